//! What each end of a bulk transfer reports of itself: the sender's counts, CPU and
//! pacing accuracy, the receiver's counts, CPU and integrity.

use serde::Serialize;

use netlane::metrics::{CpuTime, Summary};
use netlane::pace::PaceStats;
use netlane::zerocopy::ZerocopyStats;

use crate::payload::Integrity;

/// Pacing accuracy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct PaceReport {
    /// Target rate, bytes/s.
    pub target_rate_bytes_per_s: u64,
    /// Achieved sender rate over the schedule, bytes/s.
    pub achieved_rate_bytes_per_s: f64,
    /// achieved / target.
    pub accuracy: f64,
    /// The release period used, nanoseconds.
    pub quantum_ns: u64,
    /// Segments per release at the target rate.
    pub segments_per_release: f64,
    /// How late the sender woke for each release, nanoseconds.
    pub lateness_ns: Summary,
    /// Schedule counters.
    pub stats: PaceStats,
}

/// What the sender did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct TxReport {
    /// Datagrams sent (UDP) or send calls (TCP).
    pub datagrams: u64,
    /// Payload bytes sent.
    pub bytes: u64,
    /// System calls made.
    pub syscalls: u64,
    /// Seconds spent sending.
    pub seconds: f64,
    /// CPU time of the sender (thread, or the external process).
    pub cpu: CpuTime,
    /// Which paths actually ran, e.g. "gso: cmsg", "txtime: unsupported -> user-space pacer".
    pub path: Vec<String>,
    /// GSO latched off after EIO/EINVAL.
    pub gso_fallbacks: u64,
    /// Datagrams resent individually after a GSO failure.
    pub gso_resent: u64,
    /// Zerocopy latched off after ENOBUFS.
    pub zerocopy_fallbacks: u64,
    /// Zerocopy completions (None without zerocopy).
    pub zerocopy: Option<ZerocopyStats>,
    /// Sends that found the receiver's port closed (ICMP port unreachable) and were
    /// repeated.
    pub refused: u64,
    /// Pacing accuracy (None when unpaced).
    pub pacing: Option<PaceReport>,
}

/// What the receiver saw.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct RxReport {
    /// Datagrams (UDP) or read calls (TCP) received.
    pub datagrams: u64,
    /// Payload bytes received.
    pub bytes: u64,
    /// System calls made.
    pub syscalls: u64,
    /// Reads returned (a GRO read holds several datagrams).
    pub reads: u64,
    /// Reads that were GRO trains.
    pub gro_reads: u64,
    /// Seconds from the first to the last arrival.
    pub seconds: f64,
    /// Receiver thread CPU time.
    pub cpu: CpuTime,
    /// Loss, duplicates, reordering, corruption.
    pub integrity: Integrity,
    /// Reads truncated for lack of buffer.
    pub truncated: u64,
    /// SO_INCOMING_NAPI_ID at the end (0: no NAPI).
    pub napi_id: u32,
    /// Bytes received per millisecond, over the active period (burstiness).
    pub per_ms_bytes: Summary,
    /// Datagrams the kernel dropped for a full receive buffer (UDP RcvbufErrors).
    pub kernel_drops: u64,
}

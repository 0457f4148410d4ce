//! What each end of a bulk transfer reports of itself: the sender's counts, CPU and
//! pacing accuracy, the receiver's counts, CPU and integrity.

use serde::Serialize;

use netlane::metrics::{CpuTime, Summary};
use netlane::pace::PaceStats;
use netlane::zerocopy::ZerocopyStats;

use crate::payload::Integrity;

/// Who kept a paced sender's rate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum PacerRan {
    /// The sender, sleeping until each release.
    #[default]
    User,
    /// The egress qdisc, holding each send until its SO_TXTIME release time.
    Txtime,
    /// fq, pacing the socket to its SO_MAX_PACING_RATE.
    FqRate,
}

/// Pacing accuracy.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct PaceReport {
    /// Who kept the rate.
    pub pacer: PacerRan,
    /// The qdisc the datagrams waited in: the root qdisc of the device they left by
    /// (`noqueue` without one), or the one under a tbf or under every queue of an mq
    /// (`fq under tbf`); `no route` without a route.
    pub qdisc: String,
    /// The clock of the release times (`monotonic` for fq, `tai` for etf);
    /// none without them.
    pub txtime_clock: Option<String>,
    /// Sends (a GSO train is one) the qdisc dropped because their release time had
    /// passed (reported on the socket's error queue).
    pub txtime_missed: u64,
    /// Sends the qdisc refused: a release time in the past or before one already sent,
    /// or another clock than its own.
    pub txtime_refused: u64,
    /// Target rate, bytes/s.
    pub target_rate_bytes_per_s: u64,
    /// Achieved sender rate over the schedule, bytes/s.
    pub achieved_rate_bytes_per_s: f64,
    /// achieved / target.
    pub accuracy: f64,
    /// The release period used, nanoseconds (0 for fq-rate: no releases).
    pub quantum_ns: u64,
    /// Segments per release at the target rate (0 for fq-rate).
    pub segments_per_release: f64,
    /// How late the sender woke for each release, nanoseconds (none for fq-rate).
    pub lateness_ns: Summary,
    /// Schedule counters (none for fq-rate).
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
    /// UDP sends (a GSO train is one) the sender's kernel dropped after accepting them:
    /// UDP SndbufErrors (Udp6SndbufErrors over IPv6) of its network namespace over the
    /// run, so another sender in that namespace adds its own. A full qdisc or device
    /// queue (a veth whose receiving NAPI fell behind) answers ENOBUFS, which a UDP socket
    /// does not report to its sender; drops after a qdisc hands the packet on are not
    /// counted.
    pub kernel_drops: u64,
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
    /// Each flow of a many-flow sender, summarised (None for one flow).
    pub flows: Option<crate::flows::FlowsReport>,
}

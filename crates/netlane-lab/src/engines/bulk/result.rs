//! What a bulk run measured, at each end, and the figures derived from it: each a
//! [`Measure`] that says why it is undefined instead of turning into 0.

use serde::Serialize;

use netlane::metrics::{CpuTime, Summary, SystemCpuDelta};
use netlane::pace::PaceStats;
use netlane::zerocopy::ZerocopyStats;

use super::{Integrity, Transport};
use crate::verdict::{Measure, finite, per_gb, positive, rate, ratio};

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

/// The outcome of a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct BulkResult {
    /// Sender side.
    pub tx: TxReport,
    /// Receiver side.
    pub rx: RxReport,
    /// Whole-machine CPU over the sending period.
    pub system: SystemCpuDelta,
    /// UDP or TCP.
    pub transport: Transport,
}

/// Figures derived from a run. Each is a [`Measure`]: undefined figures (CPU per GB of
/// nothing, a rate over no time) say why instead of turning into 0.
impl BulkResult {
    /// Payload bytes per second the sender sent.
    pub fn tx_rate(&self) -> Measure {
        rate(self.tx.bytes as f64, self.tx.seconds, "sender bytes")
    }

    /// Payload bytes per second the receiver got, over its own time: from its first
    /// arrival to its last, plus one release period for a paced run (n releases of a
    /// period each span n periods, but their arrivals only n - 1).
    pub fn rx_rate(&self) -> Measure {
        let period = self.tx.pacing.map_or(0.0, |p| p.quantum_ns as f64 / 1e9);
        rate(self.rx.bytes as f64, self.rx.seconds + period, "receiver bytes")
    }

    /// Datagrams (UDP) or reads (TCP) per second at the receiver.
    pub fn rx_pps(&self) -> Measure {
        rate(self.rx.datagrams as f64, self.rx.seconds, "received datagrams")
    }

    /// Sender CPU seconds per GB sent.
    pub fn tx_cpu_s_per_gb(&self) -> Measure {
        per_gb(self.tx.cpu.total_s(), self.tx.bytes, "the sender")
    }

    /// Sender CPU seconds per GB that arrived: what sending costs per byte delivered.
    pub fn tx_cpu_s_per_gb_delivered(&self) -> Measure {
        per_gb(self.tx.cpu.total_s(), self.rx.bytes, "the receiver")
    }

    /// Receiver CPU seconds per GB received.
    pub fn rx_cpu_s_per_gb(&self) -> Measure {
        per_gb(self.rx.cpu.total_s(), self.rx.bytes, "the receiver")
    }

    /// Busy CPU seconds of the whole machine per GB received (softirq work lands on
    /// whichever CPU raised it).
    pub fn system_cpu_s_per_gb(&self) -> Measure {
        per_gb(self.system.busy_s, self.rx.bytes, "the receiver")
    }

    /// Send calls per datagram, as the sender counted them.
    pub fn tx_calls_per_datagram(&self) -> Measure {
        ratio(finite(self.tx.syscalls as f64, "send calls"), positive(self.tx.datagrams as f64, "datagrams sent"))
    }

    /// Receive calls per datagram, as the receiver counted them.
    pub fn rx_calls_per_datagram(&self) -> Measure {
        ratio(
            finite(self.rx.syscalls as f64, "receive calls"),
            positive(self.rx.datagrams as f64, "datagrams received"),
        )
    }

    /// Fraction of what was sent that did not arrive: datagrams (UDP, each counted
    /// once) or bytes (TCP).
    pub fn loss(&self) -> Measure {
        let (got, sent) = match self.transport {
            Transport::Tcp => (self.rx.bytes, self.tx.bytes),
            Transport::Udp => (self.rx.integrity.unique, self.tx.datagrams),
        };
        let sent = positive(sent as f64, "sent")?;
        Ok((1.0 - got as f64 / sent).max(0.0))
    }

    /// Why the run cannot be true, if it cannot: the receiver counted more than the
    /// sender sent.
    pub fn impossible(&self) -> Option<String> {
        let (got, sent, what) = match self.transport {
            Transport::Tcp => (self.rx.bytes, self.tx.bytes, "bytes"),
            Transport::Udp => (self.rx.integrity.unique, self.tx.datagrams, "distinct datagrams"),
        };
        (got > sent).then(|| format!("the receiver counted {got} {what}, the sender sent {sent}"))
    }

    /// Paced runs: the receiver's rate ([`BulkResult::rx_rate`]) over the target rate.
    pub fn rx_pacing_accuracy(&self) -> Option<Measure> {
        let p = self.tx.pacing?;
        Some(ratio(self.rx_rate(), positive(p.target_rate_bytes_per_s as f64, "target rate")))
    }
}

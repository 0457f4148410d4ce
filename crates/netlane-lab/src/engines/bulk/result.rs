//! What a bulk run measured, at each end, and the figures derived from it: each a
//! [`Measure`] that says why it is undefined instead of turning into 0.

use serde::Serialize;

use netlane::metrics::SystemCpuDelta;

use super::{RxReport, Transport, TxReport};
use crate::verdict::{Measure, finite, per_gb, positive, rate, ratio};

/// The outcome of a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct BulkResult {
    /// Sender side.
    pub tx: TxReport,
    /// Receiver side.
    pub rx: RxReport,
    /// Whole-machine CPU over the sending period.
    pub system: SystemCpuDelta,
    /// The receiver's CPU over the sending period, where the receiver was pinned to
    /// one: the receiver's work and whatever else runs there (the receiving NAPI thread,
    /// by default).
    pub receiving_cpu: Option<SystemCpuDelta>,
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
        let period = self.tx.pacing.as_ref().map_or(0.0, |p| p.quantum_ns as f64 / 1e9);
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

    /// Busy seconds of the receiver's CPU per GB received: the receive path's cost when
    /// the receiving NAPI runs there too.
    pub fn receiving_cpu_s_per_gb(&self) -> Measure {
        let busy = self.receiving_cpu.as_ref().map(|c| c.busy_s).ok_or("the receiver was not pinned to a CPU")?;
        per_gb(busy, self.rx.bytes, "the receiver")
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
        let p = self.tx.pacing.as_ref()?;
        Some(ratio(self.rx_rate(), positive(p.target_rate_bytes_per_s as f64, "target rate")))
    }
}

//! The UDP content-delivery system's data path: a bulk sender (UDP with GSO, sendmmsg
//! batching, MSG_ZEROCOPY and pacing, or a TCP stream) and a receiver (recvmmsg, UDP
//! GRO) that count, time and check every byte, each measuring its own CPU.
//!
//! A [`SenderJob`] or a [`RecvJob`] is what one end runs (`netlane bulk send`, `netlane
//! bulk recv`, or a thread of the lab's); the lab's bulk engine (`netlane-lab`'s
//! `engines::bulk`) places the two ends on hosts and derives a run's figures from their
//! [`TxReport`] and [`RxReport`]. Every datagram carries a header ([`payload`]) that the
//! receiver checks for loss, duplicates, reordering and corruption.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod flows;
mod flows_tx;
mod jobs;
pub mod payload;
mod receiver;
mod reports;
mod tcp_tx;
mod udp_tx;

use std::time::Duration;

use serde::Serialize;

use netlane::pace::Quantum;
use netlane::topology::TopologyError;
use netlane::udp::{Batching, GsoMode, RxBatching, SendError};

pub use jobs::{BoundReceiver, RecvJob, SenderJob, run_sender_job};
pub use payload::{Integrity, Verify};
pub use reports::{PaceReport, PacerRan, RxReport, TxReport};

/// Transport protocol.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// UDP datagrams.
    #[default]
    Udp,
    /// A TCP stream.
    Tcp,
}

/// Pacing of a UDP sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Pacing {
    /// Target rate, bytes of payload per second.
    pub rate: u64,
    /// Release period.
    pub quantum: Quantum,
    /// Who keeps the rate.
    pub pacer: Pacer,
}

impl Pacing {
    /// `rate` released every `quantum`, by the kernel where its qdisc can ([`Pacer::Auto`]).
    pub fn new(rate: u64, quantum: Quantum) -> Pacing {
        Pacing { rate, quantum, pacer: Pacer::Auto }
    }
}

/// Who keeps a paced sender's rate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Pacer {
    /// `txtime` where the egress qdisc honours release times, else `user`.
    #[default]
    Auto,
    /// The sender sleeps until each release and sends it: the kernel sends at once.
    User,
    /// Earliest departure times: every quantum the sender hands the kernel the next
    /// quantum's datagrams, each send with its own SO_TXTIME release time, and the egress
    /// qdisc (fq or etf) holds each until then.
    Txtime,
    /// No schedule in the sender: it sends as the socket takes datagrams, and fq paces the
    /// socket to its SO_MAX_PACING_RATE (set from the rate, counting headers as fq does).
    FqRate,
}

impl Pacer {
    /// As the command line writes it.
    pub fn name(self) -> &'static str {
        match self {
            Pacer::Auto => "auto",
            Pacer::User => "user",
            Pacer::Txtime => "txtime",
            Pacer::FqRate => "fq-rate",
        }
    }
}

/// What netlane's sender does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct TxSpec {
    /// UDP or TCP.
    pub transport: Transport,
    /// UDP segmentation offload.
    pub gso: GsoMode,
    /// UDP batching without GSO.
    pub batching: Batching,
    /// MSG_ZEROCOPY.
    pub zerocopy: bool,
    /// UDP payload bytes per datagram (the GSO segment size).
    pub datagram_size: usize,
    /// Datagrams per GSO send or per sendmmsg call.
    pub segments_per_send: usize,
    /// Pacing (UDP only).
    pub pacing: Option<Pacing>,
    /// Bytes per TCP send call.
    pub tcp_write: usize,
    /// How long to send.
    pub duration: Duration,
    /// CPU to pin the sender thread to.
    pub cpu: Option<usize>,
    /// Send buffer size (None: kernel default).
    pub sndbuf: Option<usize>,
    /// Stop after this many payload bytes (None: send for the whole duration).
    pub limit_bytes: Option<u64>,
    /// UDP: bytes of payload the sends take in turn, one send's worth after another
    /// (None: one send's worth, always in the CPU's caches). A span larger than the
    /// last-level cache makes every send copy memory the cache no longer holds, as a
    /// server sending from a large page cache does.
    pub payload_span: Option<usize>,
    /// UDP: many flows from a few unconnected sockets instead of one connected flow
    /// (the rate, when paced, is all the flows' together).
    pub flows: Option<flows::Flows>,
}

/// The largest payload span a sender takes.
pub const MAX_PAYLOAD_SPAN: usize = 1 << 30;

impl TxSpec {
    /// A UDP sender with defaults: 1400-byte datagrams, one per `sendmsg`, 2 seconds.
    pub fn udp() -> Self {
        Self {
            transport: Transport::Udp,
            gso: GsoMode::Off,
            batching: Batching::Single,
            zerocopy: false,
            datagram_size: 1400,
            segments_per_send: 1,
            pacing: None,
            tcp_write: 65_536,
            duration: Duration::from_secs(2),
            cpu: None,
            sndbuf: None,
            limit_bytes: None,
            payload_span: None,
            flows: None,
        }
    }

    /// A TCP sender writing 64 KiB per call.
    pub fn tcp() -> Self {
        Self { transport: Transport::Tcp, ..Self::udp() }
    }
}

/// What the receiver does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RxSpec {
    /// UDP or TCP.
    pub transport: Transport,
    /// UDP receive batching.
    pub batching: RxBatching,
    /// UDP_GRO on the socket.
    pub gro: bool,
    /// How much to check.
    pub verify: Verify,
    /// Receive buffer size.
    pub rcvbuf: usize,
    /// CPU to pin the receiver thread to.
    pub cpu: Option<usize>,
    /// Largest datagram expected (buffer size per read without GRO).
    pub max_datagram: usize,
    /// Flows of a many-flow sender to count one by one (0: one flow).
    pub flows: u32,
}

impl RxSpec {
    /// A UDP receiver with defaults: recvmmsg batches of 64, header checks, 16 MiB
    /// receive buffer.
    pub fn udp() -> Self {
        Self {
            transport: Transport::Udp,
            batching: RxBatching::Mmsg(64),
            gro: false,
            verify: Verify::Header,
            rcvbuf: 16 << 20,
            cpu: None,
            max_datagram: 65_535,
            flows: 0,
        }
    }

    /// A TCP receiver.
    pub fn tcp() -> Self {
        Self { transport: Transport::Tcp, ..Self::udp() }
    }

    /// Checks for values that cannot work.
    pub fn validate(&self) -> Result<(), BulkError> {
        if let RxBatching::Mmsg(n) = self.batching
            && !(1..=netlane_sys::msg::MAX_MMSG).contains(&n)
        {
            return Err(BulkError::Config(format!(
                "reads per recvmmsg must be 1..={}, got {n}",
                netlane_sys::msg::MAX_MMSG
            )));
        }
        if !(payload::HEADER_LEN..=65_535).contains(&self.max_datagram) {
            return Err(BulkError::Config(format!(
                "largest datagram must be {}..=65535 bytes, got {}",
                payload::HEADER_LEN,
                self.max_datagram
            )));
        }
        if self.rcvbuf == 0 {
            return Err(BulkError::Config("receive buffer size must be positive".into()));
        }
        if self.flows > flows::MAX_FLOWS {
            return Err(BulkError::Config(format!(
                "at most {} flows are counted, not {}",
                flows::MAX_FLOWS,
                self.flows
            )));
        }
        Ok(())
    }
}

/// Fewest pacing releases a paced run must have.
pub const MIN_RELEASES: u32 = 10;

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum BulkError {
    /// Bad specification.
    #[error("{0}")]
    Config(String),
    /// The topology failed.
    #[error(transparent)]
    Topology(#[from] TopologyError),
    /// A send failed beyond the sender's fallbacks.
    #[error(transparent)]
    Send(#[from] SendError),
    /// Another I/O error.
    #[error(transparent)]
    Io(#[from] netlane::error::IoError),
    /// The machine has not the memory a run asks for.
    #[error(transparent)]
    Memory(#[from] netlane::memory::MemoryError),
    /// A worker thread panicked.
    #[error("{0} thread panicked")]
    Panic(&'static str),
}

/// A [`BulkError`] for an I/O error of `what` ("bind the receiver").
pub fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BulkError {
    let what = what.into();
    move |source| BulkError::Io(netlane::error::IoError::new(what, source))
}

impl TxSpec {
    /// Checks for values that cannot work over IPv6 (`ipv6`) or IPv4, and a path MTU
    /// when it is known.
    pub fn validate(&self, ipv6: bool, path_mtu: Option<u32>) -> Result<(), BulkError> {
        let tx = self;
        if tx.duration.is_zero() {
            return Err(BulkError::Config("duration must be positive".into()));
        }
        if tx.transport == Transport::Tcp {
            if tx.tcp_write == 0 {
                return Err(BulkError::Config("TCP write size must be positive".into()));
            }
            if tx.payload_span.is_some() {
                return Err(BulkError::Config("a payload span is for UDP senders; TCP sends one buffer".into()));
            }
            return Ok(());
        }
        if tx.datagram_size < payload::HEADER_LEN {
            return Err(BulkError::Config(format!(
                "datagram size {} is below the {}-byte bulk header",
                tx.datagram_size,
                payload::HEADER_LEN
            )));
        }
        let limits = netlane::udp::gso::GsoLimits::for_family(ipv6);
        if tx.datagram_size > limits.max_payload {
            return Err(BulkError::Config(format!(
                "datagram size {} exceeds the largest UDP payload ({})",
                tx.datagram_size, limits.max_payload
            )));
        }
        if let Some(mtu) = path_mtu {
            let max = netlane::udp::max_payload_for_mtu(mtu as usize, ipv6);
            if tx.datagram_size > max {
                return Err(BulkError::Config(format!(
                    "datagram (gso) size {} is above the path MTU: a {mtu}-byte MTU leaves {max} bytes of UDP payload over {}",
                    tx.datagram_size,
                    if ipv6 { "IPv6" } else { "IPv4" }
                )));
            }
        }
        if tx.segments_per_send == 0 || tx.segments_per_send > netlane_sys::msg::MAX_MMSG {
            return Err(BulkError::Config(format!(
                "segments per send must be 1..={}, got {}",
                netlane_sys::msg::MAX_MMSG,
                tx.segments_per_send
            )));
        }
        if tx.gso != GsoMode::Off && tx.segments_per_send > limits.segments_per_send(tx.datagram_size) {
            return Err(BulkError::Config(format!(
                "{} segments of {} bytes exceed the 64 KB IP datagram limit: at most {} fit one GSO send",
                tx.segments_per_send,
                tx.datagram_size,
                limits.segments_per_send(tx.datagram_size)
            )));
        }
        if let Some(span) = tx.payload_span {
            let send = tx.segments_per_send * tx.datagram_size;
            if !(send..=MAX_PAYLOAD_SPAN).contains(&span) {
                return Err(BulkError::Config(format!(
                    "a payload span of {span} bytes: it must hold one send ({send} bytes) and be at most {} MiB",
                    MAX_PAYLOAD_SPAN >> 20
                )));
            }
        }
        if let Some(f) = &tx.flows {
            return validate_flows(tx, f, ipv6, path_mtu);
        }
        if let Some(p) = tx.pacing {
            if p.pacer == Pacer::FqRate {
                if p.rate == 0 {
                    return Err(BulkError::Config("a pacing rate must be positive".into()));
                }
                if p.quantum != Quantum::Auto {
                    return Err(BulkError::Config(
                        "the fq-rate pacer has no release period: fq paces every datagram at the socket's rate".into(),
                    ));
                }
                return Ok(());
            }
            let cfg = netlane::pace::PaceConfig {
                quantum: p.quantum,
                ..netlane::pace::PaceConfig::new(p.rate, tx.datagram_size, tx.segments_per_send)
            };
            cfg.validate().map_err(|e| BulkError::Config(e.to_string()))?;
            // With fewer than MIN_RELEASES releases a run is a few bursts: neither the
            // sender's nor the receiver's rate means anything.
            let quantum = Duration::from_nanos(cfg.quantum_ns());
            if quantum * MIN_RELEASES > tx.duration {
                return Err(BulkError::Config(format!(
                    "a pacing quantum of {} releases the run of {} in fewer than {MIN_RELEASES} bursts; use a \
                     quantum of at most {} or a longer run",
                    netlane::metrics::units::format_duration(quantum),
                    netlane::metrics::units::format_duration(tx.duration),
                    netlane::metrics::units::format_duration(tx.duration / MIN_RELEASES)
                )));
            }
        }
        Ok(())
    }
}

/// A many-flow sender's flows: counts within bounds, path MTUs that leave room for
/// the flow header and fit the path, only what it can do.
fn validate_flows(tx: &TxSpec, f: &flows::Flows, ipv6: bool, path_mtu: Option<u32>) -> Result<(), BulkError> {
    let bad = |m: String| Err(BulkError::Config(m));
    if !(1..=flows::MAX_FLOWS).contains(&f.count) {
        return bad(format!("flows must be 1..={}, got {}", flows::MAX_FLOWS, f.count));
    }
    if !(1..=flows::MAX_FLOW_SOCKETS.min(f.count)).contains(&f.sockets) {
        return bad(format!("flow sockets must be 1..={} (and no more than the flows)", flows::MAX_FLOW_SOCKETS));
    }
    if f.mtus.is_empty() || f.mtus.len() > 16 {
        return bad(format!("flows take 1 to 16 path MTUs, got {}", f.mtus.len()));
    }
    let least = netlane::udp::ip_udp_header_len(ipv6) + payload::FLOW_HEADER_LEN;
    for &mtu in &f.mtus {
        if (mtu as usize) < least || mtu > 65_535 || path_mtu.is_some_and(|p| mtu > p) {
            return bad(format!(
                "a flow's path MTU of {mtu}: it must hold the {least} bytes of headers and be at most {}",
                path_mtu.unwrap_or(65_535)
            ));
        }
    }
    if tx.zerocopy || tx.payload_span.is_some() || tx.batching == Batching::Mmsg {
        return bad("many flows send with GSO or one sendmsg per datagram, copying from one cached buffer".into());
    }
    if tx.pacing.is_some_and(|p| !matches!(p.pacer, Pacer::Auto | Pacer::User)) {
        return bad("many flows are paced in user space, each flow on its own schedule".into());
    }
    if let Some(p) = tx.pacing {
        if p.rate == 0 {
            return bad("a pacing rate must be positive".into());
        }
        // Each flow must send often enough in the run for its rate to mean anything.
        let slowest = flows_tx::plans(tx, f, ipv6).into_iter().map(|p| p.period_ns).max().unwrap_or(0);
        let least = Duration::from_nanos(slowest) * MIN_RELEASES;
        if least > tx.duration {
            return bad(format!(
                "{} flows share {} B/s: each sends every {}, fewer than {MIN_RELEASES} times in {}; use fewer flows, \
                 a higher rate or a run of at least {}",
                f.count,
                p.rate,
                netlane::metrics::units::format_duration(Duration::from_nanos(slowest)),
                netlane::metrics::units::format_duration(tx.duration),
                netlane::metrics::units::format_duration(least)
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_messages() {
        let check = |tx: TxSpec, mtu| tx.validate(false, mtu).map_err(|e| e.to_string());
        let gso = TxSpec { gso: GsoMode::Cmsg, datagram_size: 9000, segments_per_send: 7, ..TxSpec::udp() };
        let e = check(gso, Some(1500)).unwrap_err();
        assert!(e.contains("above the path MTU") && e.contains("1472"), "{e}");
        let too_many = TxSpec { gso: GsoMode::Cmsg, segments_per_send: 64, ..TxSpec::udp() };
        let e = check(too_many, Some(1500)).unwrap_err();
        assert!(e.contains("at most 46"), "{e}");
        let zero_rate = TxSpec { pacing: Some(Pacing::new(0, Quantum::Auto)), ..TxSpec::udp() };
        assert!(check(zero_rate, None).unwrap_err().contains("positive"));
        let slow = TxSpec {
            pacing: Some(Pacing::new(10_000_000, Quantum::Fixed(2_000_000_000))),
            duration: Duration::from_secs(2),
            ..TxSpec::udp()
        };
        let e = check(slow, None).unwrap_err();
        assert!(e.contains("fewer than 10 bursts") && e.contains("at most 200ms"), "{e}");
        let tiny = TxSpec { datagram_size: 8, ..TxSpec::udp() };
        assert!(check(tiny, None).is_err());
        let zero = TxSpec { duration: Duration::ZERO, ..TxSpec::udp() };
        assert!(check(zero, None).is_err());
        let gso = TxSpec { gso: GsoMode::Cmsg, segments_per_send: 40, ..TxSpec::udp() };
        let short = TxSpec { payload_span: Some(40 * 1400 - 1), ..gso.clone() };
        assert!(check(short, None).unwrap_err().contains("hold one send (56000 bytes)"));
        let huge = TxSpec { payload_span: Some(MAX_PAYLOAD_SPAN + 1), ..gso.clone() };
        assert!(check(huge, None).unwrap_err().contains("at most 1024 MiB"));
        assert!(check(TxSpec { payload_span: Some(64 << 20), ..gso }, None).is_ok());
        let tcp = TxSpec { payload_span: Some(64 << 20), ..TxSpec::tcp() };
        assert!(check(tcp, None).unwrap_err().contains("for UDP senders"));
        assert!(check(TxSpec::udp(), Some(1500)).is_ok());
        let fq = |quantum| TxSpec {
            pacing: Some(Pacing { pacer: Pacer::FqRate, ..Pacing::new(1 << 20, quantum) }),
            ..TxSpec::udp()
        };
        assert!(check(fq(Quantum::Auto), None).is_ok());
        assert!(check(fq(Quantum::Fixed(1_000_000)), None).unwrap_err().contains("no release period"));
        let flows = |count, rate| TxSpec {
            gso: GsoMode::Cmsg,
            segments_per_send: 46,
            pacing: Some(Pacing::new(rate, Quantum::Auto)),
            duration: Duration::from_secs(10),
            flows: Some(flows::Flows { count, sockets: 4, mtus: vec![1500] }),
            ..TxSpec::udp()
        };
        assert!(check(flows(10_000, 100_000_000), Some(1500)).is_ok());
        let e = check(flows(10_000, 1_000_000), Some(1500)).unwrap_err();
        assert!(e.contains("each sends every 14.72s") && e.contains("at least 147.2s"), "{e}");
        assert!(check(flows(10, 0), None).unwrap_err().contains("positive"));
        let e = check(
            TxSpec { flows: Some(flows::Flows { count: 4, sockets: 4, mtus: vec![9000] }), ..flows(4, 1 << 20) },
            Some(1500),
        )
        .unwrap_err();
        assert!(e.contains("at most 1500"), "{e}");
    }
}

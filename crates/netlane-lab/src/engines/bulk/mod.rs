//! Bulk transfer: a sender and a receiver moving as many bytes as they can (or as the
//! pacer allows) for a fixed time, measured from both ends.
//!
//! A run is a [`TxSource`] (netlane's own sender in one of its modes, or an external
//! program such as the kernel's `udpgso_bench_tx`) and an [`RxSpec`], placed on
//! [`Endpoints`]: loopback in the current namespace, the two hosts of a
//! [`netlane::topology::TwoHosts`] veth topology, or two hosts of a testbed; each end a
//! process (`netlane bulk send`, `netlane bulk recv`: [`Roles::Processes`]) or, on this
//! machine, a thread of the caller. [`run`] starts the receiver,
//! runs the sender (pinned), lets the receiver drain, and returns a [`BulkResult`] with rates,
//! CPU cost per gigabyte (sender thread, receiver thread, whole machine), system
//! calls per datagram, loss, integrity, zerocopy completions, pacing accuracy and
//! burstiness, and which kernel paths actually ran.

mod endpoints;
mod jobs;
pub mod payload;
mod process;
mod receiver;
mod result;

pub use process::{recv_args, send_args};
use process::{run_external, run_sender_process};
mod tcp_tx;
mod udp_tx;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::Serialize;

use netlane::metrics::{SystemCpu, SystemCpuDelta};
use netlane::pace::Quantum;
use netlane::topology::{Netns, NsThread, TopologyError};

use netlane::udp::{Batching, GsoMode, RxBatching, SendError};

pub use endpoints::Endpoints;
use endpoints::machine_delta;
pub use jobs::{BoundReceiver, RecvJob, SenderJob, Txtime, run_sender_job};
pub use payload::{Integrity, Verify};
pub use result::{BulkResult, PaceReport, RxReport, TxReport};

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
}

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
        }
    }

    /// A TCP sender writing 64 KiB per call.
    pub fn tcp() -> Self {
        Self { transport: Transport::Tcp, ..Self::udp() }
    }
}

/// An external sender program, run in the sending namespace (e.g. the kernel's
/// `udpgso_bench_tx` selftest). Its arguments may contain `{addr}` and `{port}`,
/// replaced by the receiver's address and port.
#[derive(Debug, Clone, Serialize)]
pub struct ExternalTx {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Payload bytes per message the program counts.
    pub message_bytes: u64,
    /// Datagrams per message.
    pub datagrams_per_message: u64,
    /// CPU to pin it to.
    pub cpu: Option<usize>,
    /// Parses the program's output (stdout + stderr) into what it sent.
    #[serde(skip)]
    pub parse: fn(&str) -> Option<ExternalCounts>,
}

/// What an external sender reported about itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ExternalCounts {
    /// Messages sent (each [`ExternalTx::message_bytes`] long).
    pub messages: u64,
    /// Send system calls.
    pub syscalls: u64,
    /// Seconds of sending the counts cover.
    pub seconds: f64,
}

/// Who sends.
#[derive(Debug, Clone, Serialize)]
pub enum TxSource {
    /// netlane's sender.
    Netlane(TxSpec),
    /// Another program (always a process).
    External(ExternalTx),
}

/// How netlane's two ends run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Roles {
    /// Each end a process of its own running netlane (this program on this machine, the
    /// host's on another): `bulk send` and `bulk recv`, pinned by `taskset`, their
    /// reports read from their JSON. A single-threaded sender pays no shared-file-table
    /// cost in its system calls, and its CPU is measured like an external program's (the
    /// whole process, from wait4).
    Processes,
    /// Both ends threads of the calling process.
    Threads,
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
        Ok(())
    }
}

/// Fewest pacing releases a paced run must have.
pub const MIN_RELEASES: u32 = 10;

/// A whole run.
#[derive(Debug, Clone, Serialize)]
pub struct BulkRun {
    /// The sender.
    pub tx: TxSource,
    /// The receiver.
    pub rx: RxSpec,
    /// IPv6 instead of IPv4.
    pub ipv6: bool,
    /// Identifies the run in every datagram header.
    pub run_id: u32,
    /// Processes or threads.
    pub roles: Roles,
}

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
    /// A worker thread panicked.
    #[error("{0} thread panicked")]
    Panic(&'static str),
}

pub(crate) fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BulkError {
    let what = what.into();
    move |source| BulkError::Io(netlane::error::IoError::new(what, source))
}

impl BulkRun {
    /// netlane's sender specification, if netlane sends.
    pub fn netlane_spec(&self) -> Option<&TxSpec> {
        match &self.tx {
            TxSource::Netlane(t) => Some(t),
            TxSource::External(_) => None,
        }
    }

    /// Checks the run for values that cannot work, with messages for the user.
    pub fn validate(&self, path_mtu: Option<u32>) -> Result<(), BulkError> {
        self.rx.validate()?;
        let Some(tx) = self.netlane_spec() else { return Ok(()) };
        if tx.transport != self.rx.transport {
            return Err(BulkError::Config("sender and receiver must use the same transport".into()));
        }
        tx.validate(self.ipv6, path_mtu)
    }
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
        if let Some(p) = tx.pacing {
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

/// A worker thread, in a namespace or not.
enum Worker<R> {
    Ns(NsThread<R>),
    Plain(JoinHandle<R>),
}

impl<R: Send + 'static> Worker<R> {
    fn spawn(ns: Option<&Netns>, name: &str, f: impl FnOnce() -> R + Send + 'static) -> Result<Self, BulkError> {
        match ns {
            Some(ns) => Ok(Worker::Ns(ns.spawn(name, f)?)),
            None => std::thread::Builder::new()
                .name(name.into())
                .spawn(f)
                .map(Worker::Plain)
                .map_err(io_err("spawn thread")),
        }
    }

    fn join(self, what: &'static str) -> Result<R, BulkError> {
        match self {
            Worker::Ns(t) => t.join().map_err(|_| BulkError::Panic(what)),
            Worker::Plain(t) => t.join().map_err(|_| BulkError::Panic(what)),
        }
    }
}

/// Runs one bulk transfer.
pub fn run(endpoints: Endpoints<'_>, spec: &BulkRun) -> Result<BulkResult, BulkError> {
    spec.validate(endpoints.mtu())?;
    let recv = RecvJob {
        listen: SocketAddr::new(endpoints.rx_addr(spec.ipv6), 0),
        spec: spec.rx,
        run_id: spec.run_id,
        datagram_size: spec.netlane_spec().map_or(spec.rx.max_datagram, |t| t.datagram_size),
    };
    let (tx, rx, system) = match &spec.roles {
        Roles::Processes => run_processes(endpoints, spec, recv)?,
        Roles::Threads => run_threads(endpoints, spec, recv)?,
    };
    Ok(BulkResult { tx, rx, system, transport: spec.rx.transport })
}

type EndReports = (TxReport, RxReport, SystemCpuDelta);

/// Each end a process: `netlane bulk recv` first (bound before the sender starts), then
/// the sender to its end, then the receiver asked to drain and stop.
fn run_processes(endpoints: Endpoints<'_>, spec: &BulkRun, recv: RecvJob) -> Result<EndReports, BulkError> {
    let receiver = process::start_receiver(endpoints.rx_host(), &recv)?;
    let dst = receiver.address;
    let sys0 = endpoints.machine_cpu()?;
    let tx = match &spec.tx {
        TxSource::Netlane(tx) => {
            let job = SenderJob { spec: tx.clone(), dst, run_id: spec.run_id };
            run_sender_process(endpoints.tx_host(), &job)
        }
        TxSource::External(ext) => run_external(endpoints.tx_host(), ext, dst),
    };
    let sys1 = endpoints.machine_cpu();
    // The receiver is stopped even when the sender failed: the sender's error is the
    // one to report.
    let rx = receiver.finish();
    Ok((tx?, rx?, machine_delta(&sys0, &sys1?)))
}

/// Both ends threads of this process (in their namespaces).
fn run_threads(endpoints: Endpoints<'_>, spec: &BulkRun, recv: RecvJob) -> Result<EndReports, BulkError> {
    let (tx_ns, rx_ns) = endpoints.namespaces()?;
    let bound = match rx_ns {
        Some(ns) => ns.run(move || BoundReceiver::bind(recv))??,
        None => BoundReceiver::bind(recv)?,
    };
    let dst = bound.local_addr();
    let sender_done = Arc::new(AtomicBool::new(false));
    let done = sender_done.clone();
    let receiver = Worker::spawn(rx_ns, "netlane-rx", move || bound.receive(&done))?;
    let sys0 = SystemCpu::read().map_err(io_err("read /proc/stat"))?;
    let tx_result = match &spec.tx {
        TxSource::Netlane(tx) => {
            let job = SenderJob { spec: tx.clone(), dst, run_id: spec.run_id };
            let sender = Worker::spawn(tx_ns, "netlane-tx", move || run_sender_job(&job))?;
            sender.join("sender")
        }
        TxSource::External(ext) => Ok(run_external(endpoints.tx_host(), ext, dst)),
    };
    let sys1 = SystemCpu::read().map_err(io_err("read /proc/stat"))?;
    sender_done.store(true, Ordering::Release);
    let rx_result = receiver.join("receiver");
    Ok((tx_result??, rx_result??, sys0.delta(&sys1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_with(tx: TxSpec) -> BulkRun {
        BulkRun { tx: TxSource::Netlane(tx), rx: RxSpec::udp(), ipv6: false, run_id: 1, roles: Roles::Threads }
    }

    #[test]
    fn validation_messages() {
        let gso = TxSpec { gso: GsoMode::Cmsg, datagram_size: 9000, segments_per_send: 7, ..TxSpec::udp() };
        let e = run_with(gso).validate(Some(1500)).unwrap_err().to_string();
        assert!(e.contains("above the path MTU") && e.contains("1472"), "{e}");
        let too_many = TxSpec { gso: GsoMode::Cmsg, segments_per_send: 64, ..TxSpec::udp() };
        let e = run_with(too_many).validate(Some(1500)).unwrap_err().to_string();
        assert!(e.contains("at most 46"), "{e}");
        let zero_rate = TxSpec { pacing: Some(Pacing { rate: 0, quantum: Quantum::Auto }), ..TxSpec::udp() };
        assert!(run_with(zero_rate).validate(None).unwrap_err().to_string().contains("positive"));
        let slow = TxSpec {
            pacing: Some(Pacing { rate: 10_000_000, quantum: Quantum::Fixed(2_000_000_000) }),
            duration: Duration::from_secs(2),
            ..TxSpec::udp()
        };
        let e = run_with(slow).validate(None).unwrap_err().to_string();
        assert!(e.contains("fewer than 10 bursts") && e.contains("at most 200ms"), "{e}");
        let tiny = TxSpec { datagram_size: 8, ..TxSpec::udp() };
        assert!(run_with(tiny).validate(None).is_err());
        let zero = TxSpec { duration: Duration::ZERO, ..TxSpec::udp() };
        assert!(run_with(zero).validate(None).is_err());
        assert!(run_with(TxSpec::udp()).validate(Some(1500)).is_ok());
    }
}

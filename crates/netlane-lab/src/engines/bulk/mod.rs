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
mod process;
mod result;

pub use process::{recv_args, send_args};
use process::{run_external, run_sender_process};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use serde::Serialize;

use netlane::metrics::{SystemCpu, SystemCpuDelta};
use netlane::topology::{Netns, NsThread};

pub use endpoints::Endpoints;
use endpoints::machine_delta;
pub use netlane_bulk::{
    BoundReceiver, BulkError, Integrity, PaceReport, Pacing, RecvJob, RxReport, RxSpec, SenderJob, Transport, TxReport,
    TxSpec, Verify, io_err, run_sender_job,
};
pub use result::BulkResult;

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
    let (tx, rx, system, receiving) = match &spec.roles {
        Roles::Processes => run_processes(endpoints, spec, recv)?,
        Roles::Threads => run_threads(endpoints, spec, recv)?,
    };
    Ok(BulkResult { tx, rx, system, receiving_cpu: receiving, transport: spec.rx.transport })
}

/// The ends' reports, the machine's CPU and the receiver's CPU over the sending period.
type EndReports = (TxReport, RxReport, SystemCpuDelta, Option<SystemCpuDelta>);

/// The receiver's CPU from `before` to `after`, where both were read.
fn receiving_delta(before: Option<SystemCpu>, after: Option<SystemCpu>) -> Option<SystemCpuDelta> {
    Some(before?.delta(&after?))
}

/// Each end a process: `netlane bulk recv` first (bound before the sender starts), then
/// the sender to its end, then the receiver asked to drain and stop.
fn run_processes(endpoints: Endpoints<'_>, spec: &BulkRun, recv: RecvJob) -> Result<EndReports, BulkError> {
    let receiver = process::start_receiver(endpoints.rx_host(), &recv)?;
    let dst = receiver.address;
    let sys0 = endpoints.machine_cpu()?;
    let cpu0 = endpoints.receiving_cpu(spec.rx.cpu)?;
    let tx = match &spec.tx {
        TxSource::Netlane(tx) => {
            let job = SenderJob { spec: tx.clone(), dst, run_id: spec.run_id };
            run_sender_process(endpoints.tx_host(), &job)
        }
        TxSource::External(ext) => run_external(endpoints.tx_host(), ext, dst),
    };
    let sys1 = endpoints.machine_cpu();
    let cpu1 = endpoints.receiving_cpu(spec.rx.cpu);
    // The receiver is stopped even when the sender failed: the sender's error is the
    // one to report.
    let rx = receiver.finish();
    Ok((tx?, rx?, machine_delta(&sys0, &sys1?), receiving_delta(cpu0, cpu1?)))
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
    // Read before the receiver starts: a failed read then leaves no thread behind.
    let sys0 = SystemCpu::read().map_err(io_err("read /proc/stat"))?;
    let cpu0 = endpoints.receiving_cpu(spec.rx.cpu)?;
    let receiver = Worker::spawn(rx_ns, "netlane-rx", move || bound.receive(&done))?;
    let tx_result = match &spec.tx {
        TxSource::Netlane(tx) => {
            let job = SenderJob { spec: tx.clone(), dst, run_id: spec.run_id };
            Worker::spawn(tx_ns, "netlane-tx", move || run_sender_job(&job)).and_then(|s| s.join("sender"))
        }
        TxSource::External(ext) => Ok(run_external(endpoints.tx_host(), ext, dst)),
    };
    let sys1 = SystemCpu::read().map_err(io_err("read /proc/stat"));
    let cpu1 = endpoints.receiving_cpu(spec.rx.cpu);
    // The receiver is stopped whatever failed.
    sender_done.store(true, Ordering::Release);
    let rx_result = receiver.join("receiver");
    Ok((tx_result??, rx_result??, sys0.delta(&sys1?), receiving_delta(cpu0, cpu1?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_with_two_transports_is_refused() {
        let run = BulkRun {
            tx: TxSource::Netlane(TxSpec::tcp()),
            rx: RxSpec::udp(),
            ipv6: false,
            run_id: 1,
            roles: Roles::Threads,
        };
        assert!(run.validate(None).unwrap_err().to_string().contains("same transport"));
    }
}

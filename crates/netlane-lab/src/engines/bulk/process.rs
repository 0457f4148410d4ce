//! The ends as processes on their hosts: an external sender (the kernel's
//! `udpgso_bench_tx`), `netlane bulk send` running one [`SenderJob`], `netlane bulk recv`
//! running one [`RecvJob`]; the arguments that run them, and their reports read back.

use std::net::SocketAddr;
use std::time::Duration;

use netlane::udp::{Batching, RxBatching};

use super::{BulkError, ExternalTx, RecvJob, RxReport, SenderJob, TxReport};
use crate::host::{Args, Finished, Host, Program, RoleProcess, RoleSpec};
use crate::scenarios::value_name;

/// Runs `program args` on `host` (pinned to `cpu`) as a role to its end: its CPU use
/// (the whole process, from wait4) and its output. A failed exit is an error carrying
/// its output.
fn run_child(host: &dyn Host, program: Program, args: &[String], cpu: Option<usize>) -> Result<Finished, BulkError> {
    let name = match &program {
        Program::Other(p) => p.display().to_string(),
        Program::Netlane => "netlane".to_string(),
    };
    let spec = RoleSpec::program(&name, program, args.iter().cloned()).on_cpus(cpu.as_slice());
    let ran = RoleProcess::start(host, &spec, None)
        .and_then(|p| p.wait(CHILD_LIMIT))
        .map_err(|e| BulkError::Config(format!("{e:#}")))?;
    if !ran.status.success() {
        return Err(BulkError::Config(format!(
            "{name} {} failed ({}): {}",
            args.join(" "),
            ran.status,
            format!("{}\n{}", ran.stdout, ran.stderr).trim()
        )));
    }
    Ok(ran)
}

/// The longest a sender process may run (a run is seconds; this only ends a hung one).
const CHILD_LIMIT: Duration = Duration::from_secs(600);

pub(super) fn run_external(host: &dyn Host, ext: &ExternalTx, dst: SocketAddr) -> Result<TxReport, BulkError> {
    let args: Vec<String> = ext
        .args
        .iter()
        .map(|a| a.replace("{addr}", &dst.ip().to_string()).replace("{port}", &dst.port().to_string()))
        .collect();
    let child = run_child(host, Program::Other(ext.program.clone()), &args, ext.cpu)?;
    let text = format!("{}\n{}", child.stdout, child.stderr);
    let report = (ext.parse)(&text).ok_or_else(|| {
        BulkError::Config(format!(
            "could not read the counts in the output of {}: {}",
            ext.program.display(),
            text.trim()
        ))
    })?;
    Ok(TxReport {
        datagrams: report.messages * ext.datagrams_per_message,
        bytes: report.messages * ext.message_bytes,
        syscalls: report.syscalls,
        seconds: report.seconds,
        cpu: child.cpu,
        path: vec![format!("external: {} {}", ext.program.display(), args.join(" "))],
        ..TxReport::default()
    })
}

/// The arguments after `netlane` that run `job`: every option `bulk send` has, written
/// out (the command line's tests read them back into the same job).
pub fn send_args(job: &SenderJob) -> Vec<String> {
    let t = &job.spec;
    let mut a = Args::new(&["bulk", "send", "--json", "-"]);
    a.opt("to", job.dst)
        .opt("transport", value_name(&t.transport))
        .opt("size", t.datagram_size)
        .opt("gso", t.gso)
        .opt("segments", t.segments_per_send)
        .opt("batching", t.batching)
        .flag("zerocopy", t.zerocopy)
        .opt("tcp-write", t.tcp_write)
        .duration("time", t.duration)
        .opt_some("cpu", t.cpu)
        .opt_some("sndbuf", t.sndbuf)
        .opt_some("limit", t.limit_bytes)
        .opt_some("payload-span", t.payload_span)
        .opt("run-id", job.run_id);
    if let Some(p) = t.pacing {
        a.opt("rate", p.rate)
            .opt("quantum", netlane_report::options::quantum_name(p.quantum))
            .opt("pacer", p.pacer.name());
    }
    if let Some(f) = &t.flows {
        let mtus: Vec<String> = f.mtus.iter().map(u32::to_string).collect();
        a.opt("flows", f.count).opt("flow-sockets", f.sockets).opt("flow-mtus", mtus.join(","));
    }
    a.into_vec()
}

/// The arguments after `netlane` that run `job` for at most `limit`: every option `bulk
/// recv` has, written out (the command line's tests read them back into the same job).
pub fn recv_args(job: &RecvJob, limit: Duration) -> Vec<String> {
    let r = &job.spec;
    let (batching, batch) = match r.batching {
        RxBatching::Single => (Batching::Single, None),
        RxBatching::Mmsg(n) => (Batching::Mmsg, Some(n)),
    };
    let mut a = Args::new(&["bulk", "recv", "--json", "-"]);
    a.opt("listen", job.listen)
        .opt("transport", value_name(&r.transport))
        .opt("batching", batching)
        .opt_some("batch", batch)
        .flag("gro", r.gro)
        .opt("verify", value_name(&r.verify))
        .opt("rcvbuf", r.rcvbuf)
        .opt("max-datagram", r.max_datagram)
        .opt("size", job.datagram_size)
        .opt("run-id", job.run_id)
        .opt_some("cpu", r.cpu)
        .duration("time", limit);
    if r.flows > 0 {
        a.opt("flows", r.flows);
    }
    a.into_vec()
}

/// Runs `netlane bulk send` for `job` (on `host`, pinned to the job's CPU) to its end.
/// Its CPU is the whole process's (from wait4, like an external sender's), not the
/// sending thread's own measurement.
pub(super) fn run_sender_process(host: &dyn Host, job: &SenderJob) -> Result<TxReport, BulkError> {
    let child = run_child(host, Program::Netlane, &send_args(job), job.spec.cpu)?;
    #[derive(serde::Deserialize)]
    struct BulkSend {
        report: TxReport,
    }
    let mut report =
        child.json::<BulkSend>().map_err(|e| BulkError::Config(format!("netlane bulk send: {e:#}")))?.report;
    report.cpu = child.cpu;
    report.path.push("sender: own process".into());
    Ok(report)
}

/// A receiver process (`netlane bulk recv`), bound and receiving.
pub(super) struct ReceiverProcess {
    role: RoleProcess,
    /// The address it receives on.
    pub(super) address: SocketAddr,
}

/// Longest a receiver takes to drain and report once asked to stop.
const RECEIVER_GRACE: Duration = Duration::from_secs(10);

/// Starts `netlane bulk recv` for `job` on `host`, pinned to its CPU; returns once it has
/// bound its socket.
pub(super) fn start_receiver(host: &dyn Host, job: &RecvJob) -> Result<ReceiverProcess, BulkError> {
    let spec = RoleSpec::netlane("netlane bulk recv", recv_args(job, CHILD_LIMIT))
        .on_cpus(job.spec.cpu.as_slice())
        .ready_on_stderr("listening on ", Duration::from_secs(10));
    let role = RoleProcess::start(host, &spec, None).map_err(|e| BulkError::Config(format!("{e:#}")))?;
    let address = role.listening_on().map_err(|e| BulkError::Config(format!("{e:#}")))?;
    Ok(ReceiverProcess { role, address })
}

impl ReceiverProcess {
    /// Asks it to stop (it drains first) and reads its report.
    pub(super) fn finish(self) -> Result<RxReport, BulkError> {
        #[derive(serde::Deserialize)]
        struct BulkRecv {
            report: RxReport,
        }
        let done = self.role.stop(RECEIVER_GRACE).map_err(|e| BulkError::Config(format!("{e:#}")))?;
        Ok(done.json::<BulkRecv>().map_err(|e| BulkError::Config(format!("netlane bulk recv: {e:#}")))?.report)
    }
}

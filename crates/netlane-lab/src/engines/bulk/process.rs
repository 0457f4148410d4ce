//! Senders that are processes: an external program (the kernel's `udpgso_bench_tx`) or
//! netlane itself running one [`SenderJob`], each reaped with its CPU use and output.

use std::net::SocketAddr;

use netlane::topology::Netns;

use super::{BulkError, ExternalTx, SenderJob, SenderProcess, TxReport};
use crate::host::{Finished, Program, RoleProcess, RoleSpec, ThisMachine};

/// Runs `program args` (inside `ns`, pinned to `cpu`) as a role, feeding `stdin`, to its
/// end: its CPU use (the whole process, from wait4) and its output. A failed exit is an
/// error carrying its output.
fn run_child(
    ns: Option<&Netns>,
    program: &std::path::Path,
    args: &[String],
    stdin: Option<&[u8]>,
    cpu: Option<usize>,
) -> Result<Finished, BulkError> {
    let mut spec =
        RoleSpec::program(&program.display().to_string(), Program::Other(program.into()), args.iter().cloned())
            .on_cpus(cpu.as_slice());
    if let Some(input) = stdin {
        spec = spec.with_stdin(input.to_vec());
    }
    let ran = match ns {
        Some(ns) => RoleProcess::start(ns, &spec, None),
        None => RoleProcess::start(&ThisMachine, &spec, None),
    }
    .and_then(|p| p.wait(CHILD_LIMIT))
    .map_err(|e| BulkError::Config(format!("{e:#}")))?;
    if !ran.status.success() {
        return Err(BulkError::Config(format!(
            "{} {} failed ({}): {}",
            program.display(),
            args.join(" "),
            ran.status,
            format!("{}\n{}", ran.stdout, ran.stderr).trim()
        )));
    }
    Ok(ran)
}

/// The longest a sender process may run (a run is seconds; this only ends a hung one).
const CHILD_LIMIT: std::time::Duration = std::time::Duration::from_secs(600);

pub(super) fn run_external(ns: Option<&Netns>, ext: &ExternalTx, dst: SocketAddr) -> Result<TxReport, BulkError> {
    let args: Vec<String> = ext
        .args
        .iter()
        .map(|a| a.replace("{addr}", &dst.ip().to_string()).replace("{port}", &dst.port().to_string()))
        .collect();
    let child = run_child(ns, &ext.program, &args, None, ext.cpu)?;
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

/// Runs netlane's sender as a child process. Its CPU is the whole process's (from
/// wait4, like an external sender's), not the sending thread's own measurement.
pub(super) fn run_sender_process(
    ns: Option<&Netns>,
    process: &SenderProcess,
    job: &SenderJob,
) -> Result<TxReport, BulkError> {
    let input = serde_json::to_vec(job).map_err(|e| BulkError::Config(format!("encode sender job: {e}")))?;
    let child = run_child(ns, &process.program, &process.args, Some(&input), job.spec.cpu)?;
    let mut report: TxReport = serde_json::from_str(child.stdout.trim()).map_err(|e| {
        BulkError::Config(format!(
            "the sender process {} wrote no report ({e}): {}",
            process.program.display(),
            child.stderr.trim()
        ))
    })?;
    report.cpu = child.cpu;
    report.path.push("sender: own process".into());
    Ok(report)
}

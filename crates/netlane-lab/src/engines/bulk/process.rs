//! Senders that are processes: an external program (the kernel's `udpgso_bench_tx`) or
//! netlane itself running one [`SenderJob`], each reaped with its CPU use and output.

use std::net::SocketAddr;
use std::thread::JoinHandle;

use netlane::metrics::CpuTime;
use netlane::topology::Netns;

use super::{BulkError, ExternalTx, SenderJob, SenderProcess, TxReport, io_err};

/// What a finished child process left: its CPU use and its output.
struct ChildRun {
    usage: netlane_sys::process::ChildUsage,
    stdout: String,
    stderr: String,
}

impl ChildRun {
    fn cpu(&self) -> CpuTime {
        CpuTime {
            user_s: self.usage.user.as_secs_f64(),
            system_s: self.usage.system.as_secs_f64(),
            voluntary_switches: self.usage.voluntary_switches,
            involuntary_switches: self.usage.involuntary_switches,
        }
    }
}

/// Runs `program args` (inside `ns`, pinned to `cpu`), feeding `stdin`, and reaps it
/// with its resource usage. A failed exit is an error carrying its output.
fn run_child(
    ns: Option<&Netns>,
    program: &std::path::Path,
    args: &[String],
    stdin: Option<&[u8]>,
    cpu: Option<usize>,
) -> Result<ChildRun, BulkError> {
    use std::process::Stdio;
    let mut cmd = match ns {
        Some(ns) => ns.command(program),
        None => std::process::Command::new(program),
    };
    cmd.args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(io_err(format!("start {}", program.display())))?;
    if let Some(cpu) = cpu {
        // Pinned right after start, before it has done any measurable work.
        let mut set = nix::sched::CpuSet::new();
        if set.set(cpu).is_ok() {
            let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(child.id() as i32), &set);
        }
    }
    // Read output on helper threads so a chatty child cannot block on a full pipe.
    let out = child.stdout.take().map(read_all_in_background);
    let err = child.stderr.take().map(read_all_in_background);
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        use std::io::Write;
        // A child that exits early closes the pipe; its exit status tells why.
        let _ = pipe.write_all(input);
    }
    let usage =
        netlane_sys::process::wait_with_usage(&mut child).map_err(io_err(format!("wait for {}", program.display())))?;
    let stdout = out.map(|h| h.join().unwrap_or_default()).unwrap_or_default();
    let stderr = err.map(|h| h.join().unwrap_or_default()).unwrap_or_default();
    if !usage.status.success() {
        return Err(BulkError::Config(format!(
            "{} {} failed ({}): {}",
            program.display(),
            args.join(" "),
            usage.status,
            format!("{stdout}\n{stderr}").trim()
        )));
    }
    Ok(ChildRun { usage, stdout, stderr })
}

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
        cpu: child.cpu(),
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
    report.cpu = child.cpu();
    report.path.push("sender: own process".into());
    Ok(report)
}

fn read_all_in_background(mut r: impl std::io::Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

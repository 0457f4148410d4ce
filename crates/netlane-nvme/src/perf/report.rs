//! What a run reports: each group's results summed over its jobs, the run's totals, the
//! CPU time per command, and the queues it used.

use std::sync::atomic::Ordering;

use netlane::lanes::busy::Knob;
use netlane::metrics::cpu::CpuTime;
use netlane::metrics::hist::Summary;
use serde::{Deserialize, Serialize};

use super::agents::GroupLatencies;
use super::jobloop::JobResult;
use super::queue::Shared;
use super::{JobGroup, Measured, PerfOptions, VerifyMode};

/// Results of one group.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct GroupReport {
    /// Group name.
    pub name: String,
    /// rw mode.
    pub rw: String,
    /// Block size, bytes.
    pub bs_bytes: u32,
    /// Per-job depth.
    pub qd: u32,
    /// Jobs.
    pub jobs: u32,
    /// Commands completed in the measured window.
    pub ops: u64,
    /// Reads in the window.
    pub reads: u64,
    /// Writes in the window.
    pub writes: u64,
    /// Commands per second.
    pub iops: f64,
    /// MB/s (10^6 bytes).
    pub mb_per_s: f64,
    /// Read latency, ns.
    pub read_lat_ns: Summary,
    /// Write latency, ns.
    pub write_lat_ns: Summary,
    /// Commands that completed with an error status.
    pub errors: u64,
    /// Reads whose data differed from the pattern (verify mode).
    pub mismatches: u64,
}

/// One I/O queue of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct QueueInfo {
    /// Its map: `default`, `read` or `poll`.
    pub set: String,
    /// Queue ID.
    pub qid: u16,
    /// The CPU it maps to (and its I/O worker runs on).
    pub cpu: usize,
}

/// Results of a run.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PerfReport {
    /// Per group.
    pub groups: Vec<GroupReport>,
    /// Measured seconds.
    pub seconds: f64,
    /// All commands in the window.
    pub ops: u64,
    /// All commands per second.
    pub iops: f64,
    /// Host process CPU over the window.
    pub host_cpu: CpuTime,
    /// Host CPU microseconds per command.
    pub host_cpu_us_per_io: Option<f64>,
    /// Host context switches per command (voluntary + involuntary).
    pub host_switches_per_io: Option<f64>,
    /// Target CPU microseconds per command (when its PID was given), its threads'
    /// (`target_threads`) included.
    pub target_cpu_us_per_io: Option<f64>,
    /// The host's NAPI threads towards the target (name and PID), whose CPU
    /// `host_napi_cpu_us_per_io` is: the host's receive work when NAPI is threaded.
    #[serde(default)]
    pub host_napi_threads: Vec<String>,
    /// CPU microseconds per command of the host's NAPI threads (beside the process's
    /// `host_cpu_us_per_io`); `None` without threads, or when one was unreadable.
    #[serde(default)]
    pub host_napi_cpu_us_per_io: Option<f64>,
    /// The threads counted with the target's process (name and thread id).
    #[serde(default)]
    pub target_threads: Vec<String>,
    /// Commands sent by the submitting thread itself.
    pub direct_sends: u64,
    /// Commands handed to a queue's I/O worker.
    pub worker_sends: u64,
    /// send() calls made.
    pub send_calls: u64,
    /// Commands per send() call.
    pub cmds_per_send: Option<f64>,
    /// Wake-ups of a sleeping queue worker (eventfd writes by submitters) per command in
    /// the window.
    #[serde(default)]
    pub worker_wakes_per_io: Option<f64>,
    /// Times the jobs blocked (voluntary context switches over the window) per command:
    /// waiting for a worker's hand-off, or, on poll queues reaped with the kernel's busy
    /// polling, each fall back to sleeping until an interrupt-driven wake-up.
    #[serde(default)]
    pub job_sleeps_per_io: Option<f64>,
    /// Times the host's NAPI threads towards the target were put on a CPU per command
    /// (each a wake-up by the device's interrupt, or by a timer that deferred it);
    /// `None` without threads, or when one was unreadable.
    #[serde(default)]
    pub host_napi_runs_per_io: Option<f64>,
    /// Packets taken in by busy polling (the host namespace's `BusyPollRxPackets`) per
    /// command; `None` when it could not be read.
    #[serde(default)]
    pub busy_polled_packets_per_io: Option<f64>,
    /// The interrupt moderation asked of the interface towards the target (per NAPI
    /// instance) and each poll job's busy-poll parameters, as applied or refused.
    #[serde(default)]
    pub knobs: Vec<Knob>,
    /// The I/O queues.
    pub queues: Vec<QueueInfo>,
    /// Whether each queue ended healthy.
    pub queue_failures: u64,
    /// Verify mode was on.
    pub verified: bool,
}

/// The report: each group's results summed over its jobs, and the run's totals.
pub(super) fn summarize(
    opts: &PerfOptions,
    shared: &Shared,
    results: &[(String, JobResult)],
    m: Measured,
    queue_failures: u64,
) -> (PerfReport, Vec<GroupLatencies>) {
    let secs = match opts.verify {
        // A verify-only sweep reads from the jobs' start and ends with its last block.
        VerifyMode::ReadBack => (m.ended.min(m.window.1).saturating_sub(m.start) as f64 / 1e9).max(1e-9),
        _ => opts.duration.as_secs_f64(),
    };
    let (groups, latencies): (Vec<GroupReport>, Vec<GroupLatencies>) =
        opts.groups.iter().map(|g| group_report(g, results, secs)).unzip();
    let all_ops: u64 = groups.iter().map(|g| g.ops).sum();
    let host_cpu = m.host_cpu;
    // Undefined (None), not 0, when nothing completed.
    let per_io = |x: f64| (all_ops > 0).then(|| x / all_ops as f64);
    let tick = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64;
    // The target's given threads count with its process: without them its receive
    // work would be left out.
    let target_cpu_us_per_io = match (m.target_ticks, m.target_threads.names.is_empty()) {
        ((Some(a), Some(b)), true) => per_io((b.saturating_sub(a)) as f64 / tick * 1e6),
        ((Some(a), Some(b)), false) => {
            m.target_threads.cpu_s.and_then(|t| per_io(((b.saturating_sub(a)) as f64 / tick + t) * 1e6))
        }
        _ => None,
    };
    let host_napi_cpu_us_per_io =
        if m.host_napi.names.is_empty() { None } else { m.host_napi.cpu_s.and_then(|t| per_io(t * 1e6)) };
    let host_napi_runs_per_io =
        if m.host_napi.names.is_empty() { None } else { m.host_napi.runs.and_then(|n| per_io(n as f64)) };
    let mut knobs = m.knobs;
    for (i, (_, r)) in results.iter().enumerate() {
        if let Some(k) = &r.busy_poll_knob {
            knobs.push(Knob { name: format!("job {i} {}", k.name), ..k.clone() });
        }
    }
    let names = ["default", "read", "poll"];
    let report = PerfReport {
        groups,
        seconds: secs,
        ops: all_ops,
        iops: all_ops as f64 / secs,
        host_cpu,
        host_cpu_us_per_io: per_io(host_cpu.total_s() * 1e6),
        host_switches_per_io: per_io((host_cpu.voluntary_switches + host_cpu.involuntary_switches) as f64),
        target_cpu_us_per_io,
        host_napi_threads: m.host_napi.names,
        host_napi_cpu_us_per_io,
        target_threads: m.target_threads.names,
        direct_sends: shared.direct_sends.load(Ordering::Relaxed),
        worker_sends: shared.worker_sends.load(Ordering::Relaxed),
        send_calls: shared.send_calls.load(Ordering::Relaxed),
        cmds_per_send: (m.sends > 0).then(|| m.cmds as f64 / m.sends as f64),
        worker_wakes_per_io: (m.cmds > 0).then(|| m.wakes as f64 / m.cmds as f64),
        job_sleeps_per_io: per_io(results.iter().map(|(_, r)| r.sleeps).sum::<u64>() as f64),
        host_napi_runs_per_io,
        busy_polled_packets_per_io: m.busy_polled.and_then(|n| per_io(n as f64)),
        knobs,
        queues: shared
            .queues
            .iter()
            .map(|q| QueueInfo { set: names[q.kind as usize].to_string(), qid: q.qid, cpu: q.cpu })
            .collect(),
        queue_failures,
        verified: opts.verify != VerifyMode::Off,
    };
    (report, latencies)
}

/// One group's results: its jobs' counts and latencies summed, rates over `secs`; and
/// those latencies.
fn group_report(g: &JobGroup, results: &[(String, JobResult)], secs: f64) -> (GroupReport, GroupLatencies) {
    let mut agg = JobResult::default();
    for (_, r) in results.iter().filter(|(n, _)| *n == g.name) {
        agg.read_lat.merge(&r.read_lat);
        agg.write_lat.merge(&r.write_lat);
        agg.reads += r.reads;
        agg.writes += r.writes;
        agg.bytes += r.bytes;
        agg.errors += r.errors;
        agg.mismatches += r.mismatches;
    }
    let ops = agg.reads + agg.writes;
    let report = GroupReport {
        name: g.name.clone(),
        rw: g.rw_name(),
        bs_bytes: g.bs,
        qd: g.qd,
        jobs: g.jobs,
        ops,
        reads: agg.reads,
        writes: agg.writes,
        iops: ops as f64 / secs,
        mb_per_s: agg.bytes as f64 / secs / 1e6,
        read_lat_ns: agg.read_lat.summary(),
        write_lat_ns: agg.write_lat.summary(),
        errors: agg.errors,
        mismatches: agg.mismatches,
    };
    (report, GroupLatencies { name: g.name.clone(), read: agg.read_lat, write: agg.write_lat })
}

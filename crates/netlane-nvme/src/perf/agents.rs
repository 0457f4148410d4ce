//! One workload from several hosts at once, as fio's `--client` runs a job file on each
//! of its servers: every agent runs the whole workload against the target (N hosts make
//! N times the load) and sends back its report and each group's latencies; the parts are
//! merged exactly.

use netlane::metrics::cpu::CpuTime;
use netlane::metrics::hist::Hist;
use serde::{Deserialize, Serialize};

use super::{GroupReport, PerfError, PerfOptions, PerfReport, VerifyMode};

/// One group's latencies in a run.
#[derive(Debug, Clone)]
pub struct GroupLatencies {
    /// The group's name.
    pub name: String,
    /// Its reads', ns.
    pub read: Hist,
    /// Its writes', ns.
    pub write: Hist,
}

/// What an agent sends beside its report: each group's latencies.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AgentOutput {
    /// The groups, in the workload's order.
    pub groups: Vec<GroupHdr>,
}

/// One group's latency histograms: HdrHistogram's V2 serialized form, base64.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct GroupHdr {
    /// The group's name.
    pub name: String,
    /// Its reads'.
    pub read_hdr: String,
    /// Its writes'.
    pub write_hdr: String,
}

impl AgentOutput {
    /// The output of a run whose groups' latencies are `groups`.
    pub fn of(groups: &[GroupLatencies]) -> AgentOutput {
        let groups = groups
            .iter()
            .map(|g| GroupHdr { name: g.name.clone(), read_hdr: g.read.encoded(), write_hdr: g.write.encoded() })
            .collect();
        AgentOutput { groups }
    }

    /// The latencies back, each histogram checked as it is read.
    pub fn decode(&self) -> Result<Vec<GroupLatencies>, PerfError> {
        let hist = |name: &str, which: &str, text: &str| {
            Hist::decode(text).map_err(|e| PerfError::Invalid(format!("group {name}: {which} latencies: {e}")))
        };
        self.groups
            .iter()
            .map(|g| {
                Ok(GroupLatencies {
                    name: g.name.clone(),
                    read: hist(&g.name, "read", &g.read_hdr)?,
                    write: hist(&g.name, "write", &g.write_hdr)?,
                })
            })
            .collect()
    }
}

/// More than any run counts (ten million I/Os a second for four days, over a hundred
/// times): an agent's counts past it are not a run's, and sums of them cannot overflow.
const MAX_COUNT: u64 = 1 << 47;

/// Checks that every agent's part is a run of the workload, with figures any run could
/// give; returns the longest measured time.
fn check_parts(opts: &PerfOptions, parts: &[(PerfReport, Vec<GroupLatencies>)]) -> Result<f64, PerfError> {
    let invalid = |i: usize, what: String| PerfError::Invalid(format!("agent {}: {what}", i + 1));
    if parts.is_empty() {
        return Err(PerfError::Invalid("no agents' runs to merge".into()));
    }
    let mut seconds: f64 = 0.0;
    for (i, (report, lat)) in parts.iter().enumerate() {
        if !(report.seconds.is_finite() && report.seconds > 0.0 && report.seconds <= 1e6) {
            return Err(invalid(i, format!("measured for {} s", report.seconds)));
        }
        let c = &report.host_cpu;
        let figures = [c.user_s, c.system_s, report.cmds_per_send.unwrap_or(0.0)];
        if figures.iter().chain(report.groups.iter().map(|g| &g.mb_per_s)).any(|v| !(v.is_finite() && *v >= 0.0)) {
            return Err(invalid(i, "a CPU time, rate or ratio that is not a finite, non-negative number".into()));
        }
        seconds = seconds.max(report.seconds);
        if report.groups.len() != opts.groups.len() || lat.len() != opts.groups.len() {
            return Err(invalid(i, format!("{} groups, the workload has {}", report.groups.len(), opts.groups.len())));
        }
        for ((g, l), want) in report.groups.iter().zip(lat).zip(&opts.groups) {
            if let Some(name) = [&g.name, &l.name].into_iter().find(|n| **n != want.name) {
                return Err(invalid(i, format!("group {name} where the workload has {}", want.name)));
            }
            if [g.ops, g.reads, g.writes, g.errors, g.mismatches].iter().any(|&n| n > MAX_COUNT) {
                return Err(invalid(i, format!("group {}: more commands than any run makes", g.name)));
            }
            if l.read.count() != g.reads || l.write.count() != g.writes {
                return Err(invalid(
                    i,
                    format!(
                        "group {}: {} read and {} write latencies for {} reads and {} writes",
                        g.name,
                        l.read.count(),
                        l.write.count(),
                        g.reads,
                        g.writes
                    ),
                ));
            }
        }
    }
    Ok(seconds)
}

/// The agents' parts of a run of `opts` (each report and its groups' latencies) as one
/// report: counts summed, latencies merged, rates over the longest measured time (they
/// start together), host CPU summed over the agents' processes. The target's CPU is
/// not any agent's to measure, so the merge has none. A part that is not a run of
/// `opts`, or whose latencies are not one per command, is refused.
pub fn merge(opts: &PerfOptions, parts: &[(PerfReport, Vec<GroupLatencies>)]) -> Result<PerfReport, PerfError> {
    let seconds = check_parts(opts, parts)?;
    let groups: Vec<GroupReport> = opts
        .groups
        .iter()
        .enumerate()
        .map(|(j, want)| {
            let (mut read, mut write) = (Hist::new(), Hist::new());
            let (mut reads, mut writes, mut errors, mut mismatches, mut mb) = (0, 0, 0, 0, 0.0);
            for (report, lat) in parts {
                let g = &report.groups[j];
                read.merge(&lat[j].read);
                write.merge(&lat[j].write);
                reads += g.reads;
                writes += g.writes;
                errors += g.errors;
                mismatches += g.mismatches;
                mb += g.mb_per_s * report.seconds;
            }
            GroupReport {
                name: want.name.clone(),
                rw: want.rw_name(),
                bs_bytes: want.bs,
                qd: want.qd,
                jobs: want.jobs.saturating_mul(parts.len() as u32),
                ops: reads + writes,
                reads,
                writes,
                iops: (reads + writes) as f64 / seconds,
                mb_per_s: mb / seconds,
                read_lat_ns: read.summary(),
                write_lat_ns: write.summary(),
                errors,
                mismatches,
            }
        })
        .collect();
    let ops: u64 = groups.iter().map(|g| g.ops).sum();
    let host_cpu = parts.iter().fold(CpuTime::default(), |a, (r, _)| CpuTime {
        user_s: a.user_s + r.host_cpu.user_s,
        system_s: a.system_s + r.host_cpu.system_s,
        voluntary_switches: a.voluntary_switches.saturating_add(r.host_cpu.voluntary_switches),
        involuntary_switches: a.involuntary_switches.saturating_add(r.host_cpu.involuntary_switches),
    });
    let per_io = |x: f64| (ops > 0).then(|| x / ops as f64);
    // A figure of the host's NAPI threads: every agent's, when each agent could read its
    // own. An agent without NAPI threads adds nothing; one whose threads were unreadable
    // leaves the total unknown; with none anywhere there is no figure (as in one run).
    let napi = |f: fn(&PerfReport) -> Option<f64>| {
        if parts.iter().all(|(r, _)| r.host_napi_threads.is_empty()) {
            return None;
        }
        summed_per_io(parts, |r| if r.host_napi_threads.is_empty() { Some(0.0) } else { f(r) }).and_then(per_io)
    };
    let sum = |f: fn(&PerfReport) -> u64| parts.iter().map(|(r, _)| f(r)).fold(0u64, u64::saturating_add);
    let send_calls = sum(|r| r.send_calls);
    // Each agent's commands per send, weighted by its sends (of the agents that have one).
    let (weighted, weights) = parts
        .iter()
        .filter_map(|(r, _)| Some((r.cmds_per_send? * r.send_calls as f64, r.send_calls as f64)))
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    Ok(PerfReport {
        groups,
        seconds,
        ops,
        iops: ops as f64 / seconds,
        host_cpu,
        host_cpu_us_per_io: per_io(host_cpu.total_s() * 1e6),
        host_switches_per_io: per_io(host_cpu.voluntary_switches.saturating_add(host_cpu.involuntary_switches) as f64),
        target_cpu_us_per_io: None,
        host_napi_threads: parts.iter().flat_map(|(r, _)| r.host_napi_threads.iter().cloned()).collect(),
        host_napi_cpu_us_per_io: napi(|r| r.host_napi_cpu_us_per_io),
        target_threads: Vec::new(),
        direct_sends: sum(|r| r.direct_sends),
        worker_sends: sum(|r| r.worker_sends),
        send_calls,
        cmds_per_send: (weights > 0.0).then(|| weighted / weights),
        // Each agent's wake-ups, weighted by its commands (of the agents that have them).
        worker_wakes_per_io: summed_per_io(parts, |r| r.worker_wakes_per_io).and_then(per_io),
        job_sleeps_per_io: summed_per_io(parts, |r| r.job_sleeps_per_io).and_then(per_io),
        host_napi_runs_per_io: napi(|r| r.host_napi_runs_per_io),
        busy_polled_packets_per_io: summed_per_io(parts, |r| r.busy_polled_packets_per_io).and_then(per_io),
        knobs: parts.iter().flat_map(|(r, _)| r.knobs.iter().cloned()).collect(),
        queues: parts.iter().flat_map(|(r, _)| r.queues.iter().cloned()).collect(),
        queue_failures: sum(|r| r.queue_failures),
        verified: opts.verify != VerifyMode::Off,
    })
}

/// A per-I/O figure of every agent's part back to a total (its value times its
/// commands, summed); `None` when any agent lacks it.
fn summed_per_io<T>(parts: &[(PerfReport, T)], f: impl Fn(&PerfReport) -> Option<f64>) -> Option<f64> {
    parts.iter().map(|(r, _)| f(r).map(|v| v * r.ops as f64)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::JobGroup;

    fn opts() -> PerfOptions {
        PerfOptions {
            connect: crate::host::ConnectOptions::new("10.0.0.1:4420".parse().unwrap(), "nqn.test"),
            nsid: 1,
            groups: vec![JobGroup::parse("name=rd,rw=randread,bs=4k,qd=4,jobs=2").unwrap()],
            duration: std::time::Duration::from_secs(2),
            ramp: std::time::Duration::ZERO,
            queues: 1,
            read_queues: 0,
            poll_queues: 0,
            queue_cpus: netlane::cpus::CpuList::one(0),
            queue_depth: 128,
            direct_send: false,
            batch: true,
            wake_each: false,
            caravan: None,
            verify: VerifyMode::Off,
            size: None,
            target_pid: None,
            target_threads: Vec::new(),
            busy_poll: None,
            napi: Default::default(),
            coalesce: Default::default(),
        }
    }

    /// One agent's run of `opts()`: `lat` read latencies (ns) over `seconds`.
    fn part(lat: &[u64], seconds: f64, cpu_s: f64) -> (PerfReport, Vec<GroupLatencies>) {
        let mut read = Hist::new();
        for &v in lat {
            read.record(v);
        }
        let n = lat.len() as u64;
        let group = GroupReport {
            name: "rd".into(),
            rw: "randread".into(),
            bs_bytes: 4096,
            qd: 4,
            jobs: 2,
            ops: n,
            reads: n,
            writes: 0,
            iops: n as f64 / seconds,
            mb_per_s: (n * 4096) as f64 / seconds / 1e6,
            read_lat_ns: read.summary(),
            write_lat_ns: Default::default(),
            errors: 0,
            mismatches: 0,
        };
        let report = PerfReport {
            groups: vec![group],
            seconds,
            ops: n,
            iops: n as f64 / seconds,
            host_cpu: CpuTime { user_s: cpu_s, ..CpuTime::default() },
            host_cpu_us_per_io: None,
            host_switches_per_io: None,
            target_cpu_us_per_io: Some(3.0),
            host_napi_threads: vec![format!("napi/tx0-{n} (1)")],
            host_napi_cpu_us_per_io: Some(1.0),
            target_threads: Vec::new(),
            direct_sends: 1,
            job_sleeps_per_io: None,
            host_napi_runs_per_io: None,
            busy_polled_packets_per_io: None,
            knobs: Vec::new(),
            worker_sends: n,
            send_calls: n,
            cmds_per_send: Some(2.0),
            worker_wakes_per_io: Some(0.5),
            queues: Vec::new(),
            queue_failures: 0,
            verified: false,
        };
        (report, vec![GroupLatencies { name: "rd".into(), read, write: Hist::new() }])
    }

    #[test]
    fn parts_merge_into_one_run_with_every_latency() {
        let fast: Vec<u64> = (0..900).map(|i| 10_000 + i).collect();
        let slow: Vec<u64> = (0..100).map(|i| 1_000_000 + i).collect();
        let parts = [part(&fast, 2.0, 0.5), part(&slow, 1.9, 0.25)];
        // Through the wire form, as the coordinator gets them.
        let parts: Vec<_> = parts.into_iter().map(|(r, l)| (r, AgentOutput::of(&l).decode().unwrap())).collect();
        let m = merge(&opts(), &parts).unwrap();
        let g = &m.groups[0];
        assert_eq!((g.ops, g.reads, g.jobs), (1000, 1000, 4));
        assert_eq!(m.seconds, 2.0);
        assert!((m.iops - 500.0).abs() < 1e-9);
        assert!((g.mb_per_s - 1000.0 * 4096.0 / 2.0 / 1e6).abs() < 1e-9);
        // The slow agent's tenth of the commands is the merged tail: p50 fast, p99 slow.
        assert!(g.read_lat_ns.p50 < 20_000 && g.read_lat_ns.p99 >= 1_000_000, "{:?}", g.read_lat_ns);
        assert_eq!(g.read_lat_ns.count, 1000);
        assert!((m.host_cpu_us_per_io.unwrap() - 0.75e6 / 1000.0).abs() < 1e-6);
        assert_eq!(m.target_cpu_us_per_io, None);
        // Each agent's NAPI threads: 1 us per I/O each, named each.
        assert!((m.host_napi_cpu_us_per_io.unwrap() - 1.0).abs() < 1e-9, "{:?}", m.host_napi_cpu_us_per_io);
        assert_eq!(m.host_napi_threads.len(), 2);
        assert_eq!(m.cmds_per_send, Some(2.0));
        // An agent without NAPI threads adds nothing to them; with none anywhere, the
        // merged run has no NAPI figure (not a measured zero), as one run has none.
        let mut bare = parts.clone();
        bare[1].0.host_napi_threads.clear();
        bare[1].0.host_napi_cpu_us_per_io = None;
        let m = merge(&opts(), &bare).unwrap();
        assert!((m.host_napi_cpu_us_per_io.unwrap() - 0.9).abs() < 1e-9, "{:?}", m.host_napi_cpu_us_per_io);
        bare[0].0.host_napi_threads.clear();
        let m = merge(&opts(), &bare).unwrap();
        assert_eq!((m.host_napi_cpu_us_per_io, m.host_napi_runs_per_io), (None, None));
    }

    #[test]
    fn parts_that_are_not_runs_of_the_workload_are_refused() {
        let lat: Vec<u64> = (1..=10).collect();
        let mut short = part(&lat, 1.0, 0.1);
        short.0.groups[0].reads = 11;
        let e = merge(&opts(), &[part(&lat, 1.0, 0.1), short]).unwrap_err().to_string();
        assert!(e.contains("agent 2: group rd: 10 read and 0 write latencies for 11 reads"), "{e}");
        let mut renamed = part(&lat, 1.0, 0.1);
        renamed.0.groups[0].name = "wr".into();
        assert!(merge(&opts(), &[renamed]).unwrap_err().to_string().contains("group wr where the workload has rd"));
        let mut huge = part(&lat, 1.0, 0.1);
        huge.0.groups[0].errors = u64::MAX;
        assert!(merge(&opts(), &[huge]).is_err());
        assert!(merge(&opts(), &[part(&lat, f64::NAN, 0.1)]).is_err());
        assert!(merge(&opts(), &[part(&lat, 1.0, f64::INFINITY)]).unwrap_err().to_string().contains("not a finite"));
        assert!(merge(&opts(), &[]).is_err());
        let bad =
            AgentOutput { groups: vec![GroupHdr { name: "rd".into(), read_hdr: "x".into(), write_hdr: "".into() }] };
        assert!(bad.decode().unwrap_err().to_string().starts_with("group rd: read latencies"));
    }
}

//! The nvme scenario's load generator as a process: `netlane nvme perf` for a
//! [`PerfOptions`], its report read from its JSON.

use anyhow::{Context, Result};
use netlane_nvme::perf::{CpuBinding, PerfOptions, PerfReport, VerifyMode};
use serde::Deserialize;

use crate::host::{Finished, RoleSpec};

/// The arguments after `netlane` that run `o`, every option written out (the command
/// line's tests read them back into the same options). A caravan other than the i10
/// default has no option, nor does a connection timeout other than the default: `o`
/// must not ask for them.
pub fn perf_args(o: &PerfOptions) -> Vec<String> {
    let mut a: Vec<String> = ["nvme", "perf", "--json", "-"].map(String::from).to_vec();
    let mut opt = |name: &str, value: String| {
        a.push(format!("--{name}"));
        a.push(value);
    };
    let c = &o.connect;
    opt("target", c.addr.to_string());
    opt("nqn", c.subnqn.clone());
    opt("nsid", o.nsid.to_string());
    for g in &o.groups {
        opt("group", g.to_string());
    }
    opt("time", format!("{}ns", o.duration.as_nanos()));
    opt("ramp", format!("{}ns", o.ramp.as_nanos()));
    opt("queues", o.queues.to_string());
    opt("read-queues", o.read_queues.to_string());
    opt("poll-queues", o.poll_queues.to_string());
    opt("queue-cpus", o.queue_cpus.to_string());
    opt("queue-depth", o.queue_depth.to_string());
    opt("kato", format!("{}ms", c.kato_ms));
    if let Some(s) = o.size {
        opt("size", s.to_string());
    }
    if let Some(p) = o.target_pid {
        opt("target-pid", p.to_string());
    }
    let flags = [
        ("direct-send", o.direct_send),
        ("no-batch", !o.batch),
        ("caravan", o.caravan.is_some()),
        ("verify", o.verify == VerifyMode::Write),
        ("verify-only", o.verify == VerifyMode::ReadBack),
        ("hdgst", c.hdgst),
        ("ddgst", c.ddgst),
        ("sqflow", !c.disable_sqflow),
    ];
    for (flag, on) in flags {
        if on {
            a.push(format!("--{flag}"));
        }
    }
    a
}

/// `netlane nvme perf` for `o`, pinned to the CPUs its jobs and I/O workers run on (not
/// pinned when a group is unbound).
pub fn perf_spec(o: &PerfOptions) -> RoleSpec {
    let spec = RoleSpec::netlane("netlane nvme perf", perf_args(o));
    let mut cpus: Vec<usize> = o.queue_cpus.as_slice().to_vec();
    for g in &o.groups {
        match &g.cpus {
            CpuBinding::Pinned(c) => cpus.extend_from_slice(c.as_slice()),
            CpuBinding::Unbound => return spec,
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    spec.on_cpus(&cpus)
}

/// What the run measured, from the JSON document it wrote.
pub fn perf_report(f: &Finished) -> Result<PerfReport> {
    #[derive(Deserialize)]
    struct NvmePerf {
        report: PerfReport,
    }
    Ok(f.json::<NvmePerf>().context("read nvme perf's report")?.report)
}

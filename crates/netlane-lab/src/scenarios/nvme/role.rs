//! The nvme scenario's load generator as a process: `netlane nvme perf` for a
//! [`PerfOptions`], its report read from its JSON.

use anyhow::{Context, Result};
use netlane_nvme::perf::{CpuBinding, PerfOptions, PerfReport, VerifyMode};
use serde::Deserialize;

use crate::host::{Args, Finished, RoleSpec};

/// The arguments after `netlane` that run `o`, every option written out (the command
/// line's tests read them back into the same options). A caravan other than the i10
/// default has no option, nor does a connection timeout other than the default: `o`
/// must not ask for them.
pub fn perf_args(o: &PerfOptions) -> Vec<String> {
    let mut a = Args::new(&["nvme", "perf", "--json", "-"]);
    let c = &o.connect;
    a.opt("target", c.addr).opt("nqn", &c.subnqn).opt("nsid", o.nsid);
    for g in &o.groups {
        a.opt("group", g);
    }
    a.duration("time", o.duration)
        .duration("ramp", o.ramp)
        .opt("queues", o.queues)
        .opt("read-queues", o.read_queues)
        .opt("poll-queues", o.poll_queues)
        .opt("queue-cpus", &o.queue_cpus)
        .opt("queue-depth", o.queue_depth)
        .opt("kato", format!("{}ms", c.kato_ms))
        .opt_some("size", o.size)
        .opt_some("target-pid", o.target_pid)
        .opt_some(
            "target-threads",
            (!o.target_threads.is_empty())
                .then(|| o.target_threads.iter().map(u32::to_string).collect::<Vec<_>>().join(",")),
        )
        .flag("direct-send", o.direct_send)
        .flag("no-batch", !o.batch)
        .flag("wake-each", o.wake_each)
        .flag("caravan", o.caravan.is_some())
        .flag("verify", o.verify == VerifyMode::Write)
        .flag("verify-only", o.verify == VerifyMode::ReadBack)
        .flag("hdgst", c.hdgst)
        .flag("ddgst", c.ddgst)
        .flag("sqflow", !c.disable_sqflow)
        .opt_some("busy-poll", o.busy_poll)
        .napi(&o.napi);
    for (name, value) in &o.coalesce {
        a.opt("coalesce", format!("{name}={value}"));
    }
    a.into_vec()
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

/// `netlane nvme perf --agent` for `o`, called `name`: ready when it says so (its queues
/// connected), its jobs start on SIGUSR1.
pub fn perf_agent_spec(name: &str, o: &PerfOptions) -> RoleSpec {
    let mut spec = perf_spec(o);
    spec.name = name.to_string();
    spec.args.push("--agent".into());
    spec.ready_on_stderr("ready", std::time::Duration::from_secs(60))
}

/// What the run measured, from the JSON document it wrote.
pub fn perf_report(f: &Finished) -> Result<PerfReport> {
    #[derive(Deserialize)]
    struct NvmePerf {
        report: PerfReport,
    }
    Ok(f.json::<NvmePerf>().context("read nvme perf's report")?.report)
}

//! `nvme perf` from several hosts at once, one measurement: each host runs the whole
//! workload (as fio's `--client` does) as a `netlane nvme perf --agent`, connects its
//! queues, says it is ready, and starts its jobs when the coordinator gives the word;
//! each sends back its report and its groups' latency histograms, and the run is their
//! exact merge.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use netlane::cpus::CpuList;
use netlane_nvme::perf::{self, AgentOutput, GroupLatencies, PerfOptions, PerfReport};
use serde::{Deserialize, Serialize};

use super::role::perf_agent_spec;
use crate::host::{Agent, RoleProcess, start_together};

/// What one agent did in a run (its first group's figures, as the lab's tables show).
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct NvmeAgent {
    /// Its host.
    pub host: String,
    /// I/Os per second it completed, every group.
    pub iops: f64,
    /// Its first group's latencies, ns (of the group's main direction).
    pub latency_ns: netlane::metrics::hist::Summary,
    /// Its process's CPU per I/O, us.
    pub host_cpu_us_per_io: Option<f64>,
    /// Its commands that failed or read back wrong.
    pub errors: u64,
}

/// `opts` run from every host of `agents` at once (each the whole workload), merged into
/// one report, with each agent's part. An agent's queues go on its own CPUs where it has
/// some, else on every CPU of its host with `every_cpu` (the machines need not have the
/// same CPUs), else on `opts`'s.
pub fn run_perf(agents: &[Agent<'_>], opts: &PerfOptions, every_cpu: bool) -> Result<(PerfReport, Vec<NvmeAgent>)> {
    if agents.is_empty() {
        bail!("no hosts to run nvme perf from");
    }
    let limit = opts.ramp + opts.duration + Duration::from_secs(60);
    let mut specs = Vec::with_capacity(agents.len());
    for (i, a) in agents.iter().enumerate() {
        let queue_cpus = match a.own_cpus() {
            Some(cpus) => CpuList::new(cpus),
            None if every_cpu => {
                let online = a.host.read_file("/sys/devices/system/cpu/online")?;
                online.trim().parse().with_context(|| format!("{}'s online CPUs ({})", a.host.name(), online.trim()))?
            }
            None => opts.queue_cpus.clone(),
        };
        let placed = PerfOptions { queue_cpus, ..opts.clone() };
        specs.push((a.host, perf_agent_spec(&format!("nvme perf agent {} on {}", i + 1, a.host.name()), &placed)));
    }
    let roles = start_together(&specs)?;
    let hosts: Vec<String> = agents.iter().map(|a| a.host.name()).collect();
    let (parts, summaries) = collect(roles, &hosts, limit)?;
    Ok((perf::merge(opts, &parts)?, summaries))
}

/// One agent's part of a run: its report and its groups' latency histograms.
pub(super) type AgentPart = (PerfReport, Vec<GroupLatencies>);

/// Every started agent's part and what it did, in order (`hosts`: where each ran), each
/// waited for at most `limit`; an error when one failed or sent no histograms.
pub(super) fn collect(
    roles: Vec<RoleProcess>,
    hosts: &[String],
    limit: Duration,
) -> Result<(Vec<AgentPart>, Vec<NvmeAgent>)> {
    let mut parts = Vec::with_capacity(roles.len());
    let mut summaries = Vec::with_capacity(roles.len());
    for (role, host) in roles.into_iter().zip(hosts) {
        let finished = role.wait(limit)?;
        if !finished.status.success() {
            bail!("the agent on {host} failed ({}): {}", finished.status, finished.stderr_tail());
        }
        #[derive(Deserialize)]
        struct NvmePerf {
            report: PerfReport,
            agent: Option<AgentOutput>,
        }
        let doc: NvmePerf = finished.json().with_context(|| format!("read the report of the agent on {host}"))?;
        let output = doc.agent.with_context(|| format!("the agent on {host} sent no histograms"))?;
        let latencies = output.decode().with_context(|| format!("the agent on {host}"))?;
        let r = &doc.report;
        let first = r.groups.first().context("a report without groups")?;
        let l = if first.reads > 0 { first.read_lat_ns } else { first.write_lat_ns };
        summaries.push(NvmeAgent {
            host: host.clone(),
            iops: r.iops,
            latency_ns: l,
            host_cpu_us_per_io: r.host_cpu_us_per_io,
            errors: r.groups.iter().fold(0u64, |n, g| n.saturating_add(g.errors).saturating_add(g.mismatches)),
        });
        parts.push((doc.report, latencies));
    }
    Ok((parts, summaries))
}

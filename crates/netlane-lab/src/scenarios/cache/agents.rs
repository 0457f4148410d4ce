//! The load generator on several hosts at once, one measurement: each host runs a
//! `netlane kv load` agent with its share of the connections and the rate (the kv crate's
//! `split`); every agent connects, says it is ready, and starts its schedule on its own
//! clock when the coordinator gives the word (SIGUSR1, an order over SSH); each sends
//! back its whole latency histogram, and the run is their exact merge. A rate search
//! bisects over the merged percentile; an agent that lagged behind its schedule makes the
//! run one that measured its generator, as one generator's lag does.

use std::cell::RefCell;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use netlane_kv::load::search::SearchConfig;
use netlane_kv::load::stats::Sla;
use netlane_kv::loadgen::{self, LoadConfig, LoadReport, Run, RunPoint, SearchReport};
use serde::{Deserialize, Serialize};

use super::role::{KvLoad, LoadStep, load_on, load_spec, time_limit};
pub use crate::host::Agent;
use crate::host::start_together;

/// What one agent did in a run.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AgentSummary {
    /// Its host.
    pub host: String,
    /// Its connections.
    pub connections: u32,
    /// Requests it offered per second of the window.
    pub offered_per_s: f64,
    /// Requests completed per second of the window.
    pub achieved_per_s: f64,
    /// Share of its sends it delayed itself past the tolerance.
    pub lag_share: f64,
    /// CPU time of its threads, s.
    pub cpu_s: f64,
    /// That over its threads' wall time.
    pub cpu_busy: f64,
    /// Its connections that failed.
    pub connection_failures: u64,
}

/// A run made by agents: the merged run, and each agent's part.
#[derive(Debug)]
pub struct AgentsRun {
    /// The merged run (the whole configuration's report, every agent's histogram).
    pub run: Run,
    /// Each agent's part, in the agents' order.
    pub agents: Vec<AgentSummary>,
}

impl AgentsRun {
    /// The run judged against `sla` over a window of `cfg`'s length, its lag the worst
    /// agent's (one agent behind its schedule spoils the run, however many kept theirs).
    pub fn measure(&self, sla: &Sla, cfg: &LoadConfig) -> netlane_kv::load::stats::Measurement {
        let mut m = self.run.stats.measure(sla, cfg.duration.as_nanos() as u64);
        m.lag_share = self.agents.iter().map(|a| a.lag_share).fold(m.lag_share, f64::max);
        m
    }
}

/// How long an agent may take to open its connections and say so.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// One run of `cfg` made by `agents`, split between them.
pub fn run_agents(agents: &[Agent<'_>], cfg: &LoadConfig) -> Result<AgentsRun> {
    let shares = loadgen::split(cfg, agents.len())?;
    let mut specs = Vec::with_capacity(agents.len());
    let mut placed = Vec::with_capacity(agents.len());
    for (i, (agent, share)) in agents.iter().zip(shares).enumerate() {
        let share = LoadConfig { cpus: agent.own_cpus().or(share.cpus), ..share };
        let name = format!("kv load agent {} on {}", i + 1, agent.host.name());
        specs.push((agent.host, load_spec(&name, &share, LoadStep::Agent).ready_on_stderr("ready", READY_WITHIN)));
        placed.push((agent.host.name(), share));
    }
    let roles = start_together(&specs)?;
    let mut outputs = Vec::with_capacity(roles.len());
    let mut summaries = Vec::with_capacity(roles.len());
    for (role, (host, share)) in roles.into_iter().zip(placed) {
        let finished = role.wait(time_limit(&share, LoadStep::Agent))?;
        if !finished.status.success() {
            bail!("the agent on {host} failed ({}): {}", finished.status, finished.stderr_tail());
        }
        let doc: KvLoad = finished.json().with_context(|| format!("read the report of the agent on {host}"))?;
        let output = doc.agent.with_context(|| format!("the agent on {host} sent no histogram"))?;
        let stats = output.stats().with_context(|| format!("the agent on {host}"))?;
        let own = LoadReport::summarize(&share, &stats, output.connection_failures, output.cpu_s, output.wall_s);
        summaries.push(AgentSummary {
            host,
            connections: share.connections,
            offered_per_s: own.offered_per_s,
            achieved_per_s: own.achieved_per_s,
            lag_share: own.lag_share,
            cpu_s: own.client_cpu_s,
            cpu_busy: own.client_cpu_busy,
            connection_failures: own.connection_failures,
        });
        outputs.push(output);
    }
    let run = loadgen::merge(cfg, &outputs)?;
    Ok(AgentsRun { run, agents: summaries })
}

/// Stores the key space through the first agent's host.
pub fn warm_up_agents(agents: &[Agent<'_>], cfg: &LoadConfig) -> Result<u64> {
    let first = agents.first().context("no agents")?;
    load_on(first.host, cfg, LoadStep::WarmUp)?.warmed_up_keys.context("the load generator stored no keys")
}

/// One rate of a search, as its runs' agents did it.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AgentsStep {
    /// The rate asked for, requests/s.
    pub rate_per_s: f64,
    /// Each agent's part of the run.
    pub agents: Vec<AgentSummary>,
}

/// The highest rate within `sla` in `range` that `agents` together offer a server, each
/// run a merge of theirs ([`loadgen::search_with`]); `progress` sees every run and its
/// agents as it ends. Also every run's agents.
pub fn search_agents(
    agents: &[Agent<'_>],
    cfg: &LoadConfig,
    sla: Sla,
    range: SearchConfig,
    stop: &AtomicBool,
    mut progress: impl FnMut(&RunPoint, &[AgentSummary]),
) -> Result<(SearchReport, Vec<AgentsStep>)> {
    let steps = RefCell::new(Vec::new());
    let report = loadgen::search_with(
        cfg,
        sla,
        range,
        stop,
        |p| progress(p, steps.borrow().last().map_or(&[][..], |s: &AgentsStep| &s.agents[..])),
        |c: &LoadConfig| -> Result<_> {
            let r = run_agents(agents, c)?;
            let rate = match c.pacing {
                netlane_kv::load::schedule::Pacing::Open(a) => a.rate_per_s,
                netlane_kv::load::schedule::Pacing::Closed { .. } => 0.0,
            };
            let m = r.measure(&sla, c);
            steps.borrow_mut().push(AgentsStep { rate_per_s: rate, agents: r.agents });
            Ok(m)
        },
    )?;
    Ok((report, steps.into_inner()))
}

//! `netlane kv load --agents` (the coordinator: agents on other hosts over SSH, one
//! merged measurement) and `netlane kv load --agent` (one agent, as the coordinator
//! starts it).

use anyhow::Result;
use netlane_kv::load::schedule::Pacing;
use netlane_kv::load::search::SearchConfig;
use netlane_kv::load::stats::Sla;
use netlane_kv::loadgen::{self, AgentOutput, LoadConfig, LoadError, Run, SearchReport};
use netlane_lab::scenarios::kv::{Agent, AgentSummary, AgentsStep, run_agents, search_agents, warm_up_agents};

use super::load::{LoadArgs, progress_line};
use crate::agents::AgentHosts;
use crate::documents::KvLoad;
use crate::out::{self, OutputArgs};
use crate::signals::{STOP, StartGate};

/// `--agent`: opens every connection, says `ready`, starts on SIGUSR1, and writes the
/// run with its whole histogram. The coordinator judges it, so a run that measured
/// nothing is written and exits 0 like any other.
pub(super) fn run_as_agent(cfg: &LoadConfig, mut doc: KvLoad, out: &OutputArgs) -> Result<u8> {
    let gate = StartGate::register()?;
    let ready = format!("ready: {} connections to {}", cfg.connections, cfg.server);
    let run = loadgen::run_gated(cfg, STOP.flag(), || gate.wait(&ready).map_err(LoadError::Config))?;
    doc.agent = Some(AgentOutput::of(&run));
    doc.report = Some(run.report);
    out.write_json(&netlane_report::document("kv-load", doc))?;
    Ok(0)
}

/// The agents' hosts, connected.
pub(super) struct Coordinator {
    hosts: AgentHosts,
}

impl Coordinator {
    /// Connects to every host of `--agents` (their netlane checked).
    pub(super) fn connect(a: &LoadArgs) -> Result<Coordinator> {
        Ok(Coordinator { hosts: a.hosts.connect()? })
    }

    fn agents(&self) -> Vec<Agent<'_>> {
        self.hosts.agents()
    }

    /// Stores every key from the first agent's host.
    pub(super) fn warm_up(&self, cfg: &LoadConfig) -> Result<u64> {
        warm_up_agents(&self.agents(), cfg)
    }

    /// One run, merged, and what each agent did.
    pub(super) fn run(&self, cfg: &LoadConfig) -> Result<(Run, AgentsStep)> {
        let r = run_agents(&self.agents(), cfg)?;
        let rate = match cfg.pacing {
            Pacing::Open(a) => a.rate_per_s,
            Pacing::Closed { .. } => 0.0,
        };
        Ok((r.run, AgentsStep { rate_per_s: rate, agents: r.agents }))
    }

    /// A search over merged runs.
    pub(super) fn search(
        &self,
        cfg: &LoadConfig,
        sla: Sla,
        range: SearchConfig,
    ) -> Result<(SearchReport, Vec<AgentsStep>)> {
        search_agents(&self.agents(), cfg, sla, range, STOP.flag(), |p, agents| {
            eprintln!("{}", progress_line(p, sla));
            for a in agents {
                eprintln!("    {}", agent_line(a));
            }
        })
    }
}

fn agent_line(a: &AgentSummary) -> String {
    format!(
        "{}: {} connections, offered {:.0}/s achieved {:.0}/s, lagged {:.2}%, CPU {:.2} s ({:.0}% busy){}",
        a.host,
        a.connections,
        a.offered_per_s,
        a.achieved_per_s,
        a.lag_share * 100.0,
        a.cpu_s,
        a.cpu_busy * 100.0,
        if a.connection_failures > 0 { format!(", {} connections failed", a.connection_failures) } else { "".into() }
    )
}

/// Each agent's part of a run, a line each.
pub(super) fn print_agents(agents: &[AgentSummary]) {
    for a in agents {
        out::println(&format!("agent {}", agent_line(a)));
    }
}

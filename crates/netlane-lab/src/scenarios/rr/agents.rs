//! The client population on several hosts at once, one measurement: each host runs a
//! `netlane rr clients --agent` with its share of the clients (the rr crate's `split`);
//! every agent makes its sockets, says it is ready, and starts when the coordinator
//! gives the word; each sends back its report and its whole latency histogram, and the
//! run is their exact merge.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use netlane::cpus::CpuList;
use netlane::metrics::hist::Hist;
use netlane_rr::clients::{self, AgentOutput, ClientsConfig, ClientsReport};
use serde::{Deserialize, Serialize};

use super::role::{agent_spec, clients_report, clients_spec};
use crate::host::{Agent, RoleProcess, start_together};

/// What one agent did in a run.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RrAgent {
    /// Its host.
    pub host: String,
    /// Its clients.
    pub clients: usize,
    /// Responses per second it measured.
    pub responses_per_s: f64,
    /// Its latencies, ns.
    pub latency_ns: netlane::metrics::hist::Summary,
    /// Requests it gave up.
    pub lost: u64,
    /// CPU time of its threads, s.
    pub cpu_s: f64,
}

/// The population `cfg` from `agents`: one host runs it alone (no parts to show), several
/// run their shares as agents of one measurement (each one's part shown); a population
/// of fewer clients than hosts runs on as many hosts as it has clients. `started` is
/// called once every host has its word to start (a reading taken around the run). The
/// merged latencies come back when agents ran it (one host alone sends none).
pub fn run_clients<T>(
    agents: &[Agent<'_>],
    cfg: &ClientsConfig,
    started: impl FnOnce() -> Result<T>,
) -> Result<(ClientsReport, Option<Hist>, Vec<RrAgent>, T)> {
    let limit = cfg.ramp + cfg.duration + Duration::from_secs(30);
    let placed = |a: &Agent<'_>, c: &ClientsConfig| ClientsConfig {
        cpus: a.own_cpus().map(CpuList::new).or(c.cpus.clone()),
        ..c.clone()
    };
    let agents = &agents[..agents.len().min(cfg.clients)];
    if let [one] = agents {
        let role = RoleProcess::start(one.host, &clients_spec(&placed(one, cfg)), None)?;
        let reading = started()?;
        return Ok((clients_report(&role.wait(limit)?)?, None, Vec::new(), reading));
    }
    let shares: Vec<ClientsConfig> =
        clients::split(cfg, agents.len())?.iter().zip(agents).map(|(s, a)| placed(a, s)).collect();
    let specs: Vec<_> = agents
        .iter()
        .zip(&shares)
        .enumerate()
        .map(|(i, (a, share))| (a.host, agent_spec(&format!("rr clients agent {} on {}", i + 1, a.host.name()), share)))
        .collect();
    let roles = start_together(&specs)?;
    let reading = started()?;
    let mut parts = Vec::with_capacity(roles.len());
    let mut summaries = Vec::with_capacity(roles.len());
    for ((role, a), share) in roles.into_iter().zip(agents).zip(&shares) {
        let host = a.host.name();
        let finished = role.wait(limit)?;
        if !finished.status.success() {
            bail!("the agent on {host} failed ({}): {}", finished.status, finished.stderr_tail());
        }
        #[derive(Deserialize)]
        struct RrClients {
            report: ClientsReport,
            agent: Option<AgentOutput>,
        }
        let doc: RrClients = finished.json().with_context(|| format!("read the report of the agent on {host}"))?;
        let output = doc.agent.with_context(|| format!("the agent on {host} sent no histogram"))?;
        let hist = Hist::decode(&output.latency_hdr).with_context(|| format!("the agent on {host}"))?;
        summaries.push(RrAgent {
            host,
            clients: share.clients,
            responses_per_s: doc.report.responses_per_s,
            latency_ns: doc.report.latency_ns,
            lost: doc.report.lost,
            cpu_s: doc.report.cpu_s,
        });
        parts.push((doc.report, hist));
    }
    let (report, hist) = clients::merge(cfg, &parts)?;
    Ok((report, Some(hist), summaries, reading))
}

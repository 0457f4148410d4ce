//! Where a cache scenario's roles run: the server's host, and the load generator's
//! hosts (one runs `netlane kv load` alone; several run it as agents of one merged
//! measurement). Two namespaces of this machine, or a testbed's machines.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use netlane::metrics::cpu::SystemCpu;
use netlane::topology::TwoHosts;
use netlane_kv::load::search::SearchConfig;
use netlane_kv::load::stats::Sla;
use netlane_kv::load::workload::WorkloadSpec;
use netlane_kv::loadgen::{LoadConfig, LoadReport, SearchReport};

use super::agents::{Agent, AgentSummary, run_agents, search_agents};
use super::role::{LoadStep, load_on};
use crate::host::Host;

/// Where a cache scenario's roles run.
pub(crate) struct CacheSite<'a> {
    /// The server's host.
    pub(crate) server: &'a dyn Host,
    /// The load generator's hosts, each with its CPUs (none: the configuration's).
    pub(crate) generators: Vec<Agent<'a>>,
}

impl<'a> CacheSite<'a> {
    /// The server in `h`'s receiving namespace, the generator in its sending one.
    pub(crate) fn two_hosts(h: &'a TwoHosts) -> CacheSite<'a> {
        CacheSite { server: &h.rx, generators: vec![Agent { host: &h.tx, cpus: Vec::new() }] }
    }

    /// `cfg` on the only generator (its CPUs when it has some).
    fn alone(&self, cfg: &LoadConfig) -> Option<(&'a dyn Host, LoadConfig)> {
        match self.generators.as_slice() {
            [one] => Some((one.host, LoadConfig { cpus: one.own_cpus().or(cfg.cpus.clone()), ..cfg.clone() })),
            _ => None,
        }
    }

    /// Stores the key space from the (first) generator's host: the keys stored.
    pub(crate) fn warm_up(&self, cfg: &LoadConfig) -> Result<u64> {
        let first = self.generators.first().context("no load generator host")?;
        load_on(first.host, cfg, LoadStep::WarmUp)?.warmed_up_keys.context("the load generator stored no keys")
    }

    /// One run: the generator's, or the agents' merged.
    pub(crate) fn run(&self, cfg: &LoadConfig) -> Result<LoadReport> {
        self.run_with_agents(cfg).map(|(r, _)| r)
    }

    /// [`CacheSite::run`], with each agent's part (none from one generator alone).
    pub(crate) fn run_with_agents(&self, cfg: &LoadConfig) -> Result<(LoadReport, Vec<AgentSummary>)> {
        match self.alone(cfg) {
            Some((host, cfg)) => {
                let r = load_on(host, &cfg, LoadStep::Run)?.report.context("the load generator reported no run")?;
                Ok((r, Vec::new()))
            }
            None => {
                let r = run_agents(&self.generators, cfg)?;
                Ok((r.run.report, r.agents))
            }
        }
    }

    /// The highest rate within `sla` in `range`.
    pub(crate) fn search(&self, cfg: &LoadConfig, sla: Sla, range: SearchConfig) -> Result<SearchReport> {
        match self.alone(cfg) {
            Some((host, cfg)) => load_on(host, &cfg, LoadStep::Search { sla, range })?
                .search
                .context("the load generator reported no search"),
            None => {
                let never = std::sync::atomic::AtomicBool::new(false);
                Ok(search_agents(&self.generators, cfg, sla, range, &never, |_, _| {})?.0)
            }
        }
    }

    /// The server host's CPU `cpu` counters, now.
    pub(crate) fn server_cpu(&self, cpu: usize) -> Result<SystemCpu> {
        crate::host::cpu_counters(self.server, cpu)
    }

    /// Waits (10 s at most) until a server accepts on `addr` from the generator's side
    /// (a one-key store from there); `what` names it in the error.
    pub(crate) fn wait_until_accepting(&self, addr: SocketAddr, what: &str) -> Result<()> {
        let first = self.generators.first().context("no load generator host")?;
        let probe = LoadConfig {
            server: addr,
            connections: 1,
            threads: 1,
            workload: WorkloadSpec { keys: 1, ..WorkloadSpec::default() },
            ..LoadConfig::default()
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let tried = load_on(first.host, &probe, LoadStep::WarmUp);
            if tried.as_ref().is_ok_and(|l| l.warmed_up_keys == Some(1)) {
                return Ok(());
            }
            if Instant::now() > deadline {
                let why = tried.err().map_or("it stored nothing".to_string(), |e| format!("{e:#}"));
                bail!("{what} did not accept connections on {addr} within 10 s ({why})");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

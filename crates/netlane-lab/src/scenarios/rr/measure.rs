//! The rr scenario's runs: the veth pairs they run on, and one exchange between the
//! server and a client population with the server CPU's time read around it.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use netlane::metrics::cpu::SystemCpuDelta;
use netlane::topology::TwoHosts;
use netlane_rr::clients::{ClientsConfig, ClientsReport};

use super::agents::{RrAgent, run_clients};
use netlane_rr::server::ServerStats;
use serde::Serialize;

use crate::host::{Agent, Host, RoleProcess, cpu_counters};
use crate::runner::Measured;
use netlane_report::format;

use super::*;

/// One run's result: what the clients measured, the server's counters, and the server
/// CPU's time (the server thread, its NAPI and softirqs, all pinned there).
#[derive(Debug, Clone, Serialize)]
pub struct RrRun {
    /// The clients' measurements.
    pub clients: ClientsReport,
    /// The server's counters.
    pub server: ServerStats,
    /// The server CPU over the clients' run (warm-up included).
    pub server_cpu: SystemCpuDelta,
    /// Each client host's part, when several ran the population (agents of one
    /// measurement).
    pub agents: Vec<RrAgent>,
}

impl Measured for RrRun {
    fn summary(&self) -> String {
        let c = &self.clients;
        format!(
            "{:.0} responses/s, p50 {}, p99 {}, server CPU idle {}",
            c.responses_per_s,
            format::seconds(c.latency_ns.p50 as f64 / 1e9),
            format::seconds(c.latency_ns.p99 as f64 / 1e9),
            idle(self).map_or("-".into(), |v| format!("{v:.0}%"))
        )
    }

    fn figures(&self) -> Vec<(&'static str, Option<f64>)> {
        let c = &self.clients;
        let l = &c.latency_ns;
        let us = |v: u64| (l.count > 0).then(|| v as f64 / 1e3);
        let s = &self.server;
        vec![
            ("responses_per_s", Some(c.responses_per_s)),
            ("p50_us", us(l.p50)),
            ("p99_us", us(l.p99)),
            ("p9999_us", us(l.p9999)),
            ("server_thread_busy_pct", Some(s.busy * 100.0)),
            ("server_cpu_idle_pct", idle(self).ok()),
            ("server_cpu_us_per_response", cost(self).ok()),
            ("wakeups_per_s", (s.seconds > 0.0).then(|| s.counters.wakeups as f64 / s.seconds)),
            ("frames_per_wakeup", Some(s.frames_per_wakeup)),
            ("retransmits", Some(c.retransmits as f64)),
            ("lost", Some(c.lost as f64)),
        ]
    }
}

/// Where a run's roles are: the server's host, the clients' hosts (several: agents of
/// one measurement).
pub(super) struct RrSite<'a> {
    pub(super) server: &'a dyn Host,
    pub(super) clients: Vec<Agent<'a>>,
}

impl<'a> RrSite<'a> {
    /// The server in `h`'s receiving namespace, the clients in its sending one.
    pub(super) fn two_hosts(h: &'a TwoHosts) -> RrSite<'a> {
        RrSite { server: &h.rx, clients: vec![Agent { host: &h.tx, cpus: Vec::new() }] }
    }
}

impl RrBenchArgs {
    /// A veth pair per MTU and queue count the modes use, in the order they first need it.
    pub(super) fn networks(&self, modes: &[Mode]) -> Result<Vec<(Net, TwoHosts)>> {
        let mut wanted: Vec<Net> = Vec::new();
        for m in modes {
            if !wanted.contains(&m.net()) {
                wanted.push(m.net());
            }
        }
        let mut nets = Vec::new();
        for net in wanted {
            let h = TwoHosts::create("rr", self.link(net))?;
            self.clients_end().apply(&h.tx, &h.tx_if, h.tx_index)?;
            nets.push((net, h));
        }
        Ok(nets)
    }

    /// One run of `m`, said as `label`, on the site of its network. Corrupted or
    /// mismatched responses stop the scenario: its figures would not be the server's.
    pub(super) fn run_one(&self, sites: &[(Net, RrSite<'_>)], m: &Mode, label: &str) -> Result<RrRun> {
        let site = &sites.iter().find(|(net, _)| *net == m.net()).context("a network for the mode")?.1;
        let r = exchange(site, m, self.server_cpu).with_context(|| format!("run {label}"))?;
        let c = &r.clients;
        if c.corrupt + c.mismatched > 0 {
            bail!("{label}: {} corrupted and {} mismatched responses", c.corrupt, c.mismatched);
        }
        Ok(r)
    }
}

/// One run: the server (a `netlane rr serve` process) on the site's server host, the
/// clients (`netlane rr clients`, or its agents) on its client hosts.
fn exchange(site: &RrSite<'_>, m: &Mode, server_cpu: usize) -> Result<RrRun> {
    let server = RoleProcess::start(site.server, &role::serve_spec(&m.server), None)?;
    let pop = ClientsConfig { server: server.listening_on()?, ..m.clients.clone() };
    // Every way out of here goes past the stop (or the kill when the server is
    // dropped): a failure on the way must not leave the server running.
    let measured = (|| {
        // From when every client host has its word: not their setup.
        let (clients, _, agents, cpu0) = run_clients(&site.clients, &pop, || cpu_counters(site.server, server_cpu))?;
        let cpu1 = cpu_counters(site.server, server_cpu)?;
        Ok::<_, anyhow::Error>((clients, agents, cpu0.delta(&cpu1)))
    })();
    let server = role::server_stats(&server.stop(Duration::from_secs(10)).context("the rr server failed")?)?;
    let (clients, agents, server_cpu) = measured?;
    Ok(RrRun { clients, server, server_cpu, agents })
}

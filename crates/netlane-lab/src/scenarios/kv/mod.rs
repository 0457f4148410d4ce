//! `kv`: the memcached-protocol cache against memcached 1.6.18 under one open-loop load
//! generator (the ADQ talk's application, measured its way: throughput under a tail
//! latency SLA). The server in one namespace on its own CPU, the generator in another
//! on the other CPU, joined by a veth pair.
//!
//! - sla: the highest offered rate each server holds within the SLA (p99.9 < 1 ms by
//!   default) and within a tighter one, found by bisection over short open-loop runs,
//!   the best rate confirmed by a second run;
//! - rates: latency percentiles and the server CPU per request at fixed offered rates;
//! - closed: a closed loop (one request in flight per connection, the way memtier-style
//!   tools measure) against an open loop at 80% of the rate the closed loop reached (a
//!   closed loop runs the generator flat out): what coordinated omission hides.
//!
//! Every round starts each server fresh, loads the key space, and runs its parts; the
//! servers alternate first from round to round. Ratios pair the servers within a round.
//!
//! The folder: `options.rs` (what can be asked), `measure.rs` (a server's round: warm-up,
//! floor, searches, fixed rates, closed loop), `checks.rs` (the quantities the targets
//! compare and the check list), `report.rs` (its sections).

mod checks;
mod measure;
mod options;
mod report;
#[cfg(test)]
mod tests;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::ValueEnum;
use netlane::topology::{LinkConfig, RxTuning, TwoHosts};
use netlane_kv::load::schedule::Pacing;
use netlane_report::ScenarioReport;
use netlane_report::options::OptionList;

use super::Scenario;
use super::cache::{CacheSite, open, program_exists};
use crate::progress::Progress;
use crate::runner::Runner;
use crate::testbed::{Needs, Testbed};

pub use self::measure::{KvRound, KvRun};
pub use self::options::{KvBenchArgs, WorkloadArgs};
pub use crate::scenarios::cache::agents::{
    Agent, AgentSummary, AgentsRun, AgentsStep, run_agents, search_agents, warm_up_agents,
};
pub use crate::scenarios::cache::role::{LoadStep, kv_serve_args, load_args};

/// A part of the scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum)]
pub enum Part {
    /// Highest rate within the SLA and within a tighter one.
    Sla,
    /// Latency and server CPU at fixed offered rates.
    Rates,
    /// Closed loop against open loop at most of the closed loop's rate.
    Closed,
}

impl Part {
    fn name(self) -> String {
        crate::scenarios::value_name(&self)
    }
}

/// A server under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum)]
pub enum ServerKind {
    /// `netlane kv serve`'s server.
    Netlane,
    /// memcached (Debian's 1.6.18).
    Memcached,
}

impl ServerKind {
    fn name(self) -> String {
        crate::scenarios::value_name(&self)
    }
}

impl Scenario for KvBenchArgs {
    fn name(&self) -> &'static str {
        "kv"
    }

    fn options(&self) -> OptionList {
        let parts: Vec<String> = self.parts.iter().map(|p| p.name()).collect();
        let servers: Vec<String> = self.servers.iter().map(|s| s.name()).collect();
        let list = self
            .on
            .listed(OptionList::new())
            .words("parts", &parts)
            .words("servers", &servers)
            .int("connections", u64::from(self.connections))
            .int("threads", self.threads as u64);
        self.workload
            .echo(list)
            .text("sla", self.sla.to_string())
            .text("tight-sla", self.tight_sla.to_string())
            .num("search-lo", self.search_lo)
            .num("search-hi", self.search_hi)
            .num("resolution", self.resolution)
            .duration("step", self.step)
            .ints("rates", &self.rates)
            .int("closed-depth", u64::from(self.closed_depth))
            .duration("time", self.time)
            .int("repeat", u64::from(self.repeat))
            .duration("stall-probe", self.stall_probe)
            .int("server-cpu", self.server_cpu as u64)
            .int("client-cpu", self.client_cpu as u64)
            .text("memcached", self.memcached.clone())
    }

    fn validate(&self) -> Result<()> {
        if self.on.testbed.is_none() {
            let n = netlane::cpus::online_count();
            for (what, c) in [("--server-cpu", self.server_cpu), ("--client-cpu", self.client_cpu)] {
                if c >= n {
                    bail!("{what} {c}: this machine has CPUs 0-{}", n - 1);
                }
            }
        }
        if self.parts.is_empty() || self.servers.is_empty() {
            bail!("--parts and --servers: nothing to run");
        }
        if !(1..=64).contains(&self.threads) {
            bail!("--threads {}: 1..=64", self.threads);
        }
        if self.parts.contains(&Part::Rates) && (self.rates.is_empty() || self.rates.contains(&0)) {
            bail!("--rates: at least one rate, none zero");
        }
        crate::scenarios::cache::check_search_range(self.search_lo, self.search_hi, self.resolution)?;
        let addr = SocketAddr::from(([10, 0, 0, 1], 11211));
        let check = [
            self.load(addr, open(self.search_lo), self.step),
            self.load(addr, Pacing::Closed { depth: self.closed_depth }, self.time),
        ];
        for c in check {
            c.validate()?;
        }
        for r in &self.rates {
            self.load(addr, open(*r as f64), self.time).validate()?;
        }
        if self.stall_probe > Duration::from_secs(600) {
            bail!("--stall-probe {:?}: at most 600s", self.stall_probe);
        }
        if let Some(t) = self.on.open()? {
            return self.check_testbed(&t);
        }
        if self.probes_stalls() && !program_exists("cyclictest") {
            bail!("cyclictest: not found (scripts/setup.sh installs rt-tests; --stall-probe 0s skips the probe)");
        }
        if self.servers.contains(&ServerKind::Memcached) && !program_exists(&self.memcached) {
            bail!("{}: not found (scripts/setup.sh --lab installs memcached)", self.memcached);
        }
        if !netlane::topology::have_privileges() {
            bail!("the kv scenario builds two network namespaces: run it as root");
        }
        Ok(())
    }

    fn runs(&self) -> usize {
        let per = |p: &Part| match p {
            Part::Sla => 2,
            Part::Rates => self.rates.len(),
            Part::Closed => 2,
        };
        let per_server = 1 + usize::from(self.probes_stalls()) + self.parts.iter().map(per).sum::<usize>();
        per_server * self.servers.len() * self.repeat as usize
    }

    fn run(&self, progress: &dyn Progress) -> Result<ScenarioReport> {
        self.validate()?;
        if let Some(t) = self.on.open()? {
            self.check_testbed(&t)?;
            let generators = t.clients.iter().map(|c| Agent { host: c.host(), cpus: c.pinned() }).collect();
            let site = CacheSite { server: t.server.host(), generators };
            let addr = SocketAddr::new(t.server_addr(), 11211);
            let nic = t.hold_nic()?;
            let mut report = self.rounds(progress, &site, addr)?;
            report.notes.insert(0, t.describe());
            report.notes.extend(nic.finish());
            report.cpu_plan = t.cpu_plan(&[self.server_cpu]);
            return Ok(report);
        }
        let h = TwoHosts::create(
            "kv",
            LinkConfig { mtu: 1500, queues: 1, rx: RxTuning::threaded_napi_on(self.server_cpu) },
        )?;
        RxTuning::threaded_napi_on(self.client_cpu).apply(&h.tx, &h.tx_if, h.tx_index)?;
        // TCP over veth skips NAPI while TSO is on (drivers/net/veth.c): a packet's
        // receive work runs in its sender's context, on the sender's CPU, right after the
        // send. The server CPU therefore carries the receive side of its replies, and the
        // generator's CPU that of the requests, for both servers alike. Each end's
        // threaded NAPI or RPS on its own CPU would cost an inter-processor wake-up per
        // packet, which the generator cannot spare (docs/results.md).
        let addr = SocketAddr::new(IpAddr::V4(TwoHosts::RX_V4), 11211);
        let report = self.rounds(progress, &CacheSite::two_hosts(&h), addr);
        drop(h);
        report
    }
}

impl KvBenchArgs {
    /// Every round, on `site`, the servers at `addr`.
    fn rounds(&self, progress: &dyn Progress, site: &CacheSite<'_>, addr: SocketAddr) -> Result<ScenarioReport> {
        let mut runner = Runner::new(progress);
        let all = runner.rounds(
            self.servers.len(),
            |_| self.repeat,
            |runner, i, turn| {
                let kind = self.servers[i];
                self.round(runner, site, addr, kind, turn)
                    .with_context(|| format!("{} round {}", kind.name(), turn.round + 1))
            },
        )?;
        Ok(self.report(&all, runner.into_records()))
    }

    /// Refuses a testbed that lacks what this run needs: cyclictest (as root, for its
    /// SCHED_FIFO probe) and memcached where they run, --server-cpu on the server host.
    fn check_testbed(&self, t: &Testbed) -> Result<()> {
        let mut server = Needs::default();
        if self.probes_stalls() {
            server.root = true;
            server.programs.push("cyclictest".into());
        }
        if self.servers.contains(&ServerKind::Memcached) {
            server.programs.push(self.memcached.clone());
        }
        t.check(&server, &Needs::default())?;
        t.check_server_cpu(self.server_cpu)
    }
}

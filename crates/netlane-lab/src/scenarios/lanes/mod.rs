//! `lanes`: application device queues in software, measured on the cache server the way
//! the ADQ talk measured memcached: throughput within a tail-latency SLA, and latency
//! and the kernel's events per request at fixed loads, for each way of placing
//! connections on worker threads.
//!
//! The network: two namespaces joined by a veth with one queue per CPU, each of the
//! server end's queues served by a threaded NAPI instance pinned to its CPU (a NIC with
//! one interrupt per CPU); the generator's end sends without TSO so that TCP takes that
//! NAPI path and every server socket has a NAPI id. Replies keep TSO and skip NAPI:
//! their receive work runs in the server's send. The generator has a thread on each CPU,
//! as the server has a worker on each. The server's end records each packet's receive
//! queue as a NIC driver does (for `xps_rxqs`) and counts its transmit queues (mq).
//!
//! Modes, every one in every round, in rotating order:
//! - `plain`: netlane's server, one worker per CPU, connections dealt round robin: half
//!   of them on a worker whose CPU does not run their queue;
//! - `plain-busy`: the talk's unmodified application with ADQ's other parts: plain
//!   workers whose epolls busy poll, transmit queues paired with receive queues
//!   (`xps_rxqs`), no NAPI-id placement (a worker's epoll polls whichever queue its
//!   last connection came on);
//! - `rfs`: plain workers with receive flow steering, the kernel's own answer (each
//!   flow's protocol work moved to the CPU its worker last read it on; aRFS where the
//!   device has ntuple filters);
//! - `napi`: lanes, the acceptor hands each connection to the lane owning its
//!   SO_INCOMING_NAPI_ID, the lane pinned to that queue's CPU;
//! - `napi-busy`: the same, each lane's epoll busy polling (`--busy-poll`);
//! - `threaded-busy`: the same without the lanes polling, each queue's NAPI thread busy
//!   polling instead (netdev netlink's threaded busy-poll mode; where the kernel refuses
//!   it, the mode is left out and its check says why);
//! - `reuseport`: lanes without an acceptor: the reuseport BPF selector;
//! - `memcached`, `memcached-n`: memcached 1.6.18 with two threads, without and with
//!   `-N` (its NAPI-id mode, with the global `net.core.busy_poll` it relies on, set for
//!   the run and restored after).

mod checks;
pub(super) mod isolation;
mod measure;
mod options;
mod plan;
mod report;
mod rfs;
mod sweep;
#[cfg(test)]
pub(super) mod tests;
mod threaded;

use std::net::{IpAddr, SocketAddr};

use anyhow::{Context, Result, bail};
use netlane::topology::{LinkConfig, RxTuning, TwoHosts};

use crate::plan::Role;
use crate::progress::Progress;
use crate::runner::{Runner, Turn};
use crate::scenarios::Scenario;
use crate::scenarios::cache::CacheSite;
use crate::scenarios::cache::agents::Agent;
use crate::scenarios::cache::program_exists;
use crate::testbed::{Needs, Testbed};
use netlane_report::ScenarioReport;
use netlane_report::options::OptionList;

use self::checks::*;
pub(crate) use self::checks::{latency_of, mean_of};
use self::measure::LaneSite;
pub use self::measure::{LaneRound, LaneRun};
pub use self::options::{LanesBenchArgs, Mode};
pub(crate) use self::plan::cpu_plan;
use self::plan::*;
pub(crate) use crate::scenarios::cache::open;

impl Scenario for LanesBenchArgs {
    fn name(&self) -> &'static str {
        "lanes"
    }

    fn options(&self) -> OptionList {
        let modes: Vec<String> = self.modes.iter().map(|m| m.name()).collect();
        let conns: Vec<u64> = self.connections.iter().map(|&c| u64::from(c)).collect();
        let list = OptionList::new().words("modes", &modes).ints("connections", &conns).ints("rates", &self.rates);
        let mut list = self
            .workload
            .echo(list)
            .text("sla", self.sla.to_string())
            .num("search-lo", self.search_lo)
            .num("search-hi", self.search_hi)
            .num("resolution", self.resolution)
            .duration("step", self.step)
            .text("busy-poll", self.busy_poll.to_string());
        // The per-NAPI knobs are echoed only when set (unset: the device's own).
        if let Some(v) = self.napi_defer_hard_irqs {
            list = list.int("napi-defer-hard-irqs", u64::from(v));
        }
        if let Some(d) = self.gro_flush_timeout {
            list = list.duration("gro-flush-timeout", d);
        }
        if let Some(d) = self.irq_suspend_timeout {
            list = list.duration("irq-suspend-timeout", d);
        }
        let list = list
            .int("memcached-busy-poll", u64::from(self.memcached_busy_poll))
            .duration("time", self.time)
            .int("repeat", u64::from(self.repeat))
            .flag("no-search", self.no_search)
            .ints("sweep-connections", &self.sweep_connections.iter().map(|&c| u64::from(c)).collect::<Vec<_>>())
            .flag("no-sweep", self.no_sweep)
            .text("memcached", self.memcached.clone())
            .flag("no-isolation", self.no_isolation)
            .int("isolation-link", self.isolation_link)
            .int("isolation-rate", self.isolation_rate)
            .int("isolation-connections", u64::from(self.isolation_connections));
        self.on.listed(list)
    }

    fn validate(&self) -> Result<()> {
        if self.modes.is_empty() {
            bail!("--modes: nothing to run");
        }
        if self.connections.is_empty() || self.connections.iter().any(|&c| !(2..=4096).contains(&c)) {
            bail!("--connections: at least one count, each 2..=4096");
        }
        if self.rates.is_empty() || self.rates.contains(&0) {
            bail!("--rates: at least one rate, none zero");
        }
        if self.sweep_connections.iter().any(|&c| !(2..=4096).contains(&c)) {
            bail!("--sweep-connections: each count 2..=4096");
        }
        crate::scenarios::cache::check_search_range(self.search_lo, self.search_hi, self.resolution)?;
        let addr = SocketAddr::from(([10, 0, 0, 1], 11211));
        for &c in &self.connections {
            for &r in &self.rates {
                self.load(addr, c, open(r as f64), self.time).validate()?;
            }
        }
        // The sweep's connections open together: the generator's descriptors allow them.
        if !self.no_sweep && !self.no_search {
            for &c in &self.sweep_connections {
                self.load(addr, c, open(self.search_lo), self.step).validate()?;
            }
        }
        if let Some(t) = self.on.open()? {
            return self.check_testbed(&t);
        }
        if self.modes.iter().any(|m| m.is_memcached()) && !program_exists(&self.memcached) {
            bail!("{}: not found (scripts/setup.sh installs memcached)", self.memcached);
        }
        if !self.no_isolation {
            if self.isolation_link < 1_000_000 {
                bail!("--isolation-link {} B/s: at least 1 MB/s (8 Mbit/s)", self.isolation_link);
            }
            if !(2..=4096).contains(&self.isolation_connections) {
                bail!("--isolation-connections {}: 2..=4096", self.isolation_connections);
            }
            let addr = SocketAddr::from(([10, 0, 0, 1], 11211));
            self.load(addr, self.isolation_connections, open(self.isolation_rate as f64), self.time).validate()?;
            if !program_exists("socat") {
                bail!("socat: not found (scripts/setup.sh installs it; the isolation part's bulk sender)");
            }
        }
        if !netlane::topology::have_privileges() {
            bail!("the lanes scenario builds network namespaces and loads BPF: run it as root");
        }
        Ok(())
    }

    fn runs(&self) -> usize {
        let per = 1 + usize::from(!self.no_search) + self.connections.len() * self.rates.len();
        // A testbed leaves out memcached -N, rfs and the isolation part (and its device may
        // leave out the NAPI modes, which only the run finds out).
        let testbed = self.on.testbed.is_some();
        let modes: Vec<Mode> =
            self.modes.iter().copied().filter(|m| !(testbed && m.this_machine_only().is_some())).collect();
        let swept = self.sweep_connections.iter().filter(|c| **c != self.connections[0]).count();
        let sweep: usize = modes.iter().filter(|m| self.sweeps(**m)).count() * swept;
        let isolation = if self.no_isolation || testbed { 0 } else { 1 + 3 };
        (per * modes.len() + sweep + isolation) * self.repeat as usize
    }

    fn run(&self, progress: &dyn Progress) -> Result<ScenarioReport> {
        self.validate()?;
        if let Some(t) = self.on.open()? {
            return self.run_on_testbed(&t, progress);
        }
        let plan = cpu_plan();
        let h =
            TwoHosts::create("lanes", LinkConfig { mtu: 1500, queues: LANES as u32, rx: RxTuning::threaded_napi() })?;
        // Requests take the server end's NAPI path (the generator's TSO off); replies
        // keep TSO and skip NAPI, their receive work done in the server's send (the
        // generator shares the CPUs: a NAPI thread of its own would cost it a wake-up
        // per reply).
        h.set_tx_tso(false)?;
        let placed_rx = netlane::topology::pin_napi_by_queue(&h.rx, h.rx_index, plan.cpus(Role::Napi))?;
        // The server end's receive queue recorded as a NIC driver records it (a veth
        // does not, and xps_rxqs would send every reply by queue 0).
        let rx_index = h.rx_index;
        let recorder =
            h.rx.run(move || netlane::lanes::RecordedRxQueues::install(rx_index, LANES as u32))?
                .context("record the server's receive queues")?;
        let addr = SocketAddr::new(IpAddr::V4(TwoHosts::RX_V4), 11211);
        // Threaded busy polling where this kernel has it; otherwise left out, and why.
        let mut this = self.clone();
        let mut threaded_refused = None;
        if this.modes.contains(&Mode::ThreadedBusy)
            && let Err(why) = h.rx.run(move || netlane::lanes::queues::try_threaded_busy_poll(rx_index))?
        {
            this.modes.retain(|m| *m != Mode::ThreadedBusy);
            threaded_refused = Some(why);
        }
        if this.modes.is_empty() {
            bail!("nothing to run: {}", threaded_refused.unwrap_or_default());
        }
        let site = LaneSite::two_hosts(&h, &plan);
        let mut runner = Runner::new(progress);
        let mut iso = Vec::new();
        let all = runner.rounds_then(
            this.modes.len(),
            |_| this.repeat,
            |runner, i, turn| {
                let mode = this.modes[i];
                this.round(runner, &site, addr, mode, turn)
                    .with_context(|| format!("{} round {}", mode.name(), turn.round + 1))
            },
            |runner, round| {
                if !self.no_isolation {
                    let turn = Turn { round, rounds: self.repeat };
                    iso.push(self.isolation_round(runner, &h, turn).context("isolation")?);
                }
                Ok(())
            },
        )?;
        drop(site);
        drop(recorder);
        drop(h);
        let mut report = this.report(&all, &iso, Some(&plan), &placed_rx, runner.into_records());
        if let Some(why) = threaded_refused {
            report::threaded_not_here(&mut report, &why);
        }
        Ok(report)
    }
}

impl LanesBenchArgs {
    /// Refuses a testbed that lacks what this run needs: root and memcached on the server
    /// host, its `iface` (the lane device).
    fn check_testbed(&self, t: &Testbed) -> Result<()> {
        if self.modes.iter().all(|m| m.this_machine_only().is_some()) {
            let named: Vec<String> = self.modes.iter().map(|m| m.name()).collect();
            bail!("--modes {}: not on a testbed (each needs a setting only this machine's to make)", named.join(","));
        }
        // The reuseport mode's selector is a BPF program.
        let mut server = Needs { root: true, bpf: self.modes.contains(&Mode::Reuseport), ..Needs::default() };
        if self.modes.contains(&Mode::Memcached) {
            server.programs.push(self.memcached.clone());
        }
        t.check(&server, &Needs::default())?;
        if t.server.spec.iface.is_none() {
            bail!("{}: no `iface` (the lanes' device)", t.server.label());
        }
        Ok(())
    }

    /// The server on the testbed's server host, a lane per CPU the file gives it on its
    /// `iface`; the load from the client hosts (several: agents of one merged
    /// measurement). memcached -N (its global net.core.busy_poll) and the isolation part
    /// are left out and said so.
    fn run_on_testbed(&self, t: &Testbed, progress: &dyn Progress) -> Result<ScenarioReport> {
        let device = t.server.spec.iface.clone().context("the server host names no `iface`")?;
        let lanes = t.server.cpus()?.as_slice().to_vec();
        let generators = t.clients.iter().map(|c| Agent { host: c.host(), cpus: c.pinned() }).collect();
        let site = LaneSite {
            cache: CacheSite { server: t.server.host(), generators },
            device: device.clone(),
            lanes: lanes.clone(),
            local: None,
        };
        let mut this = self.clone();
        this.modes.retain(|m| m.this_machine_only().is_none());
        let mut left_out = Vec::new();
        for m in &self.modes {
            if let Some(why) = m.this_machine_only() {
                left_out.push(format!("{} ({why})", m.name()));
            }
        }
        left_out.push("the isolation part (it shapes and marks on one machine's veth)".to_string());
        // The file's NIC settings first: they may give the device its NAPI.
        let nic = t.hold_nic()?;
        // Lanes own NAPI instances, one receive queue's each: on a device without (a
        // bridge, a bond), with fewer queues than lanes, or where that cannot be read,
        // only the modes that need none run.
        let short = t.server.rx_queues_lack(lanes.len());
        let napis = match t.server.napi_ids(&device) {
            Ok(Ok(ids)) if ids.is_empty() => Some("it has no NAPI instance".to_string()),
            Ok(Ok(_)) if short.is_some() => short.map(|why| format!("{why} for {} lanes", lanes.len())),
            Ok(Ok(_)) => None,
            Ok(Err(why)) => Some(format!("its NAPI instances are not known: {why}")),
            Err(e) => Some(format!("its NAPI instances could not be read: {e:#}")),
        };
        if let Some(why) = napis {
            let needs: Vec<String> = this.modes.iter().filter(|m| m.lane_device()).map(|m| m.name()).collect();
            if !needs.is_empty() {
                this.modes.retain(|m| !m.lane_device());
                left_out.push(format!("{} ({device} on {}: {why})", needs.join(", "), t.server.label()));
            }
        }
        if this.modes.is_empty() {
            bail!("nothing to run on this testbed: {}", left_out.join("; "));
        }
        let addr = SocketAddr::new(t.server_addr(), 11211);
        let mut runner = Runner::new(progress);
        let all = runner.rounds(
            this.modes.len(),
            |_| this.repeat,
            |runner, i, turn| {
                let mode = this.modes[i];
                this.round(runner, &site, addr, mode, turn)
                    .with_context(|| format!("{} round {}", mode.name(), turn.round + 1))
            },
        )?;
        let mut report = this.report(&all, &[], None, &[], runner.into_records());
        let mut notes = vec![format!(
            "{} {} lanes on {device} (CPUs {}); its NAPI and interrupts as the testbed leaves them (its `threaded` \
             and `irqs`). Busy CPU and the kernel's counters are the server host's.",
            t.describe(),
            lanes.len(),
            netlane::cpus::CpuList::new(lanes.clone())
        )];
        if !left_out.is_empty() {
            notes.push(format!("Left out on this testbed: {}.", left_out.join("; ")));
        }
        if this.modes.iter().any(|m| m.busy_polls())
            && (self.napi_defer_hard_irqs.is_some()
                || self.gro_flush_timeout.is_some()
                || self.irq_suspend_timeout.is_some())
        {
            notes.push(format!(
                "The busy-polling modes' per-NAPI knobs set on {device}'s NAPI instances by the cache server on {} for its \
                 rounds, put back by it when it stops (by `netlane clean` there if it is killed).",
                t.server.label()
            ));
        }
        report.notes.splice(0..0, notes);
        report.notes.extend(nic.finish());
        report.cpu_plan = t.cpu_plan(&lanes);
        Ok(report)
    }
}

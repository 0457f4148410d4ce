//! The lanes scenario's runs: a server in each mode, its warm-up, search and fixed-rate
//! runs, with the CPUs' busy time and the kernel's counters around each.

use std::net::SocketAddr;

use anyhow::{Context, Result};
use netlane::metrics::cpu::SystemCpu;
use netlane::metrics::kstat::KernelCounters;
use netlane::topology::TwoHosts;
use netlane::topology::netdev::NapiSettings;
use netlane_kv::load::search::SearchConfig;
use netlane_kv::loadgen::{LoadConfig, LoadReport, SearchReport};
use netlane_kv::server::{LanesView, ServerConfig, Steer};
use netlane_kv::store::StoreConfig;
use serde::Serialize;

use crate::plan::{CpuPlan, Role};
use crate::runner::{Measured, Runner, Turn};
use crate::scenarios::cache::{self, CacheServer, CacheSite, memcached_spec, open};
use crate::scenarios::unless_generator_lagged;

use super::*;

/// One fixed-rate run.
#[derive(Debug, Clone, Serialize)]
pub struct LaneRun {
    /// Connections.
    pub connections: u32,
    /// Offered rate asked for.
    pub rate: u64,
    /// The generator's report.
    pub load: LoadReport,
    /// Busy CPU seconds over every CPU of the machine.
    pub busy_s: f64,
    /// What the kernel counted meanwhile.
    pub kernel: KernelCounters,
    /// Runs made before this one and discarded: the generator lagged in them.
    pub discarded: u32,
    /// Packets the server's device sent by each transmit queue (empty where they are
    /// not counted: on a testbed).
    pub tx_queues: Vec<u64>,
}

/// One mode's round.
#[derive(Debug, Clone, Serialize)]
pub struct LaneRound {
    /// Which mode.
    pub mode: Mode,
    /// The search at the first connection count.
    pub search: Option<SearchReport>,
    /// The connection sweep's searches (the plain and napi modes).
    pub sweep: Vec<super::sweep::SweepPoint>,
    /// The fixed-rate runs, connections-major.
    pub runs: Vec<LaneRun>,
    /// netlane's lanes at the end of the round.
    pub lanes: Option<LanesView>,
    /// The rfs mode: RFS's settings as read back, and whether the device steers in
    /// hardware (aRFS).
    pub rfs: Option<String>,
}

impl Measured for LaneRun {
    fn summary(&self) -> String {
        summary(self)
    }

    fn figures(&self) -> Vec<(&'static str, Option<f64>)> {
        vec![
            ("achieved_per_s", Some(self.load.achieved_per_s)),
            ("mean_us", self.load.latency_ns.mean.map(|ns| ns / 1e3)),
            ("p999_us", pct(&self.load, "p99.9")),
            ("cpu_us_per_request", cpu_per_request(self).ok()),
        ]
    }
}

/// Where a round runs: the cache site, the lane device on the server's host and the
/// lanes' CPUs there, and (on one machine) the topology whose per-NAPI knobs a round
/// puts back.
pub(crate) struct LaneSite<'a> {
    pub(crate) cache: CacheSite<'a>,
    pub(crate) device: String,
    pub(crate) lanes: Vec<usize>,
    pub(crate) local: Option<&'a TwoHosts>,
}

impl<'a> LaneSite<'a> {
    /// The server in `h`'s receiving namespace on the plan's lane CPUs.
    pub(crate) fn two_hosts(h: &'a TwoHosts, plan: &CpuPlan) -> LaneSite<'a> {
        LaneSite {
            cache: CacheSite::two_hosts(h),
            device: h.rx_if.clone(),
            lanes: plan.cpus(Role::Lane).to_vec(),
            local: Some(h),
        }
    }

    /// An mq root qdisc on the server's device for a mode's round, counting each
    /// transmit queue (a NIC's default; on one machine, and only for the modes' rounds:
    /// the isolation part puts its own root qdisc there).
    fn count_tx_queues(&self) -> Result<Option<netlane::installed::Held>> {
        let Some(h) = self.local else { return Ok(None) };
        let dev = self.device.clone();
        let (asked, mq) = h.rx.run(move || netlane::nic::set_mq(&dev))?;
        mq.map(Some).with_context(|| asked.to_string())
    }

    /// Packets sent by each of the server's device's transmit queues so far, where its
    /// mq root qdisc counts them (on one machine).
    fn tx_queues(&self) -> Result<Vec<u64>> {
        let Some(h) = self.local else { return Ok(Vec::new()) };
        let dev = self.device.clone();
        h.rx.run(move || netlane::nic::tx_queue_packets(&dev))?.map_err(anyhow::Error::msg)
    }

    /// The busy time of the server's machine and its kernel's counters, now (on one
    /// machine, of the whole machine: the generator's share included).
    fn readings(&self) -> Result<(SystemCpu, KernelCounters)> {
        if self.local.is_some() {
            return Ok((SystemCpu::read().context("read /proc/stat")?, KernelCounters::read()?));
        }
        let host = self.cache.server;
        let read = |p: &str| host.read_file(p);
        let stat = read("/proc/stat")?;
        let cpu = SystemCpu::parse(&stat).with_context(|| format!("no cpu line in /proc/stat on {}", host.name()))?;
        let kernel = KernelCounters::parse(&stat, &read("/proc/interrupts")?, &read("/proc/softirqs")?);
        Ok((crate::host::stamped(host, cpu), kernel))
    }
}

impl LanesBenchArgs {
    pub(crate) fn server_config(
        &self,
        device: &str,
        lanes: &[usize],
        addr: SocketAddr,
        mode: Mode,
        max_conns: usize,
    ) -> ServerConfig {
        let base = ServerConfig {
            listen: addr,
            threads: lanes.len(),
            cpus: Some(lanes.to_vec()),
            store: StoreConfig::new(1 << 30, 1 << 20, 64),
            max_conns,
            ..ServerConfig::default()
        };
        match mode {
            // RFS is the kernel's, set around the round (`rfs::hold`).
            Mode::Plain | Mode::Rfs => ServerConfig { steer: Steer::RoundRobin, ..base },
            Mode::Napi | Mode::NapiBusy | Mode::Reuseport | Mode::PlainBusy | Mode::ThreadedBusy => ServerConfig {
                steer: match mode {
                    Mode::Reuseport => Steer::Reuseport,
                    Mode::PlainBusy => Steer::RoundRobin,
                    _ => Steer::Acceptor,
                },
                lane_device: Some(device.to_string()),
                xps_rxqs: true,
                // The threaded mode's polling is its NAPI threads', set by the lab.
                busy_poll: (mode.busy_polls() && mode != Mode::ThreadedBusy).then_some(self.busy_poll),
                napi: if mode.busy_polls() && mode != Mode::ThreadedBusy {
                    NapiSettings {
                        defer_hard_irqs: self.napi_defer_hard_irqs,
                        gro_flush_timeout_ns: self.gro_flush_timeout.map(|d| d.as_nanos() as u64),
                        irq_suspend_timeout_ns: self.irq_suspend_timeout.map(|d| d.as_nanos() as u64),
                    }
                } else {
                    NapiSettings::default()
                },
                ..base
            },
            Mode::Memcached | Mode::MemcachedN => unreachable!("memcached is not configured here"),
        }
    }

    pub(crate) fn start(&self, site: &LaneSite<'_>, addr: SocketAddr, mode: Mode) -> Result<CacheServer> {
        let lanes = &site.lanes[..];
        // Room for every connection the round opens: its fixed rates' and its sweep's.
        let swept = if self.sweeps(mode) { self.sweep_connections.iter().max().copied() } else { None };
        let most = self.connections.iter().copied().chain(swept).max().unwrap_or(64);
        let max_conns = most as usize + 64;
        let running = if mode.is_memcached() {
            // `net.core.busy_poll` is global (the knob does not exist inside a namespace):
            // set for this run and put back as it was.
            let guard = (mode == Mode::MemcachedN)
                .then(|| {
                    netlane::installed::Sysctl::set(
                        "/proc/sys/net/core/busy_poll",
                        &self.memcached_busy_poll.to_string(),
                    )
                    .context("set net.core.busy_poll")
                })
                .transpose()?;
            let mut spec = memcached_spec(&self.memcached, addr, lanes, lanes.len(), max_conns as u32);
            if mode == Mode::MemcachedN {
                spec.args.extend(["-N".into(), lanes.len().to_string()]);
            }
            CacheServer::start(&site.cache, &spec, false, guard)?
        } else {
            let cfg = self.server_config(&site.device, lanes, addr, mode, max_conns);
            CacheServer::start(&site.cache, &cache::role::kv_serve_spec(&cfg, lanes), true, None)?
        };
        site.cache.wait_until_accepting(addr, &mode.name())?;
        Ok(running)
    }

    /// Puts the per-NAPI knobs the busy-polling modes changed back to the kernel's defaults, so that
    /// the modes after it run as they would alone.
    pub(crate) fn reset_napi(&self, h: &TwoHosts) -> Result<()> {
        if self.napi_defer_hard_irqs.is_none() && self.gro_flush_timeout.is_none() && self.irq_suspend_timeout.is_none()
        {
            return Ok(());
        }
        let (dev, ifindex) = (h.rx_if.clone(), h.rx_index);
        let here = h.rx.run(netlane::topology::NetnsHandle::current)??;
        let knobs = here.with_sysfs(move || -> Result<Vec<netlane::lanes::Knob>> {
            let ids = netlane::lanes::queues::discover(ifindex)?.napi_ids();
            let zero = NapiSettings {
                defer_hard_irqs: Some(0),
                gro_flush_timeout_ns: Some(0),
                irq_suspend_timeout_ns: Some(0),
            };
            // The kernel's defaults are meant to stay: nothing to put back.
            let applied = netlane::lanes::queues::apply_napi_settings(&dev, ifindex, &ids, &zero);
            applied.held.into_iter().for_each(netlane::installed::Held::release);
            Ok(applied.knobs)
        })??;
        for k in knobs.iter().filter(|k| !k.applied()) {
            tracing::warn!(knob = %k.name, status = ?k.status, "could not reset a per-NAPI knob");
        }
        Ok(())
    }

    /// One load run with the CPUs' busy time and the kernel's counters around it, made
    /// again when the generator lagged in it; a run of the round recorded under `what`.
    pub(crate) fn measured(
        &self,
        runner: &mut Runner<'_>,
        turn: Turn,
        what: &str,
        site: &LaneSite<'_>,
        rate: u64,
        cfg: LoadConfig,
    ) -> Result<LaneRun> {
        let connections = cfg.connections;
        let once = || -> Result<LaneRun> {
            let cfg = cfg.clone();
            let ((cpu0, k0), q0) = (site.readings()?, site.tx_queues()?);
            let r = site.cache.run(&cfg)?;
            let ((cpu1, k1), q1) = (site.readings()?, site.tx_queues()?);
            Ok(LaneRun {
                connections,
                rate,
                load: r,
                busy_s: cpu0.delta(&cpu1).busy_s,
                kernel: k0.delta(&k1),
                discarded: 0,
                tx_queues: q1.iter().zip(&q0).map(|(a, b)| a.saturating_sub(*b)).collect(),
            })
        };
        let progress = runner.progress();
        runner.measure(turn, what, |label| {
            let (mut run, discarded) = unless_generator_lagged(progress, label, once, |r| &r.load)?;
            run.discarded = discarded;
            Ok(run)
        })
    }

    /// One mode's round: its server started, the key space stored, the search at the
    /// first connection count, then every fixed rate at every connection count.
    pub(crate) fn round(
        &self,
        runner: &mut Runner<'_>,
        site: &LaneSite<'_>,
        addr: SocketAddr,
        mode: Mode,
        turn: Turn,
    ) -> Result<LaneRound> {
        let who = mode.name();
        // Held until the round ends, after its server stopped.
        let rfs = match (mode, site.local) {
            (Mode::Rfs, Some(h)) => Some(super::rfs::hold(h, self.rfs_flows)?),
            (Mode::Rfs, None) => anyhow::bail!("rfs: only on one machine (net.core.rps_sock_flow_entries is global)"),
            _ => None,
        };
        let _mq = site.count_tx_queues()?;
        let _threaded = match (mode, site.local) {
            (Mode::ThreadedBusy, Some(h)) => Some(super::threaded::BusyPollingThreads::set(h)?),
            _ => None,
        };
        let server = self.start(site, addr, mode)?;
        cache::warm_up(runner, turn, &site.cache, &who, self.load(addr, 8, open(self.search_lo), self.step))?;
        let mut out = LaneRound {
            mode,
            search: None,
            sweep: Vec::new(),
            runs: Vec::new(),
            lanes: None,
            rfs: rfs.as_ref().map(|r| r.said.clone()),
        };
        let range = SearchConfig {
            lo_per_s: self.search_lo,
            hi_per_s: self.search_hi,
            resolution: self.resolution,
            max_bisections: 10,
        };
        if !self.no_search {
            let cfg = self.load(addr, self.connections[0], open(self.search_lo), self.step);
            out.search = Some(cache::search(runner, turn, &site.cache, &who, cfg, self.sla, range)?);
        }
        if self.sweeps(mode) {
            for c in self.sweep_connections.iter().copied().filter(|c| *c != self.connections[0]) {
                let cfg = self.load(addr, c, open(self.search_lo), self.step);
                let search =
                    cache::search(runner, turn, &site.cache, &format!("{who} {c} connections"), cfg, self.sla, range)?;
                out.sweep.push(super::sweep::SweepPoint { connections: c, search });
            }
        }
        for &c in &self.connections {
            for &rate in &self.rates {
                let cfg = self.load(addr, c, open(rate as f64), self.time);
                out.runs.push(self.measured(
                    runner,
                    turn,
                    &format!("{who} {c} connections {rate}/s"),
                    site,
                    rate,
                    cfg,
                )?);
            }
        }
        // What the lanes did is a table of the report; the runs stand without it.
        out.lanes = server.stop().unwrap_or_else(|e| {
            tracing::warn!("{who}: the cache server's lanes were not read back: {e:#}");
            None
        });
        if let (true, Some(h)) = (mode.busy_polls(), site.local) {
            self.reset_napi(h)?;
        }
        drop(rfs);
        Ok(out)
    }
}

//! The nvme scenario's runs: the network, the target process, one perf run, and what
//! the runner shows and records of it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use netlane::topology::{LinkConfig, RxTuning, TwoHosts};
use netlane_nvme::perf::{PerfOptions, PerfReport};

use super::checks::{host_us_per_io, per_core, us};
use super::options::NvmeBenchArgs;
use super::role;
use crate::host::{Host, RoleProcess, RoleSpec, ThisMachine, cpu_counters, start_together};
use crate::runner::Measured;
use crate::scenarios::net::PathKind;
use netlane_report::format;

impl NvmeBenchArgs {
    /// The two namespaces of the veth path (none on loopback).
    pub(super) fn network(&self) -> Result<Option<TwoHosts>> {
        Ok(match self.path {
            PathKind::Veth => {
                // Both directions carry data: each end's NAPI runs on its own side's CPU,
                // like two machines with NICs.
                let cfg = LinkConfig { mtu: self.mtu, queues: 1, rx: RxTuning::threaded_napi_on(self.target_cpu()) };
                let h = TwoHosts::create("nvme", cfg)?;
                RxTuning::threaded_napi_on(self.host_cpu).apply(&h.tx, &h.tx_if, h.tx_index)?;
                Some(h)
            }
            PathKind::Loopback => None,
        })
    }

    /// `netlane nvme target` on the target's CPU on `site`'s target host, and the address
    /// it listens on. A role process: stopped with its report at the end, killed (by
    /// the PID we started) if the run fails first.
    pub(super) fn start_target(&self, site: &NvmeSite<'_>) -> Result<(RoleProcess, SocketAddr)> {
        let cpu = self.target_cpu();
        let spec = self
            .target_spec(site.listen, &[cpu], &["--ns".into(), "mem:256M:512".into()])
            .ready_when("listening on ", Duration::from_secs(10));
        let target = RoleProcess::start(site.target, &spec, None)?;
        let addr = target.listening_on()?;
        Ok((target, addr))
    }

    /// `netlane nvme target` listening on `listen`, its reactors on `cpus` (and pinned
    /// there), namespace 1 of --ns-size in memory, `more` arguments after.
    pub(super) fn target_spec(&self, listen: SocketAddr, cpus: &[usize], more: &[String]) -> RoleSpec {
        let list: Vec<String> = cpus.iter().map(usize::to_string).collect();
        let mut args = vec![
            "nvme".to_string(),
            "target".into(),
            "--listen".into(),
            listen.to_string(),
            "--cpus".into(),
            list.join(","),
            "--ns".into(),
            format!("mem:{}", self.ns_size),
        ];
        args.extend_from_slice(more);
        RoleSpec::netlane("the nvme target", args).on_cpus(cpus)
    }
}

/// Where the target and the host run, and where the target listens.
pub(super) struct NvmeSite<'a> {
    pub(super) target: &'a dyn Host,
    pub(super) host: &'a dyn Host,
    pub(super) listen: SocketAddr,
    /// The target's CPU on its host when that is another machine than perf's: nvme perf
    /// cannot read the target's process there, so the target's CPU per I/O is this
    /// CPU's busy time over the measured window.
    pub(super) target_cpu_across: Option<usize>,
    /// The veth pair between them, when they run in two namespaces here.
    pub(super) veth: Option<&'a TwoHosts>,
}

/// TSO off at the target's end of the veth while held, put back on when dropped.
pub(super) struct TargetTsoOff<'a>(&'a TwoHosts);

impl<'a> TargetTsoOff<'a> {
    pub(super) fn hold(h: &'a TwoHosts) -> Result<TargetTsoOff<'a>> {
        h.set_rx_tso(false).context("turning TSO off at the target's end")?;
        Ok(TargetTsoOff(h))
    }
}

impl Drop for TargetTsoOff<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.0.set_rx_tso(true) {
            tracing::warn!("TSO could not be turned back on at the target's end: {e}");
        }
    }
}

impl<'a> NvmeSite<'a> {
    /// Two namespaces of the veth path, or this machine on loopback.
    pub(super) fn here(hosts: Option<&'a TwoHosts>) -> NvmeSite<'a> {
        match hosts {
            Some(h) => NvmeSite {
                target: &h.rx,
                host: &h.tx,
                listen: SocketAddr::new(h.rx_addr(false), netlane_nvme::DEFAULT_PORT),
                target_cpu_across: None,
                veth: Some(h),
            },
            None => NvmeSite {
                target: &ThisMachine,
                host: &ThisMachine,
                listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
                target_cpu_across: None,
                veth: None,
            },
        }
    }
}

/// One perf run of `opts` from `site`'s host side, a `netlane nvme perf` process; an
/// error when any command failed or read back wrong.
pub(super) fn perf(site: &NvmeSite<'_>, opts: &PerfOptions, label: &str) -> Result<PerfReport> {
    let limit = opts.ramp + opts.duration + Duration::from_secs(60);
    let mut target_busy = None;
    let run = match site.target_cpu_across {
        None => RoleProcess::start(site.host, &role::perf_spec(opts), None).and_then(|p| p.wait(limit)),
        Some(cpu) => (|| {
            // perf as an agent: its jobs start on our word, so the window is known here
            // to within the word's trip (milliseconds of a window of seconds).
            let spec = role::perf_agent_spec("nvme perf", opts);
            let perf = start_together(&[(site.host, spec)])?.pop().context("nvme perf did not start")?;
            std::thread::sleep(opts.ramp);
            let c0 = cpu_counters(site.target, cpu)?;
            let t0 = std::time::Instant::now();
            std::thread::sleep(opts.duration);
            let c1 = cpu_counters(site.target, cpu)?;
            // The readings are a round trip apart beyond the window: the busy time scaled
            // to the window the I/Os were counted over.
            let between = t0.elapsed().as_secs_f64().max(opts.duration.as_secs_f64());
            target_busy = Some(c0.delta(&c1).busy_s * opts.duration.as_secs_f64() / between);
            perf.wait(limit)
        })(),
    }
    .with_context(|| format!("run {label}"))?;
    if !run.status.success() {
        bail!("{label}: nvme perf exited with {}: {}", run.status, run.stderr_tail());
    }
    let mut rep = role::perf_report(&run).with_context(|| format!("run {label}"))?;
    if let Some(busy_s) = target_busy {
        rep.target_cpu_us_per_io = (rep.ops > 0).then(|| busy_s * 1e6 / rep.ops as f64);
    }
    let errors: u64 = rep.groups.iter().map(|g| g.errors + g.mismatches).sum();
    if errors > 0 {
        bail!("{label}: {errors} commands failed");
    }
    Ok(rep)
}

/// A run as the runner shows and records it: the main group's (the readers') figures,
/// the host's and target's CPU per I/O, and the writer's rate where there is one.
impl Measured for PerfReport {
    fn summary(&self) -> String {
        let g = &self.groups[0];
        format!(
            "{:.0} IOPS, p50 {}, p99.99 {}, host {} us/IO ({} of it NAPI)",
            g.iops,
            format::seconds(g.read_lat_ns.p50 as f64 / 1e9),
            format::seconds(g.read_lat_ns.p9999 as f64 / 1e9),
            host_us_per_io(self).map_or("-".into(), |v| format!("{v:.2}")),
            self.host_napi_cpu_us_per_io.map_or("none".into(), |v| format!("{v:.2}"))
        )
    }

    fn figures(&self) -> Vec<(&'static str, Option<f64>)> {
        let g = &self.groups[0];
        let l = &g.read_lat_ns;
        vec![
            ("iops", Some(g.iops)),
            ("p50_us", (l.count > 0).then(|| us(l.p50))),
            ("p99_us", (l.count > 0).then(|| us(l.p99))),
            ("p9999_us", (l.count > 0).then(|| us(l.p9999))),
            // The process's, as before; its NAPI threads' beside it.
            ("host_cpu_us_per_io", self.host_cpu_us_per_io),
            ("host_napi_cpu_us_per_io", self.host_napi_cpu_us_per_io),
            ("target_cpu_us_per_io", self.target_cpu_us_per_io),
            ("host_switches_per_io", self.host_switches_per_io),
            ("cmds_per_send", self.cmds_per_send),
            ("iops_per_host_core", per_core(self).ok()),
            ("writer_mb_per_s", self.groups.get(1).map(|w| w.mb_per_s)),
            ("job_sleeps_per_io", self.job_sleeps_per_io),
            ("host_napi_runs_per_io", self.host_napi_runs_per_io),
            ("busy_polled_packets_per_io", self.busy_polled_packets_per_io),
        ]
    }
}

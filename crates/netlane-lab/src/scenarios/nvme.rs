//! `netlane bench nvme`: the NVMe/TCP scenarios of the talk, host and target on their own
//! CPUs and (by default) their own network namespaces joined by a veth pair.
//!
//! - QD1 4 KiB random-read latency through the I/O worker, with direct send, and with
//!   poll queues;
//! - QD32 4 KiB random-read IOPS per host core with one send per command, with batching,
//!   and with i10 caravans;
//! - the mixed workload: 16 QD1 4 KiB readers and one QD32 1 MiB writer, on one shared
//!   queue map and on separate read/write maps.

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use netlane::topology::{LinkConfig, RxTuning, TwoHosts};
use netlane_nvme::host::ConnectOptions;
use netlane_nvme::perf::{Caravan, CpuBinding, JobGroup, PerfOptions, PerfReport};

use super::{PathKind, Progress, cpus, parse_positive_duration};
use crate::report::chart::{Series, bars};
use crate::report::{Cell, Check, ScenarioReport, Table};
use netlane_nvme::target::DEFAULT_NQN;

/// Parts of the NVMe scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Part {
    /// QD1 latency: I/O worker vs direct send vs polling.
    Qd1,
    /// QD32 IOPS per host core: no batching vs batching vs caravans.
    Qd32,
    /// 16 QD1 readers + a QD32 1 MiB writer: shared vs separate queue maps.
    Mixed,
}

/// Options of `netlane bench nvme`.
#[derive(Debug, Clone, Args)]
pub struct NvmeBenchArgs {
    /// Where host and target run.
    #[arg(long, value_enum, default_value_t = PathKind::Veth)]
    pub path: PathKind,
    /// Measured time per run.
    #[arg(long, default_value = "4s", value_parser = parse_positive_duration)]
    pub time: Duration,
    /// Warm-up before each measurement.
    #[arg(long, default_value = "500ms", value_parser = netlane::metrics::units::parse_duration)]
    pub ramp: Duration,
    /// CPU of the host side (jobs, queue workers, the host end's NAPI).
    #[arg(long, default_value_t = 0)]
    pub host_cpu: usize,
    /// CPU of the target (its reactor and its end's NAPI).
    #[arg(long)]
    pub target_cpu: Option<usize>,
    /// Parts to run (comma separated).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "qd1,qd32,mixed")]
    pub parts: Vec<Part>,
    /// Target memory namespace size.
    #[arg(long, default_value = "1G")]
    pub ns_size: String,
    /// Runs of each mode, interleaved (A B C A B C); the report keeps each mode's best
    /// run, since interference on a shared machine only adds latency and cost.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub repeat: u32,
    /// MTU of the veth pair (storage networks usually run jumbo frames).
    #[arg(long, default_value_t = 9000, value_parser = clap::value_parser!(u32).range(1280..=65535))]
    pub mtu: u32,
}

struct Run {
    part: Part,
    label: &'static str,
    opts: PerfOptions,
}

/// The target process; killed (by its PID, which we started) when dropped.
struct TargetProcess {
    child: Child,
}

impl Drop for TargetProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl NvmeBenchArgs {
    /// Checks the options against this machine.
    pub fn validate(&self) -> Result<()> {
        let n = cpus();
        let t = self.target_cpu();
        if self.host_cpu >= n || t >= n {
            bail!("CPU {} does not exist (this machine has {n})", self.host_cpu.max(t));
        }
        if self.parts.is_empty() {
            bail!("no parts to run");
        }
        netlane::metrics::units::parse_size(&self.ns_size).map_err(|e| anyhow::anyhow!("--ns-size: {e}"))?;
        if self.path == PathKind::Veth && !netlane::topology::have_privileges() {
            bail!("the veth path needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN); run as root or use --path loopback");
        }
        Ok(())
    }

    fn target_cpu(&self) -> usize {
        self.target_cpu.unwrap_or(if cpus() > 1 { 1 } else { 0 })
    }

    /// Number of runs.
    pub fn run_count(&self) -> usize {
        self.parts.iter().map(|p| if *p == Part::Mixed { 2 } else { 3 }).sum::<usize>() * self.repeat as usize
    }

    fn runs(&self, addr: SocketAddr, target_pid: u32) -> Result<Vec<Run>> {
        let host = self.host_cpu;
        let base = |groups: Vec<JobGroup>| PerfOptions {
            connect: {
                let mut c = ConnectOptions::new(addr, DEFAULT_NQN);
                c.kato_ms = 10_000;
                c
            },
            nsid: 1,
            groups,
            duration: self.time,
            ramp: self.ramp,
            queues: 1,
            read_queues: 0,
            poll_queues: 0,
            queue_cpus: netlane::cpus::CpuList::one(host),
            queue_depth: 128,
            direct_send: false,
            batch: true,
            caravan: None,
            verify: false,
            size: None,
            target_pid: Some(target_pid),
        };
        let g = |spec: &str| JobGroup::parse(spec).map_err(anyhow::Error::msg);
        let mut runs = Vec::new();
        for part in &self.parts {
            match part {
                Part::Qd1 => {
                    let reader = g(&format!("name=qd1,rw=randread,bs=4k,qd=1,jobs=1,cpus={host}"))?;
                    runs.push(Run { part: *part, label: "I/O worker", opts: base(vec![reader.clone()]) });
                    runs.push(Run {
                        part: *part,
                        label: "direct send",
                        opts: PerfOptions { direct_send: true, ..base(vec![reader.clone()]) },
                    });
                    let hipri = JobGroup { hipri: true, ..reader };
                    runs.push(Run {
                        part: *part,
                        label: "poll queue",
                        opts: PerfOptions { poll_queues: 1, ..base(vec![hipri]) },
                    });
                }
                Part::Qd32 => {
                    let reader = g(&format!("name=qd32,rw=randread,bs=4k,qd=32,jobs=1,cpus={host}"))?;
                    runs.push(Run {
                        part: *part,
                        label: "send per command",
                        opts: PerfOptions { batch: false, ..base(vec![reader.clone()]) },
                    });
                    runs.push(Run { part: *part, label: "batched", opts: base(vec![reader.clone()]) });
                    runs.push(Run {
                        part: *part,
                        label: "caravans",
                        opts: PerfOptions { caravan: Some(Caravan::default()), ..base(vec![reader]) },
                    });
                }
                Part::Mixed => {
                    let readers = g(&format!("name=readers,rw=randread,bs=4k,qd=1,jobs=16,cpus={host}"))?;
                    let writer =
                        JobGroup { cpus: CpuBinding::Unbound, ..g("name=writer,rw=write,bs=1M,qd=32,jobs=1")? };
                    // Direct send is on in both (as in current Linux hosts); only the
                    // queue maps differ.
                    runs.push(Run {
                        part: *part,
                        label: "shared map",
                        opts: PerfOptions { direct_send: true, ..base(vec![readers.clone(), writer.clone()]) },
                    });
                    runs.push(Run {
                        part: *part,
                        label: "separate maps",
                        opts: PerfOptions { read_queues: 1, direct_send: true, ..base(vec![readers, writer]) },
                    });
                }
            }
        }
        Ok(runs)
    }

    fn start_target(&self, hosts: Option<&TwoHosts>) -> Result<(TargetProcess, SocketAddr)> {
        let exe = std::env::current_exe().context("find the netlane executable")?;
        let listen = match hosts {
            Some(h) => SocketAddr::new(h.rx_addr(false), netlane_nvme::DEFAULT_PORT),
            None => SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
        };
        let mut cmd = match hosts {
            Some(h) => h.rx.command(&exe),
            None => std::process::Command::new(&exe),
        };
        cmd.args(["nvme", "target", "--listen", &listen.to_string(), "--cpus", &self.target_cpu().to_string()])
            .args(["--ns", &format!("mem:{}", self.ns_size)])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn().context("start the target process")?;
        let stdout = child.stdout.take().context("target stdout")?;
        let proc_ = TargetProcess { child };
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(l)) = lines.next() {
                let _ = tx.send(l);
            }
            // Keep draining so the target never blocks on a full pipe.
            for _ in lines {}
        });
        let line = rx.recv_timeout(Duration::from_secs(10)).context("the target did not start within 10 s")?;
        let addr: SocketAddr = line
            .strip_prefix("listening on ")
            .and_then(|r| r.split_whitespace().next())
            .and_then(|a| a.parse().ok())
            .with_context(|| format!("unexpected target output {line:?}"))?;
        Ok((proc_, addr))
    }

    /// Runs every part.
    pub fn run(&self, progress: &dyn Progress) -> Result<ScenarioReport> {
        self.validate()?;
        let hosts = match self.path {
            PathKind::Veth => {
                // Both directions carry data: each end's NAPI runs on its own side's CPU,
                // like two machines with NICs.
                let cfg = LinkConfig { mtu: self.mtu, queues: 1, rx: RxTuning::threaded_napi_on(self.target_cpu()) };
                let h = TwoHosts::create("nvme", cfg)?;
                RxTuning::threaded_napi_on(self.host_cpu).apply(&h.tx, &h.tx_if, h.tx_index)?;
                Some(h)
            }
            PathKind::Loopback => None,
        };
        let (target, addr) = self.start_target(hosts.as_ref())?;
        let runs = self.runs(addr, target.child.id())?;
        progress.plan(runs.len() * self.repeat as usize);
        let mut all: Vec<Vec<PerfReport>> = vec![Vec::new(); runs.len()];
        for round in 0..self.repeat {
            for (i, r) in runs.iter().enumerate() {
                let mut label = format!("{:?} {}", r.part, r.label).to_lowercase();
                if self.repeat > 1 {
                    label.push_str(&format!(" #{}", round + 1));
                }
                progress.start(&label);
                let opts = r.opts.clone();
                let rep = match &hosts {
                    Some(h) => h.tx.run(move || netlane_nvme::perf::run(&opts))?,
                    None => netlane_nvme::perf::run(&opts),
                }
                .with_context(|| format!("run {label}"))?;
                let errors: u64 = rep.groups.iter().map(|g| g.errors + g.mismatches).sum();
                if errors > 0 {
                    bail!("{label}: {errors} commands failed");
                }
                let main = &rep.groups[0];
                progress.finish(
                    &label,
                    &format!(
                        "{:.0} IOPS, p50 {:.1} us, p99.99 {:.1} us, host {:.2} us/IO",
                        main.iops,
                        main.read_lat_ns.p50 as f64 / 1e3,
                        main.read_lat_ns.p9999 as f64 / 1e3,
                        rep.host_cpu_us_per_io
                    ),
                );
                all[i].push(rep);
            }
        }
        // Each mode's best run by the measure its part is about.
        let mut results: Vec<(Part, &'static str, PerfReport)> = Vec::new();
        let mut spread = Vec::new();
        for (r, reps) in runs.iter().zip(all) {
            let key = |p: &PerfReport| -> f64 {
                let g = &p.groups[0];
                match r.part {
                    Part::Qd1 => g.read_lat_ns.p50 as f64,
                    Part::Qd32 => -(p.ops as f64 / p.host_cpu.total_s().max(1e-9)),
                    Part::Mixed => g.read_lat_ns.p9999 as f64,
                }
            };
            let values: Vec<String> = reps
                .iter()
                .map(|p| match r.part {
                    Part::Qd1 => format!("p50 {:.1} us", key(p) / 1e3),
                    Part::Qd32 => format!("{:.0} IOPS/core", -key(p)),
                    Part::Mixed => format!("p99.99 {:.0} us, {:.0} IOPS", key(p) / 1e3, p.groups[0].iops),
                })
                .collect();
            spread.push(format!("{:?} {}: {}", r.part, r.label, values.join("; ")).to_lowercase());
            if let Some(best) = reps.into_iter().min_by(|a, b| key(a).total_cmp(&key(b))) {
                results.push((r.part, r.label, best));
            }
        }
        drop(target);
        let mut rep = self.report(&results);
        if self.repeat > 1 {
            rep.notes.push(format!(
                "Each mode ran {} times, interleaved; tables and checks use each mode's best run (QD1: lowest p50; \
                 QD32: most IOPS per host core; mixed: lowest readers' p99.99). All runs: {}.",
                self.repeat,
                spread.join(" | ")
            ));
        }
        Ok(rep)
    }

    fn report(&self, results: &[(Part, &'static str, PerfReport)]) -> ScenarioReport {
        let mut rep = ScenarioReport {
            name: "nvme".into(),
            title: "NVMe/TCP: QD1 latency, QD32 IOPS per core, mixed workload queue maps".into(),
            description: format!(
                "A user-space NVMe/TCP host (netlane nvme perf) against netlane's target over {}. CPU split on this \
                 {}-CPU machine: the host (jobs, queue workers{}) on CPU {}, the target (one reactor{}) on CPU {}; the \
                 mixed workload's writer is unbound. Latency is from submission to completion in the job thread.",
                match self.path {
                    PathKind::Veth => "a veth pair between two network namespaces",
                    PathKind::Loopback => "loopback",
                },
                cpus(),
                if self.path == PathKind::Veth { ", the host end's threaded NAPI" } else { "" },
                self.host_cpu,
                if self.path == PathKind::Veth { ", the target end's threaded NAPI" } else { "" },
                self.target_cpu()
            ),
            options: vec![
                ("path".into(), format!("{:?}", self.path).to_lowercase()),
                ("mtu".into(), self.mtu.to_string()),
                ("repeat".into(), self.repeat.to_string()),
                ("time".into(), format!("{:?}", self.time)),
                ("ramp".into(), format!("{:?}", self.ramp)),
                ("host_cpu".into(), self.host_cpu.to_string()),
                ("target_cpu".into(), self.target_cpu().to_string()),
                ("ns".into(), format!("mem:{}", self.ns_size)),
            ],
            tables: Vec::new(),
            charts: Vec::new(),
            checks: Vec::new(),
            notes: Vec::new(),
            raw: serde_json::Value::Null,
        };
        let find =
            |part: Part, label: &str| results.iter().find(|(p, l, _)| *p == part && *l == label).map(|(_, _, r)| r);
        let mut raw = serde_json::Map::new();
        for (p, l, r) in results {
            raw.insert(format!("{p:?} {l}").to_lowercase(), serde_json::to_value(r).unwrap_or_default());
        }
        rep.raw = serde_json::Value::Object(raw);
        let us = |ns: u64| ns as f64 / 1e3;
        let summary = |name: &str, title: &str, part: Part| -> Option<crate::report::Table> {
            let rows: Vec<_> = results.iter().filter(|(p, _, _)| *p == part).collect();
            if rows.is_empty() {
                return None;
            }
            let mut t = crate::report::Table {
                name: name.into(),
                title: title.into(),
                columns: [
                    "mode",
                    "IOPS",
                    "p50 us",
                    "p99 us",
                    "p99.99 us",
                    "host us/IO",
                    "target us/IO",
                    "switches/IO",
                    "cmds/send",
                    "IOPS per host core",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect(),
                rows: Vec::new(),
            };
            for (_, l, r) in rows {
                let g = &r.groups[0];
                let host_cores = r.host_cpu.total_s() / r.seconds;
                t.rows.push(vec![
                    crate::report::Cell::text(*l),
                    crate::report::Cell::num(g.iops, 0),
                    crate::report::Cell::num(us(g.read_lat_ns.p50), 1),
                    crate::report::Cell::num(us(g.read_lat_ns.p99), 1),
                    crate::report::Cell::num(us(g.read_lat_ns.p9999), 1),
                    crate::report::Cell::num(r.host_cpu_us_per_io, 2),
                    crate::report::Cell::num(r.target_cpu_us_per_io.unwrap_or(f64::NAN), 2),
                    crate::report::Cell::num(r.host_switches_per_io, 2),
                    crate::report::Cell::num(r.cmds_per_send, 2),
                    crate::report::Cell::num(if host_cores > 0.0 { g.iops / host_cores } else { f64::NAN }, 0),
                ]);
            }
            Some(t)
        };
        if let Some(t) = summary("nvme-qd1", "QD1 4 KiB random read", Part::Qd1) {
            rep.tables.push(t);
        }
        if let Some(t) = summary("nvme-qd32", "QD32 4 KiB random read, one host core", Part::Qd32) {
            rep.tables.push(t);
        }
        // QD1 checks and chart.
        if let (Some(w), Some(d), Some(p)) =
            (find(Part::Qd1, "I/O worker"), find(Part::Qd1, "direct send"), find(Part::Qd1, "poll queue"))
        {
            let p50 = |r: &PerfReport| r.groups[0].read_lat_ns.p50 as f64;
            rep.checks.push(Check::new(
                "QD1: direct send lowers p50 latency (saves the hand-off to the I/O worker)",
                "direct / worker < 1",
                format!("{:.1} / {:.1} us = {:.2}", p50(d) / 1e3, p50(w) / 1e3, p50(d) / p50(w)),
                p50(d) < p50(w),
            ));
            rep.checks.push(Check::new(
                "QD1: polling lowers p50 latency further (no receive-side switch)",
                "poll / direct < 1",
                format!("{:.1} / {:.1} us = {:.2}", p50(p) / 1e3, p50(d) / 1e3, p50(p) / p50(d)),
                p50(p) < p50(d),
            ));
            let cats: Vec<String> = ["p50", "p90", "p99", "p99.9", "p99.99"].iter().map(|s| s.to_string()).collect();
            let series: Vec<Series> = [("I/O worker", w), ("direct send", d), ("poll queue", p)]
                .iter()
                .map(|(n, r)| {
                    let l = &r.groups[0].read_lat_ns;
                    Series::new(*n, vec![us(l.p50), us(l.p90), us(l.p99), us(l.p999), us(l.p9999)])
                })
                .collect();
            rep.charts.push(bars(
                "nvme-qd1",
                "QD1 4 KiB random read latency (us, log scale)",
                "us",
                &cats,
                &series,
                true,
            ));
        }
        if let (Some(n), Some(b), Some(c)) =
            (find(Part::Qd32, "send per command"), find(Part::Qd32, "batched"), find(Part::Qd32, "caravans"))
        {
            let per_core = |r: &PerfReport| r.ops as f64 / r.host_cpu.total_s().max(1e-9);
            rep.checks.push(Check::new(
                "QD32: batching raises IOPS per host core",
                "batched / send-per-command > 1",
                format!("{:.0} / {:.0} = {:.2}", per_core(b), per_core(n), per_core(b) / per_core(n)),
                per_core(b) > per_core(n),
            ));
            rep.checks.push(Check::new(
                "QD32: caravans put more commands in each send",
                "caravan cmds/send > batched",
                format!("{:.1} vs {:.1}", c.cmds_per_send, b.cmds_per_send),
                c.cmds_per_send > b.cmds_per_send,
            ));
            let cats: Vec<String> = ["send per command", "batched", "caravans"].iter().map(|s| s.to_string()).collect();
            rep.charts.push(bars(
                "nvme-qd32",
                "QD32 4 KiB random read: IOPS per host CPU-second",
                "IOPS per core",
                &cats,
                &[Series::new("IOPS per host core", vec![per_core(n), per_core(b), per_core(c)])],
                false,
            ));
        }
        if let (Some(s), Some(m)) = (find(Part::Mixed, "shared map"), find(Part::Mixed, "separate maps")) {
            rep.tables.push(perf_table("nvme-mixed-shared", "Mixed workload, one shared queue map", s));
            rep.tables.push(perf_table("nvme-mixed-separate", "Mixed workload, separate read and write queue maps", m));
            let r = |x: &PerfReport| x.groups[0].iops;
            let t = |x: &PerfReport| x.groups[0].read_lat_ns.p9999 as f64;
            let a = |x: &PerfReport| x.groups[0].read_lat_ns.mean;
            rep.checks.push(Check::new(
                "Mixed: separate queue maps raise the readers' IOPS (talk: more than 2x)",
                ">= 2x",
                format!("{:.0} / {:.0} = {:.1}x", r(m), r(s), r(m) / r(s).max(1e-9)),
                r(m) >= 2.0 * r(s),
            ));
            rep.checks.push(Check::new(
                "Mixed: separate queue maps cut the readers' p99.99 latency (talk: about 10x)",
                ">= 5x lower",
                format!("{:.0} / {:.0} us = {:.1}x", t(s) / 1e3, t(m) / 1e3, t(s) / t(m).max(1.0)),
                t(s) >= 5.0 * t(m),
            ));
            rep.notes.push(format!(
                "Mixed: readers' mean latency {:.0} us shared vs {:.0} us separate ({:.1}x); writer {:.0} vs {:.0} MB/s.",
                a(s) / 1e3,
                a(m) / 1e3,
                a(s) / a(m).max(1.0),
                s.groups.get(1).map_or(0.0, |g| g.mb_s),
                m.groups.get(1).map_or(0.0, |g| g.mb_s),
            ));
            let cats: Vec<String> =
                ["read IOPS", "read p50 us", "read p99 us", "read p99.99 us"].iter().map(|s| s.to_string()).collect();
            let series: Vec<Series> = [("shared map", s), ("separate maps", m)]
                .iter()
                .map(|(n, x)| {
                    let l = &x.groups[0].read_lat_ns;
                    Series::new(*n, vec![x.groups[0].iops, us(l.p50), us(l.p99), us(l.p9999)])
                })
                .collect();
            rep.charts.push(bars("nvme-mixed", "Mixed workload: the 16 readers (log scale)", "", &cats, &series, true));
        }
        rep
    }
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// A table of a perf report's groups.
pub fn perf_table(name: &str, title: &str, r: &PerfReport) -> Table {
    let mut t = Table {
        name: name.into(),
        title: title.into(),
        columns: [
            "group",
            "rw",
            "bs",
            "qd",
            "jobs",
            "IOPS",
            "MB/s",
            "p50 us",
            "p90 us",
            "p99 us",
            "p99.9 us",
            "p99.99 us",
            "errors",
            "mismatches",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        rows: Vec::new(),
    };
    for g in &r.groups {
        let lat = if g.reads >= g.writes { &g.read_lat_ns } else { &g.write_lat_ns };
        t.rows.push(vec![
            Cell::text(&g.name),
            Cell::text(&g.rw),
            Cell::text(netlane::metrics::units::format_size(u64::from(g.bs))),
            Cell::num(f64::from(g.qd), 0),
            Cell::num(f64::from(g.jobs), 0),
            Cell::num(g.iops, 0),
            Cell::num(g.mb_s, 1),
            Cell::num(us(lat.p50), 1),
            Cell::num(us(lat.p90), 1),
            Cell::num(us(lat.p99), 1),
            Cell::num(us(lat.p999), 1),
            Cell::num(us(lat.p9999), 1),
            Cell::num(g.errors as f64, 0),
            Cell::num(g.mismatches as f64, 0),
        ]);
    }
    t
}

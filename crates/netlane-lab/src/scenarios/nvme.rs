//! `nvme`: the NVMe/TCP talk's experiments, host and target on their own CPUs and (by
//! default) their own network namespaces joined by a veth pair.
//!
//! - QD1 4 KiB random-read latency through the I/O worker, with direct send, and with
//!   poll queues;
//! - QD32 4 KiB random-read IOPS per host core with one send per command, with batching,
//!   and with i10 caravans;
//! - the mixed workload: 16 QD1 4 KiB readers and one QD32 1 MiB writer, on one shared
//!   queue map and on separate read/write maps (at least five rounds: its p99.99 ratio
//!   swings between runs);
//! - queue-CPU affinity: QD1 latency and QD32 IOPS per host core with each queue's I/O
//!   worker on the submitting CPU (aligned) and on the other one (crossed);
//! - caravans against plain batching over request sizes 512 B..128 KiB and one or four
//!   jobs (a 512-byte-block namespace).
//!
//! Every mode runs once per round (rotating order); checks pair two modes per round.

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use netlane::cpus::CpuList;
use netlane::metrics::Summary;
use netlane::topology::{LinkConfig, RxTuning, TwoHosts};
use netlane_nvme::host::ConnectOptions;
use netlane_nvme::perf::{Caravan, CpuBinding, JobGroup, PerfOptions, PerfReport};
use netlane_nvme::target::DEFAULT_NQN;

use super::net::PathKind;
use super::{Scenario, from_words};
use crate::progress::Progress;
use crate::stats::{Spread, median, repeat_flags, round_order, sig};
use crate::verdict::{Measure, Spec, join_headline, measured_median, paired, positive, rate};
use netlane_report::options::{OptionList, parse_duration, parse_positive_duration, parse_size};
use netlane_report::{
    Axis, Chart, ChartKind, Column, Point, Row, RunRecord, Scale, ScenarioReport, Series, Table, Unit, Value, format,
};

/// Parts of the NVMe scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Part {
    /// QD1 latency: I/O worker vs direct send vs polling.
    Qd1,
    /// QD32 IOPS per host core: no batching vs batching vs caravans.
    Qd32,
    /// 16 QD1 readers + a QD32 1 MiB writer: shared vs separate queue maps.
    Mixed,
    /// Queue-CPU affinity: I/O workers on the submitting CPU vs the other one.
    Affinity,
    /// Caravans vs batching over request sizes and job counts.
    Caravans,
}

impl Part {
    fn name(self) -> String {
        crate::scenarios::value_name(&self)
    }
}

/// The caravan sweep's job counts (32 commands in flight in all); its request sizes are
/// an option.
const SWEEP_JOBS: [u32; 2] = [1, 4];
/// The namespace the sweep uses (512-byte blocks, so 512-byte requests are possible).
const SWEEP_NSID: u32 = 2;
/// Fewest rounds of the mixed part when more than one is asked for.
const MIXED_MIN_ROUNDS: u32 = 5;

fn sweep_label(mode: &str, bs: u32, jobs: u32) -> String {
    format!("{mode} {} x{jobs}", size_name(bs))
}

fn size_name(bs: u32) -> String {
    if bs >= 1024 { format!("{}K", bs / 1024) } else { bs.to_string() }
}

/// Options of the `nvme` scenario.
#[derive(Debug, Clone, Args)]
pub struct NvmeBenchArgs {
    /// Where host and target run.
    #[arg(long, value_enum, default_value_t = PathKind::Veth)]
    pub path: PathKind,
    /// Measured time per run.
    #[arg(short = 't', long, default_value = "4s", value_parser = parse_positive_duration)]
    pub time: Duration,
    /// Warm-up before each measurement.
    #[arg(long, alias = "ramp_time", default_value = "500ms", value_parser = parse_duration)]
    pub ramp: Duration,
    /// CPU of the host side (jobs, queue workers, the host end's NAPI).
    #[arg(long, default_value_t = 0)]
    pub host_cpu: usize,
    /// CPU of the target (its reactor and its end's NAPI) [default: 1, or 0 on a 1-CPU machine].
    #[arg(long)]
    pub target_cpu: Option<usize>,
    /// Parts to run (comma separated).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "qd1,qd32,mixed,affinity,caravans")]
    pub parts: Vec<Part>,
    /// Target memory namespace size.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub ns_size: u64,
    /// Rounds: every mode runs once per round, in a rotating order; checks pair the modes
    /// they compare within each round. The mixed part runs at least 5 unless this is 1.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub repeat: u32,
    /// MTU of the veth pair (storage networks usually run jumbo frames).
    #[arg(long, default_value_t = 9000, value_parser = clap::value_parser!(u32).range(1280..=65535))]
    pub mtu: u32,
    /// Request sizes of the caravan sweep (comma separated; 512 to 128K, multiples of 512).
    #[arg(long, value_delimiter = ',', default_value = "512,4K,32K,128K", value_parser = parse_sweep_size)]
    pub caravan_sizes: Vec<u32>,
}

/// A caravan sweep request size: 512 bytes to 128 KiB, whole 512-byte blocks.
fn parse_sweep_size(s: &str) -> Result<u32, String> {
    let v = parse_size(s)?;
    if !(512..=128 << 10).contains(&v) || v % 512 != 0 {
        return Err(format!("{s}: a request size is 512 to 128K, in whole 512-byte blocks"));
    }
    Ok(v as u32)
}

/// One mode of a part.
#[derive(Debug, Clone)]
struct Mode {
    part: Part,
    label: String,
    opts: PerfOptions,
}

/// The target process; killed (by the PID we started) when dropped, and by the kernel
/// when we die (parent-death signal).
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
    /// The defaults, as `netlane bench nvme` has them.
    pub fn defaults() -> NvmeBenchArgs {
        from_words(&[]).expect("the defaults parse")
    }

    fn target_cpu(&self) -> usize {
        self.target_cpu.unwrap_or(if netlane::cpus::online_count() > 1 { 1 } else { 0 })
    }

    fn labels(&self) -> Vec<(Part, String)> {
        let mut v: Vec<(Part, String)> = Vec::new();
        for p in &self.parts {
            let words: Vec<String> = match p {
                Part::Qd1 => ["I/O worker", "direct send", "poll queue"].map(String::from).to_vec(),
                Part::Qd32 => ["send per command", "batched", "caravans"].map(String::from).to_vec(),
                Part::Mixed => ["shared map", "separate maps", "readers alone"].map(String::from).to_vec(),
                Part::Affinity => {
                    ["QD1 aligned", "QD1 crossed", "QD32 aligned", "QD32 crossed"].map(String::from).to_vec()
                }
                Part::Caravans => self
                    .caravan_sizes
                    .iter()
                    .flat_map(|&bs| SWEEP_JOBS.iter().map(move |&j| (bs, j)))
                    .flat_map(|(bs, j)| ["batched", "caravans"].map(|m| sweep_label(m, bs, j)))
                    .collect(),
            };
            v.extend(words.into_iter().map(|w| (*p, w)));
        }
        v
    }

    /// Rounds a part runs.
    fn rounds(&self, part: Part) -> u32 {
        if part == Part::Mixed && self.repeat > 1 { self.repeat.max(MIXED_MIN_ROUNDS) } else { self.repeat }
    }

    fn modes(&self, addr: SocketAddr, target_pid: u32) -> Result<Vec<Mode>> {
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
            queue_cpus: CpuList::one(host),
            queue_depth: 128,
            direct_send: false,
            batch: true,
            caravan: None,
            verify: netlane_nvme::perf::VerifyMode::Off,
            size: None,
            target_pid: Some(target_pid),
        };
        let g = |spec: &str| JobGroup::parse(spec).map_err(anyhow::Error::msg);
        let mut modes = Vec::new();
        for part in &self.parts {
            let m = |label: &str, opts| Mode { part: *part, label: label.to_string(), opts };
            match part {
                Part::Qd1 => {
                    let reader = g(&format!("name=qd1,rw=randread,bs=4k,qd=1,jobs=1,cpus={host}"))?;
                    let hipri = JobGroup { hipri: true, ..reader.clone() };
                    modes.push(m("I/O worker", base(vec![reader.clone()])));
                    modes.push(m("direct send", PerfOptions { direct_send: true, ..base(vec![reader]) }));
                    modes.push(m("poll queue", PerfOptions { poll_queues: 1, ..base(vec![hipri]) }));
                }
                Part::Qd32 => {
                    let reader = g(&format!("name=qd32,rw=randread,bs=4k,qd=32,jobs=1,cpus={host}"))?;
                    modes.push(m("send per command", PerfOptions { batch: false, ..base(vec![reader.clone()]) }));
                    modes.push(m("batched", base(vec![reader.clone()])));
                    modes.push(m("caravans", PerfOptions { caravan: Some(Caravan::default()), ..base(vec![reader]) }));
                }
                Part::Mixed => {
                    let readers = g(&format!("name=readers,rw=randread,bs=4k,qd=1,jobs=16,cpus={host}"))?;
                    let writer =
                        JobGroup { cpus: CpuBinding::Unbound, ..g("name=writer,rw=write,bs=1M,qd=32,jobs=1")? };
                    // Direct send is on in both (as in current Linux hosts); only the
                    // queue maps differ.
                    let both = vec![readers.clone(), writer];
                    modes.push(m("shared map", PerfOptions { direct_send: true, ..base(both.clone()) }));
                    modes.push(m("separate maps", PerfOptions { read_queues: 1, direct_send: true, ..base(both) }));
                    // The floor no queue map can go below: the same readers with no
                    // writer at all.
                    modes.push(m(
                        "readers alone",
                        PerfOptions { read_queues: 1, direct_send: true, ..base(vec![readers]) },
                    ));
                }
                Part::Affinity => {
                    // The blk-mq map sends the host CPU's commands to its queue either way;
                    // what changes is where that queue's I/O worker runs. Crossed, it runs
                    // on the other CPU (on this machine also the target's).
                    let other = CpuList::one(self.target_cpu());
                    let qd1 = g(&format!("name=qd1,rw=randread,bs=4k,qd=1,jobs=1,cpus={host}"))?;
                    let qd32 = g(&format!("name=qd32,rw=randread,bs=4k,qd=32,jobs=1,cpus={host}"))?;
                    modes.push(m("QD1 aligned", base(vec![qd1.clone()])));
                    modes.push(m("QD1 crossed", PerfOptions { queue_cpus: other.clone(), ..base(vec![qd1]) }));
                    modes.push(m("QD32 aligned", base(vec![qd32.clone()])));
                    modes.push(m("QD32 crossed", PerfOptions { queue_cpus: other, ..base(vec![qd32]) }));
                }
                Part::Caravans => {
                    for &bs in &self.caravan_sizes {
                        for jobs in SWEEP_JOBS {
                            let spec = format!(
                                "name=sweep,rw=randread,bs={},qd={},jobs={jobs},cpus={host}",
                                size_name(bs),
                                32 / jobs
                            );
                            let opts = PerfOptions {
                                nsid: SWEEP_NSID,
                                duration: self.time.min(Duration::from_secs(2)),
                                ..base(vec![g(&spec)?])
                            };
                            modes.push(m(&sweep_label("batched", bs, jobs), opts.clone()));
                            modes.push(m(
                                &sweep_label("caravans", bs, jobs),
                                PerfOptions { caravan: Some(Caravan::default()), ..opts },
                            ));
                        }
                    }
                }
            }
        }
        Ok(modes)
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
        netlane_sys::process::kill_with_parent(&mut cmd);
        cmd.args(["nvme", "target", "--listen", &listen.to_string(), "--cpus", &self.target_cpu().to_string()])
            .args(["--ns", &format!("mem:{}", self.ns_size), "--ns", "mem:256M:512"])
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
}

impl Scenario for NvmeBenchArgs {
    fn name(&self) -> &'static str {
        "nvme"
    }

    fn options(&self) -> OptionList {
        let parts: Vec<String> = self.parts.iter().map(|p| p.name()).collect();
        OptionList::new()
            .text("path", self.path.name())
            .int("mtu", u64::from(self.mtu))
            .words("parts", &parts)
            .duration("time", self.time)
            .duration("ramp", self.ramp)
            .int("repeat", u64::from(self.repeat))
            .int("host-cpu", self.host_cpu as u64)
            .int("target-cpu", self.target_cpu() as u64)
            .size("ns-size", self.ns_size)
            .words("caravan-sizes", &self.caravan_sizes.iter().map(|b| size_name(*b)).collect::<Vec<_>>())
    }

    fn validate(&self) -> Result<()> {
        let n = netlane::cpus::online_count();
        for (what, c) in [("--host-cpu", self.host_cpu), ("--target-cpu", self.target_cpu())] {
            if c >= n {
                bail!("{what} {c}: this machine has CPUs 0-{}", n - 1);
            }
        }
        if self.parts.is_empty() {
            bail!("--parts: no parts to run");
        }
        if self.parts.contains(&Part::Caravans) && self.caravan_sizes.is_empty() {
            bail!("--caravan-sizes: no request sizes to sweep");
        }
        if self.ns_size < 64 << 20 {
            bail!("--ns-size {}: at least 64M (the mixed workload's writer alone covers 32M)", self.ns_size);
        }
        if self.path == PathKind::Veth && !netlane::topology::have_privileges() {
            bail!("the veth path needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN); run as root or use --path loopback");
        }
        Ok(())
    }

    fn runs(&self) -> usize {
        self.labels().iter().map(|(p, _)| self.rounds(*p) as usize).sum()
    }

    fn run(&self, progress: &dyn Progress) -> Result<ScenarioReport> {
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
        let modes = self.modes(addr, target.child.id())?;
        let mut all: Vec<Vec<PerfReport>> = vec![Vec::new(); modes.len()];
        let mut records = Vec::new();
        let mut index = 0u32;
        let most = self.parts.iter().map(|p| self.rounds(*p)).max().unwrap_or(1);
        for round in 0..most as usize {
            for i in round_order(modes.len(), round) {
                let m = &modes[i];
                if round >= self.rounds(m.part) as usize {
                    continue;
                }
                index += 1;
                let mut label = format!("{} {}", m.part.name(), m.label);
                if self.rounds(m.part) > 1 {
                    label.push_str(&format!(" #{}", round + 1));
                }
                progress.start(&label);
                let opts = m.opts.clone();
                let rep = match &hosts {
                    Some(h) => h.tx.run(move || netlane_nvme::perf::run(&opts))?,
                    None => netlane_nvme::perf::run(&opts),
                }
                .with_context(|| format!("run {label}"))?;
                let errors: u64 = rep.groups.iter().map(|g| g.errors + g.mismatches).sum();
                if errors > 0 {
                    bail!("{label}: {errors} commands failed");
                }
                let g = &rep.groups[0];
                progress.finish(
                    &label,
                    &format!(
                        "{:.0} IOPS, p50 {}, p99.99 {}, host {} us/IO",
                        g.iops,
                        format::seconds(g.read_lat_ns.p50 as f64 / 1e9),
                        format::seconds(g.read_lat_ns.p9999 as f64 / 1e9),
                        rep.host_cpu_us_per_io.map_or("-".into(), |v| format!("{v:.2}"))
                    ),
                );
                records.push(record(index, round as u32 + 1, &format!("{} {}", m.part.name(), m.label), &rep));
                all[i].push(rep);
            }
        }
        drop(target);
        Ok(self.report(&modes, &all, records))
    }
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

/// IOPS per host CPU-second.
fn per_core(r: &PerfReport) -> Measure {
    rate(r.ops as f64, r.host_cpu.total_s(), "host CPU")
}

/// The main group's (the readers') latency percentile, degenerate when nothing completed.
fn lat(r: &PerfReport, f: fn(&Summary) -> u64, what: &str) -> Measure {
    let s = &r.groups[0].read_lat_ns;
    if s.count == 0 {
        return Err(format!("no {} completed: empty latency histogram", r.groups[0].name));
    }
    positive(f(s) as f64, what)
}

fn p50(r: &PerfReport) -> Measure {
    lat(r, |s| s.p50, "p50")
}

fn p9999(r: &PerfReport) -> Measure {
    lat(r, |s| s.p9999, "p99.99")
}

fn iops(r: &PerfReport) -> Measure {
    positive(r.groups[0].iops, &format!("{} IOPS", r.groups[0].name))
}

fn record(index: u32, round: u32, label: &str, r: &PerfReport) -> RunRecord {
    let g = &r.groups[0];
    let l = &g.read_lat_ns;
    let mut rec = RunRecord::new(
        index,
        round,
        label,
        vec![
            ("iops", Some(g.iops)),
            ("p50_us", (l.count > 0).then(|| us(l.p50))),
            ("p99_us", (l.count > 0).then(|| us(l.p99))),
            ("p9999_us", (l.count > 0).then(|| us(l.p9999))),
            ("host_cpu_us_per_io", r.host_cpu_us_per_io),
            ("target_cpu_us_per_io", r.target_cpu_us_per_io),
            ("host_switches_per_io", r.host_switches_per_io),
            ("cmds_per_send", r.cmds_per_send),
            ("iops_per_host_core", per_core(r).ok()),
            ("writer_mb_per_s", r.groups.get(1).map(|w| w.mb_per_s)),
        ],
    );
    rec.detail = serde_json::to_value(r).unwrap_or_default();
    rec
}

fn values(rs: &[PerfReport], f: impl Fn(&PerfReport) -> Measure) -> Vec<f64> {
    rs.iter().filter_map(|r| f(r).ok()).collect()
}

fn med(rs: &[PerfReport], f: impl Fn(&PerfReport) -> Measure) -> Value {
    let v = values(rs, f);
    if v.is_empty() { Value::Missing } else { Value::num(median(v)) }
}

fn opt(o: Option<f64>, what: &str) -> Measure {
    o.ok_or_else(|| format!("no {what}"))
}

/// A percentile rank and how to read it from a summary.
type Pick = (f64, fn(&Summary) -> u64);

/// Median across rounds of each percentile, as points on a "nines" axis (seconds).
fn percentile_series(name: &str, rs: &[PerfReport], group: usize) -> Series {
    let pick: [Pick; 5] =
        [(50.0, |s| s.p50), (90.0, |s| s.p90), (99.0, |s| s.p99), (99.9, |s| s.p999), (99.99, |s| s.p9999)];
    let points = pick
        .iter()
        .filter_map(|(p, f)| {
            let v: Vec<f64> = rs
                .iter()
                .filter_map(|r| r.groups.get(group))
                .filter(|g| g.read_lat_ns.count > 0)
                .map(|g| f(&g.read_lat_ns) as f64 / 1e9)
                .collect();
            Point::of(format::nines_x(*p), &v)
        })
        .collect();
    Series { name: name.into(), points }
}

impl NvmeBenchArgs {
    fn report(&self, modes: &[Mode], all: &[Vec<PerfReport>], runs: Vec<RunRecord>) -> ScenarioReport {
        let find = |part: Part, label: &str| {
            modes.iter().position(|m| m.part == part && m.label == label).map(|i| &all[i][..])
        };
        let mut flags = Vec::new();
        for (m, rs) in modes.iter().zip(all) {
            flags.extend(repeat_flags(&format!("{} {}", m.part.name(), m.label), "IOPS", &values(rs, iops)));
        }
        let mut tables = Vec::new();
        let mut charts = Vec::new();
        let mut checks = Vec::new();
        let mut notes = Vec::new();
        let spread = |rs: &[PerfReport], f: fn(&PerfReport) -> Measure| {
            Value::opt(Spread::of(&values(rs, f)).and_then(|s| s.relative()).map(|r| r * 100.0))
        };
        let us_of = |f: fn(&Summary) -> u64| move |r: &PerfReport| lat(r, f, "latency").map(|v| v / 1e3);
        // A check on the per-round ratio f(a) / f(b) of two modes of `part`.
        let compare = |spec: Spec, part: Part, a: &str, b: &str, f: fn(&PerfReport) -> Measure, what: &str| match (
            find(part, a),
            find(part, b),
        ) {
            (Some(x), Some(y)) => spec.evaluate(paired(x, y, f), &format!("{what}, per round")),
            _ => spec.skipped(format!("the {} part did not run", part.name())),
        };

        if self.parts.contains(&Part::Qd1) {
            let mut t = Table::new(
                "nvme-qd1",
                format!("QD1 4 KiB random read, medians of {} rounds", self.repeat),
                vec![
                    Column::new("mode", "mode", 0),
                    Column::new("iops", "IOPS", 0),
                    Column::new("p50_us", "p50 us", 1),
                    Column::new("p90_us", "p90 us", 1),
                    Column::new("p99_us", "p99 us", 1),
                    Column::new("p999_us", "p99.9 us", 1),
                    Column::new("p9999_us", "p99.99 us", 1),
                    Column::new("host_cpu_us_per_io", "host CPU us/IO", 2),
                    Column::new("target_cpu_us_per_io", "target CPU us/IO", 2),
                    Column::new("host_switches_per_io", "switches/IO", 2),
                    Column::new("p50_spread_pct", "p50 spread %", 0),
                ],
            );
            let mut series = Vec::new();
            for label in ["I/O worker", "direct send", "poll queue"] {
                let Some(rs) = find(Part::Qd1, label) else { continue };
                t.push(Row::new(vec![
                    Value::text(label),
                    med(rs, iops),
                    med(rs, us_of(|s| s.p50)),
                    med(rs, us_of(|s| s.p90)),
                    med(rs, us_of(|s| s.p99)),
                    med(rs, us_of(|s| s.p999)),
                    med(rs, us_of(|s| s.p9999)),
                    med(rs, |r| opt(r.host_cpu_us_per_io, "host CPU per I/O")),
                    med(rs, |r| opt(r.target_cpu_us_per_io, "target CPU per I/O")),
                    med(rs, |r| opt(r.host_switches_per_io, "switches per I/O")),
                    spread(rs, p50),
                ]));
                series.push(percentile_series(label, rs, 0));
            }
            tables.push(t);
            charts.push(Chart {
                name: "nvme-qd1".into(),
                title: "QD1 4 KiB random read: latency by percentile".into(),
                kind: ChartKind::Percentiles,
                x: Axis::numeric("percentile", Unit::Nines, Scale::Linear),
                y: Axis::numeric("latency", Unit::Seconds, Scale::Log),
                series,
            });
            let pair = |id: &str, name: &str, a: &str, b: &str| {
                compare(Spec::below(id, name, 1.0, "x"), Part::Qd1, a, b, p50, &format!("{a} / {b} p50"))
            };
            checks.push(pair(
                "nvme.qd1-direct-send",
                "QD1: direct send lowers p50 latency (saves the hand-off to the I/O worker)",
                "direct send",
                "I/O worker",
            ));
            checks.push(pair(
                "nvme.qd1-polling",
                "QD1: polling lowers p50 latency further (no receive-side switch)",
                "poll queue",
                "direct send",
            ));
        }

        if self.parts.contains(&Part::Qd32) {
            let mut t = Table::new(
                "nvme-qd32",
                format!("QD32 4 KiB random read on one host core, medians of {} rounds", self.repeat),
                vec![
                    Column::new("mode", "mode", 0),
                    Column::new("iops", "IOPS", 0),
                    Column::new("iops_per_host_core", "IOPS per host core", 0),
                    Column::new("cmds_per_send", "commands/send", 1),
                    Column::new("host_cpu_us_per_io", "host CPU us/IO", 2),
                    Column::new("host_switches_per_io", "switches/IO", 2),
                    Column::new("p50_us", "p50 us", 1),
                    Column::new("p9999_us", "p99.99 us", 1),
                    Column::new("spread_pct", "spread %", 0),
                ],
            );
            let mut points = Vec::new();
            let labels = ["send per command", "batched", "caravans"];
            for (x, label) in labels.iter().enumerate() {
                let Some(rs) = find(Part::Qd32, label) else { continue };
                t.push(Row::new(vec![
                    Value::text(*label),
                    med(rs, iops),
                    med(rs, per_core),
                    med(rs, |r| opt(r.cmds_per_send, "sends")),
                    med(rs, |r| opt(r.host_cpu_us_per_io, "host CPU per I/O")),
                    med(rs, |r| opt(r.host_switches_per_io, "switches per I/O")),
                    med(rs, us_of(|s| s.p50)),
                    med(rs, us_of(|s| s.p9999)),
                    spread(rs, per_core),
                ]));
                points.extend(Point::of(x as f64, &values(rs, per_core)));
            }
            tables.push(t);
            charts.push(Chart {
                name: "nvme-qd32".into(),
                title: "QD32 4 KiB random read: IOPS per host CPU-second".into(),
                kind: ChartKind::Bars,
                x: Axis::categories("mode", labels.iter().map(|s| s.to_string()).collect()),
                y: Axis::numeric("IOPS per host core", Unit::Count("IOPS".into()), Scale::Linear),
                series: vec![Series { name: "IOPS per host core".into(), points }],
            });
            let spec = Spec::above(
                "nvme.qd32-batching",
                "QD32: batching raises IOPS per host core over one send per command",
                1.0,
                "x",
            );
            checks.push(compare(
                spec,
                Part::Qd32,
                "batched",
                "send per command",
                per_core,
                "batched / send per command IOPS per host core",
            ));
            if let (Some(c), Some(b)) = (find(Part::Qd32, "caravans"), find(Part::Qd32, "batched"))
                && let (Value::Num(cc), Value::Num(bc)) =
                    (med(c, |r| opt(r.cmds_per_send, "sends")), med(b, |r| opt(r.cmds_per_send, "sends")))
            {
                notes.push(format!(
                    "Caravans put {cc:.1} commands in each send, plain batching {bc:.1} (a fact of how each sends, \
                     counted by the host, not a target)."
                ));
            }
        }

        if self.parts.contains(&Part::Mixed) {
            let mut t = Table::new(
                "nvme-mixed",
                format!(
                    "Mixed workload: 16 QD1 4 KiB readers and a QD32 1 MiB writer, medians of {} rounds",
                    self.rounds(Part::Mixed)
                ),
                vec![
                    Column::new("map", "queue maps", 0),
                    Column::new("readers_iops", "readers IOPS", 0),
                    Column::new("readers_p50_us", "readers p50 us", 1),
                    Column::new("readers_p99_us", "readers p99 us", 1),
                    Column::new("readers_p9999_us", "readers p99.99 us", 1),
                    Column::new("readers_mean_us", "readers mean us", 1),
                    Column::new("writer_mb_per_s", "writer MB/s", 0),
                    Column::new("p9999_spread_pct", "p99.99 spread %", 0),
                ],
            );
            let mut series = Vec::new();
            let mut iops_points = Vec::new();
            for (x, label) in ["shared map", "separate maps", "readers alone"].iter().enumerate() {
                let Some(rs) = find(Part::Mixed, label) else { continue };
                t.push(Row::new(vec![
                    Value::text(*label),
                    med(rs, iops),
                    med(rs, us_of(|s| s.p50)),
                    med(rs, us_of(|s| s.p99)),
                    med(rs, us_of(|s| s.p9999)),
                    med(rs, |r| positive(r.groups[0].read_lat_ns.mean, "mean latency").map(|v| v / 1e3)),
                    med(rs, |r| r.groups.get(1).map_or(Err("no writer".into()), |w| Ok(w.mb_per_s))),
                    spread(rs, p9999),
                ]));
                series.push(percentile_series(label, rs, 0));
                iops_points.extend(Point::of(x as f64, &values(rs, iops)));
            }
            tables.push(t);
            charts.push(Chart {
                name: "nvme-mixed".into(),
                title: "Mixed workload: the 16 readers' latency by percentile".into(),
                kind: ChartKind::Percentiles,
                x: Axis::numeric("percentile", Unit::Nines, Scale::Linear),
                y: Axis::numeric("read latency", Unit::Seconds, Scale::Log),
                series,
            });
            charts.push(Chart {
                name: "nvme-mixed-iops".into(),
                title: "Mixed workload: the 16 readers' IOPS".into(),
                kind: ChartKind::Bars,
                x: Axis::categories(
                    "queue maps",
                    vec!["shared map".into(), "separate maps".into(), "readers alone".into()],
                ),
                y: Axis::numeric("readers' IOPS", Unit::Count("IOPS".into()), Scale::Linear),
                series: vec![Series { name: "readers".into(), points: iops_points }],
            });
            let spec = Spec::at_least(
                "nvme.mixed-read-iops",
                "Mixed: separate queue maps raise the readers' IOPS (talk: more than 2x)",
                2.0,
                "x",
            );
            checks.push(compare(
                spec,
                Part::Mixed,
                "separate maps",
                "shared map",
                iops,
                "separate / shared readers' IOPS",
            ));
            let spec = Spec::at_least(
                "nvme.mixed-read-p9999",
                "Mixed: separate queue maps cut the readers' p99.99 latency (talk: about 10x)",
                5.0,
                "x lower",
            );
            checks.push(compare(
                spec,
                Part::Mixed,
                "shared map",
                "separate maps",
                p9999,
                "shared / separate readers' p99.99",
            ));
            // What bounds the ratio here: a perfect queue map would give the readers
            // their latency without a writer, so shared / alone is the most any map
            // could reach on this machine.
            if let (Some(shared), Some(sep), Some(alone)) = (
                find(Part::Mixed, "shared map"),
                find(Part::Mixed, "separate maps"),
                find(Part::Mixed, "readers alone"),
            ) {
                let ratios = |a, b| -> Option<Spread> {
                    Spread::of(&paired(a, b, p9999).into_iter().filter_map(Result::ok).collect::<Vec<_>>())
                };
                if let (Some(ceiling), Some(gap), Value::Num(floor)) =
                    (ratios(shared, alone), ratios(sep, alone), med(alone, p9999))
                {
                    notes.push(format!(
                        "The 16 readers alone, with no writer, have p99.99 {} us (median of {} rounds): the floor \
                         no queue map can go below on this CPU split. Shared map / readers alone is {}x ({}..{}), \
                         the most separate maps could reach here; separate maps / readers alone is {}x ({}..{}).",
                        sig(floor / 1e3),
                        alone.len(),
                        sig(ceiling.median),
                        sig(ceiling.min),
                        sig(ceiling.max),
                        sig(gap.median),
                        sig(gap.min),
                        sig(gap.max),
                    ));
                }
            }
        }

        if self.parts.contains(&Part::Affinity) {
            let mut t = Table::new(
                "nvme-affinity",
                format!(
                    "Queue-CPU affinity: the I/O worker on the submitting CPU {} (aligned) or on CPU {} (crossed), \
                     medians of {} rounds",
                    self.host_cpu,
                    self.target_cpu(),
                    self.repeat
                ),
                vec![
                    Column::new("mode", "mode", 0),
                    Column::new("iops", "IOPS", 0),
                    Column::new("iops_per_host_core", "IOPS per host core", 0),
                    Column::new("p50_us", "p50 us", 1),
                    Column::new("p99_us", "p99 us", 1),
                    Column::new("host_cpu_us_per_io", "host CPU us/IO", 2),
                    Column::new("host_switches_per_io", "switches/IO", 2),
                ],
            );
            for label in ["QD1 aligned", "QD1 crossed", "QD32 aligned", "QD32 crossed"] {
                let Some(rs) = find(Part::Affinity, label) else { continue };
                t.push(Row::new(vec![
                    Value::text(label),
                    med(rs, iops),
                    med(rs, per_core),
                    med(rs, us_of(|s| s.p50)),
                    med(rs, us_of(|s| s.p99)),
                    med(rs, |r| opt(r.host_cpu_us_per_io, "host CPU per I/O")),
                    med(rs, |r| opt(r.host_switches_per_io, "switches per I/O")),
                ]));
            }
            tables.push(t);
            let spec = Spec::below(
                "nvme.affinity-qd1",
                "Affinity: an aligned I/O worker lowers QD1 p50 latency (talk: 30 -> 27 us, 0.9x)",
                1.0,
                "x",
            );
            checks.push(compare(spec, Part::Affinity, "QD1 aligned", "QD1 crossed", p50, "aligned / crossed p50"));
            let spec = Spec::at_least(
                "nvme.affinity-qd32",
                "Affinity: an aligned I/O worker raises QD32 IOPS per host core (talk: 180 K -> 230 K, 1.28x)",
                1.2,
                "x",
            );
            checks.push(compare(
                spec,
                Part::Affinity,
                "QD32 aligned",
                "QD32 crossed",
                per_core,
                "aligned / crossed IOPS per host core",
            ));
        }

        if self.parts.contains(&Part::Caravans) {
            let mut t = Table::new(
                "nvme-caravans",
                format!(
                    "Caravans vs plain batching, random reads, 32 commands in flight split over the jobs, medians of \
                     {} rounds",
                    self.repeat
                ),
                vec![
                    Column::new("bs_bytes", "request", 0),
                    Column::new("jobs", "jobs", 0),
                    Column::new("batched_per_core", "batched IOPS/core", 0),
                    Column::new("caravans_per_core", "caravans IOPS/core", 0),
                    Column::new("ratio", "caravans / batched", 2),
                    Column::new("ratio_min", "min", 2),
                    Column::new("ratio_max", "max", 2),
                    Column::new("batched_cmds_per_send", "batched cmds/send", 1),
                    Column::new("caravans_cmds_per_send", "caravans cmds/send", 1),
                ],
            );
            let mut won = Vec::new();
            let mut series: Vec<Series> = SWEEP_JOBS
                .iter()
                .map(|j| Series { name: format!("{j} job{}", if *j == 1 { "" } else { "s" }), points: Vec::new() })
                .collect();
            for (bi, &bs) in self.caravan_sizes.iter().enumerate() {
                for (ji, jobs) in SWEEP_JOBS.iter().enumerate() {
                    let (Some(b), Some(c)) = (
                        find(Part::Caravans, &sweep_label("batched", bs, *jobs)),
                        find(Part::Caravans, &sweep_label("caravans", bs, *jobs)),
                    ) else {
                        continue;
                    };
                    let ratios: Vec<f64> = paired(c, b, per_core).into_iter().filter_map(Result::ok).collect();
                    let sp = Spread::of(&ratios);
                    if sp.as_ref().is_some_and(|s| s.min > 1.0) {
                        won.push(format!("{} x{jobs} ({})", size_name(bs), sig(sp.as_ref().map_or(0.0, |s| s.median))));
                    }
                    series[ji].points.extend(Point::of(bi as f64, &ratios));
                    t.push(Row::new(vec![
                        Value::num(f64::from(bs)),
                        Value::num(f64::from(*jobs)),
                        med(b, per_core),
                        med(c, per_core),
                        Value::opt(sp.as_ref().map(|s| s.median)),
                        Value::opt(sp.as_ref().map(|s| s.min)),
                        Value::opt(sp.as_ref().map(|s| s.max)),
                        med(b, |r| opt(r.cmds_per_send, "sends")),
                        med(c, |r| opt(r.cmds_per_send, "sends")),
                    ]));
                }
            }
            tables.push(t);
            charts.push(Chart {
                name: "nvme-caravans".into(),
                title: "Caravans / plain batching, IOPS per host core, by request size".into(),
                kind: ChartKind::Lines,
                x: Axis::categories("request size", self.caravan_sizes.iter().map(|b| size_name(*b)).collect()),
                y: Axis::numeric("caravans / batched", Unit::Ratio, Scale::Linear),
                series,
            });
            notes.push(if won.is_empty() {
                "Caravans won in no cell of the sweep (no size and job count where every round's ratio was above 1)."
                    .to_string()
            } else {
                format!("Caravans beat plain batching in every round at: {}.", won.join(", "))
            });
        }

        let headline = {
            let get = |id: &str| measured_median(&checks, id);
            let parts = [
                get("nvme.qd1-polling").map(|v| format!("polling took QD1 p50 to {v}x of direct send's")),
                get("nvme.qd32-batching").map(|v| format!("batching gave {v}x the IOPS per host core")),
                get("nvme.mixed-read-p9999").map(|v| format!("separate queue maps cut the readers' p99.99 {v}x")),
            ];
            join_headline(parts.into_iter().flatten().collect())
                .unwrap_or_else(|| format!("{} modes, {} rounds.", modes.len(), self.repeat))
        };
        let options = self.options();
        ScenarioReport {
            name: "nvme".into(),
            title: "NVMe/TCP: QD1 latency, QD32 IOPS per core, mixed workload queue maps".into(),
            description: format!(
                "A user-space NVMe/TCP host (netlane nvme perf) against netlane's target over {}. CPU split on this \
                 {}-CPU machine: the host (jobs, queue workers{}) on CPU {}, the target (one reactor{}) on CPU {}; the \
                 mixed workload's writer is unbound. Latency is from submission to completion in the job thread. \
                 In the affinity part, \"crossed\" runs the queue's I/O worker on the target's CPU: on a 2-CPU \
                 machine that also gives the host a second CPU, which the talk's many-core machine never lacked.",
                match self.path {
                    PathKind::Veth => "a veth pair between two network namespaces",
                    PathKind::Loopback => "loopback",
                },
                netlane::cpus::online_count(),
                if self.path == PathKind::Veth { ", the host end's threaded NAPI" } else { "" },
                self.host_cpu,
                if self.path == PathKind::Veth { ", the target end's threaded NAPI" } else { "" },
                self.target_cpu()
            ),
            headline,
            options: options.object(),
            echo: options.echo(),
            tables,
            charts,
            checks,
            flags,
            notes,
            runs,
            cpu_plan: Vec::new(),
        }
    }
}

/// A table of a perf report's groups (what `netlane nvme perf` prints).
pub fn perf_table(name: &str, title: &str, r: &PerfReport) -> Table {
    let mut t = Table::new(
        name,
        title,
        vec![
            Column::new("group", "group", 0),
            Column::new("rw", "rw", 0),
            Column::new("bs_bytes", "bs", 0),
            Column::new("qd", "qd", 0),
            Column::new("jobs", "jobs", 0),
            Column::new("iops", "IOPS", 0),
            Column::new("mb_per_s", "MB/s", 1),
            Column::new("p50_us", "p50 us", 1),
            Column::new("p90_us", "p90 us", 1),
            Column::new("p99_us", "p99 us", 1),
            Column::new("p999_us", "p99.9 us", 1),
            Column::new("p9999_us", "p99.99 us", 1),
            Column::new("errors", "errors", 0),
            Column::new("mismatches", "mismatches", 0),
        ],
    );
    for g in &r.groups {
        let lat = if g.reads >= g.writes { &g.read_lat_ns } else { &g.write_lat_ns };
        let l = |v: u64| if lat.count > 0 { Value::num(us(v)) } else { Value::Missing };
        t.push(Row::new(vec![
            Value::text(&g.name),
            Value::text(&g.rw),
            Value::Int(u64::from(g.bs_bytes)),
            Value::Int(u64::from(g.qd)),
            Value::Int(u64::from(g.jobs)),
            Value::num(g.iops),
            Value::num(g.mb_per_s),
            l(lat.p50),
            l(lat.p90),
            l(lat.p99),
            l(lat.p999),
            l(lat.p9999),
            Value::Int(g.errors),
            Value::Int(g.mismatches),
        ]));
    }
    t
}

#[cfg(test)]
mod tests {
    use netlane::metrics::CpuTime;
    use netlane_nvme::perf::GroupReport;

    use super::*;
    use netlane_report::Outcome;

    /// A run whose main group did `ops` reads in a second with these latencies.
    fn perf(ops: u64, p50_ns: u64, p9999_ns: u64, host_cpu_s: f64) -> PerfReport {
        let lat = Summary {
            count: ops,
            p50: p50_ns,
            p90: p50_ns,
            p99: p9999_ns,
            p999: p9999_ns,
            p9999: p9999_ns,
            mean: p50_ns as f64,
            ..Summary::default()
        };
        let group = |name: &str| GroupReport {
            name: name.into(),
            rw: "randread".into(),
            bs_bytes: 4096,
            qd: 1,
            jobs: 1,
            ops,
            reads: ops,
            writes: 0,
            iops: ops as f64,
            mb_per_s: 0.0,
            read_lat_ns: if ops > 0 { lat } else { Summary::default() },
            write_lat_ns: Summary::default(),
            errors: 0,
            mismatches: 0,
        };
        PerfReport {
            groups: vec![group("readers"), group("writer")],
            seconds: 1.0,
            ops,
            iops: ops as f64,
            host_cpu: CpuTime { user_s: host_cpu_s, ..CpuTime::default() },
            host_cpu_us_per_io: None,
            host_switches_per_io: None,
            target_cpu_us_per_io: None,
            direct_sends: 0,
            worker_sends: 0,
            send_calls: 0,
            cmds_per_send: None,
            queues: Vec::new(),
            queue_failures: 0,
            verified: false,
        }
    }

    fn setup() -> (NvmeBenchArgs, Vec<Mode>) {
        let a = NvmeBenchArgs::defaults();
        let modes = a.modes("127.0.0.1:4420".parse().unwrap(), 1).unwrap();
        (a, modes)
    }

    /// Two good rounds per mode; the mode labelled `bad` gets `degenerate` in round 2.
    fn all(modes: &[Mode], bad: &str, degenerate: PerfReport) -> Vec<Vec<PerfReport>> {
        modes
            .iter()
            .map(|m| {
                let good = match m.label.as_str() {
                    "I/O worker" => perf(25_000, 38_000, 1_900_000, 0.5),
                    "direct send" => perf(30_000, 32_000, 850_000, 0.5),
                    "poll queue" => perf(48_000, 19_000, 900_000, 1.0),
                    "send per command" => perf(90_000, 330_000, 2_300_000, 1.0),
                    "batched" => perf(200_000, 160_000, 2_200_000, 0.8),
                    "caravans" => perf(160_000, 170_000, 2_700_000, 0.8),
                    "shared map" => perf(2_100, 7_400_000, 15_000_000, 1.0),
                    "readers alone" => perf(40_000, 350_000, 1_500_000, 1.0),
                    "QD1 aligned" => perf(30_000, 30_000, 900_000, 0.5),
                    "QD1 crossed" => perf(27_000, 34_000, 900_000, 0.5),
                    "QD32 aligned" => perf(230_000, 140_000, 900_000, 1.0),
                    "QD32 crossed" => perf(180_000, 170_000, 900_000, 1.0),
                    l if l.starts_with("caravans ") => perf(200_000, 160_000, 2_200_000, 0.8),
                    l if l.starts_with("batched ") => perf(200_000, 160_000, 2_200_000, 1.0),
                    _ => perf(17_000, 600_000, 2_000_000, 1.0),
                };
                let second = if m.label == bad { degenerate.clone() } else { good.clone() };
                vec![good, second]
            })
            .collect()
    }

    fn outcome(r: &ScenarioReport, id: &str) -> (Outcome, String) {
        let c = r.checks.iter().find(|c| c.id == id).unwrap_or_else(|| panic!("no {id}"));
        (c.outcome, c.reason.clone())
    }

    #[test]
    fn good_rounds_meet_the_targets_they_should() {
        let (a, modes) = setup();
        let r = a.report(&modes, &all(&modes, "none", perf(0, 0, 0, 0.0)), Vec::new());
        for c in &r.checks {
            assert_eq!(c.outcome, Outcome::Met, "{}: {:?} {}", c.id, c.measured, c.reason);
        }
        // 15 ms shared, 2 ms separate, 1.5 ms without a writer.
        let floor = r.notes.iter().find(|n| n.contains("readers alone")).expect("a note on the mixed floor");
        assert!(floor.contains("p99.99 1500 us"), "{floor}");
        assert!(floor.contains("is 10.0x (10.0..10.0)"), "{floor}");
        assert!(floor.contains("is 1.33x"), "{floor}");
    }

    #[test]
    fn mixed_checks_are_invalid_when_the_shared_map_readers_did_nothing() {
        // Before: 0 IOPS with a shared map made "separate >= 2x shared" pass.
        let (a, modes) = setup();
        let r = a.report(&modes, &all(&modes, "shared map", perf(0, 0, 0, 1.0)), Vec::new());
        for id in ["nvme.mixed-read-iops", "nvme.mixed-read-p9999"] {
            let (o, why) = outcome(&r, id);
            assert_eq!(o, Outcome::Invalid, "{id}: {why}");
        }
    }

    #[test]
    fn an_empty_histogram_or_no_cpu_time_is_invalid() {
        let (a, modes) = setup();
        // Separate maps with a p99.99 of 0 (nothing completed): the old check divided by it.
        let r = a.report(&modes, &all(&modes, "separate maps", perf(0, 0, 0, 1.0)), Vec::new());
        let (o, why) = outcome(&r, "nvme.mixed-read-p9999");
        assert_eq!(o, Outcome::Invalid);
        assert!(why.contains("empty latency histogram"), "{why}");
        let r = a.report(&modes, &all(&modes, "direct send", perf(0, 0, 0, 0.5)), Vec::new());
        assert_eq!(outcome(&r, "nvme.qd1-direct-send").0, Outcome::Invalid);
        assert_eq!(outcome(&r, "nvme.qd1-polling").0, Outcome::Invalid);
        let r = a.report(&modes, &all(&modes, "batched", perf(200_000, 160_000, 2_200_000, 0.0)), Vec::new());
        let (o, why) = outcome(&r, "nvme.qd32-batching");
        assert_eq!(o, Outcome::Invalid);
        assert!(why.contains("no time was measured"), "{why}");
    }

    #[test]
    fn the_mixed_part_runs_five_rounds_and_the_sweep_says_where_caravans_won() {
        let (mut a, modes) = setup();
        a.repeat = 3;
        let per_round = modes.len();
        let mixed = modes.iter().filter(|m| m.part == Part::Mixed).count();
        assert_eq!(a.runs(), per_round * 3 + mixed * 2, "mixed modes run 5 rounds, the rest 3");
        a.repeat = 1;
        assert_eq!(a.runs(), per_round, "--repeat 1 runs everything once");
        assert_eq!(modes.iter().filter(|m| m.part == Part::Caravans).count(), 16);
        // Caravans at 0.8 s of CPU against batching's 1.0 for the same IOPS: a win in
        // every cell, each named.
        let r = a.report(&modes, &all(&modes, "none", perf(0, 0, 0, 0.0)), Vec::new());
        let note = r.notes.iter().find(|n| n.contains("Caravans beat")).expect("a note on the sweep");
        assert!(note.contains("512 x1 (1.25)") && note.contains("128K x4"), "{note}");
        // A degenerate crossed run makes the affinity check invalid, never met.
        let r = a.report(&modes, &all(&modes, "QD32 crossed", perf(0, 0, 0, 0.0)), Vec::new());
        assert_eq!(outcome(&r, "nvme.affinity-qd32").0, Outcome::Invalid);
    }

    #[test]
    fn a_collapsed_repeat_is_flagged() {
        let (mut a, modes) = setup();
        a.repeat = 3;
        let mut rs = all(&modes, "none", perf(0, 0, 0, 0.0));
        let poll = modes.iter().position(|m| m.label == "poll queue").unwrap();
        rs[poll] =
            vec![perf(40_000, 19_000, 900_000, 1.0), perf(6, 19_000, 900_000, 1.0), perf(41_000, 19_000, 900_000, 1.0)];
        let r = a.report(&modes, &rs, Vec::new());
        assert!(
            r.flags.iter().any(|f| f.kind == netlane_report::FlagKind::Collapsed && f.subject == "qd1 poll queue"),
            "{:?}",
            r.flags
        );
    }
}

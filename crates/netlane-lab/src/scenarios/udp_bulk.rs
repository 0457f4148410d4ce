//! `netlane bench udp-bulk`: UDP bulk transfer in every mode, side by side with TCP
//! and with the kernel's own selftest sender, over veth between namespaces (or
//! loopback).

use std::path::PathBuf;
use std::time::Duration;

use crate::engines::bulk::{BulkResult, BulkRun, Pacing, RxSpec, TxSource, TxSpec, Verify};
use anyhow::{Result, bail};
use clap::{Args, ValueEnum};
use netlane::metrics::units::{Rate, format_duration};
use netlane::pace::Quantum;
use netlane::udp::gso::GsoLimits;
use netlane::udp::{Batching, GsoMode, RxBatching};
use serde::Serialize;

use super::{NetArgs, Progress, median, parse_positive_duration, parse_quantum, parse_rate, quantum_label, selftest};
use crate::report::chart::{self, Series};
use crate::report::{Cell, Check, ScenarioReport, Table};

/// A way of moving bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// TCP stream, 64 KiB per send (the baseline).
    Tcp,
    /// TCP stream with MSG_ZEROCOPY.
    TcpZc,
    /// One sendmsg per UDP datagram; one recvmsg per datagram.
    Udp,
    /// sendmmsg batches; recvmmsg batches.
    Sendmmsg,
    /// UDP GSO via a per-call UDP_SEGMENT cmsg; recvmmsg receiver.
    Gso,
    /// UDP GSO via the UDP_SEGMENT socket option.
    GsoSockopt,
    /// UDP GSO to a UDP_GRO receiver.
    GsoGro,
    /// UDP GSO with MSG_ZEROCOPY.
    GsoZc,
    /// UDP GSO paced at each of --rates.
    Paced,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Tcp => "tcp",
            Mode::TcpZc => "tcp-zc",
            Mode::Udp => "udp",
            Mode::Sendmmsg => "sendmmsg",
            Mode::Gso => "gso",
            Mode::GsoSockopt => "gso-sockopt",
            Mode::GsoGro => "gso-gro",
            Mode::GsoZc => "gso-zc",
            Mode::Paced => "paced",
        }
    }
}

/// Receiver checks on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum VerifyArg {
    /// Count only.
    Count,
    /// Sequence numbers: loss, duplicates, reordering.
    Header,
    /// Sequence numbers and every payload byte.
    Full,
}

impl From<VerifyArg> for Verify {
    fn from(v: VerifyArg) -> Self {
        match v {
            VerifyArg::Count => Verify::Count,
            VerifyArg::Header => Verify::Header,
            VerifyArg::Full => Verify::Full,
        }
    }
}

/// Options of `netlane bench udp-bulk`.
#[derive(Debug, Clone, Args)]
pub struct UdpBulkArgs {
    /// Network placement.
    #[command(flatten)]
    pub net: NetArgs,
    /// Modes to run, comma separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "tcp,tcp-zc,udp,sendmmsg,gso,gso-sockopt,gso-gro,gso-zc,paced"
    )]
    pub modes: Vec<Mode>,
    /// How long each run sends.
    #[arg(long, default_value = "2s", value_parser = parse_positive_duration)]
    pub duration: Duration,
    /// UDP payload bytes per datagram (the GSO segment size).
    #[arg(long, default_value_t = 1400)]
    pub gso_size: usize,
    /// Datagrams per GSO send or sendmmsg call [default: as many as fit 64 KB, at most 64].
    #[arg(long)]
    pub segments: Option<usize>,
    /// Target rates of the paced mode, comma separated (e.g. 10MB/s,1GB/s,200mbit).
    #[arg(long, value_delimiter = ',', default_value = "10MB/s,100MB/s,1GB/s", value_parser = parse_rate, allow_hyphen_values = true)]
    pub rates: Vec<u64>,
    /// Pacing release quantum: auto, or a duration such as 1ms.
    #[arg(long, default_value = "auto", value_parser = parse_quantum)]
    pub quantum: Quantum,
    /// What the receiver verifies.
    #[arg(long, value_enum, default_value_t = VerifyArg::Header)]
    pub verify: VerifyArg,
    /// The kernel's udpgso_bench_tx, to compare senders [default: target/kselftest/udpgso_bench_tx or $NETLANE_UDPGSO_BENCH_TX].
    #[arg(long)]
    pub selftest: Option<PathBuf>,
    /// Skip the comparison with udpgso_bench_tx.
    #[arg(long)]
    pub no_selftest: bool,
    /// Repetitions of the udpgso_bench_tx comparison, interleaved with alternating order
    /// (the best runs are compared).
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub repeat: u32,
    /// Write all results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the main table as CSV to this file.
    #[arg(long)]
    pub csv: Option<PathBuf>,
}

/// One planned run.
#[derive(Debug, Clone)]
struct Planned {
    label: String,
    mode: Option<Mode>,
    rate: Option<u64>,
    run: BulkRun,
}

/// Results as saved in JSON.
#[derive(Debug, Clone, Serialize)]
struct RunRecord {
    label: String,
    mode: Option<Mode>,
    rate: Option<u64>,
    result: BulkResult,
}

impl UdpBulkArgs {
    fn segments(&self) -> usize {
        self.segments.unwrap_or_else(|| GsoLimits::for_family(self.net.ipv6).segments_per_send(self.gso_size))
    }

    fn verify(&self) -> Verify {
        self.verify.into()
    }

    fn tx(&self) -> TxSpec {
        TxSpec {
            datagram_size: self.gso_size,
            segments_per_send: self.segments(),
            duration: self.duration,
            cpu: Some(self.net.tx_cpu),
            ..TxSpec::udp()
        }
    }

    fn rx(&self) -> RxSpec {
        RxSpec { verify: self.verify(), cpu: Some(self.net.rx_cpu()), ..RxSpec::udp() }
    }

    /// Specs for `mode` (and `rate` for the paced mode).
    fn specs(&self, mode: Mode, rate: Option<u64>) -> (TxSpec, RxSpec) {
        let (tx, rx) = (self.tx(), self.rx());
        let gso = TxSpec { gso: GsoMode::Cmsg, ..tx.clone() };
        match mode {
            Mode::Tcp => (TxSpec { transport: crate::engines::bulk::Transport::Tcp, ..tx }, tcp_rx(rx)),
            Mode::TcpZc => {
                (TxSpec { transport: crate::engines::bulk::Transport::Tcp, zerocopy: true, ..tx }, tcp_rx(rx))
            }
            Mode::Udp => (TxSpec { segments_per_send: 1, ..tx }, RxSpec { batching: RxBatching::Single, ..rx }),
            Mode::Sendmmsg => (TxSpec { batching: Batching::Mmsg, ..tx }, rx),
            Mode::Gso => (gso, rx),
            Mode::GsoSockopt => (TxSpec { gso: GsoMode::Sockopt, ..tx }, rx),
            Mode::GsoGro => (gso, RxSpec { gro: true, batching: RxBatching::Mmsg(8), ..rx }),
            Mode::GsoZc => (TxSpec { zerocopy: true, ..gso }, rx),
            Mode::Paced => (TxSpec { pacing: rate.map(|rate| Pacing { rate, quantum: self.quantum }), ..gso }, rx),
        }
    }

    fn planned(&self, mode: Mode, rate: Option<u64>, run_id: u32) -> Planned {
        let (tx, rx) = self.specs(mode, rate);
        let label = match rate {
            Some(r) => format!("paced {}", netlane::metrics::units::compact_rate(r)),
            None => mode.name().to_string(),
        };
        Planned {
            label,
            mode: Some(mode),
            rate,
            run: BulkRun { tx: self.net.sender(tx), rx, ipv6: self.net.ipv6, run_id },
        }
    }

    /// Checks options before anything is built.
    pub fn validate(&self) -> Result<()> {
        self.net.validate()?;
        if self.modes.is_empty() {
            bail!("no modes given");
        }
        let mtu = Some(self.net.path_mtu());
        for (i, mode) in self.modes.iter().enumerate() {
            let rates: Vec<Option<u64>> =
                if *mode == Mode::Paced { self.rates.iter().map(|r| Some(*r)).collect() } else { vec![None] };
            for rate in rates {
                self.planned(*mode, rate, i as u32).run.validate(mtu).map_err(|e| anyhow::anyhow!("{e}"))?;
            }
        }
        if self.modes.contains(&Mode::Paced) && self.rates.is_empty() {
            bail!("the paced mode needs at least one --rates value");
        }
        Ok(())
    }

    fn selftest_binary(&self) -> Option<PathBuf> {
        if self.no_selftest { None } else { selftest::locate(self.selftest.as_deref()) }
    }

    fn plan(&self) -> (Vec<Planned>, Vec<Planned>) {
        let mut main = Vec::new();
        let mut id = 1;
        for mode in &self.modes {
            if *mode == Mode::Paced {
                for r in &self.rates {
                    main.push(self.planned(*mode, Some(*r), id));
                    id += 1;
                }
            } else {
                main.push(self.planned(*mode, None, id));
                id += 1;
            }
        }
        let mut cmp = Vec::new();
        if let Some(bin) = self.selftest_binary() {
            let segs = self.segments();
            for round in 0..self.repeat {
                for gso in [false, true] {
                    let mode = if gso { Mode::Gso } else { Mode::Udp };
                    let mut ours = self.planned(mode, None, id);
                    ours.label = format!("netlane {}", mode.name());
                    // Both senders face the identical receiver: it only counts (the
                    // kernel's sender does not write netlane's header) and reads into
                    // datagram-sized buffers. How fast the receiver drains decides how
                    // often a sender blocks, so anything else would skew the CPU.
                    let (_, rx) = self.specs(mode, None);
                    let counting = RxSpec { verify: Verify::Count, max_datagram: self.gso_size, ..rx };
                    ours.run.rx = counting;
                    id += 1;
                    let ext =
                        selftest::sender(&bin, self.net.ipv6, self.duration, self.gso_size, segs, gso, self.net.tx_cpu);
                    let kernel = Planned {
                        label: format!("udpgso_bench_tx {}", if gso { "-S (gso)" } else { "(udp)" }),
                        mode: None,
                        rate: None,
                        run: BulkRun { tx: TxSource::External(ext), rx: counting, ipv6: self.net.ipv6, run_id: id },
                    };
                    id += 1;
                    // Counterbalanced (ABBA): which sender goes first alternates, because
                    // a run's position after the previous one measurably shifts its cost.
                    if round % 2 == 0 {
                        cmp.extend([ours, kernel]);
                    } else {
                        cmp.extend([kernel, ours]);
                    }
                }
            }
        }
        (main, cmp)
    }

    /// Number of runs this configuration makes (for progress bars).
    pub fn run_count(&self) -> usize {
        let (a, b) = self.plan();
        a.len() + b.len()
    }

    /// Runs every mode and builds the report.
    pub fn run(&self, progress: &dyn Progress) -> Result<ScenarioReport> {
        self.validate()?;
        let (main, cmp) = self.plan();
        let hosts = self.net.build("udp-bulk")?;
        progress.plan(main.len() + cmp.len());
        let mut records = Vec::new();
        for p in main.iter().chain(cmp.iter()) {
            progress.start(&p.label);
            let result = super::run_one(&hosts, &p.label, &p.run)?;
            progress.finish(&p.label, &super::summary_line(&result));
            records.push(RunRecord { label: p.label.clone(), mode: p.mode, rate: p.rate, result });
        }
        let (main_records, cmp_records) = records.split_at(main.len());
        Ok(self.report(main_records, cmp_records))
    }

    fn options(&self) -> Vec<(String, String)> {
        let mut o = Vec::new();
        o.push(("benchmark".into(), "udp-bulk".into()));
        self.net.echo(&mut o);
        o.push(("modes".into(), self.modes.iter().map(|m| m.name()).collect::<Vec<_>>().join(",")));
        o.push(("duration".into(), format_duration(self.duration)));
        o.push(("gso_size".into(), self.gso_size.to_string()));
        o.push(("segments".into(), self.segments().to_string()));
        o.push(("rates".into(), self.rates.iter().map(|r| Rate(*r as f64).to_string()).collect::<Vec<_>>().join(",")));
        o.push(("quantum".into(), quantum_label(self.quantum)));
        o.push(("verify".into(), format!("{:?}", self.verify).to_lowercase()));
        o.push(("rcvbuf".into(), RxSpec::udp().rcvbuf.to_string()));
        o.push(("selftest".into(), self.selftest_binary().map_or("none".into(), |p| p.display().to_string())));
        o.push(("repeat".into(), self.repeat.to_string()));
        o
    }

    fn report(&self, main: &[RunRecord], cmp: &[RunRecord]) -> ScenarioReport {
        let find = |m: Mode| main.iter().find(|r| r.mode == Some(m) && r.rate.is_none()).map(|r| &r.result);
        let mut table = Table {
            name: "udp-bulk".into(),
            title: "UDP bulk transfer, every mode side by side".into(),
            columns: [
                "mode",
                "tx MB/s",
                "rx MB/s",
                "rx kpps",
                "tx CPU s/GB",
                "rx CPU s/GB",
                "system CPU s/GB",
                "tx syscalls/dgram",
                "rx syscalls/dgram",
                "loss %",
                "zc completions",
                "zc copied %",
                "path",
            ]
            .map(String::from)
            .to_vec(),
            rows: Vec::new(),
        };
        for r in main {
            let x = &r.result;
            let zc = x.tx.zerocopy;
            table.rows.push(vec![
                Cell::text(&r.label),
                Cell::num(x.tx_rate / 1e6, 1),
                Cell::num(x.rx_rate / 1e6, 1),
                Cell::num(if x.rx.seconds > 0.0 { x.rx.datagrams as f64 / x.rx.seconds / 1e3 } else { f64::NAN }, 1),
                Cell::num(x.tx_cpu_per_gb, 3),
                Cell::num(x.rx_cpu_per_gb, 3),
                Cell::num(x.system_cpu_per_gb, 3),
                Cell::num(x.tx_syscalls_per_datagram, 4),
                Cell::num(x.rx_syscalls_per_datagram, 4),
                Cell::num(x.loss * 100.0, 2),
                zc.map_or(Cell::Empty, |z| Cell::text(format!("{}/{}", z.completed, z.sends))),
                zc.map_or(Cell::Empty, |z| Cell::num(z.copied_fraction() * 100.0, 1)),
                Cell::text(x.tx.path.join("; ")),
            ]);
        }
        let unpaced_gso = find(Mode::Gso);
        let paced: Vec<&RunRecord> = main.iter().filter(|r| r.rate.is_some()).collect();
        let mut pace_table = Table {
            name: "udp-bulk-pacing".into(),
            title: "Paced GSO: accuracy and cost".into(),
            columns: [
                "target",
                "quantum",
                "segments/release",
                "tx achieved",
                "accuracy %",
                "rx MB/s",
                "wake late p50 us",
                "wake late p99 us",
                "tx CPU s/GB",
                "vs unpaced GSO",
                "per-ms p99/mean",
                "loss %",
            ]
            .map(String::from)
            .to_vec(),
            rows: Vec::new(),
        };
        for r in &paced {
            let x = &r.result;
            let Some(p) = x.tx.pacing else { continue };
            let per_ms = x.rx.per_ms_bytes;
            pace_table.rows.push(vec![
                Cell::text(Rate(p.target_rate as f64).to_string()),
                Cell::text(format_duration(Duration::from_nanos(p.quantum_ns))),
                Cell::num(p.segments_per_release, 1),
                Cell::text(Rate(p.achieved_rate).to_string()),
                Cell::num(p.accuracy * 100.0, 2),
                Cell::num(x.rx_rate / 1e6, 1),
                Cell::num(p.lateness_ns.p50 as f64 / 1e3, 0),
                Cell::num(p.lateness_ns.p99 as f64 / 1e3, 0),
                Cell::num(x.tx_cpu_per_gb, 3),
                Cell::num(unpaced_gso.map_or(f64::NAN, |g| x.tx_cpu_per_gb / g.tx_cpu_per_gb), 2),
                Cell::num(if per_ms.mean > 0.0 { per_ms.p99 as f64 / per_ms.mean } else { f64::NAN }, 2),
                Cell::num(x.loss * 100.0, 2),
            ]);
        }

        // Comparison with the kernel's selftest sender: best of interleaved runs.
        let mut cmp_table = Table {
            name: "udp-bulk-selftest".into(),
            title: "netlane's sender vs the kernel's udpgso_bench_tx (interleaved runs in alternating order; medians, and the best run)".into(),
            columns: ["sender", "runs", "tx MB/s", "tx CPU s/GB", "best tx CPU s/GB", "tx syscalls/dgram", "rx MB/s", "loss %"]
                .map(String::from)
                .to_vec(),
            rows: Vec::new(),
        };
        let mut best_cpu = std::collections::BTreeMap::new();
        let mut labels: Vec<String> = Vec::new();
        for r in cmp {
            if !labels.contains(&r.label) {
                labels.push(r.label.clone());
            }
        }
        for label in &labels {
            let runs: Vec<&BulkResult> = cmp.iter().filter(|r| &r.label == label).map(|r| &r.result).collect();
            let m = |f: fn(&BulkResult) -> f64| median(runs.iter().map(|r| f(r)).collect());
            let cpu = m(|r| r.tx_cpu_per_gb);
            let best = runs
                .iter()
                .map(|r| r.tx_cpu_per_gb)
                .filter(|v| v.is_finite() && *v > 0.0)
                .fold(f64::INFINITY, f64::min);
            best_cpu.insert(label.clone(), best);
            cmp_table.rows.push(vec![
                Cell::text(label),
                Cell::num(runs.len() as f64, 0),
                Cell::num(m(|r| r.tx_rate) / 1e6, 1),
                Cell::num(cpu, 3),
                Cell::num(best, 3),
                Cell::num(m(|r| r.tx_syscalls_per_datagram), 4),
                Cell::num(m(|r| r.rx_rate) / 1e6, 1),
                Cell::num(m(|r| r.loss) * 100.0, 2),
            ]);
        }

        let checks = self.checks(main, &best_cpu);
        let mut notes = Vec::new();
        if let Some(p) = paced.first()
            && let Some(note) = p.result.tx.path.iter().find(|s| s.starts_with("txtime") || s.starts_with("pacing:"))
        {
            notes.push(format!("Pacing path: {note}."));
        }
        if let Some(z) = find(Mode::GsoZc).and_then(|r| r.tx.zerocopy) {
            notes.push(format!(
                "MSG_ZEROCOPY: {} of {} sends completed, {:.1}% reported as copied by the kernel.",
                z.completed,
                z.sends,
                z.copied_fraction() * 100.0
            ));
        }
        if let (Some(g), Some(gg)) = (find(Mode::Gso), find(Mode::GsoGro))
            && g.loss > 0.05
        {
            notes.push(format!(
                "Without GRO the receiver could not keep up with the GSO sender ({:.0}% loss); with UDP_GRO it lost {:.2}%: \
                 the receive side needs the same batching the send side has.",
                g.loss * 100.0,
                gg.loss * 100.0
            ));
        }
        if self.selftest_binary().is_none() && !self.no_selftest {
            notes.push(
                "udpgso_bench_tx was not found, so the comparison with the kernel's sender did not run: build it with \
                 scripts/build-selftests.sh (make lab does), or pass --selftest PATH."
                    .into(),
            );
        }

        let mut charts = Vec::new();
        let cats: Vec<String> = main.iter().map(|r| r.label.clone()).collect();
        charts.push(chart::bars(
            "udp-bulk-throughput",
            "Throughput per mode",
            "MB/s (log)",
            &cats,
            &[
                Series::new("sender", main.iter().map(|r| r.result.tx_rate / 1e6).collect()),
                Series::new("receiver", main.iter().map(|r| r.result.rx_rate / 1e6).collect()),
            ],
            true,
        ));
        charts.push(chart::bars(
            "udp-bulk-cpu",
            "CPU seconds per GB",
            "CPU s/GB (log)",
            &cats,
            &[
                Series::new("sender", main.iter().map(|r| r.result.tx_cpu_per_gb).collect()),
                Series::new("receiver", main.iter().map(|r| r.result.rx_cpu_per_gb).collect()),
                Series::new("whole machine", main.iter().map(|r| r.result.system_cpu_per_gb).collect()),
            ],
            true,
        ));
        charts.push(chart::bars(
            "udp-bulk-syscalls",
            "System calls per datagram",
            "calls (log)",
            &cats,
            &[
                Series::new("sender", main.iter().map(|r| r.result.tx_syscalls_per_datagram).collect()),
                Series::new("receiver", main.iter().map(|r| r.result.rx_syscalls_per_datagram).collect()),
            ],
            true,
        ));

        let raw = serde_json::json!({
            "runs": main.iter().map(|r| serde_json::to_value(r).unwrap_or_default()).collect::<Vec<_>>(),
            "selftest_runs": cmp.iter().map(|r| serde_json::to_value(r).unwrap_or_default()).collect::<Vec<_>>(),
        });
        let mut tables = vec![table];
        if !pace_table.rows.is_empty() {
            tables.push(pace_table);
        }
        if !cmp_table.rows.is_empty() {
            tables.push(cmp_table);
        }
        ScenarioReport {
            name: "udp-bulk".into(),
            title: "UDP content delivery: GSO, GRO, zerocopy, pacing".into(),
            description: "A sender and a receiver in two namespaces joined by veth move data for a fixed time in each \
                mode: TCP (the baseline), plain UDP, sendmmsg, UDP GSO (cmsg and socket option), GSO to a UDP_GRO \
                receiver, GSO with MSG_ZEROCOPY, and GSO paced at several rates. CPU is measured per thread \
                (sender, receiver) and for the whole machine from /proc/stat, as seconds per GB moved. The kernel's \
                own selftest sender runs against the same receiver for comparison."
                .into(),
            options: self.options(),
            tables,
            charts,
            checks,
            notes,
            raw,
        }
    }

    fn checks(&self, main: &[RunRecord], selftest: &std::collections::BTreeMap<String, f64>) -> Vec<Check> {
        let find = |m: Mode| main.iter().find(|r| r.mode == Some(m) && r.rate.is_none()).map(|r| &r.result);
        let mut c = Vec::new();
        let (udp, gso, tcp, gro, mmsg) =
            (find(Mode::Udp), find(Mode::Gso), find(Mode::Tcp), find(Mode::GsoGro), find(Mode::Sendmmsg));
        let missing = |what: &str| format!("not run (needs the {what} mode)");
        match (gso, udp) {
            (Some(g), Some(u)) => {
                let ratio = g.tx_cpu_per_gb / u.tx_cpu_per_gb;
                c.push(Check::new(
                    "GSO sender CPU vs plain sendmsg",
                    "<= 0.25 x",
                    format!("{ratio:.3} x ({:.3} vs {:.3} s/GB)", g.tx_cpu_per_gb, u.tx_cpu_per_gb),
                    ratio <= 0.25,
                ));
            }
            _ => c.push(Check::skipped("GSO sender CPU vs plain sendmsg", "<= 0.25 x", missing("gso and udp"))),
        }
        match (gso, tcp) {
            (Some(g), Some(t)) => {
                let ratio = g.tx_cpu_per_gb / t.tx_cpu_per_gb;
                c.push(Check::new(
                    "GSO sender CPU vs TCP stream",
                    "<= 1.5 x",
                    format!("{ratio:.3} x ({:.3} vs {:.3} s/GB)", g.tx_cpu_per_gb, t.tx_cpu_per_gb),
                    ratio <= 1.5,
                ));
            }
            _ => c.push(Check::skipped("GSO sender CPU vs TCP stream", "<= 1.5 x", missing("gso and tcp"))),
        }
        match (gro, udp) {
            (Some(g), Some(u)) => {
                let ratio = g.rx_rate / u.rx_rate;
                c.push(Check::new(
                    "GSO+GRO receiver throughput vs plain UDP",
                    ">= 4 x",
                    format!("{ratio:.1} x ({} vs {})", Rate(g.rx_rate), Rate(u.rx_rate)),
                    ratio >= 4.0,
                ));
            }
            _ => {
                c.push(Check::skipped("GSO+GRO receiver throughput vs plain UDP", ">= 4 x", missing("gso-gro and udp")))
            }
        }
        let batch = self.segments();
        match mmsg {
            Some(m) => {
                let want = 1.0 / batch as f64;
                let got = m.tx_syscalls_per_datagram;
                c.push(Check::new(
                    "sendmmsg system calls per datagram",
                    format!("= 1/{batch} ({want:.4})"),
                    format!("{got:.4}"),
                    (got / want - 1.0).abs() < 0.01,
                ));
            }
            None => c.push(Check::skipped(
                "sendmmsg system calls per datagram",
                format!("= 1/{batch}"),
                missing("sendmmsg"),
            )),
        }
        for r in main.iter().filter(|r| r.rate.is_some()) {
            let x = &r.result;
            let Some(p) = x.tx.pacing else { continue };
            let rate = Rate(p.target_rate as f64);
            c.push(Check::new(
                format!("paced {rate}: achieved rate"),
                "within 2% of target",
                format!("{:.2}% of target", p.accuracy * 100.0),
                (p.accuracy - 1.0).abs() <= 0.02,
            ));
            match gso {
                Some(g) => {
                    let ratio = x.tx_cpu_per_gb / g.tx_cpu_per_gb;
                    c.push(Check::new(
                        format!("paced {rate}: sender CPU vs unpaced GSO"),
                        "<= 1.3 x",
                        format!("{ratio:.2} x ({:.3} vs {:.3} s/GB)", x.tx_cpu_per_gb, g.tx_cpu_per_gb),
                        ratio <= 1.3,
                    ));
                }
                None => c.push(Check::skipped(
                    format!("paced {rate}: sender CPU vs unpaced GSO"),
                    "<= 1.3 x",
                    missing("gso"),
                )),
            }
        }
        for (ours, kernel, what) in
            [("netlane udp", "udpgso_bench_tx (udp)", "plain"), ("netlane gso", "udpgso_bench_tx -S (gso)", "GSO")]
        {
            let name = format!("{what} sender vs the kernel's udpgso_bench_tx");
            let target = "netlane's CPU per GB <= the kernel sender's (best of the interleaved runs: interference only adds cost)";
            match (selftest.get(ours), selftest.get(kernel)) {
                (Some(a), Some(b)) => {
                    let ratio = a / b;
                    c.push(Check::new(name, target, format!("{ratio:.3} x ({a:.3} vs {b:.3} s/GB)"), ratio <= 1.0));
                }
                _ => c.push(Check::skipped(name, target, "udpgso_bench_tx not run")),
            }
        }
        c
    }
}

/// A TCP receiver with the placement and checks of `rx`.
fn tcp_rx(rx: RxSpec) -> RxSpec {
    RxSpec { transport: crate::engines::bulk::Transport::Tcp, ..rx }
}

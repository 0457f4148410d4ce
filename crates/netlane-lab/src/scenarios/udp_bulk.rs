//! `udp-bulk`: UDP bulk transfer in every mode, side by side with TCP and with the
//! kernel's own selftest sender, over veth between namespaces (or loopback).
//!
//! Every mode (and each paced rate, and each side of the comparison with
//! `udpgso_bench_tx`) is an arm; `--repeat` rounds run every arm once, in a rotating
//! order. Checks compare two arms round by round; the tables show medians of the
//! rounds, measured at the receiver where it counts (bytes that arrived, the rate they
//! arrived at).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, bail};
use clap::{ArgAction, Args, ValueEnum};
use netlane::metrics::units::compact_rate;
use netlane::pace::Quantum;
use netlane::udp::gso::GsoLimits;
use netlane::udp::{Batching, GsoMode, RxBatching};

use super::net::{NetArgs, run_one, summary_line};
use super::{Scenario, from_words, selftest};
use crate::engines::bulk::{BulkResult, BulkRun, Pacing, RxSpec, Transport, TxSource, TxSpec, Verify};
use crate::progress::Progress;
use crate::runner::{Measured, Runner};
use crate::stats::{self, Spread, median, repeat_flags, sig};
use crate::verdict::{Measure, Spec, paired, positive};
use netlane_report::options::{OptionList, parse_positive_duration, parse_quantum, parse_rate, quantum_name};
use netlane_report::{
    Axis, Chart, ChartKind, Column, Flag, FlagKind, Point, Row, RunRecord, Scale, ScenarioReport, Series, Table, Unit,
    Value, format,
};

/// A way of moving bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum)]
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
    /// UDP GSO paced at each of --rates, to a UDP_GRO receiver.
    Paced,
}

impl Mode {
    /// The word the command line takes.
    pub fn name(self) -> String {
        crate::scenarios::value_name(&self)
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

impl VerifyArg {
    fn name(self) -> String {
        crate::scenarios::value_name(&self)
    }
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

/// Options of the `udp-bulk` scenario.
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
    #[arg(short = 't', long, alias = "duration", default_value = "2s", value_parser = parse_positive_duration)]
    pub time: Duration,
    /// Rounds: every mode runs once per round, in a rotating order; checks pair the
    /// modes they compare within each round.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub repeat: u32,
    /// UDP payload bytes per datagram (the GSO segment size).
    #[arg(long, default_value_t = 1400)]
    pub gso_size: usize,
    /// Datagrams per GSO send or sendmmsg call [default: as many as fit 64 KB, at most 64].
    #[arg(long)]
    pub segments: Option<usize>,
    /// Target rates of the paced mode, comma separated (e.g. 10MB/s,1GB/s,200mbit).
    #[arg(long, value_delimiter = ',', default_value = "10MB/s,100MB/s,1GB/s", value_parser = parse_rate, allow_hyphen_values = true)]
    pub rates: Vec<u64>,
    /// Pacing release quantum: auto, or a duration such as 1ms (at most a tenth of --time).
    #[arg(long, default_value = "auto", value_parser = parse_quantum)]
    pub quantum: Quantum,
    /// What the receiver verifies.
    #[arg(long, value_enum, default_value_t = VerifyArg::Header)]
    pub verify: VerifyArg,
    /// The kernel's udpgso_bench_tx, to compare senders [default: target/kselftest/udpgso_bench_tx or $NETLANE_UDPGSO_BENCH_TX].
    #[arg(long)]
    pub selftest: Option<PathBuf>,
    /// Skip the comparison with udpgso_bench_tx.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set)]
    pub no_selftest: bool,
}

/// Which side of what an arm is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// A mode of the main table.
    Main(Mode, Option<u64>),
    /// netlane's sender against a counting receiver (compared with the kernel's).
    Ours(bool),
    /// The kernel's udpgso_bench_tx (plain, or with -S).
    Kernel(bool),
}

/// One arm: a labelled run that every round repeats.
#[derive(Debug, Clone)]
struct Arm {
    label: String,
    role: Role,
    run: BulkRun,
}

impl UdpBulkArgs {
    /// The defaults, as `netlane bench udp-bulk` has them.
    pub fn defaults() -> UdpBulkArgs {
        from_words(&[]).expect("the defaults parse")
    }

    fn segments(&self) -> usize {
        self.segments.unwrap_or_else(|| GsoLimits::for_family(self.net.ipv6).segments_per_send(self.gso_size))
    }

    fn tx(&self) -> TxSpec {
        TxSpec {
            datagram_size: self.gso_size,
            segments_per_send: self.segments(),
            duration: self.time,
            cpu: Some(self.net.tx_cpu),
            ..TxSpec::udp()
        }
    }

    fn rx(&self) -> RxSpec {
        RxSpec { verify: self.verify.into(), cpu: Some(self.net.rx_cpu()), ..RxSpec::udp() }
    }

    /// Sender and receiver for `mode` (and `rate` for the paced mode).
    fn specs(&self, mode: Mode, rate: Option<u64>) -> (TxSpec, RxSpec) {
        let (tx, rx) = (self.tx(), self.rx());
        let gso = TxSpec { gso: GsoMode::Cmsg, ..tx.clone() };
        let tcp_rx = RxSpec { transport: Transport::Tcp, ..rx };
        match mode {
            Mode::Tcp => (TxSpec { transport: Transport::Tcp, ..tx }, tcp_rx),
            Mode::TcpZc => (TxSpec { transport: Transport::Tcp, zerocopy: true, ..tx }, tcp_rx),
            Mode::Udp => (TxSpec { segments_per_send: 1, ..tx }, RxSpec { batching: RxBatching::Single, ..rx }),
            Mode::Sendmmsg => (TxSpec { batching: Batching::Mmsg, ..tx }, rx),
            Mode::Gso => (gso, rx),
            Mode::GsoSockopt => (TxSpec { gso: GsoMode::Sockopt, ..tx }, rx),
            Mode::GsoGro => (gso, RxSpec { gro: true, batching: RxBatching::Mmsg(8), ..rx }),
            Mode::GsoZc => (TxSpec { zerocopy: true, ..gso }, rx),
            // Paced runs deliver to a GRO receiver: the receiver-side rate then measures
            // the pacer, not a receiver that cannot take 1 GB/s without GRO.
            Mode::Paced => (
                TxSpec { pacing: rate.map(|rate| Pacing { rate, quantum: self.quantum }), ..gso },
                RxSpec { gro: true, batching: RxBatching::Mmsg(8), ..rx },
            ),
        }
    }

    fn arm(&self, mode: Mode, rate: Option<u64>) -> Arm {
        let (tx, rx) = self.specs(mode, rate);
        let label = match rate {
            Some(r) => format!("paced {}", compact_rate(r)),
            None => mode.name().to_string(),
        };
        Arm {
            label,
            role: Role::Main(mode, rate),
            run: BulkRun { tx: self.net.sender(tx), rx, ipv6: self.net.ipv6, run_id: 0 },
        }
    }

    fn selftest_binary(&self) -> Option<PathBuf> {
        if self.no_selftest { None } else { selftest::locate(self.selftest.as_deref()) }
    }

    /// Every arm: the modes, then the two sides of the comparison with the kernel's sender.
    fn arms(&self) -> Vec<Arm> {
        let mut arms = Vec::new();
        for mode in &self.modes {
            if *mode == Mode::Paced {
                arms.extend(self.rates.iter().map(|r| self.arm(*mode, Some(*r))));
            } else {
                arms.push(self.arm(*mode, None));
            }
        }
        if let Some(bin) = self.selftest_binary() {
            for gso in [false, true] {
                let mode = if gso { Mode::Gso } else { Mode::Udp };
                // Both senders face the identical receiver: it only counts (the kernel's
                // sender does not write netlane's header) and reads into datagram-sized
                // buffers. How fast the receiver drains decides how often a sender
                // blocks, so anything else would skew the CPU.
                let (_, rx) = self.specs(mode, None);
                let counting = RxSpec { verify: Verify::Count, max_datagram: self.gso_size, ..rx };
                let mut ours = self.arm(mode, None);
                ours.label = format!("netlane {}", mode.name());
                ours.role = Role::Ours(gso);
                ours.run.rx = counting;
                arms.push(ours);
                let ext = selftest::sender(
                    &bin,
                    self.net.ipv6,
                    self.time,
                    self.gso_size,
                    self.segments(),
                    gso,
                    self.net.tx_cpu,
                );
                arms.push(Arm {
                    label: format!("udpgso_bench_tx{}", if gso { " -S" } else { "" }),
                    role: Role::Kernel(gso),
                    run: BulkRun { tx: TxSource::External(ext), rx: counting, ipv6: self.net.ipv6, run_id: 0 },
                });
            }
        }
        arms
    }
}

impl Scenario for UdpBulkArgs {
    fn name(&self) -> &'static str {
        "udp-bulk"
    }

    fn options(&self) -> OptionList {
        let modes: Vec<String> = self.modes.iter().map(|m| m.name()).collect();
        let o = self
            .net
            .options()
            .words("modes", &modes)
            .duration("time", self.time)
            .int("repeat", u64::from(self.repeat))
            .int("gso-size", self.gso_size as u64)
            .int("segments", self.segments() as u64)
            .rates("rates", &self.rates)
            .text("quantum", quantum_name(self.quantum))
            .text("verify", self.verify.name())
            .flag("no-selftest", self.no_selftest);
        match self.selftest_binary() {
            Some(p) => o.text("selftest", p.display().to_string()),
            None => o,
        }
    }

    fn validate(&self) -> Result<()> {
        self.net.validate()?;
        if self.modes.is_empty() {
            bail!("--modes: no modes given");
        }
        if let Some(dup) = self.modes.iter().enumerate().find(|(i, m)| self.modes[..*i].contains(m)) {
            bail!("--modes: {} is listed twice", dup.1.name());
        }
        if self.modes.contains(&Mode::Paced) && self.rates.is_empty() {
            bail!("the paced mode needs at least one --rates value");
        }
        let mtu = Some(self.net.path_mtu());
        for arm in self.arms() {
            arm.run.validate(mtu).map_err(|e| anyhow::Error::new(e).context(arm.label.clone()))?;
        }
        Ok(())
    }

    fn runs(&self) -> usize {
        self.arms().len() * self.repeat as usize
    }

    fn run(&self, progress: &dyn Progress) -> Result<ScenarioReport> {
        self.validate()?;
        let arms = self.arms();
        let hosts = self.net.build("udp-bulk")?;
        let mut runner = Runner::new(progress);
        let results = runner.rounds(
            arms.len(),
            |_| self.repeat,
            |runner, a, turn| {
                let arm = &arms[a];
                let run = BulkRun { run_id: runner.next_index(), ..arm.run.clone() };
                runner.measure(turn, &arm.label, |label| run_one(&hosts, label, &run))
            },
        )?;
        let records = runner.into_records();
        Ok(self.report(&arms, &results, records))
    }
}

impl Measured for BulkResult {
    fn summary(&self) -> String {
        summary_line(self)
    }

    fn figures(&self) -> Vec<(&'static str, Option<f64>)> {
        vec![
            ("tx_mb_per_s", self.tx_rate().ok().map(|v| v / 1e6)),
            ("rx_mb_per_s", self.rx_rate().ok().map(|v| v / 1e6)),
            ("rx_kpps", self.rx_pps().ok().map(|v| v / 1e3)),
            ("tx_cpu_s_per_gb", self.tx_cpu_s_per_gb().ok()),
            ("tx_cpu_s_per_gb_delivered", self.tx_cpu_s_per_gb_delivered().ok()),
            ("rx_cpu_s_per_gb", self.rx_cpu_s_per_gb().ok()),
            ("system_cpu_s_per_gb", self.system_cpu_s_per_gb().ok()),
            ("tx_calls_per_datagram", self.tx_calls_per_datagram().ok()),
            ("rx_calls_per_datagram", self.rx_calls_per_datagram().ok()),
            ("loss_pct", self.loss().ok().map(|l| l * 100.0)),
            ("pacing_accuracy_rx_pct", self.rx_pacing_accuracy().and_then(Result::ok).map(|a| a * 100.0)),
        ]
    }

    fn path(&self) -> Vec<String> {
        self.tx.path.clone()
    }
}

/// `f` of a run, or why the run cannot be used (it is impossible).
fn usable(r: &BulkResult, f: &dyn Fn(&BulkResult) -> Measure) -> Measure {
    match r.impossible() {
        Some(why) => Err(why),
        None => f(r),
    }
}

/// Median over the usable runs.
fn med(rs: &[BulkResult], f: impl Fn(&BulkResult) -> Measure) -> Value {
    stats::med(rs, |r| usable(r, &f))
}

fn values(rs: &[BulkResult], f: impl Fn(&BulkResult) -> Measure) -> Vec<f64> {
    stats::values(rs, |r| usable(r, &f))
}

impl UdpBulkArgs {
    fn report(&self, arms: &[Arm], results: &[Vec<BulkResult>], runs: Vec<RunRecord>) -> ScenarioReport {
        let main: Vec<usize> = (0..arms.len()).filter(|i| matches!(arms[*i].role, Role::Main(..))).collect();
        let find = |role: Role| arms.iter().position(|a| a.role == role).map(|i| &results[i][..]);
        let mode = |m: Mode| find(Role::Main(m, None));
        let mut flags = Vec::new();

        // Impossible runs, lossy modes, collapsed and noisy repeats.
        for (a, rs) in arms.iter().zip(results) {
            for (round, r) in rs.iter().enumerate() {
                if let Some(why) = r.impossible() {
                    flags.push(Flag {
                        kind: FlagKind::Impossible,
                        subject: a.label.clone(),
                        message: format!("round {}: {why}; the run is left out of the tables and checks", round + 1),
                    });
                }
            }
            flags.extend(repeat_flags(&a.label, "receiver MB/s", &values(rs, |r| r.rx_rate().map(|v| v / 1e6))));
            let loss = values(rs, BulkResult::loss);
            if !loss.is_empty() && median(loss.clone()) > 0.5 {
                flags.push(Flag {
                    kind: FlagKind::Lossy,
                    subject: a.label.clone(),
                    message: format!(
                        "lost {:.0}% of what it sent: its sender CPU per GB sent ({} s/GB) understates the cost per GB \
                         delivered ({} s/GB)",
                        median(loss) * 100.0,
                        format::cell(&med(rs, BulkResult::tx_cpu_s_per_gb), 3),
                        format::cell(&med(rs, BulkResult::tx_cpu_s_per_gb_delivered), 3)
                    ),
                });
            }
        }

        let mut table = Table::new(
            "udp-bulk",
            format!("Every mode, medians of {} rounds", self.repeat),
            vec![
                Column::new("mode", "mode", 0),
                Column::new("tx_mb_per_s", "tx MB/s", 1),
                Column::new("rx_mb_per_s", "rx MB/s", 1),
                Column::new("rx_kpps", "rx kpps", 1),
                Column::new("tx_cpu_s_per_gb", "tx CPU s/GB sent", 3),
                Column::new("tx_cpu_s_per_gb_delivered", "tx CPU s/GB delivered", 3),
                Column::new("rx_cpu_s_per_gb", "rx CPU s/GB", 3),
                Column::new("system_cpu_s_per_gb", "machine CPU s/GB", 3),
                Column::new("tx_calls_per_datagram", "tx calls/dgram (own count)", 4),
                Column::new("rx_calls_per_datagram", "rx calls/dgram (own count)", 4),
                Column::new("loss_pct", "loss %", 2),
                Column::new("zc_copied_pct", "zc copied %", 1),
                Column::new("spread_pct", "spread %", 0),
            ],
        );
        for &i in &main {
            let rs = &results[i];
            let zc = rs
                .iter()
                .filter_map(|r| r.tx.zerocopy)
                .fold((0u64, 0u64, 0u64), |acc, z| (acc.0 + z.sends, acc.1 + z.completed, acc.2 + z.copied));
            let mut note = rs.first().map(|r| format!("path: {}", r.tx.path.join("; ")));
            if zc.0 > 0
                && let Some(n) = note.as_mut()
            {
                n.push_str(&format!("; zerocopy: {} of {} sends completed, {} copied", zc.1, zc.0, zc.2));
            }
            let spread = Spread::of(&values(rs, BulkResult::tx_cpu_s_per_gb)).and_then(|s| s.relative());
            table.push(Row {
                cells: vec![
                    Value::text(&arms[i].label),
                    med(rs, |r| r.tx_rate().map(|v| v / 1e6)),
                    med(rs, |r| r.rx_rate().map(|v| v / 1e6)),
                    med(rs, |r| r.rx_pps().map(|v| v / 1e3)),
                    med(rs, BulkResult::tx_cpu_s_per_gb),
                    med(rs, BulkResult::tx_cpu_s_per_gb_delivered),
                    med(rs, BulkResult::rx_cpu_s_per_gb),
                    med(rs, BulkResult::system_cpu_s_per_gb),
                    med(rs, BulkResult::tx_calls_per_datagram),
                    med(rs, BulkResult::rx_calls_per_datagram),
                    med(rs, |r| r.loss().map(|l| l * 100.0)),
                    if zc.1 > 0 { Value::num(100.0 * zc.2 as f64 / zc.1 as f64) } else { Value::Missing },
                    Value::opt(spread.map(|s| s * 100.0)),
                ],
                footnote: note,
            });
        }
        let mut tables = vec![table];

        let gso = mode(Mode::Gso);
        let paced: Vec<usize> =
            (0..arms.len()).filter(|i| matches!(arms[*i].role, Role::Main(Mode::Paced, Some(_)))).collect();
        if !paced.is_empty() {
            let mut t = Table::new(
                "udp-bulk-pacing",
                "Paced GSO: the rate at the receiver, and what pacing costs the sender",
                vec![
                    Column::new("target", "target", 0),
                    Column::new("quantum", "quantum", 0),
                    Column::new("segments_per_release", "segments/release", 1),
                    Column::new("rx_accuracy_pct", "rx rate % of target", 2),
                    Column::new("tx_schedule_accuracy_pct", "tx schedule % of target", 2),
                    Column::new("rx_mb_per_s", "rx MB/s", 2),
                    Column::new("wake_late_p50_us", "wake late p50 us", 0),
                    Column::new("wake_late_p99_us", "wake late p99 us", 0),
                    Column::new("tx_cpu_s_per_gb", "tx CPU s/GB", 3),
                    Column::new("tx_cpu_vs_gso", "tx CPU x unpaced GSO", 2),
                    Column::new("per_ms_p99_over_mean", "per-ms p99/mean", 2),
                    Column::new("loss_pct", "loss %", 2),
                ],
            );
            for &i in &paced {
                let rs = &results[i];
                let Role::Main(_, Some(rate)) = arms[i].role else { continue };
                let p = rs.iter().find_map(|r| r.tx.pacing);
                let vs_gso = gso.map(|g| paired(rs, g, |r| usable(r, &BulkResult::tx_cpu_s_per_gb)));
                let vs: Vec<f64> = vs_gso.into_iter().flatten().filter_map(Result::ok).collect();
                t.push(Row::new(vec![
                    Value::text(compact_rate(rate)),
                    p.map_or(Value::Missing, |p| Value::text(format::seconds(p.quantum_ns as f64 / 1e9))),
                    p.map_or(Value::Missing, |p| Value::num(p.segments_per_release)),
                    med(rs, |r| r.rx_pacing_accuracy().unwrap_or(Err("not paced".into())).map(|a| a * 100.0)),
                    med(rs, |r| r.tx.pacing.map_or(Err("not paced".into()), |p| Ok(p.accuracy * 100.0))),
                    med(rs, |r| r.rx_rate().map(|v| v / 1e6)),
                    med(rs, |r| r.tx.pacing.map_or(Err("not paced".into()), |p| Ok(p.lateness_ns.p50 as f64 / 1e3))),
                    med(rs, |r| r.tx.pacing.map_or(Err("not paced".into()), |p| Ok(p.lateness_ns.p99 as f64 / 1e3))),
                    med(rs, BulkResult::tx_cpu_s_per_gb),
                    if vs.is_empty() { Value::Missing } else { Value::num(median(vs)) },
                    med(rs, |r| {
                        let m = r.rx.per_ms_bytes;
                        positive(m.mean, "mean bytes per ms").map(|mean| m.p99 as f64 / mean)
                    }),
                    med(rs, |r| r.loss().map(|l| l * 100.0)),
                ]));
            }
            tables.push(t);
        }

        let kernel: Vec<usize> =
            (0..arms.len()).filter(|i| matches!(arms[*i].role, Role::Ours(_) | Role::Kernel(_))).collect();
        if !kernel.is_empty() {
            let mut t = Table::new(
                "udp-bulk-selftest",
                "netlane's sender vs the kernel's udpgso_bench_tx, against the same counting receiver",
                vec![
                    Column::new("sender", "sender", 0),
                    Column::new("runs", "runs", 0),
                    Column::new("tx_mb_per_s", "tx MB/s", 1),
                    Column::new("tx_cpu_s_per_gb", "tx CPU s/GB", 3),
                    Column::new("spread_pct", "spread %", 0),
                    Column::new("tx_calls_per_datagram", "tx calls/dgram (own count)", 4),
                    Column::new("rx_mb_per_s", "rx MB/s", 1),
                    Column::new("loss_pct", "loss %", 2),
                ],
            );
            for &i in &kernel {
                let rs = &results[i];
                let spread = Spread::of(&values(rs, BulkResult::tx_cpu_s_per_gb)).and_then(|s| s.relative());
                t.push(Row::new(vec![
                    Value::text(&arms[i].label),
                    Value::Int(rs.len() as u64),
                    med(rs, |r| r.tx_rate().map(|v| v / 1e6)),
                    med(rs, BulkResult::tx_cpu_s_per_gb),
                    Value::opt(spread.map(|s| s * 100.0)),
                    med(rs, BulkResult::tx_calls_per_datagram),
                    med(rs, |r| r.rx_rate().map(|v| v / 1e6)),
                    med(rs, |r| r.loss().map(|l| l * 100.0)),
                ]));
            }
            tables.push(t);
        }

        let checks = self.checks(arms, results);
        let mut notes = Vec::new();
        if let Some(m) = mode(Mode::Sendmmsg)
            && let Value::Num(calls) = med(m, BulkResult::tx_calls_per_datagram)
        {
            notes.push(format!(
                "sendmmsg made {calls:.4} send calls per datagram (1/{} = {:.4} by construction). Calls per datagram \
                 are the program's own counts, not the kernel's.",
                self.segments(),
                1.0 / self.segments() as f64
            ));
        }
        if let Some(p) = paced.first().and_then(|i| results[*i].first())
            && let Some(path) = p.tx.path.iter().find(|s| s.starts_with("txtime") || s.starts_with("pacing:"))
        {
            notes.push(format!("Pacing path: {path}."));
        }
        if self.selftest_binary().is_none() && !self.no_selftest {
            notes.push(
                "udpgso_bench_tx was not found, so the comparison with the kernel's sender did not run: build it with \
                 scripts/build-selftests.sh (make lab does), or pass --selftest PATH."
                    .into(),
            );
        }

        let cats: Vec<String> = main.iter().map(|i| arms[*i].label.clone()).collect();
        let series = |name: &str, f: &dyn Fn(&BulkResult) -> Measure| Series {
            name: name.into(),
            points: main
                .iter()
                .enumerate()
                .filter_map(|(x, i)| Point::of(x as f64, &values(&results[*i], f)))
                .collect(),
        };
        let charts = vec![
            Chart {
                name: "udp-bulk-throughput".into(),
                title: "Throughput per mode (median of the rounds, bars show their range)".into(),
                kind: ChartKind::Dots,
                x: Axis::categories("mode", cats.clone()),
                y: Axis::numeric("payload rate", Unit::BytesPerSecond, Scale::Log),
                series: vec![series("sender", &BulkResult::tx_rate), series("receiver", &BulkResult::rx_rate)],
            },
            Chart {
                name: "udp-bulk-cpu".into(),
                title: "CPU seconds per GB".into(),
                kind: ChartKind::Dots,
                x: Axis::categories("mode", cats),
                y: Axis::numeric("CPU", Unit::Count("s/GB".into()), Scale::Log),
                series: vec![
                    series("sender, per GB sent", &BulkResult::tx_cpu_s_per_gb),
                    series("sender, per GB delivered", &BulkResult::tx_cpu_s_per_gb_delivered),
                    series("receiver", &BulkResult::rx_cpu_s_per_gb),
                    series("whole machine", &BulkResult::system_cpu_s_per_gb),
                ],
            },
        ];

        let gso_cpu = checks.iter().find(|c| c.id == "udp-bulk.gso-cpu-vs-udp").and_then(|c| c.measured.as_ref());
        let gro = checks.iter().find(|c| c.id == "udp-bulk.gro-rx-vs-udp").and_then(|c| c.measured.as_ref());
        let headline = match (gso_cpu, gro) {
            (Some(a), Some(b)) => format!(
                "A GSO sender used {}x the CPU per GB of one sendmsg per datagram; a GRO receiver took in {}x plain UDP's rate.",
                sig(a.median),
                sig(b.median)
            ),
            _ => format!("{} modes, {} rounds.", main.len(), self.repeat),
        };
        let options = self.options();
        ScenarioReport {
            name: "udp-bulk".into(),
            title: "UDP content delivery: GSO, GRO, zerocopy, pacing".into(),
            description: "A sender and a receiver in two namespaces joined by veth move data for a fixed time in each \
                mode: TCP (the baseline), plain UDP, sendmmsg, UDP GSO (cmsg and socket option), GSO to a UDP_GRO \
                receiver, GSO with MSG_ZEROCOPY, and GSO paced at several rates. CPU is measured per thread (sender, \
                receiver) and for the whole machine from /proc/stat, as seconds per GB: per GB sent and per GB \
                delivered for the sender. Rates are measured at both ends. The kernel's own selftest sender runs \
                against the same counting receiver in the same rounds."
                .into(),
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

    fn checks(&self, arms: &[Arm], results: &[Vec<BulkResult>]) -> Vec<netlane_report::Check> {
        let find = |role: Role| arms.iter().position(|a| a.role == role).map(|i| &results[i][..]);
        let mode = |m: Mode| find(Role::Main(m, None));
        let missing = |what: &str| format!("not run (needs the {what} modes)");
        let pair = |spec: Spec,
                    a: Option<&[BulkResult]>,
                    b: Option<&[BulkResult]>,
                    f: &dyn Fn(&BulkResult) -> Measure,
                    how: &str,
                    needs: &str| {
            match (a, b) {
                (Some(a), Some(b)) => spec.evaluate(paired(a, b, |r| usable(r, f)), how),
                _ => spec.skipped(missing(needs)),
            }
        };
        let mut c = vec![
            pair(
                Spec::at_most(
                    "udp-bulk.gso-cpu-vs-udp",
                    "GSO sender CPU per GB vs one sendmsg per datagram",
                    0.25,
                    "x",
                ),
                mode(Mode::Gso),
                mode(Mode::Udp),
                &BulkResult::tx_cpu_s_per_gb,
                "gso / udp sender CPU s/GB sent, per round",
                "gso and udp",
            ),
            pair(
                Spec::at_most("udp-bulk.gso-cpu-vs-tcp", "GSO sender CPU per GB vs a TCP stream", 1.5, "x"),
                mode(Mode::Gso),
                mode(Mode::Tcp),
                &BulkResult::tx_cpu_s_per_gb,
                "gso / tcp sender CPU s/GB sent, per round",
                "gso and tcp",
            ),
            pair(
                Spec::at_least("udp-bulk.gro-rx-vs-udp", "GSO+GRO receiver rate vs plain UDP's", 4.0, "x"),
                mode(Mode::GsoGro),
                mode(Mode::Udp),
                &BulkResult::rx_rate,
                "gso-gro / udp bytes per second at the receiver, per round",
                "gso-gro and udp",
            ),
        ];
        for (i, a) in arms.iter().enumerate() {
            let Role::Main(Mode::Paced, Some(rate)) = a.role else { continue };
            let r = compact_rate(rate);
            let rs = &results[i];
            c.push(
                Spec::within(
                    &format!("udp-bulk.paced-{r}-rate"),
                    format!("paced {r}: rate at the receiver, % of the target"),
                    98.0,
                    102.0,
                    "%",
                )
                .evaluate(
                    rs.iter()
                        .map(|x| {
                            usable(x, &|x| x.rx_pacing_accuracy().unwrap_or(Err("not paced".into())).map(|a| a * 100.0))
                        })
                        .collect(),
                    "bytes received over the receiver's own span plus one release period, per run",
                ),
            );
            c.push(pair(
                Spec::at_most(
                    &format!("udp-bulk.paced-{r}-cpu"),
                    format!("paced {r}: sender CPU per GB vs unpaced GSO"),
                    1.3,
                    "x",
                ),
                Some(rs),
                mode(Mode::Gso),
                &BulkResult::tx_cpu_s_per_gb,
                "paced / gso sender CPU s/GB sent, per round",
                "gso",
            ));
        }
        for (gso, what) in [(false, "plain"), (true, "GSO")] {
            let spec = Spec::at_most(
                &format!("udp-bulk.{}-sender-vs-kernel", what.to_lowercase()),
                format!("{what} sender CPU per GB vs the kernel's udpgso_bench_tx"),
                1.0,
                "x",
            );
            c.push(match (find(Role::Ours(gso)), find(Role::Kernel(gso))) {
                (Some(a), Some(b)) => spec.evaluate(
                    paired(a, b, |r| usable(r, &BulkResult::tx_cpu_s_per_gb)),
                    "netlane / udpgso_bench_tx sender CPU s/GB, same receiver, per round",
                ),
                _ => spec.skipped("udpgso_bench_tx not run"),
            });
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use netlane::metrics::CpuTime;

    use super::*;
    use crate::engines::bulk::{Integrity, PaceReport, RxReport, TxReport};
    use netlane_report::Outcome;

    /// A run that moved `bytes` in a second with 0.1 s of CPU on each side.
    fn run(bytes: u64, pacing: Option<u64>) -> BulkResult {
        let datagrams = bytes / 1400;
        let cpu = CpuTime { user_s: 0.05, system_s: 0.05, ..CpuTime::default() };
        BulkResult {
            tx: TxReport {
                datagrams,
                bytes,
                syscalls: datagrams,
                seconds: 1.0,
                cpu,
                pacing: pacing.map(|r| PaceReport {
                    target_rate_bytes_per_s: r,
                    quantum_ns: 1_000_000,
                    accuracy: 1.0,
                    ..PaceReport::default()
                }),
                ..TxReport::default()
            },
            rx: RxReport {
                datagrams,
                bytes,
                syscalls: datagrams,
                seconds: 0.999,
                cpu,
                integrity: Integrity { unique: datagrams, ..Integrity::default() },
                ..RxReport::default()
            },
            ..BulkResult::default()
        }
    }

    fn args() -> UdpBulkArgs {
        let mut a = UdpBulkArgs::defaults();
        a.net.path = super::super::PathKind::Loopback;
        a.no_selftest = true;
        a.repeat = 2;
        a.rates = vec![10_000_000];
        a
    }

    /// Every arm's results: two good rounds, except `bad` (an arm label) whose second
    /// round is `degenerate`.
    fn results(arms: &[Arm], bad: &str, degenerate: BulkResult) -> Vec<Vec<BulkResult>> {
        arms.iter()
            .map(|a| {
                let good = match a.role {
                    Role::Main(Mode::Paced, Some(r)) => run(r, Some(r)),
                    _ => run(1_400_000_000, None),
                };
                let second = if a.label == bad { degenerate.clone() } else { good.clone() };
                vec![good, second]
            })
            .collect()
    }

    fn outcome(checks: &[netlane_report::Check], id: &str) -> (Outcome, String) {
        let c = checks.iter().find(|c| c.id == id).unwrap_or_else(|| panic!("no check {id}"));
        (c.outcome, c.reason.clone())
    }

    #[test]
    fn good_runs_give_measured_checks() {
        let a = args();
        let arms = a.arms();
        let checks = a.checks(&arms, &results(&arms, "none", BulkResult::default()));
        for id in [
            "udp-bulk.gso-cpu-vs-udp",
            "udp-bulk.gso-cpu-vs-tcp",
            "udp-bulk.gro-rx-vs-udp",
            "udp-bulk.paced-10MB/s-rate",
        ] {
            let (o, why) = outcome(&checks, id);
            assert_ne!(o, Outcome::Invalid, "{id}: {why}");
        }
    }

    #[test]
    fn every_check_is_invalid_when_a_mode_it_reads_moved_nothing() {
        let a = args();
        let arms = a.arms();
        let nothing = BulkResult::default();
        for (arm, ids) in [
            ("gso", &["udp-bulk.gso-cpu-vs-udp", "udp-bulk.gso-cpu-vs-tcp", "udp-bulk.paced-10MB/s-cpu"][..]),
            ("udp", &["udp-bulk.gso-cpu-vs-udp", "udp-bulk.gro-rx-vs-udp"][..]),
            ("tcp", &["udp-bulk.gso-cpu-vs-tcp"][..]),
            ("gso-gro", &["udp-bulk.gro-rx-vs-udp"][..]),
            ("paced 10MB/s", &["udp-bulk.paced-10MB/s-rate", "udp-bulk.paced-10MB/s-cpu"][..]),
        ] {
            let checks = a.checks(&arms, &results(&arms, arm, nothing.clone()));
            for id in ids {
                let (o, why) = outcome(&checks, id);
                assert_eq!(o, Outcome::Invalid, "{arm} moved nothing, yet {id} is {o:?} ({why})");
                assert!(why.contains("sample 2"), "{id}: {why}");
            }
        }
    }

    #[test]
    fn no_cpu_time_and_impossible_runs_are_invalid() {
        let a = args();
        let arms = a.arms();
        let mut no_cpu = run(1_400_000_000, None);
        no_cpu.tx.cpu = CpuTime::default();
        let (o, why) = outcome(&a.checks(&arms, &results(&arms, "gso", no_cpu)), "udp-bulk.gso-cpu-vs-udp");
        assert_eq!(o, Outcome::Invalid);
        assert!(why.contains("no CPU time"), "{why}");
        // The receiver counting more than was sent cannot be true.
        let mut impossible = run(1_400_000_000, None);
        impossible.rx.integrity.unique = impossible.tx.datagrams * 2;
        let (o, why) = outcome(&a.checks(&arms, &results(&arms, "gso-gro", impossible)), "udp-bulk.gro-rx-vs-udp");
        assert_eq!(o, Outcome::Invalid);
        assert!(why.contains("receiver counted"), "{why}");
    }

    #[test]
    fn the_kernel_comparison_is_invalid_when_the_kernel_sender_sent_nothing() {
        let mut a = args();
        a.no_selftest = false;
        a.selftest = Some("/bin/true".into());
        let arms = a.arms();
        let checks = a.checks(&arms, &results(&arms, "udpgso_bench_tx -S", BulkResult::default()));
        let (o, why) = outcome(&checks, "udp-bulk.gso-sender-vs-kernel");
        assert_eq!(o, Outcome::Invalid, "{why}");
        assert_ne!(outcome(&checks, "udp-bulk.plain-sender-vs-kernel").0, Outcome::Invalid);
    }

    #[test]
    fn the_report_flags_impossible_and_lossy_modes() {
        let a = args();
        let arms = a.arms();
        let mut lossy = run(1_400_000_000, None);
        lossy.rx.integrity.unique /= 10;
        lossy.rx.bytes /= 10;
        let mut rs = results(&arms, "gso", lossy.clone());
        let gso = arms.iter().position(|x| x.label == "gso").unwrap();
        rs[gso][0] = lossy;
        let r = a.report(&arms, &rs, Vec::new());
        assert!(r.flags.iter().any(|f| f.kind == FlagKind::Lossy && f.subject == "gso"), "{:?}", r.flags);
        let mut impossible = run(1_400_000_000, None);
        impossible.rx.integrity.unique *= 2;
        let r = a.report(&arms, &results(&arms, "udp", impossible), Vec::new());
        assert!(r.flags.iter().any(|f| f.kind == FlagKind::Impossible && f.subject == "udp"), "{:?}", r.flags);
    }
}

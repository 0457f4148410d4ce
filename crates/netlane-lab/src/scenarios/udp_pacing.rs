//! `udp-pacing`: the LPC 2018 talk's pacing experiment. A token-bucket bottleneck (tbf,
//! 200 Mbit/s with a small queue by default) sits on the sender's link; a GSO sender
//! offers a fixed share of the bottleneck's rate, released every quantum. Wider quanta
//! mean fewer wake-ups and fuller GSO sends (less CPU) but bigger bursts (more loss at
//! the bottleneck). "unpaced" sends the same bytes as one burst.

use std::time::Duration;

use anyhow::{Result, bail};
use clap::Args;
use netlane::metrics::units::{Rate, format_duration};
use netlane::pace::Quantum;
use netlane::topology::QdiscStats;
use netlane::udp::GsoMode;
use netlane::udp::gso::GsoLimits;

use super::net::{NetArgs, PathKind, endpoints, run_one, summary_line};
use super::{Heading, Scenario, Sections, from_words};
use crate::engines::bulk::{BulkResult, BulkRun, Pacing, RxSpec, TxSource, TxSpec};
use crate::progress::Progress;
use crate::runner::{Measured, Runner};
use crate::stats::{self, median, repeat_flags, sig};
use crate::verdict::{Measure, Spec, finite, paired, ratio};
use netlane_report::options::{OptionList, parse_positive_duration, parse_rate, parse_size};
use netlane_report::{
    Axis, Chart, ChartKind, Column, Flag, Point, Row, RunRecord, Scale, ScenarioReport, Series, Table, Unit, Value,
    format,
};
use serde::Serialize;

/// One point of the sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepPoint {
    /// No pacer: the same bytes as fast as the socket takes them.
    Unpaced,
    /// Releases every this many nanoseconds.
    Quantum(u64),
}

impl SweepPoint {
    /// As the command line writes it.
    pub fn name(&self) -> String {
        match self {
            SweepPoint::Unpaced => "unpaced".into(),
            SweepPoint::Quantum(ns) => format_duration(Duration::from_nanos(*ns)),
        }
    }

    /// As people read it.
    fn label(&self) -> String {
        match self {
            SweepPoint::Unpaced => "unpaced".into(),
            SweepPoint::Quantum(ns) => format::seconds(*ns as f64 / 1e9),
        }
    }
}

fn parse_point(s: &str) -> Result<SweepPoint, String> {
    if s.eq_ignore_ascii_case("unpaced") {
        return Ok(SweepPoint::Unpaced);
    }
    Ok(SweepPoint::Quantum(parse_positive_duration(s)?.as_nanos() as u64))
}

/// Options of the `udp-pacing` scenario.
#[derive(Debug, Clone, Args)]
pub struct UdpPacingArgs {
    /// Network placement (the bottleneck needs --path veth).
    #[command(flatten)]
    pub net: NetArgs,
    /// Bottleneck rate (tbf on the sender's link).
    #[arg(long, default_value = "200mbit", value_parser = parse_rate, allow_hyphen_values = true)]
    pub bottleneck: u64,
    /// Bottleneck bucket size.
    #[arg(long, default_value = "32k", value_parser = parse_size)]
    pub burst: u64,
    /// Bottleneck queue limit (bytes queued before drops).
    #[arg(long, default_value = "64k", value_parser = parse_size)]
    pub queue: u64,
    /// Offered load, percent of the bottleneck's rate (counted in wire bytes).
    #[arg(long, default_value_t = 90, value_parser = clap::value_parser!(u32).range(1..=200))]
    pub offered: u32,
    /// Sweep points: release quanta and "unpaced" (the same bytes in one burst), comma separated.
    #[arg(long, value_delimiter = ',', default_value = "250us,1ms,4ms,8ms,unpaced", value_parser = parse_point)]
    pub quanta: Vec<SweepPoint>,
    /// How long each point sends.
    #[arg(short = 't', long, alias = "duration", default_value = "2s", value_parser = parse_positive_duration)]
    pub time: Duration,
    /// Rounds: every point runs once per round, in a rotating order.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub repeat: u32,
    /// UDP payload bytes per datagram.
    #[arg(long, default_value_t = 1400)]
    pub gso_size: usize,
}

/// One run of a point, with what the bottleneck did during it.
#[derive(Debug, Clone, Serialize)]
struct PointRun {
    result: BulkResult,
    qdisc: QdiscStats,
}

impl Measured for PointRun {
    fn summary(&self) -> String {
        summary_line(&self.result)
    }

    fn figures(&self) -> Vec<(&'static str, Option<f64>)> {
        let r = &self.result;
        vec![
            ("tx_mb_per_s", r.tx_rate().ok().map(|v| v / 1e6)),
            ("rx_mb_per_s", r.rx_rate().ok().map(|v| v / 1e6)),
            ("loss_pct", r.loss().ok().map(|l| l * 100.0)),
            ("bottleneck_drops", Some(self.qdisc.drops as f64)),
            ("tx_cpu_s_per_gb", r.tx_cpu_s_per_gb().ok()),
            ("tx_cpu_s_per_gb_delivered", r.tx_cpu_s_per_gb_delivered().ok()),
        ]
    }

    fn path(&self) -> Vec<String> {
        self.result.tx.path.clone()
    }
}

impl UdpPacingArgs {
    /// The defaults, as `netlane bench udp-pacing` has them.
    pub fn defaults() -> UdpPacingArgs {
        from_words(&[]).expect("the defaults parse")
    }

    /// Payload rate that puts `offered`% of the bottleneck on the wire: each datagram
    /// also carries IP, UDP and Ethernet headers.
    fn offered_rate(&self) -> u64 {
        let overhead = netlane::udp::ip_udp_header_len(self.net.ipv6) + 14;
        let wire_share = self.gso_size as f64 / (self.gso_size + overhead) as f64;
        (self.bottleneck as f64 * f64::from(self.offered) / 100.0 * wire_share) as u64
    }

    fn segments(&self) -> usize {
        GsoLimits::for_family(self.net.ipv6).segments_per_send(self.gso_size)
    }

    fn run_for(&self, point: SweepPoint, run_id: u32) -> BulkRun {
        let rate = self.offered_rate();
        let base = TxSpec {
            gso: GsoMode::Cmsg,
            datagram_size: self.gso_size,
            segments_per_send: self.segments(),
            duration: self.time,
            cpu: Some(self.net.tx_cpu),
            ..TxSpec::udp()
        };
        let tx = match point {
            // The same bytes a paced run moves, as fast as possible (bounded by the
            // duration, which it will not need).
            SweepPoint::Unpaced => TxSpec { limit_bytes: Some((rate as f64 * self.time.as_secs_f64()) as u64), ..base },
            SweepPoint::Quantum(ns) => TxSpec { pacing: Some(Pacing { rate, quantum: Quantum::Fixed(ns) }), ..base },
        };
        BulkRun {
            tx: TxSource::Netlane(tx),
            rx: RxSpec { cpu: Some(self.net.rx_cpu()), ..RxSpec::udp() },
            ipv6: self.net.ipv6,
            run_id,
            roles: self.net.roles(),
        }
    }
}

impl Scenario for UdpPacingArgs {
    fn name(&self) -> &'static str {
        "udp-pacing"
    }

    fn options(&self) -> OptionList {
        let quanta: Vec<String> = self.quanta.iter().map(SweepPoint::name).collect();
        self.net
            .options()
            .rate("bottleneck", self.bottleneck)
            .size("burst", self.burst)
            .size("queue", self.queue)
            .int("offered", u64::from(self.offered))
            .words("quanta", &quanta)
            .duration("time", self.time)
            .int("repeat", u64::from(self.repeat))
            .int("gso-size", self.gso_size as u64)
    }

    fn validate(&self) -> Result<()> {
        if self.net.path != PathKind::Veth {
            bail!("the pacing experiment needs a bottleneck qdisc on a veth link: use --path veth (needs root)");
        }
        self.net.validate()?;
        if self.quanta.is_empty() {
            bail!("no sweep points given (--quanta)");
        }
        if self.burst < 2048 {
            bail!("--burst {} is below one full-size packet; tbf would never send", self.burst);
        }
        if self.burst > u64::from(u32::MAX) || self.queue > u64::from(u32::MAX) {
            bail!("--burst and --queue must be below 4 GiB");
        }
        for (i, p) in self.quanta.iter().enumerate() {
            self.run_for(*p, i as u32)
                .validate(Some(self.net.path_mtu()))
                .map_err(|e| anyhow::Error::new(e).context(p.name()))?;
        }
        Ok(())
    }

    fn runs(&self) -> usize {
        self.quanta.len() * self.repeat as usize
    }

    fn run(&self, progress: &dyn Progress) -> Result<ScenarioReport> {
        self.validate()?;
        let hosts = self.net.build("udp-pacing")?;
        let h = hosts.as_ref().ok_or_else(|| anyhow::anyhow!("the pacing experiment needs the veth path"))?;
        h.set_bottleneck(self.bottleneck, self.burst as u32, self.queue as u32)?;
        let mut runner = Runner::new(progress);
        let runs = runner.rounds(
            self.quanta.len(),
            |_| self.repeat,
            |runner, i, turn| {
                let p = self.quanta[i];
                let run = self.run_for(p, runner.next_index());
                runner.measure(turn, &p.name(), |label| {
                    let before = h.egress_qdisc()?.1;
                    let result = run_one(endpoints(&hosts), label, &run)?;
                    let after = h.egress_qdisc()?.1;
                    let qdisc = QdiscStats {
                        bytes: after.bytes.saturating_sub(before.bytes),
                        packets: after.packets.saturating_sub(before.packets),
                        drops: after.drops.saturating_sub(before.drops),
                        overlimits: after.overlimits.saturating_sub(before.overlimits),
                    };
                    Ok(PointRun { result, qdisc })
                })
            },
        )?;
        let records = runner.into_records();
        Ok(self.report(&runs, records))
    }
}

fn usable(r: &PointRun, f: &dyn Fn(&BulkResult) -> Measure) -> Measure {
    match r.result.impossible() {
        Some(why) => Err(why),
        None => f(&r.result),
    }
}

fn values(rs: &[PointRun], f: &dyn Fn(&BulkResult) -> Measure) -> Vec<f64> {
    stats::values(rs, |r| usable(r, f))
}

fn med(rs: &[PointRun], f: &dyn Fn(&BulkResult) -> Measure) -> Value {
    stats::med(rs, |r| usable(r, f))
}

fn loss_pct(r: &BulkResult) -> Measure {
    r.loss().map(|l| l * 100.0)
}

impl UdpPacingArgs {
    fn report(&self, runs: &[Vec<PointRun>], records: Vec<RunRecord>) -> ScenarioReport {
        let mut out = Sections::default();
        out.tables.push(self.sweep_table(runs, &mut out.flags));
        let mut trade_off = TradeOff {
            checks: Vec::new(),
            headline: format!("{} sweep points, {} rounds.", self.quanta.len(), self.repeat),
        };
        self.trade_off(runs, &mut trade_off);
        out.checks = trade_off.checks;
        out.charts = self.charts(runs);
        out.notes = vec![format!(
            "Each paced point releases the bytes due in one quantum as full GSO sends; the bottleneck holds {} B of \
         bucket and {} B of queue, so releases larger than that are dropped at the qdisc. The offered load is {} \
         of payload. Pacing runs in user space (no fq/etf for SO_TXTIME here).",
            self.burst,
            self.queue,
            Rate(self.offered_rate() as f64)
        )];
        let heading = Heading { title: TITLE.into(), description: DESCRIPTION.into(), headline: trade_off.headline };
        out.report(self, heading, records, self.net.cpu_plan())
    }

    /// Every sweep point: rates, loss, drops at the bottleneck, sender CPU, wake-ups.
    fn sweep_table(&self, runs: &[Vec<PointRun>], flags: &mut Vec<Flag>) -> Table {
        let mut table = Table::new(
            "udp-pacing",
            format!(
                "Release quantum vs loss and sender CPU at a {} bottleneck ({}% offered), medians of {} rounds",
                Rate(self.bottleneck as f64),
                self.offered,
                self.repeat
            ),
            vec![
                Column::new("quantum", "quantum", 0),
                Column::new("segments_per_release", "segments/release", 1),
                Column::new("tx_mb_per_s", "tx MB/s", 1),
                Column::new("rx_mb_per_s", "rx MB/s", 1),
                Column::new("loss_pct", "loss %", 2),
                Column::new("bottleneck_drops", "bottleneck drops", 0),
                Column::new("tx_cpu_s_per_gb", "tx CPU s/GB sent", 3),
                Column::new("tx_cpu_s_per_gb_delivered", "tx CPU s/GB delivered", 3),
                Column::new("wakeups_per_s", "wake-ups/s", 0),
                Column::new("rx_per_ms_p99_kb", "rx per-ms p99 kB", 1),
            ],
        );
        for (p, rs) in self.quanta.iter().zip(runs) {
            flags.extend(repeat_flags(&p.label(), "sender CPU s/GB", &values(rs, &BulkResult::tx_cpu_s_per_gb)));
            let pace = rs.iter().find_map(|r| r.result.tx.pacing);
            let drops: Vec<f64> = rs.iter().map(|r| r.qdisc.drops as f64).collect();
            table.push(Row::new(vec![
                Value::text(p.label()),
                pace.map_or(Value::text("all"), |p| Value::num(p.segments_per_release)),
                med(rs, &|r| r.tx_rate().map(|v| v / 1e6)),
                med(rs, &|r| r.rx_rate().map(|v| v / 1e6)),
                med(rs, &loss_pct),
                Value::num(median(drops)),
                med(rs, &BulkResult::tx_cpu_s_per_gb),
                med(rs, &BulkResult::tx_cpu_s_per_gb_delivered),
                med(rs, &|r| {
                    r.tx.pacing.map_or(Err("unpaced".into()), |p| ratio(Ok(p.stats.releases as f64), Ok(r.tx.seconds)))
                }),
                med(rs, &|r| Ok(r.rx.per_ms_bytes.p99 as f64 / 1e3)),
            ]));
        }

        table
    }

    /// The talk's trade-off as checks, and the headline that says it.
    fn trade_off(&self, runs: &[Vec<PointRun>], out: &mut TradeOff) {
        // The talk's finding: widening the interval cut sender CPU a lot while the loss
        // rate rose. Compare the narrowest and widest paced points, round by round.
        let paced: Vec<(usize, u64)> = self
            .quanta
            .iter()
            .enumerate()
            .filter_map(|(i, p)| if let SweepPoint::Quantum(ns) = p { Some((i, *ns)) } else { None })
            .collect();
        let narrow = paced.iter().min_by_key(|(_, ns)| *ns).copied();
        let wide = paced.iter().max_by_key(|(_, ns)| *ns).copied();
        if let (Some((n, _)), Some((w, _))) = (narrow, wide)
            && n != w
        {
            let (nl, wl) = (self.quanta[n].label(), self.quanta[w].label());
            let cpu = Spec::below(
                "udp-pacing.cpu-falls",
                format!("sender CPU per GB falls from {nl} to {wl} quanta"),
                1.0,
                "x",
            )
            .evaluate(
                paired(&runs[w], &runs[n], |r| usable(r, &BulkResult::tx_cpu_s_per_gb)),
                &format!("{wl} / {nl} sender CPU s/GB sent, per round"),
            );
            let loss = Spec::above("udp-pacing.loss-rises", format!("loss rises from {nl} to {wl} quanta"), 0.0, "pp")
                .evaluate(
                    runs[w]
                        .iter()
                        .zip(&runs[n])
                        .map(|(a, b)| {
                            let (a, b) = (usable(a, &loss_pct)?, usable(b, &loss_pct)?);
                            finite(a, "loss").and_then(|a| finite(b, "loss").map(|b| a - b))
                        })
                        .collect(),
                    &format!("{wl} loss % - {nl} loss %, per round (percentage points)"),
                );
            if let (Some(c), Some(_)) = (&cpu.measured, &loss.measured) {
                let lm = |i: usize| med(&runs[i], &loss_pct).as_f64().map_or("-".into(), |v| format!("{v:.2}%"));
                out.headline = format!(
                    "From {nl} to {wl} release quanta the sender's CPU per GB changed {}x while loss went from {} to {}.",
                    sig(c.median),
                    lm(n),
                    lm(w)
                );
            }
            out.checks.push(cpu);
            out.checks.push(loss);
        }
    }

    fn charts(&self, runs: &[Vec<PointRun>]) -> Vec<Chart> {
        let xs: Vec<String> = self.quanta.iter().map(SweepPoint::label).collect();
        let series = |name: &str, f: &dyn Fn(&BulkResult) -> Measure| Series {
            name: name.into(),
            points: runs.iter().enumerate().filter_map(|(x, rs)| Point::of(x as f64, &values(rs, f))).collect(),
        };
        vec![
            Chart {
                name: "udp-pacing-loss".into(),
                title: "Loss at the bottleneck vs release quantum".into(),
                kind: ChartKind::Lines,
                x: Axis::categories("release quantum", xs.clone()),
                y: Axis::numeric("loss", Unit::Percent, Scale::Linear),
                series: vec![series("loss", &loss_pct)],
            },
            Chart {
                name: "udp-pacing-cpu".into(),
                title: "Sender CPU per GB vs release quantum".into(),
                kind: ChartKind::Lines,
                x: Axis::categories("release quantum", xs),
                y: Axis::numeric("sender CPU", Unit::Count("s/GB".into()), Scale::Linear),
                series: vec![
                    series("per GB sent", &BulkResult::tx_cpu_s_per_gb),
                    series("per GB delivered", &BulkResult::tx_cpu_s_per_gb_delivered),
                ],
            },
        ]
    }
}

/// The trade-off's checks and the headline.
struct TradeOff {
    checks: Vec<netlane_report::Check>,
    headline: String,
}

/// The scenario's title.
const TITLE: &str = "Pacing experiment: release quantum vs loss and CPU";

/// What the scenario does, for the report.
const DESCRIPTION: &str = "The LPC 2018 talk's experiment: a QUIC server paced its sends in user space; widening the \
    pacing interval cut the sender's CPU a lot while the loss rate rose from a low base. Here a tbf \
    qdisc on the sender's veth is the bottleneck, and a GSO sender offers a fixed share of its rate with \
    each release quantum; 'unpaced' sends the same bytes in one burst. Loss is counted at the receiver.";

#[cfg(test)]
mod tests {
    use netlane::metrics::CpuTime;

    use super::*;
    use crate::engines::bulk::{Integrity, RxReport, TxReport};
    use netlane_report::Outcome;

    /// A run that sent `datagrams` 1400-byte datagrams with `cpu_s` of sender CPU and
    /// lost `lost` of them.
    fn point(datagrams: u64, cpu_s: f64, lost: u64) -> PointRun {
        let cpu = CpuTime { user_s: cpu_s, ..CpuTime::default() };
        let got = datagrams - lost;
        PointRun {
            result: BulkResult {
                tx: TxReport {
                    datagrams,
                    bytes: datagrams * 1400,
                    syscalls: datagrams / 46,
                    seconds: 1.0,
                    cpu,
                    ..TxReport::default()
                },
                rx: RxReport {
                    datagrams: got,
                    bytes: got * 1400,
                    seconds: 1.0,
                    cpu,
                    integrity: Integrity { unique: got, ..Integrity::default() },
                    ..RxReport::default()
                },
                ..BulkResult::default()
            },
            qdisc: QdiscStats::default(),
        }
    }

    fn args() -> UdpPacingArgs {
        let mut a = UdpPacingArgs::defaults();
        a.quanta = vec![SweepPoint::Quantum(250_000), SweepPoint::Quantum(8_000_000)];
        a.repeat = 2;
        a
    }

    fn outcome(r: &ScenarioReport, id: &str) -> (Outcome, String) {
        let c = r.checks.iter().find(|c| c.id == id).unwrap_or_else(|| panic!("no {id}"));
        (c.outcome, c.reason.clone())
    }

    #[test]
    fn the_trade_off_is_measured_from_paired_rounds() {
        let a = args();
        let narrow = vec![point(10_000, 0.4, 0), point(10_000, 0.4, 0)];
        let wide = vec![point(10_000, 0.1, 500), point(10_000, 0.12, 400)];
        let r = a.report(&[narrow, wide], Vec::new());
        assert_eq!(outcome(&r, "udp-pacing.cpu-falls").0, Outcome::Met);
        assert_eq!(outcome(&r, "udp-pacing.loss-rises").0, Outcome::Met);
    }

    #[test]
    fn a_point_that_moved_nothing_or_had_no_cpu_time_makes_both_checks_invalid() {
        let a = args();
        let narrow = vec![point(10_000, 0.4, 0), point(10_000, 0.4, 0)];
        let nothing = PointRun { result: BulkResult::default(), qdisc: QdiscStats::default() };
        let r = a.report(&[narrow.clone(), vec![point(10_000, 0.1, 500), nothing]], Vec::new());
        for id in ["udp-pacing.cpu-falls", "udp-pacing.loss-rises"] {
            let (o, why) = outcome(&r, id);
            assert_eq!(o, Outcome::Invalid, "{id}: {why}");
        }
        let r = a.report(&[narrow, vec![point(10_000, 0.0, 0), point(10_000, 0.1, 0)]], Vec::new());
        let (o, why) = outcome(&r, "udp-pacing.cpu-falls");
        assert_eq!(o, Outcome::Invalid);
        assert!(why.contains("no CPU time"), "{why}");
    }

    #[test]
    fn no_loss_at_either_end_is_a_measured_miss_not_a_pass() {
        let a = args();
        let r = a.report(&[vec![point(10_000, 0.4, 0); 2], vec![point(10_000, 0.1, 0); 2]], Vec::new());
        assert_eq!(outcome(&r, "udp-pacing.loss-rises").0, Outcome::Missed);
    }
}

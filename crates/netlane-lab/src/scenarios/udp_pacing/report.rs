//! The udp-pacing scenario's report: the sweep table, the trade-off checks, the charts.

use super::*;

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

/// Who paced a run, and where (`txtime (fq under tbf)`, `user`).
fn pacer_name(p: &netlane_bulk::PaceReport) -> String {
    use netlane_bulk::PacerRan;
    match p.pacer {
        PacerRan::User => "user".into(),
        PacerRan::Txtime => format!("txtime ({})", p.qdisc),
        PacerRan::FqRate => format!("fq-rate ({})", p.qdisc),
    }
}

/// Who paced the paced runs, in the senders' own words (one line per way that ran). The
/// bottleneck's own queue (tbf's byte-limited bfifo) is what drops a release too large
/// for it, so no pacing qdisc goes under it: the points pace in user space, with the
/// reason.
fn who_paced(runs: &[Vec<PointRun>]) -> Vec<String> {
    let mut ways: Vec<String> = Vec::new();
    for r in runs.iter().flatten().filter(|r| r.result.tx.pacing.is_some()) {
        let said = r.result.tx.path.iter().find(|l| l.starts_with("pacing:") || l.starts_with("txtime:"));
        if let Some(line) = said
            && !ways.contains(line)
        {
            ways.push(line.clone());
        }
    }
    ways.into_iter().map(|w| format!("Who paced: {w}.")).collect()
}

impl UdpPacingArgs {
    pub(super) fn report(&self, runs: &[Vec<PointRun>], records: Vec<RunRecord>) -> ScenarioReport {
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
         of payload.",
            self.burst,
            self.queue,
            Rate(self.offered_rate() as f64)
        )];
        out.notes.extend(who_paced(runs));
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
                Column::new("pacer", "pacer", 0),
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
            let pace = rs.iter().find_map(|r| r.result.tx.pacing.as_ref());
            let drops: Vec<f64> = rs.iter().map(|r| r.qdisc.drops as f64).collect();
            table.push(Row::new(vec![
                Value::text(p.label()),
                pace.map_or(Value::text("none"), |p| Value::text(pacer_name(p))),
                pace.map_or(Value::text("all"), |p| Value::num(p.segments_per_release)),
                med(rs, &|r| r.tx_rate().map(|v| v / 1e6)),
                med(rs, &|r| r.rx_rate().map(|v| v / 1e6)),
                med(rs, &loss_pct),
                Value::num(median(drops)),
                med(rs, &BulkResult::tx_cpu_s_per_gb),
                med(rs, &BulkResult::tx_cpu_s_per_gb_delivered),
                med(rs, &|r| {
                    r.tx.pacing
                        .as_ref()
                        .map_or(Err("unpaced".into()), |p| ratio(Ok(p.stats.releases as f64), Ok(r.tx.seconds)))
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
    qdisc on the sender's link (its veth, or a testbed's interface) is the bottleneck, and a GSO sender offers a fixed share of its rate with \
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

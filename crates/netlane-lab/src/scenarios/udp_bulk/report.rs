//! The udp-bulk scenario's report: every mode's table, paced GSO, netlane's sender
//! against the kernel's, the charts, and the flags on runs that cannot stand.

use netlane::metrics::units::compact_rate;
use netlane_report::{
    Axis, Chart, ChartKind, Check, Column, Flag, FlagKind, Point, Row, RunRecord, Scale, ScenarioReport, Series, Table,
    Unit, Value, format,
};

use super::checks::{med, usable, values};
use super::plan::{Arm, Role};
use super::{Mode, UdpBulkArgs};
use crate::engines::bulk::BulkResult;
use crate::scenarios::net::PathKind;
use crate::scenarios::{Heading, Sections};
use crate::stats::{Spread, median, repeat_flags, sig};
use crate::verdict::{Measure, paired, positive};
use netlane::memory::human;

/// The scenario's title.
const TITLE: &str = "UDP content delivery: GSO, GRO, zerocopy, pacing";

impl UdpBulkArgs {
    pub(super) fn report(&self, arms: &[Arm], results: &[Vec<BulkResult>], runs: Vec<RunRecord>) -> ScenarioReport {
        let main: Vec<usize> = (0..arms.len()).filter(|i| matches!(arms[*i].role, Role::Main(..))).collect();
        let mut out = Sections { flags: flags(arms, results), ..Sections::default() };
        out.tables.push(self.modes_table(arms, results, &main));
        let paced: Vec<usize> =
            (0..arms.len()).filter(|i| matches!(arms[*i].role, Role::Main(Mode::Paced, Some(_)))).collect();
        if !paced.is_empty() {
            out.tables.push(self.pacing_table(arms, results, &paced));
        }
        let kernel: Vec<usize> =
            (0..arms.len()).filter(|i| matches!(arms[*i].role, Role::Ours(_) | Role::Kernel(_))).collect();
        if !kernel.is_empty() {
            out.tables.push(selftest_table(arms, results, &kernel));
        }
        out.tables.extend(self.flows_table(arms, results));
        out.checks = self.checks(arms, results);
        out.checks.extend(self.flow_checks(arms, results));
        out.notes = self.notes(arms, results, &paced);
        out.notes.extend(self.flows_note(arms, results));
        if self.modes.contains(&Mode::Flows) {
            out.notes.extend(self.flows_left_out().into_iter().map(|l| format!("Left out of the flows mode: {l}.")));
        }
        out.charts = charts(arms, results, &main);
        let heading = Heading {
            title: TITLE.into(),
            description: if self.on.testbed.is_some() { TESTBED_DESCRIPTION } else { DESCRIPTION }.into(),
            headline: self.headline(&out.checks, main.len()),
        };
        out.report(self, heading, runs, self.net.cpu_plan())
    }

    /// Every mode of the main table: rates, CPU per GB, calls, loss.
    fn modes_table(&self, arms: &[Arm], results: &[Vec<BulkResult>], main: &[usize]) -> Table {
        let mut table = Table::new(
            "udp-bulk",
            format!("Every mode, medians of {} rounds", self.repeat),
            vec![
                Column::new("mode", "mode", 0),
                Column::new("case", "case", 0),
                Column::new("tx_mb_per_s", "tx MB/s", 1),
                Column::new("rx_mb_per_s", "rx MB/s", 1),
                Column::new("rx_kpps", "rx kpps", 1),
                Column::new("tx_cpu_s_per_gb", "tx CPU s/GB sent", 3),
                Column::new("tx_cpu_s_per_gb_delivered", "tx CPU s/GB delivered", 3),
                Column::new("rx_cpu_s_per_gb", "rx CPU s/GB", 3),
                Column::new("receiving_cpu_s_per_gb", "rx CPU busy s/GB (+NAPI)", 3),
                Column::new("system_cpu_s_per_gb", "machine CPU s/GB", 3),
                Column::new("tx_calls_per_datagram", "tx calls/dgram (own count)", 4),
                Column::new("rx_calls_per_datagram", "rx calls/dgram (own count)", 4),
                Column::new("loss_pct", "loss %", 2),
                Column::new("zc_copied_pct", "zc copied %", 1),
                Column::new("spread_pct", "spread %", 0),
            ],
        );
        for &i in main {
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
            // A testbed's device may cut what veth and loopback pass whole: its cases are
            // not these.
            let case = match arms[i].role {
                Role::Main(m, _) if self.on.testbed.is_none() => Value::text(m.case()),
                _ => Value::Missing,
            };
            table.push(Row {
                cells: vec![
                    Value::text(&arms[i].label),
                    case,
                    med(rs, |r| r.tx_rate().map(|v| v / 1e6)),
                    med(rs, |r| r.rx_rate().map(|v| v / 1e6)),
                    med(rs, |r| r.rx_pps().map(|v| v / 1e3)),
                    med(rs, BulkResult::tx_cpu_s_per_gb),
                    med(rs, BulkResult::tx_cpu_s_per_gb_delivered),
                    med(rs, BulkResult::rx_cpu_s_per_gb),
                    med(rs, BulkResult::receiving_cpu_s_per_gb),
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
        table
    }

    /// Paced GSO: the rate at the receiver, and what pacing costs the sender.
    fn pacing_table(&self, arms: &[Arm], results: &[Vec<BulkResult>], paced: &[usize]) -> Table {
        let gso = arms.iter().position(|a| a.role == Role::Main(Mode::Gso, None)).map(|i| &results[i][..]);
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
        for &i in paced {
            let rs = &results[i];
            let Role::Main(_, Some(rate)) = arms[i].role else { continue };
            let p = rs.iter().find_map(|r| r.tx.pacing.as_ref());
            let vs_gso = gso.map(|g| paired(rs, g, |r| usable(r, &BulkResult::tx_cpu_s_per_gb)));
            let vs: Vec<f64> = vs_gso.into_iter().flatten().filter_map(Result::ok).collect();
            t.push(Row::new(vec![
                Value::text(compact_rate(rate)),
                p.map_or(Value::Missing, |p| Value::text(format::seconds(p.quantum_ns as f64 / 1e9))),
                p.map_or(Value::Missing, |p| Value::num(p.segments_per_release)),
                med(rs, |r| r.rx_pacing_accuracy().unwrap_or(Err("not paced".into())).map(|a| a * 100.0)),
                med(rs, |r| r.tx.pacing.as_ref().map_or(Err("not paced".into()), |p| Ok(p.accuracy * 100.0))),
                med(rs, |r| r.rx_rate().map(|v| v / 1e6)),
                med(rs, |r| {
                    r.tx.pacing.as_ref().map_or(Err("not paced".into()), |p| Ok(p.lateness_ns.p50 as f64 / 1e3))
                }),
                med(rs, |r| {
                    r.tx.pacing.as_ref().map_or(Err("not paced".into()), |p| Ok(p.lateness_ns.p99 as f64 / 1e3))
                }),
                med(rs, BulkResult::tx_cpu_s_per_gb),
                if vs.is_empty() { Value::Missing } else { Value::num(median(vs)) },
                med(rs, |r| {
                    let m = r.rx.per_ms_bytes;
                    positive(m.mean, "mean bytes per ms").map(|mean| m.p99 as f64 / mean)
                }),
                med(rs, |r| r.loss().map(|l| l * 100.0)),
            ]));
        }
        t
    }

    fn notes(&self, arms: &[Arm], results: &[Vec<BulkResult>], paced: &[usize]) -> Vec<String> {
        let mode = |m: Mode| arms.iter().position(|a| a.role == Role::Main(m, None)).map(|i| &results[i][..]);
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
        let left_out = self.left_out();
        let mut reasons: Vec<&str> = Vec::new();
        for why in left_out.iter().filter_map(|m| self.cannot_run(*m)) {
            if !reasons.contains(&why) {
                reasons.push(why);
            }
        }
        for why in reasons {
            let names: Vec<String> =
                left_out.iter().filter(|m| self.cannot_run(**m) == Some(why)).map(|m| m.name()).collect();
            notes.push(format!("Left out: {} ({why}).", names.join(", ")));
        }
        notes.extend(self.cases_note(arms));
        notes.extend(zerocopy_note(arms, results, self.on.testbed.is_some()));
        if self.selftest_binary().is_none() && !self.no_selftest {
            notes.push(
                "udpgso_bench_tx was not found, so the comparison with the kernel's sender did not run: build it with \
                 scripts/build-selftests.sh (make lab does), or pass --selftest PATH."
                    .into(),
            );
        }
        notes
    }

    /// Which case of the talk's each row is, where the rows need telling apart.
    fn cases_note(&self, arms: &[Arm]) -> Vec<String> {
        let ran = |m: Mode| arms.iter().any(|a| a.role == Role::Main(m, None));
        let mut notes = Vec::new();
        if self.on.testbed.is_none() && self.net.path == PathKind::Veth {
            notes.push(
                "The cases (the table's \"case\" column): veth takes a GSO train or a 64 KB TCP packet whole and \
                 hands it to the receiver uncut, so \"not cut\" rows are the hardware offload case (USO, TSO) and \
                 more: no NIC does less. The \"cut in software\" rows turn those offloads off at the sender's \
                 device, so the kernel's GSO cuts each train just before it, as for a NIC without them (the case the \
                 talk measured GSO in). tcp-mss sets the device's gso_max_segs to 1: TCP builds one segment per \
                 packet (Linux's TCP otherwise always uses GSO)."
                    .into(),
            );
        }
        if ran(Mode::GsoGro) {
            notes.push("GRO: gso-gro's receiver gets each GSO train whole, so nothing is left to coalesce.".into());
        }
        if ran(Mode::SendmmsgGro) {
            notes.push(
                "GRO: sendmmsg-gro sends single datagrams that GRO coalesces in the receiving device's NAPI, the \
                 receive-side saving itself."
                    .into(),
            );
        }
        if ran(Mode::GsoCold) || ran(Mode::GsoZcCold) {
            let cpu = self.net.tx_cpu;
            // The sender's cache is this machine's only where the sender runs here.
            let llc = if self.on.testbed.is_none() { netlane::cpus::last_level_cache_bytes(cpu) } else { None };
            notes.push(match llc {
                Some(llc) if llc >= self.cold_span as u64 => format!(
                    "The cold modes' payload span ({}) is not larger than CPU {cpu}'s last-level cache ({}): their \
                     payload may stay cached; a cold span larger than the cache makes them cold.",
                    human(self.cold_span as u64),
                    human(llc)
                ),
                Some(llc) => format!(
                    "The cold modes take their payload from a {} span in turn, {:.0}x the {} last-level cache of the \
                     sender's CPU {cpu}: each send copies memory the cache no longer holds.",
                    human(self.cold_span as u64),
                    self.cold_span as f64 / llc as f64,
                    human(llc)
                ),
                None => format!(
                    "The cold modes take their payload from a {} span in turn (the size of the sender's last-level \
                     cache is not known here).",
                    human(self.cold_span as u64)
                ),
            });
        }
        notes
    }

    /// The talk's two claims as measured: GSO's saving for the sender (cut in software,
    /// the talk's case, where it ran; else not cut) and GRO coalescing's for the receive
    /// path.
    fn headline(&self, checks: &[Check], modes: usize) -> String {
        let get =
            |id: &str| checks.iter().find(|c| c.id == id).and_then(|c| c.measured.as_ref()).map(|m| sig(m.median));
        let gso = match (get("udp-bulk.gso-sw-cpu-vs-udp"), get("udp-bulk.gso-cpu-vs-udp")) {
            (Some(sw), Some(whole)) => Some(format!(
                "A GSO sender used {sw}x the CPU per GB of one sendmsg per datagram with its trains cut in software, \
                 {whole}x with the device taking them whole"
            )),
            (Some(sw), None) => Some(format!(
                "A GSO sender used {sw}x the CPU per GB of one sendmsg per datagram with its trains cut in software"
            )),
            (None, Some(whole)) => Some(format!(
                "A GSO sender used {whole}x the CPU per GB of one sendmsg per datagram, the device taking its trains whole"
            )),
            (None, None) => None,
        };
        let gro = get("udp-bulk.gro-coalesced-rx-cpu")
            .map(|g| format!("GRO coalescing single datagrams cost the receive path {g}x the CPU per GB"));
        match (gso, gro) {
            (Some(a), Some(b)) => format!("{a}; {b}."),
            (Some(a), None) | (None, Some(a)) => format!("{a}."),
            (None, None) => format!("{modes} modes, {} rounds.", self.repeat),
        }
    }
}

/// What the kernel did with the MSG_ZEROCOPY sends, when it copied any (`testbed`: the
/// sender's device is a testbed's, not veth or loopback).
fn zerocopy_note(arms: &[Arm], results: &[Vec<BulkResult>], testbed: bool) -> Option<String> {
    let (completed, copied) = arms
        .iter()
        .zip(results)
        .filter(|(a, _)| matches!(a.role, Role::Main(..)))
        .flat_map(|(_, rs)| rs.iter().filter_map(|r| r.tx.zerocopy))
        .fold((0u64, 0u64), |acc, z| (acc.0 + z.completed, acc.1 + z.copied));
    (copied > 0).then(|| {
        let why = if testbed {
            "the sending device could not send from the pinned pages"
        } else {
            "veth and loopback copy every one"
        };
        format!(
            "MSG_ZEROCOPY: the kernel copied {copied} of the {completed} sends it completed \
             (SO_EE_CODE_ZEROCOPY_COPIED): {why}, so the zerocopy rows here show what asking for zerocopy costs, \
             not what it saves."
        )
    })
}

/// Impossible runs, lossy modes, collapsed and noisy repeats.
fn flags(arms: &[Arm], results: &[Vec<BulkResult>]) -> Vec<Flag> {
    let mut flags = Vec::new();
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
    flags
}

/// netlane's sender against the kernel's udpgso_bench_tx.
fn selftest_table(arms: &[Arm], results: &[Vec<BulkResult>], kernel: &[usize]) -> Table {
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
    for &i in kernel {
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
    t
}

fn charts(arms: &[Arm], results: &[Vec<BulkResult>], main: &[usize]) -> Vec<Chart> {
    let cats: Vec<String> = main.iter().map(|i| arms[*i].label.clone()).collect();
    let series = |name: &str, f: &dyn Fn(&BulkResult) -> Measure| Series {
        name: name.into(),
        points: main.iter().enumerate().filter_map(|(x, i)| Point::of(x as f64, &values(&results[*i], f))).collect(),
    };
    vec![
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
    ]
}

/// What the scenario does, for the report.
const TESTBED_DESCRIPTION: &str = "A sender on the testbed's server host and a receiver on its first client host \
        move data for a fixed time in each mode: TCP (the baseline), plain UDP, sendmmsg, UDP GSO (cmsg and socket \
        option), GSO to a UDP_GRO receiver, GSO with MSG_ZEROCOPY, and GSO paced at several rates. CPU is measured \
        per process (sender, receiver) and for both machines together from their /proc/stat (once when they are one \
        machine), as seconds per GB: \
        per GB sent and per GB delivered for the sender. Rates are measured at both ends.";

const DESCRIPTION: &str = "A sender and a receiver in two namespaces joined by veth move data for a fixed time in each \
        mode: TCP (the baseline), plain UDP, sendmmsg, UDP GSO (cmsg and socket option), GSO to a UDP_GRO \
        receiver, GSO with MSG_ZEROCOPY, and GSO paced at several rates. CPU is measured per thread (sender, \
        receiver) and for the whole machine from /proc/stat, as seconds per GB: per GB sent and per GB \
        delivered for the sender. Rates are measured at both ends. The kernel's own selftest sender runs \
        against the same counting receiver in the same rounds.";

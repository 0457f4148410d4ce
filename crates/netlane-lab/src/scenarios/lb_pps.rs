//! `lb-pps`: packets per second per core through the XDP load balancer, 1 to 1 M
//! flows, hints off / rx-hash / per-flow tags / per-destination tags, with a trivial
//! XDP_TX program as the ceiling in the same run, on one core and on two (two receive
//! queues, two NAPI threads, a generator per CPU with half of the flows each).
//!
//! The engine ([`crate::engines::lb_pps`]) loads and warms up every program of a flow
//! count, then gives them turns on the interface: six slices each, rotating order. A
//! round here is one turn of every program, so a ratio pairs two programs' slices of
//! the same round. Slices that measured nothing (the NAPI thread got no CPU) are left
//! out and said so.

use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Result, bail};
use clap::Args;
use netlane_lb::HintMode;

use super::{Scenario, from_words};
use crate::engines::lb_pps::{self as pps, PpsOptions, PpsResult, Subject};
use crate::progress::Progress;
use crate::stats::{Spread, median, repeat_flags};
use crate::verdict::{Measure, Spec};
use netlane_report::options::{OptionList, parse_positive_duration};
use netlane_report::{
    Axis, Chart, ChartKind, Check, Column, Flag, FlagKind, Point, Row, RunRecord, Scale, ScenarioReport, Series, Table,
    Unit, Value,
};

/// Options of the `lb-pps` scenario.
#[derive(Debug, Clone, Args)]
pub struct LbPpsArgs {
    /// Flow counts (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "1,100,10000,1000000")]
    pub flows: Vec<u32>,
    /// Balancer hint modes (comma separated): off, rx-hash, flow-tag, dest-tag.
    #[arg(long, value_delimiter = ',', default_value = "off,rx-hash,flow-tag,dest-tag")]
    pub modes: Vec<String>,
    /// Measured time per program and flow count (taken in six turns).
    #[arg(short = 't', long, default_value = "2s", value_parser = parse_positive_duration)]
    pub time: Duration,
    /// Skip the skb path (frames from a packet socket, flow counts up to 10,000: where
    /// veth has an RX hash, so the device-bound build and the TCX classifier's tags are
    /// measured).
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub no_skb: bool,
    /// Skip the two-core runs (a second veth pair with two queues, a generator on each
    /// CPU sending half of the flows, two NAPI threads; flow counts that split in two).
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub no_two_cores: bool,
}

impl LbPpsArgs {
    /// The defaults, as `netlane bench lb-pps` has them.
    pub fn defaults() -> LbPpsArgs {
        from_words(&[]).expect("the defaults parse")
    }

    fn engine_options(&self) -> Result<PpsOptions> {
        let mut modes = Vec::new();
        for m in &self.modes {
            match HintMode::from_name(m) {
                Some(h) => modes.push(h),
                None => bail!("--modes: {m:?} is not one of off, rx-hash, flow-tag, dest-tag"),
            }
        }
        let o = PpsOptions {
            flows: self.flows.clone(),
            modes,
            time: self.time,
            skb: !self.no_skb,
            two_cores: !self.no_two_cores,
        };
        o.validate()?;
        Ok(o)
    }
}

impl Scenario for LbPpsArgs {
    fn name(&self) -> &'static str {
        "lb-pps"
    }

    fn options(&self) -> OptionList {
        let flows: Vec<u64> = self.flows.iter().map(|f| u64::from(*f)).collect();
        OptionList::new()
            .ints("flows", &flows)
            .words("modes", &self.modes)
            .duration("time", self.time)
            .flag("no-skb", self.no_skb)
            .flag("no-two-cores", self.no_two_cores)
    }

    fn validate(&self) -> Result<()> {
        self.engine_options()?;
        if !netlane::topology::have_privileges() {
            bail!("lb-pps builds namespaces and loads XDP programs: run it as root");
        }
        Ok(())
    }

    /// Per flow count: one load-and-warm-up per program, then the turns; the same again
    /// on the skb path for flow counts up to its limit.
    fn runs(&self) -> usize {
        let skb = if self.no_skb { 0 } else { self.flows.iter().filter(|f| **f <= pps::SKB_MAX_FLOWS).count() };
        (self.flows.len() + skb) * (self.modes.len() + 2)
    }

    fn run(&self, progress: &dyn Progress) -> Result<ScenarioReport> {
        let o = self.engine_options()?;
        self.validate()?;
        // The engine says what it starts; the previous step is then done.
        let last = Mutex::new(String::new());
        let tell = |label: &str| {
            if let Ok(mut l) = last.lock() {
                if !l.is_empty() {
                    progress.finish(&l, "done");
                }
                *l = label.to_string();
            }
            progress.start(label);
        };
        let results = pps::run(&o, &tell)?;
        if let Ok(l) = last.lock()
            && !l.is_empty()
        {
            progress.finish(&l, "done");
        }
        Ok(self.report(&results))
    }
}

/// What the times with no device say about the tagged path, at the smallest flow count.
fn bare_note(results: &[PpsResult]) -> Option<String> {
    let f = results.iter().map(|r| r.flows).min()?;
    let find = |h: HintMode| results.iter().find(|r| r.flows == f && r.subject == Subject::Balancer(h));
    let parts = |h: HintMode| -> Option<(f64, f64, f64)> {
        let r = find(h)?;
        Some((r.over_xdp_tx_ns?, r.room_ns?, r.beyond_room_ns?))
    };
    let (off, off_room, off_rest) = parts(HintMode::Off)?;
    let tagged: Vec<String> = [HintMode::FlowTag, HintMode::DestTag]
        .into_iter()
        .filter_map(|h| {
            let (o, room, rest) = parts(h)?;
            Some(format!("{} {o:.0} ns ({room:.0} making room, {rest:.0} the rest)", h.name()))
        })
        .collect();
    if tagged.is_empty() {
        return None;
    }
    Some(format!(
        "With no device in the path (second table) at {f} flow(s), the untagged program costs {off:.0} ns per packet \
         over XDP_TX on the same frames ({off_room:.0} making room for the outer header, {off_rest:.0} the rest), \
         the tagged ones {}. Making room is one helper call (bpf_xdp_adjust_head); on frames with a hint it also \
         moves the XDP metadata the hint came in (and on frames without, the kernel's runner resets frames whose \
         pointers moved and not the others, so there xdp_tx skips a few ns that the others pay). What a helper \
         call costs depends on the CPU and the kernel's return-thunk mitigation (docs/results.md has this \
         machine's). The per-core rates in the first table add \
         veth's fixed cost per packet (the ceiling's core ns) to every program alike, so their ratios are smaller \
         than the programs' own.",
        tagged.join(", ")
    ))
}

/// Paired samples of `a / b`, slice by slice; slices where either side measured nothing
/// are left out, and a check with fewer than half its slices measured is invalid.
fn paired_slices(a: &PpsResult, b: &PpsResult) -> (Vec<Measure>, usize) {
    paired(&a.slices_mpps_per_core, &b.slices_mpps_per_core)
}

/// A program's slices over its ceiling's slices of the same rounds (None where either
/// measured nothing): its rate with the machine's drift divided out.
fn over_ceiling(r: &PpsResult, ceiling: &PpsResult) -> Vec<Option<f64>> {
    r.slices_mpps_per_core
        .iter()
        .zip(&ceiling.slices_mpps_per_core)
        .map(|(x, c)| Some(x.as_ref()? / c.filter(|v| *v > 0.0).as_ref()?))
        .collect()
}

fn paired(a: &[Option<f64>], b: &[Option<f64>]) -> (Vec<Measure>, usize) {
    let pairs: Vec<(Option<f64>, Option<f64>)> = a.iter().copied().zip(b.iter().copied()).collect();
    let mut samples: Vec<Measure> =
        pairs.iter().filter_map(|(x, y)| Some(Ok(x.as_ref()? / y.filter(|v| *v > 0.0).as_ref()?))).collect();
    let dropped = pairs.len() - samples.len();
    if samples.len() * 2 < pairs.len() {
        samples.push(Err(format!("only {} of {} slices measured both programs", samples.len(), pairs.len())));
    }
    (samples, dropped)
}

fn slice_note(how: &str, dropped: usize) -> String {
    if dropped == 0 {
        how.to_string()
    } else {
        format!(
            "{how}; {dropped} slice(s) left out: a NAPI thread got no CPU in them (or, on two cores, less than a \
             quarter of the other's)"
        )
    }
}

impl LbPpsArgs {
    /// The programs timed with no device (frames path, one core).
    fn bare_table(&self, results: &[PpsResult]) -> Table {
        let mut t = Table::new(
            "lb-pps-no-device",
            "Time per packet with no device: the generator chained into each program (a tail call in place of the \
             transmit), timed by the kernel's live-frames runner on the balancer's CPU, and the generator's next frames \
             through xdp_tx and xdp_tx_room (XDP_TX after making room for an outer header); medians of the slices, \
             whole ns per frame",
            vec![
                Column::new("flows", "flows", 0),
                Column::new("program", "program", 0),
                Column::new("ns_per_packet", "ns/pkt (generator + program)", 1),
                Column::new("over_xdp_tx_ns", "ns over xdp_tx", 1),
                Column::new("spread_ns", "spread ns", 1),
                Column::new("room_ns", "making room ns", 1),
                Column::new("beyond_room_ns", "the rest ns", 1),
                Column::new("slices_timed", "slices", 0),
            ],
        );
        for r in results.iter().filter(|r| r.bare_ns_per_packet.is_some()) {
            t.push(Row::new(vec![
                Value::Int(u64::from(r.flows)),
                Value::text(r.subject.label()),
                Value::opt(r.bare_ns_per_packet),
                Value::opt(r.over_xdp_tx_ns),
                Value::opt(r.over_xdp_tx_spread_ns),
                Value::opt(r.room_ns),
                Value::opt(r.beyond_room_ns),
                Value::text(format!("{}/{}", r.bare_slices, r.slices_mpps_per_core.len())),
            ]));
        }
        t
    }

    fn report(&self, results: &[PpsResult]) -> ScenarioReport {
        let find = |flows: u32, s: Subject| results.iter().find(|r| r.flows == flows && r.subject == s);
        let mut flows: Vec<u32> = results.iter().map(|r| r.flows).collect();
        flows.dedup();
        let mut subjects: Vec<Subject> = Vec::new();
        for r in results {
            if !subjects.contains(&r.subject) {
                subjects.push(r.subject);
            }
        }
        let off = Subject::Balancer(HintMode::Off);

        let mut t = Table::new(
            "lb-pps",
            "Packets per second through the balancer (medians of the slices)",
            vec![
                Column::new("flows", "flows", 0),
                Column::new("program", "program", 0),
                Column::new("mpps_per_core", "Mpps per core", 3),
                Column::new("spread_pct", "spread %", 0),
                Column::new("x_ceiling", "x ceiling", 2),
                Column::new("x_one_core", "per core x 1 core", 2),
                Column::new("mpps_all_cores", "Mpps, all cores", 2),
                Column::new("core_ns_per_packet", "core ns/pkt", 0),
                Column::new("prog_ns_per_packet", "prog ns/pkt", 1),
                Column::new("mpps_wall", "Mpps (wall)", 3),
                Column::new("napi_busy_pct", "NAPI busy %", 0),
                Column::new("hint_hits_pct", "hint hits %", 1),
                Column::new("conn_hits_pct", "conn hits %", 1),
                Column::new("slices_measured", "slices", 0),
            ],
        );
        let mut flags = Vec::new();
        let mut records = Vec::new();
        for (i, r) in results.iter().enumerate() {
            let ceiling = find(r.flows, r.subject.ceiling());
            let x_ceiling: Vec<f64> =
                ceiling.map(|c| paired_slices(r, c).0.into_iter().filter_map(Result::ok).collect()).unwrap_or_default();
            let measured = r.measured_slices();
            let spread = Spread::of(&measured).and_then(|s| s.relative());
            let label = format!("{} flows, {}", r.flows, r.subject.label());
            flags.extend(repeat_flags(&label, "Mpps per core", &measured));
            if let Some(w) = &r.warm_up
                && !w.complete
            {
                flags.push(Flag {
                    kind: FlagKind::Incomplete,
                    subject: label.clone(),
                    message: format!("warm-up incomplete after {} passes: {}", w.passes, w.last),
                });
            }
            let hits = |v: f64| {
                if r.subject.is_ceiling() { Value::Missing } else { Value::num(100.0 * v) }
            };
            t.push(Row::new(vec![
                Value::Int(u64::from(r.flows)),
                Value::text(r.subject.label()),
                Value::opt(r.mpps_per_core),
                Value::opt(spread.map(|s| s * 100.0)),
                if r.subject.is_ceiling() || x_ceiling.is_empty() {
                    Value::Missing
                } else {
                    Value::num(median(x_ceiling))
                },
                match r.subject.on_one_core().and_then(|o| find(r.flows, o)) {
                    Some(one) => {
                        let x: Vec<f64> = paired_slices(r, one).0.into_iter().filter_map(Result::ok).collect();
                        if x.is_empty() { Value::Missing } else { Value::num(median(x)) }
                    }
                    None => Value::Missing,
                },
                Value::opt(r.mpps_per_core.map(|m| m * f64::from(r.cores))),
                Value::opt(r.core_ns_per_packet),
                Value::opt(r.prog_ns_per_packet),
                Value::num(r.mpps),
                if r.seconds > 0.0 {
                    Value::num(100.0 * r.napi_cpu_s / r.seconds / f64::from(r.cores.max(1)))
                } else {
                    Value::Missing
                },
                hits(r.hint_hit_ratio),
                hits(r.conn_hit_ratio),
                Value::text(format!("{}/{}", measured.len(), r.slices_mpps_per_core.len())),
            ]));
            let mut rec = RunRecord::new(
                i as u32 + 1,
                1,
                label,
                vec![
                    ("flows", Some(f64::from(r.flows))),
                    ("mpps_per_core", r.mpps_per_core),
                    ("prog_ns_per_packet", r.prog_ns_per_packet),
                    ("core_ns_per_packet", r.core_ns_per_packet),
                    ("mpps_wall", Some(r.mpps)),
                    ("no_device_over_xdp_tx_ns", r.over_xdp_tx_ns),
                ],
            );
            rec.detail = serde_json::to_value(r).unwrap_or_default();
            records.push(rec);
        }

        let bare = self.bare_table(results);

        let mut checks: Vec<Check> = Vec::new();
        for &f in &flows {
            let spec = Spec::at_least(
                &format!("lb-pps.untagged-vs-ceiling-{f}"),
                format!("{f} flows: untagged balancer vs the XDP_TX ceiling (Mpps per core)"),
                0.7,
                "x",
            );
            checks.push(match (find(f, off), find(f, Subject::XdpTxCeiling)) {
                (Some(l), Some(c)) => {
                    let (s, dropped) = paired_slices(l, c);
                    spec.evaluate(s, &slice_note("untagged / ceiling Mpps per core, per slice", dropped))
                }
                _ => spec.skipped("needs the off mode"),
            });
        }
        // The talk: marked packets skip parsing and the lookups, +40% at small flow
        // counts; at 10 K and 1 M flows the connection table misses the caches.
        for (f, min) in [(1u32, 1.4), (100, 1.4), (10_000, 1.25), (1_000_000, 1.0)] {
            if !flows.contains(&f) {
                continue;
            }
            for tag in [HintMode::FlowTag, HintMode::DestTag] {
                let spec = Spec::at_least(
                    &format!("lb-pps.{}-vs-untagged-{f}", tag.name()),
                    format!("{f} flows: {} vs untagged (Mpps per core)", tag.name()),
                    min,
                    "x",
                );
                checks.push(match (find(f, Subject::Balancer(tag)), find(f, off)) {
                    (Some(tg), Some(l)) => {
                        let (s, dropped) = paired_slices(tg, l);
                        spec.evaluate(
                            s,
                            &slice_note(&format!("{} / untagged Mpps per core, per slice", tag.name()), dropped),
                        )
                    }
                    _ => spec.skipped(format!("needs the off and {} modes", tag.name())),
                });
            }
        }

        // The talk's multi-core result (12 cores: 26 -> ~40 Mpps at small flow counts),
        // on this machine's two. (One flow cannot use two queues.)
        if flows.contains(&100) && results.iter().any(|r| r.cores == 2) {
            for tag in [HintMode::FlowTag, HintMode::DestTag] {
                let spec = Spec::at_least(
                    &format!("lb-pps.two-cores-{}-vs-untagged-100", tag.name()),
                    format!("two cores, 100 flows: {} vs untagged (Mpps per core)", tag.name()),
                    1.4,
                    "x",
                );
                let (tg, un) = (Subject::TwoCoreBalancer(tag), Subject::TwoCoreBalancer(HintMode::Off));
                checks.push(match (find(100, tg), find(100, un)) {
                    (Some(tg), Some(l)) => {
                        let (s, dropped) = paired_slices(tg, l);
                        spec.evaluate(
                            s,
                            &slice_note(
                                &format!("{} / untagged Mpps per core on two cores, per slice", tag.name()),
                                dropped,
                            ),
                        )
                    }
                    _ => spec.skipped(format!("needs the off and {} modes on two cores", tag.name())),
                });
            }
        }

        // Per-destination tags do not grow with the flows: 1 M flows like 100.
        if flows.contains(&100) && flows.contains(&1_000_000) {
            let tag = Subject::Balancer(HintMode::DestTag);
            let spec = Spec::at_least(
                "lb-pps.dest-tag-1000000-vs-100",
                "dest-tag: 1 M flows vs 100 flows (Mpps per core over the XDP_TX ceiling's)",
                0.9,
                "x",
            );
            let ceiling = Subject::XdpTxCeiling;
            checks.push(match (find(1_000_000, tag), find(1_000_000, ceiling), find(100, tag), find(100, ceiling)) {
                (Some(a), Some(ca), Some(b), Some(cb)) => {
                    let (s, dropped) = paired(&over_ceiling(a, ca), &over_ceiling(b, cb));
                    spec.evaluate(
                        s,
                        &slice_note(
                            "(1 M flows / its ceiling) over (100 flows / its ceiling), Mpps per core, slices of the \
                             same turn: the flow counts run minutes apart, and each is divided by the ceiling of its \
                             own round so that the machine's drift in between cancels",
                            dropped,
                        ),
                    )
                }
                _ => spec.skipped("needs the dest-tag mode"),
            });
        }

        let line = |get: fn(&PpsResult) -> (Option<f64>, Vec<f64>), scale: f64| -> Vec<Series> {
            subjects
                .iter()
                .map(|s| Series {
                    name: s.label(),
                    points: flows
                        .iter()
                        .filter_map(|f| {
                            let r = find(*f, *s)?;
                            let (y, all) = get(r);
                            let sp = Spread::of(&all);
                            Some(Point {
                                x: f64::from(*f),
                                y: y? * scale,
                                low: sp.filter(|s| s.n > 1).map(|s| s.min * scale),
                                high: sp.filter(|s| s.n > 1).map(|s| s.max * scale),
                            })
                        })
                        .collect(),
                })
                .collect()
        };
        let charts = vec![
            Chart {
                name: "lb-pps-mpps".into(),
                title: "Mpps per core vs flows (median of the slices, bars show their range)".into(),
                kind: ChartKind::Lines,
                x: Axis::numeric("flows", Unit::Count("flows".into()), Scale::Log),
                y: Axis::numeric("Mpps per core", Unit::Count("Mpps".into()), Scale::Linear),
                series: line(|r| (r.mpps_per_core, r.measured_slices()), 1.0),
            },
            Chart {
                name: "lb-pps-prog-ns".into(),
                title: "Program time per packet vs flows (BPF run-time statistics)".into(),
                kind: ChartKind::Lines,
                x: Axis::numeric("flows", Unit::Count("flows".into()), Scale::Log),
                y: Axis::numeric("time per packet", Unit::Seconds, Scale::Linear),
                series: line(|r| (r.prog_ns_per_packet, Vec::new()), 1e-9),
            },
        ];

        let mut notes = Vec::new();
        if let (Some(lo), Some(hi)) = (flows.first(), flows.last())
            && let (Some(a), Some(b)) = (find(*lo, off), find(*hi, off))
            && hi > lo
            && let (Some(pa), Some(pb)) = (a.prog_ns_per_packet, b.prog_ns_per_packet)
        {
            notes.push(format!(
                "Untagged, the program took {pa:.0} ns per packet at {lo} flows and {pb:.0} ns at {hi}: the \
                 connection-table lookup misses the CPU caches once the flows' entries no longer fit, as the talk \
                 found at 10 K flows. Tagged packets skip that lookup; their own per-flow state (tag entries, the \
                 rx-hash cache) grows too, which per-destination tags avoid."
            ));
        }
        let returned: u64 =
            flows.iter().filter_map(|f| results.iter().find(|r| r.flows == *f)).map(|r| r.sink_frames_all_turns).sum();
        let ran: u64 = results.iter().map(|r| r.packets).sum();
        notes.push(format!(
            "The sink got {returned} frames back for {ran} measured program runs (plus the lead-ins after each \
             switch). The rest were dropped when the balancer's XDP_TX found the generator end's ring full (that \
             end's NAPI shares CPU 0 with the generator); the balancer had done its work on them. Frames the \
             generator sends while the balancer end's ring is full are dropped before any program runs and do \
             not count."
        ));
        notes.push(
            "Mpps per core is measured with the kernel's BPF run-time statistics off (they add two clock reads to \
             every program run; packets come from the programs' own per-CPU counters); program time per packet \
             comes from the last quarter of each one-core slice, with them on, and includes part of their clock \
             reads (two-core rows have none)."
                .into(),
        );
        if results.iter().any(|r| matches!(r.subject, Subject::SkbCeiling | Subject::SkbBalancer(_))) {
            notes.push(
                "Rows marked skb: the same programs on frames that a packet socket sends through the generator \
                 end's stack, so they reach the balancer as skbs; veth then has an RX hash, and the device-bound \
                 build (kfunc) reads it: the kernel's flow hash (rx-hash), or the tag the TCX classifier on the \
                 sending end set (flow-tag, dest-tag; each mode's classifier is attached only in its turns). An skb \
                 costs the veth path far more than an XDP frame (compare the two ceilings' core ns per packet), so \
                 compare skb rows with each other. On veth the RX hash is not free: the kfunc makes the kernel \
                 compute the flow hash (rx-hash program time) unless the classifier has set one."
                    .into(),
            );
        } else {
            notes.push(
                "The device-bound build (hints from the bpf_xdp_metadata_rx_hash kfunc) was not measured (--no-skb, \
                 or no flow count up to 10,000): veth only has an RX hash for packets that arrive as skbs."
                    .into(),
            );
        }
        if let Some(f) = flows.iter().copied().find(|f| find(*f, Subject::TwoCoreBalancer(HintMode::Off)).is_some()) {
            let part = |s: Subject| -> Option<String> {
                let two = find(f, s)?;
                let per_core = two.mpps_per_core?;
                let vs_one = s
                    .on_one_core()
                    .and_then(|o| find(f, o))
                    .map(|one| paired_slices(two, one).0.into_iter().filter_map(Result::ok).collect::<Vec<f64>>())
                    .filter(|x| !x.is_empty())
                    .map(|x| format!(" ({:.2}x its one-core rate)", median(x)))
                    .unwrap_or_default();
                Some(format!("{} {per_core:.2} Mpps per core, {:.2} on both{vs_one}", s.label(), per_core * 2.0))
            };
            let parts: Vec<String> = [
                Subject::TwoCoreCeiling,
                Subject::TwoCoreBalancer(HintMode::Off),
                Subject::TwoCoreBalancer(HintMode::FlowTag),
                Subject::TwoCoreBalancer(HintMode::DestTag),
            ]
            .into_iter()
            .filter_map(part)
            .collect();
            notes.push(format!(
                "Two cores at {f} flows: {}. Each CPU runs a generator, a balancer NAPI thread and a sink thread \
                 here (the machine has two), and the two-core turns keep the NAPI threads busier than the one-core \
                 turns do (NAPI busy %: bigger batches, fewer wake-ups per packet). So a rate on two cores against \
                 the same program's on one core is not only the cost of the second core; compare programs with each \
                 other and with the two-core ceiling on two cores.",
                parts.join("; ")
            ));
        }
        if let Some(n) = bare_note(results) {
            notes.push(n);
        }
        let headline = {
            let get = |id: &str| crate::verdict::measured_median(&checks, id);
            let lo = flows.first().copied().unwrap_or(1);
            match (get(&format!("lb-pps.untagged-vs-ceiling-{lo}")), get("lb-pps.dest-tag-vs-untagged-1000000")) {
                (Some(a), Some(b)) => format!(
                    "Untagged, the balancer ran at {a}x the XDP_TX ceiling at {lo} flows; per-destination tags gave {b}x \
                     the untagged rate at 1 M flows."
                ),
                (Some(a), None) => format!("Untagged, the balancer ran at {a}x the XDP_TX ceiling at {lo} flows."),
                _ => format!("{} programs at {} flow counts.", subjects.len(), flows.len()),
            }
        };
        let options = self.options();
        ScenarioReport {
            name: "lb-pps".into(),
            title: "XDP load balancer: packets per second per core, hints off and on, vs XDP_TX".into(),
            description: "A generator (BPF_PROG_RUN live frames on CPU 0) sends 64-byte TCP frames of N flows over a \
                veth pair to the balancer, which runs in the threaded NAPI of the other end pinned to CPU 1 and \
                XDP_TXes them back into a sink. All programs of a flow count are loaded and warmed up first, then \
                take turns on the interface (six slices each, rotating order); figures are medians of a program's \
                slices, ratios are paired slice by slice. Mpps per core = packets / CPU time of that NAPI thread \
                (veth + XDP + XDP_TX), with BPF run-time statistics off; program ns/packet from those statistics, \
                on for the last quarter of each slice. Hints arrive as \
                XDP metadata written by the generator (the emulated NIC); tags are installed by the control plane \
                from the balancer's new-flow events, as in `netlane lb`. Measured frames visit the flows in a \
                scattered order. Two cores: the same programs, in the same turns, on a second veth pair with two \
                queues; a generator on each CPU sends its half of the flows (as RSS keeps a flow on one queue) into \
                the queue of its CPU, whose NAPI thread runs on the other CPU; Mpps per core = packets / CPU time of \
                both NAPI threads, and Mpps on all cores = that x 2 (each NAPI thread shares its CPU with a \
                generator here, so it is a capacity, not a rate seen on the wire). No device (second table): each \
                one-core slice also runs the generator chained into its program by a tail call on the balancer's \
                CPU, and the generator's next frames into xdp_tx and xdp_tx_room, timed by the kernel's live-frames \
                runner: the differences are the programs' own cost per packet, without veth and without run-time \
                statistics (whole ns; skb-path programs are not timed this way)."
                .into(),
            headline,
            options: options.object(),
            echo: options.echo(),
            tables: vec![t, bare],
            charts,
            checks,
            flags,
            notes,
            runs: records,
            cpu_plan: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(slices: Vec<Option<f64>>) -> PpsResult {
        PpsResult {
            subject: Subject::XdpTxCeiling,
            flows: 1,
            seconds: 1.0,
            packets: 1,
            mpps: 1.0,
            napi_cpu_s: 1.0,
            cores: 1,
            mpps_per_core: Some(1.0),
            slices_mpps_per_core: slices,
            prog_ns_per_packet: None,
            core_ns_per_packet: None,
            bare_ns_per_packet: None,
            over_xdp_tx_ns: None,
            room_ns: None,
            beyond_room_ns: None,
            over_xdp_tx_spread_ns: None,
            bare_slices: 0,
            hint_hit_ratio: 0.0,
            conn_hit_ratio: 0.0,
            sink_frames_all_turns: 0,
            warm_up: None,
        }
    }

    #[test]
    fn slices_pair_by_round_and_unmeasured_ones_are_left_out() {
        let a = result(vec![Some(2.0), None, Some(3.0), Some(4.0)]);
        let b = result(vec![Some(4.0), Some(4.0), Some(4.0), Some(4.0)]);
        let (s, dropped) = paired_slices(&a, &b);
        assert_eq!(dropped, 1);
        assert_eq!(s, vec![Ok(0.5), Ok(0.75), Ok(1.0)]);
    }

    fn at(flows: u32, subject: Subject, mpps: Option<f64>) -> PpsResult {
        PpsResult { subject, flows, cores: subject.cores(), mpps_per_core: mpps, ..result(vec![mpps; 6]) }
    }

    fn all(untagged_at_10k: Option<f64>) -> Vec<PpsResult> {
        let mut v = Vec::new();
        for f in [1u32, 100, 10_000, 1_000_000] {
            v.push(at(f, Subject::XdpTxCeiling, Some(4.5)));
            v.push(at(f, Subject::Balancer(HintMode::Off), if f == 10_000 { untagged_at_10k } else { Some(3.0) }));
            v.push(at(f, Subject::Balancer(HintMode::FlowTag), Some(4.2)));
            v.push(at(f, Subject::Balancer(HintMode::DestTag), Some(4.3)));
        }
        v
    }

    #[test]
    fn checks_pair_slices_and_a_program_that_measured_nothing_is_invalid() {
        let a = LbPpsArgs::defaults();
        let r = a.report(&all(Some(2.0)));
        let get = |r: &ScenarioReport, id: &str| r.checks.iter().find(|c| c.id == id).unwrap().outcome;
        assert_eq!(get(&r, "lb-pps.untagged-vs-ceiling-1"), netlane_report::Outcome::Missed, "3.0 / 4.5 < 0.7");
        assert_eq!(get(&r, "lb-pps.flow-tag-vs-untagged-10000"), netlane_report::Outcome::Met);
        assert_eq!(get(&r, "lb-pps.flow-tag-vs-untagged-1"), netlane_report::Outcome::Met, "4.2 / 3.0 = 1.4");
        assert_eq!(get(&r, "lb-pps.dest-tag-vs-untagged-100"), netlane_report::Outcome::Met);
        assert_eq!(get(&r, "lb-pps.dest-tag-1000000-vs-100"), netlane_report::Outcome::Met, "4.3 / 4.3");
        // The untagged program's NAPI thread got no CPU in any slice at 10 K flows.
        let r = a.report(&all(None));
        for id in [
            "lb-pps.untagged-vs-ceiling-10000",
            "lb-pps.flow-tag-vs-untagged-10000",
            "lb-pps.dest-tag-vs-untagged-10000",
        ] {
            assert_eq!(get(&r, id), netlane_report::Outcome::Invalid, "{id}");
        }
        assert_eq!(get(&r, "lb-pps.untagged-vs-ceiling-1"), netlane_report::Outcome::Missed, "3.0 / 4.5 < 0.7");
        assert!(r.checks.iter().all(|c| !c.id.contains("two-cores")), "no two-core check without two-core runs");
    }

    #[test]
    fn one_million_flows_against_a_hundred_divides_out_the_drift_of_the_machine() {
        let get = |v: &[PpsResult]| {
            let r = LbPpsArgs::defaults().report(v);
            r.checks.iter().find(|c| c.id == "lb-pps.dest-tag-1000000-vs-100").unwrap().outcome
        };
        let set = |v: &mut Vec<PpsResult>, f: u32, s: Subject, m: f64| {
            let i = v.iter().position(|r| r.flows == f && r.subject == s).unwrap();
            v[i] = at(f, s, Some(m));
        };
        // The machine ran 40% slower while the 1 M flows took their turns: the
        // ceiling fell as much as the tagged balancer did.
        let mut slow = all(Some(2.0));
        set(&mut slow, 1_000_000, Subject::XdpTxCeiling, 2.7);
        set(&mut slow, 1_000_000, Subject::Balancer(HintMode::DestTag), 2.58);
        assert_eq!(get(&slow), netlane_report::Outcome::Met, "(2.58 / 2.7) / (4.3 / 4.5) = 1.0");
        // The same ceiling, a tagged balancer that slowed down by itself.
        let mut worse = all(Some(2.0));
        set(&mut worse, 1_000_000, Subject::Balancer(HintMode::DestTag), 2.58);
        assert_eq!(get(&worse), netlane_report::Outcome::Missed, "(2.58 / 4.5) / (4.3 / 4.5) = 0.6");
    }

    #[test]
    fn two_core_rows_pair_with_their_one_core_program_and_have_checks_of_their_own() {
        let mut v = all(Some(2.0));
        v.push(at(100, Subject::TwoCoreCeiling, Some(4.4)));
        v.push(at(100, Subject::TwoCoreBalancer(HintMode::Off), Some(2.7)));
        v.push(at(100, Subject::TwoCoreBalancer(HintMode::FlowTag), Some(3.0)));
        v.push(at(100, Subject::TwoCoreBalancer(HintMode::DestTag), Some(3.9)));
        let r = LbPpsArgs::defaults().report(&v);
        let get = |id: &str| r.checks.iter().find(|c| c.id == id).unwrap().outcome;
        assert_eq!(get("lb-pps.two-cores-dest-tag-vs-untagged-100"), netlane_report::Outcome::Met, "3.9 / 2.7");
        assert_eq!(get("lb-pps.two-cores-flow-tag-vs-untagged-100"), netlane_report::Outcome::Missed, "3.0 / 2.7");
        let t = &r.tables[0];
        let col = |name: &str| t.columns.iter().position(|c| c.key == name).unwrap();
        let row = t
            .rows
            .iter()
            .find(|row| row.cells[col("program")] == Value::text("lb hints=off (2 cores)"))
            .expect("a two-core row");
        assert_eq!(row.cells[col("x_one_core")], Value::num(0.9), "2.7 / 3.0 per core");
        assert_eq!(row.cells[col("mpps_all_cores")], Value::num(5.4), "2 x 2.7");
        assert!(r.notes.iter().any(|n| n.starts_with("Two cores at 100 flows")), "{:?}", r.notes);
    }

    #[test]
    fn an_incomplete_warm_up_is_flagged() {
        let mut v = all(Some(2.0));
        v[1].warm_up = Some(crate::engines::lb_pps::WarmUp {
            passes: 8,
            complete: false,
            last: "only 44.0% of the frames reached the balancer".into(),
        });
        let r = LbPpsArgs::defaults().report(&v);
        assert!(r.flags.iter().any(|f| f.kind == FlagKind::Incomplete && f.message.contains("44.0%")), "{:?}", r.flags);
    }

    #[test]
    fn too_few_measured_slices_make_the_check_invalid() {
        let a = result(vec![Some(2.0), None, None, None]);
        let b = result(vec![Some(4.0); 4]);
        let (s, _) = paired_slices(&a, &b);
        let c = Spec::at_least("t", "t", 0.7, "x").evaluate(s, "");
        assert_eq!(c.outcome, netlane_report::Outcome::Invalid);
        assert!(c.reason.contains("only 1 of 4 slices"), "{}", c.reason);
    }
}

//! The lb-pps scenario's report: the rates table with each run's record and flags, the
//! table of times with no device, the charts, and the notes, each a section of its own.

use netlane_lb::HintMode;
use netlane_report::{
    Axis, Chart, ChartKind, Column, Flag, FlagKind, Point, Row, RunRecord, Scale, ScenarioReport, Series, Table, Unit,
    Value,
};

use super::LbPpsArgs;
use super::checks::{Runs, checks, paired_slices};
use crate::engines::lb_pps::{PpsResult, Subject};
use crate::plan::CpuPlan;
use crate::scenarios::{Heading, Sections};
use crate::stats::{Spread, med, median, repeat_flags, values};
use crate::verdict::{Measure, measured_median};

/// The report's title.
const TITLE: &str = "XDP load balancer: packets per second per core, hints off and on, vs XDP_TX";

/// What the scenario does, for the report's reader.
const DESCRIPTION: &str = "A generator (BPF_PROG_RUN live frames on the plan's first generator CPU) sends 64-byte TCP \
    frames of N flows over a veth pair to the balancer, which runs in the threaded NAPI of the other end pinned \
    to the plan's first balancer (napi) CPU and XDP_TXes them back into a sink. All programs of a flow count are loaded and warmed up first, then \
    take turns on the interface (six slices each, rotating order); figures are medians of a program's \
    slices, ratios are paired slice by slice. Mpps per core = packets / CPU time of that NAPI thread \
    (veth + XDP + XDP_TX), with BPF run-time statistics off; program ns/packet from those statistics, \
    on for the last quarter of each slice. Hints arrive as \
    XDP metadata written by the generator (the emulated NIC); tags are installed by the control plane \
    from the balancer's new-flow events, as in `netlane lb`. Measured frames visit the flows in a \
    scattered order. Two cores: the same programs, in the same turns, on a second veth pair with a \
    queue per CPU; a generator on each generator CPU sends its half of the flows (as RSS keeps a flow on one \
    queue) into the queue of its CPU, whose NAPI thread runs on a balancer CPU (of its own where the machine \
    has four CPUs; otherwise the other generator's, and the two-core checks are not shown); Mpps per core = \
    packets / CPU time of both NAPI threads, and Mpps on all cores = that x 2 (where a NAPI thread shares \
    its CPU with a generator, a capacity, not a rate seen on the wire). No device (second table): each \
    one-core slice also runs the generator chained into its program by a tail call on the balancer's \
    CPU, and the generator's next frames into xdp_tx and xdp_tx_room, timed by the kernel's live-frames \
    runner: the differences are the programs' own cost per packet, without veth and without run-time \
    statistics (whole ns; skb-path programs are not timed this way).";

impl LbPpsArgs {
    pub(super) fn report(&self, results: &[PpsResult], plan: &CpuPlan) -> ScenarioReport {
        let runs = Runs::of(results);
        let mut out = Sections::default();
        let records = rates_section(&runs, &mut out);
        out.tables.push(bare_table(results));
        out.checks = checks(&runs, plan);
        out.charts = charts(&runs);
        notes_section(&runs, super::plan::two_cores_apart(plan), &mut out);
        let heading = Heading { title: TITLE.into(), description: DESCRIPTION.into(), headline: headline(&runs, &out) };
        out.report(self, heading, records, super::plan::view(plan))
    }
}

/// Each program's rate at each flow count (medians of the slices), with its run record
/// and what is flagged about its slices and warm-up.
fn rates_section(runs: &Runs<'_>, out: &mut Sections) -> Vec<RunRecord> {
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
    let mut records = Vec::new();
    for (i, r) in runs.results.iter().enumerate() {
        let label = format!("{} flows, {}", r.flows, r.subject.label());
        out.flags.extend(repeat_flags(&label, "Mpps per core", &r.measured_slices()));
        if let Some(w) = &r.warm_up
            && !w.complete
        {
            out.flags.push(Flag {
                kind: FlagKind::Incomplete,
                subject: label.clone(),
                message: format!("warm-up incomplete after {} passes: {}", w.passes, w.last),
            });
        }
        t.push(rate_row(runs, r));
        records.push(record(i, r, label));
    }
    out.tables.push(t);
    records
}

/// A program's row of the rates table.
fn rate_row(runs: &Runs<'_>, r: &PpsResult) -> Row {
    let measured = r.measured_slices();
    let spread = Spread::of(&measured).and_then(|s| s.relative());
    let sample = |m: &Measure| m.clone();
    let x_ceiling = runs.find(r.flows, r.subject.ceiling()).map(|c| paired_slices(r, c).0).unwrap_or_default();
    let x_one_core = r
        .subject
        .on_one_core()
        .and_then(|o| runs.find(r.flows, o))
        .map(|one| paired_slices(r, one).0)
        .unwrap_or_default();
    let hits = |v: f64| {
        if r.subject.is_ceiling() { Value::Missing } else { Value::num(100.0 * v) }
    };
    Row::new(vec![
        Value::Int(u64::from(r.flows)),
        Value::text(r.subject.label()),
        Value::opt(r.mpps_per_core),
        Value::opt(spread.map(|s| s * 100.0)),
        if r.subject.is_ceiling() { Value::Missing } else { med(&x_ceiling, sample) },
        med(&x_one_core, sample),
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
    ])
}

/// The run record of result `i`: its figures, and the whole result as detail.
fn record(i: usize, r: &PpsResult, label: String) -> RunRecord {
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
    rec
}

/// The programs timed with no device (frames path, one core).
fn bare_table(results: &[PpsResult]) -> Table {
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

/// A way frames arrive: its chart's name, how the title says it, and its programs.
type Way = (&'static str, &'static str, fn(&Subject) -> bool);

/// Mpps per core against the flows, a chart per way frames arrive (a line per program,
/// six at most: a chart of every program would have more lines than colours), and
/// program time per packet.
fn charts(runs: &Runs<'_>) -> Vec<Chart> {
    let line = |get: fn(&PpsResult) -> (Option<f64>, Vec<f64>), scale: f64, on: &dyn Fn(&Subject) -> bool| {
        runs.subjects
            .iter()
            .filter(|s| on(s))
            .map(|s| Series {
                name: s.label(),
                points: runs
                    .flows
                    .iter()
                    .filter_map(|f| {
                        let r = runs.find(*f, *s)?;
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
            .collect::<Vec<Series>>()
    };
    let ways: [Way; 3] = [
        ("lb-pps-mpps", "XDP frames, one core", |s| matches!(s, Subject::XdpTxCeiling | Subject::Balancer(_))),
        ("lb-pps-mpps-skb", "skbs, one core", |s| matches!(s, Subject::SkbCeiling | Subject::SkbBalancer(_))),
        ("lb-pps-mpps-two-cores", "XDP frames, two cores", |s| {
            matches!(s, Subject::TwoCoreCeiling | Subject::TwoCoreBalancer(_))
        }),
    ];
    let mut charts: Vec<Chart> = ways
        .into_iter()
        .map(|(name, way, on)| Chart {
            name: name.into(),
            title: format!("Mpps per core vs flows, {way} (median of the slices, bars show their range)"),
            kind: ChartKind::Lines,
            x: Axis::numeric("flows", Unit::Count("flows".into()), Scale::Log),
            y: Axis::numeric("Mpps per core", Unit::Count("Mpps".into()), Scale::Linear),
            series: line(|r| (r.mpps_per_core, r.measured_slices()), 1.0, &on),
        })
        .filter(|c| !c.series.is_empty())
        .collect();
    charts.push(Chart {
        name: "lb-pps-prog-ns".into(),
        title: "Program time per packet vs flows (BPF run-time statistics; one core)".into(),
        kind: ChartKind::Lines,
        x: Axis::numeric("flows", Unit::Count("flows".into()), Scale::Log),
        y: Axis::numeric("time per packet", Unit::Seconds, Scale::Linear),
        series: line(|r| (r.prog_ns_per_packet, Vec::new()), 1e-9, &|s| s.cores() == 1),
    });
    charts
}

/// The notes, in the report's order: what the flow counts did to the untagged program,
/// the frames that came back, how rates and program time were measured, the skb path,
/// two cores, and the times with no device.
fn notes_section(runs: &Runs<'_>, two_cores_apart: bool, out: &mut Sections) {
    out.notes.extend(cache_note(runs));
    let returned: u64 = runs
        .flows
        .iter()
        .filter_map(|f| runs.results.iter().find(|r| r.flows == *f))
        .map(|r| r.sink_frames_all_turns)
        .sum();
    let ran: u64 = runs.results.iter().map(|r| r.packets).sum();
    out.notes.push(format!(
        "The sink got {returned} frames back for {ran} measured program runs (plus the lead-ins after each \
         switch). The rest were dropped when the balancer's XDP_TX found the generator end's ring full (that \
         end's NAPI shares the generator's CPU); the balancer had done its work on them. Frames the \
         generator sends while the balancer end's ring is full are dropped before any program runs and do \
         not count."
    ));
    out.notes.push(
        "Mpps per core is measured with the kernel's BPF run-time statistics off (they add two clock reads to \
         every program run; packets come from the programs' own per-CPU counters); program time per packet \
         comes from the last quarter of each one-core slice, with them on, and includes part of their clock \
         reads (two-core rows have none)."
            .into(),
    );
    out.notes.push(path_note(runs.results));
    if runs.results.iter().any(|r| r.subject.hint() == Some(HintMode::DestTagDirect)) {
        out.notes.push(DIRECT_NOTE.into());
    }
    out.notes.extend(two_core_note(runs, two_cores_apart));
    out.notes.extend(bare_note(runs.results));
}

/// The untagged program's time per packet at the fewest and the most flows.
fn cache_note(runs: &Runs<'_>) -> Option<String> {
    let (lo, hi) = (runs.flows.first()?, runs.flows.last()?);
    let off = Subject::Balancer(HintMode::Off);
    let (a, b) = (runs.find(*lo, off)?, runs.find(*hi, off)?);
    if hi <= lo {
        return None;
    }
    let (pa, pb) = (a.prog_ns_per_packet?, b.prog_ns_per_packet?);
    Some(format!(
        "Untagged, the program took {pa:.0} ns per packet at {lo} flows and {pb:.0} ns at {hi}: the \
         connection-table lookup misses the CPU caches once the flows' entries no longer fit. Tagged packets \
         skip that lookup, but their own per-flow state (tag entries, the rx-hash cache) grows too. The talk's \
         10 K-flow finding is about that: on one core the tagged path gained almost nothing at 10 K flows, \
         which it put down to cache misses on per-flow state, and it proposed marking per destination \
         instead; the tagged-vs-untagged checks at the larger flow counts say how that holds here."
    ))
}

/// What the direct variant of destination tags skips, and why it is not the default.
const DIRECT_NOTE: &str = "dest-tag-direct is the talk's \"marked packets skip parsing\": a destination tag goes from \
     the IP header's checks (and that the tagged real's VIP has the packet's address and protocol) straight to \
     encapsulation; of the transport header only the ports are read, for the outer header's hash. dest-tag, the \
     default, parses the transport header and holds the tagged real's VIP to the packet's port. The direct variant \
     is not the default because it trusts the classifier to have matched the VIP's port (a rule on the destination \
     address alone would send another port's traffic, even another VIP's on that address, to the tagged real) and \
     forwards a transport header cut short after the ports for the real's stack to drop. The gap between the two is \
     the cost of the parsing skipped: compare their rates, and their ns per packet with no device. Its hint hits are \
     the packets that took the direct path.";

/// Whether the skb path (and so the device-bound build) was measured.
fn path_note(results: &[PpsResult]) -> String {
    if results.iter().any(|r| matches!(r.subject, Subject::SkbCeiling | Subject::SkbBalancer(_))) {
        "Rows marked skb: the same programs on frames that a packet socket sends through the generator \
             end's stack, so they reach the balancer as skbs; veth then has an RX hash, and the device-bound \
             build (kfunc) reads it: the kernel's flow hash (rx-hash), or the tag the TCX classifier on the \
             sending end set (the tag modes; each mode's classifier is attached only in its turns). An skb \
             costs the veth path far more than an XDP frame (compare the two ceilings' core ns per packet), so \
             compare skb rows with each other. On veth the RX hash is not free: the kfunc makes the kernel \
             compute the flow hash (rx-hash program time) unless the classifier has set one."
            .into()
    } else {
        "The device-bound build (hints from the bpf_xdp_metadata_rx_hash kfunc) was not measured (--no-skb, \
             or no flow count up to 10,000): veth only has an RX hash for packets that arrive as skbs."
            .into()
    }
}

/// Each program on two cores at the first flow count measured there, against its
/// one-core rate.
fn two_core_note(runs: &Runs<'_>, apart: bool) -> Option<String> {
    let find = |f: u32, s: Subject| runs.find(f, s);
    let f = runs.flows.iter().copied().find(|f| find(*f, Subject::TwoCoreBalancer(HintMode::Off)).is_some())?;
    let part = |s: Subject| -> Option<String> {
        let two = find(f, s)?;
        let per_core = two.mpps_per_core?;
        let vs_one = s
            .on_one_core()
            .and_then(|o| find(f, o))
            .map(|one| values(&paired_slices(two, one).0, |m: &Measure| m.clone()))
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
        Subject::TwoCoreBalancer(HintMode::DestTagDirect),
    ]
    .into_iter()
    .filter_map(part)
    .collect();
    let shared = if apart {
        ""
    } else {
        " Each CPU runs a generator, a balancer NAPI thread and a sink thread here (the plan could not keep \
         them apart)."
    };
    Some(format!(
        "Two cores at {f} flows: {}.{shared} The two-core turns keep the NAPI threads busier than the one-core \
         turns do (NAPI busy %: bigger batches, fewer wake-ups per packet). So a rate on two cores against \
         the same program's on one core is not only the cost of the second core; compare programs with each \
         other and with the two-core ceiling on two cores.",
        parts.join("; ")
    ))
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
    let tagged: Vec<String> = [HintMode::FlowTag, HintMode::DestTag, HintMode::DestTagDirect]
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

/// The headline: the talk's claim, tagged packets against untagged at the fewest flows
/// (flow tags and destination tags), then destination tags at the most flows, as their
/// checks measured them; without tagged runs, untagged against the ceiling.
fn headline(runs: &Runs<'_>, out: &Sections) -> String {
    let get = |id: &str| measured_median(&out.checks, id);
    let (lo, hi) = (runs.flows.first().copied().unwrap_or(1), runs.flows.last().copied().unwrap_or(1));
    let at = |tag: &str, f: u32| get(&format!("lb-pps.{tag}-vs-untagged-{f}"));
    let dest = match (at("dest-tag", lo), at("dest-tag-direct", lo)) {
        (Some(b), Some(d)) => Some(format!("destination tags at {b}x (skipping the transport header: {d}x)")),
        (Some(b), None) => Some(format!("destination tags at {b}x")),
        (None, Some(d)) => Some(format!("destination tags that skip the transport header at {d}x")),
        (None, None) => None,
    };
    let few = match (at("flow-tag", lo), dest) {
        (Some(a), Some(d)) => Some(format!("flow tags ran at {a}x and {d}")),
        (Some(a), None) => Some(format!("flow tags ran at {a}x")),
        (None, Some(d)) => Some(format!("{d} ran")),
        (None, None) => None,
    };
    let many = (hi > lo).then(|| at("dest-tag", hi)).flatten();
    match (few, many) {
        (Some(few), Some(b)) => format!(
            "At {lo} flow(s), {few} the untagged balancer's packets per core; at {hi} flows destination tags ran at \
             {b}x."
        ),
        (Some(few), None) => format!("At {lo} flow(s), {few} the untagged balancer's packets per core."),
        (None, _) => match get(&format!("lb-pps.untagged-vs-ceiling-{lo}")) {
            Some(a) => format!("Untagged, the balancer ran at {a}x the XDP_TX ceiling at {lo} flows."),
            None => format!("{} programs at {} flow counts.", runs.subjects.len(), runs.flows.len()),
        },
    }
}

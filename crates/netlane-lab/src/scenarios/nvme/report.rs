//! The nvme scenario's report, built from sections: each part's table, charts and notes,
//! the repeats' flags, the headline, and the table of one perf run.

use netlane::metrics::Summary;
use netlane_nvme::perf::PerfReport;

use super::checks::{
    Results, host_us_per_io, iops, lat, opt, p50, p9999, per_core, target_busy_pct, us, writer_mb_per_s,
};
use super::options::{NvmeBenchArgs, Part, size_name};
use super::plan::{Mode, SWEEP_JOBS, sweep_label};
use crate::scenarios::net::PathKind;
use crate::scenarios::{Heading, Sections};
use crate::stats::{Spread, med, repeat_flags, sig, values};
use crate::verdict::{Measure, join_headline, measured_median, paired, positive};
use netlane_report::{
    Axis, Chart, ChartKind, Check, Column, Flag, Point, Row, RunRecord, Scale, ScenarioReport, Series, Table, Unit,
    Value, format,
};

/// The spread of `f` over the rounds, in percent of its median.
fn spread(rs: &[PerfReport], f: fn(&PerfReport) -> Measure) -> Value {
    Value::opt(Spread::of(&values(rs, f)).and_then(|s| s.relative()).map(|r| r * 100.0))
}

/// The readers' latency percentile `f`, in microseconds.
fn us_of(f: fn(&Summary) -> u64) -> impl Fn(&PerfReport) -> Measure {
    move |r| lat(r, f, "latency").map(|v| v / 1e3)
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

/// Collapsed and noisy repeats of each mode's IOPS.
fn flags(modes: &[Mode], all: &[Vec<PerfReport>]) -> Vec<Flag> {
    let mut flags = Vec::new();
    for (m, rs) in modes.iter().zip(all) {
        flags.extend(repeat_flags(&m.what(), "IOPS", &values(rs, iops)));
    }
    flags
}

/// Which threads the CPU figures include, from the last run, and the share of the
/// host's that its NAPI threads took.
fn cpu_note(all: &[Vec<PerfReport>]) -> String {
    let last = all.iter().flatten().last();
    let napi = last.map(|r| r.host_napi_threads.join(", ")).filter(|s| !s.is_empty());
    let target = last.map(|r| r.target_threads.join(", ")).filter(|s| !s.is_empty());
    let shares: Vec<f64> = all
        .iter()
        .flatten()
        .filter_map(|r| Some(r.host_napi_cpu_us_per_io? / host_us_per_io(r).ok()? * 100.0))
        .collect();
    format!(
        "CPU figures: the host's (host CPU us/IO, IOPS per host core) are nvme perf's process and {}; the target's \
         are its process{}.{}",
        napi.map_or(
            "no NAPI thread (its receive work runs in softirq context, in whatever it interrupts)".into(),
            |n| { format!("the host end's NAPI thread(s) {n}, where its receive work runs") }
        ),
        target.map_or(String::new(), |t| format!(" and the target end's NAPI thread(s) {t}")),
        if shares.is_empty() {
            String::new()
        } else {
            format!(
                " The NAPI threads took {:.0}% of the host's CPU (median over runs); on a veth, segments the target \
                 sends with TSO skip the host's NAPI and are taken in by the target's own send.",
                crate::stats::median(shares)
            )
        }
    )
}

impl NvmeBenchArgs {
    pub(super) fn report(
        &self,
        modes: &[Mode],
        all: &[Vec<PerfReport>],
        lanes: Option<&super::lanes::LanesOutcome>,
        runs: Vec<RunRecord>,
    ) -> ScenarioReport {
        let found = Results { modes, all };
        let mut out = Sections::default();
        if self.parts.contains(&Part::Qd1) {
            self.qd1_section(found, &mut out);
        }
        if self.parts.contains(&Part::Qd32) {
            self.qd32_section(found, &mut out);
        }
        if self.parts.contains(&Part::Mixed) {
            self.mixed_section(found, &mut out);
            self.mixed_floor_note(found, &mut out);
            self.mixed_writer_note(found, &mut out);
        }
        if self.parts.contains(&Part::Affinity) {
            self.affinity_section(found, &mut out);
        }
        if self.parts.contains(&Part::Caravans) {
            self.caravans_section(found, &mut out);
        }
        if self.parts.contains(&Part::Polling) {
            self.polling_section(found, &mut out);
        }
        if all.iter().any(|rs| !rs.is_empty()) {
            out.notes.push(cpu_note(all));
        }
        out.checks = self.checks(found);
        self.lanes_section(lanes, &mut out);
        let lanes_done = lanes.and_then(|l| l.as_ref().ok());
        out.flags = flags(modes, all);
        for (m, rs) in super::lanes::LANE_MODES.iter().zip(lanes_done.map_or(&[][..], |l| &l.runs[..])) {
            out.flags.extend(repeat_flags(&format!("lanes {}", m.label()), "IOPS", &values(rs, |r| iops(&r.perf))));
        }
        let lane_modes = lanes_done.map_or(0, |l| l.runs.len());
        let heading = Heading {
            title: "NVMe/TCP: QD1 latency, QD32 IOPS per core, mixed workload queue maps".into(),
            description: self.description(),
            headline: self.headline(&out.checks, modes.len() + lane_modes),
        };
        let mut plan = Vec::new();
        if !modes.is_empty() {
            plan = crate::plan::as_given(&[
                (crate::plan::Role::Generator, &[self.host_cpu]),
                (crate::plan::Role::Server, &[self.target_cpu()]),
            ]);
        }
        // The lanes part's roles, by its own plan.
        plan.extend(lanes_done.into_iter().flat_map(|l| l.plan.view()).map(|mut r| {
            r.role = format!("lanes part {}", r.role);
            r
        }));
        out.report(self, heading, runs, plan)
    }

    /// The setup: the path, and where host and target run on this machine.
    fn description(&self) -> String {
        if self.on.testbed.is_some() {
            return format!(
                "A user-space NVMe/TCP host (netlane nvme perf, its jobs and queue workers on CPU {} of the testbed's \
                 first client host) against netlane's target (one reactor on CPU {} of its server host), over the \
                 testbed's network; the mixed workload's writer is unbound. Latency is from submission to \
                 completion in the job thread. In the affinity part, \"crossed\" runs the queue's I/O worker on \
                 another CPU of the host's machine.",
                self.host_cpu,
                self.target_cpu()
            );
        }
        format!(
            "A user-space NVMe/TCP host (netlane nvme perf) against netlane's target over {}. CPU split on this \
             {}-CPU machine: the host (jobs, queue workers{}) on CPU {}, the target (one reactor{}) on CPU {}; the \
             mixed workload's writer is unbound. Latency is from submission to completion in the job thread. \
             In the affinity part, \"crossed\" runs the queue's I/O worker on the target's CPU: on a 2-CPU \
             machine that also gives the host a second CPU, which the talk's many-core machine never lacked. \
             The lanes part runs apart: four hosts and a target with two reactors, placed by its own plan.",
            match self.path {
                PathKind::Veth => "a veth pair between two network namespaces",
                PathKind::Loopback => "loopback",
            },
            netlane::cpus::online_count(),
            if self.path == PathKind::Veth { ", the host end's threaded NAPI" } else { "" },
            self.host_cpu,
            if self.path == PathKind::Veth { ", the target end's threaded NAPI" } else { "" },
            self.target_cpu()
        )
    }

    fn headline(&self, checks: &[Check], modes: usize) -> String {
        let get = |id: &str| measured_median(checks, id);
        let parts = [
            get("nvme.qd1-polling").map(|v| format!("polling took QD1 p50 to {v}x of direct send's")),
            get("nvme.qd32-batching").map(|v| format!("batching gave {v}x the IOPS per host core")),
            get("nvme.mixed-read-p9999").map(|v| format!("separate queue maps cut the readers' p99.99 {v}x")),
            get("nvme.lanes-target-cpu").map(|v| format!("lanes took the target's CPU per I/O to {v}x")),
        ];
        join_headline(parts.into_iter().flatten().collect())
            .unwrap_or_else(|| format!("{modes} modes, {} rounds.", self.repeat))
    }

    /// QD1 latency of each mode: a table and the percentiles' chart.
    fn qd1_section(&self, found: Results<'_>, out: &mut Sections) {
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
                Column::new("host_cpu_us_per_io", "host CPU us/IO (+NAPI)", 2),
                Column::new("target_cpu_us_per_io", "target CPU us/IO", 2),
                Column::new("host_switches_per_io", "switches/IO", 2),
                Column::new("p50_spread_pct", "p50 spread %", 0),
            ],
        );
        let mut series = Vec::new();
        for label in ["I/O worker", "direct send", "poll queue"] {
            let Some(rs) = found.find(Part::Qd1, label) else { continue };
            t.push(Row::new(vec![
                Value::text(label),
                med(rs, iops),
                med(rs, us_of(|s| s.p50)),
                med(rs, us_of(|s| s.p90)),
                med(rs, us_of(|s| s.p99)),
                med(rs, us_of(|s| s.p999)),
                med(rs, us_of(|s| s.p9999)),
                med(rs, host_us_per_io),
                med(rs, |r| opt(r.target_cpu_us_per_io, "target CPU per I/O")),
                med(rs, |r| opt(r.host_switches_per_io, "switches per I/O")),
                spread(rs, p50),
            ]));
            series.push(percentile_series(label, rs, 0));
        }
        out.tables.push(t);
        out.charts.push(Chart {
            name: "nvme-qd1".into(),
            title: "QD1 4 KiB random read: latency by percentile".into(),
            kind: ChartKind::Percentiles,
            x: Axis::numeric("percentile", Unit::Nines, Scale::Linear),
            y: Axis::numeric("latency", Unit::Seconds, Scale::Log),
            series,
        });
    }

    /// QD32 IOPS per host core of each mode: a table, its chart, and the commands each
    /// send carried.
    fn qd32_section(&self, found: Results<'_>, out: &mut Sections) {
        let mut t = Table::new(
            "nvme-qd32",
            format!("QD32 4 KiB random read on one host core, medians of {} rounds", self.repeat),
            vec![
                Column::new("mode", "mode", 0),
                Column::new("iops", "IOPS", 0),
                Column::new("iops_per_host_core", "IOPS per host core", 0),
                Column::new("cmds_per_send", "commands/send", 1),
                Column::new("wakes_per_io", "worker wake-ups/IO", 2),
                Column::new("host_cpu_us_per_io", "host CPU us/IO (+NAPI)", 2),
                Column::new("host_switches_per_io", "switches/IO", 2),
                Column::new("p50_us", "p50 us", 1),
                Column::new("p9999_us", "p99.99 us", 1),
                Column::new("spread_pct", "spread %", 0),
            ],
        );
        let mut points = Vec::new();
        let labels = super::plan::QD32_MODES;
        for (x, label) in labels.iter().enumerate() {
            let Some(rs) = found.find(Part::Qd32, label) else { continue };
            t.push(Row::new(vec![
                Value::text(*label),
                med(rs, iops),
                med(rs, per_core),
                med(rs, |r| opt(r.cmds_per_send, "sends")),
                med(rs, |r| opt(r.worker_wakes_per_io, "wake-ups per I/O")),
                med(rs, host_us_per_io),
                med(rs, |r| opt(r.host_switches_per_io, "switches per I/O")),
                med(rs, us_of(|s| s.p50)),
                med(rs, us_of(|s| s.p9999)),
                spread(rs, per_core),
            ]));
            points.extend(Point::of(x as f64, &values(rs, per_core)));
        }
        out.tables.push(t);
        out.charts.push(Chart {
            name: "nvme-qd32".into(),
            title: "QD32 4 KiB random read: IOPS per host CPU-second".into(),
            kind: ChartKind::Bars,
            x: Axis::categories("mode", labels.iter().map(|s| s.to_string()).collect()),
            y: Axis::numeric("IOPS per host core", Unit::Count("IOPS".into()), Scale::Linear),
            series: vec![Series { name: "IOPS per host core".into(), points }],
        });
        if let (Some(c), Some(b)) = (found.find(Part::Qd32, "caravans"), found.find(Part::Qd32, "batched"))
            && let (Value::Num(cc), Value::Num(bc)) =
                (med(c, |r| opt(r.cmds_per_send, "sends")), med(b, |r| opt(r.cmds_per_send, "sends")))
        {
            out.notes.push(format!(
                "Caravans put {cc:.1} commands in each send, plain batching {bc:.1} (a fact of how each sends, \
                 counted by the host, not a target)."
            ));
        }
    }

    /// The mixed workload's readers under each queue map: a table, their latency by
    /// percentile and their IOPS.
    fn mixed_section(&self, found: Results<'_>, out: &mut Sections) {
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
            let Some(rs) = found.find(Part::Mixed, label) else { continue };
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
        out.tables.push(t);
        out.charts.push(Chart {
            name: "nvme-mixed".into(),
            title: "Mixed workload: the 16 readers' latency by percentile".into(),
            kind: ChartKind::Percentiles,
            x: Axis::numeric("percentile", Unit::Nines, Scale::Linear),
            y: Axis::numeric("read latency", Unit::Seconds, Scale::Log),
            series,
        });
        out.charts.push(Chart {
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
    }

    /// What bounds the mixed part's ratio: a perfect queue map would give the readers
    /// their latency without a writer, so shared / alone is the most any map could
    /// reach on this machine.
    fn mixed_floor_note(&self, found: Results<'_>, out: &mut Sections) {
        let (Some(shared), Some(sep), Some(alone)) = (
            found.find(Part::Mixed, "shared map"),
            found.find(Part::Mixed, "separate maps"),
            found.find(Part::Mixed, "readers alone"),
        ) else {
            return;
        };
        let ratios = |a, b| -> Option<Spread> {
            Spread::of(&paired(a, b, p9999).into_iter().filter_map(Result::ok).collect::<Vec<_>>())
        };
        if let (Some(ceiling), Some(gap), Value::Num(floor)) =
            (ratios(shared, alone), ratios(sep, alone), med(alone, p9999))
        {
            out.notes.push(format!(
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

    /// Where the writer's throughput goes with separate maps, from the runs: how much
    /// more the readers did, and how busy the target's CPU was in both.
    fn mixed_writer_note(&self, found: Results<'_>, out: &mut Sections) {
        let (Some(shared), Some(sep)) =
            (found.find(Part::Mixed, "shared map"), found.find(Part::Mixed, "separate maps"))
        else {
            return;
        };
        let ratio = |f: fn(&PerfReport) -> Measure| {
            Spread::of(&paired(sep, shared, f).into_iter().filter_map(Result::ok).collect::<Vec<_>>())
        };
        let (Some(writer), Some(readers)) = (ratio(writer_mb_per_s), ratio(iops)) else { return };
        let (busy_shared, busy_sep) = (med(shared, target_busy_pct), med(sep, target_busy_pct));
        let said = |v: &Value| match v {
            Value::Num(v) => format!("{v:.0}%"),
            _ => "unread".to_string(),
        };
        let why = match (&busy_shared, &busy_sep) {
            (Value::Num(a), Value::Num(b)) if a.min(*b) >= 90.0 => {
                "The target's CPU was full in both: the readers' extra commands took CPU the writer had (one reactor \
                 on one CPU here, where the talk's target had cores to spare)."
            }
            (Value::Num(_), Value::Num(_)) => "The target's CPU was not full: the writer's loss is not its CPU.",
            _ => "The target's CPU was not read (a testbed): what the writer lost to is not known.",
        };
        out.notes.push(format!(
            "The writer with separate maps: {}x its MB/s with a shared map ({}..{}), while the readers did {}x their \
             IOPS ({}..{}); the target's CPU (its reactor, and its NAPI thread where counted) was {} busy with a shared \
             map and {} with separate maps. {why}",
            sig(writer.median),
            sig(writer.min),
            sig(writer.max),
            sig(readers.median),
            sig(readers.min),
            sig(readers.max),
            said(&busy_shared),
            said(&busy_sep)
        ));
    }

    /// QD1 latency and QD32 IOPS per host core with the I/O worker aligned and crossed.
    fn affinity_section(&self, found: Results<'_>, out: &mut Sections) {
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
                Column::new("host_cpu_us_per_io", "host CPU us/IO (+NAPI)", 2),
                Column::new("host_switches_per_io", "switches/IO", 2),
            ],
        );
        for label in ["QD1 aligned", "QD1 crossed", "QD32 aligned", "QD32 crossed"] {
            let Some(rs) = found.find(Part::Affinity, label) else { continue };
            t.push(Row::new(vec![
                Value::text(label),
                med(rs, iops),
                med(rs, per_core),
                med(rs, us_of(|s| s.p50)),
                med(rs, us_of(|s| s.p99)),
                med(rs, host_us_per_io),
                med(rs, |r| opt(r.host_switches_per_io, "switches per I/O")),
            ]));
        }
        out.tables.push(t);
    }

    /// Caravans against plain batching in each cell of the sweep: a table, the ratio by
    /// request size, and the cells where caravans won every round.
    fn caravans_section(&self, found: Results<'_>, out: &mut Sections) {
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
                    found.find(Part::Caravans, &sweep_label("batched", bs, *jobs)),
                    found.find(Part::Caravans, &sweep_label("caravans", bs, *jobs)),
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
        out.tables.push(t);
        out.charts.push(Chart {
            name: "nvme-caravans".into(),
            title: "Caravans / plain batching, IOPS per host core, by request size".into(),
            kind: ChartKind::Lines,
            x: Axis::categories("request size", self.caravan_sizes.iter().map(|b| size_name(*b)).collect()),
            y: Axis::numeric("caravans / batched", Unit::Ratio, Scale::Linear),
            series,
        });
        out.notes.push(if won.is_empty() {
            "Caravans won in no cell of the sweep (no size and job count where every round's ratio was above 1)."
                .to_string()
        } else {
            format!("Caravans beat plain batching in every round at: {}.", won.join(", "))
        });
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

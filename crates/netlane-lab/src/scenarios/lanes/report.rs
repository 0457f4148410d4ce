//! The lanes scenario's report: tables, charts, checks and notes from every round.

use crate::plan::{CpuPlan, Role};
use crate::scenarios::{Heading, Sections, discarded_note};
use crate::stats::repeat_flags;
use crate::verdict::{Measure, Spec, join_headline, measured_and_target, measured_median, paired, positive};
use netlane_report::{
    Axis, Chart, ChartKind, Check, Column, Point, Row, RunRecord, Scale, ScenarioReport, Series, Table, Unit, Value,
};

use super::isolation::IsoRun;
use super::*;

/// The report's title.
const TITLE: &str =
    "Lanes: connections on the thread that owns their receive queue, against plain workers and memcached";

/// The check of the threaded-busy mode.
const THREADED_CHECK: &str = "lanes.threaded-busy-poll";

/// The threaded-busy mode's check when this kernel refused threaded busy polling: not
/// shown here, with the kernel's answer.
pub(super) fn threaded_not_here(report: &mut ScenarioReport, why: &str) {
    let name = "NAPI threads that busy poll hold more within the SLA than NAPI-id lanes woken by the device";
    let check = Spec::at_least(THREADED_CHECK, name, 1.0, "x")
        .not_shown_for("a kernel whose NAPI threads can busy poll (netdev netlink napi-set threaded=busy-poll)", why);
    match report.checks.iter_mut().find(|c| c.id == THREADED_CHECK) {
        Some(c) => *c = Check { name: c.name.clone(), ..check },
        None => report.checks.push(check),
    }
    report.notes.push(format!("threaded-busy was left out: {why}."));
}

/// A mode's rounds, when the mode ran.
pub(crate) type Find<'a> = dyn Fn(Mode) -> Option<&'a [LaneRound]> + 'a;

/// Mode `a` against mode `b`, paired by round on `of`; skipped when either did not run.
/// Busy-polling workers spin on their CPUs: beside the generator's threads (`plan`: this
/// machine's, where they share CPUs) they take its time and the comparison would
/// measure that, so it is not shown.
pub(crate) fn pair_check(
    spec: Spec,
    (a, b): (Mode, Mode),
    find: &Find<'_>,
    plan: Option<&CpuPlan>,
    of: impl Fn(&LaneRound) -> Measure,
    what: &str,
) -> Check {
    let shared = plan.filter(|p| !p.apart(Role::Lane, Role::Generator));
    match (find(a).zip(find(b)), shared.filter(|_| a.busy_polls() || b.busy_polls())) {
        (Some(_), Some(plan)) => spec.not_shown(
            plan.needs(&[Role::Lane, Role::Generator]),
            plan.available(),
            "busy-polling lanes and the generator's threads apart",
            &plan.describe(),
        ),
        (Some((x, y)), None) => spec.evaluate(paired(x, y, of), what),
        (None, _) => spec.skipped(format!("needs the {} and {} modes", a.name(), b.name())),
    }
}

impl LanesBenchArgs {
    pub(crate) fn report(
        &self,
        all: &[Vec<LaneRound>],
        iso: &[Vec<IsoRun>],
        plan: Option<&CpuPlan>,
        placed: &[(u32, u32, usize)],
        runs: Vec<RunRecord>,
    ) -> ScenarioReport {
        let mut out = Sections::default();
        let made_again = all.iter().flatten().flat_map(|r| r.runs.iter().map(|x| x.discarded)).sum::<u32>()
            + iso.iter().flatten().map(|r| r.discarded).sum::<u32>();
        out.notes.extend(discarded_note(made_again));
        let find = |m: Mode| self.modes.iter().position(|x| *x == m).map(|i| &all[i][..]);
        if !self.no_search {
            self.sla_section(all, &find, plan, &mut out);
            self.sweep_section(&find, plan, &mut out);
        }
        self.rates_section(all, &mut out);
        self.tail_checks(&find, plan, &mut out);
        self.placement_section(all, &mut out);
        self.tx_queue_section(all, &mut out);
        if let Some(rfs) = find(Mode::Rfs).and_then(<[LaneRound]>::last).and_then(|r| r.rfs.as_ref()) {
            out.notes.push(format!("rfs ran with {rfs}."));
        }
        if !iso.is_empty() {
            let (t, c, n) = super::isolation::report(self, iso);
            out.tables.push(t);
            out.checks.extend(c);
            out.notes.extend(n);
        }
        if let Some(plan) = plan {
            self.plan_notes(plan, placed, &mut out);
        }
        let heading =
            Heading { title: TITLE.into(), description: self.description(), headline: self.headline(&out.checks) };
        out.report(self, heading, runs, plan.map(CpuPlan::view).unwrap_or_default())
    }

    fn description(&self) -> String {
        let placed = if self.on.testbed.is_some() {
            "netlane's cache server on a testbed's server host with a worker (lane) per CPU the testbed gives it, \
             its interface's NAPI as the testbed leaves it, netlane's open-loop generator on the client hosts"
                .to_string()
        } else {
            format!(
                "netlane's cache server in one namespace with {LANES} workers (lanes), netlane's open-loop generator \
                 in another with {LANES} threads, joined by a veth with a queue per lane, each queue's NAPI thread \
                 pinned; the CPU plan places them (apart where the machine has the CPUs)"
            )
        };
        format!(
            "{placed}. Modes: {}. \
             Busy polling of napi-busy and plain-busy: {}; memcached -N runs with net.core.busy_poll={} us. The key space ({} keys) is \
             stored before each mode's round. A rate of the search is decided by three runs of {} of five, or two that agree far from the bound.",
            self.modes.iter().map(|m| m.name()).collect::<Vec<_>>().join(", "),
            self.busy_poll,
            self.memcached_busy_poll,
            self.workload.keys,
            netlane_report::format::seconds(self.step.as_secs_f64())
        )
    }

    /// The highest rate each mode held within the SLA, and the throughput checks.
    /// `plan`: this machine's (none: lanes and generators on machines of their own).
    fn sla_section(&self, all: &[Vec<LaneRound>], find: &Find<'_>, plan: Option<&CpuPlan>, out: &mut Sections) {
        let mut t = Table::new(
            "lanes-sla",
            format!(
                "Highest offered rate within {}, {} connections, medians of {} rounds",
                self.sla, self.connections[0], self.repeat
            ),
            vec![
                Column::new("mode", "mode", 0),
                Column::new("sla_per_s", &format!("requests/s within {}", self.sla), 0),
            ],
        );
        let mut points = Vec::new();
        for (i, m) in self.modes.iter().enumerate() {
            t.push(Row::new(vec![Value::text(m.name()), med(&all[i], best)]));
            let v: Vec<f64> = all[i].iter().filter_map(|r| best(r).ok()).collect();
            out.flags.extend(repeat_flags(&format!("{} within {}", m.name(), self.sla), "requests/s", &v));
            points.extend(Point::of(i as f64, &v));
        }
        out.tables.push(t);
        out.charts.push(Chart {
            name: "lanes-sla".into(),
            title: format!("Requests/s within {} by placement", self.sla),
            kind: ChartKind::Bars,
            x: Axis::categories("mode", self.modes.iter().map(|m| m.name().to_string()).collect()),
            y: Axis::numeric("requests/s", Unit::Count("requests/s".into()), Scale::Linear),
            series: vec![Series { name: "requests/s".into(), points }],
        });
        let pairs: [(&str, String, f64, Mode, Mode); 6] = [
            (
                "lanes.aligned-throughput",
                format!("NAPI-id lanes hold more requests/s within {} than plain workers (talk: +70%)", self.sla),
                1.7,
                Mode::Napi,
                Mode::Plain,
            ),
            (
                "lanes.busy-poll-throughput",
                format!("busy polling adds requests/s within {} to NAPI-id lanes", self.sla),
                1.0,
                Mode::NapiBusy,
                Mode::Napi,
            ),
            (
                "lanes.handoff-over-reuseport",
                format!(
                    "the acceptor's NAPI-id hand-off holds more within {} than the no-change reuseport path (talk: 10-15%)",
                    self.sla
                ),
                1.1,
                Mode::Napi,
                Mode::Reuseport,
            ),
            (
                "lanes.napi-id-change",
                format!(
                    "the NAPI-id change holds more within {} than busy-polling plain workers with paired queues, \
                     the unmodified application's ADQ (talk: 10-15%)",
                    self.sla
                ),
                1.1,
                Mode::NapiBusy,
                Mode::PlainBusy,
            ),
            (
                "lanes.napi-over-rfs",
                format!(
                    "NAPI-id lanes hold more within {} than plain workers with RFS, the kernel's own steering",
                    self.sla
                ),
                1.0,
                Mode::Napi,
                Mode::Rfs,
            ),
            (
                THREADED_CHECK,
                format!(
                    "NAPI threads that busy poll hold more within {} than NAPI-id lanes woken by the device",
                    self.sla
                ),
                1.0,
                Mode::ThreadedBusy,
                Mode::Napi,
            ),
        ];
        for (id, name, target, a, b) in pairs {
            let spec = Spec::at_least(id, name, target, "x");
            let what = format!("{} / {} requests/s within {}, per round", a.name(), b.name(), self.sla);
            out.checks.push(pair_check(spec, (a, b), find, plan, best, &what));
        }
    }

    /// The fixed offered rates: latency, CPU and the kernel's events per request.
    fn rates_section(&self, all: &[Vec<LaneRound>], out: &mut Sections) {
        let mut t = Table::new(
            "lanes-rates",
            format!(
                "Fixed offered rates (Poisson), medians of {} rounds; per request: over {}",
                self.repeat,
                if self.on.testbed.is_some() {
                    "every CPU of the server's machine".to_string()
                } else {
                    format!("all {} CPUs of the machine", netlane::cpus::online_count())
                }
            ),
            vec![
                Column::new("mode", "mode, connections, offered", 0),
                Column::new("achieved_per_s", "achieved/s", 0),
                Column::new("mean_us", "mean us", 1),
                Column::new("p99_us", "p99 us", 1),
                Column::new("p999_us", "p99.9 us", 1),
                Column::new("cpu_us", "CPU us/request", 2),
                Column::new("ctxt", "context switches/request", 2),
                Column::new("irq", "interrupts/request", 2),
                Column::new("ipi", "IPIs/request", 2),
                Column::new("net_rx", "NET_RX softirqs/request", 2),
            ],
        );
        for (i, m) in self.modes.iter().enumerate() {
            for (j, (c, r)) in
                self.connections.iter().flat_map(|c| self.rates.iter().map(move |r| (*c, *r))).enumerate()
            {
                let rs: Vec<LaneRun> = all[i].iter().filter_map(|x| x.runs.get(j).cloned()).collect();
                t.push(Row::new(vec![
                    Value::text(format!("{} {c} {r}/s", m.name())),
                    med(&rs, |x| Ok(x.load.achieved_per_s)),
                    med(&rs, mean),
                    med(&rs, latency("p99")),
                    med(&rs, latency("p99.9")),
                    med(&rs, cpu_per_request),
                    med(&rs, |x| per_request(x, x.kernel.ctxt)),
                    med(&rs, |x| per_request(x, x.kernel.interrupts_total())),
                    med(&rs, |x| per_request(x, x.kernel.ipis())),
                    med(&rs, |x| per_request(x, x.kernel.softirq("NET_RX"))),
                ]));
            }
        }
        out.tables.push(t);
    }

    /// The tail at the highest load of the first connection count: aligned against
    /// plain, and the NAPI-id change against the unmodified application's ADQ.
    fn tail_checks(&self, find: &Find<'_>, plan: Option<&CpuPlan>, out: &mut Sections) {
        let j = self.rates.len() - 1;
        fn p999(r: &LaneRun) -> Measure {
            latency("p99.9")(r)
        }
        type Of = fn(&LaneRun) -> Measure;
        let (aligned, change) = ((Mode::Napi, Mode::Plain), (Mode::NapiBusy, Mode::PlainBusy));
        type Tail = (&'static str, &'static str, f64, Of, (Mode, Mode));
        let tails: [Tail; 4] = [
            (
                "lanes.aligned-p999",
                "NAPI-id lanes' p99.9 against plain workers' at the highest fixed rate (talk: -60%)",
                0.4,
                p999,
                aligned,
            ),
            (
                "lanes.aligned-mean",
                "NAPI-id lanes' mean latency against plain workers' (talk: -60%)",
                0.4,
                mean,
                aligned,
            ),
            (
                "lanes.aligned-cpu",
                "NAPI-id lanes spend less CPU per request than plain workers (no cross-CPU wake-ups)",
                0.9,
                cpu_per_request,
                aligned,
            ),
            (
                "lanes.napi-id-change-p999",
                "the NAPI-id change lowers busy-polling workers' p99.9 at the highest fixed rate (talk: where the \
                 tail shows it)",
                1.0,
                p999,
                change,
            ),
        ];
        for (id, name, target, f, (a, b)) in tails {
            let spec = Spec::at_most(id, name, target, "x");
            let what = format!(
                "{} / {} at {} connections, {}/s, per round",
                a.name(),
                b.name(),
                self.connections[0],
                self.rates[j]
            );
            let of = |r: &LaneRound| r.runs.get(j).ok_or_else(|| "no run".to_string()).and_then(f);
            out.checks.push(pair_check(spec, (a, b), find, plan, of, &what));
        }
    }

    /// Where connections went, from the lanes' own counters (last round), and the knobs
    /// the kernel refused.
    fn placement_section(&self, all: &[Vec<LaneRound>], out: &mut Sections) {
        let mut t = Table::new(
            "lanes-placement",
            "netlane's lanes: NAPI ids owned and connections placed (last round)".to_string(),
            vec![
                Column::new("lane", "mode, lane", 0),
                Column::new("cpu", "CPU", 0),
                Column::new("napi", "NAPI ids", 0),
                Column::new("by_owner", "by NAPI id owner", 0),
                Column::new("other", "by load or round robin", 0),
                Column::new("handed_over", "handed over", 0),
            ],
        );
        for (i, m) in self.modes.iter().enumerate() {
            let Some(v) = all[i].last().and_then(|r| r.lanes.as_ref()) else { continue };
            for l in &v.lanes {
                t.push(Row::new(vec![
                    Value::text(format!("{} lane {}", m.name(), l.lane)),
                    l.cpu.map_or(Value::Missing, |c| Value::num(c as f64)),
                    Value::text(l.napi_ids.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(" ")),
                    Value::num(l.by_owner as f64),
                    Value::num((l.new_id + l.no_napi + l.round_robin) as f64),
                    Value::num(l.handed_over as f64),
                ]));
            }
            for k in v.knobs.iter().filter(|k| !k.applied) {
                out.notes.push(format!("{}: {} = {} was refused: {}", m.name(), k.name, k.wanted, k.detail));
            }
        }
        out.tables.push(t);
    }

    /// Which transmit queue replies left by, at the highest fixed rate of the first
    /// connection count (where the server's device counts them).
    fn tx_queue_section(&self, all: &[Vec<LaneRound>], out: &mut Sections) {
        let j = self.rates.len() - 1;
        let queues = all.iter().flatten().filter_map(|r| r.runs.get(j)).map(|r| r.tx_queues.len()).max().unwrap_or(0);
        if queues == 0 {
            return;
        }
        let mut columns = vec![Column::new("mode", "mode", 0)];
        columns.extend((0..queues).map(|q| Column::new(&format!("tx{q}"), &format!("tx-{q} %"), 1)));
        let mut t = Table::new(
            "lanes-txq",
            format!(
                "Packets the server sent by each transmit queue, {} connections, {}/s, medians of {} rounds",
                self.connections[0], self.rates[j], self.repeat
            ),
            columns,
        );
        for (i, m) in self.modes.iter().enumerate() {
            let rs: Vec<&LaneRun> = all[i].iter().filter_map(|x| x.runs.get(j)).collect();
            let mut row = vec![Value::text(m.name())];
            for q in 0..queues {
                row.push(med(&rs, |r| {
                    let total = positive(r.tx_queues.iter().sum::<u64>() as f64, "packets sent")?;
                    Ok(r.tx_queues.get(q).copied().unwrap_or(0) as f64 * 100.0 / total)
                }));
            }
            t.push(Row::new(row));
        }
        out.tables.push(t);
        out.notes.push(
            "Transmit queues: the server's veth end records each packet's receive queue as a NIC driver does (a veth \
             records none, and xps_rxqs would then send nearly every reply by queue 0); with xps_rxqs (every netlane \
             mode but plain and rfs) a lane's replies leave by the queue paired with the one its connections arrive \
             on, without it by the flow's hash. The device's mq root qdisc counts each queue."
                .to_string(),
        );
    }

    /// Where the roles ran, and what sharing CPUs means for the figures.
    fn plan_notes(&self, plan: &CpuPlan, placed: &[(u32, u32, usize)], out: &mut Sections) {
        out.notes.push(format!("CPU plan: {}.", plan.describe()));
        if !plan.apart(Role::Lane, Role::Generator) {
            out.notes.push(
                "The generator shares the lanes' CPUs: a mode that keeps a CPU busy (busy polling) leaves it less, and \
                 a search that reaches a rate where the generator lags stops there (its checks are invalid, not \
                 missed). memcached -N polls through the global net.core.busy_poll, which makes every socket of the \
                 machine busy poll, the generator's too."
                    .to_string(),
            );
        }
        out.notes.push(format!(
            "The server's receive queues: {}. Each queue's threaded NAPI is pinned to the CPU the plan gives it; the \
             generator sends without TSO so that its TCP takes that NAPI path (veth gives TCP no NAPI id otherwise).",
            placed.iter().map(|(q, n, c)| format!("queue {q} = NAPI {n} on CPU {c}")).collect::<Vec<_>>().join(", ")
        ));
    }

    fn headline(&self, checks: &[Check]) -> String {
        let get = |id: &str| measured_median(checks, id);
        let parts = [
            get("lanes.aligned-throughput")
                .map(|v| format!("NAPI-id lanes held {v}x plain workers' rate within {}", self.sla)),
            get("lanes.busy-poll-throughput").map(|v| format!("busy polling {v}x on top")),
            measured_and_target(checks, "lanes.aligned-p999")
                .map(|(v, t)| format!("NAPI-id lanes' p99.9 was {v}x plain workers' (target {t}; lower is better)")),
            get("lanes.isolation-p999")
                .map(|v| format!("per-application classes {v}x the cache's p99.9 beside a bulk neighbour")),
        ];
        join_headline(parts.into_iter().flatten().collect()).unwrap_or_else(|| {
            let modes: Vec<String> = self.modes.iter().map(|m| m.name()).collect();
            format!(
                "{} run, {} round(s) each; no comparison taken (the checks say what each needs).",
                modes.join(", "),
                self.repeat
            )
        })
    }
}

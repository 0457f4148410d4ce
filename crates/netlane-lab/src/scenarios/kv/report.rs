//! The kv scenario's report: the SLA table and search chart, the floor, the fixed
//! rates, closed against open loop, each a section of its own.

use netlane_kv::load::stats::Sla;
use netlane_report::{
    Axis, Chart, ChartKind, Column, Point, Row, RunRecord, Scale, ScenarioReport, Series, Table, Unit, Value,
};

use super::checks::{best, cpu_per_request, latency, sla_bound_text, sla_bound_us};
use super::{KvBenchArgs, KvRound, KvRun, Part, ServerKind};
use crate::scenarios::cache::pct;
use crate::scenarios::{Heading, Sections, discarded_note};
use crate::stats::{med, median, repeat_flags};
use crate::verdict::{join_headline, measured_and_target, measured_median};

/// One round's closed loop and the open loop at its rate.
struct LoopPair {
    server: String,
    rate: f64,
    closed_p50: f64,
    open_p50: f64,
    closed_p999: f64,
    open_p999: f64,
}

impl KvBenchArgs {
    pub(super) fn report(&self, all: &[Vec<KvRound>], runs: Vec<RunRecord>) -> ScenarioReport {
        let mut out = Sections::default();
        let made_again = all
            .iter()
            .flatten()
            .flat_map(|r| r.rates.iter().chain(r.closed.iter().flat_map(|(c, o)| [c, o])))
            .map(|r| r.discarded)
            .sum();
        out.notes.extend(discarded_note(made_again));
        let find = |k: ServerKind| self.servers.iter().position(|s| *s == k).map(|i| &all[i][..]);
        out.checks = self.checks(&find);
        if self.parts.contains(&Part::Sla) {
            self.sla_section(all, &mut out);
            if all.iter().flatten().any(|r| r.floor.is_some()) {
                out.tables.push(self.floor_table(all));
                out.notes.extend(self.floor_notes(all));
            }
        }
        if self.parts.contains(&Part::Rates) {
            self.rates_section(all, &mut out);
            out.tables.extend(agents_table(all));
        }
        if self.parts.contains(&Part::Closed) {
            self.closed_section(all, &mut out);
        }
        let heading = Heading { title: self.title(), description: self.description(), headline: self.headline(&out) };
        let plan = crate::plan::as_given(&[
            (crate::plan::Role::Generator, &[self.client_cpu]),
            (crate::plan::Role::Server, &[self.server_cpu]),
        ]);
        out.report(self, heading, runs, plan)
    }

    /// The highest rate each server held within each SLA, and the first round's search.
    fn sla_section(&self, all: &[Vec<KvRound>], out: &mut Sections) {
        let mut t = Table::new(
            "kv-sla",
            format!(
                "Highest offered rate within the SLA, {} connections, Poisson arrivals, medians of {} rounds",
                self.connections, self.repeat
            ),
            vec![
                Column::new("server", "server", 0),
                Column::new("sla_per_s", &format!("requests/s within {}", self.sla), 0),
                Column::new("tight_per_s", &format!("requests/s within {}", self.tight_sla), 0),
                Column::new("floor_us", &format!("{} at {:.0}/s, us", self.sla, self.search_lo), 0),
                Column::new("runs", "search runs", 0),
            ],
        );
        let mut chart_series = Vec::new();
        for (i, kind) in self.servers.iter().enumerate() {
            let rs = &all[i];
            t.push(Row::new(vec![
                Value::text(kind.name()),
                med(rs, |r| best(r, 0)),
                med(rs, |r| best(r, 1)),
                // The search's first run, at the lowest rate: the machine's floor.
                med(rs, |r| {
                    r.searches
                        .first()
                        .and_then(|s| s.curve.first())
                        .and_then(|p| p.sla_latency_ns)
                        .map(|ns| ns as f64 / 1e3)
                        .ok_or_else(|| "no latency at the lowest rate".to_string())
                }),
                med(rs, |r| Ok(r.searches.iter().map(|s| s.runs).sum::<usize>() as f64)),
            ]));
            out.flags.extend(repeat_flags(
                &format!("{} within {}", kind.name(), self.sla),
                "requests/s",
                &rs.iter().filter_map(|r| best(r, 0).ok()).collect::<Vec<_>>(),
            ));
            // The search curve of the first round: latency at the SLA percentile by rate.
            if let Some(s) = rs.first().and_then(|r| r.searches.first()) {
                let mut pts: Vec<(f64, f64)> = s
                    .curve
                    .iter()
                    .filter_map(|p| p.sla_latency_ns.map(|ns| (p.offered_per_s, ns as f64 / 1e9)))
                    .collect();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                chart_series.push(Series {
                    name: kind.name(),
                    points: pts.into_iter().filter_map(|(x, y)| Point::of(x, &[y])).collect(),
                });
            }
        }
        out.tables.push(t);
        out.charts.push(Chart {
            name: "kv-sla".into(),
            title: format!("Latency at the SLA's percentile ({}) by offered rate: the first round's search", self.sla),
            kind: ChartKind::Lines,
            x: Axis::numeric("offered requests/s", Unit::Count("requests/s".into()), Scale::Linear),
            y: Axis::numeric("latency", Unit::Seconds, Scale::Log),
            series: chart_series,
        });
    }

    /// Latency and CPU per request at each fixed offered rate.
    fn rates_section(&self, all: &[Vec<KvRound>], out: &mut Sections) {
        let mut t = Table::new(
            "kv-rates",
            format!(
                "Fixed offered rates (Poisson), {} connections, medians of {} rounds",
                self.connections, self.repeat
            ),
            vec![
                Column::new("mode", "server, offered", 0),
                Column::new("achieved_per_s", "achieved/s", 0),
                Column::new("p50_us", "p50 us", 1),
                Column::new("p99_us", "p99 us", 1),
                Column::new("p999_us", "p99.9 us", 1),
                Column::new("p9999_us", "p99.99 us", 1),
                Column::new("server_cpu_us_per_request", "server CPU us/request", 2),
                Column::new("generator_cpu_pct", "generator CPU %", 0),
                Column::new("late_pct", "late sends %", 2),
                Column::new("lag_pct", "generator lag %", 2),
            ],
        );
        let mut series = Vec::new();
        for (i, kind) in self.servers.iter().enumerate() {
            let mut pts = Vec::new();
            for (j, rate) in self.rates.iter().enumerate() {
                let rs: Vec<&KvRun> = all[i].iter().filter_map(|r| r.rates.get(j)).collect();
                let rs: Vec<KvRun> = rs.into_iter().cloned().collect();
                t.push(Row::new(vec![
                    Value::text(format!("{} {rate}/s", kind.name())),
                    med(&rs, |r| Ok(r.load.achieved_per_s)),
                    med(&rs, latency("p50")),
                    med(&rs, latency("p99")),
                    med(&rs, latency("p99.9")),
                    med(&rs, latency("p99.99")),
                    med(&rs, cpu_per_request),
                    med(&rs, |r| Ok(r.load.client_cpu_busy * 100.0)),
                    med(&rs, |r| Ok(r.load.late_share * 100.0)),
                    med(&rs, |r| Ok(r.load.lag_share * 100.0)),
                ]));
                let v: Vec<f64> = rs.iter().filter_map(|r| latency("p99.9")(r).ok().map(|u| u / 1e6)).collect();
                pts.extend(Point::of(*rate as f64, &v));
            }
            series.push(Series { name: kind.name(), points: pts });
        }
        out.tables.push(t);
        out.charts.push(Chart {
            name: "kv-rates".into(),
            title: "p99.9 latency by offered rate".into(),
            kind: ChartKind::Lines,
            x: Axis::numeric("offered requests/s", Unit::Count("requests/s".into()), Scale::Linear),
            y: Axis::numeric("p99.9 latency", Unit::Seconds, Scale::Log),
            series,
        });
    }

    /// Closed loop against open loop at its rate: what coordinated omission hides.
    fn closed_section(&self, all: &[Vec<KvRound>], out: &mut Sections) {
        let mut t = Table::new(
            "kv-closed",
            format!(
                "Closed loop ({} in flight per connection, {} connections) against open loop at 80% of the rate it reached: \
                 coordinated omission",
                self.closed_depth, self.connections
            ),
            vec![
                Column::new("mode", "server, loop", 0),
                Column::new("achieved_per_s", "achieved/s", 0),
                Column::new("p50_us", "p50 us", 1),
                Column::new("p99_us", "p99 us", 1),
                Column::new("p999_us", "p99.9 us", 1),
                Column::new("p9999_us", "p99.99 us", 1),
            ],
        );
        let mut seen = Vec::new();
        for (i, kind) in self.servers.iter().enumerate() {
            for (which, pick) in [("closed", 0usize), ("open, 80% of its rate", 1)] {
                let rs: Vec<KvRun> = all[i]
                    .iter()
                    .filter_map(|r| r.closed.as_ref().map(|c| if pick == 0 { c.0.clone() } else { c.1.clone() }))
                    .collect();
                t.push(Row::new(vec![
                    Value::text(format!("{} {which}", kind.name())),
                    med(&rs, |r| Ok(r.load.achieved_per_s)),
                    med(&rs, latency("p50")),
                    med(&rs, latency("p99")),
                    med(&rs, latency("p99.9")),
                    med(&rs, latency("p99.99")),
                ]));
            }
            for r in &all[i] {
                if let Some((c, o)) = &r.closed
                    && let (Ok(cp50), Ok(op50), Ok(c999), Ok(o999)) =
                        (latency("p50")(c), latency("p50")(o), latency("p99.9")(c), latency("p99.9")(o))
                {
                    seen.push(LoopPair {
                        server: kind.name(),
                        rate: c.load.achieved_per_s,
                        closed_p50: cp50,
                        open_p50: op50,
                        closed_p999: c999,
                        open_p999: o999,
                    });
                }
            }
        }
        out.tables.push(t);
        let in_flight = f64::from(self.connections) * f64::from(self.closed_depth);
        for kind in &self.servers {
            let v: Vec<&LoopPair> = seen.iter().filter(|s| s.server == kind.name()).collect();
            if v.is_empty() {
                continue;
            }
            let m = |f: fn(&LoopPair) -> f64| median(v.iter().map(|s| f(s)).collect());
            out.notes.push(format!(
                "{}: the closed loop kept {in_flight:.0} requests in flight and reached {:.0}/s, so its p50 of {:.0} us \
                 is mostly its own queue (Little: {in_flight:.0} / {:.0}/s = {:.0} us); requests arriving on their own \
                 at 80% of that rate (open loop) waited {:.0} us at p50 and {:.0} us at p99.9, against the closed \
                 loop's {:.0} us (medians of rounds). A closed loop reports the latency of the load it generates \
                 itself, and slows its sending while the server stalls, so a stall is counted once per connection \
                 instead of once per request that would have arrived meanwhile.",
                kind.name(),
                m(|s| s.rate),
                m(|s| s.closed_p50),
                m(|s| s.rate),
                in_flight / m(|s| s.rate) * 1e6,
                m(|s| s.open_p50),
                m(|s| s.open_p999),
                m(|s| s.closed_p999),
            ));
        }
    }

    fn headline(&self, out: &Sections) -> String {
        let get = |id: &str| measured_median(&out.checks, id);
        let parts = [
            get("kv.sla-throughput")
                .map(|v| format!("netlane's server held {v}x memcached's rate within {}", self.sla)),
            get("kv.tight-sla-throughput").map(|v| format!("{v}x within {}", self.tight_sla)),
            measured_and_target(&out.checks, "kv.cpu-per-request").map(|(v, t)| {
                format!("netlane's server used {v}x memcached's CPU per request (target {t}; lower is better)")
            }),
        ];
        join_headline(parts.into_iter().flatten().collect())
            .unwrap_or_else(|| format!("{} servers, {} rounds.", self.servers.len(), self.repeat))
    }

    fn title(&self) -> String {
        "Memcached-protocol cache: throughput within a tail-latency SLA, against memcached 1.6.18".into()
    }

    fn description(&self) -> String {
        format!(
            "Each server ({} worker thread(s), pinned to CPU {}) in one network namespace, netlane's open-loop load generator (one thread on CPU {}, {} connections, Poisson arrivals \
             from a precomputed schedule, latency from the scheduled send time) in another, joined by a veth pair. \
             The key space ({} keys, key sizes {} B, value sizes {} B) is stored before each round; {:.0}% gets. The search \
             finds the highest offered rate whose percentile holds the SLA (bisection over {} runs, each rate \
             decided by three runs of five, or by two that agree far from the bound; the best decided again); a run that fell behind (under 90% of the offered rate completed) misses, \
             and one in which the generator delayed more than 5% of its sends itself measured the generator (the search then says \
             that it stopped at the generator's limit). \
             memcached runs with the same thread count and memory, without -N (no busy polling for either). \
             TCP over veth takes no NAPI path while TSO is on: each packet's receive work runs on its sender's CPU, \
             so a server CPU figure includes the receive side of its replies and excludes that of its requests, \
             the same for both servers.",
            self.threads,
            self.server_cpu,
            self.client_cpu,
            self.connections,
            self.workload.keys,
            self.workload.key_size,
            self.workload.value_size,
            self.workload.get_ratio * 100.0,
            netlane_report::format::seconds(self.step.as_secs_f64())
        )
    }

    /// What the floor runs say of each SLA: whether either server held it at the
    /// lowest rate, and how much of its budget the stalls cyclictest saw took.
    fn floor_notes(&self, all: &[Vec<KvRound>]) -> Vec<String> {
        let mut out = Vec::new();
        for sla in [self.sla, self.tight_sla] {
            let p = format!("p{}", sla.quantile() * 100.0);
            let bound_us = sla.latency_ns() as f64 / 1e3;
            let mut per_server = Vec::new();
            let mut held = 0;
            let mut runs = 0;
            for (i, kind) in self.servers.iter().enumerate() {
                let v: Vec<f64> =
                    all[i].iter().filter_map(|r| r.floor.as_ref()).filter_map(|(run, _)| pct(&run.load, &p)).collect();
                held += v.iter().filter(|&&x| x <= bound_us).count();
                runs += v.len();
                if !v.is_empty() {
                    per_server.push(format!("{} {:.0} us", kind.name(), median(v)));
                }
            }
            let shares: Vec<f64> = all
                .iter()
                .flatten()
                .filter_map(|r| r.floor.as_ref())
                .map(|(_, f)| f.delayed_share(sla_bound_us(sla)))
                .collect();
            if shares.is_empty() {
                continue;
            }
            let allowed = (1.0 - sla.quantile()) * 100.0;
            out.push(format!(
                "{sla}: at {:.0}/s, a few percent of either server's capacity, {p} was {} (medians of rounds); {held} of \
                 {runs} such runs held {}. During them cyclictest (SCHED_FIFO 99) saw the server CPU stall for 1 ms or \
                 more now and then; those stalls alone delay {:.3}% of requests past {} (median; the SLA allows \
                 {allowed:.2}%), a lower bound: requests also wait when the other CPU, or the whole virtual machine, \
                 stalls. {}",
                self.search_lo,
                per_server.join(", "),
                sla_bound_text(sla),
                median(shares) * 100.0,
                sla_bound_text(sla),
                if held * 2 < runs {
                    "Below the floor of this machine: a search that finds no rate measured the machine, not the server."
                } else {
                    "Within the floor of this machine."
                }
            ));
        }
        out
    }

    fn floor_table(&self, all: &[Vec<KvRound>]) -> Table {
        let share = |sla: Sla| format!("requests the stalls alone delay past {}, %", sla_bound_text(sla));
        let mut t = Table::new(
            "kv-floor",
            format!(
                "The floor: each server at {:.0}/s for {} with cyclictest (SCHED_FIFO 99, a wake-up every 1 ms) on the \
                 server CPU meanwhile, measuring how late a ready thread ran",
                self.search_lo,
                netlane_report::format::seconds(self.stall_probe.as_secs_f64())
            ),
            vec![
                Column::new("mode", "server, round", 0),
                Column::new("p999_us", "requests' p99.9 us", 0),
                Column::new("p99_us", "requests' p99 us", 0),
                Column::new("over_1ms", "stalls >= 1 ms", 0),
                Column::new("max_us", "longest stall us", 0),
                Column::new("sla_share", &share(self.sla), 3),
                Column::new("tight_share", &share(self.tight_sla), 3),
            ],
        );
        for (i, kind) in self.servers.iter().enumerate() {
            for (k, r) in all[i].iter().enumerate() {
                let Some((run, f)) = &r.floor else { continue };
                t.push(Row::new(vec![
                    Value::text(format!("{} #{}", kind.name(), k + 1)),
                    latency("p99.9")(run).map_or(Value::Missing, Value::num),
                    latency("p99")(run).map_or(Value::Missing, Value::num),
                    Value::num(f.over_1ms as f64),
                    Value::num(f.max_us as f64),
                    Value::num(f.delayed_share(sla_bound_us(self.sla)) * 100.0),
                    Value::num(f.delayed_share(sla_bound_us(self.tight_sla)) * 100.0),
                ]));
            }
        }
        t
    }
}

/// Each load generator agent's part of the fixed-rate runs of the first round, beside
/// the merged run the other tables show (none when one generator made them).
fn agents_table(all: &[Vec<KvRound>]) -> Option<Table> {
    let first = all.iter().filter_map(|rounds| rounds.first());
    let runs: Vec<(&str, &KvRun)> = first.flat_map(|r| r.rates.iter().map(move |k| (r.server.as_str(), k))).collect();
    if runs.iter().all(|(_, r)| r.agents.is_empty()) {
        return None;
    }
    let mut t = Table::new(
        "kv-agents",
        "Each load generator agent's part of the fixed-rate runs (first round)",
        vec![
            Column::new("run", "server, offered (merged)", 0),
            Column::new("agent", "agent", 0),
            Column::new("connections", "connections", 0),
            Column::new("offered_per_s", "offered/s", 0),
            Column::new("achieved_per_s", "achieved/s", 0),
            Column::new("lag_pct", "lag %", 2),
            Column::new("cpu_s", "CPU s", 2),
            Column::new("cpu_busy_pct", "CPU busy %", 0),
        ],
    );
    for (server, run) in runs {
        for a in &run.agents {
            t.push(Row::new(vec![
                Value::text(format!("{server} {:.0}/s", run.load.offered_per_s)),
                Value::text(a.host.clone()),
                Value::num(f64::from(a.connections)),
                Value::num(a.offered_per_s),
                Value::num(a.achieved_per_s),
                Value::num(a.lag_share * 100.0),
                Value::num(a.cpu_s),
                Value::num(a.cpu_busy * 100.0),
            ]));
        }
    }
    Some(t)
}

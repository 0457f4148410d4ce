//! The rr scenario's report: a section per part (its table, charts and notes), the
//! target checks, and the headline.

use std::time::Duration;

use netlane_report::{
    Axis, Chart, ChartKind, Check, Column, Point, Row, RunRecord, Scale, ScenarioReport, Series, Table, Unit, Value,
};
use netlane_rr::server::{PathKind as RxPathKind, TxKind};

use crate::scenarios::{Heading, Sections};
use crate::stats::{median, repeat_flags};
use crate::verdict::{Measure, join_headline, measured_median, paired, positive};

use super::*;

/// The columns every part's table starts with, the first named `first`.
pub(super) fn columns(first: &str) -> Vec<Column> {
    vec![
        Column::new("mode", first, 0),
        Column::new("responses_per_s", "responses/s", 0),
        Column::new("p50_us", "p50 us", 1),
        Column::new("p99_us", "p99 us", 1),
        Column::new("p9999_us", "p99.99 us", 1),
        Column::new("server_cpu_idle_pct", "server CPU idle %", 0),
        Column::new("server_cpu_us_per_response", "server CPU us/response", 2),
        Column::new("wakeups_per_s", "wake-ups/s", 0),
        Column::new("frames_per_wakeup", "frames/wake-up", 1),
        Column::new("syscalls_per_response", "syscalls/response", 2),
        Column::new("retransmits_and_lost", "retransmits+lost", 0),
    ]
}

/// A mode's row of [`columns`]: medians of its rounds.
pub(super) fn row(label: &str, rs: &[RrRun]) -> Row {
    Row::new(vec![
        Value::text(label),
        med(rs, throughput),
        med(rs, us(|s| s.p50)),
        med(rs, us(|s| s.p99)),
        med(rs, us(|s| s.p9999)),
        med(rs, idle),
        med(rs, cost),
        med(rs, |r| positive(r.server.counters.wakeups as f64 / r.server.seconds.max(1e-9), "wake-ups")),
        med(rs, |r| positive(r.server.frames_per_wakeup, "frames per wake-up")),
        med(rs, |r| Ok(r.server.syscalls_per_response)),
        med(rs, |r| Ok((r.clients.retransmits + r.clients.lost) as f64)),
    ])
}

/// The responses/s axis of a chart.
pub(super) fn responses_per_s() -> Axis {
    Axis::numeric("responses/s", Unit::Count("responses/s".into()), Scale::Linear)
}

impl RrBenchArgs {
    /// The report of `modes`, `all[i]` holding the rounds of `modes[i]`.
    pub(super) fn report(&self, modes: &[Mode], all: &[Vec<RrRun>], records: Vec<RunRecord>) -> ScenarioReport {
        let runs = Runs::new(modes, all, &self.block_sizes);
        let mut out = Sections::default();
        for (m, rs) in modes.iter().zip(all) {
            out.flags.extend(repeat_flags(&m.what(), "responses/s", &values(rs, throughput)));
        }
        if self.parts.contains(&Part::Paths) {
            self.paths_section(&runs, &mut out);
        }
        if self.parts.contains(&Part::Blocks) {
            self.blocks_section(&runs, &mut out);
            self.blocks_notes(&runs, &mut out);
            self.adaptive_section(&runs, &mut out);
        }
        if self.parts.contains(&Part::Wall) {
            self.wall_section(&runs, &mut out);
        }
        if self.parts.contains(&Part::Tcp) {
            self.tcp_section(&runs, &mut out);
        }
        if self.parts.contains(&Part::Large) {
            self.large_section(&runs, &mut out);
        }
        if self.parts.contains(&Part::Tx) {
            self.tx_section(&runs, &mut out);
        }
        if self.parts.contains(&Part::Pace) {
            self.pace_section(&runs, &mut out);
        }
        if self.parts.contains(&Part::Busy) {
            self.busy_section(&runs, &mut out);
        }
        if self.parts.contains(&Part::Queues) {
            self.queues_section(&runs, &mut out);
        }
        out.tables.extend(agents_table(modes, all));
        out.checks = self.checks(&runs);
        let heading = Heading {
            title: "Datagram request/response: receive paths, TPACKET_V3 blocks, the wall, large responses, transmit paths, pacing, busy polling, receive queues"
                .into(),
            description: self.description(),
            headline: self.headline(&out.checks, modes.len()),
        };
        let plan = crate::plan::as_given(&[
            (crate::plan::Role::Generator, &[self.client_cpu]),
            (crate::plan::Role::Server, &[self.server_cpu]),
        ]);
        out.report(self, heading, records, plan)
    }

    /// Where the roles ran and what the figures count.
    fn description(&self) -> String {
        let figures = "Throughput and latency are the clients' (the receiving side); the server CPU's idle share and \
                       CPU per response count everything on that CPU (the server thread, its NAPI, softirqs) over the \
                       clients' run.";
        if self.on.testbed.is_some() {
            return format!(
                "A stateless UDP request/response server (one thread, pinned to CPU {} of the testbed's server host) \
                 and closed-loop clients (each its own socket) on the testbed's client hosts: several run their shares \
                 as agents of one measurement, started together, their latency histograms merged. {figures}",
                self.server_cpu
            );
        }
        format!(
            "A stateless UDP request/response server (one thread, pinned to CPU {}, with its end's threaded \
             NAPI) in one network namespace and closed-loop clients (each its own socket, on CPU {}; the paths \
             part's throughput comparison puts a client thread on each CPU but the server's) in another, joined by a veth pair (MTU {} but in the large part; the clients' end has threaded NAPI and GRO \
             but not rx-udp-gro-forwarding, with which veth loses IP-fragmented responses). {figures} AF_XDP runs in \
             native XDP, copy mode (veth has no zero-copy).",
            self.server_cpu, self.client_cpu, self.mtu
        )
    }

    /// Every receive path at `--clients`: the table, the throughput chart, and a note
    /// when even the busiest path left the server CPU idle.
    fn paths_section(&self, runs: &Runs<'_>, out: &mut Sections) {
        let mut t = Table::new(
            "rr-paths",
            format!(
                "Receive paths, {} closed-loop clients, {} B requests, {} B responses, medians of {} rounds",
                self.clients, self.request, self.response, self.repeat
            ),
            columns("path"),
        );
        let mut points = Vec::new();
        for (x, p) in self.paths.iter().enumerate() {
            let Some(rs) = runs.find(Part::Paths, p.name()) else { continue };
            t.push(row(p.name(), rs));
            points.extend(Point::of(x as f64, &values(rs, throughput)));
        }
        let wide = self.wide_client_cpus().len();
        for p in WIDE_PATHS {
            let label = wide_label(p, wide);
            if let Some(rs) = runs.find(Part::Paths, &label) {
                t.push(row(&label, rs));
            }
        }
        out.tables.push(t);
        out.notes.extend(self.wide_note(runs));
        out.charts.push(Chart {
            name: "rr-paths".into(),
            title: format!("Responses per second by receive path, {} clients", self.clients),
            kind: ChartKind::Bars,
            x: Axis::categories("receive path", self.paths.iter().map(|p| p.name().to_string()).collect()),
            y: responses_per_s(),
            series: vec![Series { name: "responses/s".into(), points }],
        });
        let best_idle = self
            .paths
            .iter()
            .filter_map(|p| runs.find(Part::Paths, p.name()).map(|rs| (p, values(rs, idle))))
            .filter(|(_, v)| !v.is_empty())
            .map(|(p, v)| (p, median(v)))
            .fold(
                None,
                |m: Option<(&RxPathKind, f64)>, (p, v)| {
                    if m.is_some_and(|(_, b)| b >= v) { m } else { Some((p, v)) }
                },
            );
        if let Some((p, v)) = best_idle
            && v > 20.0
        {
            let clients = if self.on.testbed.is_some() { "the client hosts" } else { "one client CPU" };
            out.notes.push(format!(
                "The server CPU was idle {v:.0}% of the time even on {p}: {clients} cannot drive one server CPU to \
                 saturation here, so responses/s measure the clients as much as the server; the paths are compared \
                 by server CPU per response."
            ));
        }
    }

    /// TPACKET_V3 block sizes at each think time and client count: a table, and charts
    /// of throughput and the server CPU's idle time for each think time.
    fn blocks_section(&self, runs: &Runs<'_>, out: &mut Sections) {
        let mut cols = columns("block, clients, think");
        cols.insert(1, Column::new("block_bytes", "block bytes", 0));
        cols.insert(2, Column::new("block_holds", "holds", 0));
        let mut t = Table::new(
            "rr-blocks",
            format!(
                "TPACKET_V3 block sizes ({} ms retire timeout), clients without a pause and pausing between \
                 requests, medians of {} rounds",
                self.retire_ms, self.repeat
            ),
            cols,
        );
        let mut sizes = self.block_sizes.clone();
        sizes.sort_unstable();
        let cats: Vec<String> = sizes.iter().map(|b| format!("{}K", b / 1024)).collect();
        for &think in &self.block_thinks {
            let mut tp_series = Vec::new();
            let mut idle_series = Vec::new();
            for &c in &self.block_clients {
                let (mut tp, mut id) = (Vec::new(), Vec::new());
                for (b, rs) in runs.fixed(c, think) {
                    // Each size at its own category, whichever others ran.
                    let x = sizes.iter().position(|s| *s == b).unwrap_or_default();
                    let mut r = row(&block_label(b, c, think), rs);
                    r.cells.insert(1, Value::num(b as f64));
                    r.cells.insert(2, Value::num(block_holds(b, self.request) as f64));
                    t.push(r);
                    tp.extend(Point::of(x as f64, &values(rs, throughput)));
                    id.extend(Point::of(x as f64, &values(rs, idle)));
                }
                tp_series.push(Series { name: format!("{c} clients"), points: tp });
                idle_series.push(Series { name: format!("{c} clients"), points: id });
            }
            let (suffix, who) = (if think.is_zero() { "-no-think" } else { "" }, think_name(think));
            out.charts.push(Chart {
                name: format!("rr-blocks-throughput{suffix}"),
                title: format!("TPACKET_V3, {who}: responses per second by block size"),
                kind: ChartKind::Lines,
                x: Axis::categories("block size", cats.clone()),
                y: responses_per_s(),
                series: tp_series,
            });
            out.charts.push(Chart {
                name: format!("rr-blocks-idle{suffix}"),
                title: format!("TPACKET_V3, {who}: the server CPU's idle time by block size"),
                kind: ChartKind::Lines,
                x: Axis::categories("block size", cats.clone()),
                y: Axis::numeric("server idle", Unit::Percent, Scale::Linear),
                series: idle_series,
            });
        }
        out.tables.push(t);
    }

    /// The blocks part's notes: the half-burst block against the best at every client
    /// count and think time, and what a bigger block saves per request at the largest
    /// population.
    fn blocks_notes(&self, runs: &Runs<'_>, out: &mut Sections) {
        for &think in &self.block_thinks {
            let shape: Vec<String> = self
                .block_clients
                .iter()
                .filter_map(|&c| {
                    let b = self.half_burst_block(c)?;
                    let rs = runs.find(Part::Blocks, &block_label(b, c, think))?;
                    let ratios: Vec<f64> = rs
                        .iter()
                        .enumerate()
                        .filter_map(|(i, r)| {
                            throughput(r).ok().zip(runs.best_fixed(c, think, i)).map(|(v, (best, _))| v / best)
                        })
                        .collect();
                    let idles = values(rs, idle);
                    (!ratios.is_empty() && !idles.is_empty()).then(|| {
                        format!("{c} clients {} KiB {:.2}x at {:.0}% idle", b / 1024, median(ratios), median(idles))
                    })
                })
                .collect();
            if !shape.is_empty() {
                out.notes.push(format!(
                    "{}: the block holding half of each population's requests against the best block (medians \
                     over rounds): {}.{}",
                    think_name(think),
                    shape.join("; "),
                    if think.is_zero() {
                        ""
                    } else {
                        " With clients pausing between requests the burst is smaller than the population, so \
                         the half-population block is larger than the burst needs."
                    }
                ));
            }
        }
        // Why a bigger block buys idle time or not: what it saves per request. At the
        // largest population without a pause (the busiest server), the smallest block
        // against the half-burst one.
        let think = self.block_thinks.iter().copied().min().unwrap_or_default();
        if let Some(&c) = self.block_clients.iter().max()
            && let (Some(&small), Some(half)) = (self.block_sizes.iter().min(), self.half_burst_block(c))
            && small < half
        {
            let cost_of = |b: usize| runs.find(Part::Blocks, &block_label(b, c, think)).map(|rs| values(rs, cost));
            if let (Some(s), Some(h)) = (cost_of(small), cost_of(half))
                && !s.is_empty()
                && !h.is_empty()
            {
                let (s, h) = (median(s), median(h));
                out.notes.push(format!(
                    "Server CPU per response at {c} clients, {}: {s:.1} us with {} KiB blocks, {h:.1} us with {} KiB \
                     ({:.2}x). Idle time bought with a bigger block comes from fewer wake-ups per request only as \
                     far as this ratio is below 1; the rest is requests not yet answered (clients waiting for the \
                     block to fill), which costs throughput.",
                    think_name(think),
                    small / 1024,
                    half / 1024,
                    h / s
                ));
            }
        }
    }

    /// The adaptive block size against the best fixed block at each think time and
    /// client count, and where no fixed block could meet both adaptive targets.
    fn adaptive_section(&self, runs: &Runs<'_>, out: &mut Sections) {
        let mut t = Table::new(
            "rr-adaptive",
            format!(
                "TPACKET_V3 with the block size adapted at run time, against the best fixed block of the same sizes, \
                 medians of {} rounds",
                self.repeat
            ),
            vec![
                Column::new("think", "think", 0),
                Column::new("clients", "clients", 0),
                Column::new("adaptive_responses_per_s", "adaptive responses/s", 0),
                Column::new("best_fixed_responses_per_s", "best fixed responses/s", 0),
                Column::new("best_fixed_block", "best fixed block bytes", 0),
                Column::new("ratio", "adaptive / best", 2),
                Column::new("adaptive_idle_pct", "adaptive server CPU idle %", 0),
                Column::new("switches", "ring switches", 0),
                Column::new("final_block_bytes", "final block bytes", 0),
                Column::new("fixed_idle_bound", "best fixed with 30% idle / best", 2),
            ],
        );
        let mut infeasible = Vec::new();
        for &think in &self.block_thinks {
            for &c in &self.block_clients {
                let Some(ad) = runs.find(Part::Blocks, &adaptive_label(c, think)) else { continue };
                let bound = fixed_idle_bound(runs, c, think, ad.len());
                if let Some(b) = bound.filter(|b| *b < ADAPTIVE_RATE) {
                    infeasible.push(format!("{c} clients, {} ({b:.2})", think_name(think)));
                }
                let ok: Vec<f64> = runs.adaptive_ratios(c, think, ad).into_iter().filter_map(Result::ok).collect();
                let bests: Vec<f64> = (0..ad.len()).filter_map(|i| runs.best_fixed(c, think, i).map(|b| b.0)).collect();
                let best_block = runs.best_fixed(c, think, 0).map(|b| b.1);
                t.push(Row::new(vec![
                    Value::text(think_name(think)),
                    Value::num(c as f64),
                    med(ad, throughput),
                    if bests.is_empty() { Value::Missing } else { Value::num(median(bests)) },
                    Value::opt(best_block.map(|b| b as f64)),
                    if ok.is_empty() { Value::Missing } else { Value::num(median(ok)) },
                    med(ad, idle),
                    med(ad, |r| r.server.adaptive_switches.map(|v| v as f64).ok_or_else(|| "not adaptive".into())),
                    med(ad, |r| r.server.adaptive_block.map(f64::from).ok_or_else(|| "not adaptive".into())),
                    Value::opt(bound),
                ]));
            }
        }
        out.tables.push(t);
        if !infeasible.is_empty() {
            out.notes.push(format!(
                "No fixed block met both adaptive targets at {}: the best fixed block leaving the server CPU 30% idle \
                 kept only that share of the best fixed block's rate (medians over rounds), so no geometry chosen \
                 at run time could either on this machine with these clients.",
                infeasible.join(", ")
            ));
        }
    }

    /// Clients 1..128 on every path: the table and latency against throughput.
    fn wall_section(&self, runs: &Runs<'_>, out: &mut Sections) {
        let mut t = Table::new(
            "rr-wall",
            format!("The wall: clients 1..128 per path, medians of {} rounds", self.repeat),
            columns("path x clients"),
        );
        let mut series = Vec::new();
        for p in &self.paths {
            let mut points = Vec::new();
            for c in WALL_CLIENTS {
                let label = wall_label(*p, c);
                let Some(rs) = runs.find(Part::Wall, &label) else { continue };
                t.push(row(&label, rs));
                let (tp, lat) = (values(rs, throughput), values(rs, p50));
                if let (false, false) = (tp.is_empty(), lat.is_empty()) {
                    points.push(Point { x: median(tp), y: median(lat) / 1e9, low: None, high: None });
                }
            }
            series.push(Series { name: p.name().into(), points });
        }
        out.tables.push(t);
        out.charts.push(Chart {
            name: "rr-wall".into(),
            title: "The wall: p50 latency against responses per second as clients double (1..128)".into(),
            kind: ChartKind::Lines,
            x: responses_per_s(),
            y: Axis::numeric("p50 latency", Unit::Seconds, Scale::Log),
            series,
        });
    }

    /// The transmit paths: the table and the server CPU per response of each.
    fn tx_section(&self, runs: &Runs<'_>, out: &mut Sections) {
        let mut cols = columns("transmit path, response");
        cols.push(Column::new("frames_pct", "responses as frames %", 0));
        let mut t = Table::new(
            "rr-tx",
            format!(
                "Transmit paths (receive path AF_XDP), {} clients, MTU {}, medians of {} rounds",
                self.clients, self.mtu, self.repeat
            ),
            cols,
        );
        let mut series = Vec::new();
        for size in TX_SIZES {
            let mut points = Vec::new();
            for (x, tx) in TxKind::ALL.iter().enumerate() {
                let Some(rs) = runs.find(Part::Tx, &tx_label(*tx, size)) else { continue };
                let mut r = row(&tx_label(*tx, size), rs);
                r.cells.push(med(rs, frames_share));
                t.push(r);
                points.extend(Point::of(x as f64, &values(rs, |r| cost(r).map(|us| us / 1e6))));
            }
            series.push(Series { name: format!("{} KiB responses", size / 1024), points });
        }
        if let Some(rs) = runs.find(Part::Tx, &tx_software_checksum_label()) {
            let mut r = row(&tx_software_checksum_label(), rs);
            r.cells.push(med(rs, frames_share));
            t.push(r);
            out.notes.push(format!(
                "The packet ring's rows leave a one-frame response's UDP checksum to the device (PACKET_VNET_HDR with \
                 NEEDS_CSUM; on veth the checksum is never summed: the receiver takes the frame as a local sender's); \
                 \"{}\" sums it in user space as a fragmented response's always is.",
                tx_software_checksum_label()
            ));
        }
        out.tables.push(t);
        out.charts.push(Chart {
            name: "rr-tx".into(),
            title: "Server CPU per response by transmit path".into(),
            kind: ChartKind::Bars,
            x: Axis::categories("transmit path", TxKind::ALL.iter().map(|k| k.name().to_string()).collect()),
            y: Axis::numeric("server CPU per response", Unit::Seconds, Scale::Linear),
            series,
        });
    }

    /// Unpaced against paced responses: the table of wake-ups, and what pacing costs.
    fn pace_section(&self, runs: &Runs<'_>, out: &mut Sections) {
        let mut cols = columns("responses");
        cols.push(Column::new("woken_per_wakeup", "clients woken per wake-up", 2));
        cols.push(Column::new("herd_pct", &format!("woken {}+ at once %", netlane_rr::clients::HERD), 2));
        cols.push(Column::new("max_woken", "most woken at once", 0));
        let mut t = Table::new(
            "rr-pace",
            format!(
                "Responses released per TPACKET_V3 block ({} requests per block) or paced at {} responses/s \
                 (100 us releases), {} clients, open loop at {} requests/s, medians of {} rounds",
                self.block,
                self.pace_options().rate,
                self.clients,
                self.pace_load,
                self.repeat
            ),
            cols,
        );
        for label in PACE {
            let Some(rs) = runs.find(Part::Pace, label) else { continue };
            let mut r = row(label, rs);
            r.cells.push(med(rs, |r| {
                let c = &r.clients;
                positive(c.woken_sockets as f64, "woken clients").map(|w| w / c.wakeups as f64)
            }));
            r.cells.push(med(rs, |r| herd_share(r, self.pace_load)));
            r.cells.push(med(rs, |r| Ok(r.clients.max_woken_sockets as f64)));
            t.push(r);
        }
        out.tables.push(t);
        let paired_ratios = |f: fn(&RrRun) -> Measure| -> Vec<f64> {
            match (runs.find(Part::Pace, PACE[1]), runs.find(Part::Pace, PACE[0])) {
                (Some(p), Some(u)) => paired(p, u, f).into_iter().filter_map(Result::ok).collect(),
                _ => Vec::new(),
            }
        };
        let (lat, cpu) = (paired_ratios(p50), paired_ratios(cost));
        if !lat.is_empty() && !cpu.is_empty() {
            out.notes.push(format!(
                "Pacing's price: the paced p50 latency was {:.2}x the unpaced one and the server CPU per response \
                 {:.2}x (medians of the rounds' ratios): responses wait for their release instead of leaving with \
                 their block, and every release is a timer wake-up.",
                median(lat),
                median(cpu)
            ));
        }
    }

    /// The headline: the checks' main ratios, or how much ran.
    fn headline(&self, checks: &[Check], modes: usize) -> String {
        let get = |id: &str| measured_median(checks, id);
        let parts = [
            get("rr.tpacket-v2-cost").map(|v| format!("TPACKET_V2 cost the server {v}x recvfrom's CPU per response")),
            get("rr.af-xdp-cost").map(|v| format!("AF_XDP {v}x")),
            get("rr.jumbo-throughput").map(|v| format!("jumbo frames gave {v}x the fragmented 8 KiB rate")),
            get("rr.tx-packet-8k-cost")
                .map(|v| format!("8 KiB responses as frames via a packet ring cost {v}x the socket's CPU")),
        ];
        join_headline(parts.into_iter().flatten().collect())
            .unwrap_or_else(|| format!("{modes} modes, {} rounds.", self.repeat))
    }
}

/// What any fixed block achieves with the idle target met: per round, the best
/// throughput among the blocks at `clients` leaving the server CPU 30% idle over the
/// best block's, the clients pausing `think`; the median over the first `rounds` rounds.
fn fixed_idle_bound(runs: &Runs<'_>, clients: usize, think: Duration, rounds: usize) -> Option<f64> {
    let bound: Vec<f64> = (0..rounds)
        .filter_map(|i| {
            let idle_best = runs
                .fixed(clients, think)
                .into_iter()
                .filter_map(|(_, rs)| rs.get(i))
                .filter(|r| idle(r).is_ok_and(|v| v >= ADAPTIVE_IDLE))
                .filter_map(|r| throughput(r).ok())
                .fold(0.0, f64::max);
            runs.best_fixed(clients, think, i).map(|b| idle_best / b.0)
        })
        .collect();
    (!bound.is_empty()).then(|| median(bound))
}

/// Each client agent's part of the first round's runs, beside the merged run the other
/// tables show (none when one host ran the clients).
fn agents_table(modes: &[Mode], all: &[Vec<RrRun>]) -> Option<Table> {
    let runs: Vec<(&Mode, &RrRun)> = modes.iter().zip(all).filter_map(|(m, rs)| rs.first().map(|r| (m, r))).collect();
    if runs.iter().all(|(_, r)| r.agents.is_empty()) {
        return None;
    }
    let mut t = Table::new(
        "rr-agents",
        "Each client agent's part of the runs (first round)",
        vec![
            Column::new("run", "run (merged)", 0),
            Column::new("agent", "agent", 0),
            Column::new("clients", "clients", 0),
            Column::new("responses_per_s", "responses/s", 0),
            Column::new("p50_us", "p50 us", 1),
            Column::new("p99_us", "p99 us", 1),
            Column::new("lost", "lost", 0),
            Column::new("cpu_s", "CPU s", 2),
        ],
    );
    for (m, run) in runs {
        for a in &run.agents {
            t.push(Row::new(vec![
                Value::text(m.what()),
                Value::text(a.host.clone()),
                Value::num(a.clients as f64),
                Value::num(a.responses_per_s),
                Value::num(a.latency_ns.p50 as f64 / 1e3),
                Value::num(a.latency_ns.p99 as f64 / 1e3),
                Value::num(a.lost as f64),
                Value::num(a.cpu_s),
            ]));
        }
    }
    Some(t)
}

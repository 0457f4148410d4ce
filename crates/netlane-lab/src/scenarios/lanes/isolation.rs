//! The lanes scenario's isolation part: two applications share the server's link, the
//! cache (netlane's server, a process of its own) and a bulk sender (socat streaming
//! TCP to a sink in the generator's namespace), with and without per-application
//! priority and shaping (`netlane::lanes::apps`).
//!
//! The link is an htb root class at `--isolation-link` on the server's egress (a veth
//! has no rate of its own; a NIC's line rate is what the class stands for). Cases, each
//! in every round, in rotating order:
//! - `alone`: the cache alone, its packets in its class;
//! - `shared`: cache and bulk, every packet in one FIFO at the link's rate (what a
//!   device with one queue and no priority gives);
//! - `classes`: cache and bulk, each application's sockets marked by its cgroup's socket
//!   program and its packets put in its own htb class by the TCX classifier: the cache
//!   first for spare bandwidth, the bulk sender held under 90% of the link.
//!
//! Latency is measured by the generator (the replies' receiver); the bulk rate by the
//! sink (the bulk's receiver).

use std::io::Read;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::scenarios::unless_generator_lagged;
use netlane::lanes::apps::{self, AppCgroup, AppSpec, ClassReport, Shaper};
use netlane::topology::TwoHosts;
use netlane_kv::loadgen::LoadReport;
use netlane_kv::server::ServerConfig;
use netlane_kv::store::StoreConfig;
use serde::Serialize;

use super::{LanesBenchArgs, latency_of, mean_of, med, open};
use crate::host::{InCgroup, Program, RoleProcess, RoleSpec};
use crate::runner::{Runner, Turn};
use crate::scenarios::cache;
use crate::scenarios::cache::CacheSite;
use crate::stats::round_order;
use crate::verdict::{Measure, Spec, paired};
use netlane_report::Check;
use netlane_report::{Column, Row, Table, Value};

/// A case of the isolation part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Case {
    /// The cache alone.
    Alone,
    /// Cache and bulk in one FIFO.
    Shared,
    /// Cache and bulk in their own classes.
    Classes,
}

impl Case {
    const ALL: [Case; 3] = [Case::Alone, Case::Shared, Case::Classes];

    fn name(self) -> &'static str {
        match self {
            Case::Alone => "alone",
            Case::Shared => "shared",
            Case::Classes => "classes",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Case::Alone => "cache alone",
            Case::Shared => "cache + bulk, one FIFO",
            Case::Classes => "cache + bulk, per-application classes",
        }
    }
}

/// One case's run.
#[derive(Debug, Clone, Serialize)]
pub struct IsoRun {
    /// Which case.
    pub case: Case,
    /// The generator's report on the cache.
    pub load: LoadReport,
    /// Bulk bytes per second at the sink meanwhile (0 when no bulk ran).
    pub bulk_per_s: f64,
    /// The shaper's classes and what each sent during the run.
    pub classes: Vec<ClassReport>,
    /// Runs made before this one and discarded: the generator lagged in them.
    pub discarded: u32,
}

const CACHE_PORT: u16 = 11311;
const SINK_PORT: u16 = 5201;

/// The cache's and the bulk sender's policies on a link of `link` B/s.
pub fn specs(link: u64) -> [AppSpec; 2] {
    [
        AppSpec {
            name: "cache".into(),
            // TC_PRIO_INTERACTIVE.
            priority: 6,
            mark: 0x4e4c_0001,
            min_rate: link / 10,
            max_rate: link,
            htb_prio: 0,
        },
        AppSpec {
            name: "bulk".into(),
            priority: 0,
            mark: 0x4e4c_0002,
            min_rate: link / 10,
            max_rate: link / 10 * 9,
            htb_prio: 1,
        },
    ]
}

/// Counts bytes of every connection to it, until dropped.
struct Sink {
    bytes: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Sink {
    fn start(h: &TwoHosts) -> Result<Sink> {
        let addr = SocketAddr::new(IpAddr::V4(TwoHosts::TX_V4), SINK_PORT);
        let listener =
            h.tx.run(move || TcpListener::bind(addr))?.with_context(|| format!("bind the sink to {addr}"))?;
        listener.set_nonblocking(true)?;
        let (bytes, stop) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let (b, s) = (bytes.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut readers = Vec::new();
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((c, _)) => {
                        let (b, s) = (b.clone(), s.clone());
                        readers.push(std::thread::spawn(move || drain(c, &b, &s)));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
            for r in readers {
                let _ = r.join();
            }
        });
        Ok(Sink { bytes, stop, thread: Some(thread) })
    }
}

fn drain(mut c: TcpStream, bytes: &AtomicU64, stop: &AtomicBool) {
    if c.set_nonblocking(false).is_err() || c.set_read_timeout(Some(Duration::from_millis(100))).is_err() {
        return;
    }
    let mut buf = vec![0u8; 1 << 16];
    while !stop.load(Ordering::Relaxed) {
        match c.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                bytes.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl LanesBenchArgs {
    /// One round of the isolation part: shaper, cgroups and cache process set up, the
    /// cases run, everything removed again.
    pub(super) fn isolation_round(&self, runner: &mut Runner<'_>, h: &TwoHosts, turn: Turn) -> Result<Vec<IsoRun>> {
        let link = self.isolation_link;
        let [cache, bulk] = specs(link);
        let plan = apps::plan(link, &[cache.clone(), bulk.clone()])?;
        let ifindex = h.rx_index;
        let mut shaper = h.rx.run(move || Shaper::install(ifindex, plan))??;
        let (cache_cg, bulk_cg) = (AppCgroup::create(&cache)?, AppCgroup::create(&bulk)?);
        let addr = SocketAddr::new(IpAddr::V4(TwoHosts::RX_V4), CACHE_PORT);
        let _server = start_cache(h, &cache_cg, addr)?;
        let sink = Sink::start(h)?;
        cache::warm_up(
            runner,
            turn,
            &CacheSite::two_hosts(h),
            "isolation",
            self.load(addr, 8, open(self.search_lo), self.step),
        )?;
        let progress = runner.progress();
        let mut out = Vec::new();
        for i in round_order(Case::ALL.len(), turn.round) {
            let case = Case::ALL[i];
            let what = format!("isolation {}", case.name());
            shaper.classify(case != Case::Shared)?;
            let bulk_proc = if case == Case::Alone {
                None
            } else {
                let sink_at = format!("TCP:{}:{SINK_PORT}", TwoHosts::TX_V4);
                let spec = RoleSpec::program(
                    "the bulk neighbour (socat; scripts/setup.sh installs it)",
                    Program::Other("socat".into()),
                    ["-u", "/dev/zero", sink_at.as_str()],
                );
                let p = RoleProcess::start(&InCgroup { host: &h.rx, cgroup: &bulk_cg }, &spec, None)?;
                // Let its window open before the cache is measured.
                std::thread::sleep(Duration::from_millis(500));
                Some(p)
            };
            let cfg = self.load(addr, self.isolation_connections, open(self.isolation_rate as f64), self.time);
            let once = || -> Result<IsoRun> {
                let before = (sink.bytes.load(Ordering::Relaxed), Instant::now(), shaper.classes()?);
                let cfg = cfg.clone();
                let r = CacheSite::two_hosts(h).run(&cfg)?;
                let secs = before.1.elapsed().as_secs_f64();
                let bulk_per_s = (sink.bytes.load(Ordering::Relaxed) - before.0) as f64 / secs;
                let classes = shaper
                    .classes()?
                    .into_iter()
                    .map(|mut c| {
                        if let Some(b) = before.2.iter().find(|b| b.class == c.class) {
                            c.stats.bytes = c.stats.bytes.saturating_sub(b.stats.bytes);
                            c.stats.packets = c.stats.packets.saturating_sub(b.stats.packets);
                            c.stats.drops = c.stats.drops.saturating_sub(b.stats.drops);
                            c.stats.overlimits = c.stats.overlimits.saturating_sub(b.stats.overlimits);
                        }
                        c
                    })
                    .collect();
                Ok(IsoRun { case, load: r, bulk_per_s, classes, discarded: 0 })
            };
            let run = runner.step(turn, &what, |label| {
                let (mut run, discarded) = unless_generator_lagged(progress, label, once, |r| &r.load)?;
                run.discarded = discarded;
                drop(bulk_proc);
                let line = summary(&run, link);
                Ok((run, line))
            })?;
            let figures = vec![
                ("achieved_per_s", Some(run.load.achieved_per_s)),
                ("p999_us", latency_of(&run.load, "p99.9").ok()),
                ("bulk_bytes_per_s", Some(run.bulk_per_s)),
            ];
            runner.record(turn, &what, figures, &run);
            out.push(run);
        }
        out.sort_by_key(|r| Case::ALL.iter().position(|c| *c == r.case));
        Ok(out)
    }
}

/// `netlane kv serve` in the rx namespace, inside the cache's cgroup, on the lanes'
/// CPUs.
fn start_cache(h: &TwoHosts, cg: &AppCgroup, addr: SocketAddr) -> Result<RoleProcess> {
    let lanes = super::cpu_plan().cpus(crate::plan::Role::Lane).to_vec();
    let cfg = ServerConfig {
        listen: addr,
        threads: lanes.len(),
        cpus: Some(lanes.clone()),
        store: StoreConfig { memory: 256 << 20, ..StoreConfig::default() },
        ..ServerConfig::default()
    };
    let spec = cache::role::kv_serve_spec(&cfg, &lanes);
    let server = RoleProcess::start(&InCgroup { host: &h.rx, cgroup: cg }, &spec, None)?;
    CacheSite::two_hosts(h).wait_until_accepting(addr, "the cache server (netlane kv serve)")?;
    Ok(server)
}

fn summary(r: &IsoRun, link: u64) -> String {
    let l = &r.load;
    let f = |p| latency_of(l, p).map_or("failed".to_string(), |v| format!("{v:.0} us"));
    format!(
        "{:.0}/s of {:.0}/s, p99 {}, p99.9 {} (lagged {:.1}%); bulk {:.0}% of the link at its receiver",
        l.achieved_per_s,
        l.offered_per_s,
        f("p99"),
        f("p99.9"),
        l.lag_share * 100.0,
        r.bulk_per_s / link as f64 * 100.0
    )
}

/// The cache's p99.9 in a run, valid only if the run was sound and, with a neighbour,
/// the neighbour really loaded the link (half of it at least, at its receiver).
fn p999(r: &IsoRun, link: u64) -> Measure {
    percentile(r, link, "p99.9")
}

/// [`p999`] for another percentile.
fn percentile(r: &IsoRun, link: u64, p: &str) -> Measure {
    crate::scenarios::cache::sound(&r.load)?;
    if r.case != Case::Alone && r.bulk_per_s < 0.5 * link as f64 {
        return Err(format!(
            "{}: the bulk neighbour reached only {:.0}% of the link",
            r.case.name(),
            r.bulk_per_s / link as f64 * 100.0
        ));
    }
    latency_of(&r.load, p)
}

/// The isolation table, checks and notes.
pub(super) fn report(args: &LanesBenchArgs, rounds: &[Vec<IsoRun>]) -> (Table, Vec<Check>, Vec<String>) {
    let link = args.isolation_link;
    let mut t = Table::new(
        "lanes-isolation",
        format!(
            "The cache at {}/s over {} connections beside a bulk TCP sender, the link at {}; medians of {} rounds",
            args.isolation_rate,
            args.isolation_connections,
            netlane_report::format::bytes_per_second(link as f64),
            rounds.len()
        ),
        vec![
            Column::new("case", "case", 0),
            Column::new("achieved_per_s", "cache requests/s", 0),
            Column::new("mean_us", "mean us", 1),
            Column::new("p99_us", "p99 us", 1),
            Column::new("p999_us", "p99.9 us", 1),
            Column::new("bulk_share", "bulk, % of link (receiver)", 1),
            Column::new("cache_class_mb", "cache class MB", 2),
            Column::new("bulk_class_mb", "bulk class MB", 2),
            Column::new("other_class_mb", "shared/default class MB", 2),
            Column::new("drops", "qdisc drops", 0),
        ],
    );
    let class_mb = |r: &IsoRun, app: &str| -> Measure {
        r.classes.iter().find(|c| c.app == app).map(|c| c.stats.bytes as f64 / 1e6).ok_or_else(|| "no class".into())
    };
    for case in Case::ALL {
        let rs: Vec<&IsoRun> = rounds.iter().flat_map(|r| r.iter().filter(|x| x.case == case)).collect();
        t.push(Row::new(vec![
            Value::text(case.describe()),
            med(&rs, |r| Ok(r.load.achieved_per_s)),
            med(&rs, |r| mean_of(&r.load)),
            med(&rs, |r| percentile(r, link, "p99")),
            med(&rs, |r| p999(r, link)),
            med(&rs, |r| Ok(r.bulk_per_s / link as f64 * 100.0)),
            med(&rs, |r| class_mb(r, "cache")),
            med(&rs, |r| class_mb(r, "bulk")),
            med(&rs, |r| class_mb(r, "(other)")),
            med(&rs, |r| Ok(r.classes.iter().map(|c| c.stats.drops).sum::<u64>() as f64)),
        ]));
    }
    let of = |case: Case| -> Vec<IsoRun> {
        rounds.iter().filter_map(|r| r.iter().find(|x| x.case == case).cloned()).collect()
    };
    let (alone, shared, classes) = (of(Case::Alone), of(Case::Shared), of(Case::Classes));
    let checks = vec![
        Spec::at_most(
            "lanes.isolation-p999",
            "with a bulk neighbour on the link, per-application classes cut the cache's p99.9 against one shared FIFO",
            0.5,
            "x",
        )
        .evaluate(paired(&classes, &shared, |r| p999(r, link)), "classes / shared p99.9, per round"),
        Spec::at_most(
            "lanes.isolation-p99",
            "with a bulk neighbour on the link, per-application classes cut the cache's p99 against one shared FIFO",
            0.5,
            "x",
        )
        .evaluate(paired(&classes, &shared, |r| percentile(r, link, "p99")), "classes / shared p99, per round"),
        Spec::at_most(
            "lanes.isolation-neighbour",
            "with its own class, the cache's p99.9 beside a bulk neighbour stays near its p99.9 alone",
            2.0,
            "x",
        )
        .evaluate(paired(&classes, &alone, |r| p999(r, link)), "classes / alone p99.9, per round"),
    ];
    let notes = vec![format!(
        "Isolation: every socket of each application gets its priority and mark from a socket program on its cgroup \
         (cache: priority {}, bulk: priority {}); a TCX program on the server's egress puts each packet in its \
         application's htb class by mark: cache guaranteed {} and first to spare bandwidth, bulk guaranteed {} and at \
         most {}. In the shared case the classifier is off and every packet waits in one FIFO at the link's rate. The \
         link is an htb class: this machine's veth has no line rate and no mqprio.",
        specs(link)[0].priority,
        specs(link)[1].priority,
        netlane_report::format::bytes_per_second(specs(link)[0].min_rate as f64),
        netlane_report::format::bytes_per_second(specs(link)[1].min_rate as f64),
        netlane_report::format::bytes_per_second(specs(link)[1].max_rate as f64),
    )];
    (t, checks, notes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenarios::cache::tests::load;
    use netlane_report::Outcome;

    fn run(case: Case, p999_us: f64, bulk_share: f64, link: u64) -> IsoRun {
        IsoRun {
            case,
            load: load(5000.0, p999_us, 0.0),
            bulk_per_s: bulk_share * link as f64,
            classes: Vec::new(),
            discarded: 0,
        }
    }

    fn outcome(checks: &[Check], id: &str) -> Outcome {
        checks.iter().find(|c| c.id == id).unwrap().outcome
    }

    #[test]
    fn classes_are_judged_against_the_shared_fifo_of_the_same_round() {
        let args = LanesBenchArgs::defaults();
        let link = args.isolation_link;
        let round = |shared: f64, classes: f64| {
            vec![
                run(Case::Alone, 300.0, 0.0, link),
                run(Case::Shared, shared, 0.9, link),
                run(Case::Classes, classes, 0.8, link),
            ]
        };
        let (t, checks, _) = report(&args, &[round(8000.0, 400.0), round(9000.0, 500.0)]);
        assert_eq!(t.rows.len(), 3);
        assert_eq!(outcome(&checks, "lanes.isolation-p999"), Outcome::Met);
        assert_eq!(outcome(&checks, "lanes.isolation-p99"), Outcome::Met);
        assert_eq!(outcome(&checks, "lanes.isolation-neighbour"), Outcome::Met);
        let (_, checks, _) = report(&args, &[round(800.0, 700.0), round(900.0, 800.0)]);
        assert_eq!(outcome(&checks, "lanes.isolation-p999"), Outcome::Missed);
    }

    #[test]
    fn a_neighbour_that_did_not_load_the_link_makes_the_checks_invalid() {
        let args = LanesBenchArgs::defaults();
        let link = args.isolation_link;
        let idle = vec![
            run(Case::Alone, 300.0, 0.0, link),
            run(Case::Shared, 300.0, 0.1, link),
            run(Case::Classes, 300.0, 0.1, link),
        ];
        let (_, checks, _) = report(&args, &[idle]);
        assert_eq!(outcome(&checks, "lanes.isolation-p999"), Outcome::Invalid);
        assert_eq!(outcome(&checks, "lanes.isolation-neighbour"), Outcome::Invalid);
    }
}

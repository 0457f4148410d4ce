//! The kv scenario's checks and report from hand-made rounds.

use netlane_kv::loadgen::SearchReport;
use netlane_report::ScenarioReport;

use super::*;
use crate::engines::stalls::Stalls;
use crate::scenarios::Scenario;
use crate::scenarios::cache::tests::load;
use netlane_report::Outcome;

fn run(rate: f64, p999_us: f64, busy_s: f64, late: f64) -> KvRun {
    KvRun {
        load: load(rate, p999_us, late),
        server_busy_s: busy_s,
        server_total_s: 3.0,
        discarded: 0,
        agents: Vec::new(),
    }
}

fn search(best: Option<f64>, capped: bool) -> SearchReport {
    SearchReport {
        sla: "p99.9=1ms".into(),
        best_per_s: best,
        capped,
        generator_limited: false,
        curve: Vec::new(),
        runs: 4,
    }
}

fn round(server: ServerKind, best: Option<f64>, busy_s: f64, late: f64) -> KvRound {
    KvRound {
        server: server.name(),
        searches: vec![search(best, false), search(best, false)],
        rates: vec![run(20_000.0, 900.0, busy_s, late)],
        closed: None,
        floor: None,
    }
}

fn args() -> KvBenchArgs {
    let mut a = KvBenchArgs::defaults();
    a.parts = vec![Part::Sla, Part::Rates];
    a.rates = vec![20_000];
    a.repeat = 2;
    a
}

fn outcome(r: &ScenarioReport, id: &str) -> Outcome {
    r.checks.iter().find(|c| c.id == id).unwrap_or_else(|| panic!("no {id}")).outcome
}

#[test]
fn defaults_validate_their_options_without_root_checks() {
    let d = KvBenchArgs::defaults();
    assert_eq!(d.sla.to_string(), "p99.9=1ms");
    assert!(d.runs() > 0);
}

#[test]
fn paired_rounds_decide_the_targets() {
    let n = vec![round(ServerKind::Netlane, Some(140_000.0), 1.0, 0.0); 2];
    let m = vec![round(ServerKind::Memcached, Some(100_000.0), 1.2, 0.0); 2];
    let r = args().report(&[n, m], Vec::new());
    assert_eq!(outcome(&r, "kv.sla-throughput"), Outcome::Met);
    assert_eq!(outcome(&r, "kv.cpu-per-request"), Outcome::Met);
    let n = vec![round(ServerKind::Netlane, Some(110_000.0), 1.3, 0.0); 2];
    let m = vec![round(ServerKind::Memcached, Some(100_000.0), 1.2, 0.0); 2];
    let r = args().report(&[n, m], Vec::new());
    assert_eq!(outcome(&r, "kv.sla-throughput"), Outcome::Missed);
    assert_eq!(outcome(&r, "kv.cpu-per-request"), Outcome::Missed);
}

#[test]
fn degenerate_runs_are_invalid_never_met() {
    // No rate held the SLA, or every rate did: no capacity was found.
    let n = vec![round(ServerKind::Netlane, None, 1.0, 0.0); 2];
    let m = vec![round(ServerKind::Memcached, Some(100_000.0), 1.2, 0.0); 2];
    assert_eq!(outcome(&args().report(&[n, m], Vec::new()), "kv.sla-throughput"), Outcome::Invalid);
    let mut capped = round(ServerKind::Netlane, Some(300_000.0), 1.0, 0.0);
    capped.searches[0].capped = true;
    let m = vec![round(ServerKind::Memcached, Some(100_000.0), 1.2, 0.0); 2];
    assert_eq!(
        outcome(&args().report(&[vec![capped.clone(), capped], m], Vec::new()), "kv.sla-throughput"),
        Outcome::Invalid
    );
    // A generator that sent 10% late measured itself: no CPU comparison from it.
    let n = vec![round(ServerKind::Netlane, Some(140_000.0), 1.0, 0.10); 2];
    let m = vec![round(ServerKind::Memcached, Some(100_000.0), 1.2, 0.0); 2];
    assert_eq!(outcome(&args().report(&[n, m], Vec::new()), "kv.cpu-per-request"), Outcome::Invalid);
}

#[test]
fn a_rate_the_generator_bounded_proves_only_a_ratio_over_the_target() {
    let limited = |best: f64| {
        let mut r = round(ServerKind::Netlane, Some(best), 1.0, 0.0);
        for s in &mut r.searches {
            s.generator_limited = true;
        }
        r
    };
    let m = vec![round(ServerKind::Memcached, Some(100_000.0), 1.2, 0.0); 2];
    // 1.4x with netlane held back by the generator: at least 1.4x, met.
    let r = args().report(&[vec![limited(140_000.0); 2], m.clone()], Vec::new());
    assert_eq!(outcome(&r, "kv.sla-throughput"), Outcome::Met);
    // 1.1x so held back: the true ratio may be anything above, so undecided.
    let r = args().report(&[vec![limited(110_000.0); 2], m.clone()], Vec::new());
    assert_eq!(outcome(&r, "kv.sla-throughput"), Outcome::Invalid);
    // memcached held back: its rate is a lower bound, so no ratio is proven.
    let mut mm = round(ServerKind::Memcached, Some(100_000.0), 1.2, 0.0);
    mm.searches[0].generator_limited = true;
    let n = vec![round(ServerKind::Netlane, Some(200_000.0), 1.0, 0.0); 2];
    let r = args().report(&[n, vec![mm.clone(), mm]], Vec::new());
    assert_eq!(outcome(&r, "kv.sla-throughput"), Outcome::Invalid);
}

#[test]
fn a_search_that_found_no_rate_shows_its_servers_floor() {
    let stalls = |long_us: Vec<u64>| Stalls {
        cpu: 1,
        seconds: 10.0,
        samples: 10_000,
        max_us: long_us.first().copied().unwrap_or(20),
        p999_us: 30,
        over_1ms: long_us.iter().filter(|&&l| l >= 1000).count() as u64,
        long_us,
    };
    // Three 40 ms stalls in 10 s delay 1.17% of requests past 1 ms.
    let noisy = stalls(vec![40_000; 3]);
    assert!((noisy.delayed_share(1000) - 0.0117).abs() < 1e-9);
    let mut n = round(ServerKind::Netlane, None, 1.0, 0.0);
    n.floor = Some((run(10_000.0, 2500.0, 1.0, 0.0), noisy.clone()));
    let mut m = round(ServerKind::Memcached, None, 1.2, 0.0);
    m.floor = Some((run(10_000.0, 3500.0, 1.2, 0.0), noisy));
    let r = args().report(&[vec![n.clone(), n], vec![m.clone(), m]], Vec::new());
    let c = r.checks.iter().find(|c| c.id == "kv.sla-throughput").unwrap();
    assert_eq!(c.outcome, Outcome::Invalid);
    assert!(c.reason.contains("netlane at 10000/s: p99.9 2500 us"), "{}", c.reason);
    assert!(c.reason.contains("alone delaying 1.170% of requests past 1 ms"), "{}", c.reason);
    assert!(r.tables.iter().any(|t| t.name == "kv-floor"));
    assert!(
        r.notes.iter().any(|n| n.contains("0 of 4 such runs held 1 ms") && n.contains("Below the floor")),
        "{:?}",
        r.notes
    );
}

#[test]
fn runs_made_by_agents_show_each_agent_beside_the_merged_run() {
    let args = KvBenchArgs { parts: vec![Part::Rates], rates: vec![10_000], ..KvBenchArgs::defaults() };
    let mut r = round(ServerKind::Netlane, None, 1.0, 0.0);
    r.rates = vec![run(10_000.0, 200.0, 1.0, 0.0)];
    let report = args.report(&[vec![r.clone()], vec![r.clone()]], Vec::new());
    assert!(report.tables.iter().all(|t| t.name != "kv-agents"), "one generator: no agents table");
    let agent = |host: &str, offered: f64| AgentSummary {
        host: host.into(),
        connections: 100,
        offered_per_s: offered,
        achieved_per_s: offered,
        lag_share: 0.001,
        cpu_s: 0.5,
        cpu_busy: 0.2,
        connection_failures: 0,
    };
    r.rates[0].agents = vec![agent("host c1", 5_010.0), agent("host c2", 4_990.0)];
    let report = args.report(&[vec![r.clone()], vec![r]], Vec::new());
    let t = report.tables.iter().find(|t| t.name == "kv-agents").expect("an agents table");
    assert_eq!(t.rows.len(), 4, "two agents of each server's run");
}

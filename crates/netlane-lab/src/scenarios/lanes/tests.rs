//! The lanes scenario's checks and plan against described rounds and machines.

use super::*;

use netlane::cpus::machine::CpuTopology;
use netlane::metrics::kstat::KernelCounters;
use netlane_kv::loadgen::SearchReport;

use crate::scenarios::cache::tests::load;

use crate::plan::{CpuPlan, Role};
use netlane_report::Outcome;

fn search(best: Option<f64>) -> SearchReport {
    SearchReport {
        sla: "p99=500us".into(),
        best_per_s: best,
        capped: false,
        generator_limited: false,
        curve: Vec::new(),
        runs: 4,
    }
}

fn round(mode: Mode, best: Option<f64>, p999_us: f64, lag: f64) -> LaneRound {
    // More connections hold less, alike for every mode.
    let sweep = [(1024, 0.8), (4096, 0.6)]
        .into_iter()
        .map(|(connections, share)| super::sweep::SweepPoint { connections, search: search(best.map(|b| b * share)) })
        .collect();
    LaneRound {
        mode,
        search: Some(search(best)),
        sweep,
        runs: vec![LaneRun {
            connections: 64,
            rate: 20_000,
            load: load(20_000.0, p999_us, lag),
            busy_s: 2.0,
            kernel: KernelCounters::default(),
            discarded: 0,
            tx_queues: vec![30_000, 30_000],
        }],
        lanes: None,
        rfs: None,
    }
}

fn two_cpus() -> CpuPlan {
    plan_on(&CpuTopology::uniform(1, 2, 1))
}

fn args() -> LanesBenchArgs {
    let mut a = LanesBenchArgs::defaults();
    a.modes = vec![Mode::Plain, Mode::Napi];
    a.connections = vec![64];
    a.rates = vec![20_000];
    a.repeat = 2;
    a
}

fn outcome(r: &ScenarioReport, id: &str) -> Outcome {
    r.checks.iter().find(|c| c.id == id).unwrap_or_else(|| panic!("no {id}")).outcome
}

#[test]
fn paired_rounds_decide_the_alignment_targets() {
    let plain = vec![round(Mode::Plain, Some(50_000.0), 3000.0, 0.0); 2];
    let napi = vec![round(Mode::Napi, Some(90_000.0), 1000.0, 0.0); 2];
    let r = args().report(&[plain.clone(), napi], &[], Some(&two_cpus()), &[], Vec::new());
    assert_eq!(outcome(&r, "lanes.aligned-throughput"), Outcome::Met);
    assert_eq!(outcome(&r, "lanes.aligned-p999"), Outcome::Met);
    assert_eq!(outcome(&r, "lanes.busy-poll-throughput"), Outcome::Skipped);
    let napi = vec![round(Mode::Napi, Some(55_000.0), 2900.0, 0.0); 2];
    let r = args().report(&[plain, napi], &[], Some(&two_cpus()), &[], Vec::new());
    assert_eq!(outcome(&r, "lanes.aligned-throughput"), Outcome::Missed);
    assert_eq!(outcome(&r, "lanes.aligned-p999"), Outcome::Missed);
}

#[test]
fn degenerate_rounds_are_invalid_never_met() {
    // No rate held, or the generator lagged: nothing is proven about the server.
    let plain = vec![round(Mode::Plain, None, 3000.0, 0.0); 2];
    let napi = vec![round(Mode::Napi, Some(90_000.0), 1000.0, 0.2); 2];
    let r = args().report(&[plain, napi], &[], Some(&two_cpus()), &[], Vec::new());
    assert_eq!(outcome(&r, "lanes.aligned-throughput"), Outcome::Invalid);
    assert_eq!(outcome(&r, "lanes.aligned-p999"), Outcome::Invalid);
    let mut limited = round(Mode::Napi, Some(90_000.0), 1000.0, 0.0);
    limited.search.as_mut().unwrap().generator_limited = true;
    let plain = vec![round(Mode::Plain, Some(50_000.0), 3000.0, 0.0); 2];
    let r = args().report(&[plain, vec![limited.clone(), limited]], &[], Some(&two_cpus()), &[], Vec::new());
    assert_eq!(outcome(&r, "lanes.aligned-throughput"), Outcome::Invalid);
}

#[test]
fn busy_polling_beside_the_generator_is_not_shown_on_two_cpus() {
    let mut a = args();
    a.modes = vec![Mode::Napi, Mode::NapiBusy];
    let rounds = [
        vec![round(Mode::Napi, Some(50_000.0), 1000.0, 0.0); 2],
        vec![round(Mode::NapiBusy, Some(60_000.0), 900.0, 0.0); 2],
    ];
    let r = a.report(&rounds, &[], Some(&two_cpus()), &[], Vec::new());
    assert_eq!(outcome(&r, "lanes.busy-poll-throughput"), Outcome::NotShown);
    let c = r.checks.iter().find(|c| c.id == "lanes.busy-poll-throughput").unwrap();
    assert!(c.reason.starts_with("needs 4 CPUs") && c.reason.contains("generator 0,1 (beside lane)"), "{}", c.reason);
    assert_eq!(r.cpu_plan.len(), 3);
    // On eight CPUs the roles are apart and the check is decided.
    let r = a.report(&rounds, &[], Some(&plan_on(&CpuTopology::uniform(1, 8, 1))), &[], Vec::new());
    assert_eq!(outcome(&r, "lanes.busy-poll-throughput"), Outcome::Met);
    assert!(r.cpu_plan.iter().all(|p| p.beside.is_none()), "{:?}", r.cpu_plan);
    // On a testbed (no plan of this machine) the generators have machines of their own.
    let r = a.report(&rounds, &[], None, &[], Vec::new());
    assert_eq!(outcome(&r, "lanes.busy-poll-throughput"), Outcome::Met);
}

#[test]
fn the_napi_id_change_and_rfs_are_paired_against_their_baselines() {
    let mut a = args();
    a.modes = vec![Mode::PlainBusy, Mode::NapiBusy, Mode::Rfs, Mode::Napi];
    let rounds = [
        vec![round(Mode::PlainBusy, Some(50_000.0), 2000.0, 0.0); 2],
        vec![round(Mode::NapiBusy, Some(58_000.0), 1500.0, 0.0); 2],
        vec![round(Mode::Rfs, Some(60_000.0), 1500.0, 0.0); 2],
        vec![round(Mode::Napi, Some(54_000.0), 1200.0, 0.0); 2],
    ];
    // Two CPUs: the busy-polling pair spins beside the generator, not shown; RFS against
    // NAPI-id lanes needs no spare CPU and is decided (here missed: RFS held more).
    let r = a.report(&rounds, &[], Some(&two_cpus()), &[], Vec::new());
    assert_eq!(outcome(&r, "lanes.napi-id-change"), Outcome::NotShown);
    assert_eq!(outcome(&r, "lanes.napi-id-change-p999"), Outcome::NotShown);
    assert_eq!(outcome(&r, "lanes.napi-over-rfs"), Outcome::Missed);
    let r = a.report(&rounds, &[], Some(&plan_on(&CpuTopology::uniform(1, 8, 1))), &[], Vec::new());
    assert_eq!(outcome(&r, "lanes.napi-id-change"), Outcome::Met, "58k / 50k = 1.16 >= 1.1");
    assert_eq!(outcome(&r, "lanes.napi-id-change-p999"), Outcome::Met);
    // Without its baseline a check is skipped, never decided.
    a.modes = vec![Mode::NapiBusy, Mode::Napi];
    let r = a.report(&[rounds[1].clone(), rounds[3].clone()], &[], None, &[], Vec::new());
    assert_eq!(outcome(&r, "lanes.napi-id-change"), Outcome::Skipped);
    assert_eq!(outcome(&r, "lanes.napi-over-rfs"), Outcome::Skipped);
}

#[test]
fn threaded_busy_polling_refused_by_the_kernel_is_not_shown_with_its_answer() {
    let mut a = args();
    a.modes = vec![Mode::Napi, Mode::Plain];
    let rounds = [
        vec![round(Mode::Napi, Some(54_000.0), 1200.0, 0.0); 2],
        vec![round(Mode::Plain, Some(50_000.0), 2000.0, 0.0); 2],
    ];
    let mut r = a.report(&rounds, &[], None, &[], Vec::new());
    assert_eq!(outcome(&r, "lanes.threaded-busy-poll"), Outcome::Skipped);
    super::report::threaded_not_here(&mut r, "napi-set threaded=busy-poll refused: integer out of range");
    let c = r.checks.iter().find(|c| c.id == "lanes.threaded-busy-poll").unwrap();
    assert_eq!(c.outcome, Outcome::NotShown);
    assert!(c.reason.contains("integer out of range") && c.reason.contains("busy-poll"), "{}", c.reason);
    // Without the search (no pair checks), the check is still there to say why.
    a.no_search = true;
    let mut r = a.report(&rounds, &[], None, &[], Vec::new());
    super::report::threaded_not_here(&mut r, "refused");
    assert_eq!(outcome(&r, "lanes.threaded-busy-poll"), Outcome::NotShown);
}

#[test]
fn the_plan_keeps_lanes_napi_threads_and_generators_apart_where_the_cpus_allow() {
    // 2 CPUs: a lane, its NAPI thread and a generator thread on each (as before the
    // plan); 8 and 64 (with SMT and two nodes): every role on CPUs of its own.
    let p = plan_on(&CpuTopology::uniform(1, 2, 1));
    assert_eq!(
        (p.cpus(Role::Lane), p.cpus(Role::Napi), p.cpus(Role::Generator)),
        (&[0, 1][..], &[0, 1][..], &[0, 1][..])
    );
    for m in [CpuTopology::uniform(1, 8, 1), CpuTopology::uniform(2, 16, 2)] {
        let p = plan_on(&m);
        assert!(
            p.apart(Role::Lane, Role::Napi)
                && p.apart(Role::Lane, Role::Generator)
                && p.apart(Role::Napi, Role::Generator),
            "{} CPUs: {}",
            m.len(),
            p.describe()
        );
    }
}

#[test]
fn defaults_parse_and_count_their_runs() {
    let d = LanesBenchArgs::defaults();
    assert_eq!(d.modes.len(), 9);
    // Per round: warm-up, search and four fixed rates per mode; the sweep's two searches
    // of plain and napi; the isolation part's warm-up and three cases.
    assert_eq!(d.runs(), ((1 + 1 + 4) * 9 + 2 * 2 + 1 + 3) * 3);
    assert_eq!(d.busy_poll.to_string(), "50,8");
}

#[test]
fn a_testbed_counts_no_runs_for_what_it_leaves_out() {
    let mut a = args();
    a.modes = vec![Mode::Plain, Mode::MemcachedN, Mode::Rfs];
    a.no_isolation = false;
    // Per mode and round: a warm-up, the search, one fixed rate; plain's sweep of two
    // searches; the isolation part 4.
    assert_eq!(a.runs(), (3 * 3 + 2 + 4) * 2);
    a.on.testbed = Some("testbed.toml".into());
    assert_eq!(a.runs(), (3 + 2) * 2, "memcached -N, rfs and the isolation part stay on one machine");
}

#[test]
fn the_sweep_tables_each_count_and_judges_the_largest() {
    let mut a = args();
    a.no_sweep = false;
    a.sweep_connections = vec![1024, 4096];
    let plain = vec![round(Mode::Plain, Some(50_000.0), 3000.0, 0.0); 2];
    let mut napi = vec![round(Mode::Napi, Some(90_000.0), 1000.0, 0.0); 2];
    let r = a.report(&[plain.clone(), napi.clone()], &[], Some(&two_cpus()), &[], Vec::new());
    let t = r.tables.iter().find(|t| t.name == "lanes-sweep").expect("the sweep's table");
    assert_eq!(t.rows.len(), 3, "the search's count and the sweep's two");
    assert_eq!(outcome(&r, "lanes.aligned-throughput-connections"), Outcome::Met);
    // At 4096 connections napi held no rate: nothing is shown there.
    for n in &mut napi {
        n.sweep[1].search.best_per_s = None;
    }
    let r = a.report(&[plain, napi], &[], Some(&two_cpus()), &[], Vec::new());
    assert_eq!(outcome(&r, "lanes.aligned-throughput-connections"), Outcome::Invalid);
    // Without the sweep, no table and no check.
    a.no_sweep = true;
    let r = a.report(&[vec![], vec![]], &[], Some(&two_cpus()), &[], Vec::new());
    assert!(r.tables.iter().all(|t| t.name != "lanes-sweep"));
}

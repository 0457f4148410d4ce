//! The lb-pps scenario's checks and report from hand-made results.

use netlane_lb::HintMode;
use netlane_report::{FlagKind, ScenarioReport, Value};

use netlane::cpus::machine::CpuTopology;

use super::LbPpsArgs;
use super::checks::paired_slices;
use super::plan::{placement, plan_on, two_cores_apart};
use crate::engines::lb_pps::{PpsCpus, PpsResult, Subject};
use crate::plan::CpuPlan;
use crate::verdict::Spec;

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
    let hint_hit_ratio = if subject.hint().is_some_and(|h| h != HintMode::Off) { 1.0 } else { 0.0 };
    PpsResult { subject, flows, cores: subject.cores(), mpps_per_core: mpps, hint_hit_ratio, ..result(vec![mpps; 6]) }
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
    let r = a.report(&all(Some(2.0)), &four_cpus());
    let get = |r: &ScenarioReport, id: &str| r.checks.iter().find(|c| c.id == id).unwrap().outcome;
    assert_eq!(get(&r, "lb-pps.untagged-vs-ceiling-1"), netlane_report::Outcome::Missed, "3.0 / 4.5 < 0.7");
    assert_eq!(get(&r, "lb-pps.flow-tag-vs-untagged-10000"), netlane_report::Outcome::Met);
    assert_eq!(get(&r, "lb-pps.flow-tag-vs-untagged-1"), netlane_report::Outcome::Met, "4.2 / 3.0 = 1.4");
    assert_eq!(get(&r, "lb-pps.dest-tag-vs-untagged-100"), netlane_report::Outcome::Met);
    assert_eq!(get(&r, "lb-pps.dest-tag-1000000-vs-100"), netlane_report::Outcome::Met, "4.3 / 4.3");
    // The untagged program's NAPI thread got no CPU in any slice at 10 K flows.
    let r = a.report(&all(None), &four_cpus());
    for id in
        ["lb-pps.untagged-vs-ceiling-10000", "lb-pps.flow-tag-vs-untagged-10000", "lb-pps.dest-tag-vs-untagged-10000"]
    {
        assert_eq!(get(&r, id), netlane_report::Outcome::Invalid, "{id}");
    }
    assert_eq!(get(&r, "lb-pps.untagged-vs-ceiling-1"), netlane_report::Outcome::Missed, "3.0 / 4.5 < 0.7");
    assert!(r.checks.iter().all(|c| !c.id.contains("two-cores")), "no two-core check without two-core runs");
}

#[test]
fn the_headline_is_the_talk_s_claim_tagged_against_untagged() {
    let a = LbPpsArgs::defaults();
    let r = a.report(&all(Some(2.0)), &four_cpus());
    assert_eq!(
        r.headline,
        "At 1 flow(s), flow tags ran at 1.40x and destination tags at 1.43x the untagged balancer's packets per \
         core; at 1000000 flows destination tags ran at 1.43x."
    );
    // Without tagged runs: the untagged balancer against the ceiling.
    let untagged: Vec<PpsResult> = all(Some(2.0))
        .into_iter()
        .filter(|r| !matches!(r.subject, Subject::Balancer(m) if m != HintMode::Off))
        .collect();
    let r = a.report(&untagged, &four_cpus());
    assert_eq!(r.headline, "Untagged, the balancer ran at 0.667x the XDP_TX ceiling at 1 flows.");
    // With the direct variant: its figure beside the checked destination tags', its own
    // checks against untagged, and the note that says what it skips.
    let mut runs = all(Some(2.0));
    runs.extend([1u32, 100, 10_000, 1_000_000].map(|f| at(f, Subject::Balancer(HintMode::DestTagDirect), Some(4.5))));
    let r = a.report(&runs, &four_cpus());
    assert_eq!(
        r.headline,
        "At 1 flow(s), flow tags ran at 1.40x and destination tags at 1.43x (skipping the transport header: 1.50x) \
         the untagged balancer's packets per core; at 1000000 flows destination tags ran at 1.43x."
    );
    let direct = r.checks.iter().find(|c| c.id == "lb-pps.dest-tag-direct-vs-untagged-1").unwrap();
    assert_eq!(direct.outcome, netlane_report::Outcome::Met, "4.5 / 3.0");
    let vs = r.checks.iter().find(|c| c.id == "lb-pps.dest-tag-direct-vs-dest-tag-1").unwrap();
    assert_eq!(vs.outcome, netlane_report::Outcome::Met, "4.5 / 4.3");
    // A variant whose packets fell back to the checked path measured the wrong thing.
    runs.iter_mut().filter(|r| r.subject == Subject::Balancer(HintMode::DestTagDirect)).for_each(|r| {
        r.hint_hit_ratio = 0.5;
    });
    let r = a.report(&runs, &four_cpus());
    let vs = r.checks.iter().find(|c| c.id == "lb-pps.dest-tag-direct-vs-dest-tag-1").unwrap();
    assert_eq!(vs.outcome, netlane_report::Outcome::Invalid, "{vs:?}");
    assert!(r.notes.iter().any(|n| n.starts_with("dest-tag-direct is the talk's")), "{:?}", r.notes);
}

#[test]
fn one_million_flows_against_a_hundred_divides_out_the_drift_of_the_machine() {
    let get = |v: &[PpsResult]| {
        let r = LbPpsArgs::defaults().report(v, &four_cpus());
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
    let r = LbPpsArgs::defaults().report(&v, &four_cpus());
    let get = |id: &str| r.checks.iter().find(|c| c.id == id).unwrap().outcome;
    assert_eq!(get("lb-pps.two-cores-dest-tag-vs-untagged-100"), netlane_report::Outcome::Met, "3.9 / 2.7");
    assert_eq!(get("lb-pps.two-cores-flow-tag-vs-untagged-100"), netlane_report::Outcome::Missed, "3.0 / 2.7");
    // On two CPUs each balancer thread shares its CPU with a generator: not shown.
    let two = LbPpsArgs::defaults().report(&v, &plan_on(&CpuTopology::uniform(1, 2, 1)));
    for tag in ["flow-tag", "dest-tag"] {
        let c = two.checks.iter().find(|c| c.id == format!("lb-pps.two-cores-{tag}-vs-untagged-100")).unwrap();
        assert_eq!(c.outcome, netlane_report::Outcome::NotShown, "{}", c.reason);
        assert!(c.reason.starts_with("needs 4 CPUs") && c.reason.contains("gives 2"), "{}", c.reason);
    }
    assert_eq!(two.cpu_plan.len(), 2, "{:?}", two.cpu_plan);
    let napi = two.cpu_plan.iter().find(|r| r.role == "napi").unwrap();
    assert_eq!((napi.cpus.clone(), napi.beside.as_deref()), (vec![1, 0], Some("generator")), "where they ran");
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
    let r = LbPpsArgs::defaults().report(&v, &four_cpus());
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

fn four_cpus() -> CpuPlan {
    plan_on(&CpuTopology::uniform(1, 4, 1))
}

#[test]
fn the_plan_keeps_generators_and_balancer_threads_apart_where_the_cpus_allow() {
    // Two CPUs: one-core turns apart, each balancer thread on the other generator's CPU.
    let p = placement(&plan_on(&CpuTopology::uniform(1, 2, 1)));
    assert_eq!(p, PpsCpus { generators: [0, 1], balancers: [1, 0] });
    assert_eq!(p.queues(), 2);
    // Three CPUs still cannot give four threads CPUs of their own.
    let three = plan_on(&CpuTopology::uniform(1, 3, 1));
    assert!(!two_cores_apart(&three));
    assert_eq!(placement(&three), PpsCpus { generators: [0, 1], balancers: [1, 0] });
    for machine in [CpuTopology::uniform(1, 4, 1), CpuTopology::uniform(1, 8, 1), CpuTopology::uniform(2, 64, 2)] {
        let plan = plan_on(&machine);
        assert!(two_cores_apart(&plan), "{}", plan.describe());
        let p = placement(&plan);
        let all: Vec<usize> = p.generators.iter().chain(&p.balancers).copied().collect();
        assert!(all.iter().enumerate().all(|(i, c)| !all[..i].contains(c)), "{p:?}");
        assert!(p.queues() <= 64, "veth's most queues: {p:?}");
    }
}

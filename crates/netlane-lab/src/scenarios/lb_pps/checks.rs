//! What the lb-pps scenario's targets compare: the results by flow count and program,
//! two programs' slices paired round by round (a program's over its ceiling's, to
//! divide out the machine's drift); and the checks themselves, as one list.

use netlane_lb::HintMode;
use netlane_report::Check;

use crate::engines::lb_pps::{PpsResult, Subject};
use crate::plan::{CpuPlan, Role};
use crate::verdict::{Measure, Spec};

/// The engine's results, looked up by flow count and program.
pub(super) struct Runs<'a> {
    /// Every result, in the order the engine returned them.
    pub(super) results: &'a [PpsResult],
    /// The flow counts, in the order they ran.
    pub(super) flows: Vec<u32>,
    /// The programs, in the order they first ran.
    pub(super) subjects: Vec<Subject>,
}

impl<'a> Runs<'a> {
    /// `results` as the engine returns them: grouped by flow count, in the order the
    /// flow counts ran.
    pub(super) fn of(results: &'a [PpsResult]) -> Runs<'a> {
        let mut flows: Vec<u32> = results.iter().map(|r| r.flows).collect();
        flows.dedup();
        let mut subjects: Vec<Subject> = Vec::new();
        for r in results {
            if !subjects.contains(&r.subject) {
                subjects.push(r.subject);
            }
        }
        Runs { results, flows, subjects }
    }

    /// The result of `s` at `flows` flows, when it ran.
    pub(super) fn find(&self, flows: u32, s: Subject) -> Option<&'a PpsResult> {
        self.results.iter().find(|r| r.flows == flows && r.subject == s)
    }
}

/// Paired samples of `a / b`, slice by slice; slices where either side measured nothing
/// are left out, and a check with fewer than half its slices measured is invalid.
pub(super) fn paired_slices(a: &PpsResult, b: &PpsResult) -> (Vec<Measure>, usize) {
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

/// `a / b` slice by slice, and how many slices were left out. Unlike
/// [`crate::verdict::paired`], a slice that measured nothing is left out rather than
/// made an invalid sample; only too few measured slices make the check invalid.
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

/// `spec` over `a`'s slices paired with `b`'s (`how` says so), or skipped for `needs`
/// when either did not run.
fn pair(spec: Spec, a: Option<&PpsResult>, b: Option<&PpsResult>, how: &str, needs: String) -> Check {
    match (a, b) {
        (Some(a), Some(b)) => {
            let (s, dropped) = paired_slices(a, b);
            spec.evaluate(s, &slice_note(how, dropped))
        }
        _ => spec.skipped(needs),
    }
}

/// The tag modes, each checked against the untagged balancer.
const TAGGED: [HintMode; 3] = [HintMode::FlowTag, HintMode::DestTag, HintMode::DestTagDirect];

/// The targets, in the report's order: the untagged balancer against the ceiling at
/// every flow count, each tag mode against untagged, destination tags that skip the
/// transport header against those that read it, the same on two cores, and
/// per-destination tags at 1 M flows against 100. The two-core ones are not shown where
/// `plan` had generators and balancer threads share CPUs.
pub(super) fn checks(runs: &Runs<'_>, plan: &CpuPlan) -> Vec<Check> {
    let (flows, find) = (&runs.flows, |f: u32, s: Subject| runs.find(f, s));
    let off = Subject::Balancer(HintMode::Off);
    let mut checks: Vec<Check> = Vec::new();
    for &f in flows {
        let spec = Spec::at_least(
            &format!("lb-pps.untagged-vs-ceiling-{f}"),
            format!("{f} flows: untagged balancer vs the XDP_TX ceiling (Mpps per core)"),
            0.7,
            "x",
        );
        let how = "untagged / ceiling Mpps per core, per slice";
        checks.push(pair(spec, find(f, off), find(f, Subject::XdpTxCeiling), how, "needs the off mode".into()));
    }
    // The talk: marked packets skip parsing and the lookups, +40% at small flow
    // counts; at 10 K and 1 M flows the connection table misses the caches.
    for (f, min) in [(1u32, 1.4), (100, 1.4), (10_000, 1.25), (1_000_000, 1.0)] {
        if !flows.contains(&f) {
            continue;
        }
        for tag in TAGGED {
            let spec = Spec::at_least(
                &format!("lb-pps.{}-vs-untagged-{f}", tag.name()),
                format!("{f} flows: {} vs untagged (Mpps per core)", tag.name()),
                min,
                "x",
            );
            let how = format!("{} / untagged Mpps per core, per slice", tag.name());
            let needs = format!("needs the off and {} modes", tag.name());
            checks.push(pair(spec, find(f, Subject::Balancer(tag)), find(f, off), &how, needs));
        }
    }

    // Skipping the transport header against reading it, where parsing is the larger
    // share of the work: at the fewest flows.
    if let Some(&f) = flows.first() {
        let (direct, checked) = (HintMode::DestTagDirect, HintMode::DestTag);
        let spec = Spec::at_least(
            &format!("lb-pps.dest-tag-direct-vs-dest-tag-{f}"),
            format!("{f} flows: destination tags skipping the transport header vs reading it (Mpps per core)"),
            1.0,
            "x",
        );
        let how = "dest-tag-direct / dest-tag Mpps per core, per slice";
        let needs = "needs the dest-tag and dest-tag-direct modes".to_string();
        let d = find(f, Subject::Balancer(direct));
        checks.push(match d.map(|r| r.hint_hit_ratio) {
            // The variant's packets must have taken its path, not fallen back to the
            // checked one.
            Some(share) if share < 0.99 => spec.invalid(format!(
                "only {:.1}% of dest-tag-direct's packets skipped the transport header",
                share * 100.0
            )),
            _ => pair(spec, d, find(f, Subject::Balancer(checked)), how, needs),
        });
    }

    // The talk's multi-core result (12 cores: 26 -> ~40 Mpps at small flow counts), on
    // two balancer cores. (One flow cannot use two queues.)
    if flows.contains(&100) && runs.results.iter().any(|r| r.cores == 2) {
        for tag in TAGGED {
            let spec = Spec::at_least(
                &format!("lb-pps.two-cores-{}-vs-untagged-100", tag.name()),
                format!("two cores, 100 flows: {} vs untagged (Mpps per core)", tag.name()),
                1.4,
                "x",
            );
            let (tg, un) = (Subject::TwoCoreBalancer(tag), Subject::TwoCoreBalancer(HintMode::Off));
            let how = format!("{} / untagged Mpps per core on two cores, per slice", tag.name());
            let needs = format!("needs the off and {} modes on two cores", tag.name());
            checks.push(if super::plan::two_cores_apart(plan) {
                pair(spec, find(100, tg), find(100, un), &how, needs)
            } else {
                // Each balancer thread would share its CPU with a generator, whose cost
                // is the same whichever program runs: the ratio would shrink toward 1.
                spec.not_shown(
                    plan.needs(&[Role::Generator, Role::Napi]),
                    plan.available(),
                    "two generators and the balancer's two NAPI threads apart",
                    &super::plan::describe(plan),
                )
            });
        }
    }

    // Per-destination tags do not grow with the flows: 1 M flows like 100.
    if flows.contains(&100) && flows.contains(&1_000_000) {
        checks.push(dest_tag_flat(runs));
    }
    checks
}

/// Per-destination tags at 1 M flows against 100, each over the ceiling of its own
/// rounds.
fn dest_tag_flat(runs: &Runs<'_>) -> Check {
    let tag = Subject::Balancer(HintMode::DestTag);
    let spec = Spec::at_least(
        "lb-pps.dest-tag-1000000-vs-100",
        "dest-tag: 1 M flows vs 100 flows (Mpps per core over the XDP_TX ceiling's)",
        0.9,
        "x",
    );
    let ceiling = Subject::XdpTxCeiling;
    let find = |f: u32, s: Subject| runs.find(f, s);
    match (find(1_000_000, tag), find(1_000_000, ceiling), find(100, tag), find(100, ceiling)) {
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
    }
}

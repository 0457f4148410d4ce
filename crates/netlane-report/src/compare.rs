//! Two results documents side by side (`netlane compare A B`): a lab's or a bench's, of
//! two commits, two machines or two settings.
//!
//! Noise-aware: each side carries its own spread (a check's paired samples, a metric's
//! repeats over rounds), and a difference counts only when the two ranges do not touch
//! and the medians differ by more than a tolerance. A check's target says which way is
//! better, so a check that moved counts as regressed or improved; a metric has no
//! direction of its own, so a metric only moved. A check that was measured in A and is
//! invalid in B regressed: the path it measured broke. One that a side did not run
//! (skipped: its plan left a mode out) or could not show is not comparable.
//!
//! The spread within one run can understate the noise between runs (a machine's state
//! drifts between them), so A may be several alike runs: their samples are pooled, and
//! how far their medians lie apart widens the tolerance of that check or metric.

use std::collections::{BTreeMap, BTreeSet};

use pool::{pool, unlike};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::model::{Check, Host, Op, Outcome, Provenance, RunRecord, SCHEMA_VERSION, Spread, Target};

/// The schema versions whose lab and bench documents compare: their checks and metrics
/// kept their layout from 1 to 2 (version 2 changed the load generators' latencies).
const COMPARES: std::ops::RangeInclusive<u32> = 1..=SCHEMA_VERSION;

/// How far apart two medians must be, as a share of the larger, before a difference counts
/// (when the ranges do not touch either).
pub const DEFAULT_TOLERANCE: f64 = 0.10;

/// The parts of a results document a comparison reads (a lab's or a bench's; the other
/// fields are ignored).
#[derive(Debug, Clone, Deserialize)]
pub struct Compared {
    kind: String,
    provenance: Provenance,
    host: Host,
    #[serde(default)]
    quick: bool,
    scenarios: Vec<ComparedScenario>,
}

#[derive(Debug, Clone, Deserialize)]
struct ComparedScenario {
    name: String,
    #[serde(default)]
    echo: Vec<String>,
    checks: Vec<Check>,
    runs: Vec<RunRecord>,
}

/// Why a document cannot be compared.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    /// Not JSON of the results layout.
    #[error("not a netlane results document (a lab's or a bench's results)")]
    Layout(#[source] serde_json::Error),
    /// A check id or scenario name that appears twice: which one of them to compare?
    #[error("{0} appears twice")]
    Duplicate(String),
    /// Another kind of document.
    #[error("a {0} document: only a lab's or a bench's results compare")]
    Kind(String),
    /// A layout this version does not read.
    #[error("schema version {0}; this netlane compares versions 1 to {SCHEMA_VERSION}")]
    Version(u32),
}

impl Compared {
    /// Reads a document's JSON text.
    pub fn parse(text: &str) -> Result<Compared, CompareError> {
        #[derive(Deserialize)]
        struct Header {
            schema_version: u32,
            kind: String,
        }
        let h: Header = serde_json::from_str(text).map_err(CompareError::Layout)?;
        if h.kind != "lab" && h.kind != "bench" {
            return Err(CompareError::Kind(h.kind));
        }
        if !COMPARES.contains(&h.schema_version) {
            return Err(CompareError::Version(h.schema_version));
        }
        let doc: Compared = serde_json::from_str(text).map_err(CompareError::Layout)?;
        let mut seen = BTreeSet::new();
        for s in &doc.scenarios {
            if !seen.insert(format!("scenario {}", s.name)) {
                return Err(CompareError::Duplicate(format!("scenario {}", s.name)));
            }
            for c in &s.checks {
                if !seen.insert(format!("check {}", c.id)) {
                    return Err(CompareError::Duplicate(format!("check {}", c.id)));
                }
            }
        }
        Ok(doc)
    }
}

/// One side of a comparison: where its numbers come from.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct Side {
    /// The file it was read from.
    pub path: String,
    /// `lab` or `bench`.
    pub kind: String,
    /// Its run.
    pub run_id: String,
    /// The commit that built it.
    pub git_commit: String,
    /// Whether it was a quick lab.
    pub quick: bool,
    /// The machine.
    pub host: Host,
}

/// Median and range of one side's samples.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, JsonSchema)]
pub struct Sampled {
    /// Median.
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
    /// How many samples.
    pub n: usize,
}

impl Sampled {
    fn of(values: &[f64]) -> Option<Sampled> {
        Spread::of(values).map(|s| Sampled { median: s.median, min: s.min, max: s.max, n: s.n })
    }

    /// Whether the two ranges do not touch and the medians are more than `tolerance` of
    /// the larger of them apart (the same either way round, and defined at zero).
    fn apart(&self, other: &Sampled, tolerance: f64) -> bool {
        let touch = self.min <= other.max && other.min <= self.max;
        let far = (other.median - self.median).abs() > tolerance * self.median.abs().max(other.median.abs());
        !touch && far
    }
}

/// (b - a) / |a|, when a is not zero.
fn change(a: f64, b: f64) -> Option<f64> {
    (a != 0.0).then(|| (b - a) / a.abs())
}

/// What became of a check from A to B.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Moved the wrong way beyond both runs' spread, or invalid in B where A measured it.
    Regressed,
    /// Moved the right way beyond both runs' spread, or measured where A was invalid.
    Improved,
    /// Within the runs' spread (or the tolerance) of each other.
    Unchanged,
    /// Only in B.
    Added,
    /// Only in A.
    Removed,
    /// Not run on a side (its plan left a mode out), not shown on one machine, or not
    /// measured on either.
    NotComparable,
}

impl Verdict {
    /// The word JSON and tables use.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Regressed => "regressed",
            Verdict::Improved => "improved",
            Verdict::Unchanged => "unchanged",
            Verdict::Added => "added",
            Verdict::Removed => "removed",
            Verdict::NotComparable => "not comparable",
        }
    }
}

/// A check in A and B.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct CheckChange {
    /// `<scenario>.<check>`.
    pub id: String,
    /// What it checks.
    pub name: String,
    /// Its target (B's, or A's when only A has it).
    pub target: Target,
    /// A's outcome (of the first of A's runs that measured it, when A is several).
    pub outcome_a: Option<Outcome>,
    /// B's outcome.
    pub outcome_b: Option<Outcome>,
    /// What A measured.
    pub a: Option<Sampled>,
    /// What B measured.
    pub b: Option<Sampled>,
    /// B's median against A's, % (positive: higher).
    pub change_pct: Option<f64>,
    /// How far apart the medians had to be, % of the larger: the tolerance, or the
    /// spread between A's runs' medians where that is larger.
    pub tolerance_pct: f64,
    /// What became of it.
    pub verdict: Verdict,
    /// Why, in words.
    pub reason: String,
}

/// A run metric of one mode in A and B (the medians over its rounds).
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct MetricChange {
    /// The scenario.
    pub scenario: String,
    /// The mode (a run's label).
    pub label: String,
    /// The metric, unit in its name.
    pub metric: String,
    /// A's runs.
    pub a: Sampled,
    /// B's runs.
    pub b: Sampled,
    /// B's median against A's, %.
    pub change_pct: Option<f64>,
    /// How far apart the medians had to be, % of the larger (as for a check).
    pub tolerance_pct: f64,
    /// Whether the ranges do not touch and the medians differ by more than the tolerance.
    pub moved: bool,
}

/// Counts of check verdicts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, JsonSchema)]
pub struct VerdictTally {
    /// Regressed.
    pub regressed: usize,
    /// Improved.
    pub improved: usize,
    /// Unchanged.
    pub unchanged: usize,
    /// Only in B.
    pub added: usize,
    /// Only in A.
    pub removed: usize,
    /// Not comparable.
    pub not_comparable: usize,
    /// Metrics that moved (no direction: not counted as regressions).
    pub metrics_moved: usize,
    /// Metrics in both.
    pub metrics: usize,
}

/// `netlane compare`: A against B.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct Comparison {
    /// The older (or reference) side: one run, or several alike runs pooled.
    pub a: Vec<Side>,
    /// The side judged against it.
    pub b: Side,
    /// How far apart medians must be before a difference counts, % of the larger.
    pub tolerance_pct: f64,
    /// The verdicts counted.
    pub summary: VerdictTally,
    /// What makes the two less than like for like (machines, quick against full,
    /// options that differ, scenarios on one side only).
    pub warnings: Vec<String>,
    /// Every check of either side, in A's order then B's new ones.
    pub checks: Vec<CheckChange>,
    /// Every run metric of a mode both sides ran.
    pub metrics: Vec<MetricChange>,
}

/// Whether a check's outcome carries a measurement to compare.
fn judged(o: Outcome) -> bool {
    matches!(o, Outcome::Met | Outcome::WithinNoise | Outcome::Missed)
}

/// Where `v` stands against `t`, larger being worse: for a bound, how far below (or
/// above) it it is, negative while it meets it with room; for a band, how far outside it
/// is (0 anywhere inside: no place in a band is better than another).
fn shortfall(t: &Target, v: f64) -> f64 {
    match t.op {
        Op::Above | Op::AtLeast => t.value - v,
        Op::Below | Op::AtMost => v - t.value,
        Op::Within => (t.value - v).max(v - t.upper.unwrap_or(f64::INFINITY)).max(0.0),
    }
}

fn sampled(c: &Check) -> Option<Sampled> {
    c.measured.as_ref().and_then(|m| {
        let v = if m.samples.is_empty() { vec![m.median] } else { m.samples.clone() };
        Sampled::of(&v)
    })
}

fn compare_check(a: &Check, b: &Check, tolerance: f64) -> CheckChange {
    let tolerance_pct = tolerance * 100.0;
    let (sa, sb) = (sampled(a), sampled(b));
    let change_pct = sa.zip(sb).and_then(|(x, y)| change(x.median, y.median)).map(|c| c * 100.0);
    let (verdict, reason) = match (judged(a.outcome), judged(b.outcome), sa.zip(sb)) {
        (true, true, Some((x, y))) if x.apart(&y, tolerance) => {
            let (wa, wb) = (shortfall(&b.target, x.median), shortfall(&b.target, y.median));
            if wb > wa {
                (Verdict::Regressed, "moved the wrong way for its target, beyond both runs' spread".to_string())
            } else if wb < wa {
                (Verdict::Improved, "moved the right way for its target, beyond both runs' spread".to_string())
            } else {
                (Verdict::Unchanged, "moved, but stands as far from its target either way".to_string())
            }
        }
        (true, true, Some(_)) => (Verdict::Unchanged, "within the runs' spread or the tolerance".to_string()),
        (true, false, _) if b.outcome == Outcome::Invalid => {
            (Verdict::Regressed, format!("{} in B: {}", b.outcome.label(), b.reason))
        }
        (false, true, _) if a.outcome == Outcome::Invalid => {
            (Verdict::Improved, format!("measured now; {} in A: {}", a.outcome.label(), a.reason))
        }
        _ if a.outcome == b.outcome && !judged(a.outcome) => {
            (Verdict::Unchanged, format!("{} on both sides", a.outcome.label()))
        }
        _ => (Verdict::NotComparable, format!("{} in A, {} in B", a.outcome.label(), b.outcome.label())),
    };
    CheckChange {
        id: b.id.clone(),
        name: b.name.clone(),
        target: b.target.clone(),
        outcome_a: Some(a.outcome),
        outcome_b: Some(b.outcome),
        a: sa,
        b: sb,
        change_pct,
        tolerance_pct,
        verdict,
        reason,
    }
}

fn one_side(c: &Check, verdict: Verdict) -> CheckChange {
    let (in_a, reason) = match verdict {
        Verdict::Removed => (true, "only in A"),
        _ => (false, "only in B"),
    };
    CheckChange {
        id: c.id.clone(),
        name: c.name.clone(),
        target: c.target.clone(),
        outcome_a: in_a.then_some(c.outcome),
        outcome_b: (!in_a).then_some(c.outcome),
        a: if in_a { sampled(c) } else { None },
        b: if in_a { None } else { sampled(c) },
        change_pct: None,
        tolerance_pct: 0.0,
        verdict,
        reason: reason.into(),
    }
}

/// Every metric of every mode over its runs: (label, metric) -> values in run order.
fn metric_values(s: &ComparedScenario) -> BTreeMap<(String, String), Vec<f64>> {
    let mut m: BTreeMap<(String, String), Vec<f64>> = BTreeMap::new();
    for r in &s.runs {
        for (k, v) in &r.metrics {
            m.entry((r.label.clone(), k.clone())).or_default().push(*v);
        }
    }
    m
}

fn side(path: &str, d: &Compared) -> Side {
    Side {
        path: path.into(),
        kind: d.kind.clone(),
        run_id: d.provenance.run_id.clone(),
        git_commit: d.provenance.git_commit.clone(),
        quick: d.quick,
        host: d.host.clone(),
    }
}

/// Compares B against A (`path_a` and `path_b` are only said).
pub fn compare(path_a: &str, a: &Compared, path_b: &str, b: &Compared, tolerance: f64) -> Comparison {
    compare_pooled(&[(path_a, a)], path_b, b, tolerance)
}

/// Compares B against one or more alike runs of A, pooled: each check and metric is
/// judged with the larger of `tolerance` and the spread between those runs' medians.
///
/// # Panics
/// When `runs_a` is empty.
pub fn compare_pooled(runs_a: &[(&str, &Compared)], path_b: &str, b: &Compared, tolerance: f64) -> Comparison {
    let docs: Vec<&Compared> = runs_a.iter().map(|(_, d)| *d).collect();
    let pooled = pool(&docs);
    let a = &pooled.doc;
    let check_tolerance = |id: &str| pooled.checks.get(id).copied().unwrap_or(0.0).max(tolerance);
    let ids_a: BTreeSet<&str> = a.scenarios.iter().flat_map(|s| &s.checks).map(|c| c.id.as_str()).collect();
    let checks_b: BTreeMap<&str, &Check> =
        b.scenarios.iter().flat_map(|s| &s.checks).map(|c| (c.id.as_str(), c)).collect();
    let mut checks: Vec<CheckChange> = a
        .scenarios
        .iter()
        .flat_map(|s| &s.checks)
        .map(|ca| match checks_b.get(ca.id.as_str()) {
            Some(cb) => {
                let mut c = compare_check(ca, cb, check_tolerance(&ca.id));
                if pooled.invalid_in_a.contains(&c.id) && cb.outcome == Outcome::Invalid {
                    c.verdict = Verdict::NotComparable;
                    c.reason = format!("{} in B: {}; invalid in one of A's runs too", cb.outcome.label(), cb.reason);
                }
                c
            }
            None => one_side(ca, Verdict::Removed),
        })
        .collect();
    checks.extend(
        b.scenarios
            .iter()
            .flat_map(|s| &s.checks)
            .filter(|cb| !ids_a.contains(cb.id.as_str()))
            .map(|cb| one_side(cb, Verdict::Added)),
    );
    let mut metrics = Vec::new();
    for sa in &a.scenarios {
        let Some(sb) = b.scenarios.iter().find(|s| s.name == sa.name) else { continue };
        let mb = metric_values(sb);
        for ((label, metric), va) in metric_values(sa) {
            let (Some(x), Some(y)) =
                (Sampled::of(&va), mb.get(&(label.clone(), metric.clone())).and_then(|v| Sampled::of(v)))
            else {
                continue;
            };
            let tolerance = pooled
                .metrics
                .get(&(sa.name.clone(), label.clone(), metric.clone()))
                .copied()
                .unwrap_or(0.0)
                .max(tolerance);
            metrics.push(MetricChange {
                scenario: sa.name.clone(),
                label,
                metric,
                a: x,
                b: y,
                change_pct: change(x.median, y.median).map(|c| c * 100.0),
                tolerance_pct: tolerance * 100.0,
                moved: x.apart(&y, tolerance),
            });
        }
    }
    let mut summary = VerdictTally { metrics: metrics.len(), ..Default::default() };
    summary.metrics_moved = metrics.iter().filter(|m| m.moved).count();
    for c in &checks {
        *match c.verdict {
            Verdict::Regressed => &mut summary.regressed,
            Verdict::Improved => &mut summary.improved,
            Verdict::Unchanged => &mut summary.unchanged,
            Verdict::Added => &mut summary.added,
            Verdict::Removed => &mut summary.removed,
            Verdict::NotComparable => &mut summary.not_comparable,
        } += 1;
    }
    Comparison {
        a: runs_a.iter().map(|(path, d)| side(path, d)).collect(),
        b: side(path_b, b),
        tolerance_pct: tolerance * 100.0,
        summary,
        warnings: unlike(&docs, b)
            .into_iter()
            .chain(
                pooled
                    .invalid_in_a
                    .iter()
                    .map(|id| format!("{id} was invalid in one of A's runs and measured in another")),
            )
            .collect(),
        checks,
        metrics,
    }
}

mod pool;
mod tables;

#[cfg(test)]
mod tests;

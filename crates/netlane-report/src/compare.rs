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

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::model::{
    Check, Column, Host, Op, Outcome, Provenance, Row, RunRecord, SCHEMA_VERSION, Spread, Table, Target, Value,
};

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

/// How far apart `medians` lie, as a share of the largest in size (0 for fewer than two).
fn between(medians: &[f64]) -> f64 {
    let (lo, hi) = medians.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &m| (l.min(m), h.max(m)));
    let size = lo.abs().max(hi.abs());
    if medians.len() < 2 || size == 0.0 { 0.0 } else { (hi - lo) / size }
}

/// Several alike runs as one reference: the first run's document with every check's
/// samples and every mode's runs pooled from all of them (a check takes the first
/// measured outcome among them), and how far their medians lie apart, by check id and by
/// (scenario, mode, metric).
struct Pooled {
    doc: Compared,
    checks: BTreeMap<String, f64>,
    metrics: BTreeMap<(String, String, String), f64>,
    /// Checks invalid in one of A's runs and measured in another: A's own path failed
    /// now and then, so B failing it too says nothing new.
    invalid_in_a: BTreeSet<String>,
}

fn pool(runs: &[&Compared]) -> Pooled {
    let mut doc = runs[0].clone();
    let mut checks = BTreeMap::new();
    let mut metrics = BTreeMap::new();
    let mut invalid_in_a = BTreeSet::new();
    for s in &mut doc.scenarios {
        let same: Vec<&ComparedScenario> =
            runs.iter().filter_map(|d| d.scenarios.iter().find(|o| o.name == s.name)).collect();
        for c in &mut s.checks {
            let alike: Vec<&Check> = same.iter().filter_map(|o| o.checks.iter().find(|x| x.id == c.id)).collect();
            let measured: Vec<&Check> = alike.iter().copied().filter(|x| judged(x.outcome)).collect();
            if alike.iter().any(|x| x.outcome == Outcome::Invalid) && !measured.is_empty() {
                invalid_in_a.insert(c.id.clone());
            }
            if let Some(first) = measured.first() {
                let pooled: Vec<f64> = measured
                    .iter()
                    .filter_map(|x| x.measured.as_ref())
                    .flat_map(|m| if m.samples.is_empty() { vec![m.median] } else { m.samples.clone() })
                    .collect();
                let medians: Vec<f64> = measured.iter().filter_map(|x| sampled(x)).map(|x| x.median).collect();
                checks.insert(c.id.clone(), between(&medians));
                *c = (*first).clone();
                if let (Some(m), Some(p)) = (c.measured.as_mut(), Sampled::of(&pooled)) {
                    m.samples = pooled;
                    m.median = p.median;
                }
            }
        }
        let per_run: Vec<BTreeMap<(String, String), Vec<f64>>> = same.iter().map(|o| metric_values(o)).collect();
        for (key, _) in per_run.first().into_iter().flatten() {
            let medians: Vec<f64> =
                per_run.iter().filter_map(|m| m.get(key).and_then(|v| Sampled::of(v))).map(|x| x.median).collect();
            metrics.insert((s.name.clone(), key.0.clone(), key.1.clone()), between(&medians));
        }
        s.runs = same.iter().flat_map(|o| o.runs.iter().cloned()).collect();
    }
    Pooled { doc, checks, metrics, invalid_in_a }
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

/// What makes the runs of A unlike each other, and each unlike B (each said once).
fn unlike(runs_a: &[&Compared], b: &Compared) -> Vec<String> {
    let among =
        runs_a.iter().skip(1).flat_map(|d| warnings(runs_a[0], d)).map(|w| format!("the runs of A differ: {w}"));
    let mut all: Vec<String> = Vec::new();
    for w in among.chain(runs_a.iter().flat_map(|d| warnings(d, b))) {
        if !all.contains(&w) {
            all.push(w);
        }
    }
    all
}

/// What makes the two sides less than like for like.
fn warnings(a: &Compared, b: &Compared) -> Vec<String> {
    let mut w = Vec::new();
    let (ha, hb) = (&a.host, &b.host);
    let mut hosts = Vec::new();
    if ha.kernel != hb.kernel {
        hosts.push(format!("kernel {} -> {}", ha.kernel, hb.kernel));
    }
    if ha.cpu_model != hb.cpu_model {
        hosts.push(format!("CPU {} -> {}", ha.cpu_model, hb.cpu_model));
    }
    if ha.cpus != hb.cpus {
        hosts.push(format!("{} CPUs -> {}", ha.cpus, hb.cpus));
    }
    if !hosts.is_empty() {
        w.push(format!("the machines differ: {}", hosts.join("; ")));
    }
    if a.quick != b.quick {
        let q = |x: bool| if x { "a quick lab" } else { "a full run" };
        w.push(format!("A is {}, B {}: shorter runs, fewer rounds, other plans", q(a.quick), q(b.quick)));
    }
    for sa in &a.scenarios {
        match b.scenarios.iter().find(|s| s.name == sa.name) {
            None => w.push(format!("{} ran in A only", sa.name)),
            Some(sb) => {
                let key = |e: &String| e.split_once('=').map_or(e.clone(), |(k, _)| k.to_string());
                let ea: BTreeMap<String, &String> = sa.echo.iter().map(|e| (key(e), e)).collect();
                let eb: BTreeMap<String, &String> = sb.echo.iter().map(|e| (key(e), e)).collect();
                let keys: BTreeSet<&String> = ea.keys().chain(eb.keys()).collect();
                let differ: Vec<String> = keys
                    .into_iter()
                    .filter(|k| ea.get(*k) != eb.get(*k))
                    .map(|k| {
                        let v = |m: &BTreeMap<String, &String>| {
                            m.get(k)
                                .map_or("(none)".to_string(), |e| e.split_once('=').map_or("", |(_, v)| v).to_string())
                        };
                        format!("{k} {} -> {}", v(&ea), v(&eb))
                    })
                    .collect();
                if !differ.is_empty() {
                    w.push(format!("{} options differ: {}", sa.name, differ.join(", ")));
                }
            }
        }
    }
    for sb in b.scenarios.iter().filter(|sb| !a.scenarios.iter().any(|sa| sa.name == sb.name)) {
        w.push(format!("{} ran in B only", sb.name));
    }
    w
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

impl VerdictTally {
    /// `1 regressed, 0 improved, 4 unchanged; 3 of 40 metrics moved`.
    pub fn sentence(&self) -> String {
        let mut s = format!("{} regressed, {} improved, {} unchanged", self.regressed, self.improved, self.unchanged);
        for (n, what) in
            [(self.added, "only in B"), (self.removed, "only in A"), (self.not_comparable, "not comparable")]
        {
            if n > 0 {
                s.push_str(&format!(", {n} {what}"));
            }
        }
        s.push_str(&format!("; {} of {} metrics moved", self.metrics_moved, self.metrics));
        s
    }
}

fn opt(v: Option<f64>) -> Value {
    Value::opt(v)
}

impl Comparison {
    /// The checks as a table: every one, worst verdict first.
    pub fn checks_table(&self) -> Table {
        let mut t = Table::new(
            "compare-checks",
            "Checks, A against B (median, and its range when there were several samples)",
            vec![
                Column::new("verdict", "verdict", 0),
                Column::new("check", "check", 0),
                Column::new("a", "A", 3),
                Column::new("a_range", "A range", 0),
                Column::new("b", "B", 3),
                Column::new("b_range", "B range", 0),
                Column::new("change_pct", "change %", 1),
                Column::new("tolerance_pct", "tolerance %", 0),
                Column::new("outcome_a", "A outcome", 0),
                Column::new("outcome_b", "B outcome", 0),
                Column::new("target", "target", 0),
            ],
        );
        let mut order: Vec<&CheckChange> = self.checks.iter().collect();
        order.sort_by_key(|c| c.verdict);
        let range = |s: Option<Sampled>| match s {
            Some(s) if s.n > 1 => {
                Value::text(format!("{}..{}", crate::format::sig3(s.min), crate::format::sig3(s.max)))
            }
            _ => Value::Missing,
        };
        let outcome = |o: Option<Outcome>| o.map_or(Value::Missing, |o| Value::text(o.label()));
        for c in order {
            let mut row = Row::new(vec![
                Value::text(c.verdict.name()),
                Value::text(&c.id),
                opt(c.a.map(|s| s.median)),
                range(c.a),
                opt(c.b.map(|s| s.median)),
                range(c.b),
                opt(c.change_pct),
                opt((c.tolerance_pct > 0.0).then_some(c.tolerance_pct)),
                outcome(c.outcome_a),
                outcome(c.outcome_b),
                Value::text(crate::format::target(&c.target)),
            ]);
            if matches!(c.verdict, Verdict::Regressed | Verdict::Improved | Verdict::NotComparable) {
                row.footnote = Some(format!("{}: {}", c.id, c.reason));
            }
            t.push(row);
        }
        t
    }

    /// The metrics as a table: those that moved, or every one with `all`.
    pub fn metrics_table(&self, all: bool) -> Table {
        let mut t = Table::new(
            "compare-metrics",
            if all { "Every metric of every mode both ran" } else { "Metrics that moved beyond both runs' spread" },
            vec![
                Column::new("scenario", "scenario", 0),
                Column::new("mode", "mode", 0),
                Column::new("metric", "metric", 0),
                Column::new("a", "A", 3),
                Column::new("b", "B", 3),
                Column::new("change_pct", "change %", 1),
                Column::new("moved", "moved", 0),
            ],
        );
        for m in self.metrics.iter().filter(|m| all || m.moved) {
            t.push(Row::new(vec![
                Value::text(&m.scenario),
                Value::text(&m.label),
                Value::text(&m.metric),
                Value::num(m.a.median),
                Value::num(m.b.median),
                opt(m.change_pct),
                Value::text(if m.moved { "yes" } else { "no" }),
            ]));
        }
        t
    }
}

#[cfg(test)]
mod tests;

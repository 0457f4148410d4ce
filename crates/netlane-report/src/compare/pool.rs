//! Several alike reference runs as one, and what makes runs unlike each other.

use std::collections::{BTreeMap, BTreeSet};

use super::{Check, Compared, ComparedScenario, Outcome, Sampled, judged, metric_values, sampled};

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
pub(super) struct Pooled {
    pub(super) doc: Compared,
    pub(super) checks: BTreeMap<String, f64>,
    pub(super) metrics: BTreeMap<(String, String, String), f64>,
    /// Checks invalid in one of A's runs and measured in another: A's own path failed
    /// now and then, so B failing it too says nothing new.
    pub(super) invalid_in_a: BTreeSet<String>,
}

pub(super) fn pool(runs: &[&Compared]) -> Pooled {
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

/// What makes the runs of A unlike each other, and each unlike B (each said once).
pub(super) fn unlike(runs_a: &[&Compared], b: &Compared) -> Vec<String> {
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

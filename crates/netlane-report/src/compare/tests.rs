use serde_json::{Value as Json, json};

use super::*;

/// A check as a results document carries it.
fn check(id: &str, op: &str, target: f64, samples: &[f64], outcome: &str) -> Json {
    let measured = (!samples.is_empty()).then(|| {
        let s = Spread::of(samples).unwrap();
        json!({"median": s.median, "min": s.min, "max": s.max, "samples": samples})
    });
    json!({"id": id, "name": format!("the {id} check"), "target": {"op": op, "value": target, "unit": "x"},
           "measured": measured, "outcome": outcome, "reason": "why"})
}

fn run(label: &str, metrics: Json) -> Json {
    json!({"index": 1, "round": 1, "label": label, "metrics": metrics, "path": [], "detail": null})
}

fn doc(kind: &str, echo: &[&str], checks: Vec<Json>, runs: Vec<Json>) -> Compared {
    let text = json!({
        "schema_version": SCHEMA_VERSION, "kind": kind,
        "provenance": {"tool": "netlane", "version": "0", "git_commit": "abc", "run_id": "r", "started_at": "t",
                       "command": []},
        "host": {"kernel": "6.18", "cpu_model": "cpu", "cpus": 2, "memory_gib": 24.0},
        "machine": {}, "summary": {}, "quick": true,
        "scenarios": [{"name": "udp-bulk", "echo": echo, "checks": checks, "runs": runs, "tables": []}]
    })
    .to_string();
    Compared::parse(&text).unwrap()
}

fn verdicts(c: &Comparison) -> Vec<(&str, Verdict)> {
    c.checks.iter().map(|c| (c.id.as_str(), c.verdict)).collect()
}

#[test]
fn a_document_compared_with_itself_has_nothing_to_say() {
    let a = doc(
        "lab",
        &["segments=46"],
        vec![check("u.gso", "at_most", 0.25, &[0.12, 0.19], "met"), check("u.tcp", "at_least", 4.0, &[], "skipped")],
        vec![run("gso", json!({"tx_mb_per_s": 3000.0})), run("gso", json!({"tx_mb_per_s": 3100.0}))],
    );
    let c = compare("a", &a, "b", &a, DEFAULT_TOLERANCE);
    assert_eq!(verdicts(&c), [("u.gso", Verdict::Unchanged), ("u.tcp", Verdict::Unchanged)]);
    assert_eq!((c.summary.regressed, c.summary.metrics_moved, c.summary.metrics), (0, 0, 1));
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
}

#[test]
fn a_check_that_moved_beyond_both_spreads_regressed_or_improved_by_its_target() {
    let slow = check("u.gso", "at_most", 0.25, &[0.97, 1.3], "missed");
    let fast = check("u.gso", "at_most", 0.25, &[0.12, 0.19], "met");
    let a = doc("lab", &["segments=46"], vec![fast.clone()], vec![]);
    let b = doc("lab", &["segments=1"], vec![slow], vec![]);
    let c = compare("a", &a, "b", &b, DEFAULT_TOLERANCE);
    assert_eq!(verdicts(&c), [("u.gso", Verdict::Regressed)]);
    assert!(c.checks[0].change_pct.unwrap() > 500.0);
    assert_eq!(c.warnings, ["udp-bulk options differ: segments 46 -> 1"]);
    assert_eq!(verdicts(&compare("b", &b, "a", &a, DEFAULT_TOLERANCE)), [("u.gso", Verdict::Improved)]);
    // Higher is better for an at_least target; a worse ratio that still meets it regressed.
    let up = |s: &[f64]| doc("lab", &[], vec![check("u.gro", "at_least", 4.0, s, "met")], vec![]);
    let c = compare("a", &up(&[9.0, 10.0]), "b", &up(&[6.0, 7.0]), DEFAULT_TOLERANCE);
    assert_eq!(verdicts(&c), [("u.gro", Verdict::Regressed)]);
}

#[test]
fn differences_inside_the_spread_or_the_tolerance_are_unchanged() {
    let one = |s: &[f64], o: &str| doc("lab", &[], vec![check("u.gso", "at_most", 0.25, s, o)], vec![]);
    // The ranges touch: 40% apart in medians, but within the spread.
    let c = compare("a", &one(&[0.1, 0.3], "within_noise"), "b", &one(&[0.14, 0.26], "within_noise"), 0.1);
    assert_eq!(c.checks[0].verdict, Verdict::Unchanged);
    // Single samples 5% apart: inside the tolerance, even though the outcome flipped.
    let c = compare("a", &one(&[0.245], "met"), "b", &one(&[0.257], "missed"), 0.1);
    assert_eq!(c.checks[0].verdict, Verdict::Unchanged);
    assert_eq!((c.checks[0].outcome_a, c.checks[0].outcome_b), (Some(Outcome::Met), Some(Outcome::Missed)));
    // The same two with no tolerance: apart, and worse.
    assert_eq!(
        compare("a", &one(&[0.245], "met"), "b", &one(&[0.257], "missed"), 0.0).checks[0].verdict,
        Verdict::Regressed
    );
    // Inside a `within` band on both sides: no way is better.
    let band = |v: f64| {
        doc(
            "lab",
            &[],
            vec![json!({"id": "u.fair", "name": "fair", "target": {"op": "within",
        "value": 0.9, "upper": 1.1, "unit": "x"}, "measured": {"median": v, "min": v, "max": v, "samples": [v]},
        "outcome": "met", "reason": ""})],
            vec![],
        )
    };
    assert_eq!(compare("a", &band(0.92), "b", &band(1.08), 0.1).checks[0].verdict, Verdict::Unchanged);
    assert_eq!(compare("a", &band(1.0), "b", &band(1.5), 0.1).checks[0].verdict, Verdict::Regressed);
}

#[test]
fn a_check_no_longer_measured_regressed_and_one_side_only_is_said() {
    let a = doc(
        "lab",
        &[],
        vec![check("u.gso", "at_most", 0.25, &[0.2], "met"), check("u.old", "at_most", 1.0, &[0.5], "met")],
        vec![],
    );
    let b = doc(
        "bench",
        &[],
        vec![check("u.gso", "at_most", 0.25, &[], "invalid"), check("u.new", "at_most", 1.0, &[0.5], "met")],
        vec![],
    );
    let c = compare("a", &a, "b", &b, DEFAULT_TOLERANCE);
    assert_eq!(verdicts(&c), [("u.gso", Verdict::Regressed), ("u.old", Verdict::Removed), ("u.new", Verdict::Added)]);
    assert_eq!(c.checks[0].reason, "invalid in B: why");
    assert_eq!(verdicts(&compare("b", &b, "a", &a, DEFAULT_TOLERANCE))[0], ("u.gso", Verdict::Improved));
    let shown = |o: &str| doc("lab", &[], vec![check("u.gso", "at_most", 0.25, &[], o)], vec![]);
    let c = compare("a", &a, "b", &shown("not_shown"), DEFAULT_TOLERANCE);
    assert_eq!(c.checks[0].verdict, Verdict::NotComparable);
    // A plan that left the mode out (a quick lab against a full one) broke nothing.
    let skipped = compare("a", &a, "b", &shown("skipped"), DEFAULT_TOLERANCE);
    assert_eq!(skipped.checks[0].verdict, Verdict::NotComparable);
    assert_eq!(skipped.summary.regressed, 0);
    assert_eq!(
        c.summary.sentence(),
        "0 regressed, 0 improved, 0 unchanged, 1 only in A, 1 not comparable; 0 of 0 metrics moved"
    );
    let t = c.checks_table();
    assert_eq!(t.rows.len(), 2);
    assert_eq!(t.footnotes(), ["u.gso: met in A, not shown on this machine in B"]);
}

#[test]
fn metrics_move_without_a_direction() {
    let a = doc(
        "lab",
        &[],
        vec![],
        vec![run("gso", json!({"tx_mb_per_s": 3000.0})), run("gso", json!({"tx_mb_per_s": 3100.0}))],
    );
    let b = doc(
        "lab",
        &[],
        vec![],
        vec![run("gso", json!({"tx_mb_per_s": 800.0})), run("udp", json!({"tx_mb_per_s": 700.0}))],
    );
    let c = compare("a", &a, "b", &b, DEFAULT_TOLERANCE);
    assert_eq!(c.metrics.len(), 1, "udp ran in B only");
    assert!(c.metrics[0].moved && c.metrics[0].change_pct.unwrap() < -70.0);
    assert_eq!(c.summary.regressed, 0, "a metric alone is no regression");
    assert_eq!(c.metrics_table(false).rows.len(), 1);
}

/// A zero median: a difference is judged against the larger of the two, the same
/// either way round.
#[test]
fn the_tolerance_holds_at_zero_and_both_ways_round() {
    let one = |v: f64| doc("lab", &[], vec![], vec![run("gso", json!({ "loss_pct": v }))]);
    let moved = |a: f64, b: f64| compare("a", &one(a), "b", &one(b), 0.1).metrics[0].moved;
    assert!(moved(0.0, 1.0) && moved(1.0, 0.0));
    assert!(!moved(0.0, 0.0));
    assert!(!moved(100.0, 109.0) && !moved(109.0, 100.0));
    assert!(moved(100.0, 112.0) && moved(112.0, 100.0));
    assert_eq!(compare("a", &one(0.0), "b", &one(1.0), 0.1).metrics[0].change_pct, None);
}

#[test]
fn other_documents_are_refused_with_what_they_are() {
    let twice = json!({"schema_version": SCHEMA_VERSION, "kind": "lab",
        "provenance": {"tool": "netlane", "version": "0", "git_commit": "abc", "run_id": "r", "started_at": "t",
                       "command": []},
        "host": {"kernel": "6.18", "cpu_model": "cpu", "cpus": 2, "memory_gib": 24.0},
        "scenarios": [{"name": "u", "checks": [check("u.a", "at_most", 1.0, &[0.5], "met"),
                                               check("u.a", "at_most", 1.0, &[0.9], "met")], "runs": []}]});
    assert_eq!(Compared::parse(&twice.to_string()).unwrap_err().to_string(), "check u.a appears twice");
    let e = Compared::parse(&json!({"schema_version": 1, "kind": "probe"}).to_string()).unwrap_err();
    assert_eq!(e.to_string(), "a probe document: only a lab's or a bench's results compare");
    let e = Compared::parse(&json!({"schema_version": 99, "kind": "lab"}).to_string()).unwrap_err();
    assert_eq!(e.to_string(), format!("schema version 99; this netlane compares versions 1 to {SCHEMA_VERSION}"));
    let e = Compared::parse("{\"kind\": ").unwrap_err();
    assert!(matches!(e, CompareError::Layout(_)) && std::error::Error::source(&e).is_some());
    let e = Compared::parse(&json!({"schema_version": 1, "kind": "lab"}).to_string()).unwrap_err();
    assert!(matches!(e, CompareError::Layout(_)), "{e}");
}

#[test]
fn several_alike_reference_runs_pool_and_their_spread_widens_the_tolerance() {
    let one = |s: &[f64], o: &str, tx: f64| {
        doc(
            "lab",
            &[],
            vec![check("u.gso", "at_most", 0.25, s, o)],
            vec![run("gso", json!({"tx_mb_per_s": tx})), run("gso", json!({"tx_mb_per_s": tx + 10.0}))],
        )
    };
    // Two alike runs whose ranges do not touch (medians 0.14 and 0.21: a third apart), and
    // a third alike run like the second.
    let (a1, a2, b) =
        (one(&[0.13, 0.15], "met", 1000.0), one(&[0.20, 0.22], "met", 1400.0), one(&[0.20, 0.22], "met", 1400.0));
    let single = compare("a1", &a1, "b", &b, DEFAULT_TOLERANCE);
    assert_eq!(verdicts(&single), [("u.gso", Verdict::Regressed)]);
    assert_eq!(single.summary.metrics_moved, 1);
    assert_eq!(single.checks[0].tolerance_pct, DEFAULT_TOLERANCE * 100.0);
    let pooled = compare_pooled(&[("a1", &a1), ("a2", &a2)], "b", &b, DEFAULT_TOLERANCE);
    assert_eq!(verdicts(&pooled), [("u.gso", Verdict::Unchanged)], "{:?}", pooled.checks[0]);
    let c = &pooled.checks[0];
    assert!((c.tolerance_pct - 100.0 * (0.21 - 0.14) / 0.21).abs() < 1e-9, "{c:?}");
    assert_eq!(c.a.map(|s| (s.n, s.min, s.max)), Some((4, 0.13, 0.22)), "samples pooled");
    assert_eq!(pooled.summary.metrics_moved, 0);
    assert_eq!(pooled.metrics[0].a.n, 4, "runs pooled");
    assert_eq!(pooled.a.len(), 2);
    // Beyond the spread between the reference runs it still counts.
    let slow = one(&[0.97, 1.3], "missed", 400.0);
    let c = compare_pooled(&[("a1", &a1), ("a2", &a2)], "slow", &slow, DEFAULT_TOLERANCE);
    assert_eq!(verdicts(&c), [("u.gso", Verdict::Regressed)]);
    // B outside the pooled range, but nearer than the reference runs lie to each other:
    // only the widened tolerance keeps it unchanged.
    let at = |v: f64| one(&[v], "met", 1000.0);
    let (r1, r2, near) = (at(0.100), at(0.120), at(0.128));
    assert_eq!(verdicts(&compare("r1", &r1, "near", &near, DEFAULT_TOLERANCE)), [("u.gso", Verdict::Regressed)]);
    let c = compare_pooled(&[("r1", &r1), ("r2", &r2)], "near", &near, DEFAULT_TOLERANCE);
    assert_eq!(verdicts(&c), [("u.gso", Verdict::Unchanged)], "{:?}", c.checks[0]);
    // A check invalid in one reference run and in B: not comparable, and said.
    let broken = one(&[], "invalid", 1000.0);
    let c = compare_pooled(&[("a1", &a1), ("broken", &broken)], "broken", &broken, DEFAULT_TOLERANCE);
    assert_eq!(verdicts(&c), [("u.gso", Verdict::NotComparable)]);
    assert!(
        c.warnings.contains(&"u.gso was invalid in one of A's runs and measured in another".to_string()),
        "{:?}",
        c.warnings
    );
    assert_eq!(verdicts(&compare("a1", &a1, "broken", &broken, DEFAULT_TOLERANCE)), [("u.gso", Verdict::Regressed)]);
    // Reference runs unlike each other say so.
    let other = doc("lab", &["segments=1"], vec![check("u.gso", "at_most", 0.25, &[0.2], "met")], vec![]);
    let c = compare_pooled(&[("a1", &a1), ("other", &other)], "b", &b, DEFAULT_TOLERANCE);
    assert!(
        c.warnings.iter().any(|w| w == "the runs of A differ: udp-bulk options differ: segments (none) -> 1"),
        "{:?}",
        c.warnings
    );
}

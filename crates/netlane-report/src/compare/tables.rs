//! A comparison as tables and a sentence, for people and CSV.

use super::{CheckChange, Comparison, Outcome, Sampled, Verdict, VerdictTally};
use crate::model::{Column, Row, Table, Value};

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

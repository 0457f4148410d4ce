//! The report as text for a terminal: options echoed as `key=value` (neper's contract),
//! tables (comfy-table, Markdown-style so they paste into issues), targets with their
//! outcome, flags, notes. No colour, so it reads the same in a log.

use std::fmt::Write as _;

use comfy_table::{CellAlignment, ContentArrangement, Table as Ct, presets};

use crate::format;
use crate::model::{Check, MachineState, Results, RoleCpus, ScenarioReport, Table, Tally, Value};

/// One table as text, with its footnotes.
pub fn table(t: &Table) -> String {
    let mut ct = Ct::new();
    ct.load_style(presets::ASCII_MARKDOWN).set_content_arrangement(ContentArrangement::Disabled);
    ct.set_header(t.columns.iter().map(|c| c.label.clone()));
    for (i, r) in t.rows.iter().enumerate() {
        let mut cells: Vec<comfy_table::Cell> = Vec::with_capacity(r.cells.len());
        for (j, (v, c)) in r.cells.iter().zip(&t.columns).enumerate() {
            let mut text = format::cell(v, c.decimals);
            if j == 0
                && let Some(n) = t.footnote_number(i)
            {
                text.push_str(&format!(" [{n}]"));
            }
            let align = if matches!(v, Value::Text(_)) { CellAlignment::Left } else { CellAlignment::Right };
            cells.push(comfy_table::Cell::new(text).set_alignment(align));
        }
        ct.add_row(cells);
    }
    let mut out = format!("{}\n{ct}\n", t.title);
    for (n, f) in t.footnotes().iter().enumerate() {
        let _ = writeln!(out, "  [{}] {f}", n + 1);
    }
    out
}

/// A check on one line: outcome, name, what was measured, the target.
pub fn check(c: &Check) -> String {
    let unit = &c.target.unit;
    let measured = match &c.measured {
        Some(m) if m.samples.len() > 1 => format!(
            "{} (median of {}: {} .. {})",
            format::measured(m.median, unit),
            m.samples.len(),
            format::sig3(m.min),
            format::sig3(m.max)
        ),
        Some(m) => format::measured(m.median, unit),
        None => c.reason.clone(),
    };
    format!("  {:<13} {}: {measured}; target {}", c.outcome.label().to_uppercase(), c.name, format::target(&c.target))
}

/// Where each role ran: `lane 0,1; napi 0,1 (beside lane)`.
pub fn cpu_plan(plan: &[RoleCpus]) -> String {
    let roles: Vec<String> = plan
        .iter()
        .map(|r| {
            let cpus: Vec<String> = r.cpus.iter().map(|c| c.to_string()).collect();
            let beside = r.beside.as_ref().map(|o| format!(" (beside {o})")).unwrap_or_default();
            format!("{} {}{beside}", r.role, cpus.join(","))
        })
        .collect();
    roles.join("; ")
}

/// A whole scenario.
pub fn scenario(s: &ScenarioReport) -> String {
    let mut out = format!("== {} ==\n{}\n", s.title, s.headline);
    for e in &s.echo {
        let _ = writeln!(out, "{e}");
    }
    if !s.cpu_plan.is_empty() {
        let _ = writeln!(out, "CPU plan: {}", cpu_plan(&s.cpu_plan));
    }
    for t in &s.tables {
        out.push('\n');
        out.push_str(&table(t));
    }
    if !s.checks.is_empty() {
        let _ = writeln!(
            out,
            "\nTargets ({}; ratios are paired: both sides measured in the same round):",
            Tally::of(&s.checks).sentence()
        );
        for c in &s.checks {
            let _ = writeln!(out, "{}", check(c));
        }
    }
    if !s.flags.is_empty() {
        let _ = writeln!(out, "\nFlags:");
        for f in &s.flags {
            let _ = writeln!(out, "  {:<10} {}: {}", f.kind.name().to_uppercase(), f.subject, f.message);
        }
    }
    if !s.notes.is_empty() {
        let _ = writeln!(out, "\nNotes:");
        for n in &s.notes {
            let _ = writeln!(out, "  - {n}");
        }
    }
    out
}

/// The machine's state in two lines.
pub fn machine(m: &MachineState) -> String {
    let f = |v: Option<f64>, d: usize| v.map_or("-".into(), |v| format!("{v:.d$}"));
    let mut out = format!(
        "machine: {}% busy before, load {} -> {}, steal {}",
        f(m.busy_pct_before, 0),
        f(m.load_avg_1m_start, 2),
        f(m.load_avg_1m_end, 2),
        m.steal_pct_during.map_or("-".into(), |s| format!("{s:.1}%")),
    );
    for w in &m.warnings {
        let _ = write!(out, "\nwarning: {w}");
    }
    out
}

/// Every scenario, then the verdict summary.
pub fn results(r: &Results) -> String {
    let mut out = String::new();
    for s in &r.scenarios {
        out.push_str(&scenario(s));
        out.push('\n');
    }
    out.push_str(&summary(r));
    out
}

/// The verdict: counts, then one line per scenario.
pub fn summary(r: &Results) -> String {
    let mut out = format!("Verdict: {}\n", r.summary.sentence());
    let w = r.scenarios.iter().map(|s| s.name.len()).max().unwrap_or(0);
    for s in &r.scenarios {
        let t = Tally::of(&s.checks);
        let _ = writeln!(out, "  {:<w$}  {} ({})", s.name, s.headline, t.sentence());
    }
    out.push_str(&machine(&r.machine));
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Column, Row};

    #[test]
    fn tables_align_numbers_and_number_footnotes() {
        let mut t =
            Table::new("t", "T", vec![Column::new("mode", "mode", 0), Column::new("tx_mb_per_s", "tx MB/s", 1)]);
        t.push(Row { cells: vec![Value::text("gso"), Value::num(1234.56)], footnote: Some("path: cmsg".into()) });
        t.push(Row::new(vec![Value::text("udp"), Value::Missing]));
        let s = table(&t);
        assert!(s.contains("| gso [1] |") && s.contains("1234.6") && s.contains("| udp"), "{s}");
        assert!(s.contains("  [1] path: cmsg"), "{s}");
        assert!(!s.contains('\u{1b}'), "no ANSI escapes");
    }
}

//! What benchmarks produce and how it is written out.
//!
//! A benchmark returns a [`ScenarioReport`]: the options it resolved (echoed as
//! `key=value`, neper-style, so a run can be reproduced), tables of measurements,
//! charts, checks of the project's performance targets (ratios measured in the same
//! run), notes, and the raw results as JSON. The same report prints to the terminal,
//! writes CSV and JSON, and becomes a section of the lab's HTML page.

pub mod chart;
pub mod html;

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

pub use html::write_html;

/// A table cell.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Cell {
    /// Text.
    Text(String),
    /// A number shown with this many decimals.
    Num(f64, #[serde(skip)] usize),
    /// No value.
    Empty,
}

impl Cell {
    /// Text cell.
    pub fn text(s: impl Into<String>) -> Self {
        Cell::Text(s.into())
    }

    /// Number cell with `decimals` decimals.
    pub fn num(v: f64, decimals: usize) -> Self {
        if v.is_finite() { Cell::Num(v, decimals) } else { Cell::Empty }
    }

    /// How the cell prints.
    pub fn render(&self) -> String {
        match self {
            Cell::Text(s) => s.clone(),
            Cell::Num(v, d) => format!("{v:.d$}"),
            Cell::Empty => "-".into(),
        }
    }
}

/// A table of measurements.
#[derive(Debug, Clone, Serialize)]
pub struct Table {
    /// File stem for its CSV.
    pub name: String,
    /// Caption.
    pub title: String,
    /// Column headers (with units).
    pub columns: Vec<String>,
    /// Rows.
    pub rows: Vec<Vec<Cell>>,
}

impl Table {
    /// Renders as aligned text for a terminal.
    pub fn to_text(&self) -> String {
        let cells: Vec<Vec<String>> = self.rows.iter().map(|r| r.iter().map(Cell::render).collect()).collect();
        let mut widths: Vec<usize> = self.columns.iter().map(|c| c.len()).collect();
        for r in &cells {
            for (i, c) in r.iter().enumerate() {
                if i < widths.len() {
                    widths[i] = widths[i].max(c.chars().count());
                }
            }
        }
        let mut out = String::new();
        let _ = writeln!(out, "{}", self.title);
        let line = |out: &mut String, items: &[String]| {
            let parts: Vec<String> = items
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let w = widths.get(i).copied().unwrap_or(0);
                    if i == 0 { format!("{s:<w$}") } else { format!("{s:>w$}") }
                })
                .collect();
            let _ = writeln!(out, "  {}", parts.join("  ").trim_end());
        };
        line(&mut out, &self.columns);
        for r in &cells {
            line(&mut out, r);
        }
        out
    }

    /// Renders as CSV (RFC 4180 quoting).
    pub fn to_csv(&self) -> String {
        let quote = |s: &str| {
            if s.contains([',', '"', '\n']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s.to_string() }
        };
        let mut out = String::new();
        let _ = writeln!(out, "{}", self.columns.iter().map(|c| quote(c)).collect::<Vec<_>>().join(","));
        for r in &self.rows {
            let cells: Vec<String> = r
                .iter()
                .map(|c| match c {
                    // Full precision in CSV; rounding is for people.
                    Cell::Num(v, _) => format!("{v}"),
                    other => quote(&other.render()),
                })
                .collect();
            let _ = writeln!(out, "{}", cells.join(","));
        }
        out
    }
}

/// An SVG chart.
#[derive(Debug, Clone, Serialize)]
pub struct Chart {
    /// File stem.
    pub name: String,
    /// Caption.
    pub title: String,
    /// The SVG document.
    #[serde(skip)]
    pub svg: String,
}

/// Outcome of a target check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Met.
    Pass,
    /// Missed.
    Fail,
    /// Could not be measured in this run.
    Skipped,
}

/// A performance target checked against numbers measured in one run.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What is checked.
    pub name: String,
    /// The target, in words.
    pub target: String,
    /// What was measured.
    pub measured: String,
    /// Outcome.
    pub status: Status,
}

impl Check {
    /// A check that passes when `ok`.
    pub fn new(name: impl Into<String>, target: impl Into<String>, measured: impl Into<String>, ok: bool) -> Self {
        Self {
            name: name.into(),
            target: target.into(),
            measured: measured.into(),
            status: if ok { Status::Pass } else { Status::Fail },
        }
    }

    /// A check that could not be made, and why.
    pub fn skipped(name: impl Into<String>, target: impl Into<String>, why: impl Into<String>) -> Self {
        Self { name: name.into(), target: target.into(), measured: why.into(), status: Status::Skipped }
    }
}

/// Everything one benchmark produced.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioReport {
    /// Short name (`udp-bulk`).
    pub name: String,
    /// Heading.
    pub title: String,
    /// What it measures and how to read it.
    pub description: String,
    /// Every resolved option.
    pub options: Vec<(String, String)>,
    /// Measurements.
    pub tables: Vec<Table>,
    /// Charts.
    pub charts: Vec<Chart>,
    /// Target checks.
    pub checks: Vec<Check>,
    /// Observations worth reading.
    pub notes: Vec<String>,
    /// Raw results.
    pub raw: serde_json::Value,
}

impl ScenarioReport {
    /// Prints options, tables, checks and notes.
    pub fn print(&self) {
        println!("== {} ==", self.title);
        for (k, v) in &self.options {
            println!("{k}={v}");
        }
        for t in &self.tables {
            println!();
            print!("{}", t.to_text());
        }
        if !self.checks.is_empty() {
            println!();
            println!("Targets (measured in this run):");
            for c in &self.checks {
                let tag = match c.status {
                    Status::Pass => "PASS",
                    Status::Fail => "FAIL",
                    Status::Skipped => "SKIP",
                };
                println!("  [{tag}] {}: {} (target: {})", c.name, c.measured, c.target);
            }
        }
        for n in &self.notes {
            println!("note: {n}");
        }
    }

    /// Writes `<dir>/<name>.json`, one CSV per table and one SVG per chart.
    pub fn write_files(&self, dir: &Path) -> Result<()> {
        fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        let json = serde_json::to_string_pretty(self)?;
        fs::write(dir.join(format!("{}.json", self.name)), json)?;
        for t in &self.tables {
            fs::write(dir.join(format!("{}.csv", t.name)), t.to_csv())?;
        }
        let charts = dir.join("charts");
        if !self.charts.is_empty() {
            fs::create_dir_all(&charts)?;
        }
        for c in &self.charts {
            fs::write(charts.join(format!("{}.svg", c.name)), &c.svg)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Table {
        Table {
            name: "t".into(),
            title: "T".into(),
            columns: vec!["mode".into(), "MB/s".into()],
            rows: vec![
                vec![Cell::text("gso"), Cell::num(1234.5678, 1)],
                vec![Cell::text("a,\"b\""), Cell::num(f64::NAN, 1)],
            ],
        }
    }

    #[test]
    fn csv_quotes_and_keeps_precision() {
        assert_eq!(table().to_csv(), "mode,MB/s\ngso,1234.5678\n\"a,\"\"b\"\"\",-\n");
    }

    #[test]
    fn text_is_aligned() {
        let t = table().to_text();
        assert_eq!(t, "T\n  mode     MB/s\n  gso    1234.6\n  a,\"b\"       -\n");
    }
}

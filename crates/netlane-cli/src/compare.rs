//! `netlane compare A [A...] B`: results documents side by side, noise-aware
//! ([`netlane_report::compare`]).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use netlane_report::compare::{self, Compared, Comparison};
use netlane_report::terminal;

use crate::out::{self, EXIT_STRICT, OutputArgs};

/// `netlane compare`.
#[derive(Debug, Args)]
pub struct CompareArgs {
    /// The reference, then the run judged against it: each a lab's report directory or
    /// its results.json, or a bench's --json file. Several reference runs (`A1 A2 B`)
    /// are pooled: how far their medians lie apart widens each check's tolerance.
    #[arg(value_name = "RUN", num_args = 2.., required = true)]
    pub runs: Vec<PathBuf>,
    /// How far apart two medians must be, as a share of the larger, before a difference
    /// counts (when the two runs' ranges do not touch either).
    #[arg(long, default_value = "10%", value_parser = parse_share)]
    pub tolerance: f64,
    /// List every metric, not only those that moved.
    #[arg(long)]
    pub all: bool,
    #[command(flatten)]
    pub out: OutputArgs,
    /// Exit with status 3 when any check regressed.
    #[arg(long)]
    pub strict: bool,
}

/// `10%` or `0.1`, from 0 to 10 (1000%).
fn parse_share(s: &str) -> Result<f64, String> {
    let (num, scale) = match s.strip_suffix('%') {
        Some(n) => (n, 0.01),
        None => (s, 1.0),
    };
    let v: f64 = num.trim().parse().map_err(|_| format!("{s:?}: expected a share such as 10% or 0.1"))?;
    let v = v * scale;
    if (0.0..=10.0).contains(&v) { Ok(v) } else { Err(format!("{s}: must be 0% to 1000%")) }
}

/// The largest results document read (a full lab's is about half a megabyte).
const MAX_RESULTS_BYTES: u64 = 64 << 20;

/// A results document from a file, or from a report directory's results.json.
fn read(path: &Path) -> Result<(String, Compared)> {
    let file = if path.is_dir() { path.join("results.json") } else { path.to_path_buf() };
    let text = netlane::files::read_text(&file, MAX_RESULTS_BYTES)?;
    let doc = Compared::parse(&text).with_context(|| file.display().to_string())?;
    Ok((file.display().to_string(), doc))
}

/// The comparison for people: both sides, warnings, the checks, the metrics that moved,
/// the verdict.
fn text(c: &Comparison, all: bool) -> String {
    let side = |name: &str, s: &compare::Side| {
        format!(
            "{name}: {} ({}{}, run {}, commit {}, {} on {} CPUs)\n",
            s.path,
            s.kind,
            if s.quick { ", quick" } else { "" },
            s.run_id,
            s.git_commit,
            s.host.kernel,
            s.host.cpus
        )
    };
    let mut out: String =
        c.a.iter()
            .enumerate()
            .map(|(i, s)| side(&if c.a.len() > 1 { format!("A{}", i + 1) } else { "A".into() }, s))
            .collect();
    out += &side("B", &c.b);
    for w in &c.warnings {
        out.push_str(&format!("warning: {w}\n"));
    }
    out.push('\n');
    out.push_str(&terminal::table(&c.checks_table()));
    let metrics = c.metrics_table(all);
    if metrics.rows.is_empty() {
        out.push_str(&format!(
            "\nNo metric moved beyond both runs' spread and {}% ({} compared).\n",
            netlane_report::format::plain(c.tolerance_pct, 1),
            c.summary.metrics
        ));
    } else {
        out.push('\n');
        out.push_str(&terminal::table(&metrics));
    }
    out.push_str(&format!("\nVerdict: {}\n", c.summary.sentence()));
    out
}

impl CompareArgs {
    /// Reads both, compares, and says so.
    pub fn run(&self) -> Result<u8> {
        self.out.validate()?;
        let (last, reference) = self.runs.split_last().context("name the runs to compare")?;
        let runs_a = reference.iter().map(|p| read(p)).collect::<Result<Vec<_>>>()?;
        let (path_b, b) = read(last)?;
        let pooled: Vec<(&str, &Compared)> = runs_a.iter().map(|(p, d)| (p.as_str(), d)).collect();
        let c = compare::compare_pooled(&pooled, &path_b, &b, self.tolerance);
        if !self.out.json_to_stdout() {
            out::print(&text(&c, self.all));
        }
        let regressed = c.summary.regressed;
        let doc = netlane_report::document("compare", c);
        self.out.write_tables(&doc.provenance.run_id, &[doc.body.checks_table(), doc.body.metrics_table(true)])?;
        self.out.write_json(&doc)?;
        Ok(if self.strict && regressed > 0 { EXIT_STRICT } else { 0 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tolerance_is_a_share() {
        assert_eq!(parse_share("10%"), Ok(0.1));
        assert_eq!(parse_share("0.25"), Ok(0.25));
        assert_eq!(parse_share("0%"), Ok(0.0));
        assert!(parse_share("-5%").unwrap_err().contains("0% to 1000%"));
        assert!(parse_share("lots").unwrap_err().contains("such as 10%"));
    }
}

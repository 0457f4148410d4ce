//! The lab's HTML page: one self-contained file (charts inlined as SVG), readable
//! without a server or scripts.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use anyhow::Result;

use super::{ScenarioReport, Status};

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Facts about the machine and run shown at the top of the page.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunInfo {
    /// `uname -r`-like kernel release.
    pub kernel: String,
    /// Number of CPUs.
    pub cpus: usize,
    /// When the lab started (UTC).
    pub started: String,
    /// Wall time of the whole lab.
    pub seconds: f64,
    /// The command line.
    pub command: String,
}

/// Writes `index.html` in `dir` for `scenarios`.
pub fn write_html(dir: &Path, info: &RunInfo, scenarios: &[ScenarioReport]) -> Result<()> {
    let mut h = String::new();
    let _ = write!(
        h,
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>netlane lab report</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }}
th, td {{ border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; }}
th {{ background: #f3f3f3; }} td:first-child, th:first-child {{ text-align: left; }}
.pass {{ color: #137333; font-weight: bold; }} .fail {{ color: #b3261e; font-weight: bold; }} .skipped {{ color: #666; }}
.opts {{ font-family: monospace; font-size: 0.85em; background: #f7f7f7; padding: 0.6em; white-space: pre-wrap; }}
.chart {{ margin: 1em 0; }} .note {{ background: #fff8e1; padding: 0.4em 0.8em; border-left: 3px solid #f9a825; }}
</style></head><body>
<h1>netlane lab report</h1>
<p>Kernel {kernel}, {cpus} CPUs. Started {started} UTC, took {secs:.0} s.<br><code>{cmd}</code></p>
<p>Every number below was measured in this run on this machine. Targets compare modes measured side by side
in the same run (ratios), because single numbers on a shared 2-CPU machine are noisy.</p>
"#,
        kernel = esc(&info.kernel),
        cpus = info.cpus,
        started = esc(&info.started),
        secs = info.seconds,
        cmd = esc(&info.command),
    );
    h.push_str("<h2>Contents</h2><ul>");
    for s in scenarios {
        let _ = write!(h, "<li><a href=\"#{}\">{}</a></li>", esc(&s.name), esc(&s.title));
    }
    h.push_str("</ul>");
    for s in scenarios {
        let _ = write!(h, "<h2 id=\"{}\">{}</h2><p>{}</p>", esc(&s.name), esc(&s.title), esc(&s.description));
        if !s.checks.is_empty() {
            h.push_str("<h3>Targets</h3><table><tr><th>check</th><th>target</th><th>measured</th><th>result</th></tr>");
            for c in &s.checks {
                let (class, word) = match c.status {
                    Status::Pass => ("pass", "pass"),
                    Status::Fail => ("fail", "FAIL"),
                    Status::Skipped => ("skipped", "not measured"),
                };
                let _ = write!(
                    h,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"{class}\">{word}</td></tr>",
                    esc(&c.name),
                    esc(&c.target),
                    esc(&c.measured)
                );
            }
            h.push_str("</table>");
        }
        for t in &s.tables {
            let _ = write!(h, "<h3>{}</h3><table><tr>", esc(&t.title));
            for c in &t.columns {
                let _ = write!(h, "<th>{}</th>", esc(c));
            }
            h.push_str("</tr>");
            for r in &t.rows {
                h.push_str("<tr>");
                for c in r {
                    let _ = write!(h, "<td>{}</td>", esc(&c.render()));
                }
                h.push_str("</tr>");
            }
            let _ = write!(h, "</table><p><a href=\"{}.csv\">{}.csv</a></p>", esc(&t.name), esc(&t.name));
        }
        for c in &s.charts {
            let _ = write!(h, "<div class=\"chart\">{}</div>", c.svg);
        }
        for n in &s.notes {
            let _ = write!(h, "<p class=\"note\">{}</p>", esc(n));
        }
        h.push_str("<details><summary>Options</summary><div class=\"opts\">");
        for (k, v) in &s.options {
            let _ = writeln!(h, "{}={}", esc(k), esc(v));
        }
        let _ = write!(h, "</div></details><p>Raw results: <a href=\"{0}.json\">{0}.json</a></p>", esc(&s.name));
    }
    h.push_str("</body></html>\n");
    fs::write(dir.join("index.html"), h)?;
    Ok(())
}

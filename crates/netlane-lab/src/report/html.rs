//! The lab's HTML page: one self-contained file (charts inline as SVG, no scripts),
//! readable from 320 px up. The first screen says what was met, within noise, missed
//! or invalid, one headline per scenario, where the numbers come from, and how to read
//! them.

use maud::{DOCTYPE, Markup, PreEscaped, html};

use super::svg;
use netlane_report::format;
use netlane_report::{Check, Document, Outcome, Results, ScenarioReport, Table, Tally, Value};

const STYLE: &str = r#"
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d1d1f;line-height:1.45;background:#fff}
main{max-width:1100px;margin:0 auto;padding:1.5rem 1rem 4rem}
h1{font-size:1.7rem;margin:.2rem 0 1rem}h2{font-size:1.35rem;margin:2.5rem 0 .4rem;padding-top:1rem;border-top:1px solid #ddd}
h3{font-size:1.05rem;margin:1.4rem 0 .4rem}
code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:.85em;overflow-wrap:anywhere}
.scroll{overflow-x:auto;max-width:100%;margin:.4rem 0}
table{border-collapse:collapse;font-size:.88rem}
th,td{border-bottom:1px solid #e3e3e3;padding:.3rem .55rem;text-align:right;white-space:nowrap;vertical-align:top}
th{background:#f5f5f7;font-weight:600}
td.l,th.l{text-align:left}td.wrap{white-space:normal;min-width:14rem}
.badge{display:inline-block;border-radius:.7rem;padding:.05rem .55rem;font-size:.8rem;font-weight:600;white-space:nowrap}
.met{background:#d9f2df;color:#0b5c1f}.within_noise{background:#fff1c7;color:#6b4e00}
.missed{background:#fbd9d6;color:#8c1d13}.invalid{background:#e9d7f5;color:#4f1f73}.skipped{background:#e6e6e6;color:#444}.not_shown{background:#e3eef9;color:#1f4f73}
.tally{display:flex;flex-wrap:wrap;gap:.5rem;margin:.3rem 0 1rem;font-size:1.05rem}
.tally .badge{font-size:1rem;padding:.2rem .8rem}
.verdict{background:#fafafa;border:1px solid #e3e3e3;border-radius:.5rem;padding:.8rem 1rem}
.headline{font-weight:600}
.warn{background:#fff8e1;border-left:4px solid #f9a825;padding:.4rem .8rem;margin:.5rem 0}
.flag{border-left:4px solid #c62828;background:#fdecea;padding:.4rem .8rem;margin:.4rem 0}
dl.kv{display:grid;grid-template-columns:max-content 1fr;gap:.15rem 1rem;margin:.4rem 0}
dl.kv dt{font-weight:600}dl.kv dd{margin:0;overflow-wrap:anywhere}
details{margin:.6rem 0}summary{cursor:pointer;font-weight:600}
figure{margin:1rem 0}figure svg{width:100%;height:auto;display:block}figcaption{font-size:.85rem;color:#555}
ol.foot{font-size:.82rem;color:#444;margin:.2rem 0 0 1.2rem;padding:0}ol.foot li{overflow-wrap:anywhere}
.opts{font-family:ui-monospace,monospace;font-size:.8rem;background:#f7f7f7;padding:.6rem;white-space:pre-wrap;overflow-wrap:anywhere}
nav ul{padding-left:1.2rem}
@media (max-width:700px){main{padding:1rem .6rem 3rem}h1{font-size:1.4rem}dl.kv{grid-template-columns:1fr}}
"#;

fn badge(o: Outcome) -> Markup {
    let class = o.name();
    html! { span class={"badge " (class)} { (o.label()) } }
}

fn tally(t: &Tally) -> Markup {
    html! {
        div class="tally" {
            span class="badge met" { (t.met) " met" }
            span class="badge within_noise" { (t.within_noise) " within noise" }
            span class="badge missed" { (t.missed) " missed" }
            span class="badge invalid" { (t.invalid) " invalid" }
            @if t.skipped > 0 { span class="badge skipped" { (t.skipped) " skipped" } }
            @if t.not_shown > 0 { span class="badge not_shown" { (t.not_shown) " not shown on this machine" } }
        }
    }
}

fn measured(c: &Check) -> Markup {
    let unit = &c.target.unit;
    html! {
        @match &c.measured {
            Some(m) if m.samples.len() > 1 => {
                (format::measured(m.median, unit)) br;
                span class="mono" { "median of " (m.samples.len()) ", " (format::sig3(m.min)) " .. " (format::sig3(m.max)) }
            }
            Some(m) => { (format::measured(m.median, unit)) }
            None => { "-" }
        }
    }
}

fn checks(cs: &[Check]) -> Markup {
    html! {
        div class="scroll" {
            table {
                tr { th class="l" { "outcome" } th class="l" { "target" } th { "measured" } th { "wanted" } th class="l" { "how measured / why" } }
                @for c in cs {
                    tr {
                        td class="l" { (badge(c.outcome)) }
                        td class="l wrap" { (c.name) }
                        td { (measured(c)) }
                        td { (format::target(&c.target)) }
                        td class="l wrap" { (c.reason) }
                    }
                }
            }
        }
    }
}

/// Every missed or invalid target, on the first screen: what, where, and why.
fn not_met(scenarios: &[ScenarioReport]) -> Markup {
    let bad: Vec<(&str, &Check)> = scenarios
        .iter()
        .flat_map(|s| s.checks.iter().map(move |c| (s.name.as_str(), c)))
        .filter(|(_, c)| matches!(c.outcome, Outcome::Missed | Outcome::Invalid))
        .collect();
    html! {
        @if !bad.is_empty() {
            h3 { "Missed and invalid targets" }
            div class="scroll" {
                table {
                    tr { th class="l" { "outcome" } th class="l" { "scenario" } th class="l" { "target" } th { "measured" } th { "wanted" } }
                    @for (name, c) in &bad {
                        tr {
                            td class="l" { (badge(c.outcome)) }
                            td class="l" { a href={"#" (name)} { (name) } }
                            td class="l wrap" { (c.name) }
                            td { (measured(c)) }
                            td { (format::target(&c.target)) }
                        }
                    }
                }
            }
        }
    }
}

fn table(t: &Table) -> Markup {
    html! {
        h3 { (t.title) }
        div class="scroll" {
            table {
                tr { @for (i, c) in t.columns.iter().enumerate() { th class=[(i == 0).then_some("l")] { (c.label) } } }
                @for (ri, r) in t.rows.iter().enumerate() {
                    tr {
                        @for (i, (v, c)) in r.cells.iter().zip(&t.columns).enumerate() {
                            td class=[matches!(v, Value::Text(_)).then_some("l")] {
                                (format::cell(v, c.decimals))
                                @if i == 0 { @if let Some(n) = t.footnote_number(ri) { sup { "[" (n) "]" } } }
                            }
                        }
                    }
                }
            }
        }
        @let notes = t.footnotes();
        @if !notes.is_empty() { ol class="foot" { @for n in &notes { li { (n) } } } }
        p class="mono" { a href={(t.name) ".csv"} { (t.name) ".csv" } }
    }
}

fn scenario(s: &ScenarioReport) -> Markup {
    html! {
        section id=(s.name) {
            h2 { (s.title) }
            p class="headline" { (s.headline) }
            p { (s.description) }
            @if !s.cpu_plan.is_empty() { p class="plan" { "CPU plan: " (netlane_report::terminal::cpu_plan(&s.cpu_plan)) } }
            @if !s.checks.is_empty() {
                h3 { "Targets" }
                (tally(&Tally::of(&s.checks)))
                (checks(&s.checks))
            }
            @for f in &s.flags {
                div class="flag" { strong { (f.kind.name()) ": " (f.subject) } " " (f.message) }
            }
            @for c in &s.charts {
                figure data-name=(c.name) data-series=(c.series.len()) {
                    @match svg::render(c) {
                        Ok(svg) => { div class="chart" { (PreEscaped(svg)) } }
                        Err(e) => { div class="warn chart-error" { "chart " (c.name) " could not be drawn: " (e) } }
                    }
                    figcaption { (c.title) " (" a href={"charts/" (c.name) ".svg"} { "SVG" } ")" }
                }
            }
            @for t in &s.tables { (table(t)) }
            @if !s.notes.is_empty() { h3 { "Notes" } ul { @for n in &s.notes { li { (n) } } } }
            details {
                summary { "Options (" (s.echo.len()) ")" }
                div class="opts" { @for e in &s.echo { (e) "\n" } }
            }
            p class="mono" { "Raw runs: " a href={(s.name) ".json"} { (s.name) ".json" } ", " a href="runs.csv" { "runs.csv" } }
        }
    }
}

fn glossary() -> Markup {
    let items: [(&str, &str); 13] = [
        ("met", "every paired sample meets the target"),
        ("within noise", "the target lies inside the range of the paired samples: some pairs meet it, some do not"),
        ("missed", "no paired sample meets the target"),
        (
            "invalid",
            "an input was degenerate (nothing moved, no CPU time, NaN, an empty histogram, an impossible run); counts as missed",
        ),
        ("skipped", "a mode the check needs did not run; counts as missed under --strict"),
        (
            "not shown on this machine",
            "the machine has too few CPUs to show the effect (say, busy polling beside a generator); the reason gives how \
             many it needs and where the roles ran instead; neither met nor a failure, under --strict too",
        ),
        ("round", "every mode of a scenario runs once per round, in an order that rotates from round to round"),
        (
            "paired ratio",
            "a ratio of two modes measured in the same round; checks use the median of the per-round ratios and show their range",
        ),
        ("spread", "(max - min) / median of a mode's repeats"),
        ("MB, GB", "10^6 and 10^9 bytes; MB/s likewise"),
        (
            "s/GB",
            "CPU seconds per GB moved: per GB sent for a sender, per GB received for a receiver or the whole machine",
        ),
        ("x ceiling", "packets per second per core as a share of a trivial XDP_TX program's, measured in the same run"),
        ("p50 .. p99.99", "latency percentiles from HDR histograms (3 significant digits)"),
    ];
    html! {
        details class="glossary" {
            summary { "How to read this report" }
            dl class="kv" { @for (t, d) in items { dt { (t) } dd { (d) } } }
            p { "Every number was measured in this run on this machine. See docs/output.md in the source for every field." }
        }
    }
}

/// The page for a lab (or bench) document.
pub fn page(doc: &Document<Results>) -> String {
    let r = &doc.body;
    let p = &doc.provenance;
    let h = &doc.host;
    let m = &r.machine;
    let short = p.git_commit.get(..12).unwrap_or(&p.git_commit);
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "netlane lab report " (p.started_at) }
                style { (PreEscaped(STYLE)) }
            }
            body { main {
                h1 { "netlane lab report" }
                section class="verdict" {
                    (tally(&r.summary))
                    div class="scroll" {
                        table {
                            tr { th class="l" { "scenario" } th class="l" { "headline" } th { "met" } th { "within noise" } th { "missed" } th { "invalid" } th { "skipped" } th { "not shown here" } }
                            @for s in &r.scenarios {
                                @let t = Tally::of(&s.checks);
                                tr {
                                    td class="l" { a href={"#" (s.name)} { (s.name) } }
                                    td class="l wrap" { (s.headline) }
                                    td { (t.met) } td { (t.within_noise) } td { (t.missed) } td { (t.invalid) } td { (t.skipped) } td { (t.not_shown) }
                                }
                            }
                        }
                    }
                    @if r.quick {
                        div class="warn" { "A quick lab (" code { "--quick" } "): one round per scenario and shorter runs. Its verdicts show that the paths work; for measurements run the lab without " code { "--quick" } "." }
                    }
                    @for w in &m.warnings { div class="warn" { "Warning: " (w) } }
                    (not_met(&r.scenarios))
                }
                h3 { "Provenance" }
                dl class="kv" {
                    dt { "netlane" } dd { (p.version) " (commit " code { (short) } ")" }
                    dt { "started" } dd { (p.started_at) @if let Some(s) = m.seconds { ", took " (format::plain(s, 0)) " s" } }
                    dt { "host" } dd { "Linux " (h.kernel) ", " (h.cpu_model) ", " (h.cpus) " CPUs, " (format::plain(h.memory_gib, 1)) " GiB" }
                    dt { "load" } dd {
                        @if let Some(b) = m.busy_pct_before { (format::plain(b, 0)) "% busy before the run; " }
                        "load average "
                        @if let Some(l) = m.load_avg_1m_start { (format!("{l:.2}")) } @else { "-" } " at start"
                        @if let Some(l) = m.load_avg_1m_end { ", " (format!("{l:.2}")) " at end" }
                        @if let Some(s) = m.steal_pct_during { "; " (format::plain(s, 1)) "% of CPU time stolen by the hypervisor during the run" }
                    }
                    dt { "command" } dd { code { (p.command.join(" ")) } }
                    dt { "run id" } dd { code { (p.run_id) } }
                }
                (glossary())
                nav { h3 { "Scenarios" } ul { @for s in &r.scenarios { li { a href={"#" (s.name)} { (s.title) } } } } }
                @for s in &r.scenarios { (scenario(s)) }
            } }
        }
    };
    markup.into_string()
}

//! `netlane lab --quick` as a user runs it: the report directory it writes (every file,
//! the first screen: quick said, missed and invalid targets listed), read in headless
//! Chromium at a phone's and a desktop's width.

use std::path::Path;
use std::process::Command;

mod common;
use common::{netlane, stderr, stdout, temp_dir, valid_document};

/// Whether `test` may run, and, when it may, the machine to itself among these tests:
/// both measure (the quick lab's verdicts, compare's alike runs), and `make test` runs
/// the command-line tests two at a time.
fn privileged(test: &str) -> Option<common::Alone> {
    static ONE_LAB: std::sync::Mutex<()> = std::sync::Mutex::new(());
    netlane_testkit::privileged(test).then(|| common::alone(&ONE_LAB))
}

/// What a page looks like in headless Chromium at `width` pixels: the page's scroll
/// width, and each chart's size and element count, measured by a script added to a
/// copy of the page.
fn chromium_probe(page: &Path, width: u32) -> serde_json::Value {
    let probe = r#"<script>
addEventListener('load', () => {
  const d = document.documentElement;
  const charts = [...document.querySelectorAll('figure')].map(f => {
    const s = f.querySelector('svg');
    if (!s) return {svg: false, name: f.dataset.name};
    const r = s.getBoundingClientRect();
    // The plot: where the mesh's faint lines are. Tick labels sit left of it (y; the
    // axis description is the rotated text) and below it (x, then the description).
    const grid = [...s.querySelectorAll('line')]
      .filter(l => parseFloat(l.getAttribute('opacity') || '1') < 1).map(l => l.getBBox());
    const x0 = Math.min(...grid.map(b => b.x)), x1 = Math.max(...grid.map(b => b.x + b.width));
    const y0 = Math.min(...grid.map(b => b.y)), y1 = Math.max(...grid.map(b => b.y + b.height));
    const texts = [...s.querySelectorAll('text')].filter(t => t.textContent.trim()).map(t => [t, t.getBBox()]);
    const left = texts.filter(([t, b]) => !t.getAttribute('transform') && b.x + b.width <= x0 + 1
      && b.y + b.height >= y0 - 8 && b.y <= y1 + 8).length;
    const below = texts.filter(([t, b]) => b.y >= y1 - 1 && b.x + b.width >= x0 - 40 && b.x <= x1 + 40).length;
    // Each series' colour fills its markers, bars and legend swatch.
    const colours = new Set([...s.querySelectorAll('circle,rect')]
      .map(e => (e.getAttribute('fill') || '').toUpperCase()).filter(c => c && c !== '#FFFFFF' && c !== 'NONE'));
    return {svg: true, name: f.dataset.name, series: +f.dataset.series, colours: colours.size, yLabels: left,
      belowX: below, gridLines: grid.length, width: r.width, height: r.height,
      elements: s.querySelectorAll('*').length};
  });
  const wide = [...document.body.querySelectorAll('*')]
    .filter(e => e.getBoundingClientRect().right > innerWidth + 1 && !e.closest('.scroll'))
    .slice(0, 5).map(e => e.tagName + '.' + e.className);
  const p = document.createElement('pre');
  p.id = 'netlane-probe';
  p.textContent = JSON.stringify({scrollWidth: d.scrollWidth, innerWidth, charts, wide,
    chartErrors: document.querySelectorAll('.chart-error').length});
  document.body.appendChild(p);
});
</script>"#;
    let html = std::fs::read_to_string(page).unwrap();
    let copy = page.with_file_name(format!("probe-{width}.html"));
    std::fs::write(&copy, html.replace("</body>", &format!("{probe}</body>"))).unwrap();
    let profile = page.with_file_name(format!("chromium-{width}"));
    let o = Command::new("chromium")
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run"])
        .args(["--disable-background-networking", "--disable-component-update", "--disable-sync"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--window-size={width},1000"))
        .args(["--virtual-time-budget=10000", "--dump-dom"])
        .arg(format!("file://{}", copy.display()))
        .output()
        .expect("run chromium (scripts/setup.sh installs it)");
    let dom = String::from_utf8_lossy(&o.stdout);
    let start = dom.find("<pre id=\"netlane-probe\">").unwrap_or_else(|| panic!("no probe output: {}", stderr(&o)));
    let rest = &dom[start + "<pre id=\"netlane-probe\">".len()..];
    let json = rest[..rest.find("</pre>").unwrap()].replace("&quot;", "\"").replace("&amp;", "&");
    serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"))
}

#[test]
fn lab_writes_a_complete_report_that_reads_in_a_browser() {
    let Some(_alone) = privileged("lab_writes_a_complete_report_that_reads_in_a_browser") else {
        return;
    };
    let dir = temp_dir("lab");
    let o = netlane(&["lab", "--quick", "--out", dir.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("Verdict:") && out.contains("report:") && out.contains("index.html"), "{out}");
    let html = std::fs::read_to_string(dir.join("index.html")).unwrap();
    assert!(html.contains("<svg") && html.contains("udp-pacing") && html.contains("<table"), "html incomplete");
    for f in [
        "udp-bulk.csv",
        "udp-pacing.csv",
        "udp-pacing.json",
        "nvme.json",
        "nvme-qd1.csv",
        "lb-pps.csv",
        "runs.csv",
        "checks.csv",
        "results.json",
        "charts/udp-bulk-throughput.svg",
        "charts/udp-pacing-loss.svg",
        "charts/nvme-qd1.svg",
        "charts/nvme-mixed.svg",
        "charts/lb-pps-mpps.svg",
        "rr.json",
        "rr-paths.csv",
        "charts/rr-paths.svg",
        "charts/rr-large.svg",
    ] {
        assert!(dir.join(f).is_file(), "missing {f}");
    }
    let doc = valid_document(&std::fs::read_to_string(dir.join("results.json")).unwrap(), "results");
    assert_eq!(doc["kind"], "lab");
    let names: Vec<&str> = doc["scenarios"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["udp-bulk", "udp-pacing", "nvme", "lb-pps", "rr", "kv", "lanes", "soak"]);
    // The first screen says it was quick, and lists every missed or invalid target before
    // anything else; invalid and skipped are counted apart.
    assert_eq!(doc["quick"], true);
    let provenance = html.find("<h3>Provenance</h3>").expect("a provenance section");
    let quick = html.find("A quick lab (<code>--quick</code>)").expect("the quick lab said so");
    assert!(quick < provenance);
    assert!(html.contains("<th>invalid</th><th>skipped</th>"), "invalid and skipped apart");
    let bad: Vec<&str> = doc["scenarios"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["checks"].as_array().unwrap())
        .filter(|c| c["outcome"] == "missed" || c["outcome"] == "invalid")
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    if !bad.is_empty() {
        let list = html.find("<h3>Missed and invalid targets</h3>").expect("the list on the first screen");
        assert!(list < provenance);
        let first_screen = &html[list..provenance];
        for name in &bad {
            let escaped = name.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
            assert!(first_screen.contains(&escaped), "{name} not on the first screen");
        }
    }
    // The soak held every server to its bounds, and read the NVMe data back after kill -9
    // (the tail latency bound is left to the general rule: measured, not invalid; this
    // machine runs other jobs beside the tests).
    let soak = &doc["scenarios"][7];
    for c in soak["checks"].as_array().unwrap().iter().filter(|c| !c["id"].as_str().unwrap().ends_with("_p99")) {
        assert_eq!(c["outcome"], "met", "{c}");
    }
    assert!(soak["checks"].as_array().unwrap().iter().any(|c| c["id"] == "soak.nvme_read_back"), "{soak}");
    let pacing = &doc["scenarios"][1];
    assert_eq!(pacing["tables"][0]["rows"].as_array().unwrap().len(), 5, "five sweep points");
    // lb-pps timed every frames-path program with no device too, in every slice.
    let lb = &doc["scenarios"][3];
    let bare =
        lb["tables"].as_array().unwrap().iter().find(|t| t["name"] == "lb-pps-no-device").expect("no-device table");
    let rows = bare["rows"].as_array().unwrap();
    assert!(rows.iter().any(|r| r["program"] == "xdp_tx ceiling") && rows.len() >= 2, "{rows:?}");
    for r in rows {
        assert!(r["ns_per_packet"].as_f64().is_some_and(|ns| ns > 0.0), "{r}");
        assert!(r["over_xdp_tx_ns"].as_f64().is_some() && r["room_ns"].as_f64().is_some(), "{r}");
        let slices = r["slices_timed"].as_str().unwrap();
        let (timed, all) = slices.split_once('/').unwrap();
        assert_eq!(timed, all, "every slice timed with no device: {r}");
    }
    // Every check is measured, except where the load generator, on the two CPUs the
    // servers use, could not keep its open-loop schedule even when its runs were made
    // again: a VM whose hypervisor takes the CPUs for milliseconds at a time (steal) does
    // that, and the lab then says the check is invalid rather than measure the generator.
    for s in doc["scenarios"].as_array().unwrap() {
        let lagged = s["notes"].as_array().unwrap().iter().any(|n| {
            n.as_str().unwrap().contains("made again: the generator, on the same CPUs as the server, delayed more than")
        });
        for c in s["checks"].as_array().unwrap() {
            let reason = c["reason"].as_str().unwrap_or_default();
            let for_lag = lagged && (reason.contains("the generator delayed") || reason.contains("answered soundly"));
            if !for_lag {
                assert_ne!(c["outcome"], "invalid", "a quick lab run on this machine measures every check: {c}");
            }
        }
    }
    valid_document(&std::fs::read_to_string(dir.join("nvme.json")).unwrap(), "results");
    // In a browser, at a desktop and a narrow width: no horizontal overflow of the page
    // (wide tables scroll inside their boxes), and every chart drew.
    for width in [1400, 800] {
        let p = chromium_probe(&dir.join("index.html"), width);
        let (scroll, inner) = (p["scrollWidth"].as_f64().unwrap(), p["innerWidth"].as_f64().unwrap());
        assert!(scroll <= inner, "at {width} px the page overflows: {scroll} > {inner}; too wide: {}", p["wide"]);
        assert_eq!(p["wide"].as_array().unwrap().len(), 0, "at {width} px: {}", p["wide"]);
        assert_eq!(p["chartErrors"], 0, "at {width} px a chart could not be drawn");
        let charts = p["charts"].as_array().unwrap();
        let want: usize =
            doc["scenarios"].as_array().unwrap().iter().map(|s| s["charts"].as_array().unwrap().len()).sum();
        assert_eq!(charts.len(), want, "at {width} px: {charts:?}");
        for c in charts {
            assert_eq!(c["svg"], true, "{c}");
            assert!(c["width"].as_f64().unwrap() > 300.0 && c["height"].as_f64().unwrap() > 100.0, "{c}");
            assert!(c["elements"].as_u64().unwrap() > 40, "a chart with hardly anything drawn: {c}");
            // Both axes labelled, and no colour used by two series of one chart.
            assert!(c["gridLines"].as_u64().unwrap() > 0, "no mesh to find the plot by: {c}");
            assert!(c["yLabels"].as_u64().unwrap() >= 1, "no tick label left of the plot: {c}");
            assert!(c["belowX"].as_u64().unwrap() >= 2, "no tick label below the plot (only its description): {c}");
            assert_eq!(c["colours"], c["series"], "a colour used by two series (each has its swatch): {c}");
        }
    }
    // Nothing left behind: no lab namespace whose process is gone.
    let stale: Vec<String> = netlane::topology::netns_names()
        .into_iter()
        .filter(|n| ["udp-bulk", "udp-pacing", "nvme", "pps-", "rr", "kv"].iter().any(|l| n.contains(l)))
        .filter(|n| {
            netlane::topology::registry::owner_pid(n)
                .is_some_and(|pid| !Path::new("/proc").join(pid.to_string()).exists())
        })
        .collect();
    assert!(stale.is_empty(), "namespaces left behind: {stale:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `netlane compare` on real quick labs: two made alike show no regression; one whose GSO
/// mode was slowed on purpose (one datagram per GSO send, set with `--set`) shows that
/// check regressed, and `--strict` says so with status 3.
#[test]
fn compare_tells_a_slowed_mode_from_the_noise_between_two_alike_runs() {
    let Some(_alone) = privileged("compare_tells_a_slowed_mode_from_the_noise_between_two_alike_runs") else {
        return;
    };
    let dir = temp_dir("compare");
    let lab = |name: &str, extra: &[&str]| {
        let out = dir.join(name);
        let mut args = vec!["lab", "--quick", "--only", "udp-bulk", "--out", out.to_str().unwrap()];
        let plan = [
            "udp-bulk.modes=udp,gso",
            "udp-bulk.flows=none",
            "udp-bulk.no-selftest=true",
            "udp-bulk.repeat=3",
            "udp-bulk.time=500ms",
        ];
        for set in plan.iter().chain(extra) {
            args.extend(["--set", set]);
        }
        let o = netlane(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        out
    };
    let (a1, a2, slow) = (lab("a1", &[]), lab("a2", &[]), lab("slow", &["udp-bulk.segments=1"]));
    let compare_with = |a: &Path, b: &Path, tolerance: &str| {
        let o = netlane(&[
            "compare",
            a.to_str().unwrap(),
            b.to_str().unwrap(),
            "--json",
            "-",
            "--strict",
            "--tolerance",
            tolerance,
        ]);
        let doc = valid_document(&stdout(&o), "compare");
        (o.status.code(), doc)
    };
    let compare = |a: &Path, b: &Path| compare_with(a, b, "10%");
    let verdict = |doc: &serde_json::Value, id: &str| {
        doc["checks"].as_array().unwrap().iter().find(|c| c["id"] == id).unwrap_or_else(|| panic!("{id}"))["verdict"]
            .clone()
    };
    let (code, same) = compare(&a1, &a1);
    assert_eq!(code, Some(0));
    assert_eq!((same["summary"]["regressed"].as_u64(), same["summary"]["metrics_moved"].as_u64()), (Some(0), Some(0)));
    // Two runs made alike minutes apart on this shared 2-CPU VM, after the quick lab,
    // have differed by half (0.139 against 0.214, each with a range of 3 rounds that the
    // other's did not touch): more than the default tolerance is for. Alike runs here
    // are judged with room for that; the slowed mode, five times worse, is judged with
    // the default.
    let (code, alike) = compare_with(&a1, &a2, "100%");
    assert_eq!(code, Some(0), "two alike runs: {}", alike["checks"]);
    assert_eq!(verdict(&alike, "udp-bulk.gso-cpu-vs-udp"), "unchanged");
    assert!(alike["warnings"].as_array().unwrap().is_empty(), "{}", alike["warnings"]);
    let (code, slowed) = compare(&a1.join("results.json"), &slow);
    assert_eq!(code, Some(3), "{}", slowed["checks"]);
    assert_eq!(verdict(&slowed, "udp-bulk.gso-cpu-vs-udp"), "regressed");
    assert_eq!(slowed["summary"]["regressed"], 1);
    assert_eq!(slowed["warnings"], serde_json::json!(["udp-bulk options differ: segments 46 -> 1"]));
    // The two alike runs pooled as the reference: their spread widens the tolerance, and
    // the slowed mode still stands out at the default.
    let o = netlane(&["compare", a1.to_str().unwrap(), a2.to_str().unwrap(), slow.to_str().unwrap(), "--json", "-"]);
    let pooled = valid_document(&stdout(&o), "compare");
    assert_eq!(pooled["a"].as_array().map(Vec::len), Some(2));
    assert_eq!(verdict(&pooled, "udp-bulk.gso-cpu-vs-udp"), "regressed", "{}", pooled["checks"]);
    // The same for people, and as CSV.
    let csv = dir.join("csv");
    let o = netlane(&["compare", a1.to_str().unwrap(), slow.to_str().unwrap(), "--csv", csv.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "without --strict a regression is said, not an error");
    let text = stdout(&o);
    assert!(
        text.contains("regressed [1] | udp-bulk.gso-cpu-vs-udp") && text.contains("Verdict: 1 regressed"),
        "{text}"
    );
    assert!(csv.join("compare-checks.csv").is_file() && csv.join("compare-metrics.csv").is_file());
    // What is not a results document is refused with what it is.
    let probe = dir.join("probe.json");
    let o = netlane(&["probe", "--json", probe.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = netlane(&["compare", a1.to_str().unwrap(), probe.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o).trim(),
        format!("error: {}: a probe document: only a lab's or a bench's results compare", probe.display())
    );
    let o = netlane(&["compare", a1.to_str().unwrap(), dir.join("none").to_str().unwrap()]);
    assert!(stderr(&o).starts_with(&format!("error: open {}: ", dir.join("none").display())), "{}", stderr(&o));
    std::fs::remove_dir_all(&dir).unwrap();
}

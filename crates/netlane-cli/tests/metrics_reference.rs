//! `docs/metrics.md`, the reference of every Prometheus metric the servers serve, is
//! generated here from what they really serve: `kv serve`, `rr serve` and `nvme target`
//! each run with `--metrics-addr`, are given load by their own client, and scraped; `lb
//! run`'s exposition (which needs a device and root to serve) is rendered from its
//! statistics with one VIP and one real. The test fails when the file is stale; to
//! regenerate: `NETLANE_WRITE_METRICS=1 cargo test -p netlane-cli --test metrics_reference`.

use std::collections::BTreeMap;
use std::io::{Read, Write};

mod common;
use common::{netlane, repo, stderr};

/// Every family in an exposition: name -> (type, help, label keys seen, whether a sample
/// was).
fn families(text: &str) -> BTreeMap<String, (String, String, Vec<String>, bool)> {
    let mut f: BTreeMap<String, (String, String, Vec<String>, bool)> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            f.entry(name.to_string()).or_default().1 = help.replace("\\\\", "\\").replace("\\n", " ");
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            f.entry(name.to_string()).or_default().0 = kind.to_string();
        } else if !line.starts_with('#') && !line.is_empty() {
            let name_end = line.find(['{', ' ']).unwrap();
            let sample = &line[..name_end];
            // A histogram's samples are its family's name with a suffix.
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| sample.strip_suffix(s).filter(|b| f.contains_key(*b)))
                .unwrap_or(sample);
            if let Some(entry) = f.get_mut(family) {
                entry.3 = true;
            }
            if let (Some(entry), Some(labels)) = (f.get_mut(family), line[name_end..].strip_prefix('{')) {
                let labels = &labels[..labels.rfind('}').unwrap()];
                for kv in labels.split("\",").filter(|kv| !kv.is_empty()) {
                    let key = kv.split('=').next().unwrap().to_string();
                    if key != "le" && !entry.2.contains(&key) {
                        entry.2.push(key);
                    }
                }
            }
        }
    }
    f
}

/// GET /metrics from `addr`, the body.
fn scrape(addr: &str) -> String {
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    write!(c, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut resp = String::new();
    c.read_to_string(&mut resp).unwrap();
    resp.split_once("\r\n\r\n").unwrap().1.to_string()
}

/// Starts a server with `--metrics-addr 127.0.0.1:0`, runs `load` at the address its
/// first line names, and returns what its endpoint serves.
fn served(args: &[&str], load: impl FnOnce(&str) -> Vec<String>) -> String {
    let server = common::Started::new(&[args, &["--metrics-addr", "127.0.0.1:0"]].concat());
    let args = load(&server.addr());
    let o = netlane(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    // The servers publish what their threads counted a little late, and the target sees
    // perf's queues go only after perf exits: scrape once nothing is left connected.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let connected = |t: &str| {
        t.contains("netlane_nvme_target_open_connections ")
            && !t.contains(
                "netlane_nvme_target_open_connections 0
",
            )
    };
    let mut text = scrape(&server.metrics());
    while connected(&text) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
        text = scrape(&server.metrics());
    }
    let (code, _, err) = server.stop();
    assert_eq!(code, Some(0), "{err}");
    text
}

fn section(title: &str, text: &str) -> String {
    let mut s = format!("## {title}\n\n| metric | type | labels | meaning |\n|---|---|---|---|\n");
    for (name, (kind, help, labels, seen)) in families(text) {
        let labels = match (labels.is_empty(), seen) {
            (false, _) => labels.join(", "),
            (true, true) => "-".to_string(),
            (true, false) => "(none seen: no sample in the run)".to_string(),
        };
        s.push_str(&format!("| `{name}` | {kind} | {labels} | {} |\n", help.replace('|', "\\|")));
    }
    s + "\n"
}

#[test]
fn the_metrics_reference_is_what_the_servers_serve() {
    let words = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
    let kv = served(&["kv", "serve", "-l", "127.0.0.1", "-p", "-1", "-t", "1", "-m", "16"], |a| {
        words(&format!("kv load --server {a} -c 2 --rate 1000 --time 300ms --keys 100"))
    });
    let rr = served(&["rr", "serve", "--listen", "127.0.0.1:0"], |a| {
        words(&format!("rr clients --server {a} --clients 2 --rate 1000 -t 300ms"))
    });
    let nvme = served(&["nvme", "target", "--listen", "127.0.0.1:0"], |a| {
        words(&format!("nvme perf --target {a} -t 300ms --ramp 0s --rw randrw --qd 4"))
    });
    let lb = netlane_lb::stats::render_prometheus(&netlane_lb::stats::LbStats {
        iface: "eth0".into(),
        attach_mode: "native".into(),
        hints: "off".into(),
        global: [("tx".to_string(), 1)].into(),
        vips: vec![netlane_lb::stats::VipStats {
            vip: "10.100.0.1:80/tcp".into(),
            packets: 1,
            bytes: 60,
            reals: vec![netlane_lb::stats::RealStats { address: "10.1.0.11".into(), weight: 1, packets: 1, bytes: 60 }],
        }],
        tags: Default::default(),
        tags_in_use: 0,
    });
    let doc = format!(
        "# Metrics\n\nEvery Prometheus metric the servers serve on `--metrics-addr` (text format 0.0.4, \
         loopback only): its name, type, labels and meaning. Generated by \
         `crates/netlane-cli/tests/metrics_reference.rs` from what each server serves under load; \
         do not edit by hand.\n\n{}{}{}{}",
        section("`kv serve`", &kv),
        section("`rr serve`", &rr),
        section("`nvme target`", &nvme),
        section("`lb run` (also `/stats` as JSON, and `--prometheus FILE` for a textfile collector)", &lb),
    );
    for (server, text, least) in [("kv", &kv, 20), ("rr", &rr, 15), ("nvme", &nvme, 10), ("lb", &lb, 5)] {
        assert!(families(text).len() >= least, "{server}: {} families:\n{text}", families(text).len());
    }
    let path = repo().join("docs/metrics.md");
    if std::env::var("NETLANE_WRITE_METRICS").as_deref() == Ok("1") {
        std::fs::write(&path, &doc).unwrap();
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == doc,
        "docs/metrics.md is stale; regenerate with NETLANE_WRITE_METRICS=1 cargo test -p netlane-cli --test \
         metrics_reference"
    );
}

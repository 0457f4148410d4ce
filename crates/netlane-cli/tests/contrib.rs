//! What `contrib/` ships for operating the servers, checked against the real things:
//! the systemd units by systemd's own `systemd-analyze verify` (and each command line by
//! netlane's parser), the Grafana dashboards against the metrics the servers serve
//! (`docs/metrics.md`, itself generated from them).

use std::path::PathBuf;
use std::process::Command;

mod common;
use common::{repo, stderr, stdout, temp_dir};

fn files(dir: &str, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(repo().join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    v.sort();
    v
}

#[test]
fn the_systemd_units_verify_and_their_commands_parse() {
    let units = files("contrib/systemd", "service");
    assert_eq!(units.len(), 4, "{units:?}");
    let bin = env!("CARGO_BIN_EXE_netlane");
    let dir = temp_dir("units");
    std::fs::create_dir_all(&dir).unwrap();
    for u in &units {
        let text = std::fs::read_to_string(u).unwrap();
        // Verified with this build in the units' place (verify checks the binary exists).
        let local = dir.join(u.file_name().unwrap());
        std::fs::write(&local, text.replace("/usr/local/bin/netlane", bin)).unwrap();
        // The balancer cannot start without its next hop (checked when it runs, not by
        // the parser).
        if text.contains(" lb run ") {
            assert!(text.contains("--gateway"), "{}: lb run needs --gateway or --gateway-mac", u.display());
        }
        // Each command line parses as written (`--help` after it: parsed, not run).
        for line in text.lines().filter(|l| l.starts_with("ExecStart")) {
            let cmd = line.split_once('=').unwrap().1;
            let args: Vec<&str> = cmd.split_whitespace().skip(1).collect();
            let o = Command::new(bin).args(&args).arg("--help").output().unwrap();
            assert!(o.status.success(), "{}: {cmd}: {}", u.display(), stderr(&o));
        }
    }
    let o = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .args(units.iter().map(|u| dir.join(u.file_name().unwrap())))
        .output()
        .expect("systemd-analyze (systemd)");
    assert!(o.status.success() && stderr(&o).trim().is_empty(), "{}{}", stdout(&o), stderr(&o));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn every_metric_a_dashboard_plots_is_one_a_server_serves() {
    let reference = std::fs::read_to_string(repo().join("docs/metrics.md")).unwrap();
    let served: Vec<&str> = reference.split('`').filter(|w| w.starts_with("netlane_")).collect();
    let dashboards = files("contrib/grafana", "json");
    assert_eq!(dashboards.len(), 4, "{dashboards:?}");
    for d in &dashboards {
        let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(d).unwrap()).unwrap();
        assert!(doc["uid"].as_str().is_some_and(|u| !u.is_empty()) && doc["title"].is_string(), "{}", d.display());
        let panels = doc["panels"].as_array().unwrap();
        assert!(panels.len() >= 4, "{}", d.display());
        for p in panels {
            for t in p["targets"].as_array().unwrap() {
                let expr = t["expr"].as_str().unwrap();
                let names: Vec<&str> = expr
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .filter(|w| w.starts_with("netlane_"))
                    .collect();
                assert!(!names.is_empty(), "{}: {expr}", d.display());
                for n in names {
                    let family = n.strip_suffix("_bucket").unwrap_or(n);
                    assert!(served.contains(&family), "{}: {n} is not served (docs/metrics.md)", d.display());
                }
            }
        }
    }
}

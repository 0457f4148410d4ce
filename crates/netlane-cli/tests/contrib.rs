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

/// Each server started from its file in `contrib/config/` (the file its unit names), the
/// command line overriding the service's port and the namespace's path: what only the
/// file sets (its metrics port, the cache's sizes) shows in the server's first line.
#[test]
fn each_server_starts_from_its_config_file_and_the_command_line_wins() {
    let configs = files("contrib/config", "toml");
    assert_eq!(configs.len(), 3, "{configs:?}");
    let dir = temp_dir("configs");
    std::fs::create_dir_all(&dir).unwrap();
    let ns = format!("file:{}:16M", dir.join("ns1.img").display());
    let cases: [(&str, Vec<&str>, &[&str]); 3] = [
        (
            "netlane-kv",
            vec!["kv", "serve", "-p", "-1"],
            &["threads=4", "memory=1073741824", "max_conns=4096", "metrics=http://127.0.0.1:9464/metrics"],
        ),
        ("netlane-rr", vec!["rr", "serve", "--listen", "127.0.0.1:0"], &["metrics=http://127.0.0.1:9465/metrics"]),
        (
            "netlane-nvme-target",
            vec!["nvme", "target", "--listen", "127.0.0.1:0", "--ns", &ns],
            &["metrics=http://127.0.0.1:9466/metrics"],
        ),
    ];
    for (name, args, from_file) in cases {
        let config = repo().join(format!("contrib/config/{name}.toml"));
        let unit = std::fs::read_to_string(repo().join(format!("contrib/systemd/{name}.service"))).unwrap();
        let etc = format!("/etc/netlane/{}.toml", name.trim_start_matches("netlane-"));
        assert!(unit.contains(&format!("--config {etc}")) && unit.contains(&format!("contrib/config/{name}.toml")));
        let config = config.display().to_string();
        let args = [&args[..], &["--config", &config]].concat();
        let server = common::Started::new(&args);
        let first = server.first.clone();
        let (code, _, err) = server.stop();
        assert!(first.starts_with("listening on 127.0.0.1:"), "{name}: {first:?} {err}");
        assert!(!first.contains(":7070 ") && !first.contains(":4420 ") && !first.contains(":11211 "), "{first}");
        for want in from_file {
            assert!(first.contains(want), "{name}: {want} not in {first:?}");
        }
        assert_eq!(code, Some(0), "{name}: {err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_config_file_with_a_mistake_is_refused_in_one_line_naming_the_file_and_key() {
    let dir = temp_dir("bad-configs");
    std::fs::create_dir_all(&dir).unwrap();
    let cases = [
        ("rr", "serve", "listen = \"127.0.0.1:0\"\nbatchsize = 8\n", "`batchsize` is not an option of `rr serve`"),
        ("kv", "serve", "threads = \"four\"\n", "invalid value 'four' for '--threads <THREADS>'"),
        ("nvme", "target", "listen = [\n", "line 1, column 11: unclosed array"),
    ];
    for (i, (system, cmd, text, want)) in cases.into_iter().enumerate() {
        let file = dir.join(format!("{i}.toml"));
        std::fs::write(&file, text).unwrap();
        let o = common::netlane(&[system, cmd, "--config", &file.display().to_string()]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{system} {cmd}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with(&format!("error: {}: ", file.display())) && err.contains(want), "{err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

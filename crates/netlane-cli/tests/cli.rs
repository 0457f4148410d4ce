//! The `netlane` command as a user runs it.

use std::path::PathBuf;
use std::process::{Command, Output};

fn netlane(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_netlane")).args(args).output().expect("run netlane")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn privileged(test: &str) -> bool {
    if nix_is_root() {
        return true;
    }
    if std::env::var("NETLANE_REQUIRE_PRIVILEGED").as_deref() == Ok("1") {
        panic!("{test}: needs root, and NETLANE_REQUIRE_PRIVILEGED=1 forbids skipping");
    }
    eprintln!("SKIPPED {test}: needs root");
    false
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(2) == Some("0")))
        .unwrap_or(false)
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("netlane-cli-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn gso_size_above_the_path_mtu_is_refused() {
    let o = netlane(&["bench", "udp-bulk", "--gso-size", "9000", "--mtu", "1500", "--modes", "gso"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("above the path MTU") && e.contains("1472"), "{e}");
    let o = netlane(&["bench", "udp-bulk", "--gso-size", "1460", "--ipv6", "--modes", "gso"]);
    let e = stderr(&o);
    assert!(e.contains("1452") && e.contains("IPv6"), "{e}");
}

#[test]
fn zero_and_negative_rates_are_refused() {
    for rate in ["0MB/s", "0", "-5MB/s"] {
        let o = netlane(&["bench", "udp-bulk", "--modes", "paced", "--rates", rate]);
        assert_eq!(o.status.code(), Some(2), "rate {rate}");
        let e = stderr(&o);
        assert!(e.contains("must be positive") || e.contains("must not be negative"), "rate {rate}: {e}");
    }
    let o = netlane(&["bench", "udp-bulk", "--rates", "fast"]);
    assert!(stderr(&o).contains("unknown unit") || stderr(&o).contains("expected a number"), "{}", stderr(&o));
    let o = netlane(&["bench", "udp-pacing", "--bottleneck", "0mbit"]);
    assert!(stderr(&o).contains("must be positive"), "{}", stderr(&o));
}

#[test]
fn unknown_modes_list_the_valid_ones() {
    let o = netlane(&["bench", "udp-bulk", "--modes", "gso,warp"]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("warp") && e.contains("gso-gro") && e.contains("sendmmsg"), "{e}");
}

#[test]
fn other_bad_options_are_explained() {
    let cases: &[(&[&str], &str)] = &[
        (&["bench", "udp-bulk", "--duration", "0s"], "must be positive"),
        (&["bench", "udp-bulk", "--modes", "gso", "--segments", "64"], "at most 46"),
        (&["bench", "udp-bulk", "--tx-cpu", "4096"], "this machine has CPUs"),
        (&["bench", "udp-bulk", "--modes", "udp", "--gso-size", "8"], "bulk header"),
        (&["bench", "udp-bulk", "--modes", "paced", "--quantum", "0ms"], "must be positive"),
        (&["bench", "udp-pacing", "--path", "loopback"], "needs a bottleneck"),
        (&["bench", "udp-pacing", "--quanta", "1ms,sometime"], "\"sometime\""),
    ];
    for (args, want) in cases {
        let o = netlane(args);
        assert!(!o.status.success(), "{args:?} should fail");
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn loopback_benchmark_runs_without_root_and_writes_json_and_csv() {
    let dir = temp_dir("loopback");
    std::fs::create_dir_all(&dir).unwrap();
    let (json, csv) = (dir.join("r.json"), dir.join("r.csv"));
    let o = netlane(&[
        "bench",
        "udp-bulk",
        "--path",
        "loopback",
        "--modes",
        "tcp,udp,sendmmsg,gso,gso-gro,paced",
        "--rates",
        "20MB/s",
        "--duration",
        "300ms",
        "--no-selftest",
        "--verify",
        "full",
        "--json",
        json.to_str().unwrap(),
        "--csv",
        csv.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    // neper-style echo of every resolved option, then the table.
    for key in ["path=loopback", "gso_size=1400", "segments=46", "quantum=auto", "sender=process", "verify=full"] {
        assert!(out.contains(key), "missing {key} in:\n{out}");
    }
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let runs = report["raw"]["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 6);
    for r in runs {
        let res = &r["result"];
        assert!(res["tx"]["bytes"].as_u64().unwrap() > 0, "{}", r["label"]);
        assert_eq!(res["rx"]["integrity"]["corrupt"].as_u64(), Some(0), "{}", r["label"]);
    }
    let csv = std::fs::read_to_string(&csv).unwrap();
    assert!(csv.starts_with("mode,tx MB/s") && csv.lines().count() == 7, "{csv}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn probe_reports_every_feature_as_json() {
    let o = netlane(&["probe", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let names: Vec<&str> = v["features"].as_array().unwrap().iter().map(|f| f["name"].as_str().unwrap()).collect();
    for want in ["udp-gso", "udp-gro", "msg-zerocopy", "so-txtime", "busy-poll"] {
        assert!(names.contains(&want), "{names:?}");
    }
    for f in v["features"].as_array().unwrap() {
        let status = f["support"]["status"].as_str().unwrap();
        assert!(["supported", "unsupported", "unknown"].contains(&status));
        assert!(!f["support"]["detail"].as_str().unwrap().is_empty());
    }
}

#[test]
fn lab_writes_a_complete_report() {
    if !privileged("lab_writes_a_complete_report") {
        return;
    }
    let dir = temp_dir("lab");
    let o = netlane(&["lab", "--quick", "--only", "udp-pacing", "--out", dir.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("report:") && out.contains("index.html"), "{out}");
    let html = std::fs::read_to_string(dir.join("index.html")).unwrap();
    assert!(html.contains("<svg") && html.contains("udp-pacing") && html.contains("<table"), "html incomplete");
    for f in
        ["udp-pacing.csv", "udp-pacing.json", "results.json", "charts/udp-pacing-loss.svg", "charts/udp-pacing-cpu.svg"]
    {
        assert!(dir.join(f).is_file(), "missing {f}");
    }
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    let rows = results["scenarios"][0]["tables"][0]["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 5, "five sweep points");
    // Nothing left behind.
    let leftover: Vec<_> = std::fs::read_dir("/run/netns")
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    let pid_prefix = "nl-";
    assert!(
        leftover.iter().all(|n: &String| !n.starts_with(pid_prefix) || !n.contains("udp-pacing")),
        "namespaces left: {leftover:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn topo_clean_removes_only_stale_namespaces() {
    if !privileged("topo_clean_removes_only_stale_namespaces") {
        return;
    }
    // A namespace named like one of a netlane process that no longer exists.
    let stale = "nl-999999999-0-stale-test";
    let st = Command::new("ip").args(["netns", "add", stale]).status().unwrap();
    assert!(st.success());
    let o = netlane(&["topo", "clean"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains(stale));
    assert!(!std::path::Path::new("/run/netns").join(stale).exists());
}

#[test]
fn without_root_the_veth_path_says_what_to_do() {
    // As root, drop to nobody to see what an unprivileged user sees.
    let out = if nix_is_root() {
        Command::new("runuser")
            .args(["-u", "nobody", "--", env!("CARGO_BIN_EXE_netlane"), "bench", "udp-bulk", "--modes", "udp"])
            .output()
            .expect("runuser")
    } else {
        netlane(&["bench", "udp-bulk", "--modes", "udp"])
    };
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(e.contains("needs root") && e.contains("--path loopback"), "{e}");
}

#[test]
fn ctrl_c_removes_the_namespaces_and_the_sender() {
    if !privileged("ctrl_c_removes_the_namespaces_and_the_sender") {
        return;
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_netlane"))
        .args(["bench", "udp-bulk", "--modes", "gso", "--duration", "20s", "--no-selftest"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let prefix = format!("nl-{pid}-");
    let ours = || -> Vec<String> {
        std::fs::read_dir("/run/netns")
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect::<Vec<String>>())
            .unwrap_or_default()
            .into_iter()
            .filter(|n: &String| n.starts_with(&prefix))
            .collect()
    };
    // Wait until the run is under way: its namespaces exist and its sender process runs.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let sender_running = || {
        std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
            std::fs::read(e.path().join("cmdline")).is_ok_and(|c| {
                let c = String::from_utf8_lossy(&c);
                c.contains("__bulk-tx")
                    && std::fs::read_to_string(e.path().join("stat"))
                        .is_ok_and(|st| st.split_whitespace().nth(3) == Some(&pid.to_string()))
            })
        })
    };
    while !(ours().len() == 2 && sender_running()) {
        assert!(std::time::Instant::now() < deadline, "the run never started");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let st = Command::new("kill").args(["-INT", &pid.to_string()]).status().unwrap();
    assert!(st.success());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "exit status after Ctrl-C");
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(err.contains("removed 2 network namespaces"), "{err}");
    assert!(ours().is_empty(), "left behind: {:?}", ours());
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(!sender_running(), "the sender process outlived the benchmark");
}

/// A `netlane nvme target` process on loopback; killed (by the PID we started) on drop.
struct Target {
    child: std::process::Child,
    addr: String,
}

impl Target {
    fn start(extra: &[&str]) -> Target {
        use std::io::BufRead;
        let mut child = Command::new(env!("CARGO_BIN_EXE_netlane"))
            .args(["nvme", "target", "--listen", "127.0.0.1:0", "--cpus", "0", "--ns", "mem:32M", "--time", "60s"])
            .args(extra)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start the target");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let addr = line.strip_prefix("listening on ").and_then(|r| r.split_whitespace().next()).unwrap_or_default();
        assert!(!addr.is_empty(), "unexpected target output {line:?}");
        Target { addr: addr.to_string(), child }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn nvme_target_and_perf_processes_move_verified_data() {
    let t = Target::start(&[]);
    let dir = temp_dir("nvme-perf");
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("perf.json");
    let o = netlane(&[
        "nvme",
        "perf",
        "--target",
        &t.addr,
        "--time",
        "1s",
        "--ramp",
        "100ms",
        "--rw",
        "randrw",
        "--bs",
        "8k",
        "--qd",
        "4",
        "--jobs",
        "2",
        "--verify",
        "--size",
        "8M",
        "--hdgst",
        "--ddgst",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("verify: 0 mismatched reads") && out.contains("direct_send=false"), "{out}");
    let rep: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let g = &rep["raw"]["groups"][0];
    assert!(g["reads"].as_u64().unwrap() > 0 && g["writes"].as_u64().unwrap() > 0, "{g}");
    assert_eq!(g["mismatches"].as_u64(), Some(0));
    assert!(rep["raw"]["read_lat_ns"].is_null() && g["read_lat_ns"]["p9999"].as_u64().unwrap() > 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn nvme_bad_options_are_explained() {
    let t = Target::start(&["--mdts", "8"]);
    let perf = |extra: &[&str]| {
        let mut args = vec!["nvme", "perf", "--target", &t.addr, "--time", "1s"];
        args.extend_from_slice(extra);
        let o = netlane(&args);
        assert!(!o.status.success(), "{extra:?} should fail");
        stderr(&o)
    };
    assert!(perf(&["--bs", "3000"]).contains("not a multiple of the 4096-byte block"));
    let e = perf(&["--bs", "2M", "--rw", "write"]);
    assert!(e.contains("maximum transfer (MDTS) of 1048576"), "{e}");
    assert!(perf(&["--group", "name=a,speed=9"]).contains("unknown job key"));
    assert!(perf(&["--hipri"]).contains("hipri needs --poll-queues"));
    assert!(perf(&["--nsid", "7"]).contains("namespace 7 not found"));
    assert!(perf(&["--nqn", "nqn.wrong"]).contains("invalid data at byte 256"));
    let o = netlane(&["nvme", "perf", "--target", "127.0.0.1:1", "--time", "1s"]);
    assert!(stderr(&o).contains("connect to 127.0.0.1:1"), "{}", stderr(&o));
    let o = netlane(&["nvme", "target", "--ns", "disk:1G", "--time", "1s"]);
    assert!(stderr(&o).contains("expected mem:SIZE"), "{}", stderr(&o));
    let o = netlane(&["nvme", "target", "--cpus", "99", "--time", "1s"]);
    assert!(stderr(&o).contains("does not exist"), "{}", stderr(&o));
}

#[test]
fn lab_runs_the_nvme_scenario() {
    if !privileged("lab_runs_the_nvme_scenario") {
        return;
    }
    let dir = temp_dir("lab-nvme");
    let o = netlane(&["lab", "--quick", "--only", "nvme", "--out", dir.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    for f in ["nvme.json", "charts/nvme-qd1.svg", "charts/nvme-qd32.svg", "charts/nvme-mixed.svg", "index.html"] {
        assert!(dir.join(f).is_file(), "missing {f}");
    }
    let rep: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("nvme.json")).unwrap()).unwrap();
    assert_eq!(rep["checks"].as_array().unwrap().len(), 6);
    assert!(rep["raw"]["mixed separate maps"]["groups"][0]["ops"].as_u64().unwrap() > 0);
    let _ = std::fs::remove_dir_all(&dir);
}

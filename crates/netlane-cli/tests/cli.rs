//! The `netlane` command as a user runs it: options, outputs, exit codes, signals.
//! Every JSON document a command writes is validated against the schema in
//! `docs/schema/`.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{Reaped, netlane, prometheus_samples_once, start_listening, stderr, stdout, temp_dir, valid_document};

fn privileged(test: &str) -> bool {
    netlane_testkit::privileged(test)
}

#[test]
fn version_names_the_commit_and_help_the_exit_codes() {
    let o = netlane(&["--version"]);
    assert!(o.status.success());
    assert!(stdout(&o).contains("(commit "), "{}", stdout(&o));
    let o = netlane(&["--help"]);
    assert!(stdout(&o).contains("Exit codes: 0 ok, 1 error, 2 usage, 3 targets"), "{}", stdout(&o));
}

#[test]
fn usage_errors_exit_2_and_bad_values_are_explained() {
    let cases: &[(&[&str], &str)] = &[
        (&["bench", "udp-bulk", "--time", "0s"], "must be positive"),
        (&["bench", "udp-bulk", "--modes", "paced", "--quantum", "0ms"], "must be positive"),
        (&["bench", "udp-bulk", "--modes", "gso,warp"], "gso-gro"),
        (&["bench", "udp-bulk", "--rates", "fast"], "expected a number"),
        (&["bench", "udp-bulk", "--rates", "-5MB/s"], "negative"),
        (&["bench", "udp-bulk", "--time", "soon"], "unit"),
        (&["bench", "udp-pacing", "--bottleneck", "0mbit"], "must be positive"),
        (&["bench", "udp-pacing", "--quanta", "1ms,sometime"], "\"sometime\""),
        (&["nvme", "target", "--cpus", "99"], "does not exist"),
        (&["nvme", "perf", "--cpus", "1-0"], "backwards"),
        (
            &["lb", "run", "--config", "x", "--iface", "y", "--hints", "fast"],
            "use one of off, rx-hash, flow-tag, dest-tag, dest-tag-direct",
        ),
        (&["lab", "--only", "nothing"], "udp-bulk"),
        (&["lab", "--set", "nothing.time=1s"], "no scenario \"nothing\" (there are udp-bulk, udp-pacing"),
        (&["lab", "--set", "udp-bulk.time"], "expected OPTION=VALUE after udp-bulk."),
        (&["compare", "a", "b", "--tolerance=2000%"], "must be 0% to 1000%"),
        (&["app", "run", "--name", "a", "--mark", "0", "--", "true"], "mark 0"),
        (&["app", "run", "--name", "a", "--mark", "1", "--priority", "16", "--", "true"], "16"),
        (&["app", "run", "--name", "a", "--mark", "1"], "PROGRAM"),
        (&["app", "shape", "--dev", "lo", "--link", "1gbit", "--app", "x:1:2mbit"], "NAME:MARK:MIN:MAX"),
        (&["app", "shape", "--dev", "lo", "--link", "fast", "--app", "x:1:1mbit:2mbit"], "expected a number"),
    ];
    for (args, want) in cases {
        let o = netlane(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn bad_options_fail_before_anything_runs() {
    let cases: &[(&[&str], &str)] = &[
        (&["bench", "udp-bulk", "--gso-size", "9000", "--mtu", "1500", "--modes", "gso"], "1472"),
        (&["bench", "udp-bulk", "--gso-size", "1460", "--ipv6", "--modes", "gso"], "1452"),
        (&["bench", "udp-bulk", "--modes", "gso", "--segments", "64"], "at most 46"),
        (&["bench", "udp-bulk", "--tx-cpu", "4096"], "this machine has CPUs"),
        (&["bench", "udp-bulk", "--modes", "udp", "--gso-size", "8"], "bulk header"),
        (&["bench", "udp-bulk", "--modes", "udp,udp"], "listed twice"),
        // A quantum at or above the run's length: refused, not measured as 312 MB/s.
        (
            &[
                "bench",
                "udp-bulk",
                "--path",
                "loopback",
                "--modes",
                "paced",
                "--rates",
                "10MB/s",
                "--quantum",
                "2s",
                "-t",
                "2s",
            ],
            "fewer than 10 bursts",
        ),
        (&["bench", "udp-pacing", "--path", "loopback"], "needs a bottleneck"),
        (&["bench", "lb-pps", "--flows", "0"], "flow counts"),
        (&["bench", "lb-pps", "--modes", "off,off"], "listed twice"),
        (&["bench", "nvme", "--ns-size", "1M"], "at least 64M"),
        // An option set for the lab is checked as `bench` checks it, and only for a
        // scenario the lab runs.
        (
            &["lab", "--only", "udp-bulk", "--set", "udp-bulk.segments=lots"],
            "udp-bulk.segments=lots: invalid value 'lots'",
        ),
        (&["lab", "--only", "udp-bulk", "--set", "udp-bulk.segments=64"], "at most 46"),
        (&["lab", "--only", "udp-bulk", "--set", "kv.rates=10k"], "kv.rates=10k: this lab does not run kv"),
    ];
    for (args, want) in cases {
        let start = Instant::now();
        let o = netlane(args);
        assert_eq!(o.status.code(), Some(1), "{args:?} should fail: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
        assert!(start.elapsed() < Duration::from_secs(5), "{args:?} ran before failing");
    }
}

#[test]
fn output_paths_are_checked_before_the_run() {
    let start = Instant::now();
    let o = netlane(&["bench", "udp-bulk", "--path", "loopback", "--json", "/nonexistent/x.json", "-t", "10s"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("/nonexistent") && stderr(&o).contains("does not exist"), "{}", stderr(&o));
    assert!(start.elapsed() < Duration::from_secs(5), "it ran before checking the path");
}

#[test]
fn errors_are_said_once() {
    let o = netlane(&["nvme", "perf", "--target", "127.0.0.1:1", "-t", "1s"]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(e.contains("127.0.0.1:1"), "{e}");
    assert_eq!(e.matches("Connection refused").count(), 1, "doubled: {e}");
    assert!(!e.contains('\u{1b}'), "no colour when stderr is not a terminal: {e:?}");
}

#[test]
fn a_closed_pipe_ends_quietly() {
    // `netlane completions bash | head -1`: the reader goes away after one line.
    let mut child = Command::new(env!("CARGO_BIN_EXE_netlane"))
        .args(["completions", "bash"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    // The pipe's read end is dropped here.
    let status = child.wait().unwrap();
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{err}");
    assert!(matches!(status.code(), Some(0) | Some(141)), "{status:?}: {err}");
}

#[test]
fn completions_and_man_pages() {
    let o = netlane(&["completions", "bash"]);
    assert!(o.status.success() && stdout(&o).contains("netlane"));
    let dir = temp_dir("man");
    let o = netlane(&["man", dir.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    for page in ["netlane.1", "netlane-bench-udp-bulk.1", "netlane-nvme-perf.1", "netlane-lb-run.1"] {
        let t = std::fs::read_to_string(dir.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(t.contains(".TH"), "{page}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn bench_args(extra: &[&'static str]) -> Vec<&'static str> {
    let mut a = vec![
        "bench",
        "udp-bulk",
        "--path",
        "loopback",
        "--modes",
        "tcp,udp,sendmmsg,gso,gso-gro,paced",
        "--rates",
        "20MB/s",
        "-t",
        "300ms",
        "--repeat",
        "1",
        "--no-selftest",
        "--verify",
        "full",
    ];
    a.extend_from_slice(extra);
    a
}

#[test]
fn loopback_bench_runs_without_root_and_writes_json_and_csv() {
    let dir = temp_dir("loopback");
    std::fs::create_dir_all(&dir).unwrap();
    let (json, csv) = (dir.join("r.json"), dir.join("csv"));
    let mut args = bench_args(&[]);
    let (j, c) = (json.to_str().unwrap().to_string(), csv.to_str().unwrap().to_string());
    args.extend(["--json", j.as_str(), "--csv", c.as_str()]);
    let o = netlane(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    // neper-style echo of every resolved option, in the command line's own syntax.
    for key in ["path=loopback", "gso-size=1400", "segments=46", "quantum=auto", "ends=process", "verify=full"] {
        assert!(out.contains(&format!("\n{key}\n")), "missing {key} in:\n{out}");
    }
    assert!(out.contains("Verdict:"), "{out}");
    let doc = valid_document(&std::fs::read_to_string(&json).unwrap(), "results");
    assert_eq!(doc["kind"], "bench");
    let s = &doc["scenarios"][0];
    assert_eq!(s["options"]["time_s"], 0.3);
    assert_eq!(s["options"]["rates_bytes_per_s"][0], 20_000_000);
    let runs = s["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 6);
    for r in runs {
        assert!(r["metrics"]["tx_mb_per_s"].as_f64().unwrap() > 0.0, "{}", r["label"]);
        assert_eq!(r["detail"]["rx"]["integrity"]["corrupt"].as_u64(), Some(0), "{}", r["label"]);
    }
    // Table cells are plain numbers, not one-element arrays.
    let row = &s["tables"][0]["rows"][0];
    assert!(row["tx_mb_per_s"].is_number(), "{row}");
    let table = std::fs::read_to_string(csv.join("udp-bulk.csv")).unwrap();
    assert!(table.starts_with("run_id,mode,case,tx_mb_per_s,"), "{table}");
    assert_eq!(table.lines().count(), 7, "{table}");
    for f in ["runs.csv", "checks.csv", "udp-bulk-pacing.csv"] {
        assert!(csv.join(f).is_file(), "missing {f}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn json_to_stdout_is_the_only_stdout_and_the_echo_reads_back() {
    let o = netlane(&bench_args(&["--json", "-"]));
    assert!(o.status.success(), "{}", stderr(&o));
    let doc = valid_document(&stdout(&o), "results");
    let s = &doc["scenarios"][0];
    // Every echoed option, as `--key=value`, is accepted by the command line and
    // resolves to the same options.
    let echo: Vec<String> =
        s["echo"].as_array().unwrap().iter().map(|e| format!("--{}", e.as_str().unwrap())).collect();
    let mut args: Vec<&str> = vec!["bench", "udp-bulk"];
    args.extend(echo.iter().map(String::as_str));
    args.extend(["--json", "-"]);
    let again = netlane(&args);
    assert!(again.status.success(), "{args:?}: {}", stderr(&again));
    let doc2 = valid_document(&stdout(&again), "results");
    assert_eq!(doc2["scenarios"][0]["options"], s["options"]);
}

#[test]
fn strict_exits_3_when_a_target_is_not_met() {
    // Without the tcp mode, the GSO-vs-TCP target is skipped: a failure under --strict.
    let o = netlane(&[
        "bench",
        "udp-bulk",
        "--path",
        "loopback",
        "--modes",
        "udp,gso",
        "-t",
        "200ms",
        "--repeat",
        "1",
        "--no-selftest",
        "--strict",
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stdout(&o).contains("SKIPPED"), "{}", stdout(&o));
}

#[test]
fn probe_json_validates() {
    let o = netlane(&["probe", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let doc = valid_document(&stdout(&o), "probe");
    let names: Vec<&str> = doc["features"].as_array().unwrap().iter().map(|f| f["name"].as_str().unwrap()).collect();
    for want in [
        "udp-gso",
        "udp-gro",
        "msg-zerocopy",
        "so-txtime",
        "busy-poll",
        "af-xdp",
        "tpacket-v3",
        "btf",
        "netdev-napi",
        "memlock",
        "xdp-native",
        "xdp-generic",
        "xdp-rx-hash-kfunc",
        "tcx",
    ] {
        assert!(names.contains(&want), "{names:?}");
    }
    // What this kernel has (kernel-probe.md): AF_XDP, BTF, napi-get; the memlock limit
    // said in KiB.
    let support =
        |n: &str| doc["features"].as_array().unwrap().iter().find(|f| f["name"] == n).unwrap()["support"].clone();
    for n in ["btf", "netdev-napi"] {
        assert_eq!(support(n)["status"], "supported", "{n}: {}", support(n));
    }
    // And, as root, TPACKET_V3, XDP both ways, the RX-hash kfunc and TCX (each tried).
    if netlane_testkit::privileged("probe_json_validates") {
        for n in ["tpacket-v3", "xdp-native", "xdp-generic", "xdp-rx-hash-kfunc", "tcx"] {
            assert_eq!(support(n)["status"], "supported", "{n}: {}", support(n));
        }
    }
    assert!(support("memlock")["detail"].as_str().unwrap().starts_with("soft "), "{}", support("memlock"));
    // Without CAP_NET_RAW (as nobody, when this runs as root), AF_XDP says which
    // capability it needs.
    let unprivileged = if nix::unistd::geteuid().is_root() {
        let o = std::process::Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                env!("CARGO_BIN_EXE_netlane"),
                "probe",
                "--json",
            ])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        valid_document(&stdout(&o), "probe")
    } else {
        doc.clone()
    };
    let detail = |n: &str| {
        let f = unprivileged["features"].as_array().unwrap().iter().find(|f| f["name"] == n).unwrap();
        f["support"]["detail"].as_str().unwrap().to_string()
    };
    for (n, cap) in [("af-xdp", "CAP_NET_RAW"), ("tpacket-v3", "CAP_NET_RAW")] {
        assert!(detail(n).contains(cap) && detail(n).contains("setcap"), "{n}: {}", detail(n));
    }
    // The BPF paths are tried in a scratch namespace, which takes root whatever the
    // capabilities.
    for n in ["xdp-native", "tcx"] {
        assert!(detail(n).contains("run the probe as root"), "{n}: {}", detail(n));
    }
}

#[test]
fn lb_check_json_validates() {
    let dir = temp_dir("lbcheck");
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("lb.toml");
    std::fs::write(
        &cfg,
        "ring_size = 65537\n[[vip]]\naddress = \"10.100.0.1\"\nport = 80\nproto = \"tcp\"\n[[vip.real]]\naddress = \
         \"10.1.0.11\"\nweight = 2\n[[vip.real]]\naddress = \"fd00::12\"\nweight = 1\n",
    )
    .unwrap();
    let o = netlane(&["lb", "check", cfg.to_str().unwrap(), "--json", "-"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let doc = valid_document(&stdout(&o), "lb-check");
    let reals = doc["vips"][0]["reals"].as_array().unwrap();
    let share = |i: usize| reals[i]["share_pct"].as_f64().unwrap();
    assert!((share(0) / share(1) - 2.0).abs() < 0.05, "weights 2:1 -> {} / {}", share(0), share(1));
    let o = netlane(&["lb", "check", cfg.to_str().unwrap()]);
    assert!(stdout(&o).contains("10.1.0.11") && stdout(&o).contains("valid"), "{}", stdout(&o));

    // Bounds a configuration cannot pass, and options that cannot be right: clear
    // errors before anything is built (no root needed to see them).
    let vip = "[[vip]]\naddress = \"10.100.0.1\"\nport = 80\nproto = \"tcp\"\n[[vip.real]]\naddress = \"10.1.0.11\"\n";
    for (text, want) in [
        (format!("ring_size = 4294967291\n{vip}"), "largest ring"),
        (format!("conn_entries = 4294967295\n{vip}"), "conn_entries"),
    ] {
        std::fs::write(&cfg, text).unwrap();
        let o = netlane(&["lb", "check", cfg.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        assert!(stderr(&o).contains(want), "{want}: {}", stderr(&o));
    }
    std::fs::write(&cfg, vip).unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["lb", "run", "--config", cfg.to_str().unwrap(), "--iface", "no-such-if0"];
        args.extend_from_slice(extra);
        netlane(&args)
    };
    for (extra, want) in [
        (&["--gateway-mac", "ff:ff:ff:ff:ff:ff"][..], "unicast station"),
        (&["--gateway-mac", "00:00:00:00:00:00"][..], "unicast station"),
        (&["--gateway-mac", "02:00:00:00:00:01", "--src4", "0.0.0.0"][..], "outer IPv4 source"),
        (&["--gateway-mac", "02:00:00:00:00:01", "--src6", "::1"][..], "outer IPv6 source"),
        (&["--gateway-mac", "02:00:00:00:00:01", "--max-vips", "0"][..], "--max-vips"),
        (&["--gateway-mac", "02:00:00:00:00:01", "--max-vips", "10000"][..], "ring slots (2500 MiB)"),
    ] {
        let o = run(extra);
        assert_eq!(o.status.code(), Some(1), "{extra:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{extra:?}: {}", stderr(&o));
    }
    let o = run(&["--gateway-mac", "02:00:00:00:00:01", "--stats-interval", "1000000years"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("at most a day") || stderr(&o).contains("too long"), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A child process that is killed and reaped when dropped unless it already exited, so
/// a failing assertion never leaves a server running.
/// A `netlane nvme target` process on loopback; killed (by the PID we started) on drop.
struct Target {
    child: std::process::Child,
    addr: String,
}

impl Target {
    fn start(extra: &[&str]) -> Target {
        let mut child = Command::new(env!("CARGO_BIN_EXE_netlane"))
            .args(["nvme", "target", "--listen", "127.0.0.1:0", "--cpus", "0", "--ns", "mem:32M", "-t", "60s"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the target");
        let mut line = String::new();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        out.read_line(&mut line).unwrap();
        let addr = line.strip_prefix("listening on ").and_then(|r| r.split_whitespace().next()).unwrap_or_default();
        assert!(!addr.is_empty(), "unexpected target output {line:?}");
        // Keep its stdout drained (and kept) until the end.
        let addr = addr.to_string();
        std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = out.read_to_string(&mut rest);
        });
        Target { addr, child }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn nvme_perf_moves_verified_data_and_its_json_validates() {
    let t = Target::start(&[]);
    let o = netlane(&[
        "nvme",
        "perf",
        "--target",
        &t.addr,
        "--runtime",
        "1s",
        "--ramp_time",
        "100ms",
        "--rw",
        "randrw",
        "--bs",
        "8k",
        "--iodepth",
        "4",
        "--numjobs",
        "2",
        "--verify",
        "--size",
        "8M",
        "--hdgst",
        "--ddgst",
        "--json",
        "-",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let doc = valid_document(&stdout(&o), "nvme-perf");
    let g = &doc["report"]["groups"][0];
    assert!(g["reads"].as_u64().unwrap() > 0 && g["writes"].as_u64().unwrap() > 0, "{g}");
    assert_eq!(g["mismatches"].as_u64(), Some(0));
    assert!(g["read_lat_ns"]["p9999"].as_u64().unwrap() > 0);
    assert_eq!(doc["options"]["time_s"], 1.0);
    assert!(
        doc["echo"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e == "group=name=job,rw=randrw,rwmixread=50,bs=8K,qd=4,jobs=2,cpus=any")
    );
    // The human form.
    let o = netlane(&["nvme", "perf", "--target", &t.addr, "-t", "300ms", "--ramp", "0s", "--verify", "--size", "4M"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("verify: 0 mismatched reads") && stdout(&o).contains("direct-send=false"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn nvme_perf_verify_only_reads_back_a_file_namespace_across_a_kill_and_stops_when_the_target_dies() {
    let dir = temp_dir("verify-only");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("ns.img");
    let ns = format!("file:{}:8M", file.display());
    let perf = |t: &Target, extra: &[&str]| {
        let mut args = vec!["nvme", "perf", "--target", &t.addr, "--nsid", "2", "--size", "4M", "--jobs", "2"];
        args.extend_from_slice(extra);
        netlane(&args)
    };
    let t = Target::start(&["--ns", &ns]);
    let o = perf(&t, &["--verify", "--rw", "randrw", "-t", "500ms", "--ramp", "0s"]);
    assert!(o.status.success(), "{}", stderr(&o));
    drop(t); // SIGKILL

    let t = Target::start(&["--ns", &ns]);
    let started = Instant::now();
    let o = perf(&t, &["--verify-only", "-t", "30s", "--ramp", "0s", "--bs", "16k"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("verify: 0 mismatched reads of 256"), "{}", stdout(&o));
    let took = started.elapsed();
    assert!(took < Duration::from_secs(15), "a sweep of 4 MiB ends when it is done: {took:?}");
    // Its rate is over the time it took, not the 30 s it was given.
    let iops: f64 = stdout(&o)
        .split_whitespace()
        .skip_while(|w| *w != "total")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no total in {}", stdout(&o)));
    assert!(iops >= 256.0 / took.as_secs_f64(), "{iops} IOPS for 256 reads in {took:?}");
    drop(t);

    // One block changed behind the target's back is found.
    let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[0xff; 512], 3 << 20).unwrap();
    let t = Target::start(&["--ns", &ns]);
    let o = perf(&t, &["--verify-only", "-t", "30s", "--ramp", "0s", "--bs", "16k"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stdout(&o).contains("verify: 1 mismatched reads of 256"), "{}", stdout(&o));

    // The target dies mid-run: perf says so and stops, without waiting out -t.
    let mut t = t;
    let (addr, pid) = (t.addr.clone(), t.child.id());
    let run = std::thread::spawn(move || {
        let started = Instant::now();
        let o = netlane(&["nvme", "perf", "--target", &addr, "-t", "60s", "--ramp", "0s", "--qd", "4"]);
        (o, started.elapsed())
    });
    std::thread::sleep(Duration::from_millis(1500));
    assert!(Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap().success());
    let _ = t.child.wait();
    let (o, took) = run.join().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("queue"), "{}", stderr(&o));
    assert!(took < Duration::from_secs(20), "perf ran on for {took:?} with no target");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn nvme_bad_options_are_explained() {
    let t = Target::start(&["--mdts", "8"]);
    let perf = |extra: &[&str]| {
        let mut args = vec!["nvme", "perf", "--target", &t.addr, "-t", "1s"];
        args.extend_from_slice(extra);
        let o = netlane(&args);
        assert!(!o.status.success(), "{extra:?} should fail");
        stderr(&o)
    };
    assert!(perf(&["--bs", "3000"]).contains("not a multiple of the 4096-byte block"));
    let e = perf(&["--bs", "2M", "--rw", "write"]);
    assert!(e.contains("maximum transfer (MDTS) of 1048576"), "{e}");
    assert!(perf(&["--group", "name=a,speed=9"]).contains("unknown job key"));
    assert!(
        perf(&["--group", "name=a,cpus=0-1,7000"]).contains("above 8191")
            || perf(&["--group", "name=a,cpus=7000"]).contains("does not exist")
    );
    assert!(perf(&["--hipri"]).contains("hipri needs --poll-queues"));
    assert!(perf(&["--nsid", "7"]).contains("namespace 7 not found"));
    assert!(perf(&["--nqn", "nqn.wrong"]).contains("invalid data at byte 256"));
    let o = netlane(&["nvme", "target", "--ns", "disk:1G", "-t", "1s"]);
    assert!(stderr(&o).contains("expected mem:SIZE"), "{}", stderr(&o));
}

/// What the machine can give now, as the servers see it: GiB, and what sets it
/// (MemAvailable, or a memory cgroup's limit).
fn available() -> (u64, String) {
    let a = netlane::memory::available().expect("what memory this machine has");
    (a.bytes >> 30, a.limit.to_string())
}

#[test]
fn servers_refuse_memory_the_machine_does_not_have_and_take_only_what_is_used() {
    let (gib, limit) = available();
    let twice = (2 * gib).max(2);
    let refused = |args: &[&str], part: &str| {
        let started = Instant::now();
        let o = netlane(args);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {e}");
        assert!(started.elapsed() < Duration::from_secs(5), "{args:?} took {:?}", started.elapsed());
        assert!(
            e.contains("of memory asked for (") && e.contains(part) && e.contains(&format!("available ({limit})")),
            "{e}"
        );
        assert_eq!(e.trim_end().lines().count(), 1, "one line: {e}");
    };
    let ns = format!("mem:{twice}G");
    refused(&["nvme", "target", "--listen", "127.0.0.1:0", "--ns", &ns, "-t", "60s"], "namespace 1: ");
    let megabytes = (twice << 10).to_string();
    refused(&["kv", "serve", "-p", "-1", "-m", &megabytes, "--time", "60s"], "the cache: ");

    // A namespace that fits is taken as it is written, not up front.
    let half = format!("mem:{}G", (gib / 2).max(1));
    let started = Instant::now();
    // (Few connections, so their queue budgets do not count against it.)
    let t = Target::start(&["--ns", &half, "--max-connections", "16"]);
    assert!(started.elapsed() < Duration::from_secs(5), "listening after {:?}", started.elapsed());
    let status = std::fs::read_to_string(format!("/proc/{}/status", t.child.id())).unwrap();
    let rss_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(rss_kib < 512 << 10, "a {half} namespace took {rss_kib} KiB up front");
}

/// A full disk fails every write of every queue: the target answers each with an
/// error, counts them, and logs a summary a second, not a line per command.
#[test]
fn a_full_disk_is_counted_and_logged_once_a_second() {
    let mut child = Reaped(
        Command::new(env!("CARGO_BIN_EXE_netlane"))
            .args(["nvme", "target", "--listen", "127.0.0.1:0", "--ns", "file:/dev/full:8M", "-t", "60s"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let addr = line.strip_prefix("listening on ").and_then(|r| r.split_whitespace().next()).unwrap().to_string();
    // Every write fails: the run stops after a second of nothing but errors, not at -t.
    let started = Instant::now();
    let o =
        netlane(&["nvme", "perf", "--target", &addr, "-t", "60s", "--ramp", "0s", "--rw", "randwrite", "--qd", "8"]);
    assert_eq!(o.status.code(), Some(1), "every write failed: {}", stderr(&o));
    assert!(
        stderr(&o).contains("the run stopped: the target answered every command with an error for a second"),
        "{}",
        stderr(&o)
    );
    assert!(started.elapsed() < Duration::from_secs(15), "{:?}", started.elapsed());
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    assert_eq!(child.wait().unwrap().code(), Some(0));
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let failures: u64 = rest
        .split_whitespace()
        .find_map(|w| w.strip_prefix("storage_failures="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no storage_failures in {rest:?}"));
    let mut log = String::new();
    child.stderr.take().unwrap().read_to_string(&mut log).unwrap();
    let lines = log.lines().filter(|l| l.contains("No space left on device")).count();
    assert!(failures > 1000, "{failures} failures counted");
    assert!((1..=5).contains(&lines), "{lines} log lines for {failures} failures:\n{log}");
}

#[test]
fn the_target_stops_gracefully_on_sigterm_with_final_counters() {
    let mut child = Reaped(
        Command::new(env!("CARGO_BIN_EXE_netlane"))
            .args(["nvme", "target", "--listen", "127.0.0.1:0", "--cpus", "0", "--ns", "mem:16M", "--json", "-"])
            .args(["--metrics-addr", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    err.read_line(&mut line).unwrap();
    assert!(line.starts_with("listening on "), "with --json -, the address goes to stderr: {line:?}");
    let addr = line.strip_prefix("listening on ").and_then(|r| r.split_whitespace().next()).unwrap().to_string();
    // The endpoint is on the same line, as every server says it.
    let metrics = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("metrics=http://"))
        .and_then(|r| r.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("no metrics address: {line:?}"))
        .to_string();
    let o = netlane(&["nvme", "perf", "--target", &addr, "-t", "300ms", "--ramp", "0s", "--rw", "randrw"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // The exposition, read by the Prometheus client library's own parser. The target
    // may see perf's disconnects just after perf exits: scrape until it has.
    let scraped = prometheus_samples_once(&metrics, "netlane_nvme_target_open_connections", 0.0);
    let get = |name: &str, labels: &str| {
        scraped.iter().find(|(n, l, _)| n == name && l == labels).map(|s| s.2).unwrap_or_else(|| {
            panic!("no sample {name}{{{labels}}} in {scraped:?}");
        })
    };
    let commands = get("netlane_nvme_target_commands_total", "queue=all");
    let reads = get("netlane_nvme_target_reads_total", "queue=all");
    assert!(reads > 0.0 && get("netlane_nvme_target_writes_total", "queue=all") > 0.0);
    // Every command completed except the Asynchronous Event Request the target holds.
    assert_eq!(get("netlane_nvme_target_command_latency_seconds_count", "queue=all"), commands - 1.0);
    assert_eq!(get("netlane_nvme_target_connections_total", "outcome=accepted"), 3.0, "admin + 2 I/O queues");
    assert_eq!(get("netlane_nvme_target_open_connections", ""), 0.0, "perf disconnected");
    let st = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(st.success());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "a server stopped by SIGTERM exits 0");
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    let doc = valid_document(&out, "nvme-target");
    assert_eq!(doc["stats"]["commands"].as_u64(), Some(commands as u64), "final counters as last scraped: {out}");
    assert_eq!(doc["stats"]["subsystem"]["read_cmds"].as_u64(), Some(reads as u64), "{out}");
}

#[test]
fn without_root_the_veth_path_says_what_to_do() {
    // As root, drop to nobody to see what an unprivileged user sees.
    let out = if nix::unistd::geteuid().is_root() {
        Command::new("runuser")
            .args(["-u", "nobody", "--", env!("CARGO_BIN_EXE_netlane"), "bench", "udp-bulk", "--modes", "udp"])
            .output()
            .expect("runuser")
    } else {
        netlane(&["bench", "udp-bulk", "--modes", "udp"])
    };
    assert_eq!(out.status.code(), Some(1));
    let e = stderr(&out);
    assert!(e.contains("needs root") && e.contains("--path loopback"), "{e}");
}

#[test]
fn ctrl_c_removes_the_namespaces_and_the_sender() {
    if !privileged("ctrl_c_removes_the_namespaces_and_the_sender") {
        return;
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_netlane"))
        .args(["bench", "udp-bulk", "--modes", "gso", "-t", "20s", "--no-selftest"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let prefix = format!("nl-{pid}-");
    let ours = || -> Vec<String> {
        netlane::topology::netns_names().into_iter().filter(|n: &String| n.starts_with(&prefix)).collect()
    };
    // Wait until the run is under way: its namespaces exist and its sender process
    // (`netlane bulk send`) runs.
    let deadline = Instant::now() + Duration::from_secs(20);
    let sender_running = || {
        std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
            std::fs::read(e.path().join("cmdline")).is_ok_and(|c| {
                let c = String::from_utf8_lossy(&c);
                c.contains("bulk\0send\0")
                    && std::fs::read_to_string(e.path().join("stat"))
                        .is_ok_and(|st| st.split_whitespace().nth(3) == Some(&pid.to_string()))
            })
        })
    };
    while !(ours().len() == 2 && sender_running()) {
        assert!(Instant::now() < deadline, "the run never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    let st = Command::new("kill").args(["-INT", &pid.to_string()]).status().unwrap();
    assert!(st.success());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "exit status after SIGINT");
    let mut err = String::new();
    child.stderr.as_mut().unwrap().read_to_string(&mut err).unwrap();
    assert!(err.contains("removed 2 network namespaces"), "{err}");
    assert!(ours().is_empty(), "left behind: {:?}", ours());
    std::thread::sleep(Duration::from_millis(200));
    assert!(!sender_running(), "the sender process outlived the benchmark");
}

#[test]
fn lb_run_and_decap_serve_until_sigterm_and_report_their_counters() {
    if !privileged("lb_run_and_decap_serve_until_sigterm_and_report_their_counters") {
        return;
    }
    let (a, b) = common::veth_pair("cli-lb", ("lb0", "lb1"), 231);
    let dir = temp_dir("lbrun");
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("lb.toml");
    std::fs::write(
        &cfg,
        "ring_size = 1021\nconn_entries = 4096\n[[vip]]\naddress = \"10.100.0.1\"\nport = 80\nproto = \"tcp\"\n\
         [[vip.real]]\naddress = \"10.1.0.11\"\n",
    )
    .unwrap();
    // The device-bound build on a device without RX metadata (loopback): says so, and
    // libbpf's own lines stay out of the output.
    let o = a
        .command(env!("CARGO_BIN_EXE_netlane"))
        .args(["lb", "run", "--config", cfg.to_str().unwrap(), "--iface", "lo", "--gateway-mac", "02:00:00:00:00:01"])
        .args(["--hints", "rx-hash", "--hint-source", "kfunc", "-t", "1s"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("gives XDP programs no RX metadata"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("libbpf:"), "{}", stderr(&o));
    let stats = dir.join("stats.json");
    let mut run = a.command(env!("CARGO_BIN_EXE_netlane"));
    run.args(["lb", "run", "--config", cfg.to_str().unwrap(), "--iface", "lb0", "--gateway-mac", "02:00:00:00:00:01"])
        .args(["--stats-interval", "200ms", "--stats-json", stats.to_str().unwrap(), "--json", "-"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = Reaped(run.spawn().unwrap());
    let deadline = Instant::now() + Duration::from_secs(20);
    while !stats.is_file() {
        assert!(Instant::now() < deadline, "lb run never published statistics");
        std::thread::sleep(Duration::from_millis(50));
    }
    // A live edit (a real added, the file renamed into place) is applied; a bad one
    // keeps the running configuration.
    let edit = |text: &str| {
        let tmp = dir.join("lb.toml.new");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &cfg).unwrap();
        std::thread::sleep(Duration::from_millis(1000));
    };
    edit(&(std::fs::read_to_string(&cfg).unwrap() + "[[vip.real]]\naddress = \"10.1.0.12\"\n"));
    edit("ring_size = 1021\nconn_entries = 4096\n[[vip]]\naddress = \"10.100.0.1\"\nproto = \"tcp\"\n");
    // The statistics file can no longer be written (a directory now stands where it
    // goes): the balancer keeps forwarding, says so, and still stops cleanly.
    std::fs::remove_file(&stats).unwrap();
    std::fs::create_dir_all(stats.join("in-the-way")).unwrap();
    std::thread::sleep(Duration::from_millis(800));
    assert!(child.0.try_wait().unwrap().is_none(), "lb run exited when it could not write its statistics");
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let status = child.wait().unwrap();
    let (mut out, mut err) = (String::new(), String::new());
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(err.contains("loading the data plane") && err.contains("detached from lb0"), "{err}");
    assert!(err.contains("still forwarding"), "the failed writes are reported: {err}");
    assert!(err.contains("10.100.0.1:80/tcp: +[10.1.0.12] -[] reweighted []"), "the edit is applied: {err}");
    assert!(err.contains("kept the running configuration") && err.contains("has no [[vip.real]]"), "{err}");
    let doc = valid_document(&out, "lb-run");
    assert_eq!(doc["mode"], "native");
    assert_eq!(doc["stats"]["iface"], "lb0");

    // The reals' decapsulation program: attached, then detached when the time is up.
    let o = b
        .command(env!("CARGO_BIN_EXE_netlane"))
        .args(["lb", "decap", "--iface", "lb1", "-t", "300ms"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("decapsulated on lb1"), "{}", stdout(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rr_serve_answers_rr_clients_and_both_write_valid_json() {
    let dir = temp_dir("rr-json");
    std::fs::create_dir_all(&dir).unwrap();
    let serve_json = dir.join("serve.json");
    let serve_json_arg = serve_json.to_str().unwrap();
    let (mut child, addr, mut out) = start_listening(&[
        "rr",
        "serve",
        "--listen",
        "localhost:0",
        "--path",
        "recvfrom",
        "-t",
        "60s",
        "--json",
        serve_json_arg,
    ]);
    let addr = addr.as_str();
    // Host names, as every peer tool takes them: `localhost` is 127.0.0.1.
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
    let by_name = addr.replace("127.0.0.1", "localhost");
    let o =
        netlane(&["rr", "clients", "--server", &by_name, "--clients", "8", "-t", "500ms", "--ramp", "100ms", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let doc = valid_document(&stdout(&o), "rr-clients");
    let r = &doc["report"];
    let responses = r["responses"].as_u64().unwrap();
    assert!(responses > 100, "{r}");
    for k in ["corrupt", "mismatched", "lost"] {
        assert_eq!(r[k].as_u64(), Some(0), "{k}: {r}");
    }
    // More than the server sends: a refusal naming its limit ends the run at once.
    for response in ["70000", "20K"] {
        let started = Instant::now();
        let o = netlane(&["rr", "clients", "--server", addr, "--clients", "2", "--response", response, "-t", "30s"]);
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        assert!(stderr(&o).contains("the server sends responses of at most 16384 payload bytes"), "{}", stderr(&o));
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    }
    let st = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(st.success());
    assert_eq!(child.wait().unwrap().code(), Some(0), "a server stopped by SIGTERM exits 0");
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("stopped after") && rest.contains("responses="), "{rest}");
    let doc = valid_document(&std::fs::read_to_string(&serve_json).unwrap(), "rr-serve");
    assert!(doc["stats"]["responses"].as_u64().unwrap() >= responses, "{doc}");
    assert_eq!(doc["stats"]["path"], "recvfrom");
    // 8 KiB responses to 512-byte requests are over the ratio an address gets before it
    // shows it receives: each client was asked once for its cookie, then verified.
    assert_eq!(doc["stats"]["retries_sent"].as_u64(), Some(8), "{doc}");
    assert!(doc["stats"]["verified_requests"].as_u64().unwrap() >= responses, "{doc}");
    assert_eq!(doc["stats"]["refused_too_large"].as_u64(), Some(4), "two clients, twice: {doc}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rr_bad_options_and_an_absent_server_are_clear_errors() {
    let o = netlane(&["rr", "serve", "--path", "tpacket-v9"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("unknown receive path \"tpacket-v9\""), "{}", stderr(&o));
    let o = netlane(&["rr", "serve", "--listen", "127.0.0.1:0", "--segment", "20"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("segment size 20"), "{}", stderr(&o));
    let o = netlane(&["rr", "serve", "--listen", "127.0.0.1:0", "--batch", "0"]);
    assert!(stderr(&o).contains("batch 0: must be 1..="), "{}", stderr(&o));
    let o = netlane(&["rr", "clients", "--request", "10"]);
    assert!(stderr(&o).contains("request size 10"), "{}", stderr(&o));
    let o = netlane(&["rr", "clients", "--threads", "3", "--clients", "2"]);
    assert!(stderr(&o).contains("3 threads for 2 clients"), "{}", stderr(&o));
    // One address rule everywhere: HOST:PORT, or a host alone with the default port.
    for (cmd, opt, bad, says) in [
        (["rr", "clients"], "--server", "localhost:x", "\"x\" is not a port"),
        (["kv", "load"], "--server", "localhost:70000", "is not a port"),
        (["nvme", "perf"], "--target", "a b:1", "expected HOST:PORT"),
        (["hostile", "kv"], "--addr", "localhost", "expected HOST:PORT"),
        // Rates take SI suffixes (`10k`), as sizes and byte rates take units.
        (["rr", "clients"], "--rate", "ten", "k, M or G for thousands"),
    ] {
        let o = netlane(&[cmd[0], cmd[1], opt, bad]);
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{bad}: {}", stderr(&o));
    }
    // Nobody listens: the run ends on time with an error that says what happened.
    let port = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let server = format!("127.0.0.1:{port}");
    let o = netlane(&["rr", "clients", "--server", &server, "--clients", "2", "-t", "300ms", "--timeout", "20ms"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains(&format!("no response from {server}")), "{}", stderr(&o));
    assert!(stdout(&o).contains("lost="), "{}", stdout(&o));
}

#[test]
fn kv_serve_answers_memcached_clients_serves_metrics_and_stops_on_sigterm() {
    let dir = temp_dir("kv-serve");
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("serve.json");
    let mut child = Command::new(env!("CARGO_BIN_EXE_netlane"))
        .args(["kv", "serve", "-l", "127.0.0.1", "-p", "-1", "-U", "0", "-t", "2", "-m", "16"])
        .args(["--metrics-addr", "127.0.0.1:0", "--time", "60s", "--json", json.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start kv serve");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let field = |name: &str| {
        first
            .split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .map(str::to_string)
            .unwrap_or_else(|| panic!("{first}"))
    };
    let addr = first.split_whitespace().nth(2).unwrap().to_string();
    let metrics = field("metrics=http://").trim_end_matches("/metrics").to_string();
    let mut c = std::net::TcpStream::connect(&addr).unwrap();
    c.write_all(b"set k 0 0 2\r\nhi\r\nget k nope\r\n").unwrap();
    let got = read_until_end(&mut c);
    assert_eq!(String::from_utf8_lossy(&got), "STORED\r\nVALUE k 0 2\r\nhi\r\nEND\r\n");
    // Workers publish their counters after each turn of their loop, which may end just
    // after the reply left: scrape until the get shows.
    let samples = prometheus_samples_once(&metrics, "netlane_kv_get_hits_total", 1.0);
    let value = |n: &str| samples.iter().find(|s| s.0 == n).map(|s| s.2).unwrap_or_else(|| panic!("no {n}"));
    assert_eq!(value("netlane_kv_get_hits_total"), 1.0);
    assert_eq!(value("netlane_kv_get_misses_total"), 1.0);
    assert_eq!(value("netlane_kv_curr_items"), 1.0);
    assert_eq!(value("netlane_kv_limit_maxbytes"), 16.0 * 1024.0 * 1024.0);
    // The load generator against it: JSON on stdout, validated, every request answered.
    let o = netlane(&[
        "kv",
        "load",
        "--server",
        &addr,
        "-c",
        "8",
        "--rate",
        "2000",
        "--duration",
        "500ms",
        "--keys",
        "1000",
        "--sla",
        "p99=50ms",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let doc = valid_document(&stdout(&o), "kv-load");
    let r = &doc["report"];
    assert!(r["counts"]["completed"].as_u64().unwrap() > 500, "{r}");
    assert_eq!(r["counts"]["completed"], r["counts"]["offered"], "{r}");
    assert_eq!(r["counts"]["misses"], 0, "the warm-up stored every key: {r}");
    assert!(doc["sla_met"].is_boolean() && doc["echo"].as_array().unwrap().iter().any(|e| e == "sla=p99=50ms"));
    assert_eq!(doc["warmed_up_keys"], 1000, "{doc}");
    // A warm-up alone (what the lab asks before its runs): the keys stored, no run.
    let o = netlane(&["kv", "load", "--server", &addr, "--keys", "1000", "--warmup-only", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let doc = valid_document(&stdout(&o), "kv-load");
    assert_eq!(doc["warmed_up_keys"], 1000, "{doc}");
    assert!(doc["report"].is_null() && doc["search"].is_null(), "{doc}");
    let st = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(st.success());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "a server stopped by SIGTERM exits 0");
    let last: Vec<String> = lines.map_while(Result::ok).collect();
    let last = last.join("\n");
    assert!(last.contains("get_hits=") && last.contains("curr_items=1001"), "{last}");
    let doc = valid_document(&std::fs::read_to_string(&json).unwrap(), "kv-serve");
    assert_eq!(doc["stats"]["curr_items"], 1001, "{doc}");
    assert!(doc["stats"]["get_hits"].as_u64().unwrap() > 400, "{doc}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn kv_serve_bad_options_are_explained() {
    let o = netlane(&["kv", "serve", "-t", "0", "-p", "0"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("--threads 0"), "{}", stderr(&o));
    let o = netlane(&["kv", "serve", "-m", "1", "-p", "0"]);
    assert!(stderr(&o).contains("too small"), "{}", stderr(&o));
    let o = netlane(&["kv", "serve", "-l", "nonsense"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("expected ADDR:PORT"), "{}", stderr(&o));
    let o = netlane(&["kv", "serve", "--metrics-addr", "10.0.0.1:9000"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("loopback"), "{}", stderr(&o));
    // Lanes: bad counts, policies and steering are refused by the parser; asking for a
    // lane per queue of loopback, which has no NAPI, says so.
    for (args, want) in [
        (&["--lanes", "0"][..], "--lanes 0"),
        (&["--busy-poll", "0"], "microseconds"),
        (&["--busy-poll", "50,8,fast"], "prefer"),
        (&["--steer", "napi-magic"], "round-robin, acceptor or reuseport"),
        (&["--lanes", "2", "-t", "2"], "cannot be used with"),
    ] {
        let o = netlane(&[&["kv", "serve", "-p", "0"][..], args].concat());
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
    }
    let o = netlane(&["kv", "serve", "-p", "0", "--lanes", "auto"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("--lanes auto: lo: no receive queue has a NAPI instance"), "{}", stderr(&o));
    let o = netlane(&["kv", "serve", "-p", "0", "--gro-flush-timeout", "20us"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("--lane-device"), "{}", stderr(&o));
    let o = netlane(&["kv", "load", "--rate", "0", "--no-warmup"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("rate"), "{}", stderr(&o));
    let o = netlane(&["kv", "load", "--sla", "p99.9", "--search"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("p99.9=1ms"), "{}", stderr(&o));
    // Nobody listening: a clear error, not a report of zeros.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    // `--time`, as every other command calls the run length (`--duration` too).
    let o = netlane(&["kv", "load", "--server", &format!("127.0.0.1:{port}"), "--time", "100ms"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("connect"), "{}", stderr(&o));
    // The search's range is checked before the warm-up writes anything (here there is
    // no server at all: the warm-up would fail first).
    let o = netlane(&[
        "kv",
        "load",
        "--server",
        &format!("127.0.0.1:{port}"),
        "--sla",
        "p99=1ms",
        "--search",
        "--search-lo",
        "5000",
        "--search-hi",
        "1000",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("--search") && stderr(&o).contains("rate range"), "{}", stderr(&o));
    let o = netlane(&["kv", "load", "--strict"]);
    assert_eq!(o.status.code(), Some(2), "--strict needs an SLA: {}", stderr(&o));
}

#[test]
fn kv_serve_takes_memcached_s_options() {
    // A Unix socket with its mask (-s, -a), and nothing else served.
    let dir = temp_dir("kv-unix");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("mc.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_netlane"))
        .args(["kv", "serve", "-s", path.to_str().unwrap(), "-a", "640", "-t", "1", "-m", "16", "--time", "30s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let first = BufReader::new(child.stdout.take().unwrap()).lines().next().unwrap().unwrap();
    assert!(first.starts_with(&format!("listening on {} (unix)", path.display())), "{first}");
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o640);
    let mut c = std::os::unix::net::UnixStream::connect(&path).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(b"set k 0 0 2\r\nhi\r\nget k\r\n").unwrap();
    let got = read_until_end(&mut c);
    assert_eq!(String::from_utf8_lossy(&got), "STORED\r\nVALUE k 0 2\r\nhi\r\nEND\r\n");
    stop_child(&mut child);
    assert!(!path.exists(), "the socket file is removed when the server stops");
    let _ = std::fs::remove_dir_all(&dir);
    // With no -l, only loopback is served (memcached: every address).
    let (mut child, addr) = start_kv_serve(&[]);
    stop_child(&mut child);
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
    // Options memcached has and netlane does not are refused by name.
    for (args, want) in [
        (&["-d"][..], "-d: netlane does not daemonize"),
        (&["-S"], "-S: authentication is not supported"),
        (&["-o", "ext_path=/tmp/x:64m"], "not supported"),
        (&["-o", "nonsense"], "illegal suboption"),
        (&["-B", "http"], "ascii, binary or auto"),
    ] {
        let o = netlane(&[&["kv", "serve", "-p", "-1", "--time", "1s"][..], args].concat());
        assert_ne!(o.status.code(), Some(0), "{args:?}");
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn kv_serve_as_root_runs_as_the_user_of_dash_u_once_its_socket_is_open() {
    if !privileged("kv_serve_as_root_runs_as_the_user_of_dash_u_once_its_socket_is_open") {
        return;
    }
    // Port 1211 needs root to bind; the server then runs as nobody (memcached drops
    // before binding, so it could not take a port under 1024 with -u).
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let low = if std::net::TcpListener::bind("127.0.0.1:1211").is_ok() { 1211 } else { port };
    let (mut child, addr) = start_kv_serve(&["-u", "nobody", "-p", &low.to_string()]);
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
    let uid =
        status.lines().find_map(|l| l.strip_prefix("Uid:")).unwrap().split_whitespace().next().unwrap().to_string();
    let mut c = std::net::TcpStream::connect(&addr).unwrap();
    c.write_all(b"set k 0 0 1\r\na\r\nget k\r\n").unwrap();
    let got = read_until_end(&mut c);
    stop_child(&mut child);
    assert_eq!(addr, format!("127.0.0.1:{low}"));
    assert_eq!(uid, "65534", "the server runs as nobody");
    assert!(got.ends_with(b"VALUE k 0 1\r\na\r\nEND\r\n"), "{got:?}");
}

#[test]
fn kv_load_fails_when_its_connections_fail_and_strict_fails_a_missed_sla() {
    // A server that takes two connections (-c 2) of the four asked for: two are refused,
    // the run measures half of what it offered, and says it failed.
    let (mut child, server) = start_kv_serve(&["-c", "2"]);
    let o = netlane(&[
        "kv",
        "load",
        "--server",
        &server,
        "-c",
        "4",
        "--rate",
        "1000",
        "--duration",
        "500ms",
        "--keys",
        "100",
        "--no-warmup",
        "--json",
    ]);
    stop_child(&mut child);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("the measurement failed: 2 connections failed"), "{}", stderr(&o));
    // The report is written all the same.
    let doc = valid_document(&stdout(&o), "kv-load");
    assert!(doc["report"]["counts"]["completed"].as_u64().unwrap() > 0, "{doc}");
    // --strict: an SLA no server can meet exits 3, with the report.
    let (mut child, server) = start_kv_serve(&[]);
    let o = netlane(&[
        "kv",
        "load",
        "--server",
        &server,
        "-c",
        "2",
        "--rate",
        "500",
        "--duration",
        "300ms",
        "--keys",
        "100",
        "--sla",
        "p50=1ns",
        "--strict",
        "--json",
    ]);
    stop_child(&mut child);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert_eq!(valid_document(&stdout(&o), "kv-load")["sla_met"], false);
}

/// Reads a memcached reply up to its `END` line.
fn read_until_end(c: &mut impl Read) -> Vec<u8> {
    let mut buf = [0u8; 64];
    let mut got = Vec::new();
    while !got.ends_with(b"END\r\n") {
        let n = c.read(&mut buf).unwrap();
        assert!(n > 0, "closed after {got:?}");
        got.extend_from_slice(&buf[..n]);
    }
    got
}

/// `netlane kv serve` with `args` (on a free port unless they give one): the child and
/// its address.
fn start_kv_serve(args: &[&str]) -> (std::process::Child, String) {
    let port: &[&str] = if args.contains(&"-p") { &[] } else { &["-p", "-1"] };
    let mut child = Command::new(env!("CARGO_BIN_EXE_netlane"))
        .args(["kv", "serve", "-t", "1", "-m", "16", "--time", "60s"])
        .args(port)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let first = BufReader::new(child.stdout.take().unwrap()).lines().next().unwrap().unwrap();
    let addr = first.split_whitespace().nth(2).unwrap().to_string();
    (child, addr)
}

fn stop_child(child: &mut std::process::Child) {
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let _ = child.wait();
}

#[test]
fn app_run_gives_every_socket_of_a_program_its_priority_and_mark() {
    if !privileged("app_run_gives_every_socket_of_a_program_its_priority_and_mark") {
        return;
    }
    let script = "import socket; s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); \
                  print(s.getsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY), s.getsockopt(socket.SOL_SOCKET, socket.SO_MARK))";
    let o = netlane(&[
        "app",
        "run",
        "--name",
        "cli-test",
        "--priority",
        "3",
        "--mark",
        "0x22",
        "--",
        "python3",
        "-c",
        script,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "3 34");
    assert!(stderr(&o).contains("sockets given priority 3 and mark 0x22"), "{}", stderr(&o));
    // The program's exit status is the command's.
    let o = netlane(&["app", "run", "--name", "cli-test", "--mark", "1", "--", "sh", "-c", "exit 7"]);
    assert_eq!(o.status.code(), Some(7), "{}", stderr(&o));
    // SIGTERM to netlane reaches the program; both end, and the cgroup goes with them.
    let mut run = Reaped(
        Command::new(env!("CARGO_BIN_EXE_netlane"))
            .args(["app", "run", "--name", "cli-term", "--mark", "1", "--", "sleep", "30"])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(Command::new("kill").args(["-TERM", &run.id().to_string()]).status().unwrap().success());
    let t = Instant::now();
    let status = run.wait().unwrap();
    assert!(t.elapsed() < Duration::from_secs(5), "the program outlived the signal");
    assert_eq!(status.code(), Some(128 + 15), "the program ended by SIGTERM");
    let root = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let cg2 = root.lines().find(|l| l.contains(" - cgroup2 ")).and_then(|l| l.split_whitespace().nth(4)).unwrap();
    let left: Vec<_> = std::fs::read_dir(cg2)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with("-cli-term"))
        .collect();
    assert!(left.is_empty(), "cgroups left behind: {left:?}");
    // Shaping a device that does not exist, or more guarantees than the link: clear errors.
    let o = netlane(&["app", "shape", "--dev", "no-such-if0", "--link", "1gbit", "--app", "a:1:1mbit:2mbit"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("--dev no-such-if0"), "{}", stderr(&o));
    let o = netlane(&[
        "app",
        "shape",
        "--dev",
        "lo",
        "--link",
        "1mbit",
        "--app",
        "a:1:1mbit:1mbit",
        "--app",
        "b:2:1mbit:1mbit",
    ]);
    assert!(stderr(&o).contains("add up to"), "{}", stderr(&o));
    // mqprio asked for where it cannot be had (loopback has one transmit queue): says why.
    let o = netlane(&[
        "app",
        "shape",
        "--dev",
        "lo",
        "--link",
        "1gbit",
        "--app",
        "a:1:1mbit:2mbit:0:3",
        "--backend",
        "mqprio",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("mqprio channel mode on interface 1: the device has 1 transmit queue; mqprio needs one per traffic class (2)"),
        "{}",
        stderr(&o)
    );
}

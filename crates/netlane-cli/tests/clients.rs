//! What every load generator shares with `bench`: `--sla` with `--strict` (exit 3 when it
//! was missed, 0 when held) and `--csv` (the run as one row led by its run id), for
//! `kv load`, `rr clients` and `nvme perf`, each against its own server on loopback.

use std::path::Path;

mod common;
use common::{netlane, start_listening, stderr, stdout, temp_dir, valid_document};

/// The CSV file `name` in `dir`: its header and its one row, as key -> value.
fn one_row(dir: &Path, name: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{name}: a header and one row: {text}");
    lines[0].split(',').map(String::from).zip(lines[1].split(',').map(String::from)).collect()
}

fn field<'a>(row: &'a [(String, String)], key: &str) -> &'a str {
    &row.iter().find(|(k, _)| k == key).unwrap_or_else(|| panic!("no {key} in {row:?}")).1
}

/// Runs a client twice: an SLA nothing meets (exit 3, sla_met false) and one anything
/// meets (exit 0), the second with `--csv`; returns the CSV's row.
fn strict_both_ways(kind: &str, args: &[&str], csv: &Path) -> Vec<(String, String)> {
    let run = |sla: &str, extra: &[&str]| {
        let mut a: Vec<&str> = args.to_vec();
        a.extend(["--sla", sla, "--strict", "--json", "-"]);
        a.extend(extra);
        netlane(&a)
    };
    let o = run("p99=1ns", &[]);
    assert_eq!(o.status.code(), Some(3), "{args:?}: {}", stderr(&o));
    assert_eq!(valid_document(&stdout(&o), kind)["sla_met"], false);
    let o = run("p99=60s", &["--csv", csv.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
    let doc = valid_document(&stdout(&o), kind);
    assert_eq!(doc["sla_met"], true);
    let row = one_row(csv, &format!("{kind}.csv"));
    assert_eq!(field(&row, "run_id"), doc["provenance"]["run_id"].as_str().unwrap());
    row
}

#[test]
fn the_clients_judge_an_sla_with_strict_and_write_csv() {
    let dir = temp_dir("clients");
    let (_rr, addr, _) = start_listening(&["rr", "serve", "--listen", "127.0.0.1:0"]);
    let row = strict_both_ways(
        "rr-clients",
        &["rr", "clients", "--server", &addr, "--clients", "4", "--rate", "2k", "-t", "500ms", "--ramp", "0s"],
        &dir,
    );
    assert!(field(&row, "responses").parse::<u64>().unwrap() > 500, "{row:?}");
    assert_eq!((field(&row, "sla"), field(&row, "sla_met")), ("p99=60s", "yes"));
    let (_nvme, addr, _) = start_listening(&["nvme", "target", "--listen", "127.0.0.1:0"]);
    let row = strict_both_ways("nvme-perf", &["nvme", "perf", "--target", &addr, "-t", "500ms", "--ramp", "0s"], &dir);
    assert!(field(&row, "iops").parse::<f64>().unwrap() > 0.0, "{row:?}");
    let (_kv, addr, _) = start_listening(&["kv", "serve", "-l", "127.0.0.1", "-p", "-1", "-t", "1", "-m", "16"]);
    let row = strict_both_ways(
        "kv-load",
        &["kv", "load", "--server", &addr, "-c", "2", "--rate", "1000", "--time", "500ms", "--keys", "100"],
        &dir,
    );
    assert!(field(&row, "completed").parse::<u64>().unwrap() > 200, "{row:?}");
    assert_eq!(field(&row, "sla_met"), "yes");
    // A run says where it is on stderr as it goes (a line a second when stderr is not a
    // terminal), and its results on stdout.
    let o =
        netlane(&["kv", "load", "--server", &addr, "-c", "2", "--rate", "1000", "--time", "1500ms", "--keys", "100"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("] measuring ") && stderr(&o).contains(" requests/s, eta "), "{}", stderr(&o));
    assert!(!stdout(&o).contains("eta"), "{}", stdout(&o));
    // An SLA at a percentile nvme perf does not keep is refused before anything runs.
    let o = netlane(&["nvme", "perf", "--target", "127.0.0.1:9", "--sla", "p95=1ms"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("at p50, p90, p99, p99.9, p99.99 or p100"), "{}", stderr(&o));
    // --strict needs an SLA to judge.
    let o = netlane(&["rr", "clients", "--strict"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--sla"), "{}", stderr(&o));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A server says its rates while it runs: `rr serve` publishes every counter on
/// `/metrics` (read by Debian's Prometheus parser) and prints a line of rates every
/// `--stats-interval` on stderr.
#[test]
fn rr_serve_publishes_its_counters_and_rates_while_it_runs() {
    let server = common::Started::new(&[
        "rr",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--metrics-addr",
        "127.0.0.1:0",
        "--stats-interval",
        "200ms",
    ]);
    let o = netlane(&["rr", "clients", "--server", &server.addr(), "--clients", "4", "--rate", "2k", "-t", "600ms"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // Each lane adds its counts every tenth of a second: a moment for the last of them.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let samples = common::prometheus_samples(&server.metrics());
    let get = |n: &str| samples.iter().find(|s| s.0 == n).map(|s| s.2);
    assert!(get("netlane_rr_responses_total").is_some_and(|v| v > 500.0), "{samples:?}");
    assert!(get("netlane_rr_frames_total").is_some(), "{samples:?}");
    // Also what the transmit path counts, not only at the end.
    assert!(get("netlane_rr_send_syscalls_total").is_some_and(|v| v > 500.0), "{samples:?}");
    let (code, rest, err) = server.stop();
    assert_eq!(code, Some(0));
    assert!(rest.contains("stopped after"), "{rest}");
    let rates: Vec<&str> = err.lines().filter(|l| l.contains(" responses/s ")).collect();
    assert!(rates.len() >= 2, "a line every 200 ms: {err}");
    assert!(rates.iter().any(|l| !l.contains("] 0 responses/s")), "{err}");
}

/// Starts the server `args` (with `--stats-interval 200ms`), runs `load` against the
/// address its first line names, stops it with SIGTERM, and returns its lines of rates.
fn rates_while(args: &[&str], load: impl FnOnce(&str) -> Vec<String>) -> Vec<String> {
    let server = common::Started::new(&[args, &["--stats-interval", "200ms"]].concat());
    let args = load(&server.addr());
    let o = netlane(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    let (code, rest, err) = server.stop();
    assert_eq!(code, Some(0), "{rest}");
    err.lines().filter(|l| l.starts_with('[') && l.contains("s] ")).map(String::from).collect()
}

#[test]
fn kv_serve_and_nvme_target_print_their_rates_while_they_run() {
    let words = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
    let kv = rates_while(&["kv", "serve", "-l", "127.0.0.1", "-p", "-1", "-t", "1", "-m", "16"], |addr| {
        words(&format!("kv load --server {addr} -c 2 --rate 2000 --time 800ms --keys 100"))
    });
    assert!(kv.len() >= 3, "a line every 200 ms: {kv:?}");
    assert!(kv.iter().any(|l| l.contains("% hits") && !l.contains("] 0 gets/s")), "{kv:?}");
    let nvme = rates_while(&["nvme", "target", "--listen", "127.0.0.1:0"], |addr| {
        words(&format!("nvme perf --target {addr} -t 800ms --ramp 0s --rw randread"))
    });
    assert!(nvme.len() >= 3, "{nvme:?}");
    assert!(nvme.iter().any(|l| !l.contains("] 0 commands/s") && l.contains(" MB/s, errors 0/s")), "{nvme:?}");
}

/// Run without the capabilities a path needs, a server says which and how to get them,
/// before it sets anything up (as nobody when the tests run as root).
#[test]
fn a_refusal_for_want_of_capabilities_names_them() {
    let dir = temp_dir("caps");
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("lb.toml");
    std::fs::write(
        &config,
        "ring_size = 13\n[[vip]]\naddress = \"10.100.0.1\"\nport = 80\nproto = \"tcp\"\n[[vip.real]]\naddress = \
         \"10.1.0.11\"\nweight = 1\n",
    )
    .unwrap();
    // Readable by nobody: the temporary directory is this user's.
    let open = |p: &Path, mode: u32| {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
    };
    open(&dir, 0o755);
    open(&config, 0o644);
    let as_nobody = |args: &[&str]| {
        let mut c = if nix::unistd::geteuid().is_root() {
            let mut c = std::process::Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups", env!("CARGO_BIN_EXE_netlane")]);
            c
        } else {
            std::process::Command::new(env!("CARGO_BIN_EXE_netlane"))
        };
        c.args(args).output().unwrap()
    };
    for (args, want) in [
        (
            vec!["rr", "serve", "--listen", "127.0.0.1:0", "--path", "tpacket-v3", "-t", "1s"],
            "the tpacket-v3 path needs CAP_NET_RAW: run as root, or grant it: setcap cap_net_raw+ep",
        ),
        (
            vec!["rr", "serve", "--listen", "127.0.0.1:0", "--path", "af-xdp", "-t", "1s"],
            "the af-xdp path needs CAP_NET_RAW, CAP_BPF and CAP_NET_ADMIN",
        ),
        (
            vec!["lb", "run", "--config", config.to_str().unwrap(), "--iface", "lo"]
                .into_iter()
                .chain(["--gateway-mac", "02:00:00:00:00:01", "-t", "1s"])
                .collect(),
            "the XDP load balancer needs CAP_BPF and CAP_NET_ADMIN: run as root, or grant them: setcap \
             cap_bpf,cap_net_admin+ep",
        ),
    ] {
        let o = as_nobody(&args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

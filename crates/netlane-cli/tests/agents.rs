//! `netlane kv load --agents` and `netlane rr clients --agents`: the load on two SSH
//! hosts against a server on a third, one merged measurement. The hosts are namespaces
//! running Debian's sshd (`netlane_testkit::sshd`) on one bridged network; the
//! coordinator reaches them only through `ssh`. Needs root and openssh-server. Also
//! `rr clients --agent` alone.

mod common;

use std::time::Duration;

use netlane_lab::host::{RoleProcess, RoleSpec, SshHost, SshSpec};
use netlane_testkit::sshd::SshHosts;

/// `netlane CMD --agents agent1,agent2 ARGS --json -` (reaching the agents through the
/// fixture's ssh configuration), which must succeed: its document of `kind`.
/// Held by this file's tests that run load, so that they do not run beside each other.
static MEASURING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn by_agents(hosts: &SshHosts, cmd: &[&str], agents: &str, args: &[&str], kind: &str) -> serde_json::Value {
    let config = hosts.config.display().to_string();
    let mut all = cmd.to_vec();
    all.extend(["--agents", agents, "--ssh-config", &config, "--agent-netlane", env!("CARGO_BIN_EXE_netlane")]);
    all.extend(args);
    all.extend(["--json", "-"]);
    let o = common::netlane(&all);
    assert!(o.status.success(), "{all:?}: {}", common::stderr(&o));
    common::valid_document(&common::stdout(&o), kind)
}

fn load(hosts: &SshHosts, agents: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["--server", "10.77.0.1:11211", "--connections", "6", "--keys", "2000"];
    args.extend(extra);
    by_agents(hosts, &["kv", "load"], agents, &args, "kv-load")
}

#[test]
fn two_agents_make_one_measurement_for_kv_rr_and_nvme_and_a_search_over_their_merged_runs() {
    if !netlane_testkit::privileged("two_agents_make_one_measurement_and_a_search_over_their_merged_runs") {
        return;
    }
    // It judges what it measures (every request answered, an SLA held, a search capped):
    // nothing else of this file beside it.
    let _alone = common::alone(&MEASURING);
    let hosts = SshHosts::start(&["kvserver", "agent1", "agent2"]).unwrap();
    hosts.bridge("10.77.0").unwrap();
    let server_host = SshHost::connect(&SshSpec {
        destination: "kvserver".into(),
        config: Some(hosts.config.clone()),
        netlane: env!("CARGO_BIN_EXE_netlane").into(),
        deploy: None,
    })
    .unwrap();
    let args = ["kv", "serve", "--json", "-", "--listen", "10.77.0.1", "--port", "11211", "--threads", "1"];
    let serve = RoleSpec::netlane("netlane kv serve", args).ready_on_stderr("listening on", Duration::from_secs(20));
    let server = RoleProcess::start(&server_host, &serve, None).unwrap();

    // One run: each agent offers its share, and the merged run is every agent's requests.
    let doc = load(&hosts, "agent1,agent2", &["--rate", "3000", "--duration", "1s", "--sla", "p99=100ms"]);
    assert_eq!(doc["warmed_up_keys"], 2000);
    let steps = doc["agents"].as_array().unwrap();
    assert_eq!(steps.len(), 1);
    let agents = steps[0]["agents"].as_array().unwrap();
    assert_eq!(agents.iter().map(|a| a["host"].as_str().unwrap()).collect::<Vec<_>>(), ["host agent1", "host agent2"]);
    assert_eq!(agents.iter().map(|a| a["connections"].as_u64().unwrap()).collect::<Vec<_>>(), [3, 3]);
    let report = &doc["report"];
    let offered: f64 = agents.iter().map(|a| a["offered_per_s"].as_f64().unwrap()).sum();
    let achieved: f64 = agents.iter().map(|a| a["achieved_per_s"].as_f64().unwrap()).sum();
    assert!((offered - report["offered_per_s"].as_f64().unwrap()).abs() < 1e-6, "{doc}");
    assert!((achieved - report["achieved_per_s"].as_f64().unwrap()).abs() < 1e-6, "{doc}");
    // Both agents sent (a Poisson second at 1500/s is far from none), and every request
    // they offered was answered.
    for a in agents {
        assert!(a["offered_per_s"].as_f64().unwrap() > 500.0, "{a}");
    }
    assert_eq!(report["counts"]["completed"], report["counts"]["offered"], "{report}");
    assert_eq!(doc["sla_met"], true, "{doc}");

    // A search whose every run is the agents' merge. A send is late past 5 ms, not the
    // default 100 us: with an SLA of 100 ms that is lateness enough, and two agents, a
    // server and their sshd on two CPUs (a VM's, whose vCPU stalls reach milliseconds)
    // delay more than 5% of the sends by over 100 us in some runs, which would make the
    // search measure the scheduler, not the merge.
    let doc = load(
        &hosts,
        "agent1,agent2",
        &[
            "--late-after",
            "5ms",
            "--no-warmup",
            "--duration",
            "200ms",
            "--ramp",
            "50ms",
            "--sla",
            "p99=100ms",
            "--search",
            "--search-lo",
            "500",
            "--search-hi",
            "2000",
            "--resolution",
            "1.5",
            "--max-bisections",
            "1",
        ],
    );
    let search = &doc["search"];
    // Far below what the server holds within 100 ms: every rate meets, and the search
    // (one bisection) ends capped.
    assert_eq!(search["capped"], true, "{search}");
    assert!(search["best_per_s"].as_f64().is_some_and(|b| b >= 1000.0), "{search}");
    let steps = doc["agents"].as_array().unwrap();
    assert_eq!(steps.len() as u64, search["runs"].as_u64().unwrap());
    assert!(steps.iter().all(|s| s["agents"].as_array().unwrap().len() == 2), "{doc}");

    let stopped = server.stop(Duration::from_secs(10)).unwrap();
    let served: serde_json::Value = stopped.json().unwrap();
    assert!(served["stats"]["cmd_get"].as_u64().unwrap() > 0, "{served}");

    // The datagram service's clients the same way: an open-loop population split
    // between the two hosts, merged into one report.
    let args = ["rr", "serve", "--listen", "10.77.0.1:7070", "--json", "-"];
    let serve = RoleSpec::netlane("netlane rr serve", args).ready_on_stderr("listening on", Duration::from_secs(20));
    let server = RoleProcess::start(&server_host, &serve, None).unwrap();
    let args = ["--server", "10.77.0.1:7070", "--clients", "5", "--rate", "2000", "--response", "1K"];
    let doc = by_agents(
        &hosts,
        &["rr", "clients"],
        "agent1,agent2",
        &[&args[..], &["-t", "1s", "--ramp", "100ms"]].concat(),
        "rr-clients",
    );
    let parts = doc["agents"].as_array().unwrap();
    assert_eq!(parts.iter().map(|a| a["host"].as_str().unwrap()).collect::<Vec<_>>(), ["host agent1", "host agent2"]);
    assert_eq!(parts.iter().map(|a| a["clients"].as_u64().unwrap()).collect::<Vec<_>>(), [3, 2]);
    let report = &doc["report"];
    assert_eq!(report["clients"], 5, "{report}");
    // Both hosts' clients were answered (1200/s and 800/s for a second are far from
    // none), and the merged rate is theirs together.
    for a in parts {
        assert!(a["responses_per_s"].as_f64().unwrap() > 300.0, "{a}");
    }
    let sum: f64 = parts.iter().map(|a| a["responses_per_s"].as_f64().unwrap()).sum();
    let merged = report["responses_per_s"].as_f64().unwrap();
    assert!((sum - merged).abs() < 0.05 * merged, "{sum} vs {merged}: {doc}");
    assert_eq!(report["lost"], 0, "{report}");
    let served: serde_json::Value = server.stop(Duration::from_secs(10)).unwrap().json().unwrap();
    assert!(served["stats"]["responses"].as_u64().unwrap() >= report["responses"].as_u64().unwrap(), "{served}");

    // nvme perf the fio --client way: both hosts run the whole workload against one
    // target, and the run is their merge.
    let args = ["nvme", "target", "--listen", "10.77.0.1:4420", "--ns", "mem:16M", "--json", "-"];
    let target =
        RoleSpec::netlane("netlane nvme target", args).ready_on_stderr("listening on", Duration::from_secs(20));
    let target = RoleProcess::start(&server_host, &target, None).unwrap();
    let args = ["--target", "10.77.0.1:4420", "--qd", "2", "-t", "1s", "--ramp", "100ms"];
    let doc = by_agents(&hosts, &["nvme", "perf"], "agent1,agent2", &args, "nvme-perf");
    let parts = doc["agents"].as_array().unwrap();
    assert_eq!(parts.iter().map(|a| a["host"].as_str().unwrap()).collect::<Vec<_>>(), ["host agent1", "host agent2"]);
    let report = &doc["report"];
    let group = &report["groups"][0];
    // Each host ran the whole workload: one job each, two in the merge, and every read's
    // latency in the merged histogram.
    assert_eq!(group["name"], "job", "{report}");
    assert_eq!(group["jobs"], 2, "{report}");
    assert_eq!(group["read_lat_ns"]["count"], group["reads"], "{report}");
    assert_eq!(group["errors"], 0, "{report}");
    for a in parts {
        assert!(a["iops"].as_f64().unwrap() > 50.0, "{a}");
    }
    let sum: f64 = parts.iter().map(|a| a["iops"].as_f64().unwrap()).sum();
    let merged = report["iops"].as_f64().unwrap();
    assert!((sum - merged).abs() < 0.05 * merged, "{sum} vs {merged}: {doc}");
    assert!(report["target_cpu_us_per_io"].is_null(), "{report}");
    // The target served at least every command the merge counts (the ramp's too).
    let served: serde_json::Value = target.stop(Duration::from_secs(10)).unwrap().json().unwrap();
    assert!(served["stats"]["commands"].as_u64().unwrap() >= report["ops"].as_u64().unwrap(), "{served}");
    // Nothing is left on any host once the coordinator is done.
    drop(server_host);
    for h in &hosts.hosts {
        h.wait_until_bare(false, Duration::from_secs(10)).unwrap();
    }
}

#[test]
fn agents_are_refused_before_anything_runs_when_they_cannot_be() {
    let o = common::netlane(&["kv", "load", "--agents", "a,b", "--agent"]);
    assert_eq!(o.status.code(), Some(2), "{}", common::stderr(&o));
    let o = common::netlane(&["kv", "load", "--agents", "a,b,c", "--connections", "2", "--no-warmup"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(common::stderr(&o).contains("3 agents for 2 connections"), "{}", common::stderr(&o));
    let o = common::netlane(&["rr", "clients", "--agents", "a,b,c", "--clients", "2"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(common::stderr(&o).contains("2 clients cannot be split between 3 agents"), "{}", common::stderr(&o));
    for flag in ["--verify", "--verify-only", "--target-pid=1"] {
        let o = common::netlane(&["nvme", "perf", "--agents", "a,b", flag]);
        assert_eq!(o.status.code(), Some(1), "{flag}");
        let flag = flag.split('=').next().unwrap();
        assert!(
            common::stderr(&o).contains(&format!("--agents cannot be combined with {flag}")),
            "{}",
            common::stderr(&o)
        );
    }
    let o = common::netlane(&["nvme", "perf", "--agents", "a", "--agent"]);
    assert_eq!(o.status.code(), Some(2), "{}", common::stderr(&o));
}

/// `rr clients --agent`, as the lab starts one on each client host: it makes its sockets,
/// says it is ready, starts on SIGUSR1, and writes its report with the whole latency
/// histogram (one latency per response).
#[test]
fn an_rr_clients_agent_starts_on_its_word_and_sends_its_whole_histogram() {
    use std::io::{BufRead as _, Read as _};
    let _alone = common::alone(&MEASURING);
    let (server, addr, _) = common::start_listening(&["rr", "serve", "--listen", "127.0.0.1:0", "-t", "60s"]);
    let mut agent = common::Reaped(
        std::process::Command::new(env!("CARGO_BIN_EXE_netlane"))
            .args(["rr", "clients", "--agent", "--server", &addr, "--clients", "4", "-t", "300ms", "--ramp", "50ms"])
            .args(["--response", "1K", "--json", "-"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut err = std::io::BufReader::new(agent.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), format!("ready: 4 clients to {addr}"));
    // Not started yet: it is still waiting a moment later.
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(agent.try_wait().unwrap().is_none(), "the agent ran before its start");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(agent.id() as i32), nix::sys::signal::SIGUSR1).unwrap();
    let mut out = String::new();
    agent.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    assert!(agent.wait().unwrap().success());
    let doc = common::valid_document(&out, "rr-clients");
    let responses = doc["report"]["responses"].as_u64().unwrap();
    assert!(responses > 50, "{doc}");
    let hist = netlane::metrics::hist::Hist::decode(doc["agent"]["latency_hdr"].as_str().unwrap()).unwrap();
    assert_eq!(hist.count(), responses);
    drop(server);
}

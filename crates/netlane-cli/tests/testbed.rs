//! `netlane lab --testbed`: the lab on machines it reaches only over SSH (namespaces of
//! this machine running Debian's sshd, `netlane_testkit::sshd`, on one bridged network):
//! the kv, rr and lanes scenarios' servers on the server host, their load from two
//! client hosts as agents of one merged measurement; nvme's target there, nvme perf on
//! the first client host; udp-bulk and udp-pacing from the server host to the first
//! client host. Needs root and openssh-server.

mod common;

use std::path::Path;

use netlane_testkit::sshd::SshHosts;

fn testbed(hosts: &SshHosts, dir: &Path, extra_client: &str) -> std::path::PathBuf {
    let file = dir.join("testbed.toml");
    std::fs::write(
        &file,
        format!(
            "ssh_config = {:?}\nnetlane = {:?}\n\n[server]\nssh = \"server\"\naddr = \"10.78.0.1\"\ncpus = \"1\"\n\n\
             [[clients]]\nssh = \"client1\"\ncpus = \"0\"\n{extra_client}\n[[clients]]\nssh = \"client2\"\ncpus = \"0\"\n",
            hosts.config.display().to_string(),
            env!("CARGO_BIN_EXE_netlane"),
        ),
    )
    .unwrap();
    file
}

/// The machine to one testbed test at a time: their runs pin the same CPUs, and some
/// judge what they measure.
fn one_testbed() -> common::Alone {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    common::alone(&ONE)
}

/// Three SSH hosts on one bridge (the server at 10.78.0.1, the clients at .2 and .3), a
/// folder for `test`, and [`one_testbed`]'s hold; none when it cannot run here (not root,
/// said by the testkit).
fn bridged(test: &str) -> Option<(SshHosts, std::path::PathBuf, common::Alone)> {
    if !netlane_testkit::privileged(test) {
        return None;
    }
    let alone = one_testbed();
    let hosts = SshHosts::start(&["server", "client1", "client2"]).unwrap();
    hosts.bridge("10.78.0").unwrap();
    let dir = common::temp_dir(test);
    std::fs::create_dir_all(&dir).unwrap();
    Some((hosts, dir, alone))
}

/// `netlane bench ARGS --json -`, which must succeed: its one scenario's report.
fn bench(args: &[&str]) -> serde_json::Value {
    let o = common::netlane(&[&["bench"], args, &["--json", "-"]].concat());
    assert!(o.status.success(), "{}", common::stderr(&o));
    common::valid_document(&common::stdout(&o), "results")["scenarios"][0].clone()
}

#[test]
fn the_quick_lab_runs_nvme_rr_and_kv_on_a_testbed_of_ssh_hosts_and_leaves_nothing_behind() {
    let Some((hosts, dir, _alone)) =
        bridged("the_quick_lab_runs_nvme_rr_and_kv_on_a_testbed_of_ssh_hosts_and_leaves_nothing_behind")
    else {
        return;
    };
    let file = testbed(&hosts, &dir, "");
    let out = dir.join("report");
    // The soak has a test of its own (below). nvme's caravan sweep is left out: its runs
    // cross the hosts as the QD32 part's do, eight more of them.
    let o = common::netlane(&[
        "lab",
        "--quick",
        "--only",
        "udp-bulk,lb-pps,nvme,rr,kv",
        "--set",
        "nvme.parts=qd1,qd32,mixed,affinity",
        "--testbed",
        file.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--json",
        "-",
    ]);
    let err = common::stderr(&o);
    assert!(o.status.success(), "{err}");
    // Every scenario that builds its network here is named as left out, and udp-bulk
    // (the first client has no `addr` to receive at; its own test below gives one).
    assert!(err.contains("not run on the testbed") && err.contains("udp-bulk") && err.contains("lb-pps"), "{err}");
    let doc = common::valid_document(&common::stdout(&o), "results");
    let scenarios = doc["scenarios"].as_array().unwrap();
    let names: Vec<&str> = scenarios.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["nvme", "rr", "kv"], "{doc}");
    nvme_ran_across_hosts(&scenarios[0]);
    rr_ran_across_hosts(&scenarios[1]);
    let kv = &scenarios[2];
    let note = kv["notes"][0].as_str().unwrap();
    assert!(
        note.contains("the server on host server at 10.78.0.1")
            && note.contains("host client1, host client2 (agents of one merged measurement)"),
        "{note}"
    );
    // Both servers ran at both rates, each run measured (merged from both agents).
    let runs = kv["runs"].as_array().unwrap();
    for who in ["netlane 10000/s", "netlane 20000/s", "memcached 10000/s", "memcached 20000/s"] {
        let run = runs.iter().find(|r| r["label"].as_str().is_some_and(|w| w.starts_with(who)));
        let run = run.unwrap_or_else(|| panic!("no run {who}: {runs:?}"));
        let achieved = run["metrics"]["achieved_per_s"].as_f64().unwrap_or(0.0);
        assert!(achieved > 1000.0, "{who}: {run}");
    }
    assert!(kv["checks"].as_array().is_some_and(|c| !c.is_empty()), "{kv}");
    // Each agent's part beside the merged runs, and the CPUs named by host.
    let agents = kv["tables"].as_array().unwrap().iter().find(|t| t["name"] == "kv-agents").expect("an agents table");
    assert_eq!(agents["rows"].as_array().unwrap().len(), 8, "2 servers x 2 rates x 2 agents: {agents}");
    let plan: Vec<&str> = kv["cpu_plan"].as_array().unwrap().iter().map(|r| r["role"].as_str().unwrap()).collect();
    assert_eq!(plan, ["server on host server", "generator on host client1", "generator on host client2"]);
    // The sessions' sshd processes end as their connections close.
    for h in &hosts.hosts {
        h.wait_until_bare(false, std::time::Duration::from_secs(15)).unwrap();
    }
}

/// The nvme target on the server host, nvme perf on the first client host, the target's
/// CPU per I/O read there; the affinity part left out (that host's `cpus` is one CPU)
/// and said so.
fn nvme_ran_across_hosts(nvme: &serde_json::Value) {
    let notes: Vec<&str> = nvme["notes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    assert!(notes[0].contains("the target on host server at 10.78.0.1, nvme perf on host client1"), "{notes:?}");
    assert!(notes[1].contains("Left out on this testbed: the affinity part"), "{notes:?}");
    let runs = nvme["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3 + 4 + 3, "qd1, qd32, mixed: {runs:?}");
    for run in runs {
        assert!(run["metrics"]["iops"].as_f64().unwrap_or(0.0) > 100.0, "{run}");
        // The target's CPU per I/O from its CPU on the server host, over the window.
        assert!(run["metrics"]["target_cpu_us_per_io"].as_f64().is_some_and(|us| us > 0.0), "{run}");
    }
    assert!(notes[0].contains("The target's CPU per I/O is its CPU's busy time there"), "{notes:?}");
    let plan: Vec<&str> = nvme["cpu_plan"].as_array().unwrap().iter().map(|r| r["role"].as_str().unwrap()).collect();
    assert_eq!(plan, ["target on host server", "host on host client1"]);
}

/// The rr scenario's server on the server host, each run's clients split between the
/// two client hosts and merged; the MTU 9000 mode left out (the testbed's network is
/// MTU 1500) and said so; 8 KiB requests in fragments served on the recvmmsg and ring
/// paths, the rings reassembling them.
fn rr_ran_across_hosts(rr: &serde_json::Value) {
    let notes: Vec<&str> = rr["notes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    assert!(notes[0].contains("the server on host server at 10.78.0.1"), "{notes:?}");
    assert!(notes[1].starts_with("Left out on this testbed") && notes[1].contains("MTU 9000"), "{notes:?}");
    let runs = rr["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 5 + 2 + 3, "five paths, two large modes, three with fragmented requests: {runs:?}");
    for run in runs {
        let per_s = run["metrics"]["responses_per_s"].as_f64().unwrap_or(0.0);
        assert!(per_s > 1000.0, "{run}");
        assert_eq!(run["metrics"]["lost"].as_f64(), Some(0.0), "{run}");
    }
    let agents = rr["tables"].as_array().unwrap().iter().find(|t| t["name"] == "rr-agents").expect("an agents table");
    let rows = agents["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 10 * 2, "10 runs x 2 agents: {agents}");
    let reassembled: Vec<u64> = runs
        .iter()
        .filter(|r| r["label"].as_str().is_some_and(|l| l.contains("requests fragmented") && l.contains("tpacket")))
        .map(|r| r["detail"]["server"]["ring_reassembled"].as_u64().unwrap())
        .collect();
    assert!(reassembled.len() == 2 && reassembled.iter().all(|n| *n > 1000), "{reassembled:?}");
    let plan: Vec<&str> = rr["cpu_plan"].as_array().unwrap().iter().map(|r| r["role"].as_str().unwrap()).collect();
    assert_eq!(plan, ["server on host server", "generator on host client1", "generator on host client2"]);
}

/// `bench udp-bulk --testbed`: the sender on the server host, the receiver on the first
/// client host at its `addr`, each end a process there; both machines' CPU counted; the
/// NIC settings the file gives held on each host while it runs and put back.
#[test]
fn udp_bulk_runs_from_the_server_host_to_the_first_client_host() {
    let Some((hosts, dir, _alone)) = bridged("udp_bulk_runs_from_the_server_host_to_the_first_client_host") else {
        return;
    };
    let file =
        testbed(&hosts, &dir, "addr = \"10.78.0.2\"\niface = \"eth0\"\nnic = [\"channels.rx=1\"]\nxps = \"0\"\n");
    // NIC settings held while it runs: those the server's bridge refuses (coalescing, RSS),
    // those the client's veth takes; all said, and the taken ones put back.
    let text = std::fs::read_to_string(&file).unwrap().replacen(
        "cpus = \"1\"\n",
        "cpus = \"1\"\niface = \"br0\"\nnic = [\"coalesce.rx-usecs=10\"]\nrss = \"equal 1\"\n",
        1,
    );
    std::fs::write(&file, text).unwrap();
    let r = &bench(&[
        "udp-bulk",
        "--testbed",
        file.to_str().unwrap(),
        "--tx-cpu",
        "1",
        "--rx-cpu",
        "0",
        "--modes",
        "tcp,udp,gso,gso-sw",
        "--repeat",
        "1",
        "-t",
        "500ms",
    ]);
    assert!(
        r["notes"][0]
            .as_str()
            .unwrap()
            .contains("the sender on host server, the receiver on host client1 at 10.78.0.2"),
        "{r}"
    );
    let notes: Vec<&str> = r["notes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    let held = |who: &str| notes.iter().find(|n| n.starts_with(&format!("NIC settings held on {who}")));
    let server = held("server (host server) br0").unwrap_or_else(|| panic!("{notes:?}"));
    assert!(
        server.contains("coalesce of br0: rx-usecs=10: refused: ") && server.contains("Operation not supported"),
        "{server}"
    );
    assert!(server.contains("RSS of br0: equal 1: refused: ethtool -x br0: Operation not supported"), "{server}");
    let client = held("client 1 (host client1) eth0").unwrap_or_else(|| panic!("{notes:?}"));
    assert!(
        client.contains(
            "channels of eth0: rx=1: applied, reads rx=1; tx-0 xps_cpus (CPU 0) of eth0: 00000001: applied, reads 1. \
             All put back as they were."
        ),
        "{client}"
    );
    // The testbed's NIC is not the lab's to switch offloads on.
    assert!(notes.iter().any(|n| n.starts_with("Left out: gso-sw")), "{notes:?}");
    let runs = r["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3, "tcp, udp, gso; no udpgso_bench_tx across hosts: {runs:?}");
    for run in runs {
        let m = &run["metrics"];
        assert!(m["rx_mb_per_s"].as_f64().unwrap_or(0.0) > 1.0, "{run}");
        assert!(m["system_cpu_s_per_gb"].as_f64().unwrap_or(0.0) > 0.0, "{run}");
        // The receiver's CPU, read on the receiver's host.
        assert!(m["receiving_cpu_s_per_gb"].as_f64().unwrap_or(0.0) > 0.0, "{run}");
    }
    let plan: Vec<&str> = r["cpu_plan"].as_array().unwrap().iter().map(|r| r["role"].as_str().unwrap()).collect();
    assert_eq!(plan, ["sender on host server", "receiver on host client1"]);
    for h in &hosts.hosts {
        h.wait_until_bare(false, std::time::Duration::from_secs(15)).unwrap();
    }
    udp_pacing_runs_behind_a_bottleneck_on_the_server_host(&file);
    for h in &hosts.hosts {
        h.wait_until_bare(false, std::time::Duration::from_secs(15)).unwrap();
    }
    // Threads cannot run on another machine: said before anything runs.
    let o = common::netlane(&["bench", "udp-bulk", "--testbed", file.to_str().unwrap(), "--ends", "thread"]);
    assert!(
        common::stderr(&o).contains("--ends thread: on a testbed each end runs as a process"),
        "{}",
        common::stderr(&o)
    );
}

#[test]
fn a_testbed_that_lacks_what_a_scenario_needs_is_refused_host_by_host() {
    if !netlane_testkit::privileged("a_testbed_that_lacks_what_a_scenario_needs_is_refused_host_by_host") {
        return;
    }
    let hosts = SshHosts::start(&["server", "client1", "client2"]).unwrap();
    let dir = common::temp_dir("testbed-refused");
    std::fs::create_dir_all(&dir).unwrap();
    let file = testbed(&hosts, &dir, "iface = \"nosuch0\"\n");
    let text = std::fs::read_to_string(&file).unwrap().replace("cpus = \"1\"", "cpus = \"1,4095\"");
    std::fs::write(&file, text).unwrap();
    let o = common::netlane(&["lab", "--quick", "--only", "kv", "--testbed", file.to_str().unwrap(), "--json", "-"]);
    let err = common::stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("server (host server): no CPU 4095"), "{err}");
    assert!(err.contains("client 1 (host client1): no interface nosuch0"), "{err}");
    assert!(common::stdout(&o).is_empty());
    // A scenario that cannot run across hosts, asked for alone.
    let o = common::netlane(&["lab", "--only", "lb-pps", "--testbed", file.to_str().unwrap()]);
    assert!(
        common::stderr(&o).contains(
            "no scenario asked for runs across hosts (udp-bulk, with an `addr` for the first client, udp-pacing, \
             with that and an `iface` for the server, lanes, with that `iface`, nvme, rr, kv and soak do)"
        ),
        "{}",
        common::stderr(&o)
    );
}

#[test]
fn a_lab_killed_mid_run_leaves_nothing_on_any_host() {
    let Some((hosts, dir, _alone)) = bridged("a_lab_killed_mid_run_leaves_nothing_on_any_host") else { return };
    let file = testbed(&hosts, &dir, "");
    let mut lab = common::Reaped(
        std::process::Command::new(env!("CARGO_BIN_EXE_netlane"))
            .args([
                "lab",
                "--quick",
                "--testbed",
                file.to_str().unwrap(),
                "--out",
                dir.join("report").to_str().unwrap(),
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Killed outright (no handler runs) once a server and the agents are up.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let busy = |h: &netlane_testkit::sshd::SshdHost| !h.roles().is_empty();
    while !(busy(&hosts.hosts[0]) && busy(&hosts.hosts[1])) {
        assert!(std::time::Instant::now() < deadline, "the lab never ran its roles");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(lab.id() as i32), nix::sys::signal::SIGKILL).unwrap();
    lab.wait().unwrap();
    for h in &hosts.hosts {
        h.wait_until_bare(false, std::time::Duration::from_secs(15)).unwrap();
    }
}

/// rr's wall on a testbed of two client hosts: a population of one client runs on one
/// host, larger ones on both as agents.
#[test]
fn an_rr_population_smaller_than_the_client_hosts_runs_on_as_many_as_it_has_clients() {
    let Some((hosts, dir, _alone)) =
        bridged("an_rr_population_smaller_than_the_client_hosts_runs_on_as_many_as_it_has_clients")
    else {
        return;
    };
    let file = testbed(&hosts, &dir, "");
    let r = &bench(&[
        "rr",
        "--testbed",
        file.to_str().unwrap(),
        "--parts",
        "wall",
        "--paths",
        "recvfrom",
        "--repeat",
        "1",
        "-t",
        "200ms",
        "--ramp",
        "100ms",
    ]);
    assert_eq!(r["runs"].as_array().unwrap().len(), 8, "{r}");
    let agents = r["tables"].as_array().unwrap().iter().find(|t| t["name"] == "rr-agents").expect("an agents table");
    let rows = |run: &str| agents["rows"].as_array().unwrap().iter().filter(|row| row["run"] == run).count();
    assert_eq!(rows("wall recvfrom x1"), 0, "one client: one host alone, no agents: {agents}");
    assert_eq!(rows("wall recvfrom x2"), 2, "{agents}");
    assert_eq!(rows("wall recvfrom x128"), 2, "{agents}");
}

/// `bench udp-pacing --testbed` (on udp-bulk's testbed): the sender on the server host
/// behind a tbf bottleneck on its `iface`, held there while the sweep runs and removed
/// after; the bottleneck's drops read there around each run: a burst of the bytes a
/// paced run spreads loses far more at the bottleneck than the paced run.
fn udp_pacing_runs_behind_a_bottleneck_on_the_server_host(file: &Path) {
    let r = &bench(&[
        "udp-pacing",
        "--testbed",
        file.to_str().unwrap(),
        "--tx-cpu",
        "1",
        "--rx-cpu",
        "0",
        "--bottleneck",
        "10MB/s",
        "--quanta",
        "1ms,unpaced",
        "--repeat",
        "1",
        "-t",
        "500ms",
    ]);
    let notes: Vec<&str> = r["notes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    assert!(notes[0].contains("the sender on host server behind a tbf bottleneck on br0"), "{notes:?}");
    let tbf = notes.iter().find(|n| n.contains("tbf root qdisc of br0")).unwrap_or_else(|| panic!("{notes:?}"));
    assert!(tbf.contains("applied, reads tbf") && tbf.contains("All put back as they were."), "{tbf}");
    let runs = r["runs"].as_array().unwrap();
    let drops = |label: &str| {
        let run = runs.iter().find(|r| r["label"].as_str().is_some_and(|l| l.starts_with(label)));
        let run = run.unwrap_or_else(|| panic!("no run {label}: {runs:?}"));
        assert!(run["metrics"]["rx_mb_per_s"].as_f64().unwrap_or(0.0) > 1.0, "{run}");
        run["metrics"]["bottleneck_drops"].as_f64().unwrap()
    };
    let (paced, unpaced) = (drops("1ms"), drops("unpaced"));
    assert!(unpaced > 0.0 && paced < unpaced, "paced {paced} unpaced {unpaced}: {runs:?}");
}

/// `bench lanes --testbed`: the cache server on the server host, a lane per CPU the file
/// gives it on its `iface` (a veth with NAPI, GRO on, its NAPI threaded as the file
/// asks), the load from both client hosts as agents; napi mode places the connections by
/// NAPI id there; napi-busy's per-NAPI knobs are set there and put back; the isolation
/// part is left out and said so.
#[test]
fn lanes_run_on_the_server_hosts_interface() {
    if !netlane_testkit::privileged("lanes_run_on_the_server_hosts_interface") {
        return;
    }
    let _alone = one_testbed();
    // A hub of its own: the server's interface is a veth (a port of the hub's bridge).
    let hosts = SshHosts::start(&["hub", "server", "client1", "client2"]).unwrap();
    hosts.bridge("10.79.0").unwrap();
    // The server's veth has NAPI once GRO is on, and TCP takes it when the hub's port
    // towards it does not send TSO trains (veth passes those around NAPI): what a NIC
    // does anyway.
    let features = |host: usize, dev: &'static str, f: &'static [(&'static str, bool)]| {
        hosts.hosts[host]
            .ns
            .run(move || netlane::topology::ethtool::Ethtool::open().unwrap().set_features(dev, f).unwrap())
            .unwrap()
    };
    features(1, "eth0", &[("rx-gro", true)]);
    features(0, "p1", &[("tx-tcp-segmentation", false), ("tx-tcp6-segmentation", false)]);
    let dir = common::temp_dir("testbed-lanes");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("testbed.toml");
    std::fs::write(
        &file,
        format!(
            "ssh_config = {:?}\nnetlane = {:?}\n\n[server]\nssh = \"server\"\naddr = \"10.79.0.2\"\niface = \"eth0\"\n\
             cpus = \"1\"\nthreaded = true\n\n[[clients]]\nssh = \"client1\"\ncpus = \"0\"\n[[clients]]\nssh = \
             \"client2\"\ncpus = \"0\"\n",
            hosts.config.display().to_string(),
            env!("CARGO_BIN_EXE_netlane"),
        ),
    )
    .unwrap();
    // Two lanes need a device with two receive queues: without, the NAPI modes are left
    // out (here nothing else is asked for).
    let two = dir.join("two-lanes.toml");
    std::fs::write(&two, std::fs::read_to_string(&file).unwrap().replacen("cpus = \"1\"", "cpus = \"0-1\"", 1))
        .unwrap();
    let o = common::netlane(&["bench", "lanes", "--testbed", two.to_str().unwrap(), "--modes", "napi", "--no-search"]);
    assert_eq!(o.status.code(), Some(1), "{}", common::stderr(&o));
    assert!(
        common::stderr(&o)
            .contains("napi (eth0 on server (host server): eth0 has 1 receive queues, not 2 for 2 lanes)"),
        "{}",
        common::stderr(&o)
    );
    let r = &bench(&[
        "lanes",
        "--testbed",
        file.to_str().unwrap(),
        "--modes",
        "plain,napi,napi-busy",
        "--napi-defer-hard-irqs",
        "2",
        "--gro-flush-timeout",
        "20us",
        "--no-search",
        "--connections",
        "16",
        "--rates",
        "2000",
        "--repeat",
        "1",
        "-t",
        "1s",
        "--keys",
        "10000",
    ]);
    let notes: Vec<&str> = r["notes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    assert!(
        notes[0].contains("the server on host server at 10.79.0.2") && notes[0].contains("1 lanes on eth0 (CPUs 1)")
    );
    assert!(notes[1].starts_with("Left out on this testbed: the isolation part"), "{notes:?}");
    let held = notes.iter().find(|n| n.contains("threaded NAPI of eth0")).unwrap_or_else(|| panic!("{notes:?}"));
    assert!(held.contains("applied, reads 1") && held.contains("All put back as they were."), "{held}");
    let runs = r["runs"].as_array().unwrap();
    for mode in ["plain", "napi", "napi-busy"] {
        let run = runs.iter().find(|x| x["label"].as_str().is_some_and(|l| l.starts_with(&format!("{mode} 16"))));
        let run = run.unwrap_or_else(|| panic!("no {mode} run: {runs:?}"));
        assert!(run["metrics"]["achieved_per_s"].as_f64().unwrap_or(0.0) > 1000.0, "{run}");
    }
    // napi mode: every connection placed by the lane owning its NAPI id.
    let t = r["tables"].as_array().unwrap().iter().find(|t| t["name"] == "lanes-placement").expect("placement");
    let rows = t["rows"].as_array().unwrap();
    let napi = rows.iter().find(|row| row["lane"] == "napi lane 0").unwrap_or_else(|| panic!("{t}"));
    assert!(napi["by_owner"].as_f64().unwrap_or(0.0) >= 16.0 && napi["other"].as_f64() == Some(0.0), "{t}");
    // napi-busy's per-NAPI knobs: set by the server there (none refused), put back by it.
    assert!(
        notes.iter().any(|n| n.starts_with("The busy-polling modes' per-NAPI knobs set on eth0's NAPI instances")),
        "{notes:?}"
    );
    assert!(!notes.iter().any(|n| n.contains("was refused")), "{notes:?}");
    let after = hosts.hosts[1].ns.run(|| netlane::nic::show("eth0").unwrap()).unwrap();
    assert!(!after.napis.is_empty(), "{after:?}");
    for n in &after.napis {
        assert_eq!((n.defer_hard_irqs, n.gro_flush_timeout_ns), (Some(0), Some(0)), "{after:?}");
    }
    for h in &hosts.hosts {
        h.wait_until_bare(false, std::time::Duration::from_secs(15)).unwrap();
    }
}

/// The soak across hosts: each server on the server host, its memory and descriptors
/// sampled there by its supervisor; the valid client on the first client host, the
/// hostile ones (`netlane hostile`) on the second; the balancer left out and said so.
#[test]
fn the_soak_runs_its_servers_on_the_server_host_and_its_clients_on_the_client_hosts() {
    let Some((hosts, dir, _alone)) =
        bridged("the_soak_runs_its_servers_on_the_server_host_and_its_clients_on_the_client_hosts")
    else {
        return;
    };
    let file = testbed(&hosts, &dir, "");
    let before = soak_dirs();
    let r = &bench(&["soak", "--testbed", file.to_str().unwrap(), "--servers", "kv,nvme,lb", "--time", "3s"]);
    let notes: Vec<&str> = r["notes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    assert!(
        notes[0].contains("each server on server (host server) at 10.78.0.1")
            && notes[0].contains(
                "the valid client on client 1 (host client1), the hostile clients on client 2 (host client2)"
            ),
        "{notes:?}"
    );
    assert!(notes.iter().any(|n| n.starts_with("Left out on this testbed: lb")), "{notes:?}");
    let rows = r["tables"][0]["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "kv and nvme: {rows:?}");
    for row in rows {
        let v = |k: &str| row[k].as_f64().unwrap_or(0.0);
        assert!(v("valid") > 1000.0 && v("hostile") > 100.0, "{row}");
        // Sampled on the server host: its supervisor's lines, none left in the output.
        assert!(v("peak_rss_mib") > 1.0 && v("peak_fds") > 3.0, "{row}");
    }
    let checks = r["checks"].as_array().unwrap();
    assert_eq!(checks.len(), 9, "4 each, and nvme's read-back: {checks:?}");
    // Nothing lost and every block read back; the latency and memory bounds are checked
    // too, but this machine's two CPUs run other tests beside it.
    assert!(checks.iter().all(|c| c["outcome"] != "invalid"), "{checks:?}");
    let what = |c: &&serde_json::Value| c["name"].as_str().unwrap_or("").to_string();
    let lossless: Vec<_> =
        checks.iter().filter(|c| what(c).contains("failed or were lost") || what(c).contains("read back")).collect();
    assert_eq!(lossless.len(), 3, "{checks:?}");
    assert!(lossless.iter().all(|c| c["outcome"] == "met"), "{checks:?}");
    for h in &hosts.hosts {
        h.wait_until_bare(false, std::time::Duration::from_secs(15)).unwrap();
    }
    assert_eq!(soak_dirs(), before, "the NVMe target's directory on the server host is removed");
    // Killed outright while the target runs: its directory goes with the session.
    let mut soak = common::Reaped(
        std::process::Command::new(env!("CARGO_BIN_EXE_netlane"))
            .args(["bench", "soak", "--testbed", file.to_str().unwrap(), "--servers", "nvme", "--time", "30s"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while hosts.hosts[0].roles().iter().filter(|(_, comm)| comm == "netlane").count() < 2 {
        assert!(std::time::Instant::now() < deadline, "the soak never started its target");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_ne!(soak_dirs(), before, "a directory for the target's file");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(soak.id() as i32), nix::sys::signal::SIGKILL).unwrap();
    soak.wait().unwrap();
    for h in &hosts.hosts {
        h.wait_until_bare(false, std::time::Duration::from_secs(15)).unwrap();
    }
    assert_eq!(soak_dirs(), before, "the directory removed as the session ended");
}

/// The soak directories in /tmp (the hosts are namespaces of this machine: one /tmp).
fn soak_dirs() -> Vec<String> {
    let mut d: Vec<String> = std::fs::read_dir("/tmp")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("netlane-soak-"))
        .collect();
    d.sort();
    d
}

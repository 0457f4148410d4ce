//! `netlane clean` on what killed netlane processes left behind (namespaces, the
//! processes still in them, qdiscs, cgroups, per-NAPI settings and XPS maps), each test
//! leaving something on purpose and checking what clean says of it. Needs root.

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{Reaped, netlane, stderr, stdout, temp_dir, veth_pair};

fn privileged(test: &str) -> bool {
    netlane_testkit::privileged(test)
}

/// One test of this file at a time: each leaves something behind and then runs `netlane
/// clean`, which would also remove what another test left before that one's clean said so.
fn one_clean_at_a_time() -> common::Alone {
    static CLEAN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    common::alone(&CLEAN)
}

/// The process ids of `comm` processes whose parent is `parent`.
fn children_named(parent: u32, comm: &str) -> Vec<u32> {
    let Ok(procs) = std::fs::read_dir("/proc") else { return Vec::new() };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            // pid (comm) state ppid ...
            let Some((name, rest)) = stat.split_once(") ") else { return false };
            name.ends_with(&format!("({comm}")) && rest.split_whitespace().nth(1) == Some(&parent.to_string())
        })
        .collect()
}

#[test]
fn topo_clean_removes_only_stale_namespaces() {
    if !privileged("topo_clean_removes_only_stale_namespaces") {
        return;
    }
    let _clean = one_clean_at_a_time();
    // A namespace named like one of a netlane process that no longer exists.
    let stale = "nl-999999999-0-stale-test";
    let st = Command::new("ip").args(["netns", "add", stale]).status().unwrap();
    assert!(st.success());
    let o = netlane(&["topo", "list"]);
    assert!(stdout(&o).contains(stale) && stdout(&o).contains("stale"), "{}", stdout(&o));
    // A process still running inside it (a server a killed run left) is ended first:
    // it would keep the namespace alive.
    let mut inside = Reaped(Command::new("ip").args(["netns", "exec", stale, "sleep", "60"]).spawn().unwrap());
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::fs::read_to_string(format!("/proc/{}/comm", inside.id())).unwrap_or_default().trim() != "sleep" {
        assert!(Instant::now() < deadline, "sleep did not start in {stale}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = netlane(&["topo", "clean"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains(&format!("removed namespace {stale}")), "{}", stdout(&o));
    assert!(
        stdout(&o).contains(&format!("ended sleep (pid {}), still running in {stale}", inside.id())),
        "{}",
        stdout(&o)
    );
    assert!(inside.wait().unwrap().signal().is_some(), "sleep was ended by a signal");
    assert!(!Path::new("/run/netns").join(stale).exists());
}

#[test]
fn a_lab_run_killed_with_sigkill_takes_memcached_with_it_and_clean_removes_its_namespaces() {
    if !privileged("a_lab_run_killed_with_sigkill_takes_memcached_with_it_and_clean_removes_its_namespaces") {
        return;
    }
    let _clean = one_clean_at_a_time();
    let dir = temp_dir("killed-lab");
    let mut lab = Reaped(
        Command::new(env!("CARGO_BIN_EXE_netlane"))
            .args(["lab", "--quick", "--only", "kv", "--out", dir.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = lab.id();
    // memcached runs (under taskset, which executes it) as the lab's child.
    let deadline = Instant::now() + Duration::from_secs(180);
    let memcached = loop {
        if let Some(&m) = children_named(pid, "memcached").first() {
            break m;
        }
        assert!(lab.try_wait().unwrap().is_none(), "the lab ended before memcached started");
        assert!(Instant::now() < deadline, "memcached did not start within 180 s");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap().success());
    lab.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let gone = || {
        std::fs::read_to_string(format!("/proc/{memcached}/stat"))
            .map_or(true, |s| s.split_once(") ").is_some_and(|(_, r)| r.starts_with('Z')))
    };
    while !gone() {
        assert!(Instant::now() < deadline, "memcached {memcached} outlived the lab it served");
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = netlane(&["clean"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let left: Vec<String> = netlane::topology::netns_names()
        .into_iter()
        .filter(|n| netlane::topology::registry::owner_pid(n) == Some(pid))
        .collect();
    assert!(left.is_empty(), "still there after netlane clean: {left:?}; it said {}", stdout(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

/// SIGKILL gives no destructor a chance: `app shape` leaves its htb qdisc shaping the
/// device and `app run` its cgroup (its program dies with it). Both were recorded when
/// made, and `netlane clean` undoes them and says so.
#[test]
fn what_a_killed_app_shape_and_app_run_leave_netlane_clean_undoes() {
    if !privileged("what_a_killed_app_shape_and_app_run_leave_netlane_clean_undoes") {
        return;
    }
    let _clean = one_clean_at_a_time();
    let (a, _b) = veth_pair("cli-clean", ("cl0", "cl1"), 232);
    let root_qdisc = || {
        a.run(|| {
            let mut r = netlane::topology::Rtnl::open().unwrap();
            let i = r.link_index("cl0").unwrap();
            r.root_qdisc(i).unwrap().map(|(kind, _)| kind)
        })
        .unwrap()
    };
    let kill = |pid: u32| assert!(Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap().success());
    let wait_for = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };

    let mut shape = Reaped(
        a.command(env!("CARGO_BIN_EXE_netlane"))
            .args(["app", "shape", "--dev", "cl0", "--link", "1gbit", "--app", "a:1:1mbit:2mbit", "--backend", "htb"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // The classifier is attached last: once the classes are there, the shaper is up.
    wait_for("app shape never installed its qdisc", &|| root_qdisc().as_deref() == Some("htb"));
    std::thread::sleep(Duration::from_millis(300));
    kill(shape.id());
    shape.wait().unwrap();
    assert_eq!(root_qdisc().as_deref(), Some("htb"), "SIGKILL leaves the qdisc shaping the device");

    let mut run = Reaped(
        Command::new(env!("CARGO_BIN_EXE_netlane"))
            .args(["app", "run", "--name", "cli-kill", "--mark", "1", "--", "sleep", "60"])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let sleeper = || children_named(run.0.id(), "sleep").first().copied();
    wait_for("app run never started its program", &|| sleeper().is_some());
    let program = sleeper().unwrap();
    let cgroup = std::fs::read_to_string(format!("/proc/{program}/cgroup")).unwrap();
    assert!(cgroup.trim_end().ends_with("-cli-kill"), "{cgroup}");
    let (run_pid, shape_pid) = (run.id(), shape.id());
    kill(run_pid);
    run.wait().unwrap();
    wait_for("the program outlived app run", &|| !Path::new(&format!("/proc/{program}")).exists());

    let o = netlane(&["clean"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let said = stdout(&o);
    assert!(
        said.contains(&format!("htb root qdisc on cl0 (namespace {}) (left by pid {shape_pid}): removed", a.name())),
        "{said}"
    );
    assert!(said.contains(&format!("netlane-{run_pid}-cli-kill (left by pid {run_pid}): removed")), "{said}");
    assert_ne!(root_qdisc().as_deref(), Some("htb"), "the qdisc is gone");
    let cg2 = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let cg2 = cg2.lines().find(|l| l.contains(" - cgroup2 ")).and_then(|l| l.split_whitespace().nth(4)).unwrap();
    assert!(!Path::new(cg2).join(format!("netlane-{run_pid}-cli-kill")).exists());
    // Nothing is left to do the second time.
    let o = netlane(&["clean"]);
    assert!(!stdout(&o).contains(&format!("pid {shape_pid}")) && !stdout(&o).contains(&format!("pid {run_pid}")));
}

/// `kv serve` with lanes changes per-NAPI settings and XPS maps on its device: put back
/// when it stops, and by `netlane clean` after a SIGKILL.
#[test]
fn per_napi_settings_and_xps_maps_a_killed_kv_serve_changed_netlane_clean_puts_back() {
    use netlane::topology::{LinkConfig, RxTuning, TwoHosts};
    if !privileged("per_napi_settings_and_xps_maps_a_killed_kv_serve_changed_netlane_clean_puts_back") {
        return;
    }
    let _clean = one_clean_at_a_time();
    let h = TwoHosts::create("cli-napi", LinkConfig { mtu: 1500, queues: 2, rx: RxTuning::threaded_napi() }).unwrap();
    let (dev, ifindex) = (h.rx_if.clone(), h.rx_index);
    // Each NAPI instance's GRO flush timeout and defer count, and each transmit queue's
    // XPS map, as the device's namespace shows them.
    let state = || {
        let d = dev.clone();
        let here = h.rx.run(netlane::topology::NetnsHandle::current).unwrap().unwrap();
        here.with_sysfs(move || {
            let mut nd = netlane::topology::netdev::Netdev::open().unwrap();
            let mut s: Vec<String> = nd
                .napis(ifindex)
                .unwrap()
                .iter()
                .map(|n| format!("napi {} {:?} {:?}", n.id, n.gro_flush_timeout_ns, n.defer_hard_irqs))
                .collect();
            for q in 0..2 {
                let xps = std::fs::read_to_string(format!("/sys/class/net/{d}/queues/tx-{q}/xps_rxqs")).unwrap();
                s.push(format!("tx-{q} {}", xps.trim()));
            }
            s
        })
        .unwrap()
    };
    let before = state();
    assert!(before.iter().filter(|s| s.starts_with("napi ")).count() == 2, "{before:?}");
    let serve = |port: &str| {
        let mut c = h.rx.command(env!("CARGO_BIN_EXE_netlane"));
        c.args(["kv", "serve", "--listen", &format!("{}:{port}", TwoHosts::RX_V4), "--lanes", "auto"])
            .args(["--lane-device", &dev, "--gro-flush-timeout", "20us", "--napi-defer-hard-irqs", "2", "--xps-rxqs"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = Reaped(c.spawn().unwrap());
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
        assert!(first.starts_with("listening on"), "{first}");
        child
    };
    let wait_gone = |child: &mut Reaped| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "kv serve did not stop");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    // SIGTERM: the server puts everything back itself.
    let mut s = serve("11311");
    let during = state();
    assert_ne!(during, before, "the settings were written");
    assert!(during.iter().any(|x| x.contains("Some(20000) Some(2)")), "{during:?}");
    assert!(Command::new("kill").args(["-TERM", &s.id().to_string()]).status().unwrap().success());
    wait_gone(&mut s);
    assert_eq!(state(), before, "a server stopped with SIGTERM puts its changes back");
    // SIGKILL: the changes stay, recorded; netlane clean puts them back.
    let mut s = serve("11312");
    let pid = s.id();
    assert!(Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap().success());
    wait_gone(&mut s);
    assert_eq!(state(), during, "SIGKILL leaves the settings");
    let o = netlane(&["clean"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let said = stdout(&o);
    assert!(said.contains(&format!("of {dev}: defer-hard-irqs=2,gro-flush-timeout=20000ns (was ")), "{said}");
    assert!(said.contains(&format!("(left by pid {pid}): restored to")) && said.contains("xps_rxqs"), "{said}");
    assert_eq!(state(), before, "netlane clean put back what the killed server changed");
}

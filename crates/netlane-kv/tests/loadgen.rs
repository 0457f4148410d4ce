//! The load generator against real servers (netlane's, memcached 1.6.18) and a fake
//! server that stalls, over loopback. No root needed.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use netlane_kv::load::schedule::{Arrivals, Pacing, Process};
use netlane_kv::load::workload::WorkloadSpec;
use netlane_kv::loadgen::{self, LoadConfig};
use netlane_kv::server::{Server, ServerConfig};
use netlane_kv::store::StoreConfig;

fn load(server: SocketAddr, pacing: Pacing) -> LoadConfig {
    LoadConfig {
        server,
        connections: 8,
        threads: 2,
        pacing,
        workload: WorkloadSpec { keys: 5000, ..WorkloadSpec::default() },
        duration: Duration::from_secs(1),
        drain: Duration::from_millis(500),
        ..LoadConfig::default()
    }
}

fn open(rate: f64) -> Pacing {
    Pacing::Open(Arrivals { process: Process::Poisson, rate_per_s: rate })
}

/// Warm-up, then an open-loop second at 5000/s: everything offered is answered, every
/// get hits.
fn check_open_loop(addr: SocketAddr) {
    let cfg = load(addr, open(5000.0));
    assert_eq!(loadgen::warm_up(&cfg).unwrap(), 5000);
    let r = loadgen::run(&cfg, &AtomicBool::new(false)).unwrap().report;
    let c = &r.counts;
    assert!(c.offered > 4000 && c.offered < 6000, "{r:?}");
    assert_eq!(c.completed, c.offered, "{r:?}");
    assert_eq!((c.errors, c.lost, c.unanswered, c.not_sent, c.misses), (0, 0, 0, 0, 0), "{r:?}");
    assert!(c.hits > 0 && c.stored > 0, "{r:?}");
    let l = r.latency_ns;
    assert!([l.p50, l.p90, l.p99, l.p999, l.p9999].iter().all(|v| v.is_some_and(|ns| ns > 0)), "{r:?}");
    assert!(l.count > 0 && l.min <= l.p50 && l.p9999 <= l.max && l.mean.is_some(), "{l:?}");
    assert!(r.client_cpu_s > 0.0);
}

#[test]
fn open_loop_against_netlanes_server() {
    let server = Server::start(ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        threads: 2,
        store: StoreConfig::new(64 << 20, 1 << 20, 8),
        ..ServerConfig::default()
    })
    .unwrap();
    check_open_loop(server.local_addr());
    let s = server.stop();
    assert!(s.protocol.0["get_hits"] > 3000, "{:?}", s.protocol);
}

#[test]
fn open_loop_against_memcached() {
    // An address no other test listens on, so the wait below cannot reach another
    // process that took the same port meanwhile.
    let port = TcpListener::bind("127.78.0.1:0").unwrap().local_addr().unwrap().port();
    let mut cmd = Command::new("memcached");
    cmd.args(["-l", "127.78.0.1", "-p", &port.to_string(), "-U", "0", "-t", "2"]);
    if nix::unistd::geteuid().is_root() {
        cmd.args(["-u", "root"]);
    }
    let mut child = cmd.spawn().expect("memcached (scripts/setup.sh installs it)");
    let addr = SocketAddr::from(([127, 78, 0, 1], port));
    let deadline = Instant::now() + Duration::from_secs(5);
    while TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "memcached did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let result = std::panic::catch_unwind(|| check_open_loop(addr));
    let _ = child.kill();
    let _ = child.wait();
    result.unwrap();
}

/// A server that answers every `get` with `END`, but stops answering for `stall` once,
/// `after` into the run.
fn stalling_server(after: Duration, stall: Duration) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t0 = Instant::now();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { return };
            std::thread::spawn(move || {
                let mut w = s.try_clone().unwrap();
                let mut stalled = false;
                for line in BufReader::new(s).lines() {
                    let Ok(line) = line else { return };
                    if !stalled && t0.elapsed() >= after {
                        stalled = true;
                        std::thread::sleep(stall.saturating_sub(t0.elapsed() - after));
                    }
                    if line.starts_with("get") && w.write_all(b"END\r\n").is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[test]
fn a_stall_shows_in_open_loop_latency_and_hides_in_closed_loop() {
    // Gets only, 4 connections, a 300 ms stall half a second in.
    let spec = WorkloadSpec { keys: 100, get_ratio: 1.0, ..WorkloadSpec::default() };
    let mut open_cfg = load(stalling_server(Duration::from_millis(500), Duration::from_millis(300)), open(4000.0));
    open_cfg.workload = spec;
    open_cfg.connections = 4;
    let open_run = loadgen::run(&open_cfg, &AtomicBool::new(false)).unwrap();
    let mut closed_cfg =
        load(stalling_server(Duration::from_millis(500), Duration::from_millis(300)), Pacing::Closed { depth: 1 });
    closed_cfg.workload = spec;
    closed_cfg.connections = 4;
    let closed_run = loadgen::run(&closed_cfg, &AtomicBool::new(false)).unwrap();
    let p90 = |r: &loadgen::Run| r.stats.latency_at(0.9).unwrap_or(u64::MAX);
    // Open loop: the ~1200 requests scheduled during the stall (a quarter of the run)
    // carry its delay, so p90 is tens of milliseconds.
    assert!(p90(&open_run) > 20_000_000, "open loop p90 {} ns: {:?}", p90(&open_run), open_run.report);
    // Closed loop: only the 4 requests in flight waited; the rest never were sent, so
    // p90 stays at the server's usual latency.
    assert!(p90(&closed_run) < 5_000_000, "closed loop p90 {} ns: {:?}", p90(&closed_run), closed_run.report);
    assert_eq!(open_run.report.counts.completed, open_run.report.counts.offered);
}

/// A server that answers `get`s with `END` and closes every other connection after its
/// tenth request.
fn closing_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for (n, s) in l.incoming().enumerate() {
            let Ok(s) = s else { return };
            std::thread::spawn(move || {
                let mut w = s.try_clone().unwrap();
                for (i, line) in BufReader::new(s).lines().enumerate() {
                    if n % 2 == 1 && i == 10 {
                        return;
                    }
                    let Ok(line) = line else { return };
                    if line.starts_with("get") && w.write_all(b"END\r\n").is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[test]
fn connections_the_server_closes_are_counted_and_the_run_ends_on_time() {
    // Before the fix a closed connection stayed queued for sending and the loop spun on
    // it for ever.
    let mut cfg = load(closing_server(), open(4000.0));
    cfg.workload = WorkloadSpec { keys: 100, get_ratio: 1.0, ..WorkloadSpec::default() };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(loadgen::run(&cfg, &AtomicBool::new(false)).map(|r| r.report));
    });
    let r = rx.recv_timeout(Duration::from_secs(10)).expect("a 1.5 s run did not end within 10 s").unwrap();
    let c = &r.counts;
    assert_eq!(r.connection_failures, 4, "{r:?}");
    assert!(c.not_sent > 1000 && c.completed > 1000, "{r:?}");
    // Every request offered in the window has an outcome (the lost may include requests
    // of the ramp, which are not offered in the window).
    assert!(c.completed + c.lost + c.not_sent >= c.offered, "{r:?}");
}

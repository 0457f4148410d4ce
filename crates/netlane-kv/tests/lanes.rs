//! Lanes over a two-queue veth between two namespaces (root): connections land on the
//! lane that owns the NAPI id (receive queue) their packets arrive through, by the
//! acceptor's hand-off and by the reuseport BPF selector; busy polling is applied and
//! read back; lanes added and removed while traffic flows lose no request.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use netlane::lanes::queues;
use netlane::topology::{LinkConfig, RxTuning, TwoHosts};
use netlane_kv::load::schedule::{Arrivals, Pacing, Process};
use netlane_kv::load::workload::WorkloadSpec;
use netlane_kv::loadgen::{self, LoadConfig};
use netlane_kv::server::{LanesView, Server, ServerConfig, Steer};
use netlane_kv::store::StoreConfig;
use netlane_testkit::privileged;

/// Two hosts joined by a veth with two queues, each with its NAPI instance (GRO on,
/// threaded; the client end's TSO off so that its TCP takes the NAPI path): flows
/// spread over the queues by their hash, as RSS spreads them.
fn hosts(label: &str) -> TwoHosts {
    let h = TwoHosts::create(label, LinkConfig { mtu: 1500, queues: 2, rx: RxTuning::threaded_napi() })
        .expect("two namespaces");
    h.set_tx_tso(false).expect("TSO off");
    h
}

fn config(h: &TwoHosts, steer: Steer, lanes: usize) -> ServerConfig {
    ServerConfig {
        listen: SocketAddr::new(h.rx_addr(false), 0),
        threads: lanes,
        store: StoreConfig::new(64 << 20, 1 << 20, 8),
        steer,
        lane_device: Some(h.rx_if.clone()),
        ..ServerConfig::default()
    }
}

fn start(h: &TwoHosts, cfg: ServerConfig) -> Server {
    h.rx.run(move || Server::start(cfg)).unwrap().expect("the server starts")
}

/// Opens `n` connections from the tx host, each answered once, and keeps them open.
fn connect(h: &TwoHosts, addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    h.tx.run(move || {
        (0..n)
            .map(|_| {
                let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                s.write_all(b"version\r\n").unwrap();
                let mut line = String::new();
                BufReader::new(&s).read_line(&mut line).unwrap();
                assert!(line.starts_with("VERSION "), "{line:?}");
                s
            })
            .collect()
    })
    .unwrap()
}

/// Every connection sits on the lane owning its NAPI id, the device's ids are split
/// between the lanes, and both lanes got connections (the flows spread).
fn assert_on_their_owners(v: &LanesView, device_ids: &[u32], n: u64) {
    let mut owned: Vec<u32> = v.lanes.iter().flat_map(|l| l.napi_ids.clone()).collect();
    owned.sort_unstable();
    let mut want = device_ids.to_vec();
    want.sort_unstable();
    assert_eq!(owned, want, "each of the device's NAPI ids has one owner: {v:?}");
    let by_owner: u64 = v.lanes.iter().map(|l| l.by_owner).sum();
    let others: u64 = v.lanes.iter().map(|l| l.new_id + l.no_napi + l.round_robin).sum();
    assert_eq!((by_owner, others), (n, 0), "{v:?}");
    assert_eq!(v.lanes.iter().map(|l| l.connections).sum::<u64>(), n, "{v:?}");
    assert!(v.lanes.iter().all(|l| l.connections > 0), "64 flows over two queues reach both: {v:?}");
}

#[test]
fn the_acceptor_hands_each_connection_to_the_lane_owning_its_napi_id() {
    if !privileged("the_acceptor_hands_each_connection_to_the_lane_owning_its_napi_id") {
        return;
    }
    let h = hosts("kv-lanes-acc");
    let rx_index = h.rx_index;
    let q = h.rx.run(move || queues::discover(rx_index)).unwrap().unwrap();
    assert_eq!(q.rx.len(), 2, "two receive queues with NAPI: {q:?}");
    let server = start(&h, config(&h, Steer::Acceptor, 2));
    let conns = connect(&h, server.local_addr(), 64);
    let v = server.lanes();
    assert_on_their_owners(&v, &q.napi_ids(), 64);
    assert_eq!(v.lanes.iter().map(|l| l.handed_over).sum::<u64>(), 0);
    drop(conns);
    server.stop();
}

#[test]
fn the_reuseport_selector_puts_each_connection_on_its_lanes_listener() {
    if !privileged("the_reuseport_selector_puts_each_connection_on_its_lanes_listener") {
        return;
    }
    let h = hosts("kv-lanes-rp");
    let rx_index = h.rx_index;
    let q = h.rx.run(move || queues::discover(rx_index)).unwrap().unwrap();
    let server = start(&h, config(&h, Steer::Reuseport, 2));
    let conns = connect(&h, server.local_addr(), 64);
    let v = server.lanes();
    assert_on_their_owners(&v, &q.napi_ids(), 64);
    // The kernel gave every SYN to the right listener: no lane handed one over.
    assert_eq!(v.lanes.iter().map(|l| l.handed_over).sum::<u64>(), 0, "{v:?}");
    assert!(v.steered_by_napi >= 64, "{v:?}");
    drop(conns);
    server.stop();
}

#[test]
fn busy_polling_is_applied_to_every_lane_and_read_back() {
    if !privileged("busy_polling_is_applied_to_every_lane_and_read_back") {
        return;
    }
    let h = hosts("kv-lanes-bp");
    let mut cfg = config(&h, Steer::Acceptor, 2);
    cfg.busy_poll = Some("20,16,prefer".parse().unwrap());
    cfg.xps_rxqs = true;
    cfg.napi.gro_flush_timeout_ns = Some(20_000);
    let server = start(&h, cfg);
    let conns = connect(&h, server.local_addr(), 8);
    let v = server.lanes();
    let epoll: Vec<_> = v.knobs.iter().filter(|k| k.name == "EPIOCSPARAMS").collect();
    assert_eq!(epoll.len(), 2, "one per lane: {v:?}");
    assert!(epoll.iter().all(|k| k.applied && k.detail == "20,16,prefer"), "{v:?}");
    assert_eq!(v.lanes.iter().map(|l| l.busy_poll_refused).sum::<u64>(), 0, "{v:?}");
    // Transmit queue i paired with receive queue i, read back from the namespace's sysfs.
    let xps: Vec<_> = v.knobs.iter().filter(|k| k.name.contains("xps_rxqs")).collect();
    assert_eq!(xps.len(), 2, "{v:?}");
    assert!(xps.iter().all(|k| k.applied), "{v:?}");
    assert!(xps.iter().any(|k| k.name.contains("tx-1") && k.detail.trim_start_matches('0') == "2"), "{v:?}");
    // The GRO flush timeout, per NAPI instance (napi-set) or per device (sysfs).
    assert!(
        v.knobs.iter().any(|k| k.applied && (k.name.starts_with("napi ") || k.name.contains("gro_flush_timeout"))),
        "{v:?}"
    );
    drop(conns);
    server.stop();
}

/// Replies by transmit queue, as shares of everything sent meanwhile, while `conns`
/// each make `turns` round trips; and the share of the connections on the lane owning
/// receive queue 0 (from the lanes' counts: connections on each lane now).
fn replies_by_queue(h: &TwoHosts, server: &Server, q0_napi: u32, conns: &mut [TcpStream], turns: usize) -> (f64, f64) {
    let dev = h.rx_if.clone();
    let read = || {
        let d = dev.clone();
        h.rx.run(move || netlane::nic::tx_queue_packets(&d)).unwrap().expect("per-queue counters")
    };
    let before = read();
    let mut line = String::new();
    for _ in 0..turns {
        for s in conns.iter_mut() {
            s.write_all(b"version\r\n").unwrap();
            line.clear();
            BufReader::new(&*s).read_line(&mut line).unwrap();
            assert!(line.starts_with("VERSION "), "{line:?}");
        }
    }
    let after = read();
    let sent: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert_eq!(sent.len(), 2, "two transmit queues: {sent:?}");
    let total = sent.iter().sum::<u64>() as f64;
    assert!(total >= (conns.len() * turns) as f64, "a reply per request at least: {sent:?}");
    let v = server.lanes();
    let on_q0: u64 = v.lanes.iter().filter(|l| l.napi_ids.contains(&q0_napi)).map(|l| l.connections).sum();
    let all: u64 = v.lanes.iter().map(|l| l.connections).sum();
    assert!(on_q0 > 0 && on_q0 < all, "the flows reach both queues: {v:?}");
    eprintln!("replies by transmit queue {sent:?}; connections on rx-0's lane {on_q0} of {all}");
    (sent[0] as f64 / total, on_q0 as f64 / all as f64)
}

#[test]
fn replies_leave_by_the_transmit_queue_paired_with_their_receive_queue() {
    if !privileged("replies_leave_by_the_transmit_queue_paired_with_their_receive_queue") {
        return;
    }
    let h = hosts("kv-lanes-xps");
    let (rx_index, dev) = (h.rx_index, h.rx_if.clone());
    let q = h.rx.run(move || queues::discover(rx_index)).unwrap().unwrap();
    let q0_napi = q.rx.iter().find(|r| r.queue == 0).expect("queue 0").napi_id;
    let (outcome, mq) = h.rx.run(move || netlane::nic::set_mq(&dev)).unwrap();
    let _mq = mq.unwrap_or_else(|| panic!("{outcome}"));
    let mut cfg = config(&h, Steer::Acceptor, 2);
    cfg.xps_rxqs = true;
    let server = start(&h, cfg);
    let addr = server.local_addr();
    // As the veth leaves it: the queue TCP recorded is not the one the packets came on
    // (a flow its peer sent by tx-1 is recorded as rx-0, one sent by tx-0 as none), so
    // xps_rxqs sends a share of about 1 - p/2 by tx-0 when p of the connections are on
    // rx-0: a share that only matches theirs near p = 2/3, so it is shown, not judged.
    let mut conns = connect(&h, addr, 32);
    let (tx0, conns0) = replies_by_queue(&h, &server, q0_napi, &mut conns, 20);
    eprintln!("without recording: replies by tx-0 {tx0:.2}, connections on rx-0 {conns0:.2}");
    drop(conns);
    // The next phase counts the lanes' connections: these must be gone from them first.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while server.lanes().lanes.iter().map(|l| l.connections).sum::<u64>() > 0 {
        assert!(std::time::Instant::now() < deadline, "the first connections never closed: {:?}", server.lanes());
        std::thread::sleep(Duration::from_millis(10));
    }
    // With the receive queue recorded as a NIC driver does, each lane's replies leave by
    // its own queue pair's transmit queue.
    let recorder = h.rx.run(move || netlane::lanes::RecordedRxQueues::install(rx_index, 2)).unwrap().unwrap();
    let mut conns = connect(&h, addr, 32);
    let (tx0, conns0) = replies_by_queue(&h, &server, q0_napi, &mut conns, 20);
    assert!((tx0 - conns0).abs() < 0.1, "replies by tx-0 {tx0:.2} against connections on rx-0 {conns0:.2}");
    let (recorded, other) = recorder.counts().unwrap();
    assert!(recorded > 32 * 20 && other == 0, "recorded {recorded}, left alone {other}");
    drop(conns);
    server.stop();
}

/// Runs the generator in the tx namespace for `secs` at `rate`, changing lanes with
/// `change` meanwhile; every request offered must be answered.
fn load_through_lane_changes(steer: Steer, change: impl FnOnce(&Server)) {
    let h = hosts(&format!("kv-live-{}", if steer == Steer::Reuseport { "rp" } else { "acc" }));
    let mut cfg = config(&h, steer, 2);
    cfg.max_lanes = Some(6);
    let server = start(&h, cfg);
    let addr = server.local_addr();
    let load = LoadConfig {
        server: addr,
        connections: 48,
        threads: 1,
        pacing: Pacing::Open(Arrivals { process: Process::Poisson, rate_per_s: 3000.0 }),
        workload: WorkloadSpec { keys: 2000, ..WorkloadSpec::default() },
        duration: Duration::from_secs(3),
        drain: Duration::from_secs(2),
        ..LoadConfig::default()
    };
    let warm = load.clone();
    assert_eq!(h.tx.run(move || loadgen::warm_up(&warm)).unwrap().unwrap(), 2000);
    let generator = h.tx.spawn("kv-load", move || loadgen::run(&load, &AtomicBool::new(false))).unwrap();
    // Meanwhile new connections keep coming: each must be answered, none reset, while
    // the lanes (and, with reuseport, their listeners) come and go.
    let churn = h.tx.spawn("kv-churn", move || churn(addr, Duration::from_millis(2600))).unwrap();
    change(&server);
    let r = generator.join().unwrap().expect("the load ran").report;
    let (opened, failed) = churn.join().unwrap();
    assert!(opened > 50, "{opened} connections opened");
    assert!(failed.is_empty(), "{} of {opened} new connections failed: {failed:?}", failed.len());
    let c = &r.counts;
    assert!(c.offered > 8000, "{r:?}");
    assert_eq!(c.completed, c.offered, "every request answered: {r:?}");
    assert_eq!((c.errors, c.lost, c.unanswered, c.not_sent, c.misses), (0, 0, 0, 0, 0), "{r:?}");
    assert_eq!(r.connection_failures, 0, "{r:?}");
    let v = server.lanes();
    let moved_in: u64 = v.lanes.iter().map(|l| l.moved_in).sum();
    assert!(moved_in > 0, "connections moved: {v:?}");
    server.stop();
}

/// Opens, uses and closes connections one after another for `how_long`; returns how
/// many it opened and the errors of those that failed.
fn churn(addr: SocketAddr, how_long: Duration) -> (usize, Vec<String>) {
    let t0 = std::time::Instant::now();
    let (mut opened, mut failed) = (0, Vec::new());
    while t0.elapsed() < how_long {
        opened += 1;
        let r = (|| -> std::io::Result<()> {
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
            s.set_read_timeout(Some(Duration::from_secs(2)))?;
            s.write_all(b"version\r\n")?;
            let mut line = String::new();
            BufReader::new(&s).read_line(&mut line)?;
            if !line.starts_with("VERSION ") {
                return Err(std::io::Error::other(format!("answered {line:?}")));
            }
            Ok(())
        })();
        if let Err(e) = r {
            failed.push(e.to_string());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    (opened, failed)
}

#[test]
fn lanes_added_and_removed_under_load_lose_no_request() {
    if !privileged("lanes_added_and_removed_under_load_lose_no_request") {
        return;
    }
    load_through_lane_changes(Steer::Acceptor, |s| {
        std::thread::sleep(Duration::from_millis(900));
        let added = s.add_lane(None).unwrap();
        std::thread::sleep(Duration::from_millis(500));
        s.remove_lane(0).unwrap();
        std::thread::sleep(Duration::from_millis(500));
        s.remove_lane(added).unwrap();
        let v = s.lanes();
        assert_eq!(v.lanes.len(), 1, "{v:?}");
        assert!(s.remove_lane(v.lanes[0].lane).is_err(), "the last lane stays");
    });
}

#[test]
fn reuseport_lanes_added_and_removed_under_load_lose_no_request() {
    if !privileged("reuseport_lanes_added_and_removed_under_load_lose_no_request") {
        return;
    }
    load_through_lane_changes(Steer::Reuseport, |s| {
        std::thread::sleep(Duration::from_millis(900));
        s.add_lane(None).unwrap();
        std::thread::sleep(Duration::from_millis(500));
        s.remove_lane(1).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        s.remove_lane(0).unwrap();
        let v = s.lanes();
        assert_eq!(v.lanes.len(), 1, "{v:?}");
    });
}

/// Loopback has no NAPI: every connection has NAPI id 0 and is placed by load. Removing
/// lanes under load still moves every connection and answers every request.
#[test]
fn connections_without_a_napi_id_move_when_their_lane_leaves() {
    let server = Server::start(ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        threads: 3,
        store: StoreConfig::new(64 << 20, 1 << 20, 8),
        steer: Steer::Acceptor,
        ..ServerConfig::default()
    })
    .unwrap();
    let load = LoadConfig {
        server: server.local_addr(),
        connections: 30,
        threads: 1,
        pacing: Pacing::Open(Arrivals { process: Process::Poisson, rate_per_s: 2000.0 }),
        workload: WorkloadSpec { keys: 1000, ..WorkloadSpec::default() },
        duration: Duration::from_secs(2),
        drain: Duration::from_secs(2),
        ..LoadConfig::default()
    };
    assert_eq!(loadgen::warm_up(&load).unwrap(), 1000);
    let addr = server.local_addr();
    let generator = std::thread::spawn(move || loadgen::run(&load, &AtomicBool::new(false)));
    let churner = std::thread::spawn(move || churn(addr, Duration::from_millis(1800)));
    std::thread::sleep(Duration::from_millis(700));
    server.remove_lane(0).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    server.remove_lane(2).unwrap();
    let r = generator.join().unwrap().unwrap().report;
    let (opened, failed) = churner.join().unwrap();
    let c = &r.counts;
    assert_eq!(c.completed, c.offered, "{r:?}");
    assert_eq!((c.errors, c.lost, c.unanswered, c.not_sent), (0, 0, 0, 0), "{r:?}");
    assert!(failed.is_empty(), "{} of {opened} new connections failed: {failed:?}", failed.len());
    let v = server.lanes();
    assert_eq!(v.lanes.len(), 1, "{v:?}");
    assert!(v.lanes.iter().all(|l| l.no_napi + l.moved_in > 0), "{v:?}");
    // Every connection is closed by now, and the server counted every one of them.
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while server.stats().curr_connections > 0 {
        assert!(std::time::Instant::now() < deadline, "{:?}", server.stats());
        std::thread::sleep(Duration::from_millis(20));
    }
    server.stop();
}

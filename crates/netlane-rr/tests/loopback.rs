//! The server and the clients over loopback (no privileges needed): every socket path,
//! IPv4 and IPv6, segmented responses, a standard echo server (socat), and peers that
//! lose or corrupt datagrams.

use std::net::UdpSocket;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use netlane::serve::Stop;
use netlane_rr::clients::{self, ClientsConfig, ClientsReport, Load};
use netlane_rr::proto::client::ClientConfig;
use netlane_rr::proto::server::{ResponderConfig, respond};
use netlane_rr::proto::wire::HEADER_LEN;
use netlane_rr::server::{self, PaceOptions, PathKind, ServerConfig, ServerError, TxKind};

mod common;
use common::{Reaped, client, population, with_server};

fn assert_clean(r: &ClientsReport) {
    assert!(r.responses > 100, "too few responses: {r:?}");
    assert_eq!((r.corrupt, r.mismatched, r.lost, r.send_errors, r.recv_errors), (0, 0, 0, 0, 0), "{r:?}");
    assert!(r.latency_ns.count == r.responses && r.latency_ns.p50 > 0, "{r:?}");
    // Every response was read after a wake-up that found its socket ready.
    assert!(r.wakeups >= 1 && r.woken_sockets >= r.wakeups, "{r:?}");
    assert!(r.max_woken_sockets <= r.clients as u64 && r.herd_woken_sockets <= r.woken_sockets, "{r:?}");
}

#[test]
fn every_socket_path_serves_every_client_over_ipv4_and_ipv6() {
    for path in [PathKind::Recvfrom, PathKind::Recvmmsg] {
        for listen in ["127.0.0.1:0", "[::1]:0"] {
            let cfg = ServerConfig { listen: listen.parse().unwrap(), path, ..ServerConfig::default() };
            let (r, st) = with_server(cfg, |addr| {
                clients::run(&population(addr, 64, client(512, 8192)), &AtomicBool::new(false)).unwrap()
            });
            assert_clean(&r);
            // Every client was answered (64 4-tuples) and nothing was refused.
            assert!(st.counters.responses >= r.responses, "{path} {listen}: {st:?} {r:?}");
            assert_eq!(
                st.counters.refused_malformed
                    + st.counters.refused_too_large
                    + st.counters.send_errors
                    + st.counters.send_dropped,
                0,
                "{st:?}"
            );
            assert!(st.counters.wakeups > 0 && st.counters.frames >= st.counters.wakeups, "{st:?}");
        }
    }
}

#[test]
fn segmented_responses_go_out_with_gso_and_come_back_whole_with_gro() {
    let cfg = ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        responder: ResponderConfig { segment: Some(1440), ..ResponderConfig::default() },
        ..ServerConfig::default()
    };
    let (r, st) = with_server(cfg, |addr| {
        let p = ClientsConfig { gro: true, ..population(addr, 16, client(512, 8192)) };
        clients::run(&p, &AtomicBool::new(false)).unwrap()
    });
    assert_clean(&r);
    assert!(st.counters.gso_sends > 0 && st.counters.datagrams_sent >= 6 * st.counters.responses - 6, "{st:?}");
}

#[test]
fn an_open_loop_sends_at_its_rate_whatever_the_responses() {
    let cfg = ServerConfig { listen: "127.0.0.1:0".parse().unwrap(), ..ServerConfig::default() };
    let (r, _) = with_server(cfg, |addr| {
        let p = ClientsConfig {
            load: Load::Open { rate: 2000.0 },
            client: ClientConfig { max_outstanding: 8, ..client(512, 1024) },
            ..population(addr, 8, client(512, 1024))
        };
        clients::run(&p, &AtomicBool::new(false)).unwrap()
    });
    assert_clean(&r);
    // 2000/s for 0.5 s: about 1000 arrivals (Poisson; the bounds are five sigmas wide).
    assert!((800..=1200).contains(&r.requests), "{r:?}");
}

/// A server that answers through `respond` but drops about a quarter of the requests and
/// flips one payload byte in about a fifth of the responses (picked by a hash of the
/// datagram count: a plain `n % 4` would keep hitting the same client of a population
/// whose size it divides).
fn lossy_server(sock: UdpSocket, stop: &AtomicBool) -> (u64, u64) {
    sock.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let cfg = ResponderConfig::default();
    let mut out = vec![0u8; cfg.max_reply_bytes()];
    let mut buf = vec![0u8; 65_536];
    let (mut n, mut dropped, mut corrupted) = (0u64, 0, 0);
    while !stop.load(Ordering::Relaxed) {
        let Ok((len, from)) = sock.recv_from(&mut buf) else { continue };
        n += 1;
        let h = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 59;
        if h % 4 == 0 {
            dropped += 1;
            continue;
        }
        let reply = respond(&cfg, &buf[..len], &mut out).unwrap();
        if h % 5 == 1 {
            out[HEADER_LEN + 7] ^= 0x40;
            corrupted += 1;
        }
        sock.send_to(&out[..reply.len], from).unwrap();
    }
    (dropped, corrupted)
}

#[test]
fn lost_requests_are_sent_again_and_corrupted_responses_never_accepted() {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = sock.local_addr().unwrap();
    let stop = AtomicBool::new(false);
    let (r, (dropped, corrupted)) = thread::scope(|s| {
        let h = s.spawn(|| lossy_server(sock, &stop));
        // A 10 ms timeout retransmits often; 100 retries give a request a second in all,
        // so a server thread descheduled on a loaded machine does not make it lost.
        let c = ClientConfig { timeout_ns: 10_000_000, max_retries: 100, ..client(512, 2048) };
        let r = clients::run(&population(addr, 8, c), &AtomicBool::new(false)).unwrap();
        stop.store(true, Ordering::Relaxed);
        (r, h.join().unwrap())
    });
    assert!(dropped > 10 && corrupted > 10, "the server misbehaved too little: {dropped} {corrupted}");
    assert!(r.responses > 100, "{r:?}");
    assert!(r.corrupt > 0 && r.retransmits > 0, "{r:?}");
    assert_eq!((r.mismatched, r.lost), (0, 0), "{r:?}");
}

#[test]
fn a_server_that_is_not_there_gives_errors_and_losses_not_a_hang() {
    // A port nobody listens on: ICMP port unreachable on every send.
    let addr = UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let c = ClientConfig { timeout_ns: 10_000_000, max_retries: 1, ..client(512, 1024) };
    let r = clients::run(&population(addr, 4, c), &AtomicBool::new(false)).unwrap();
    assert_eq!(r.responses, 0);
    assert!(r.lost > 0 && r.recv_errors > 0, "{r:?}");
}

#[test]
fn echo_mode_drives_a_standard_udp_echo_server() {
    // socat (installed by scripts/setup.sh) answers each datagram with its own bytes.
    let port = UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = Command::new("socat")
        .args(["-T", "5", &format!("UDP4-RECVFROM:{port},bind=127.0.0.1,fork"), "PIPE"])
        .stdin(Stdio::null())
        .spawn()
        .expect("socat runs (scripts/setup.sh installs it)");
    let _guard = Reaped(child);
    // Ready when it echoes.
    let probe = UdpSocket::bind("127.0.0.1:0").unwrap();
    probe.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut buf = [0u8; 8];
    loop {
        probe.send_to(b"ready?", ("127.0.0.1", port)).unwrap();
        if probe.recv(&mut buf).is_ok_and(|n| &buf[..n] == b"ready?") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "socat did not echo within 10 s");
    }
    let c = ClientConfig { echo: true, ..client(512, 512) };
    let r =
        clients::run(&population(format!("127.0.0.1:{port}").parse().unwrap(), 4, c), &AtomicBool::new(false)).unwrap();
    assert!(r.responses > 20, "{r:?}");
    assert_eq!((r.corrupt, r.mismatched, r.lost), (0, 0, 0), "{r:?}");
}

#[test]
fn bad_options_fail_before_anything_is_built() {
    let base = ServerConfig { listen: "127.0.0.1:0".parse().unwrap(), ..ServerConfig::default() };
    let run = |cfg: ServerConfig| {
        server::serve(
            &cfg,
            &{
                let s = Stop::new().unwrap();
                s.stop();
                s
            },
            |_| panic!("must not start"),
        )
    };
    assert!(matches!(run(ServerConfig { batch: 0, ..base.clone() }), Err(ServerError::Batch(0))));
    assert!(matches!(run(ServerConfig { batch: 1025, ..base.clone() }), Err(ServerError::Batch(1025))));
    let seg = ResponderConfig { segment: Some(20), ..ResponderConfig::default() };
    assert!(matches!(run(ServerConfig { responder: seg, ..base.clone() }), Err(ServerError::Config(_))));
    let e = run(ServerConfig { tx: TxKind::AfXdp, ..base.clone() }).unwrap_err().to_string();
    assert!(e.contains("needs `path` af-xdp, not recvmmsg"), "{e}");
    let any = ServerConfig { tx: TxKind::Packet, listen: "0.0.0.0:0".parse().unwrap(), ..base.clone() };
    let e = run(any).unwrap_err().to_string();
    assert!(e.contains("listen on a specific address"), "{e}");
    let pace = PaceOptions { rate: 1000, quantum: Duration::from_millis(1), queue: 64 };
    let e = run(ServerConfig {
        pace: Some(pace),
        responder: ResponderConfig { segment: Some(1472), ..ResponderConfig::default() },
        ..base.clone()
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("pacing sends each response as one datagram"), "{e}");
    let e = run(ServerConfig { pace: Some(PaceOptions { rate: 0, ..pace }), ..base.clone() }).unwrap_err().to_string();
    assert!(e.contains("pacing rate 0"), "{e}");
    let e = "udp".parse::<TxKind>().unwrap_err();
    assert!(e.contains("socket, packet, af-xdp"), "{e}");
    let e = "tpacket-v9".parse::<PathKind>().unwrap_err();
    assert!(e.contains("recvfrom, recvmmsg, tpacket-v2, tpacket-v3, af-xdp"), "{e}");
    let bad = |f: fn(&mut ClientsConfig)| {
        let mut p = population("127.0.0.1:9".parse().unwrap(), 4, client(512, 1024));
        f(&mut p);
        clients::run(&p, &AtomicBool::new(false)).unwrap_err().to_string()
    };
    assert!(bad(|p| p.clients = 0).contains("0 clients"));
    assert!(bad(|p| p.threads = 5).contains("5 threads for 4 clients"));
    assert!(bad(|p| p.load = Load::Open { rate: -1.0 }).contains("rate -1"));
    assert!(bad(|p| p.load = Load::Open { rate: 1e12 }).contains("at most 10000000"));
    assert!(bad(|p| p.client.request_len = 10).contains("request size 10"));
}

#[test]
fn frames_for_loopback_addresses_go_through_the_socket_and_are_counted() {
    // The kernel drops frames from 127.0.0.0/8 that arrive on a device (IP_LOCALNET), so
    // the frame path hands loopback peers to the socket; nothing is lost.
    let cfg = ServerConfig { listen: "127.0.0.1:0".parse().unwrap(), tx: TxKind::Packet, ..ServerConfig::default() };
    let (r, st) =
        with_server(cfg, |a| clients::run(&population(a, 4, client(512, 1024)), &AtomicBool::new(false)).unwrap());
    assert_clean(&r);
    let raw = st.raw_tx.as_ref().unwrap();
    // A client's first request for more than three times its size is answered with a
    // Retry (its address is not verified yet), sent the same way.
    assert_eq!(
        (raw.datagrams, raw.via_socket_loopback),
        (0, st.counters.responses + st.counters.retries_sent),
        "{raw:?}"
    );
    assert_eq!(st.tx, "packet");
}

#[test]
fn paced_responses_leave_no_faster_than_the_schedule_and_none_is_lost() {
    // 16 clients could take tens of thousands of responses per second here; the
    // schedule lets 2000 per second out, two per 1 ms release.
    let pace = PaceOptions { rate: 2000, quantum: Duration::from_millis(1), queue: 64 };
    let cfg = ServerConfig { listen: "127.0.0.1:0".parse().unwrap(), pace: Some(pace), ..ServerConfig::default() };
    let (r, st) =
        with_server(cfg, |a| clients::run(&population(a, 16, client(512, 1024)), &AtomicBool::new(false)).unwrap());
    assert_clean(&r);
    assert!(r.responses_per_s <= 2000.0 * 1.1, "the schedule is a ceiling: {r:?}");
    let p = st.paced.as_ref().unwrap();
    assert_eq!(
        p.sent,
        st.counters.responses + st.counters.retries_sent,
        "every response (and Retry) sent, none dropped: {p:?}"
    );
    assert!(p.queue_max > 2 && p.mean_wait_us > 0.0, "responses waited for their turn: {p:?}");
    assert!(p.sent as f64 <= 3.0 * p.releases as f64, "a release is two responses, one more with the carry: {p:?}");
}

/// Requests that arrive faster than they are answered (the socket never goes empty)
/// cannot hold a stop off: a wake-up answers a bounded number of batches, then the loop
/// looks at its stop again.
#[test]
fn a_flood_of_requests_does_not_hold_off_a_stop() {
    use netlane::serve::Running;
    use netlane_rr::proto::wire::{Header, encode};
    let server =
        server::Server::start(ServerConfig { listen: "127.0.0.1:0".parse().unwrap(), ..ServerConfig::default() })
            .expect("the server starts");
    let addr = server.local_addr();
    let mut request = vec![0u8; 64];
    let n = encode(&Header::request(1, 0, 0, 32), &mut request).unwrap();
    request.truncate(n);
    let flooding = std::sync::Arc::new(AtomicBool::new(true));
    let floods: Vec<_> = (0..3)
        .map(|_| {
            let (flooding, request) = (flooding.clone(), request.clone());
            thread::spawn(move || {
                let s = UdpSocket::bind("127.0.0.1:0").unwrap();
                s.connect(addr).unwrap();
                while flooding.load(Ordering::Relaxed) {
                    let _ = s.send(&request);
                }
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(300));
    let (tx, rx) = std::sync::mpsc::channel();
    let started = std::time::Instant::now();
    thread::spawn(move || tx.send(server.stop()).unwrap());
    let stopped = rx.recv_timeout(Duration::from_secs(5));
    let took = started.elapsed();
    flooding.store(false, Ordering::Relaxed);
    floods.into_iter().for_each(|f| f.join().unwrap());
    let stats = stopped.expect("the server stops within 5 s under a flood").expect("the server ran");
    assert!(stats.counters.frames > 1000, "the flood reached the server: {stats:?}");
    assert!(took < Duration::from_secs(2), "stopping took {took:?}");
}

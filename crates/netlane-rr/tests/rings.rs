//! The paths below the stack (TPACKET_V2, TPACKET_V3 rings and AF_XDP, generic XDP on
//! loopback): they serve every client, coexist with tcpdump and other sockets, retire a
//! lone request's block by timeout, and refuse impossible rings and UMEMs before
//! building anything. Need root (CAP_NET_RAW, CAP_BPF).

use std::io::Read;
use std::net::UdpSocket;
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::thread;
use std::time::{Duration, Instant};

use netlane::serve::Stop;
use netlane_rr::clients::{self, ClientsReport};
use netlane_rr::server::{self, PathKind, RingOptions, ServerConfig, ServerError, XdpOptions};
use netlane_testkit::privileged;

mod common;
use common::{Reaped, client, population, with_server};

const FRAME_PATHS: [PathKind; 3] = [PathKind::TpacketV2, PathKind::TpacketV3, PathKind::AfXdp];

fn ring_server(path: PathKind, listen: &str, ring: RingOptions) -> ServerConfig {
    ServerConfig { listen: listen.parse().unwrap(), path, ring, ..ServerConfig::default() }
}

/// Sends `n` datagrams from loopback to `to` (a socket with a read timeout), one at a
/// time; returns how many it received intact.
fn datagrams_received(to: &UdpSocket, n: u8) -> usize {
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut buf = [0u8; 64];
    (0..n)
        .filter(|&i| {
            tx.send_to(&[i; 32], to.local_addr().unwrap()).unwrap();
            to.recv(&mut buf).is_ok_and(|len| len == 32 && buf[0] == i)
        })
        .count()
}

fn assert_clean(r: &ClientsReport) {
    assert!(r.responses > 50, "too few responses: {r:?}");
    assert_eq!((r.corrupt, r.mismatched, r.lost, r.recv_errors), (0, 0, 0, 0), "{r:?}");
}

#[test]
fn frame_paths_serve_every_client_over_ipv4_and_ipv6() {
    if !privileged("frame_paths_serve_every_client_over_ipv4_and_ipv6") {
        return;
    }
    // A small V3 block (4 frame slots) keeps 64 clients from waiting on the timeout.
    let ring = RingOptions { frames_per_block: 4, retire_ms: 2, ..RingOptions::default() };
    for path in FRAME_PATHS {
        for listen in ["127.0.0.1:0", "[::1]:0"] {
            let (r, st) = with_server(ring_server(path, listen, ring), |addr| {
                clients::run(&population(addr, 64, client(512, 8192)), &AtomicBool::new(false)).unwrap()
            });
            assert_clean(&r);
            assert_eq!(st.iface.as_deref(), Some("lo"), "{st:?}");
            // Each client's first request got a Retry (it asks for 16 times its size before
            // its address is verified), then the response.
            assert!(
                st.counters.responses >= r.responses
                    && st.counters.frames == st.counters.responses + st.counters.retries_sent,
                "{path} {listen}: {st:?}"
            );
            assert_eq!(
                (st.counters.ring_drops, st.counters.ring_skipped, st.counters.ring_fragments),
                (0, 0, 0),
                "{st:?}"
            );
            // No socket receive calls: the frames are read from shared memory.
            assert_eq!(st.counters.recv_syscalls, 0, "{st:?}");
            if path == PathKind::AfXdp {
                let x = st.xdp.as_ref().expect("an AF_XDP report");
                assert_eq!((x.mode.as_str(), x.zero_copy, x.queues), ("generic", false, 1), "lo: {x:?}");
                assert_eq!(x.redirected, st.counters.frames, "{x:?}");
                // The responses travel back over lo through the same hook: passed.
                assert!(x.passed >= st.counters.responses, "{x:?}");
            }
        }
    }
}

#[test]
fn tcpdump_and_other_sockets_keep_working_while_a_frame_path_runs() {
    if !privileged("tcpdump_and_other_sockets_keep_working_while_a_frame_path_runs") {
        return;
    }
    for path in FRAME_PATHS {
        let other = UdpSocket::bind("127.0.0.1:0").unwrap();
        other.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        let other_addr = other.local_addr().unwrap();
        let ring = RingOptions { frames_per_block: 4, retire_ms: 2, ..RingOptions::default() };
        let ((r, captured, other_got), st) = with_server(ring_server(path, "127.0.0.1:0", ring), |addr| {
            // A packet ring gets a copy, so tcpdump still sees the service's requests;
            // AF_XDP takes them before any tap, so tcpdump must still see the rest.
            let watched = if path == PathKind::AfXdp { other_addr.port() } else { addr.port() };
            let mut dump = Reaped(
                Command::new("tcpdump")
                    .args(["-i", "lo", "-n", "-l", "-c", "10", "udp", "and", "dst", "port", &watched.to_string()])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("tcpdump runs (scripts/setup.sh installs it)"),
            );
            // tcpdump says "listening on lo" once it captures.
            let stderr = dump.0.stderr.take().unwrap();
            let (ready_tx, ready_rx) = std::sync::mpsc::channel();
            thread::spawn(move || {
                use std::io::BufRead;
                let ready =
                    std::io::BufReader::new(stderr).lines().any(|l| l.is_ok_and(|l| l.contains("listening on")));
                let _ = ready_tx.send(ready);
            });
            assert_eq!(ready_rx.recv_timeout(Duration::from_secs(10)), Ok(true), "tcpdump started capturing");
            let r = clients::run(&population(addr, 8, client(512, 8192)), &AtomicBool::new(false)).unwrap();
            // Another socket on the same host and interface still gets its datagrams.
            let other_got = datagrams_received(&other, 10);
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline && matches!(dump.0.try_wait(), Ok(None)) {
                thread::sleep(Duration::from_millis(20));
            }
            let mut out = String::new();
            if let Some(mut so) = dump.0.stdout.take() {
                let _ = dump.0.kill();
                let _ = so.read_to_string(&mut out);
            }
            (r, out.lines().filter(|l| l.contains(&format!(".{watched}:"))).count(), other_got)
        });
        assert_clean(&r);
        assert_eq!(captured, 10, "{path}: tcpdump kept capturing");
        assert_eq!(other_got, 10, "{path}: another UDP socket kept receiving");
        assert!(st.counters.responses >= r.responses, "{st:?}");
    }
}

#[test]
fn frame_paths_take_only_what_their_own_socket_would_receive() {
    if !privileged("frame_paths_take_only_what_their_own_socket_would_receive") {
        return;
    }
    // Another socket with the service's port on another address (IPv4 beside an IPv6
    // service, 127.0.0.2 beside 127.0.0.1) keeps its datagrams: a path below the stack
    // takes only its own socket's (AF_XDP used to steal them, the rings to read them).
    let ring = RingOptions { frames_per_block: 4, retire_ms: 2, ..RingOptions::default() };
    let adaptive = RingOptions { adaptive: true, ..ring };
    let paths = [
        (PathKind::TpacketV2, ring),
        (PathKind::TpacketV3, ring),
        (PathKind::TpacketV3, adaptive),
        (PathKind::AfXdp, ring),
    ];
    for (path, ring) in paths {
        for (listen, other_ip) in [("[::1]:0", "127.0.0.1"), ("127.0.0.1:0", "127.0.0.2")] {
            let what = format!("{path} adaptive={} on {listen}, another socket on {other_ip}", ring.adaptive);
            let ((r, other_got), st) = with_server(ring_server(path, listen, ring), |addr| {
                let other = UdpSocket::bind((other_ip, addr.port())).unwrap();
                other.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
                let got = datagrams_received(&other, 20);
                let r = clients::run(&population(addr, 8, client(512, 8192)), &AtomicBool::new(false)).unwrap();
                (r, got)
            });
            assert_clean(&r);
            assert_eq!(other_got, 20, "{what}: the other socket got every datagram");
            assert_eq!(
                (st.counters.frames, st.counters.ring_skipped, st.counters.refused_malformed),
                (st.counters.responses + st.counters.retries_sent, 0, 0),
                "{what}: the path saw only the service's datagrams: {st:?}"
            );
            if let Some(x) = &st.xdp {
                assert_eq!(x.redirected, st.counters.frames, "{what}: {x:?}");
            }
        }
    }
}

#[test]
fn a_lone_request_is_delivered_when_its_v3_block_retires() {
    if !privileged("a_lone_request_is_delivered_when_its_v3_block_retires") {
        return;
    }
    // One client, a 64-slot block: the block never fills, so every request waits for
    // the 30 ms retire timer, and still gets its answer.
    let ring = RingOptions { frames_per_block: 64, retire_ms: 30, ..RingOptions::default() };
    let (r, st) = with_server(ring_server(PathKind::TpacketV3, "127.0.0.1:0", ring), |addr| {
        clients::run(&population(addr, 1, client(512, 8192)), &AtomicBool::new(false)).unwrap()
    });
    assert!(r.responses >= 5, "{r:?}");
    assert_eq!((r.corrupt, r.lost, r.retransmits), (0, 0, 0), "{r:?}");
    assert!(r.latency_ns.p50 >= 15_000_000, "a lone request cannot be handed over before its block retires: {r:?}");
    assert_eq!(st.frames_per_wakeup, 1.0, "one request per retired block: {st:?}");
}

#[test]
fn impossible_rings_are_refused_before_anything_is_built() {
    let run = |path, ring| {
        let cfg = ring_server(path, "127.0.0.1:0", ring);
        server::serve(&cfg, &stopped(), |_| panic!("must not start")).unwrap_err()
    };
    let d = RingOptions::default();
    let e = run(PathKind::TpacketV3, RingOptions { frames_per_block: 3, ..d });
    assert!(matches!(&e, ServerError::Ring { .. }), "{e}");
    assert!(e.to_string().contains("3 frames per block of 2048 bytes make a 6144-byte block"), "{e}");
    let e = run(PathKind::TpacketV3, RingOptions { blocks: 100_000, ..d });
    assert!(e.to_string().contains("at most"), "{e}");
    let e = run(PathKind::TpacketV2, RingOptions { frame_size: 100, ..d });
    assert!(e.to_string().contains("frame size 100"), "{e}");
    let e = run(PathKind::TpacketV2, RingOptions { frames: 0, ..d });
    assert!(e.to_string().contains("at least one frame"), "{e}");
    // Four queues' UMEMs of 4096 x 4 KiB (64 MiB) cannot fit an 8 MiB memlock limit;
    // one queue's is checked before the interface is known.
    let big = ServerConfig {
        xdp: XdpOptions { frames: 1 << 20, frame_size: 4096, ..XdpOptions::default() },
        ..ring_server(PathKind::AfXdp, "127.0.0.1:0", d)
    };
    let e = server::serve(&big, &stopped(), |_| panic!("must not start")).unwrap_err();
    if netlane_rr::server::memlock_limit().is_some() {
        assert!(e.to_string().contains("locked-memory limit (RLIMIT_MEMLOCK)"), "{e}");
    }
    let odd = ServerConfig {
        xdp: XdpOptions { ring_size: 100, ..XdpOptions::default() },
        ..ring_server(PathKind::AfXdp, "127.0.0.1:0", d)
    };
    let e = server::serve(&odd, &stopped(), |_| panic!("must not start")).unwrap_err();
    assert!(e.to_string().contains("ring size 100: a power of two"), "{e}");
    let cfg = ServerConfig { iface: Some("no-such-if0".into()), ..ring_server(PathKind::TpacketV2, "127.0.0.1:0", d) };
    if privileged("impossible_rings_are_refused_before_anything_is_built") {
        let e = server::serve(&cfg, &stopped(), |_| panic!("must not start")).unwrap_err();
        assert!(e.to_string().contains("interface no-such-if0"), "{e}");
    }
}

#[test]
fn the_adaptive_ring_moves_to_a_bigger_block_for_a_bigger_burst() {
    if !privileged("the_adaptive_ring_moves_to_a_bigger_block_for_a_bigger_burst") {
        return;
    }
    let ring = RingOptions { adaptive: true, ..RingOptions::default() };
    let (r, st) = with_server(ring_server(PathKind::TpacketV3, "127.0.0.1:0", ring), |addr| {
        clients::run(&population(addr, 4, client(512, 8192)), &AtomicBool::new(false)).unwrap()
    });
    assert_clean(&r);
    assert_eq!((st.adaptive_switches, st.adaptive_block), (Some(0), Some(4096)), "4 clients: the smallest block");
    let (r, st) = with_server(ring_server(PathKind::TpacketV3, "127.0.0.1:0", ring), |addr| {
        clients::run(&population(addr, 128, client(512, 8192)), &AtomicBool::new(false)).unwrap()
    });
    assert!(r.responses > 50 && r.corrupt + r.mismatched + r.lost == 0, "{r:?}");
    assert!(st.adaptive_switches.unwrap() >= 1, "{st:?}");
    // The fanout group hands each request to one ring: no duplicates, every frame
    // counted once, and the traffic really moved to a bigger ring. (Where it ends can
    // be the smallest block again: on a loaded machine a block that starts retiring by
    // its timer steps down at once, as it should; seen in a full `make test`.)
    let per_ring = st.adaptive_ring_frames.clone().expect("frames per ring");
    assert_eq!((r.duplicates, per_ring.iter().sum::<u64>()), (0, st.counters.frames), "{r:?} {st:?}");
    let active = netlane_rr::server::ADAPTIVE_BLOCKS.iter().position(|b| Some(*b) == st.adaptive_block).unwrap();
    assert!(per_ring[active] > 0 && per_ring[0] > 0, "{per_ring:?}");
    assert!(per_ring[1..].iter().sum::<u64>() > 0, "no request reached a bigger block: {per_ring:?}");
    let bad = ServerConfig { ring, ..ring_server(PathKind::TpacketV2, "127.0.0.1:0", RingOptions::default()) };
    let e = server::serve(&bad, &stopped(), |_| panic!("must not start")).unwrap_err();
    assert!(e.to_string().contains("adaptive block size is a TPACKET_V3 mode"), "{e}");
}

/// A stop signal already given: a server that starts anyway returns at once.
fn stopped() -> Stop {
    let s = Stop::new().unwrap();
    s.stop();
    s
}

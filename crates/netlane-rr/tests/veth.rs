//! The service between two network namespaces joined by a veth pair, as two hosts: every
//! path (AF_XDP in native XDP here), 8 KiB responses fragmented by IP at MTU 1500 and
//! reassembled by the client's kernel, GSO segments at MTU 1500, one jumbo datagram at
//! MTU 9000, and fragmented requests: the stack reassembles them for the socket paths
//! and AF_XDP, the rings reassemble them themselves. Need root.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use netlane::serve::Stop;
use netlane::topology::{LinkConfig, RxTuning, TwoHosts};
use netlane_rr::clients::{self, ClientsConfig};
use netlane_rr::proto::server::ResponderConfig;
use netlane_rr::server::{self, PathKind, ServerConfig, ServerStats, TxKind};
use netlane_testkit::privileged;

mod common;
use common::veth::{assert_clean, checksum_errors, exchange, hosts, reassembled, server_cfg};
use common::{client, population};

#[test]
fn every_path_answers_8k_responses_fragmented_at_mtu_1500() {
    if !privileged("every_path_answers_8k_responses_fragmented_at_mtu_1500") {
        return;
    }
    let h = hosts("rr-frag", 1500);
    for path in PathKind::ALL {
        for ipv6 in [false, true] {
            let before = reassembled(&h);
            let (r, st) = exchange(&h, server_cfg(&h, path, ipv6), |a| population(a, 16, client(512, 8192)));
            assert_clean(&format!("{path} ipv6={ipv6}"), &r);
            assert!(st.counters.responses >= r.responses, "{st:?}");
            if path == PathKind::AfXdp {
                let x = st.xdp.as_ref().unwrap();
                assert_eq!(x.mode, "native", "veth runs XDP in its driver: {x:?}");
                assert_eq!(x.native_refused, None, "{x:?}");
                // Zero-copy is tried first; veth has none, and the driver's refusal is said.
                assert!(!x.zero_copy && x.zero_copy_refused.as_deref().is_some_and(|w| !w.is_empty()), "{x:?}");
                assert_eq!(x.redirected, st.counters.frames, "{x:?}");
            }
            if !ipv6 {
                // Every 8 KiB response was six fragments the client's kernel put back
                // together.
                assert!(reassembled(&h) - before >= r.responses, "{path}: no reassembly seen");
            }
        }
    }
}

#[test]
fn gso_segments_at_mtu_1500_and_one_jumbo_datagram_at_9000() {
    if !privileged("gso_segments_at_mtu_1500_and_one_jumbo_datagram_at_9000") {
        return;
    }
    let h = hosts("rr-gso", 1500);
    let cfg = ServerConfig {
        responder: ResponderConfig { segment: Some(1472), ..ResponderConfig::default() },
        ..server_cfg(&h, PathKind::Recvmmsg, false)
    };
    let before = reassembled(&h);
    let (r, st) = exchange(&h, cfg, |a| ClientsConfig { gro: true, ..population(a, 16, client(512, 8192)) });
    assert_clean("gso", &r);
    assert!(st.counters.gso_sends > 0, "{st:?}");
    assert_eq!(reassembled(&h), before, "segments are whole datagrams: nothing to reassemble");
    drop(h);

    let h = hosts("rr-jumbo", 9000);
    let before = reassembled(&h);
    let (r, _) = exchange(&h, server_cfg(&h, PathKind::Recvmmsg, false), |a| population(a, 16, client(512, 8192)));
    assert_clean("jumbo", &r);
    assert_eq!(reassembled(&h), before, "an 8 KiB response fits one 9000-byte frame");
}

#[test]
fn eight_kib_requests_in_fragments_are_served_on_every_path() {
    if !privileged("eight_kib_requests_in_fragments_are_served_on_every_path") {
        return;
    }
    let h = hosts("rr-freq", 1500);
    let adaptive = |mut c: ServerConfig| {
        c.ring.adaptive = true;
        c
    };
    for ipv6 in [false, true] {
        let cases = PathKind::ALL
            .into_iter()
            .map(|p| (p.to_string(), server_cfg(&h, p, ipv6)))
            .chain([("adaptive tpacket-v3".to_string(), adaptive(server_cfg(&h, PathKind::TpacketV3, ipv6)))]);
        for (name, cfg) in cases {
            let (path, what) = (cfg.path, format!("{name} ipv6={ipv6}"));
            // 8 KiB requests: six IP fragments each at MTU 1500.
            let (r, st) = exchange(&h, cfg, |a| population(a, 4, client(8192, 1024)));
            assert_clean(&what, &r);
            let c = &st.counters;
            if path.is_ring() {
                // The ring sees fragments and puts them back together itself.
                assert!(
                    c.ring_reassembled >= r.responses && c.ring_fragments >= 6 * c.ring_reassembled,
                    "{what}: {c:?}"
                );
                let lost =
                    (c.ring_reasm_given_up, c.ring_reasm_over_memory, c.ring_reasm_refused, c.ring_bad_checksums);
                assert_eq!(lost, (0, 0, 0, 0), "{what}: {c:?}");
            } else if path == PathKind::AfXdp {
                // The program passes fragments to the stack, which reassembles them.
                let x = st.xdp.as_ref().unwrap();
                assert!(x.via_stack >= r.responses && x.redirected == 0, "{what}: {x:?}");
            }
        }
    }
}

#[test]
fn frames_netlane_writes_reach_the_client_kernel_and_follow_neighbour_changes() {
    if !privileged("frames_netlane_writes_reach_the_client_kernel_and_follow_neighbour_changes") {
        return;
    }
    let h = hosts("rr-rawtx", 1500);
    for (path, tx) in
        [(PathKind::Recvmmsg, TxKind::Packet), (PathKind::TpacketV2, TxKind::Packet), (PathKind::AfXdp, TxKind::AfXdp)]
    {
        for ipv6 in [false, true] {
            let what = format!("{path} tx={tx} ipv6={ipv6}");
            let (reasm, bad) = (reassembled(&h), checksum_errors(&h));
            let cfg = ServerConfig { tx, ..server_cfg(&h, path, ipv6) };
            let (r, st) = exchange(&h, cfg, |a| population(a, 16, client(512, 8192)));
            assert_clean(&what, &r);
            let raw = st.raw_tx.clone().unwrap();
            // Every response left as frames: six IP fragments of an 8 KiB datagram each,
            // which the client's kernel checked (checksums) and put back together; and
            // each client's Retry, one frame.
            assert_eq!(raw.datagrams, st.counters.responses + st.counters.retries_sent, "{what}: {raw:?}");
            let (responses, retries) = (st.counters.responses, st.counters.retries_sent);
            assert_eq!((raw.fragmented, raw.frames), (responses, 6 * responses + retries), "{what}: {raw:?}");
            // A fragmented datagram's checksum is summed here; a one-frame Retry's is
            // left to the device on the packet ring.
            let offloaded = if tx == TxKind::Packet { retries } else { 0 };
            assert_eq!(raw.checksum_offloaded, offloaded, "{what}: {raw:?}");
            assert_eq!(checksum_errors(&h), bad, "{what}: the client's kernel saw bad UDP checksums");
            if !ipv6 {
                assert!(reassembled(&h) - reasm >= r.responses, "{what}: no reassembly seen");
            }
        }
    }

    // The kernel's neighbour entry for the client goes away mid-run: the notification
    // empties the cache, the next responses go through the socket (which makes the
    // kernel resolve the client again), then frames resume. Nothing is lost.
    let client_ip = h.tx_addr(false);
    let rx_index = h.rx_index;
    let stop = Stop::new().unwrap();
    let (atx, arx) = mpsc::channel();
    let s = stop.clone();
    let cfg = ServerConfig { tx: TxKind::Packet, ..server_cfg(&h, PathKind::Recvmmsg, false) };
    let server = h.rx.spawn("rr-server", move || server::serve(&cfg, &s, |a| atx.send(a).unwrap())).unwrap();
    let addr = arx.recv_timeout(Duration::from_secs(5)).expect("the server came up");
    let mut pop = population(addr, 16, client(512, 8192));
    pop.duration = Duration::from_millis(1500);
    let clients = h.tx.spawn("rr-clients", move || clients::run(&pop, &AtomicBool::new(false))).unwrap();
    std::thread::sleep(Duration::from_millis(600));
    h.rx.with_rtnl(|r| r.del_neighbour(rx_index, client_ip)).expect("delete the client's neighbour entry");
    let r = clients.join().unwrap().unwrap();
    stop.stop();
    let st = server.join().unwrap().expect("the server ran");
    assert_clean("neighbour deleted", &r);
    let raw = st.raw_tx.clone().unwrap();
    assert!(raw.nexthops.invalidated >= 1 && raw.nexthops.events >= 1, "{raw:?}");
    assert!(raw.via_socket_unresolved >= 1, "the unresolved client was answered through the socket: {raw:?}");
    assert!(raw.nexthops.misses >= 2, "looked up again after the change: {raw:?}");
    assert_eq!(
        raw.datagrams + raw.via_socket_unresolved,
        st.counters.responses + st.counters.retries_sent,
        "{raw:?} {st:?}"
    );
    drop(h);

    // MTU 9000: the packet ring's slots fit the link, so an 8 KiB response is one frame,
    // whose checksum the device finishes, or netlane sums when told to.
    let h = hosts("rr-rawjumbo", 9000);
    for (offload, ipv6) in [(true, false), (true, true), (false, false)] {
        let what = format!("offload={offload} ipv6={ipv6}");
        let bad = checksum_errors(&h);
        let cfg = ServerConfig {
            tx: TxKind::Packet,
            tx_checksum_offload: offload,
            ..server_cfg(&h, PathKind::Recvmmsg, ipv6)
        };
        let (r, st) = exchange(&h, cfg, |a| population(a, 16, client(512, 8192)));
        assert_clean(&what, &r);
        let raw = st.raw_tx.unwrap();
        assert_eq!((raw.fragmented, raw.frames), (0, raw.datagrams), "{what}: {raw:?}");
        assert_eq!(raw.checksum_offloaded, if offload { raw.datagrams } else { 0 }, "{what}: {raw:?}");
        assert_eq!(checksum_errors(&h), bad, "{what}: the client's kernel saw bad UDP checksums");
    }
}

#[test]
fn socat_as_a_standard_client_gets_its_datagram_back_from_every_frame_path() {
    if !privileged("socat_as_a_standard_client_gets_its_datagram_back_from_every_frame_path") {
        return;
    }
    // socat (scripts/setup.sh installs it) is the client here: the server echoes its
    // datagram on each packet/XDP receive path, and through each transmit path (the
    // frames netlane writes are received by socat's kernel socket).
    let h = hosts("rr-socat", 1500);
    let cases = [
        (PathKind::TpacketV2, TxKind::Socket),
        (PathKind::TpacketV3, TxKind::Socket),
        (PathKind::AfXdp, TxKind::AfXdp),
        (PathKind::Recvmmsg, TxKind::Packet),
    ];
    for (path, tx) in cases {
        for ipv6 in [false, true] {
            let what = format!("{path} tx={tx} ipv6={ipv6}");
            let cfg = ServerConfig {
                tx,
                responder: ResponderConfig { echo: true, ..ResponderConfig::default() },
                ..server_cfg(&h, path, ipv6)
            };
            let stop = Stop::new().unwrap();
            let (atx, arx) = mpsc::channel();
            let s = stop.clone();
            let server = h.rx.spawn("rr-server", move || server::serve(&cfg, &s, |a| atx.send(a).unwrap())).unwrap();
            let addr = arx.recv_timeout(Duration::from_secs(5)).expect("the server came up");
            let target = match addr {
                SocketAddr::V4(a) => format!("UDP4:{}:{}", a.ip(), a.port()),
                SocketAddr::V6(a) => format!("UDP6:[{}]:{}", a.ip(), a.port()),
            };
            let line = format!("netlane echo over {what}");
            let out =
                h.tx.run(|| {
                    use std::io::Write;
                    let mut child = std::process::Command::new("socat")
                        .args(["-t", "1.5", "-T", "3", "-", &target])
                        .stdin(std::process::Stdio::piped())
                        .stdout(std::process::Stdio::piped())
                        .spawn()
                        .expect("socat runs (scripts/setup.sh installs it)");
                    child.stdin.take().unwrap().write_all(line.as_bytes()).unwrap();
                    child.wait_with_output().unwrap()
                })
                .unwrap();
            stop.stop();
            let st = server.join().unwrap().expect("the server ran");
            assert_eq!(String::from_utf8_lossy(&out.stdout), line, "{what}: {st:?}");
            if tx != TxKind::Socket {
                assert_eq!(st.raw_tx.as_ref().unwrap().datagrams, 1, "{what}: sent as frames: {st:?}");
            }
        }
    }
}

#[test]
fn a_packet_transmit_ring_stopped_by_a_full_send_buffer_sends_every_frame_in_the_end() {
    if !privileged("a_packet_transmit_ring_stopped_by_a_full_send_buffer_sends_every_frame_in_the_end") {
        return;
    }
    use netlane::topology::nexthop::NextHops;
    use netlane_rr::proto::frames::{Datagram, Link};
    use netlane_sys::packet::PacketTx;
    use std::os::fd::AsFd;

    let h = hosts("rr-txfull", 1500);
    // A slow qdisc holds the frames (and their send-buffer charge) for a while, so a
    // kick with a small send buffer stops early: what it left must go with later kicks.
    let rx_index = h.rx_index;
    h.rx.with_rtnl(|r| r.add_tbf(rx_index, 1_000_000, 10_000, 1_000_000)).expect("a tbf qdisc");
    let client = h.tx.run(|| std::net::UdpSocket::bind(SocketAddr::new(TwoHosts::TX_V4.into(), 0))).unwrap().unwrap();
    client.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let to = client.local_addr().unwrap();
    const N: usize = 100;
    let left_after_first_kick =
        h.rx.run(move || {
            let src = SocketAddr::new(TwoHosts::RX_V4.into(), 7070);
            let hop = NextHops::open().unwrap().lookup(to.ip(), src.ip()).unwrap().unwrap();
            let mut ring = PacketTx::open(hop.ifindex, 2048, 256).unwrap();
            nix::sys::socket::setsockopt(&ring.as_fd(), nix::sys::socket::sockopt::SndBuf, &4096).unwrap();
            let link = Link { src_mac: hop.src_mac, dst_mac: hop.dst_mac, mtu: hop.mtu as usize };
            for i in 0..N {
                let payload = [i as u8; 200];
                let d = Datagram::new(link, src, to, &payload, i as u32, ring.max_frame()).unwrap();
                let pushed = ring
                    .push(d.frame_len(0), |slot| {
                        d.write(0, slot);
                    })
                    .unwrap();
                assert!(pushed, "room for {N} frames");
            }
            ring.flush().unwrap();
            let left = ring.pending();
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while ring.pending() > 0 && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(2));
                ring.flush().unwrap();
            }
            assert_eq!(ring.pending(), 0, "every frame handed to the kernel");
            left
        })
        .unwrap();
    assert!(left_after_first_kick > 0, "the first kick was not stopped early: nothing tested");
    let mut seen = [false; N];
    let mut buf = [0u8; 512];
    for _ in 0..N {
        let n = client.recv(&mut buf).expect("every datagram arrives");
        assert_eq!(n, 200);
        seen[usize::from(buf[0])] = true;
    }
    assert!(seen.iter().all(|s| *s), "each datagram once");
}

#[test]
fn reuseport_lanes_take_each_datagram_on_the_lane_owning_its_napi_id() {
    if !privileged("reuseport_lanes_take_each_datagram_on_the_lane_owning_its_napi_id") {
        return;
    }
    // Two queues, each with its NAPI instance; the client end's TSO off so that its
    // datagrams take that NAPI path (and carry its id); flows spread over the queues by
    // their hash, as RSS spreads them.
    let h = TwoHosts::create("rr-lanes", LinkConfig { mtu: 1500, queues: 2, rx: RxTuning::threaded_napi() })
        .expect("two namespaces");
    h.set_tx_tso(false).expect("TSO off");
    let cfg = ServerConfig { lane_device: Some(h.rx_if.clone()), ..server_cfg(&h, PathKind::Recvmmsg, false) };
    let (r, st) = exchange(&h, cfg, |a| population(a, 32, client(64, 256)));
    assert_clean("lanes", &r);
    let lanes = st.lanes.as_ref().expect("a lanes report");
    assert_eq!(lanes.lanes.len(), 2, "{lanes:?}");
    assert!(lanes.lanes.iter().all(|l| l.napi_ids.len() == 1), "each lane owns one queue's NAPI id: {lanes:?}");
    assert_eq!(lanes.by_hash, 0, "every datagram had a NAPI id a lane owns: {lanes:?}");
    // Not one decision per datagram: with rx-udp-gro-forwarding, datagrams of one flow in
    // one NAPI poll arrive as one GRO train, which the kernel steers once and splits after.
    assert!(lanes.by_napi_id > 0, "{lanes:?} {st:?}");
    assert_eq!(lanes.lanes.iter().map(|l| l.frames).sum::<u64>(), st.counters.frames);
    assert!(lanes.lanes.iter().all(|l| l.frames > 0), "32 flows over two queues reach both lanes: {lanes:?}");
    assert!(st.counters.responses >= r.responses, "{st:?}");
    // Every lane's counters reach the total: 256-byte responses to 64-byte requests are
    // over the unverified ratio, so each client got a Retry first and came back verified.
    assert!(st.counters.retries_sent >= 32 && st.counters.verified_requests >= r.responses, "{st:?}");
    assert_eq!(st.counters.frames, st.counters.responses + st.counters.retries_sent, "{st:?}");

    // Not a socket path, or a CPU of its own: refused before anything is built.
    for bad in [
        ServerConfig { lane_device: Some("rx0".into()), ..server_cfg(&h, PathKind::TpacketV3, false) },
        ServerConfig { lane_device: Some("rx0".into()), cpu: Some(0), ..server_cfg(&h, PathKind::Recvmmsg, false) },
    ] {
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains("lanes read and answer through their sockets"), "{e}");
    }
}

/// An Ethernet + IPv4 + UDP frame to `dst_mac` (header checksum filled in).
fn udp4_frame(dst_mac: [u8; 6], src: SocketAddr, dst: SocketAddr, payload: &[u8]) -> Vec<u8> {
    let (SocketAddr::V4(src), SocketAddr::V4(dst)) = (src, dst) else { panic!("IPv4 only") };
    let mut f = dst_mac.to_vec();
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x42, 0x08, 0x00]);
    let mut ip = vec![0x45, 0, 0, 0, 0, 1, 0, 0, 64, 17, 0, 0];
    ip[2..4].copy_from_slice(&((20 + 8 + payload.len()) as u16).to_be_bytes());
    ip.extend_from_slice(&src.ip().octets());
    ip.extend_from_slice(&dst.ip().octets());
    let mut sum: u32 = ip.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], c[1]]))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&src.port().to_be_bytes());
    f.extend_from_slice(&dst.port().to_be_bytes());
    f.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(payload);
    f
}

#[test]
fn frame_paths_leave_frames_for_another_hosts_mac_alone() {
    if !privileged("frame_paths_leave_frames_for_another_hosts_mac_alone") {
        return;
    }
    // With the server's interface in promiscuous mode (tcpdump puts it there) a ring or
    // an XDP program sees frames for other hosts' MACs; the stack drops them whatever
    // addresses they carry, and so must the ring's filter and the steering program.
    let h = hosts("rr-promisc", 1500);
    let st = h.rx.command("ip").args(["link", "set", &h.rx_if, "promisc", "on"]).status().unwrap();
    assert!(st.success(), "ip link set promisc on");
    for path in [PathKind::TpacketV2, PathKind::TpacketV3, PathKind::AfXdp] {
        let (r, st) = exchange(&h, server_cfg(&h, path, false), |addr| {
            let f = udp4_frame([0x02, 0, 0, 0, 0, 0x99], SocketAddr::new(h.tx_addr(false), 4000), addr, &[0xee; 32]);
            let tx_index = h.tx_index;
            h.tx.run(move || {
                let mut tx = netlane_sys::packet::PacketTx::open(tx_index, 128, 64).unwrap();
                for _ in 0..10 {
                    assert!(tx.push(f.len(), |d| d.copy_from_slice(&f)).unwrap());
                }
                tx.flush().unwrap();
            })
            .unwrap();
            std::thread::sleep(Duration::from_millis(50));
            population(addr, 4, client(512, 512))
        });
        assert_clean(&format!("{path}"), &r);
        if let Some(x) = &st.xdp {
            assert_eq!(x.redirected, st.counters.frames, "{path}: {x:?}");
        }
        assert_eq!(
            (st.counters.frames, st.counters.refused_malformed, st.counters.ring_skipped),
            (st.counters.responses + st.counters.retries_sent, 0, 0),
            "{path}: the other host's frames stayed out of the ring: {st:?}"
        );
    }
}

/// The Ethernet addresses of the client's end and the server's end of the link.
fn macs(h: &TwoHosts) -> ([u8; 6], [u8; 6]) {
    let mac = |ns: &netlane::topology::Netns, i: u32| -> [u8; 6] {
        ns.with_rtnl(|r| r.link_mac(i)).unwrap().try_into().expect("an Ethernet address")
    };
    (mac(&h.tx, h.tx_index), mac(&h.rx, h.rx_index))
}

/// Runs the server on `path` and sends it every crafted frame from the client's
/// address, port 4000; returns the request ids answered there, in order, and the
/// server's counters.
fn answer_crafted(h: &TwoHosts, path: PathKind, ipv6: bool, macs: ([u8; 6], [u8; 6])) -> (Vec<u64>, ServerStats) {
    use netlane_rr::proto::crafted::crafted;
    use netlane_rr::proto::wire::{self, Header};
    let stop = Stop::new().unwrap();
    let (tx, rx) = mpsc::channel();
    let (s, cfg) = (stop.clone(), server_cfg(h, path, ipv6));
    let server = h.rx.spawn("rr-server", move || server::serve(&cfg, &s, |a| tx.send(a).unwrap())).unwrap();
    let addr = rx.recv_timeout(Duration::from_secs(5)).expect("the server came up");
    let src = SocketAddr::new(h.tx_addr(ipv6), 4000);
    let request = |i: usize| {
        let mut buf = vec![0u8; 128];
        let n = wire::encode(&Header::request(i as u64 + 1, 0, 64, 64), &mut buf).unwrap();
        buf.truncate(n);
        buf
    };
    let shapes = crafted(macs, src, addr, &request);
    let tx_index = h.tx_index;
    let answered =
        h.tx.run(move || {
            let sock = std::net::UdpSocket::bind(src).unwrap();
            sock.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
            let mut ring = netlane_sys::packet::PacketTx::open(tx_index, 2048, 64).unwrap();
            for c in &shapes {
                assert!(ring.push(c.frame.len(), |d| d.copy_from_slice(&c.frame)).unwrap());
            }
            ring.flush().unwrap();
            let (mut ids, mut buf) = (Vec::new(), [0u8; 2048]);
            while let Ok(n) = sock.recv(&mut buf) {
                ids.push(wire::decode(&buf[..n]).expect("a valid response").0.id - 1);
            }
            ids.sort_unstable();
            ids
        })
        .unwrap();
    stop.stop();
    (answered, server.join().unwrap().expect("the server ran"))
}

#[test]
fn every_path_below_the_stack_takes_exactly_the_crafted_frames_the_socket_takes() {
    if !privileged("every_path_below_the_stack_takes_exactly_the_crafted_frames_the_socket_takes") {
        return;
    }
    use netlane_rr::proto::crafted::crafted;
    let h = hosts("rr-crafted", 1500);
    let macs = macs(&h);
    for ipv6 in [false, true] {
        let src = SocketAddr::new(h.tx_addr(ipv6), 4000);
        let shapes = crafted(macs, src, SocketAddr::new(h.rx_addr(ipv6), 7070), &|_| vec![0; 104]);
        // What the table says the stack takes and answers back to the client (a frame
        // whose source was changed, checksums and all, is answered elsewhere).
        let expected: Vec<u64> = shapes
            .iter()
            .enumerate()
            .filter(|(_, c)| c.taken && !c.name.contains("source address changed"))
            .map(|(i, _)| i as u64)
            .collect();
        let (socket, sst) = answer_crafted(&h, PathKind::Recvmmsg, ipv6, macs);
        let name = |ids: &[u64]| ids.iter().map(|&i| shapes[i as usize].name).collect::<Vec<_>>();
        assert_eq!(name(&socket), name(&expected), "ipv6={ipv6}: the kernel's socket and the table disagree");
        for path in [PathKind::TpacketV2, PathKind::TpacketV3, PathKind::AfXdp] {
            let (ids, st) = answer_crafted(&h, path, ipv6, macs);
            assert_eq!(name(&ids), name(&socket), "ipv6={ipv6} {path}: answered other frames than the socket");
            assert_eq!(
                st.counters.responses, sst.counters.responses,
                "ipv6={ipv6} {path}: responses sent anywhere: {st:?}"
            );
            assert_eq!(st.counters.refused_malformed, 0, "ipv6={ipv6} {path}: {st:?}");
            if path != PathKind::AfXdp {
                assert!(st.counters.ring_bad_checksums > 0, "ipv6={ipv6} {path}: {st:?}");
            }
        }
    }
}

/// Forged requests from 480 addresses on the client's link, each asking for the
/// largest response, sent from the client's namespace through a packet ring at about
/// 20,000 a second until `stop`; returns how many were sent.
fn flood(
    h: &TwoHosts,
    server: SocketAddr,
    macs: ([u8; 6], [u8; 6]),
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    use netlane_rr::proto::crafted::udp_frame;
    use netlane_rr::proto::wire::{self, Header};
    let mut request = vec![0u8; 64];
    let n = wire::encode(&Header::request(1, 0, 0, 65_467), &mut request).unwrap();
    request.truncate(n);
    let frames: Vec<Vec<u8>> = (0..480u32)
        .map(|i| {
            let from = SocketAddr::from(([10, 77, 0, 10 + (i % 240) as u8], 5000 + (i / 240) as u16));
            udp_frame(macs, from, server, &request)
        })
        .collect();
    let tx_index = h.tx_index;
    let thread =
        h.tx.spawn("flood", move || {
            let mut ring = netlane_sys::packet::PacketTx::open(tx_index, 2048, 256).unwrap();
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for f in frames.iter().skip(sent as usize % 480).take(64) {
                    if ring.push(f.len(), |d| d.copy_from_slice(f)).unwrap_or(false) {
                        sent += 1;
                    }
                }
                let _ = ring.flush();
                std::thread::sleep(Duration::from_millis(3));
            }
            sent
        })
        .unwrap();
    std::thread::spawn(move || thread.join().unwrap())
}

#[test]
fn forged_sources_get_retries_of_their_own_size_and_real_clients_are_still_answered() {
    if !privileged("forged_sources_get_retries_of_their_own_size_and_real_clients_are_still_answered") {
        return;
    }
    use netlane_rr::proto::server::ResponderConfig;
    let h = hosts("rr-flood", 1500);
    let macs = macs(&h);
    let cfg = ServerConfig {
        responder: ResponderConfig { max_response: 65_467, ..ResponderConfig::default() },
        ..server_cfg(&h, PathKind::Recvmmsg, false)
    };
    let real = |addr| ClientsConfig { duration: Duration::from_secs(1), ..population(addr, 8, client(512, 8192)) };
    let (alone, _) = exchange(&h, cfg.clone(), real);
    let stop = Arc::new(AtomicBool::new(false));
    let mut flooding = None;
    let (under, st) = exchange(&h, cfg, |addr| {
        flooding = Some(flood(&h, addr, macs, stop.clone()));
        std::thread::sleep(Duration::from_millis(200));
        real(addr)
    });
    stop.store(true, Ordering::Relaxed);
    let forged = flooding.unwrap().join().unwrap();
    eprintln!(
        "real clients: {:.0} responses/s alone, {:.0} under {forged} forged requests; server: {st:?}",
        alone.responses_per_s, under.responses_per_s
    );
    assert_clean("alone", &alone);
    assert_clean("under the flood", &under);
    // The flood arrived: the server saw far more requests than the real clients sent.
    assert!(forged > 5_000 && st.counters.frames > st.counters.responses + 5_000, "{forged} forged, {st:?}");
    // Every forged request got a header-only Retry, never a response: the server sent
    // the real responses, one Retry per real client, and 40 bytes per forged request.
    // (A Retry the socket would not take is dropped, not counted as sent.)
    assert!(st.counters.bytes_sent <= st.counters.responses * 8192 + st.counters.retries_sent * 40, "{st:?}");
    assert_eq!(
        st.counters.retries_sent,
        st.counters.frames - st.counters.responses,
        "every request not answered got a Retry: {st:?}"
    );
    // How much the real clients keep is a measurement for the lab (two CPUs here run
    // the flood, the server and the clients); the rates are printed above.
}

//! The load balancer end to end in namespaces ([`BalancerNet`]): client -> router ->
//! balancer (XDP, IPIP, XDP_TX back to the router) -> router -> 3 reals (decapsulation
//! in XDP, VIP on lo) -> replies straight from the reals to the client (direct server
//! return).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use netlane::topology::{End, Netns, NsThread, veth_link};
use netlane_lb::proto::config::Config;
use netlane_lb::testnet::{BalancerNet, real_addr};
use netlane_lb::{HintMode, HintSource, Lb, LbOptions, TcClassifier};
use netlane_sys::bpf::XdpMode;

const VIP: Ipv4Addr = Ipv4Addr::new(10, 210, 100, 1);
const TCP_PORT: u16 = 8080;
const UDP_PORT: u16 = 9090;

/// The shared network ([`BalancerNet`]) with a TCP and a UDP server on every real.
struct Net {
    stop: Arc<AtomicBool>,
    servers: Vec<NsThread<()>>,
    // Dropped after the servers have stopped (field order).
    net: BalancerNet,
}

impl std::ops::Deref for Net {
    type Target = BalancerNet;
    fn deref(&self) -> &BalancerNet {
        &self.net
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for s in self.servers.drain(..) {
            let _ = s.join();
        }
    }
}

/// A real's TCP server: each message is [u32 length][bytes]; the reply is [real id]
/// [u64 sum of the bytes]. Its UDP server echoes [real id] + the datagram.
fn serve(ns: &Netns, id: u8, stop: Arc<AtomicBool>) -> Vec<NsThread<()>> {
    let s2 = stop.clone();
    let tcp = ns
        .spawn(&format!("real{id}-tcp"), move || {
            let l = TcpListener::bind((VIP, TCP_PORT)).expect("bind the VIP on a real");
            l.set_nonblocking(true).unwrap();
            while !stop.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((mut c, _)) => {
                        c.set_nonblocking(false).unwrap();
                        std::thread::spawn(move || {
                            let mut len = [0u8; 4];
                            while c.read_exact(&mut len).is_ok() {
                                let mut buf = vec![0u8; u32::from_be_bytes(len) as usize];
                                if c.read_exact(&mut buf).is_err() {
                                    return;
                                }
                                let sum: u64 = buf.iter().map(|b| u64::from(*b)).sum();
                                let mut reply = vec![id];
                                reply.extend_from_slice(&sum.to_be_bytes());
                                if c.write_all(&reply).is_err() {
                                    return;
                                }
                            }
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        })
        .unwrap();
    let udp = ns
        .spawn(&format!("real{id}-udp"), move || {
            let s = UdpSocket::bind((VIP, UDP_PORT)).expect("bind the VIP on a real");
            s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
            let mut buf = [0u8; 2048];
            while !s2.load(Ordering::Relaxed) {
                if let Ok((n, from)) = s.recv_from(&mut buf[1..]) {
                    buf[0] = id;
                    let _ = s.send_to(&buf[..n + 1], from);
                }
            }
        })
        .unwrap();
    vec![tcp, udp]
}

fn build() -> Net {
    build_with("lbe", 3)
}

/// [`BalancerNet`] named `label` with `reals` reals, each serving.
fn build_with(label: &str, reals: usize) -> Net {
    let net = BalancerNet::build(label, VIP, reals).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let servers = net.reals.iter().enumerate().flat_map(|(i, ns)| serve(ns, i as u8, stop.clone())).collect();
    Net { stop, servers, net }
}

fn config(weights: &[u32], udp_weights: &[u32]) -> Config {
    let mut t = String::from("ring_size = 65537\nconn_entries = 65536\n");
    for (port, proto, ws) in [(TCP_PORT, "tcp", weights), (UDP_PORT, "udp", udp_weights)] {
        t += &format!("[[vip]]\naddress = \"{VIP}\"\nport = {port}\nproto = \"{proto}\"\n");
        for (i, w) in ws.iter().enumerate() {
            t += &format!("[[vip.real]]\naddress = \"{}\"\nweight = {w}\n", real_addr(i));
        }
    }
    Config::parse(&t).unwrap()
}

/// Sends one message of `len` bytes (seeded) and checks the reply's sum; returns the
/// real that answered.
fn round(c: &mut TcpStream, seed: u64, len: usize) -> std::io::Result<u8> {
    let data: Vec<u8> = (0..len as u64).map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed) >> 7) as u8).collect();
    let mut msg = (len as u32).to_be_bytes().to_vec();
    msg.extend_from_slice(&data);
    c.write_all(&msg)?;
    let mut reply = [0u8; 9];
    c.read_exact(&mut reply)?;
    let sum = u64::from_be_bytes(reply[1..].try_into().unwrap());
    let want: u64 = data.iter().map(|b| u64::from(*b)).sum();
    assert_eq!(sum, want, "every byte arrived intact");
    Ok(reply[0])
}

fn connect(net: &Net, n: usize) -> Vec<TcpStream> {
    net.client
        .run(move || {
            (0..n)
                .map(|_| {
                    let c = TcpStream::connect_timeout(&SocketAddr::from((VIP, TCP_PORT)), Duration::from_secs(5))
                        .expect("connect to the VIP");
                    c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
                    c
                })
                .collect()
        })
        .unwrap()
}

fn udp_flows(net: &Net, n: usize) -> Vec<UdpSocket> {
    net.client
        .run(move || {
            (0..n)
                .map(|_| {
                    let s = UdpSocket::bind("0.0.0.0:0").unwrap();
                    s.connect((VIP, UDP_PORT)).unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
                    s
                })
                .collect()
        })
        .unwrap()
}

fn udp_round(s: &UdpSocket, payload: &[u8]) -> u8 {
    s.send(payload).unwrap();
    let mut buf = [0u8; 2048];
    let n = s.recv(&mut buf).expect("the echo arrives");
    assert_eq!(&buf[1..n], payload, "echo intact");
    buf[0]
}

fn shares(ids: &[u8], reals: usize) -> Vec<f64> {
    (0..reals).map(|r| ids.iter().filter(|i| **i as usize == r).count() as f64 / ids.len() as f64).collect()
}

fn assert_shares(what: &str, got: &[f64], weights: &[u32]) {
    let total: u32 = weights.iter().sum();
    for (i, (g, w)) in got.iter().zip(weights).enumerate() {
        let want = f64::from(*w) / f64::from(total);
        assert!((g - want).abs() < 0.1, "{what}: real {i} got {g:.3} of the flows, weight share {want:.3} ({got:?})");
    }
}

#[test]
fn tcp_and_udp_spread_by_weight_every_byte_arrives_and_removal_moves_only_its_flows() {
    if !netlane_testkit::privileged("lb_e2e_spread_and_removal") {
        return;
    }
    let net = build();
    net.lb.enter_on_this_thread().unwrap();
    let mut opts = LbOptions::new("l0", net.gw_mac);
    opts.max_vips = 4;
    let mut lb = Lb::start(&config(&[1, 2, 3], &[1, 1, 1]), opts).unwrap();
    assert_eq!(lb.mode(), XdpMode::Native, "veth takes native XDP");

    // TCP: 300 connections, 16 KiB each.
    let mut conns = connect(&net, 300);
    let ids: Vec<u8> = conns.iter_mut().enumerate().map(|(i, c)| round(c, i as u64, 16 << 10).unwrap()).collect();
    assert_shares("TCP", &shares(&ids, 3), &[1, 2, 3]);
    // UDP: 300 flows, 3 datagrams each, always the same real.
    let flows = udp_flows(&net, 300);
    let uids: Vec<u8> = flows
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let first = udp_round(s, format!("flow {i} #0").as_bytes());
            for k in 1..3 {
                assert_eq!(udp_round(s, format!("flow {i} #{k}").as_bytes()), first, "a UDP flow keeps its real");
            }
            first
        })
        .collect();
    assert_shares("UDP", &shares(&uids, 3), &[1, 1, 1]);

    let st = lb.stats().unwrap();
    for k in ["drop_malformed", "drop_no_real", "drop_encap", "drop_fragment", "drop_ip_options"] {
        assert_eq!(st.global[k], 0, "{k}");
    }
    let real_packets: u64 = st.vips.iter().flat_map(|v| v.reals.iter()).map(|r| r.packets).sum();
    assert_eq!(real_packets, st.global["tx"], "per-real counters add up to what was sent");
    assert!(st.vips.iter().all(|v| v.reals.iter().all(|r| r.packets > 0)), "{st:?}");

    // Remove real 2 from both VIPs, live.
    let changes = lb.apply(&config(&[1, 2], &[1, 1])).unwrap();
    assert_eq!(changes.len(), 2);
    for c in &changes {
        assert_eq!(c.removed, vec![IpAddr::V4(real_addr(2))]);
        assert!(c.slots_moved > 0 && c.slots_moved < 65537, "{c:?}");
    }
    // Connections on reals 0 and 1 carry on with the same real; those on real 2 are gone.
    let mut broken = 0;
    for (i, (c, id)) in conns.iter_mut().zip(&ids).enumerate() {
        match round(c, 1000 + i as u64, 4096) {
            Ok(now) => {
                assert_ne!(*id, 2, "connection {i} on the removed real still answered");
                assert_eq!(now, *id, "connection {i} kept its real");
            }
            Err(_) => {
                assert_eq!(*id, 2, "connection {i} on real {id} broke");
                broken += 1;
            }
        }
    }
    assert_eq!(broken, ids.iter().filter(|i| **i == 2).count());
    // UDP flows: those on reals 0 and 1 stay; those on real 2 move to 0 or 1.
    let mut moved = 0;
    for (i, (s, id)) in flows.iter().zip(&uids).enumerate() {
        let now = udp_round(s, format!("flow {i} after").as_bytes());
        if *id == 2 {
            assert_ne!(now, 2);
            moved += 1;
        } else {
            assert_eq!(now, *id, "UDP flow {i} kept its real");
        }
    }
    assert_eq!(moved, uids.iter().filter(|i| **i == 2).count());
    let st = lb.stats().unwrap();
    assert!(st.global["conn_stale"] > 0, "entries for the removed real went stale");
    drop(lb);
    // Detached: the VIP is no longer answered (nothing listens on the balancer).
    let mut late = connect_or_fail(&net);
    assert!(late.is_none() || round(late.as_mut().unwrap(), 1, 16).is_err());
}

fn connect_or_fail(net: &Net) -> Option<TcpStream> {
    net.client
        .run(|| TcpStream::connect_timeout(&SocketAddr::from((VIP, TCP_PORT)), Duration::from_millis(500)).ok())
        .unwrap()
}

/// Hints end to end: the device-bound build reads the RX hash through the kfunc; tags
/// arrive as the packet hash set by the classifier on the router's egress to the
/// balancer. Every mode must deliver every byte to the same real as before.
#[test]
fn hints_from_the_rx_hash_kfunc_and_classifier_tags() {
    if !netlane_testkit::privileged("lb_e2e_hints") {
        return;
    }
    let net = build();
    net.lb.enter_on_this_thread().unwrap();
    let router_ns = net.router.name().to_string();
    for hint in [HintMode::RxHash, HintMode::FlowTag, HintMode::DestTag, HintMode::DestTagDirect] {
        let mut opts = LbOptions::new("l0", net.gw_mac);
        opts.max_vips = 4;
        opts.hint = hint;
        opts.hint_source = HintSource::Kfunc;
        let mut lb = Lb::start(&config(&[1, 1, 1], &[1, 1, 1]), opts).unwrap();
        let classifier = if hint == HintMode::RxHash {
            None
        } else {
            Some(TcClassifier::attach(Some(&router_ns), "rl", 1024).unwrap())
        };
        if let Some(c) = classifier {
            lb.set_classifier(Box::new(c));
        }
        let mut conns = connect(&net, 20);
        let mut first: HashMap<usize, u8> = HashMap::new();
        for (i, c) in conns.iter_mut().enumerate() {
            first.insert(i, round(c, i as u64, 8192).unwrap());
        }
        // Tag the new flows (the events of their first packets).
        let mut handled = 0;
        for _ in 0..20 {
            handled += lb.service_events(Duration::from_millis(50)).unwrap();
        }
        for round_no in 0..3 {
            for (i, c) in conns.iter_mut().enumerate() {
                assert_eq!(round(c, (round_no * 100 + i) as u64, 8192).unwrap(), first[&i], "{hint:?}: same real");
            }
        }
        let st = lb.stats().unwrap();
        // 20 connections x 3 rounds after tagging, each round at least one packet.
        assert!(st.global["hint_hit"] >= 60, "{hint:?}: hints used: {:?}", st.global);
        assert_eq!(st.global["drop_no_real"] + st.global["drop_malformed"], 0);
        if hint != HintMode::RxHash {
            assert!(handled >= 20, "{hint:?}: one event per new connection at least, got {handled}");
            assert!(st.tags.installed >= 20, "{hint:?}: {:?}", st.tags);
            // An event that names a generation its real no longer has (read after the
            // real was removed or its index reused) is not tagged.
            let stale = netlane_lb::FlowEvent {
                flow: netlane_lb::FlowKey {
                    src: "10.210.0.77".parse().unwrap(),
                    dst: IpAddr::V4(VIP),
                    sport: 4242,
                    dport: TCP_PORT,
                    proto: 6,
                },
                real: 0,
                generation: 1000,
                hash: 1,
                vip: 0,
            };
            lb.tag_flow(&stale).unwrap();
            let after = lb.stats().unwrap();
            assert_eq!(after.tags.stale_events, st.tags.stale_events + 1, "{hint:?}");
            assert_eq!(after.tags.installed, st.tags.installed, "{hint:?}: nothing installed");
        }
    }
    // A device-bound program cannot run in generic mode: a clear error.
    let mut opts = LbOptions::new("l0", net.gw_mac);
    opts.hint = HintMode::RxHash;
    opts.force_generic = true;
    let e = Lb::start(&config(&[1], &[1]), opts).unwrap_err().to_string();
    assert!(e.contains("native mode"), "{e}");
}

#[test]
fn the_classifier_tags_frames_whose_headers_are_not_in_the_linear_part() {
    if !netlane_testkit::privileged("the_classifier_tags_frames_whose_headers_are_not_in_the_linear_part") {
        return;
    }
    // A packet socket's TX ring hands a frame to the stack with only the link-layer
    // header in the skb's linear part: the classifier must pull the rest in to see the
    // flow (it tagged nothing before, so no tag reached the balancer on that path).
    let a = Netns::create("tag-pull-a").unwrap();
    let b = Netns::create("tag-pull-b").unwrap();
    let (a0, _) = veth_link(
        End { ns: &a, name: "tp0", addrs: &[(IpAddr::V4(Ipv4Addr::new(10, 213, 0, 1)), 24)] },
        End { ns: &b, name: "tp1", addrs: &[(IpAddr::V4(Ipv4Addr::new(10, 213, 0, 2)), 24)] },
        1500,
    )
    .unwrap();
    let (tagged, seen) = a
        .run(move || {
            let tagger = netlane_sys::bpf::FlowTagger::load(16).unwrap();
            let _link = tagger.attach_egress(a0).unwrap();
            let flow = netlane_sys::bpf::FlowKey {
                src: IpAddr::V4(Ipv4Addr::new(10, 213, 0, 1)),
                dst: IpAddr::V4(VIP),
                sport: 40000,
                dport: 80,
                proto: 6,
            };
            tagger.set_rule(&flow, 0x1234_5678).unwrap();
            let mut f = vec![0u8; 64];
            f[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 9]);
            f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
            f[14] = 0x45;
            f[16..18].copy_from_slice(&50u16.to_be_bytes());
            f[22] = 64;
            f[23] = 6;
            f[26..30].copy_from_slice(&[10, 213, 0, 1]);
            f[30..34].copy_from_slice(&VIP.octets());
            f[34..36].copy_from_slice(&40000u16.to_be_bytes());
            f[36..38].copy_from_slice(&80u16.to_be_bytes());
            f[46] = 5 << 4;
            f[47] = 0x10;
            let mut tx = netlane_sys::packet::PacketTx::open(a0, 128, 64).unwrap();
            for _ in 0..5 {
                assert!(tx.push(f.len(), |d| d.copy_from_slice(&f)).unwrap());
            }
            tx.flush().unwrap();
            let start = std::time::Instant::now();
            while tagger.stats().unwrap().0 < 5 && start.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(10));
            }
            // Long enough for a sixth tag, if the classifier wrongly made one, to show.
            std::thread::sleep(Duration::from_millis(50));
            tagger.stats().unwrap()
        })
        .unwrap();
    // The kernel's own frames on a link just brought up (IPv6 neighbour discovery and
    // MLD reports) pass the classifier too: they are seen but match no rule.
    assert_eq!(tagged, 5, "every frame of the flow tagged, and only those (seen {seen})");
    assert!(seen >= 5, "the classifier saw every frame (seen {seen})");
}

/// The server's lifecycle: `start` returns attached (or with why it could not attach),
/// the balancer forwards while it runs, and `stop` detaches it with its last counters.
#[test]
fn the_server_handle_forwards_until_stopped_and_returns_its_last_counters() {
    if !netlane_testkit::privileged("the_server_handle_forwards_until_stopped_and_returns_its_last_counters") {
        return;
    }
    use netlane_lb::server::{ServeOptions, Server};
    let net = build_with("lbh", 2);
    let dir = std::env::temp_dir().join(format!("netlane-lb-handle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("lb.toml");
    let mut toml = format!(
        "ring_size = 4099\nconn_entries = 4096\n[[vip]]\naddress = \"{VIP}\"\nport = {UDP_PORT}\nproto = \"udp\"\n"
    );
    for i in 0..2 {
        toml += &format!("[[vip.real]]\naddress = \"{}\"\nweight = 1\n", real_addr(i));
    }
    std::fs::write(&file, toml).unwrap();
    let opts = |iface: &str| ServeOptions {
        config: file.clone(),
        lb: LbOptions::new(iface, net.gw_mac),
        classifier: None,
        stats_interval: Duration::from_secs(1),
        stats_json: None,
        prometheus: None,
        metrics_addr: None,
        time: None,
    };
    // No such interface: start says so, nothing is left running.
    let bad = opts("no-such-if0");
    let e = net.lb.run(move || Server::start(bad, |_| {})).unwrap().unwrap_err();
    let why = netlane::error::chain(&e).to_string();
    assert!(why.contains("no-such-if0"), "{why}");
    let good = opts(netlane_lb::testnet::LB_IFACE);
    let server = net.lb.run(move || Server::start(good, |_| {})).unwrap().unwrap();
    let flows = udp_flows(&net, 8);
    let ids: Vec<u8> = flows.iter().map(|s| udp_round(s, b"through the handle")).collect();
    assert!(ids.iter().all(|i| *i < 2), "{ids:?}");
    let last = server.stop().unwrap();
    assert!(last.global.get("tx").copied().unwrap_or(0) >= 8, "every datagram forwarded: {:?}", last.global);
    // Detached: the VIP no longer answers.
    let s = &udp_flows(&net, 1)[0];
    s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    s.send(b"after the stop").unwrap();
    assert!(s.recv(&mut [0u8; 64]).is_err(), "the balancer was detached");
    let _ = std::fs::remove_dir_all(&dir);
}

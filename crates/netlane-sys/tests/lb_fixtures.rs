//! The load balancer's data plane through BPF_PROG_RUN: a table of {name, input frame,
//! expected verdict, expected output frame}, frames built by a small builder, the
//! expected encapsulation computed independently here (including the flow hash).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlane_sys::bpf::{Balancer, BalancerSizes, Decap, test_run_xdp};

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
const XDP_TX: u32 = 3;

const GW: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const OWN: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x03];
const SRC4: Ipv4Addr = Ipv4Addr::new(172, 16, 0, 0);
const SRC6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x5eed, 0, 0, 0, 0, 0, 0);
const RING: u32 = 13;

fn may_load_bpf(test: &str) -> bool {
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(2) == Some("0")))
        .unwrap_or(false);
    if root {
        return true;
    }
    if std::env::var("NETLANE_REQUIRE_PRIVILEGED").as_deref() == Ok("1") {
        panic!("{test}: needs root to load BPF, and NETLANE_REQUIRE_PRIVILEGED=1 forbids skipping");
    }
    eprintln!("SKIPPED {test}: needs root to load BPF");
    false
}

// ---- a small packet builder ----

fn csum(b: &[u8]) -> u16 {
    let mut s: u32 = b.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))).sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

fn eth(dst: [u8; 6], src: [u8; 6], proto: u16, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&dst);
    v.extend_from_slice(&src);
    v.extend_from_slice(&proto.to_be_bytes());
    v.extend_from_slice(payload);
    v
}

struct V4 {
    src: Ipv4Addr,
    dst: Ipv4Addr,
    proto: u8,
    tos: u8,
    options: usize,
    frag: u16,
    ttl: u8,
}

fn ipv4(h: &V4, payload: &[u8]) -> Vec<u8> {
    let hl = 20 + h.options;
    let mut v = vec![0u8; hl];
    v[0] = 0x40 | (hl / 4) as u8;
    v[1] = h.tos;
    v[2..4].copy_from_slice(&((hl + payload.len()) as u16).to_be_bytes());
    v[6..8].copy_from_slice(&h.frag.to_be_bytes());
    v[8] = h.ttl;
    v[9] = h.proto;
    v[12..16].copy_from_slice(&h.src.octets());
    v[16..20].copy_from_slice(&h.dst.octets());
    let c = csum(&v);
    v[10..12].copy_from_slice(&c.to_be_bytes());
    v.extend_from_slice(payload);
    v
}

fn ipv6(src: Ipv6Addr, dst: Ipv6Addr, next: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![0u8; 40];
    v[0] = 0x60;
    v[4..6].copy_from_slice(&(payload.len() as u16).to_be_bytes());
    v[6] = next;
    v[7] = 64;
    v[8..24].copy_from_slice(&src.octets());
    v[24..40].copy_from_slice(&dst.octets());
    v.extend_from_slice(payload);
    v
}

fn tcp(sport: u16, dport: u16, flags: u8) -> Vec<u8> {
    let mut v = vec![0u8; 20];
    v[0..2].copy_from_slice(&sport.to_be_bytes());
    v[2..4].copy_from_slice(&dport.to_be_bytes());
    v[12] = 5 << 4;
    v[13] = flags;
    v.extend_from_slice(b"payload!");
    v
}

fn udp(sport: u16, dport: u16) -> Vec<u8> {
    let mut v = vec![0u8; 8];
    v[0..2].copy_from_slice(&sport.to_be_bytes());
    v[2..4].copy_from_slice(&dport.to_be_bytes());
    v[4..6].copy_from_slice(&16u16.to_be_bytes());
    v.extend_from_slice(b"datagram");
    v
}

fn v4(src: [u8; 4], dst: [u8; 4], proto: u8) -> V4 {
    V4 { src: src.into(), dst: dst.into(), proto, tos: 0x10, options: 0, frag: 0, ttl: 64 }
}

// ---- the expected result, computed independently ----

/// lookup3's final mix over three words (jhash_3words), as the data plane uses it.
fn jhash3(a: u32, b: u32, c: u32) -> u32 {
    let init = 0xdead_beefu32.wrapping_add(3 << 2).wrapping_add(0x6c61_6e65);
    let (mut a, mut b, mut c) = (a.wrapping_add(init), b.wrapping_add(init), c.wrapping_add(init));
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(14));
    a ^= c;
    a = a.wrapping_sub(c.rotate_left(11));
    b ^= a;
    b = b.wrapping_sub(a.rotate_left(25));
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(16));
    a ^= c;
    a = a.wrapping_sub(c.rotate_left(4));
    b ^= a;
    b = b.wrapping_sub(a.rotate_left(14));
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(24));
    c
}

/// The flow hash the balancer computes for a frame's source address, ports, protocol.
fn flow_hash(src: IpAddr, sport: u16, dport: u16, proto: u8) -> u32 {
    let s = match src {
        IpAddr::V4(a) => u32::from_ne_bytes(a.octets()),
        IpAddr::V6(a) => a.octets().chunks_exact(4).fold(0, |x, c| x ^ u32::from_ne_bytes([c[0], c[1], c[2], c[3]])),
    };
    let sp = u32::from(u16::from_ne_bytes(sport.to_be_bytes()));
    let dp = u32::from(u16::from_ne_bytes(dport.to_be_bytes()));
    jhash3(s, (sp << 16) | dp, u32::from(proto))
}

/// IPIP: the inner IP packet behind a new outer IPv4 header.
fn expect_ipip(inner_ip: &[u8], tos: u8, hash: u32, real: Ipv4Addr) -> Vec<u8> {
    let mut src = SRC4.octets();
    let h = ((hash & 0xffff) as u16).to_be_bytes();
    src[2] ^= h[0];
    src[3] ^= h[1];
    let mut outer = ipv4(&V4 { src: src.into(), dst: real, proto: 4, tos, options: 0, frag: 0, ttl: 64 }, inner_ip);
    // The builder's id is 0 like the data plane's; nothing else to adjust.
    outer.truncate(20 + inner_ip.len());
    eth(GW, OWN, 0x0800, &outer)
}

/// IPv6 outer header (inner IPv6 or IPv4).
fn expect_ip6(inner_ip: &[u8], next: u8, tos: u8, hash: u32, real: Ipv6Addr) -> Vec<u8> {
    let mut src = SRC6.octets();
    for (i, b) in hash.to_be_bytes().iter().enumerate() {
        src[12 + i] ^= b;
    }
    let mut v = ipv6(src.into(), real, next, inner_ip);
    v[0] = 0x60 | (tos >> 4);
    v[1] = ((tos & 0xf) << 4) | ((hash >> 16) & 0xf) as u8;
    v[2] = (hash >> 8) as u8;
    v[3] = hash as u8;
    eth(GW, OWN, 0x86dd, &v)
}

/// An ICMP (IPv4) message with its checksum.
fn icmp4(ty: u8, rest: &[u8]) -> Vec<u8> {
    let mut v = vec![ty, 0, 0, 0];
    v.extend_from_slice(rest);
    let c = csum(&v);
    v[2..4].copy_from_slice(&c.to_be_bytes());
    v
}

/// An ICMPv6 message with its checksum over the pseudo-header.
fn icmp6(src: Ipv6Addr, dst: Ipv6Addr, ty: u8, rest: &[u8]) -> Vec<u8> {
    let mut msg = vec![ty, 0, 0, 0];
    msg.extend_from_slice(rest);
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&src.octets());
    pseudo.extend_from_slice(&dst.octets());
    pseudo.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    pseudo.extend_from_slice(&[0, 0, 0, 58]);
    pseudo.extend_from_slice(&msg);
    let c = csum(&pseudo);
    msg[2..4].copy_from_slice(&c.to_be_bytes());
    msg
}

struct Fixture {
    name: &'static str,
    frame: Vec<u8>,
    verdict: u32,
    expect: Option<Vec<u8>>,
}

#[test]
fn balancer_fixtures() {
    if !may_load_bpf("balancer_fixtures") {
        return;
    }
    let b = Balancer::load(BalancerSizes { max_vips: 8, max_reals: 16, ring_size: RING, conn_entries: 1024 }).unwrap();
    b.set_config(GW, OWN, SRC4, SRC6).unwrap();
    let reals: [IpAddr; 4] = [
        "10.200.0.2".parse().unwrap(),
        "10.200.0.3".parse().unwrap(),
        "fd00:200::4".parse().unwrap(),
        "10.200.0.5".parse().unwrap(),
    ];
    for (i, r) in reals.iter().enumerate() {
        b.set_real(i as u32, *r).unwrap();
    }
    // VIP 0: 10.100.0.1:80/tcp, ring alternating reals 0 and 1.
    let ring0: Vec<u32> = (0..RING).map(|i| i % 2).collect();
    b.set_vip("10.100.0.1".parse().unwrap(), 80, 6, 0).unwrap();
    b.set_ring(0, &ring0).unwrap();
    // VIP 1: 10.100.0.2:any/udp -> real 3.
    b.set_vip("10.100.0.2".parse().unwrap(), 0, 17, 1).unwrap();
    b.set_ring(1, &[3; RING as usize]).unwrap();
    // VIP 2: [fd00:100::1]:443/tcp -> real 2 (IPv6).
    b.set_vip("fd00:100::1".parse().unwrap(), 443, 6, 2).unwrap();
    b.set_ring(2, &[2; RING as usize]).unwrap();
    // VIP 3: 10.100.0.3:53/udp -> real 2 (IPv4 VIP to an IPv6 real).
    b.set_vip("10.100.0.3".parse().unwrap(), 53, 17, 3).unwrap();
    b.set_ring(3, &[2; RING as usize]).unwrap();
    // VIP 4: 10.100.0.4:80/tcp with an empty ring.
    b.set_vip("10.100.0.4".parse().unwrap(), 80, 6, 4).unwrap();
    for a in ["10.100.0.1", "10.100.0.2", "fd00:100::1", "10.100.0.3", "10.100.0.4"] {
        b.set_vip_address(a.parse().unwrap(), true).unwrap();
    }
    b.set_vip_address("10.100.0.77".parse().unwrap(), true).unwrap();
    b.set_vip_address("10.100.0.77".parse().unwrap(), false).unwrap();

    let client: IpAddr = "192.0.2.7".parse().unwrap();
    let client6: Ipv6Addr = "2001:db8::7".parse().unwrap();
    let mut fixtures = Vec::new();

    // TCP SYN to VIP 0: the real from the ring slot the flow hash picks.
    let ip = ipv4(&v4([192, 0, 2, 7], [10, 100, 0, 1], 6), &tcp(40000, 80, 0x02));
    let h = flow_hash(client, 40000, 80, 6);
    let real =
        if ring0[(h % RING) as usize] == 0 { Ipv4Addr::new(10, 200, 0, 2) } else { Ipv4Addr::new(10, 200, 0, 3) };
    fixtures.push(Fixture {
        name: "IPv4 TCP SYN to a VIP: IPIP to the ring's real",
        frame: eth(OWN, CLIENT_MAC, 0x0800, &ip),
        verdict: XDP_TX,
        expect: Some(expect_ipip(&ip, 0x10, h, real)),
    });
    // Another client port: may pick the other real; still consistent with the ring.
    let ip2 = ipv4(&v4([192, 0, 2, 7], [10, 100, 0, 1], 6), &tcp(40001, 80, 0x10));
    let h2 = flow_hash(client, 40001, 80, 6);
    let real2 =
        if ring0[(h2 % RING) as usize] == 0 { Ipv4Addr::new(10, 200, 0, 2) } else { Ipv4Addr::new(10, 200, 0, 3) };
    fixtures.push(Fixture {
        name: "IPv4 TCP ACK, new flow: ring lookup",
        frame: eth(OWN, CLIENT_MAC, 0x0800, &ip2),
        verdict: XDP_TX,
        expect: Some(expect_ipip(&ip2, 0x10, h2, real2)),
    });
    // UDP to the wildcard-port VIP.
    let ipu = ipv4(&v4([192, 0, 2, 7], [10, 100, 0, 2], 17), &udp(5000, 9999));
    fixtures.push(Fixture {
        name: "IPv4 UDP to a port-0 VIP",
        frame: eth(OWN, CLIENT_MAC, 0x0800, &ipu),
        verdict: XDP_TX,
        expect: Some(expect_ipip(&ipu, 0x10, flow_hash(client, 5000, 9999, 17), Ipv4Addr::new(10, 200, 0, 5))),
    });
    // IPv6 VIP to an IPv6 real.
    let ip6 = ipv6(client6, "fd00:100::1".parse().unwrap(), 6, &tcp(50000, 443, 0x02));
    fixtures.push(Fixture {
        name: "IPv6 TCP to a VIP: IPv6-in-IPv6",
        frame: eth(OWN, CLIENT_MAC, 0x86dd, &ip6),
        verdict: XDP_TX,
        expect: Some(expect_ip6(&ip6, 41, 0, flow_hash(client6.into(), 50000, 443, 6), "fd00:200::4".parse().unwrap())),
    });
    // IPv4 VIP to an IPv6 real.
    let ip46 = ipv4(&v4([192, 0, 2, 7], [10, 100, 0, 3], 17), &udp(5353, 53));
    fixtures.push(Fixture {
        name: "IPv4 UDP VIP with an IPv6 real: IPv4-in-IPv6",
        frame: eth(OWN, CLIENT_MAC, 0x0800, &ip46),
        verdict: XDP_TX,
        expect: Some(expect_ip6(&ip46, 4, 0x10, flow_hash(client, 5353, 53, 17), "fd00:200::4".parse().unwrap())),
    });
    // Passed to the stack, unchanged.
    let other = eth(OWN, CLIENT_MAC, 0x0800, &ipv4(&v4([192, 0, 2, 7], [10, 100, 0, 9], 6), &tcp(1, 80, 0x02)));
    fixtures.push(Fixture {
        name: "IPv4 to no VIP: pass",
        frame: other.clone(),
        verdict: XDP_PASS,
        expect: Some(other),
    });
    let wrong_port = eth(OWN, CLIENT_MAC, 0x0800, &ipv4(&v4([192, 0, 2, 7], [10, 100, 0, 1], 6), &tcp(1, 81, 0x02)));
    fixtures.push(Fixture {
        name: "known address, unknown port: pass",
        frame: wrong_port.clone(),
        verdict: XDP_PASS,
        expect: Some(wrong_port),
    });
    let arp = eth([0xff; 6], CLIENT_MAC, 0x0806, &[0u8; 28]);
    fixtures.push(Fixture { name: "ARP: pass", frame: arp.clone(), verdict: XDP_PASS, expect: Some(arp) });
    // ICMP echo to a VIP address: answered here, MACs and addresses swapped.
    let echo = ipv4(&v4([192, 0, 2, 7], [10, 100, 0, 1], 1), &icmp4(8, b"\x00\x01\x00\x07ping"));
    let reply = ipv4(&v4([10, 100, 0, 1], [192, 0, 2, 7], 1), &icmp4(0, b"\x00\x01\x00\x07ping"));
    fixtures.push(Fixture {
        name: "ICMP echo to a VIP: reply",
        frame: eth(OWN, CLIENT_MAC, 0x0800, &echo),
        verdict: XDP_TX,
        expect: Some(eth(CLIENT_MAC, OWN, 0x0800, &reply)),
    });
    let vip6: Ipv6Addr = "fd00:100::1".parse().unwrap();
    let echo6 = ipv6(client6, vip6, 58, &icmp6(client6, vip6, 128, b"\x00\x02\x00\x09ping6"));
    let reply6 = ipv6(vip6, client6, 58, &icmp6(vip6, client6, 129, b"\x00\x02\x00\x09ping6"));
    fixtures.push(Fixture {
        name: "ICMPv6 echo to a VIP: reply",
        frame: eth(OWN, CLIENT_MAC, 0x86dd, &echo6),
        verdict: XDP_TX,
        expect: Some(eth(CLIENT_MAC, OWN, 0x86dd, &reply6)),
    });
    let stray = eth(OWN, CLIENT_MAC, 0x0800, &ipv4(&v4([192, 0, 2, 7], [10, 100, 0, 77], 1), &icmp4(8, b"ping")));
    fixtures.push(Fixture {
        name: "ICMP echo to a removed VIP address: pass",
        frame: stray.clone(),
        verdict: XDP_PASS,
        expect: Some(stray),
    });
    let pong = eth(OWN, CLIENT_MAC, 0x0800, &ipv4(&v4([192, 0, 2, 7], [10, 100, 0, 1], 1), &icmp4(0, b"pong")));
    fixtures.push(Fixture {
        name: "ICMP echo reply to a VIP: pass",
        frame: pong.clone(),
        verdict: XDP_PASS,
        expect: Some(pong),
    });
    // Dropped.
    let opts = V4 { options: 4, ..v4([192, 0, 2, 7], [10, 100, 0, 1], 6) };
    fixtures.push(Fixture {
        name: "IPv4 options: drop",
        frame: eth(OWN, CLIENT_MAC, 0x0800, &ipv4(&opts, &tcp(1, 80, 0x02))),
        verdict: XDP_DROP,
        expect: None,
    });
    let frag = V4 { frag: 0x2000, ..v4([192, 0, 2, 7], [10, 100, 0, 1], 17) };
    fixtures.push(Fixture {
        name: "IPv4 fragment: drop",
        frame: eth(OWN, CLIENT_MAC, 0x0800, &ipv4(&frag, &udp(1, 80))),
        verdict: XDP_DROP,
        expect: None,
    });
    fixtures.push(Fixture {
        name: "IPv6 fragment header: drop",
        frame: eth(OWN, CLIENT_MAC, 0x86dd, &ipv6(client6, "fd00:100::1".parse().unwrap(), 44, &[0u8; 16])),
        verdict: XDP_DROP,
        expect: None,
    });
    let mut short = eth(OWN, CLIENT_MAC, 0x0800, &ipv4(&v4([192, 0, 2, 7], [10, 100, 0, 1], 6), &tcp(1, 80, 0x02)));
    short.truncate(14 + 20 + 10);
    fixtures.push(Fixture { name: "truncated TCP header: drop", frame: short, verdict: XDP_DROP, expect: None });
    fixtures.push(Fixture {
        name: "VIP with an empty ring: drop",
        frame: eth(OWN, CLIENT_MAC, 0x0800, &ipv4(&v4([192, 0, 2, 7], [10, 100, 0, 4], 6), &tcp(1, 80, 0x02))),
        verdict: XDP_DROP,
        expect: None,
    });

    for f in &fixtures {
        let r = test_run_xdp(b.program(), &f.frame).unwrap_or_else(|e| panic!("{}: {e}", f.name));
        assert_eq!(r.verdict, f.verdict, "{}: verdict", f.name);
        if let Some(want) = &f.expect {
            assert_eq!(&r.packet, want, "{}: output frame", f.name);
        }
    }
    // Counters: 5 encapsulated, 2 echoes answered, 5 passed (one non-IP), 5 dropped.
    let s = b.global_stats().unwrap();
    let (pass_non_ip, pass_non_vip, malformed, options, fragment, no_real, _encap, tx) =
        (s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]);
    assert_eq!((pass_non_ip, pass_non_vip, malformed, options, fragment, no_real, tx), (1, 4, 1, 1, 2, 1, 5));
    assert_eq!(s[10], 2, "echo requests answered");
    // The established second packet of the first flow hits the connection table.
    let ack = eth(OWN, CLIENT_MAC, 0x0800, &ipv4(&v4([192, 0, 2, 7], [10, 100, 0, 1], 6), &tcp(40000, 80, 0x10)));
    let before = b.global_stats().unwrap()[8];
    assert_eq!(test_run_xdp(b.program(), &ack).unwrap().verdict, XDP_TX);
    assert_eq!(b.global_stats().unwrap()[8], before + 1, "connection-table hit");
}

#[test]
fn decap_restores_the_inner_packet() {
    if !may_load_bpf("decap_restores_the_inner_packet") {
        return;
    }
    let d = Decap::load().unwrap();
    let inner4 = ipv4(&v4([192, 0, 2, 7], [10, 100, 0, 1], 6), &tcp(40000, 80, 0x02));
    let inner6 = ipv6("2001:db8::7".parse().unwrap(), "fd00:100::1".parse().unwrap(), 6, &tcp(50000, 443, 0x02));
    let real6: Ipv6Addr = "fd00:200::4".parse().unwrap();
    let cases: Vec<(&str, Vec<u8>, Vec<u8>)> = vec![
        ("IPIP", expect_ipip(&inner4, 0x10, 7, Ipv4Addr::new(10, 200, 0, 2)), eth(GW, OWN, 0x0800, &inner4)),
        ("IPv6 in IPv6", expect_ip6(&inner6, 41, 0, 9, real6), eth(GW, OWN, 0x86dd, &inner6)),
        ("IPv4 in IPv6", expect_ip6(&inner4, 4, 0x10, 11, real6), eth(GW, OWN, 0x0800, &inner4)),
    ];
    for (name, frame, want) in cases {
        let r = test_run_xdp(d.program(), &frame).unwrap();
        assert_eq!(r.verdict, XDP_PASS, "{name}");
        assert_eq!(r.packet, want, "{name}: inner packet");
    }
    // Not encapsulated: untouched.
    let plain = eth(GW, OWN, 0x0800, &inner4);
    let r = test_run_xdp(d.program(), &plain).unwrap();
    assert_eq!((r.verdict, r.packet), (XDP_PASS, plain));
}

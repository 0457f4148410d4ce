//! The load balancer's data plane through BPF_PROG_RUN: a table of {name, input frame,
//! expected verdict, expected output frame}, frames built by a small builder, the
//! expected encapsulation computed independently here (including the flow hash).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlane_sys::bpf::{
    Balancer, BalancerOptions, BalancerSizes, DataPlaneConfig, Decap, GlobalStat, HintMode, TagKey, test_run_xdp,
    test_run_xdp_with_meta,
};

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

fn config() -> DataPlaneConfig {
    DataPlaneConfig { gw_mac: GW, own_mac: OWN, src4: SRC4, src6: SRC6, max_new_conns_per_cpu: 0, udp_timeout_ms: 0 }
}

/// Keeps the calling test's thread on one CPU: the program runs on the caller's CPU,
/// and its hint cache and new-connection rate are per CPU, so a thread the scheduler
/// moved between two runs would see another CPU's state.
fn stay_on_one_cpu() {
    let allowed = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).unwrap();
    let cpu = (0..nix::sched::CpuSet::count()).find(|&c| allowed.is_set(c).unwrap_or(false)).unwrap();
    let mut one = nix::sched::CpuSet::new();
    one.set(cpu).unwrap();
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &one).unwrap();
}

/// A balancer with five VIPs:
/// - 0: 10.100.0.1:80/tcp, ring alternating reals 0 (10.200.0.2) and 1 (10.200.0.3);
/// - 1: 10.100.0.2:any/udp -> real 3 (10.200.0.5);
/// - 2: [fd00:100::1]:443/tcp -> real 2 (fd00:200::4);
/// - 3: 10.100.0.3:53/udp -> real 4 (fd00:200::4 again: IPv4 VIP to an IPv6 real);
/// - 4: 10.100.0.4:80/tcp with an empty ring;
/// - 5: 10.100.0.5:80/tcp, "no LRU", -> real 5 (10.200.0.6).
fn setup(hint: HintMode, cfg: DataPlaneConfig) -> Balancer {
    stay_on_one_cpu();
    let opts = BalancerOptions { sizes: BalancerSizes::new(8, 16, RING, 1024), hint, bind_ifindex: None };
    let b = Balancer::load(&opts).unwrap();
    b.set_config(&cfg).unwrap();
    let reals: [(&str, u32); 6] = [
        ("10.200.0.2", 0),
        ("10.200.0.3", 0),
        ("fd00:200::4", 2),
        ("10.200.0.5", 1),
        ("fd00:200::4", 3),
        ("10.200.0.6", 5),
    ];
    for (i, (r, vip)) in reals.iter().enumerate() {
        b.set_real(i as u32, r.parse().unwrap(), *vip, 1).unwrap();
    }
    let ring0: Vec<u32> = (0..RING).map(|i| i % 2).collect();
    b.set_vip("10.100.0.1".parse().unwrap(), 80, 6, 0, false).unwrap();
    b.set_ring(0, &ring0).unwrap();
    b.set_vip("10.100.0.2".parse().unwrap(), 0, 17, 1, false).unwrap();
    b.set_ring(1, &[3; RING as usize]).unwrap();
    b.set_vip("fd00:100::1".parse().unwrap(), 443, 6, 2, false).unwrap();
    b.set_ring(2, &[2; RING as usize]).unwrap();
    b.set_vip("10.100.0.3".parse().unwrap(), 53, 17, 3, false).unwrap();
    b.set_ring(3, &[4; RING as usize]).unwrap();
    b.set_vip("10.100.0.4".parse().unwrap(), 80, 6, 4, false).unwrap();
    b.set_vip("10.100.0.5".parse().unwrap(), 80, 6, 5, true).unwrap();
    b.set_ring(5, &[5; RING as usize]).unwrap();
    for a in ["10.100.0.1", "10.100.0.2", "fd00:100::1", "10.100.0.3", "10.100.0.4", "10.100.0.5"] {
        b.set_vip_address(a.parse().unwrap(), true).unwrap();
    }
    b.set_vip_address("10.100.0.77".parse().unwrap(), true).unwrap();
    b.set_vip_address("10.100.0.77".parse().unwrap(), false).unwrap();
    b
}

fn stat(b: &Balancer, s: GlobalStat) -> u64 {
    b.global_stats().unwrap()[s.index()]
}

/// Real 0 or 1 of VIP 0, as its ring (alternating) picks for hash `h`.
fn vip0_real(h: u32) -> (u32, Ipv4Addr) {
    if (h % RING).is_multiple_of(2) { (0, Ipv4Addr::new(10, 200, 0, 2)) } else { (1, Ipv4Addr::new(10, 200, 0, 3)) }
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
    let b = setup(HintMode::Off, DataPlaneConfig { ..config() });
    let ring0: Vec<u32> = (0..RING).map(|i| i % 2).collect();

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
    // Length fields the frame does not back: the outer length would be computed from them.
    let mut long4 = ipv4(&v4([192, 0, 2, 7], [10, 100, 0, 1], 6), &tcp(1, 80, 0x02));
    long4[2..4].copy_from_slice(&65535u16.to_be_bytes());
    fixtures.push(Fixture {
        name: "IPv4 total length 65535 in a short frame (outer length would wrap to 19): drop",
        frame: eth(OWN, CLIENT_MAC, 0x0800, &long4),
        verdict: XDP_DROP,
        expect: None,
    });
    let mut tiny4 = ipv4(&v4([192, 0, 2, 7], [10, 100, 0, 1], 6), &tcp(1, 80, 0x02));
    tiny4[2..4].copy_from_slice(&12u16.to_be_bytes());
    fixtures.push(Fixture {
        name: "IPv4 total length shorter than its header: drop",
        frame: eth(OWN, CLIENT_MAC, 0x0800, &tiny4),
        verdict: XDP_DROP,
        expect: None,
    });
    let mut long6 = ipv6(client6, "fd00:100::1".parse().unwrap(), 6, &tcp(50001, 443, 0x02));
    long6[4..6].copy_from_slice(&65535u16.to_be_bytes());
    fixtures.push(Fixture {
        name: "IPv6 payload length 65535 in a short frame: drop",
        frame: eth(OWN, CLIENT_MAC, 0x86dd, &long6),
        verdict: XDP_DROP,
        expect: None,
    });
    let mut v6in4 = ipv4(&v4([192, 0, 2, 7], [10, 100, 0, 1], 6), &tcp(1, 80, 0x02));
    v6in4[0] = 0x65;
    fixtures.push(Fixture {
        name: "IPv4 ethertype with IP version 6: drop",
        frame: eth(OWN, CLIENT_MAC, 0x0800, &v6in4),
        verdict: XDP_DROP,
        expect: None,
    });
    let mut v4in6 = ipv6(client6, "fd00:100::1".parse().unwrap(), 6, &tcp(50002, 443, 0x02));
    v4in6[0] = 0x40;
    fixtures.push(Fixture {
        name: "IPv6 ethertype with IP version 4: drop",
        frame: eth(OWN, CLIENT_MAC, 0x86dd, &v4in6),
        verdict: XDP_DROP,
        expect: None,
    });
    let mut ihl15 = ipv4(&v4([192, 0, 2, 7], [10, 100, 0, 1], 6), &tcp(1, 80, 0x02));
    ihl15[0] = 0x4f;
    fixtures.push(Fixture {
        name: "IHL 15 (60-byte header) on a 40-byte packet: drop as malformed",
        frame: eth(OWN, CLIENT_MAC, 0x0800, &ihl15),
        verdict: XDP_DROP,
        expect: None,
    });
    // A frag-needed error to the VIP that quotes too little to name a flow.
    let cut = ipv4(&v4([198, 51, 100, 1], [10, 100, 0, 1], 1), &icmp4(3, &[0, 4, 0x05, 0xdc, 0x45, 0, 0, 40]));
    let mut cut_frame = eth(OWN, CLIENT_MAC, 0x0800, &cut);
    cut_frame[14 + 21] = 4; // code 4: fragmentation needed (icmp4 writes code 0)
    fixtures.push(Fixture {
        name: "ICMP frag-needed to a VIP with a truncated quote: drop",
        frame: cut_frame,
        verdict: XDP_DROP,
        expect: None,
    });
    // IPv6 with a hop-by-hop header (next header 0) to the VIP address, and to another.
    let hbh = [6u8, 0, 1, 4, 0, 0, 0, 0];
    let mut hbh_tcp = hbh.to_vec();
    hbh_tcp.extend_from_slice(&tcp(50003, 443, 0x02));
    fixtures.push(Fixture {
        name: "IPv6 extension-header chain to a VIP: drop (unsupported)",
        frame: eth(OWN, CLIENT_MAC, 0x86dd, &ipv6(client6, "fd00:100::1".parse().unwrap(), 0, &hbh_tcp)),
        verdict: XDP_DROP,
        expect: None,
    });
    let ext_other = eth(OWN, CLIENT_MAC, 0x86dd, &ipv6(client6, "fd00:100::99".parse().unwrap(), 0, &hbh_tcp));
    fixtures.push(Fixture {
        name: "IPv6 extension-header chain to another address: pass",
        frame: ext_other.clone(),
        verdict: XDP_PASS,
        expect: Some(ext_other),
    });
    // Ethernet padding after a short packet: encapsulated with the IP length, padding kept.
    let short_udp = ipv4(&v4([192, 0, 2, 7], [10, 100, 0, 2], 17), &udp(5001, 7));
    let mut padded = eth(OWN, CLIENT_MAC, 0x0800, &short_udp);
    padded.extend_from_slice(&[0u8; 6]);
    let mut want = expect_ipip(&short_udp, 0x10, flow_hash(client, 5001, 7, 17), Ipv4Addr::new(10, 200, 0, 5));
    want.extend_from_slice(&[0u8; 6]);
    fixtures.push(Fixture {
        name: "IPv4 UDP with Ethernet padding: the outer length counts the IP packet only",
        frame: padded,
        verdict: XDP_TX,
        expect: Some(want),
    });
    fixtures.push(Fixture {
        name: "VIP with an empty ring: drop",
        frame: eth(OWN, CLIENT_MAC, 0x0800, &ipv4(&v4([192, 0, 2, 7], [10, 100, 0, 4], 6), &tcp(1, 80, 0x02))),
        verdict: XDP_DROP,
        expect: None,
    });

    for f in &fixtures {
        let r = test_run_xdp(b.program().unwrap(), &f.frame).unwrap_or_else(|e| panic!("{}: {e}", f.name));
        assert_eq!(r.verdict, f.verdict, "{}: verdict", f.name);
        if let Some(want) = &f.expect {
            assert_eq!(&r.packet, want, "{}: output frame", f.name);
        }
    }
    // Counters: 6 encapsulated, 2 echoes answered, 6 passed (one non-IP), 14 dropped.
    let s = b.global_stats().unwrap();
    assert_eq!(s.len(), GlobalStat::ALL.len(), "the map and GlobalStat::ALL list the same counters");
    let (pass_non_ip, pass_non_vip, malformed, options, fragment, no_real, _encap, tx) =
        (s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]);
    assert_eq!((pass_non_ip, pass_non_vip, malformed, options, fragment, no_real, tx), (1, 5, 8, 1, 2, 1, 6));
    assert_eq!(s[10], 2, "echo requests answered");
    assert_eq!(s[GlobalStat::DropUnsupported.index()], 1, "extension-header chain to a VIP");
    // The first flow's SYN was forwarded by the ring alone; its first packet past the
    // SYN is recorded, and the one after hits the connection table.
    let ack = eth(OWN, CLIENT_MAC, 0x0800, &ipv4(&v4([192, 0, 2, 7], [10, 100, 0, 1], 6), &tcp(40000, 80, 0x10)));
    let before = stat(&b, GlobalStat::ConnHit);
    assert_eq!(test_run_xdp(b.program().unwrap(), &ack).unwrap().verdict, XDP_TX);
    assert_eq!(stat(&b, GlobalStat::ConnHit), before, "a SYN leaves no entry");
    assert_eq!(test_run_xdp(b.program().unwrap(), &ack).unwrap().verdict, XDP_TX);
    assert_eq!(stat(&b, GlobalStat::ConnHit), before + 1, "connection-table hit");
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

/// An IPv4 TCP frame client:sport -> 10.100.0.1:80 (VIP 0) with `flags`.
fn vip0_frame(sport: u16, flags: u8) -> (Vec<u8>, Vec<u8>) {
    let ip = ipv4(&v4([192, 0, 2, 7], [10, 100, 0, 1], 6), &tcp(sport, 80, flags));
    (eth(OWN, CLIENT_MAC, 0x0800, &ip), ip)
}

fn client() -> IpAddr {
    "192.0.2.7".parse().unwrap()
}

#[test]
fn icmp_too_big_goes_to_the_flows_real() {
    if !may_load_bpf("icmp_too_big_goes_to_the_flows_real") {
        return;
    }
    let b = setup(HintMode::Off, config());
    let router = Ipv4Addr::new(192, 0, 2, 254);
    // The real's reply VIP:80 -> client:41000 was too big for a router on the way; the
    // router tells the VIP.
    let quoted = ipv4(&v4([10, 100, 0, 1], [192, 0, 2, 7], 6), &tcp(80, 41000, 0x10));
    let mut msg = vec![3, 4, 0, 0, 0, 0, 0x05, 0xdc]; // frag needed, next-hop MTU 1500
    msg.extend_from_slice(&quoted[..28]);
    let c = csum(&msg);
    msg[2..4].copy_from_slice(&c.to_be_bytes());
    let ip = ipv4(&v4(router.octets(), [10, 100, 0, 1], 1), &msg);
    let h = flow_hash(client(), 41000, 80, 6);
    let (_, real) = vip0_real(h);
    let r = test_run_xdp(b.program().unwrap(), &eth(OWN, CLIENT_MAC, 0x0800, &ip)).unwrap();
    assert_eq!(r.verdict, XDP_TX, "frag-needed for a VIP flow");
    assert_eq!(r.packet, expect_ipip(&ip, 0x10, h, real), "encapsulated whole to the flow's real");
    assert_eq!(stat(&b, GlobalStat::IcmpTooBig), 1);
    // It did not create a connection entry: the flow's first packet is still a miss.
    let before = stat(&b, GlobalStat::ConnMiss);
    test_run_xdp(b.program().unwrap(), &vip0_frame(41000, 0x10).0).unwrap();
    assert_eq!(stat(&b, GlobalStat::ConnMiss), before + 1);

    // ICMPv6 packet too big about [fd00:100::1]:443 -> [2001:db8::7]:50000.
    let vip6: Ipv6Addr = "fd00:100::1".parse().unwrap();
    let client6: Ipv6Addr = "2001:db8::7".parse().unwrap();
    let router6: Ipv6Addr = "2001:db8::fe".parse().unwrap();
    let quoted6 = ipv6(vip6, client6, 6, &tcp(443, 50000, 0x10));
    let mut body6 = 1280u32.to_be_bytes().to_vec();
    body6.extend_from_slice(&quoted6[..48]);
    let ip6 = ipv6(router6, vip6, 58, &icmp6(router6, vip6, 2, &body6));
    let h6 = flow_hash(client6.into(), 50000, 443, 6);
    let r = test_run_xdp(b.program().unwrap(), &eth(OWN, CLIENT_MAC, 0x86dd, &ip6)).unwrap();
    assert_eq!(r.verdict, XDP_TX, "packet-too-big for a VIP flow");
    assert_eq!(r.packet, expect_ip6(&ip6, 41, 0, h6, "fd00:200::4".parse().unwrap()));
    // Too-big quoting a packet from a non-VIP: passed to the stack untouched.
    let stray = ipv6(router6, "fd00:100::9".parse().unwrap(), 58, &icmp6(router6, vip6, 2, &body6));
    let frame = eth(OWN, CLIENT_MAC, 0x86dd, &stray);
    let mut other = frame.clone();
    // Quote a different source so no VIP matches.
    other[14 + 40 + 8 + 8 + 15] ^= 0x01;
    let r = test_run_xdp(b.program().unwrap(), &other).unwrap();
    assert_eq!((r.verdict, r.packet), (XDP_PASS, other));
}

#[test]
fn connection_state_rules() {
    if !may_load_bpf("connection_state_rules") {
        return;
    }
    let b = setup(HintMode::Off, DataPlaneConfig { max_new_conns_per_cpu: 3, udp_timeout_ms: 1, ..config() });
    let prog = b.program().unwrap();
    // "No LRU" VIP: two packets of one flow, no connection-table hit.
    let ip = ipv4(&v4([192, 0, 2, 7], [10, 100, 0, 5], 6), &tcp(42000, 80, 0x10));
    let frame = eth(OWN, CLIENT_MAC, 0x0800, &ip);
    for _ in 0..2 {
        let r = test_run_xdp(prog, &frame).unwrap();
        let want = expect_ipip(&ip, 0x10, flow_hash(client(), 42000, 80, 6), Ipv4Addr::new(10, 200, 0, 6));
        assert_eq!((r.verdict, r.packet), (XDP_TX, want));
    }
    assert_eq!(stat(&b, GlobalStat::ConnHit), 0, "no-LRU VIP keeps no state");

    // Rate guard: 3 new connections per second per CPU are recorded; the 4th and 5th
    // are forwarded but not recorded.
    for port in 43000..43005 {
        assert_eq!(test_run_xdp(prog, &vip0_frame(port, 0x10).0).unwrap().verdict, XDP_TX);
    }
    assert_eq!(stat(&b, GlobalStat::ConnRateLimited), 2, "no-LRU packets don't count; 2 over the limit");
}

#[test]
fn removed_real_and_idle_udp_entries_go_stale() {
    if !may_load_bpf("removed_real_and_idle_udp_entries_go_stale") {
        return;
    }
    let b = setup(HintMode::Off, DataPlaneConfig { udp_timeout_ms: 1, ..config() });
    let prog = b.program().unwrap();
    // Find a flow the ring sends to real 0, establish it, then remove real 0.
    let port = (44000u16..).find(|p| vip0_real(flow_hash(client(), *p, 80, 6)).0 == 0).unwrap();
    let (frame, ip) = vip0_frame(port, 0x10);
    let h = flow_hash(client(), port, 80, 6);
    assert_eq!(test_run_xdp(prog, &frame).unwrap().packet, expect_ipip(&ip, 0x10, h, Ipv4Addr::new(10, 200, 0, 2)));
    assert_eq!(test_run_xdp(prog, &frame).unwrap().verdict, XDP_TX);
    assert_eq!(stat(&b, GlobalStat::ConnHit), 1);
    b.clear_real(0, 2).unwrap();
    b.set_ring(0, &[1; RING as usize]).unwrap();
    let r = test_run_xdp(prog, &frame).unwrap();
    assert_eq!(r.packet, expect_ipip(&ip, 0x10, h, Ipv4Addr::new(10, 200, 0, 3)), "moved to the remaining real");
    assert_eq!(stat(&b, GlobalStat::ConnStale), 1);
    // The new entry holds.
    test_run_xdp(prog, &frame).unwrap();
    assert_eq!(stat(&b, GlobalStat::ConnHit), 2);

    // UDP entries expire after 1 ms idle.
    let ipu = ipv4(&v4([192, 0, 2, 7], [10, 100, 0, 2], 17), &udp(5000, 9999));
    let fu = eth(OWN, CLIENT_MAC, 0x0800, &ipu);
    test_run_xdp(prog, &fu).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    let stale = stat(&b, GlobalStat::ConnStale);
    assert_eq!(test_run_xdp(prog, &fu).unwrap().verdict, XDP_TX);
    assert_eq!(stat(&b, GlobalStat::ConnStale), stale + 1, "idle UDP entry expired");
}

fn hint(h: u32) -> [u8; 4] {
    h.to_ne_bytes()
}

#[test]
fn rx_hash_flow_cache() {
    if !may_load_bpf("rx_hash_flow_cache") {
        return;
    }
    let b = setup(HintMode::RxHash, config());
    let prog = b.program().unwrap();
    let port = (45000u16..).find(|p| vip0_real(flow_hash(client(), *p, 80, 6)).0 == 0).unwrap();
    let (frame, ip) = vip0_frame(port, 0x10);
    let want = expect_ipip(&ip, 0x10, flow_hash(client(), port, 80, 6), Ipv4Addr::new(10, 200, 0, 2));
    // First packet fills the cache slot (miss), the second uses it (hit).
    for expect_hits in [0, 1] {
        let r = test_run_xdp_with_meta(prog, &hint(0x1234_5678), &frame).unwrap();
        assert_eq!((r.verdict, &r.packet), (XDP_TX, &want));
        assert_eq!(stat(&b, GlobalStat::HintHit), expect_hits);
    }
    assert_eq!(stat(&b, GlobalStat::ConnHit), 0, "the hit skipped the connection table");
    // Another flow with the same hash: the cached flow does not match: full path.
    let (other, other_ip) = vip0_frame(port + 1, 0x10);
    let h2 = flow_hash(client(), port + 1, 80, 6);
    let r = test_run_xdp_with_meta(prog, &hint(0x1234_5678), &other).unwrap();
    assert_eq!(r.packet, expect_ipip(&other_ip, 0x10, h2, vip0_real(h2).1));
    assert_eq!(stat(&b, GlobalStat::HintMiss), 2);
    assert_eq!((stat(&b, GlobalStat::HintMiss), stat(&b, GlobalStat::HintStale)), (2, 0));
    // No metadata at all: the full path, same result.
    assert_eq!(test_run_xdp(prog, &frame).unwrap().packet, want);
    // The slot is back to our flow (a miss that refills it)...
    test_run_xdp_with_meta(prog, &hint(0x1234_5678), &frame).unwrap();
    assert_eq!(stat(&b, GlobalStat::HintMiss), 3);
    // ...then its real is removed: the entry is stale and the flow moves.
    b.set_ring(0, &[1; RING as usize]).unwrap();
    b.clear_real(0, 2).unwrap();
    let r = test_run_xdp_with_meta(prog, &hint(0x1234_5678), &frame).unwrap();
    assert_eq!(r.packet, expect_ipip(&ip, 0x10, flow_hash(client(), port, 80, 6), Ipv4Addr::new(10, 200, 0, 3)));
    assert_eq!((stat(&b, GlobalStat::HintStale), stat(&b, GlobalStat::HintHit)), (1, 1));
}

#[test]
fn flow_tags_events_and_stale_tags() {
    if !may_load_bpf("flow_tags_events_and_stale_tags") {
        return;
    }
    let b = setup(HintMode::FlowTag, config());
    let prog = b.program().unwrap();
    let mut events = b.events().unwrap();
    let port = (46000u16..).find(|p| vip0_real(flow_hash(client(), *p, 80, 6)).0 == 1).unwrap();
    let (frame, ip) = vip0_frame(port, 0x10);
    let h = flow_hash(client(), port, 80, 6);
    let want = expect_ipip(&ip, 0x10, h, Ipv4Addr::new(10, 200, 0, 3));
    // An untagged new flow: forwarded, and an event tells the control plane.
    assert_eq!(test_run_xdp(prog, &frame).unwrap().packet, want);
    let ev = events.drain().unwrap();
    assert_eq!(ev.len(), 1, "one new-flow event");
    let e = ev[0];
    assert_eq!((e.real, e.generation, e.hash, e.vip), (1, 1, h, 0));
    assert_eq!(
        (e.flow.src, e.flow.dst, e.flow.sport, e.flow.dport, e.flow.proto),
        (client(), "10.100.0.1".parse().unwrap(), port, 80, 6)
    );
    // The control plane gives it tag 5; tagged packets skip the lookups.
    b.set_flow_tag(5, &e).unwrap();
    let r = test_run_xdp_with_meta(prog, &hint(b.tag_key().flow_tag(5)), &frame).unwrap();
    assert_eq!((r.verdict, &r.packet), (XDP_TX, &want));
    assert_eq!(stat(&b, GlobalStat::HintHit), 1);
    let conn = stat(&b, GlobalStat::ConnHit) + stat(&b, GlobalStat::ConnMiss);
    // A wrong tag (another flow's) is stale: that flow still goes where the ring says.
    let other_port = (port + 1..).find(|p| vip0_real(flow_hash(client(), *p, 80, 6)).0 == 0).unwrap();
    let (other, other_ip) = vip0_frame(other_port, 0x10);
    let r = test_run_xdp_with_meta(prog, &hint(b.tag_key().flow_tag(5)), &other).unwrap();
    let h2 = flow_hash(client(), other_port, 80, 6);
    assert_eq!(r.packet, expect_ipip(&other_ip, 0x10, h2, Ipv4Addr::new(10, 200, 0, 2)), "not the tag's real");
    assert_eq!(stat(&b, GlobalStat::HintStale), 1);
    assert_eq!(stat(&b, GlobalStat::ConnHit) + stat(&b, GlobalStat::ConnMiss), conn + 1);
    // Tag ids out of range and unset ones are stale too.
    for t in [b.tag_key().flow_tag(0xff_ffff), b.tag_key().flow_tag(6)] {
        assert_eq!(test_run_xdp_with_meta(prog, &hint(t), &other).unwrap().verdict, XDP_TX);
    }
    assert_eq!(stat(&b, GlobalStat::HintStale), 3);
    // The tagged flow's real is removed: the tag is stale, the flow goes to a live real.
    b.set_ring(0, &[0; RING as usize]).unwrap();
    b.clear_real(1, 2).unwrap();
    let r = test_run_xdp_with_meta(prog, &hint(b.tag_key().flow_tag(5)), &frame).unwrap();
    assert_eq!(r.packet, expect_ipip(&ip, 0x10, h, Ipv4Addr::new(10, 200, 0, 2)));
    assert_eq!(stat(&b, GlobalStat::HintStale), 4);
}

#[test]
fn destination_tags_stay_inside_the_vips_set() {
    if !may_load_bpf("destination_tags_stay_inside_the_vips_set") {
        return;
    }
    let b = setup(HintMode::DestTag, config());
    let prog = b.program().unwrap();
    let port = (47000u16..).find(|p| vip0_real(flow_hash(client(), *p, 80, 6)).0 == 0).unwrap();
    let (frame, ip) = vip0_frame(port, 0x10);
    let h = flow_hash(client(), port, 80, 6);
    // Tagged with real 1 (one of VIP 0's): it goes there, no table lookups.
    let r = test_run_xdp_with_meta(prog, &hint(b.tag_key().dest_tag(1)), &frame).unwrap();
    assert_eq!(r.packet, expect_ipip(&ip, 0x10, h, Ipv4Addr::new(10, 200, 0, 3)));
    assert_eq!((stat(&b, GlobalStat::HintHit), stat(&b, GlobalStat::ConnMiss)), (1, 0));
    // Tagged with real 3 (VIP 1's) or a real index out of range: stale; the ring decides.
    for t in [b.tag_key().dest_tag(3), b.tag_key().dest_tag(15), b.tag_key().dest_tag(0xff_ffff)] {
        let r = test_run_xdp_with_meta(prog, &hint(t), &frame).unwrap();
        assert_eq!(r.packet, expect_ipip(&ip, 0x10, h, Ipv4Addr::new(10, 200, 0, 2)), "tag {t:#x}");
    }
    assert_eq!(stat(&b, GlobalStat::HintStale), 3);
    // Real 1 removed: its tag is stale.
    b.clear_real(1, 2).unwrap();
    b.set_ring(0, &[0; RING as usize]).unwrap();
    let r = test_run_xdp_with_meta(prog, &hint(b.tag_key().dest_tag(1)), &frame).unwrap();
    assert_eq!(r.packet, expect_ipip(&ip, 0x10, h, Ipv4Addr::new(10, 200, 0, 2)));
    assert_eq!(stat(&b, GlobalStat::HintStale), 4);
    // A port-0 VIP's real (VIP 1: 10.100.0.2, any UDP port): the tag holds, through
    // the lookup (a wildcard VIP's key cannot vouch for the packet's port).
    let udp_from = |sport: u16, dport: u16| {
        let ip = ipv4(&v4([192, 0, 2, 7], [10, 100, 0, 2], 17), &udp(sport, dport));
        eth(OWN, CLIENT_MAC, 0x0800, &ip)
    };
    let udp_to = |dport: u16| udp_from(5353, dport);
    let outer_dst = |p: &[u8]| Ipv4Addr::new(p[30], p[31], p[32], p[33]);
    let hits = stat(&b, GlobalStat::HintHit);
    let r = test_run_xdp_with_meta(prog, &hint(b.tag_key().dest_tag(3)), &udp_to(7777)).unwrap();
    assert_eq!((r.verdict, outer_dst(&r.packet)), (XDP_TX, Ipv4Addr::new(10, 200, 0, 5)));
    assert_eq!(stat(&b, GlobalStat::HintHit), hits + 1);
    // A port-specific VIP on the same address (index 6, real 6) takes port 7777: now
    // the port-0 VIP's real is outside the packet's VIP, and the new real's tag holds.
    b.set_real(6, "10.200.0.7".parse().unwrap(), 6, 1).unwrap();
    b.set_vip("10.100.0.2".parse().unwrap(), 7777, 17, 6, false).unwrap();
    b.set_ring(6, &[6; RING as usize]).unwrap();
    let stale = stat(&b, GlobalStat::HintStale);
    let r = test_run_xdp_with_meta(prog, &hint(b.tag_key().dest_tag(3)), &udp_to(7777)).unwrap();
    assert_eq!(outer_dst(&r.packet), Ipv4Addr::new(10, 200, 0, 7), "the ring of the packet's VIP decides");
    assert_eq!(stat(&b, GlobalStat::HintStale), stale + 1);
    let r = test_run_xdp_with_meta(prog, &hint(b.tag_key().dest_tag(6)), &udp_to(7777)).unwrap();
    assert_eq!(outer_dst(&r.packet), Ipv4Addr::new(10, 200, 0, 7));
    assert_eq!(stat(&b, GlobalStat::HintHit), hits + 2);
    // That VIP removed (its real still live): port 7777 is VIP 1's again, real 6 is not
    // (a new flow: the one above has a connection entry for real 6).
    b.remove_vip("10.100.0.2".parse().unwrap(), 7777, 17).unwrap();
    let r = test_run_xdp_with_meta(prog, &hint(b.tag_key().dest_tag(6)), &udp_from(5354, 7777)).unwrap();
    assert_eq!(outer_dst(&r.packet), Ipv4Addr::new(10, 200, 0, 5));
    assert_eq!(stat(&b, GlobalStat::HintStale), stale + 2);
    // Hash values that are not tags are plain hashes: untagged.
    let key = b.tag_key();
    let plain = (0u32..).map(|i| i.wrapping_mul(0x9e37_79b9)).find(|&h| h != key.dest_tag(h & 0xf_ffff)).unwrap();
    test_run_xdp_with_meta(prog, &hint(plain), &frame).unwrap();
    assert_eq!(stat(&b, GlobalStat::HintMiss), 1);
    // A real's index with any other check bits (what an RSS hash whose low bits name a
    // real looks like) is not a tag either, and a tag under another key is not one.
    let forged = [key.dest_tag(0) ^ (1 << 31), key.dest_tag(0) ^ (1 << 20), TagKey::from_raw(!0).dest_tag(0)];
    for t in forged.into_iter().filter(|&t| t != key.dest_tag(0)) {
        test_run_xdp_with_meta(prog, &hint(t), &frame).unwrap();
    }
    assert_eq!(stat(&b, GlobalStat::HintStale), 6, "no forged tag was taken as one");
    assert!(stat(&b, GlobalStat::HintMiss) >= 3);
}

#[test]
fn direct_destination_tags_skip_the_transport_header() {
    if !may_load_bpf("direct_destination_tags_skip_the_transport_header") {
        return;
    }
    let b = setup(HintMode::DestTagDirect, config());
    let prog = b.program().unwrap();
    let key = b.tag_key();
    let port = (47000u16..).find(|p| vip0_real(flow_hash(client(), *p, 80, 6)).0 == 0).unwrap();
    let (frame, ip) = vip0_frame(port, 0x10);
    // Tagged with real 1: straight to it, the outer header the full path would write.
    let r = test_run_xdp_with_meta(prog, &hint(key.dest_tag(1)), &frame).unwrap();
    let h = flow_hash(client(), port, 80, 6);
    assert_eq!(r.packet, expect_ipip(&ip, 0x10, h, Ipv4Addr::new(10, 200, 0, 3)));
    assert_eq!((stat(&b, GlobalStat::HintHit), stat(&b, GlobalStat::ConnMiss)), (1, 0));
    assert_eq!(stat(&b, GlobalStat::HintDirect), 1);
    assert_eq!((stat(&b, GlobalStat::Tx), b.real_counters(2).unwrap()[1].packets), (1, 1), "counted as sent");
    // Another port of the VIP's address with the same tag: the port is not checked,
    // so it goes to the tagged real too (why the checked dest-tag is the default).
    let (other, other_ip) = {
        let ip = ipv4(&v4([192, 0, 2, 7], [10, 100, 0, 1], 6), &tcp(port, 8080, 0x10));
        (eth(OWN, CLIENT_MAC, 0x0800, &ip), ip)
    };
    let r = test_run_xdp_with_meta(prog, &hint(key.dest_tag(1)), &other).unwrap();
    let h8080 = flow_hash(client(), port, 8080, 6);
    assert_eq!(r.packet, expect_ipip(&other_ip, 0x10, h8080, Ipv4Addr::new(10, 200, 0, 3)));
    // A transport header cut short after the ports is forwarded, not parsed; one without
    // its ports takes the full path (and is dropped there as malformed).
    let mut short = ipv4(&v4([192, 0, 2, 7], [10, 100, 0, 1], 6), &tcp(port, 80, 0x10));
    short.truncate(20 + 6);
    short[2..4].copy_from_slice(&26u16.to_be_bytes());
    short[10..12].fill(0);
    let c = csum(&short[..20]);
    short[10..12].copy_from_slice(&c.to_be_bytes());
    let r = test_run_xdp_with_meta(prog, &hint(key.dest_tag(1)), &eth(OWN, CLIENT_MAC, 0x0800, &short)).unwrap();
    assert_eq!(r.packet, expect_ipip(&short, 0x10, h, Ipv4Addr::new(10, 200, 0, 3)));
    assert_eq!((stat(&b, GlobalStat::HintHit), stat(&b, GlobalStat::HintDirect)), (3, 3));
    let mut shorter = short.clone();
    shorter.truncate(20 + 3);
    shorter[2..4].copy_from_slice(&23u16.to_be_bytes());
    shorter[10..12].fill(0);
    let c = csum(&shorter[..20]);
    shorter[10..12].copy_from_slice(&c.to_be_bytes());
    let r = test_run_xdp_with_meta(prog, &hint(key.dest_tag(1)), &eth(OWN, CLIENT_MAC, 0x0800, &shorter)).unwrap();
    assert_eq!((r.verdict, stat(&b, GlobalStat::HintDirect)), (XDP_DROP, 3));
    // What the L3 check refuses takes the full path, as with checked tags: another VIP's
    // real (VIP 1, another address), a real out of range, a removed real, a packet to
    // an address no VIP has, and an IP fragment.
    let hits = stat(&b, GlobalStat::HintHit);
    for t in [key.dest_tag(3), key.dest_tag(15)] {
        let r = test_run_xdp_with_meta(prog, &hint(t), &frame).unwrap();
        assert_eq!(r.packet, expect_ipip(&ip, 0x10, h, Ipv4Addr::new(10, 200, 0, 2)), "tag {t:#x}");
    }
    let stranger = eth(OWN, CLIENT_MAC, 0x0800, &ipv4(&v4([192, 0, 2, 7], [10, 9, 9, 9], 6), &tcp(port, 80, 0x10)));
    assert_eq!(test_run_xdp_with_meta(prog, &hint(key.dest_tag(1)), &stranger).unwrap().verdict, XDP_PASS);
    let mut frag = v4([192, 0, 2, 7], [10, 100, 0, 1], 6);
    frag.frag = 0x2000;
    let frag = eth(OWN, CLIENT_MAC, 0x0800, &ipv4(&frag, &tcp(port, 80, 0x10)));
    assert_eq!(test_run_xdp_with_meta(prog, &hint(key.dest_tag(1)), &frag).unwrap().verdict, XDP_DROP);
    b.clear_real(1, 2).unwrap();
    b.set_ring(0, &[0; RING as usize]).unwrap();
    let r = test_run_xdp_with_meta(prog, &hint(key.dest_tag(1)), &frame).unwrap();
    assert_eq!(r.packet, expect_ipip(&ip, 0x10, h, Ipv4Addr::new(10, 200, 0, 2)));
    assert_eq!(stat(&b, GlobalStat::HintHit), hits, "none of them went direct");
    assert_eq!(stat(&b, GlobalStat::HintStale), 4);
    // IPv6 (VIP 2, real 2) and an IPv4 VIP behind an IPv6 real (VIP 3, real 4) go direct.
    let c6: Ipv6Addr = "2001:db8::7".parse().unwrap();
    let ip6 = ipv6(c6, "fd00:100::1".parse().unwrap(), 6, &tcp(40000, 443, 0x10));
    let r = test_run_xdp_with_meta(prog, &hint(key.dest_tag(2)), &eth(OWN, CLIENT_MAC, 0x86dd, &ip6)).unwrap();
    let real6: Ipv6Addr = "fd00:200::4".parse().unwrap();
    assert_eq!(r.packet, expect_ip6(&ip6, 41, 0, flow_hash(c6.into(), 40000, 443, 6), real6));
    let dns = ipv4(&v4([192, 0, 2, 7], [10, 100, 0, 3], 17), &udp(5353, 53));
    let r = test_run_xdp_with_meta(prog, &hint(key.dest_tag(4)), &eth(OWN, CLIENT_MAC, 0x0800, &dns)).unwrap();
    assert_eq!(r.packet, expect_ip6(&dns, 4, 0x10, flow_hash(client(), 5353, 53, 17), real6));
    assert_eq!((stat(&b, GlobalStat::HintHit), stat(&b, GlobalStat::HintDirect)), (hits + 2, 5));
}

#[test]
fn a_flow_whose_event_was_lost_is_announced_by_its_next_packet() {
    if !may_load_bpf("a_flow_whose_event_was_lost_is_announced_by_its_next_packet") {
        return;
    }
    // An event ring of one page holds 64 events: 100 new flows, nobody reading.
    let mut sizes = BalancerSizes::new(8, 16, RING, 1024);
    sizes.event_ring_bytes = 4096;
    let b = Balancer::load(&BalancerOptions { sizes, hint: HintMode::FlowTag, bind_ifindex: None }).unwrap();
    b.set_config(&config()).unwrap();
    b.set_real(0, "10.200.0.2".parse().unwrap(), 0, 1).unwrap();
    b.set_vip("10.100.0.1".parse().unwrap(), 80, 6, 0, false).unwrap();
    b.set_ring(0, &[0; RING as usize]).unwrap();
    let prog = b.program().unwrap();
    let mut events = b.events().unwrap();
    let flows: Vec<Vec<u8>> = (0..100).map(|i| vip0_frame(49000 + i, 0x10).0).collect();
    for f in &flows {
        assert_eq!(test_run_xdp(prog, f).unwrap().verdict, XDP_TX);
    }
    let first = events.drain().unwrap();
    let lost = stat(&b, GlobalStat::EventsLost);
    assert!(first.len() >= 32 && first.len() < 100 && lost > 0, "{} sent, {lost} lost", first.len());
    assert_eq!(first.len() as u64 + lost, 100);
    // Every flow's next packet: every one hits its entry (the unannounced kept theirs,
    // so their real does not move if the ring changes meanwhile), and the unannounced
    // are announced now, each once.
    let hits = stat(&b, GlobalStat::ConnHit);
    for f in &flows {
        assert_eq!(test_run_xdp(prog, f).unwrap().verdict, XDP_TX);
    }
    assert_eq!(stat(&b, GlobalStat::ConnHit), hits + 100, "every flow kept its connection entry");
    let second = events.drain().unwrap();
    assert_eq!(second.len() as u64, lost, "exactly the flows whose events were lost");
    let mut all: Vec<u16> = first.iter().chain(&second).map(|e| e.flow.sport).collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), 100, "every flow announced once");
    for f in &flows {
        test_run_xdp(prog, f).unwrap();
    }
    assert_eq!(events.drain().unwrap().len(), 0, "and not again");
}

#[test]
fn rss_hashes_are_not_read_as_tags() {
    if !may_load_bpf("rss_hashes_are_not_read_as_tags") {
        return;
    }
    // 20,000 hash values (a multiplicative sequence, as varied as an RSS hash) on a
    // tagged flow of a destination-tag balancer: without the key, a value passes a
    // tag's check with probability 2^-12 (about 5 expected); each that passes still
    // has to name one of the VIP's live reals. With the old top-byte marker, 2 in 256
    // (156) were tags.
    let b = setup(HintMode::DestTag, config());
    let prog = b.program().unwrap();
    let (frame, _) = vip0_frame(47500, 0x10);
    for i in 0..20_000u32 {
        test_run_xdp_with_meta(prog, &hint(i.wrapping_mul(0x9e37_79b9) ^ 0x5bd1_e995), &frame).unwrap();
    }
    let (miss, stale, hit) =
        (stat(&b, GlobalStat::HintMiss), stat(&b, GlobalStat::HintStale), stat(&b, GlobalStat::HintHit));
    assert_eq!(miss + stale + hit, 20_000);
    assert!(stale + hit <= 25, "{} of 20,000 hashes read as tags", stale + hit);
}

#[test]
fn a_syn_flood_announces_nothing_and_leaves_established_flows_tagged() {
    if !may_load_bpf("a_syn_flood_announces_nothing_and_leaves_established_flows_tagged") {
        return;
    }
    let b = setup(HintMode::FlowTag, config());
    let prog = b.program().unwrap();
    let mut events = b.events().unwrap();
    // Ten established flows: each announced once, by its first packet past the SYN,
    // however many packets follow; the control plane tags each.
    let flows: Vec<(Vec<u8>, Vec<u8>)> = (0..10).map(|i| vip0_frame(48000 + i, 0x10)).collect();
    for (frame, _) in &flows {
        for _ in 0..3 {
            assert_eq!(test_run_xdp(prog, frame).unwrap().verdict, XDP_TX);
        }
    }
    let announced = events.drain().unwrap();
    assert_eq!(announced.len(), 10, "one event per flow");
    for (i, e) in announced.iter().enumerate() {
        b.set_flow_tag(i as u32, e).unwrap();
    }
    // A flood of SYNs from spoofed sources: forwarded, but no event and no entry.
    let conn_miss = stat(&b, GlobalStat::ConnMiss);
    for i in 0..5000u32 {
        let src = [198, 18, (i >> 8) as u8, i as u8];
        let syn = eth(
            OWN,
            CLIENT_MAC,
            0x0800,
            &ipv4(&v4(src, [10, 100, 0, 1], 6), &tcp(1024 + (i % 60000) as u16, 80, 0x02)),
        );
        assert_eq!(test_run_xdp(prog, &syn).unwrap().verdict, XDP_TX);
    }
    assert_eq!(stat(&b, GlobalStat::ConnMiss), conn_miss + 5000);
    assert_eq!(events.drain().unwrap().len(), 0, "a SYN announces nothing");
    assert_eq!(stat(&b, GlobalStat::Events), 10);
    // The established flows' tags still resolve: every tagged packet skips the lookups.
    let hits = stat(&b, GlobalStat::HintHit);
    for (i, (frame, ip)) in flows.iter().enumerate() {
        let r = test_run_xdp_with_meta(prog, &hint(b.tag_key().flow_tag(i as u32)), frame).unwrap();
        let e = &announced[i];
        let real = if e.real == 0 { Ipv4Addr::new(10, 200, 0, 2) } else { Ipv4Addr::new(10, 200, 0, 3) };
        assert_eq!(r.packet, expect_ipip(ip, 0x10, e.hash, real));
    }
    assert_eq!(stat(&b, GlobalStat::HintHit), hits + 10, "every established flow's tag was used");
}

//! Frames as packet rings and AF_XDP hand them over: Ethernet, IPv4 or IPv6, UDP. The
//! parser takes the service's datagrams out of a frame and says why it skipped any
//! other; it cannot panic and never reads past the frame or the IP packet's own length.
//! Also the classic BPF filter that lets only the service's datagrams into a packet
//! socket.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Ethernet header bytes (no VLAN tag).
pub const ETH_LEN: usize = 14;
pub(crate) const ETH_P_IP: u16 = 0x0800;
pub(crate) const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
pub(crate) const IPPROTO_UDP: u8 = 17;

/// A UDP datagram found in a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpFrame<'a> {
    /// Sender.
    pub src: SocketAddr,
    /// Destination.
    pub dst: SocketAddr,
    /// The UDP payload.
    pub payload: &'a [u8],
}

/// Why a frame held no datagram for us.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Skip {
    /// Shorter than its headers say.
    Truncated,
    /// Not IPv4 or IPv6.
    NotIp,
    /// IP, but not UDP (or behind IPv6 extension headers).
    NotUdp,
    /// An IP fragment: the payload is incomplete (the socket paths get reassembled
    /// datagrams; the ring paths count these).
    Fragment,
    /// IP or UDP lengths that disagree with each other or the frame.
    BadLength,
    /// A datagram for another port.
    OtherPort,
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// Finds the UDP datagram in an Ethernet frame (one 802.1Q tag allowed) addressed to
/// `port` (0: any).
pub fn parse_frame(frame: &[u8], port: u16) -> Result<UdpFrame<'_>, Skip> {
    let mut ethertype = be16(frame, 12).ok_or(Skip::Truncated)?;
    let mut l3 = ETH_LEN;
    if ethertype == ETH_P_8021Q {
        ethertype = be16(frame, 16).ok_or(Skip::Truncated)?;
        l3 += 4;
    }
    let ip = frame.get(l3..).ok_or(Skip::Truncated)?;
    let (src_ip, dst_ip, udp) = match ethertype {
        ETH_P_IP => {
            let first = *ip.first().ok_or(Skip::Truncated)?;
            let ihl = usize::from(first & 0x0f) * 4;
            if first >> 4 != 4 || ihl < 20 {
                return Err(Skip::BadLength);
            }
            let total = usize::from(be16(ip, 2).ok_or(Skip::Truncated)?);
            if ip.len() < ihl || total < ihl {
                return Err(Skip::BadLength);
            }
            if total > ip.len() {
                return Err(Skip::Truncated);
            }
            if ip[9] != IPPROTO_UDP {
                return Err(Skip::NotUdp);
            }
            // More fragments, or a fragment offset: not a whole datagram.
            if be16(ip, 6).ok_or(Skip::Truncated)? & 0x3fff != 0 {
                return Err(Skip::Fragment);
            }
            let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
            let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
            (IpAddr::V4(src), IpAddr::V4(dst), &ip[ihl..total])
        }
        ETH_P_IPV6 => {
            if ip.len() < 40 {
                return Err(Skip::Truncated);
            }
            if ip[0] >> 4 != 6 {
                return Err(Skip::BadLength);
            }
            match ip[6] {
                IPPROTO_UDP => {}
                44 => return Err(Skip::Fragment),
                _ => return Err(Skip::NotUdp),
            }
            let plen = usize::from(be16(ip, 4).ok_or(Skip::Truncated)?);
            if 40 + plen > ip.len() {
                return Err(Skip::Truncated);
            }
            let mut s = [0u8; 16];
            let mut d = [0u8; 16];
            s.copy_from_slice(&ip[8..24]);
            d.copy_from_slice(&ip[24..40]);
            (IpAddr::V6(Ipv6Addr::from(s)), IpAddr::V6(Ipv6Addr::from(d)), &ip[40..40 + plen])
        }
        _ => return Err(Skip::NotIp),
    };
    let sport = be16(udp, 0).ok_or(Skip::Truncated)?;
    let dport = be16(udp, 2).ok_or(Skip::Truncated)?;
    let ulen = usize::from(be16(udp, 4).ok_or(Skip::Truncated)?);
    if ulen < 8 || ulen > udp.len() {
        return Err(Skip::BadLength);
    }
    if port != 0 && dport != port {
        return Err(Skip::OtherPort);
    }
    Ok(UdpFrame { src: SocketAddr::new(src_ip, sport), dst: SocketAddr::new(dst_ip, dport), payload: &udp[8..ulen] })
}

/// One classic BPF instruction, as `struct sock_filter` has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    /// Opcode.
    pub code: u16,
    /// Jump offset if true.
    pub jt: u8,
    /// Jump offset if false.
    pub jf: u8,
    /// Constant.
    pub k: u32,
}

const fn insn(code: u16, jt: u8, jf: u8, k: u32) -> Insn {
    Insn { code, jt, jf, k }
}

// Opcodes (linux/bpf_common.h, linux/filter.h).
const LDH_ABS: u16 = 0x28;
const LDB_ABS: u16 = 0x30;
const LDH_IND: u16 = 0x48;
const LDXB_MSH: u16 = 0xb1;
const JEQ_K: u16 = 0x15;
const JSET_K: u16 = 0x45;
const RET_K: u16 = 0x06;

/// A socket filter passing only untagged Ethernet frames that carry UDP to `port`
/// over IPv4 (whole datagrams or first fragments) or IPv6 (no extension headers);
/// everything else is dropped in the kernel before it reaches the ring.
pub fn udp_port_filter(port: u16) -> [Insn; 16] {
    let p = u32::from(port);
    [
        insn(LDH_ABS, 0, 0, 12),                   // 0: ethertype
        insn(JEQ_K, 1, 0, u32::from(ETH_P_IP)),    // 1: IPv4 -> 3
        insn(JEQ_K, 7, 12, u32::from(ETH_P_IPV6)), // 2: IPv6 -> 10, else drop
        insn(LDB_ABS, 0, 0, 23),                   // 3: IPv4 protocol
        insn(JEQ_K, 0, 10, 17),                    // 4: UDP, else drop
        insn(LDH_ABS, 0, 0, 20),                   // 5: flags + fragment offset
        insn(JSET_K, 8, 0, 0x1fff),                // 6: a later fragment has no ports: drop
        insn(LDXB_MSH, 0, 0, 14),                  // 7: x = IPv4 header length
        insn(LDH_IND, 0, 0, 16),                   // 8: UDP destination port
        insn(JEQ_K, 4, 5, p),                      // 9: ours -> accept, else drop
        insn(LDB_ABS, 0, 0, 20),                   // 10: IPv6 next header
        insn(JEQ_K, 0, 3, 17),                     // 11: UDP, else drop
        insn(LDH_ABS, 0, 0, 56),                   // 12: UDP destination port
        insn(JEQ_K, 0, 1, p),                      // 13: ours -> accept, else drop
        insn(RET_K, 0, 0, 0x0004_0000),            // 14: accept (whole frame)
        insn(RET_K, 0, 0, 0),                      // 15: drop
    ]
}

/// Runs a classic BPF filter over `frame` (the subset [`udp_port_filter`] uses), for
/// tests: returns the number of bytes the kernel would accept (0: dropped).
pub fn run_filter(prog: &[Insn], frame: &[u8]) -> u32 {
    let (mut a, mut x, mut pc) = (0u32, 0u32, 0usize);
    let ld = |at: usize, n: usize| -> Option<u32> {
        let b = frame.get(at..at.checked_add(n)?)?;
        Some(b.iter().fold(0u32, |v, byte| (v << 8) | u32::from(*byte)))
    };
    for _ in 0..prog.len() {
        let Some(i) = prog.get(pc) else { return 0 };
        pc += 1;
        let jump = |cond: bool| usize::from(if cond { i.jt } else { i.jf });
        match i.code {
            LDH_ABS => match ld(i.k as usize, 2) {
                Some(v) => a = v,
                None => return 0,
            },
            LDB_ABS => match ld(i.k as usize, 1) {
                Some(v) => a = v,
                None => return 0,
            },
            LDH_IND => match ld((x as usize).saturating_add(i.k as usize), 2) {
                Some(v) => a = v,
                None => return 0,
            },
            LDXB_MSH => match ld(i.k as usize, 1) {
                Some(v) => x = (v & 0xf) * 4,
                None => return 0,
            },
            JEQ_K => pc += jump(a == i.k),
            JSET_K => pc += jump(a & i.k != 0),
            RET_K => return i.k,
            _ => return 0,
        }
    }
    0
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// An Ethernet + IPv4 + UDP frame (checksums zero).
    pub(crate) fn v4_frame(sport: u16, dport: u16, payload: &[u8], frag: u16) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&ETH_P_IP.to_be_bytes());
        let total = (20 + 8 + payload.len()) as u16;
        f.extend_from_slice(&[0x45, 0]);
        f.extend_from_slice(&total.to_be_bytes());
        f.extend_from_slice(&[0, 1]);
        f.extend_from_slice(&frag.to_be_bytes());
        f.extend_from_slice(&[64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
        f.extend_from_slice(&sport.to_be_bytes());
        f.extend_from_slice(&dport.to_be_bytes());
        f.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(payload);
        f
    }

    fn v6_frame(next: u8, dport: u16, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&ETH_P_IPV6.to_be_bytes());
        f.extend_from_slice(&[0x60, 0, 0, 0]);
        f.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        f.extend_from_slice(&[next, 64]);
        f.extend_from_slice(&Ipv6Addr::LOCALHOST.octets());
        f.extend_from_slice(&Ipv6Addr::LOCALHOST.octets());
        f.extend_from_slice(&4000u16.to_be_bytes());
        f.extend_from_slice(&dport.to_be_bytes());
        f.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn udp_over_ipv4_and_ipv6_is_found() {
        let f = v4_frame(5000, 7070, b"hello", 0);
        let u = parse_frame(&f, 7070).unwrap();
        assert_eq!(u.src, "10.0.0.1:5000".parse().unwrap());
        assert_eq!(u.dst, "10.0.0.2:7070".parse().unwrap());
        assert_eq!(u.payload, b"hello");
        let f = v6_frame(17, 7070, b"hi");
        let u = parse_frame(&f, 7070).unwrap();
        assert_eq!(u.src, "[::1]:4000".parse().unwrap());
        assert_eq!(u.payload, b"hi");
    }

    #[test]
    fn everything_else_is_skipped_with_its_reason() {
        assert_eq!(parse_frame(&v4_frame(1, 9, b"x", 0), 7070), Err(Skip::OtherPort));
        assert_eq!(parse_frame(&v4_frame(1, 7070, b"x", 0x2000), 7070), Err(Skip::Fragment));
        assert_eq!(parse_frame(&v4_frame(1, 7070, b"x", 0x0010), 7070), Err(Skip::Fragment));
        assert_eq!(parse_frame(&v6_frame(44, 7070, b"x"), 7070), Err(Skip::Fragment));
        assert_eq!(parse_frame(&v6_frame(6, 7070, b"x"), 7070), Err(Skip::NotUdp));
        let f = v4_frame(1, 7070, b"abc", 0);
        assert_eq!(parse_frame(&f[..f.len() - 1], 7070), Err(Skip::Truncated));
        let mut bad = f.clone();
        bad[14 + 20 + 5] = 200; // UDP length past the packet
        assert_eq!(parse_frame(&bad, 7070), Err(Skip::BadLength));
        let mut arp = f.clone();
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        assert_eq!(parse_frame(&arp, 7070), Err(Skip::NotIp));
        // Ethernet padding after a short packet is ignored (the IP length rules).
        let mut padded = v4_frame(1, 7070, b"a", 0);
        padded.extend_from_slice(&[0xee; 17]);
        assert_eq!(parse_frame(&padded, 7070).unwrap().payload, b"a");
    }

    #[test]
    fn the_filter_passes_exactly_the_service_datagrams() {
        let prog = udp_port_filter(7070);
        assert!(run_filter(&prog, &v4_frame(1, 7070, b"x", 0)) > 0);
        assert!(run_filter(&prog, &v4_frame(1, 7070, b"x", 0x2000)) > 0, "a first fragment has the port");
        assert_eq!(run_filter(&prog, &v4_frame(1, 7070, b"x", 0x0010)), 0, "a later fragment has no port");
        assert_eq!(run_filter(&prog, &v4_frame(1, 7071, b"x", 0)), 0);
        assert!(run_filter(&prog, &v6_frame(17, 7070, b"x")) > 0);
        assert_eq!(run_filter(&prog, &v6_frame(17, 53, b"x")), 0);
        assert_eq!(run_filter(&prog, &v6_frame(6, 7070, b"x")), 0);
        let mut opts = v4_frame(1, 7070, b"x", 0);
        // A 24-byte IPv4 header: the port moves by 4 and the filter follows it.
        opts[14] = 0x46;
        opts.splice(34..34, [1, 1, 1, 1]);
        assert!(run_filter(&prog, &opts) > 0);
    }

    proptest! {
        #[test]
        fn the_parser_and_filter_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200), port: u16) {
            let _ = parse_frame(&bytes, port);
            let _ = run_filter(&udp_port_filter(port), &bytes);
        }

        #[test]
        fn the_filter_and_the_parser_agree(sport: u16, dport in 7068u16..7073, frag in prop_oneof![Just(0u16), Just(0x2000), Just(0x0008)], n in 0usize..64) {
            let f = v4_frame(sport, dport, &vec![7u8; n], frag);
            let parsed = parse_frame(&f, 7070).is_ok();
            let passed = run_filter(&udp_port_filter(7070), &f) > 0;
            // The filter may pass a first fragment the parser then counts; never the
            // other way round.
            prop_assert!(!parsed || passed);
        }
    }
}

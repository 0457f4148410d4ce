//! Frames as packet rings and AF_XDP hand them over: Ethernet, IPv4 or IPv6, UDP. The
//! parser takes the service's datagrams out of a frame and says why it skipped any
//! other; it cannot panic and never reads past the frame or the IP packet's own length.
//! Also the classic BPF filter that lets only the service's datagrams into a packet
//! socket.
//!
//! A path below the stack must take exactly what the service's socket would, so the
//! parser checks what the stack checks before a datagram reaches a socket: the IPv4
//! header checksum (`ip_rcv_core`), the UDP checksum over the pseudo-header (it covers
//! the addresses and ports the response goes back to), the UDP length against the IP
//! payload (a shorter one trims the datagram, as `udp_rcv` does), and no VLAN tag (the
//! stack gives a tagged frame only to a VLAN device, never to a socket on the device
//! itself). Where the path reports the kernel's checksum status ([`FrameMeta`]) the
//! parser uses it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::frames::{fold, sum16};
use super::reasm::{FragKey, Fragment, Reassembled};

/// Ethernet header bytes (no VLAN tag).
pub const ETH_LEN: usize = 14;
pub(crate) const ETH_P_IP: u16 = 0x0800;
pub(crate) const ETH_P_IPV6: u16 = 0x86dd;
pub(crate) const ETH_P_8021Q: u16 = 0x8100;
pub(crate) const IPPROTO_UDP: u8 = 17;
/// IPv6's fragment header.
const IPPROTO_FRAGMENT: u8 = 44;

/// What the path knows about a frame's UDP checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Csum {
    /// The kernel verified it (`TP_STATUS_CSUM_VALID`).
    Verified,
    /// A sender on this machine left it to be finished by offload
    /// (`TP_STATUS_CSUMNOTREADY`): the stack takes such a datagram as it is.
    Partial,
    /// Nothing known: verified here.
    Unknown,
    /// Nothing known, and the path cannot tell a local sender's unfinished checksum
    /// from a finished one (AF_XDP): verified here, and a checksum field holding
    /// exactly the pseudo-header's sum, which is what offload leaves there, is taken too.
    /// That still covers the addresses, ports and length; the payload has the
    /// protocol's own CRC32C.
    UnknownOrPartial,
}

/// What a path knows about a frame beyond its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameMeta {
    /// The UDP checksum's state.
    pub csum: Csum,
    /// The VLAN tag the device took off the frame (`TP_STATUS_VLAN_VALID`), if any.
    pub vlan_tci: Option<u16>,
}

impl FrameMeta {
    /// A frame the path says nothing about: everything is verified here.
    pub const UNKNOWN: FrameMeta = FrameMeta { csum: Csum::Unknown, vlan_tci: None };
}

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
    /// datagrams; the ring paths reassemble them, see [`parse_frame_or_fragment`]).
    Fragment,
    /// IP or UDP lengths that disagree with each other or the frame.
    BadLength,
    /// A datagram for another port.
    OtherPort,
    /// A datagram for our port on an address (or of a family) the service's socket
    /// is not bound to: another socket's.
    OtherAddress,
    /// A wrong IPv4 header checksum or UDP checksum (or none, over IPv6).
    BadChecksum,
    /// A frame with a VLAN tag: the stack gives it to a VLAN device, not to us.
    Vlan,
}

/// Which destination addresses of one family a service takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddrMatch<A> {
    /// None of this family.
    No,
    /// Any address of this family (a socket bound to the wildcard).
    Any,
    /// Only this one.
    Only(A),
}

impl<A: PartialEq> AddrMatch<A> {
    fn takes(&self, dst: &A) -> bool {
        match self {
            AddrMatch::No => false,
            AddrMatch::Any => true,
            AddrMatch::Only(a) => a == dst,
        }
    }
}

/// The datagrams a service's UDP socket receives, which are the ones a path below the
/// stack (a packet ring, AF_XDP) may take for it: its port, and for each family, which
/// destination addresses. Taking more would take other sockets' datagrams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceAddr {
    /// The destination port (0: any; for tests and tools, never a server).
    pub port: u16,
    /// IPv4 destinations.
    pub v4: AddrMatch<Ipv4Addr>,
    /// IPv6 destinations.
    pub v6: AddrMatch<Ipv6Addr>,
}

impl ServiceAddr {
    /// What a UDP socket bound to `local` receives; `v6only` is its `IPV6_V6ONLY`
    /// (an IPv6 socket on the wildcard without it takes IPv4 datagrams too).
    pub fn of_socket(local: SocketAddr, v6only: bool) -> ServiceAddr {
        let port = local.port();
        match local.ip() {
            IpAddr::V4(a) => ServiceAddr { port, v4: Self::one(a, a.is_unspecified()), v6: AddrMatch::No },
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => ServiceAddr { port, v4: Self::one(v4, v4.is_unspecified()), v6: AddrMatch::No },
                None if a.is_unspecified() => {
                    ServiceAddr { port, v4: if v6only { AddrMatch::No } else { AddrMatch::Any }, v6: AddrMatch::Any }
                }
                None => ServiceAddr { port, v4: AddrMatch::No, v6: AddrMatch::Only(a) },
            },
        }
    }

    /// Every datagram to `port`, any address of either family.
    pub fn port(port: u16) -> ServiceAddr {
        ServiceAddr { port, v4: AddrMatch::Any, v6: AddrMatch::Any }
    }

    fn one<A>(a: A, wildcard: bool) -> AddrMatch<A> {
        if wildcard { AddrMatch::Any } else { AddrMatch::Only(a) }
    }

    /// Whether a datagram to `dst` is the service's.
    pub fn takes(&self, dst: SocketAddr) -> bool {
        (self.port == 0 || dst.port() == self.port) && self.takes_address(dst.ip())
    }

    /// Whether datagrams to `dst` may be the service's (on its port).
    pub fn takes_address(&self, dst: IpAddr) -> bool {
        match dst {
            IpAddr::V4(a) => self.v4.takes(&a),
            IpAddr::V6(a) => self.v6.takes(&a),
        }
    }
}

/// What a frame carries for a service: a whole datagram, or a fragment of one to an
/// address the service takes (whose port only the first fragment shows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found<'a> {
    /// A whole datagram for the service.
    Datagram(UdpFrame<'a>),
    /// An IP fragment, for [`super::reasm::Reassembler`].
    Fragment(Fragment<'a>),
}

/// The UDP content of an IP packet.
enum Content<'a> {
    Whole(&'a [u8]),
    Fragment { id: u32, offset: usize, more: bool, data: &'a [u8] },
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes([*b.get(at)?, *b.get(at + 1)?, *b.get(at + 2)?, *b.get(at + 3)?]))
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// Finds the UDP datagram in an Ethernet frame addressed to the service `want`,
/// checked as the stack checks it (see the module's documentation); an IP fragment is
/// [`Skip::Fragment`].
pub fn parse_frame(frame: &[u8], want: ServiceAddr, meta: FrameMeta) -> Result<UdpFrame<'_>, Skip> {
    match parse_frame_or_fragment(frame, want, meta)? {
        Found::Datagram(u) => Ok(u),
        Found::Fragment(_) => Err(Skip::Fragment),
    }
}

/// As [`parse_frame`], but an IP fragment of UDP to an address `want` takes is handed
/// back for reassembly (IPv4, and IPv6 with the fragment header right after the fixed
/// one; an IPv6 atomic fragment is a whole datagram).
pub fn parse_frame_or_fragment(frame: &[u8], want: ServiceAddr, meta: FrameMeta) -> Result<Found<'_>, Skip> {
    let (src, dst, content) = parse_ip(frame, meta)?;
    match content {
        Content::Whole(udp) => parse_udp(src, dst, udp, want, meta.csum).map(Found::Datagram),
        Content::Fragment { .. } if !want.takes_address(dst) => Err(Skip::OtherAddress),
        Content::Fragment { id, offset, more, data } => {
            Ok(Found::Fragment(Fragment { key: FragKey { src, dst, id }, offset, more, data }))
        }
    }
}

/// The datagram in a reassembled IP payload, checked as a whole one is (its UDP
/// checksum in full: no path vouches for a reassembled datagram's).
pub fn parse_reassembled(r: &Reassembled, want: ServiceAddr) -> Result<UdpFrame<'_>, Skip> {
    parse_udp(r.key.src, r.key.dst, &r.payload, want, Csum::Unknown)
}

/// The addresses and UDP content of the IP packet in an Ethernet frame.
fn parse_ip(frame: &[u8], meta: FrameMeta) -> Result<(IpAddr, IpAddr, Content<'_>), Skip> {
    let mut ethertype = be16(frame, 12).ok_or(Skip::Truncated)?;
    let mut l3 = ETH_LEN;
    // A priority tag (VLAN 0) is the untagged network's, as the stack treats it.
    if meta.vlan_tci.is_some_and(|tci| tci & 0x0fff != 0) {
        return Err(Skip::Vlan);
    }
    if ethertype == ETH_P_8021Q {
        if be16(frame, 14).ok_or(Skip::Truncated)? & 0x0fff != 0 {
            return Err(Skip::Vlan);
        }
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
            if fold(sum16(0, &ip[..ihl])) != 0 {
                return Err(Skip::BadChecksum);
            }
            if ip[9] != IPPROTO_UDP {
                return Err(Skip::NotUdp);
            }
            let src = IpAddr::V4(Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]));
            let dst = IpAddr::V4(Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]));
            let data = &ip[ihl..total];
            // More fragments, or a fragment offset: not a whole datagram.
            let flags = be16(ip, 6).ok_or(Skip::Truncated)?;
            if flags & 0x3fff != 0 {
                let (id, offset, more) =
                    (u32::from(be16(ip, 4).unwrap_or(0)), usize::from(flags & 0x1fff) * 8, flags & 0x2000 != 0);
                return Ok((src, dst, Content::Fragment { id, offset, more, data }));
            }
            (src, dst, data)
        }
        ETH_P_IPV6 => {
            if ip.len() < 40 {
                return Err(Skip::Truncated);
            }
            if ip[0] >> 4 != 6 {
                return Err(Skip::BadLength);
            }
            if ip[6] != IPPROTO_UDP && ip[6] != IPPROTO_FRAGMENT {
                return Err(Skip::NotUdp);
            }
            let plen = usize::from(be16(ip, 4).ok_or(Skip::Truncated)?);
            if 40 + plen > ip.len() {
                return Err(Skip::Truncated);
            }
            let mut s = [0u8; 16];
            let mut d = [0u8; 16];
            s.copy_from_slice(&ip[8..24]);
            d.copy_from_slice(&ip[24..40]);
            let (src, dst) = (IpAddr::V6(Ipv6Addr::from(s)), IpAddr::V6(Ipv6Addr::from(d)));
            let payload = &ip[40..40 + plen];
            if ip[6] == IPPROTO_FRAGMENT {
                // The fragment header: next header, reserved, offset (13 bits, in 8-byte
                // units) and M, identification.
                let (Some(&next), Some(field), Some(id)) = (payload.first(), be16(payload, 2), be32(payload, 4)) else {
                    return Err(Skip::BadLength);
                };
                if next != IPPROTO_UDP {
                    return Err(Skip::NotUdp);
                }
                let (offset, more, data) = (usize::from(field & 0xfff8), field & 1 != 0, &payload[8..]);
                if offset == 0 && !more {
                    // An atomic fragment (RFC 6946): a whole datagram.
                    return Ok((src, dst, Content::Whole(data)));
                }
                return Ok((src, dst, Content::Fragment { id, offset, more, data }));
            }
            (src, dst, payload)
        }
        _ => return Err(Skip::NotIp),
    };
    Ok((src_ip, dst_ip, Content::Whole(udp)))
}

/// The UDP datagram `udp` (to the end of the IP payload) from `src_ip` to `dst_ip`, if
/// it is the service's and its lengths and checksum hold.
fn parse_udp(src_ip: IpAddr, dst_ip: IpAddr, udp: &[u8], want: ServiceAddr, csum: Csum) -> Result<UdpFrame<'_>, Skip> {
    let sport = be16(udp, 0).ok_or(Skip::Truncated)?;
    let dport = be16(udp, 2).ok_or(Skip::Truncated)?;
    let ulen = usize::from(be16(udp, 4).ok_or(Skip::Truncated)?);
    if ulen < 8 || ulen > udp.len() {
        return Err(Skip::BadLength);
    }
    if want.port != 0 && dport != want.port {
        return Err(Skip::OtherPort);
    }
    let dst = SocketAddr::new(dst_ip, dport);
    if !want.takes(dst) {
        return Err(Skip::OtherAddress);
    }
    let udp = &udp[..ulen];
    if !udp_checksum_ok(src_ip, dst_ip, udp, csum) {
        return Err(Skip::BadChecksum);
    }
    Ok(UdpFrame { src: SocketAddr::new(src_ip, sport), dst, payload: &udp[8..] })
}

/// Whether the UDP datagram `udp` (its own length) from `src` to `dst` has a checksum
/// the stack would take.
fn udp_checksum_ok(src: IpAddr, dst: IpAddr, udp: &[u8], csum: Csum) -> bool {
    let field = be16(udp, 6).unwrap_or(0);
    match csum {
        Csum::Verified | Csum::Partial => return true,
        // No checksum: allowed over IPv4 (RFC 768), not over IPv6 (RFC 8200 8.1).
        _ if field == 0 => return src.is_ipv4(),
        Csum::Unknown | Csum::UnknownOrPartial => {}
    }
    let mut pseudo = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => sum16(sum16(0, &s.octets()), &d.octets()),
        (IpAddr::V6(s), IpAddr::V6(d)) => sum16(sum16(0, &s.octets()), &d.octets()),
        _ => return false,
    };
    pseudo += u64::from(IPPROTO_UDP) + udp.len() as u64;
    fold(sum16(pseudo, udp)) == 0 || (csum == Csum::UnknownOrPartial && field == !fold(pseudo))
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
const LD_ABS: u16 = 0x20;
const LDH_ABS: u16 = 0x28;
const LDB_ABS: u16 = 0x30;
const LDH_IND: u16 = 0x48;
const LDXB_MSH: u16 = 0xb1;
const JEQ_K: u16 = 0x15;
const JSET_K: u16 = 0x45;
const RET_K: u16 = 0x06;
/// Loads at or above this offset read the packet's metadata (linux/filter.h).
const SKF_AD_OFF: u32 = 0xffff_f000;
const SKF_AD_PKTTYPE: u32 = 4;
/// `sll_pkttype` of a frame addressed to another host (linux/if_packet.h).
pub const PACKET_OTHERHOST: u32 = 3;

/// Where a filter instruction's branch goes, before offsets are known.
#[derive(Clone, Copy)]
enum To {
    Next,
    V4,
    V6,
    /// IPv6 carrying UDP with no extension header: its port.
    V6Udp,
    Accept,
    Drop,
}

/// A socket filter passing only untagged Ethernet frames not addressed to another
/// host's MAC (the stack would drop those) that carry UDP to the service
/// `want` (its port and, per family, its address) over IPv4 or IPv6 (no extension
/// headers but a fragment header), and IP fragments to its addresses (a later fragment
/// has no ports: whose they are shows once they are reassembled); everything else is
/// dropped in the kernel before it reaches the ring. `want.port` is a bound socket's,
/// never 0.
pub fn udp_service_filter(want: ServiceAddr) -> Vec<Insn> {
    // (code, if true, if false, k) with symbolic targets, resolved below.
    let mut p: Vec<(u16, To, To, u32)> = Vec::new();
    let port = u32::from(want.port);
    // Frames for another host's MAC (an interface in promiscuous mode, for tcpdump
    // say) are not the socket's whatever their addresses: the stack drops them.
    p.push((LD_ABS, To::Next, To::Next, SKF_AD_OFF + SKF_AD_PKTTYPE)); // packet type
    p.push((JEQ_K, To::Drop, To::Next, PACKET_OTHERHOST));
    p.push((LDH_ABS, To::Next, To::Next, 12)); // ethertype
    p.push((JEQ_K, To::V4, To::Next, u32::from(ETH_P_IP)));
    p.push((JEQ_K, To::V6, To::Drop, u32::from(ETH_P_IPV6)));
    let v4 = p.len();
    if want.v4 != AddrMatch::No {
        p.push((LDB_ABS, To::Next, To::Next, 23)); // IPv4 protocol
        p.push((JEQ_K, To::Next, To::Drop, u32::from(IPPROTO_UDP)));
        if let AddrMatch::Only(a) = want.v4 {
            p.push((LD_ABS, To::Next, To::Next, 30)); // destination address
            p.push((JEQ_K, To::Next, To::Drop, u32::from(a)));
        }
        // A fragment (more to follow, or an offset): later ones have no ports, so
        // whose it is shows once it is reassembled.
        p.push((LDH_ABS, To::Next, To::Next, 20)); // flags + fragment offset
        p.push((JSET_K, To::Accept, To::Next, 0x3fff));
        p.push((LDXB_MSH, To::Next, To::Next, 14)); // x = IPv4 header length
        p.push((LDH_IND, To::Next, To::Next, 16)); // UDP destination port
        p.push((JEQ_K, To::Accept, To::Drop, port));
    }
    let v6 = p.len();
    let mut v6_udp = 0;
    if want.v6 != AddrMatch::No {
        if let AddrMatch::Only(a) = want.v6 {
            for (i, word) in a.octets().chunks_exact(4).enumerate() {
                p.push((LD_ABS, To::Next, To::Next, 38 + 4 * i as u32)); // destination address
                p.push((JEQ_K, To::Next, To::Drop, u32::from_be_bytes([word[0], word[1], word[2], word[3]])));
            }
        }
        p.push((LDB_ABS, To::Next, To::Next, 20)); // IPv6 next header
        p.push((JEQ_K, To::V6Udp, To::Next, u32::from(IPPROTO_UDP)));
        p.push((JEQ_K, To::Next, To::Drop, u32::from(IPPROTO_FRAGMENT)));
        // A fragment header, of UDP: as an IPv4 fragment.
        p.push((LDB_ABS, To::Next, To::Next, 54)); // the fragment header's next header
        p.push((JEQ_K, To::Accept, To::Drop, u32::from(IPPROTO_UDP)));
        v6_udp = p.len();
        p.push((LDH_ABS, To::Next, To::Next, 56)); // UDP destination port
        p.push((JEQ_K, To::Accept, To::Drop, port));
    }
    let accept = p.len();
    let drop = accept + 1;
    let (v4, v6) = (if want.v4 == AddrMatch::No { drop } else { v4 }, if want.v6 == AddrMatch::No { drop } else { v6 });
    let at = |i: usize, to: To| -> u8 {
        let target = match to {
            To::Next => i + 1,
            To::V4 => v4,
            To::V6 => v6,
            To::V6Udp => v6_udp,
            To::Accept => accept,
            To::Drop => drop,
        };
        // At most 32 instructions: every jump is forward and short.
        (target - i - 1) as u8
    };
    let mut out: Vec<Insn> =
        p.iter().enumerate().map(|(i, &(code, t, f, k))| insn(code, at(i, t), at(i, f), k)).collect();
    out.push(insn(RET_K, 0, 0, 0x0004_0000)); // accept (whole frame)
    out.push(insn(RET_K, 0, 0, 0)); // drop
    out
}

/// Runs a classic BPF filter over `frame` (the subset [`udp_service_filter`] uses), for
/// tests: returns the number of bytes the kernel would accept (0: dropped).
pub fn run_filter(prog: &[Insn], frame: &[u8]) -> u32 {
    run_filter_as(prog, frame, 0)
}

/// [`run_filter`] for a frame of packet type `pkttype` (0: to this host).
pub fn run_filter_as(prog: &[Insn], frame: &[u8], pkttype: u32) -> u32 {
    let (mut a, mut x, mut pc) = (0u32, 0u32, 0usize);
    let ld = |at: usize, n: usize| -> Option<u32> {
        if at == (SKF_AD_OFF + SKF_AD_PKTTYPE) as usize {
            return Some(pkttype);
        }
        let b = frame.get(at..at.checked_add(n)?)?;
        Some(b.iter().fold(0u32, |v, byte| (v << 8) | u32::from(*byte)))
    };
    for _ in 0..prog.len() {
        let Some(i) = prog.get(pc) else { return 0 };
        pc += 1;
        let jump = |cond: bool| usize::from(if cond { i.jt } else { i.jf });
        match i.code {
            LD_ABS => match ld(i.k as usize, 4) {
                Some(v) => a = v,
                None => return 0,
            },
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
pub(crate) mod tests;

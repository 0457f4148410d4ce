//! Frames that differ from a valid UDP datagram in one way the stack checks, and what
//! the stack does with each: the table the parser's tests and the tests of every path
//! below the stack (a packet ring, AF_XDP) share, so each path is held to what the
//! service's socket would receive.

use std::net::SocketAddr;

use super::frames::{fold, sum16};
use super::packet::{ETH_LEN, ETH_P_8021Q, ETH_P_IP, ETH_P_IPV6, IPPROTO_UDP};

/// One crafted frame.
#[derive(Debug, Clone)]
pub struct Crafted {
    /// What is odd about it.
    pub name: &'static str,
    /// The whole Ethernet frame.
    pub frame: Vec<u8>,
    /// Whether the stack delivers it to a socket bound to its destination.
    pub taken: bool,
    /// The payload a socket gets when it is taken.
    pub payload: Vec<u8>,
}

/// Where the IP header starts.
fn l3(f: &[u8]) -> usize {
    if f[12..14] == ETH_P_8021Q.to_be_bytes() { ETH_LEN + 4 } else { ETH_LEN }
}

fn is_v4(f: &[u8]) -> bool {
    f[l3(f)] >> 4 == 4
}

fn ihl(f: &[u8]) -> usize {
    if is_v4(f) { usize::from(f[l3(f)] & 0x0f) * 4 } else { 40 }
}

/// Where the UDP header starts.
fn l4(f: &[u8]) -> usize {
    l3(f) + ihl(f)
}

/// Recomputes the IPv4 header checksum.
fn seal_ip(f: &mut [u8]) {
    if !is_v4(f) {
        return;
    }
    let (at, n) = (l3(f), ihl(f));
    f[at + 10..at + 12].copy_from_slice(&[0, 0]);
    let c = fold(sum16(0, &f[at..at + n]));
    f[at + 10..at + 12].copy_from_slice(&c.to_be_bytes());
}

/// The pseudo-header's sum for a UDP datagram of `ulen` bytes in frame `f`.
fn pseudo(f: &[u8], ulen: usize) -> u64 {
    let at = l3(f);
    let (src, dst) = if is_v4(f) { (at + 12..at + 16, at + 16..at + 20) } else { (at + 8..at + 24, at + 24..at + 40) };
    sum16(sum16(0, &f[src]), &f[dst]) + u64::from(IPPROTO_UDP) + ulen as u64
}

/// Recomputes the UDP checksum over `ulen` bytes (the UDP length field unless given).
fn seal_udp_over(f: &mut [u8], ulen: Option<usize>) {
    let u = l4(f);
    let ulen = ulen.unwrap_or_else(|| usize::from(u16::from_be_bytes([f[u + 4], f[u + 5]])));
    f[u + 6..u + 8].copy_from_slice(&[0, 0]);
    let c = match fold(sum16(pseudo(f, ulen), &f[u..u + ulen])) {
        0 => 0xffff,
        c => c,
    };
    f[u + 6..u + 8].copy_from_slice(&c.to_be_bytes());
}

/// Fills in the IPv4 header checksum and the UDP checksum (over the UDP length) of an
/// Ethernet + IPv4/IPv6 + UDP frame.
pub(crate) fn seal(mut f: Vec<u8>) -> Vec<u8> {
    seal_ip(&mut f);
    seal_udp_over(&mut f, None);
    f
}

fn set16(f: &mut [u8], at: usize, v: u16) {
    f[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

/// A valid Ethernet + IP + UDP frame from `src` (MAC `macs.0`) to `dst` (MAC `macs.1`),
/// checksums filled in. Both addresses of one family.
pub fn udp_frame(macs: ([u8; 6], [u8; 6]), src: SocketAddr, dst: SocketAddr, payload: &[u8]) -> Vec<u8> {
    let mut f = macs.1.to_vec();
    f.extend_from_slice(&macs.0);
    let ulen = (8 + payload.len()) as u16;
    match (src, dst) {
        (SocketAddr::V4(s), SocketAddr::V4(d)) => {
            f.extend_from_slice(&ETH_P_IP.to_be_bytes());
            f.extend_from_slice(&[0x45, 0]);
            f.extend_from_slice(&(20 + ulen).to_be_bytes());
            f.extend_from_slice(&[0, 1, 0x40, 0, 64, IPPROTO_UDP, 0, 0]);
            f.extend_from_slice(&s.ip().octets());
            f.extend_from_slice(&d.ip().octets());
        }
        (s, d) => {
            let octets = |a: SocketAddr| match a {
                SocketAddr::V6(a) => a.ip().octets(),
                SocketAddr::V4(a) => a.ip().to_ipv6_mapped().octets(),
            };
            f.extend_from_slice(&ETH_P_IPV6.to_be_bytes());
            f.extend_from_slice(&[0x60, 0, 0, 0]);
            f.extend_from_slice(&ulen.to_be_bytes());
            f.extend_from_slice(&[IPPROTO_UDP, 64]);
            f.extend_from_slice(&octets(s));
            f.extend_from_slice(&octets(d));
        }
    }
    f.extend_from_slice(&src.port().to_be_bytes());
    f.extend_from_slice(&dst.port().to_be_bytes());
    f.extend_from_slice(&ulen.to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(payload);
    seal(f)
}

/// How a shape differs from the valid frame: an edit of it.
type Edit = fn(&mut Vec<u8>);

/// One shape: what is odd about it, whether the stack takes it, and its edit.
type Shape = (&'static str, bool, Edit);

/// The crafted frames from `src` to `dst` (one family), the `i`-th carrying
/// `payload(i)`.
pub fn crafted(
    macs: ([u8; 6], [u8; 6]),
    src: SocketAddr,
    dst: SocketAddr,
    payload: &dyn Fn(usize) -> Vec<u8>,
) -> Vec<Crafted> {
    let mut shapes = either_family_shapes();
    if src.is_ipv4() {
        shapes.extend(ipv4_shapes());
    } else {
        shapes.extend(ipv6_shapes());
    }
    shapes
        .into_iter()
        .enumerate()
        .map(|(i, (name, taken, edit))| {
            let payload = payload(i);
            // The shapes whose UDP length is 8 short of the IP payload carry 8 more
            // bytes, so what a socket gets is `payload` itself.
            let carried = if name.starts_with("a UDP length 8 shorter") {
                [&payload[..], &[0xee; 8]].concat()
            } else {
                payload.clone()
            };
            let mut frame = udp_frame(macs, src, dst, &carried);
            edit(&mut frame);
            Crafted { name, frame, taken, payload }
        })
        .collect()
}

/// The shapes of either family; they come first (the `i`-th shape of the list carries
/// `payload(i)`).
fn either_family_shapes() -> Vec<Shape> {
    vec![
        ("valid", true, |_| {}),
        ("a wrong UDP checksum", false, |f| {
            let u = l4(f);
            f[u + 6] ^= 0x5a;
        }),
        ("the source address changed on the wire", false, |f| {
            let at = l3(f) + if is_v4(f) { 15 } else { 23 };
            f[at] ^= 0x01;
            seal_ip(f);
        }),
        ("the source port changed on the wire", false, |f| {
            let u = l4(f);
            f[u + 1] ^= 0x01;
        }),
        ("a payload byte changed on the wire", false, |f| {
            let n = f.len();
            f[n - 1] ^= 0x80;
        }),
        ("a UDP length 8 shorter than the IP payload, checksum over the whole", false, |f| {
            let u = l4(f);
            let ulen = u16::from_be_bytes([f[u + 4], f[u + 5]]);
            seal_udp_over(f, Some(usize::from(ulen)));
            set16(f, u + 4, ulen - 8);
        }),
        ("a UDP length 8 shorter than the IP payload, checksum over that length", true, |f| {
            let u = l4(f);
            let ulen = u16::from_be_bytes([f[u + 4], f[u + 5]]);
            set16(f, u + 4, ulen - 8);
            seal_udp_over(f, None);
        }),
        ("a UDP length past the IP payload", false, |f| {
            let u = l4(f);
            let ulen = u16::from_be_bytes([f[u + 4], f[u + 5]]);
            set16(f, u + 4, ulen + 8);
        }),
        ("a UDP length under the header's 8 bytes", false, |f| {
            let u = l4(f);
            set16(f, u + 4, 4);
        }),
        ("Ethernet padding after the IP packet", true, |f| f.extend_from_slice(&[0; 24])),
        ("an IP packet longer than the frame", false, |f| {
            f.truncate(f.len() - 4);
        }),
        ("an 802.1Q tag for VLAN 100, which has no device here", false, |f| {
            f.splice(12..12, [0x81, 0x00, 0x00, 0x64]);
        }),
        ("an 802.1Q priority tag (VLAN 0)", true, |f| {
            f.splice(12..12, [0x81, 0x00, 0xa0, 0x00]);
        }),
        ("IP version 5", false, |f| {
            let at = l3(f);
            f[at] = (f[at] & 0x0f) | 0x50;
            seal_ip(f);
        }),
    ]
}

/// The shapes only IPv4 has (its header checksum, header length, options), after
/// [`either_family_shapes`].
fn ipv4_shapes() -> Vec<Shape> {
    vec![
        ("IPv4: no UDP checksum (zero)", true, |f: &mut Vec<u8>| {
            let u = l4(f);
            f[u + 6..u + 8].copy_from_slice(&[0, 0]);
        }),
        ("IPv4: a wrong header checksum", false, |f| {
            let at = l3(f);
            f[at + 10] ^= 0x01;
        }),
        ("IPv4: the source address changed, header checksum fixed", false, |f| {
            let at = l3(f);
            f[at + 15] ^= 0x02;
            seal_ip(f);
        }),
        ("IPv4: the source address changed, both checksums fixed", true, |f| {
            // A different sender, as far as anyone can tell.
            let at = l3(f);
            f[at + 15] ^= 0x04;
            seal_ip(f);
            seal_udp_over(f, None);
        }),
        ("IPv4: the TTL changed, header checksum fixed", true, |f| {
            let at = l3(f);
            f[at + 8] = 3;
            seal_ip(f);
        }),
        ("IPv4: a header length under 20", false, |f| {
            let at = l3(f);
            f[at] = 0x44;
        }),
        ("IPv4: options (a 24-byte header)", true, |f| {
            let at = l3(f);
            f[at] = 0x46;
            let total = u16::from_be_bytes([f[at + 2], f[at + 3]]) + 4;
            set16(f, at + 2, total);
            f.splice(at + 20..at + 20, [1, 1, 1, 0]);
            seal_ip(f);
            seal_udp_over(f, None);
        }),
        ("IPv4: a total length shorter than its header", false, |f| {
            let at = l3(f);
            set16(f, at + 2, 16);
            seal_ip(f);
        }),
        ("IPv4: the protocol is TCP", false, |f| {
            let at = l3(f);
            f[at + 9] = 6;
            seal_ip(f);
        }),
    ]
}

/// The shapes only IPv6 has, after [`either_family_shapes`].
fn ipv6_shapes() -> Vec<Shape> {
    vec![
        ("IPv6: no UDP checksum (zero)", false, |f: &mut Vec<u8>| {
            let u = l4(f);
            f[u + 6..u + 8].copy_from_slice(&[0, 0]);
        }),
        ("IPv6: a payload length past the frame", false, |f| {
            let at = l3(f);
            let plen = u16::from_be_bytes([f[at + 4], f[at + 5]]);
            set16(f, at + 4, plen + 16);
        }),
        ("IPv6: the next header is TCP", false, |f| {
            let at = l3(f);
            f[at + 6] = 6;
        }),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::packet::{Csum, FrameMeta, ServiceAddr, Skip, parse_frame};

    const MACS: ([u8; 6], [u8; 6]) = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);

    fn payload(i: usize) -> Vec<u8> {
        (0..64).map(|b| (b as u8).wrapping_mul(i as u8 + 1)).collect()
    }

    #[test]
    fn the_parser_takes_exactly_what_the_stack_takes() {
        for (src, dst) in [("10.0.0.1:4000", "10.0.0.2:7070"), ("[fd00::1]:4000", "[fd00::2]:7070")] {
            let (src, dst): (SocketAddr, SocketAddr) = (src.parse().unwrap(), dst.parse().unwrap());
            let want = ServiceAddr::of_socket(dst, true);
            let shapes = crafted(MACS, src, dst, &payload);
            assert!(shapes.len() >= 17, "{}", shapes.len());
            for c in &shapes {
                match parse_frame(&c.frame, want, FrameMeta::UNKNOWN) {
                    Ok(u) => {
                        assert!(c.taken, "{src}: {}: taken, the stack drops it", c.name);
                        assert_eq!(u.payload, c.payload, "{src}: {}", c.name);
                    }
                    Err(e) => assert!(!c.taken, "{src}: {}: skipped ({e:?}), the stack takes it", c.name),
                }
            }
        }
    }

    #[test]
    fn the_kernel_s_checksum_status_is_used_where_a_path_has_it() {
        let (src, dst): (SocketAddr, SocketAddr) = ("10.0.0.1:4000".parse().unwrap(), "10.0.0.2:7070".parse().unwrap());
        let want = ServiceAddr::of_socket(dst, true);
        let good = udp_frame(MACS, src, dst, b"request");
        let mut bad = good.clone();
        let u = l4(&bad);
        bad[u + 6] ^= 1;
        // What a sender on this machine leaves for offload: the pseudo-header's sum.
        let mut partial = good.clone();
        let ulen = partial.len() - u;
        let p = !fold(pseudo(&partial, ulen));
        partial[u + 6..u + 8].copy_from_slice(&p.to_be_bytes());
        let meta = |csum| FrameMeta { csum, vlan_tci: None };
        let takes = |f: &[u8], csum| parse_frame(f, want, meta(csum)).is_ok();
        assert!(takes(&bad, Csum::Verified) && takes(&partial, Csum::Partial));
        assert!(!takes(&bad, Csum::Unknown) && !takes(&partial, Csum::Unknown));
        assert!(takes(&partial, Csum::UnknownOrPartial) && !takes(&bad, Csum::UnknownOrPartial));
        // The partial sum covers the addresses: a changed source is caught.
        let mut moved = partial.clone();
        moved[ETH_LEN + 15] ^= 1;
        seal_ip(&mut moved);
        assert_eq!(parse_frame(&moved, want, meta(Csum::UnknownOrPartial)), Err(Skip::BadChecksum));
        // A tag the device took off: VLAN 100 is not ours, a priority tag is.
        let tagged = |tci| FrameMeta { csum: Csum::Unknown, vlan_tci: Some(tci) };
        assert_eq!(parse_frame(&good, want, tagged(100)), Err(Skip::Vlan));
        assert!(parse_frame(&good, want, tagged(0x2000)).is_ok());
    }
}

//! Frames built for a transmit ring: one UDP datagram as Ethernet frames with IPv4 or
//! IPv6 headers, the UDP checksum and the IPv4 header checksum computed here, and IP
//! fragments when the datagram does not fit the link (RFC 791 for IPv4; for IPv6 the
//! Fragment header of RFC 8200, since only the source fragments there).
//!
//! Sans-IO: the caller supplies the link-layer addresses and MTU (the driver reads them
//! from the kernel's routes and neighbours) and slots to write into; nothing here can
//! panic on any sizes.

use std::net::{IpAddr, SocketAddr};

use super::packet::{ETH_LEN, ETH_P_IP, ETH_P_IPV6, IPPROTO_UDP};

const IPV4_LEN: usize = 20;
const IPV6_LEN: usize = 40;
const FRAG6_LEN: usize = 8;
const UDP_LEN: usize = 8;
const IPPROTO_FRAGMENT: u8 = 44;
const HOP_LIMIT: u8 = 64;

/// Where frames go on the link: the addresses of the Ethernet header, and the largest
/// IP packet the path carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    /// Our interface's address.
    pub src_mac: [u8; 6],
    /// The next hop's address (zeros on loopback).
    pub dst_mac: [u8; 6],
    /// The path MTU: bytes of the largest IP packet.
    pub mtu: usize,
}

/// Why a datagram cannot be framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Source and destination of different families.
    #[error("source and destination are of different address families")]
    Family,
    /// More payload than a UDP datagram carries.
    #[error("{0} bytes: more than one UDP datagram carries")]
    TooLarge(usize),
    /// The link (or the slot) cannot carry even one fragment.
    #[error("an MTU of {0} bytes cannot carry a fragment")]
    MtuTooSmall(usize),
}

/// One UDP datagram planned as frames: [`Datagram::frames`] of them, each written by
/// [`Datagram::write`].
#[derive(Debug, Clone, Copy)]
pub struct Datagram<'a> {
    link: Link,
    src: SocketAddr,
    dst: SocketAddr,
    payload: &'a [u8],
    id: u32,
    /// The checksum field holds the pseudo-header's sum only, for the device to finish.
    partial: bool,
    /// Bytes of the UDP datagram (header included) each frame carries; every one but
    /// the last a multiple of 8 when fragmented.
    per_frame: usize,
    frames: usize,
}

/// The 16-bit one's complement sum of `data` added to `sum` (data of odd length is
/// padded with a zero byte; only the last piece of a sum may be odd).
pub(crate) fn sum16(mut sum: u64, data: &[u8]) -> u64 {
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        let v = u64::from_be_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
        sum += (v >> 48) + ((v >> 32) & 0xffff) + ((v >> 16) & 0xffff) + (v & 0xffff);
    }
    let mut rest = words.remainder().chunks_exact(2);
    for w in &mut rest {
        sum += u64::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = rest.remainder() {
        sum += u64::from(*last) << 8;
    }
    sum
}

/// Folds a sum into the 16-bit one's complement checksum.
pub(crate) fn fold(mut sum: u64) -> u16 {
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The Internet checksum of `data` (RFC 1071).
pub fn checksum(data: &[u8]) -> u16 {
    fold(sum16(0, data))
}

fn ip_bytes(a: IpAddr) -> ([u8; 16], usize) {
    let mut b = [0u8; 16];
    match a {
        IpAddr::V4(v) => {
            b[..4].copy_from_slice(&v.octets());
            (b, 4)
        }
        IpAddr::V6(v) => (v.octets(), 16),
    }
}

impl<'a> Datagram<'a> {
    /// Plans the datagram `src` -> `dst` carrying `payload` over `link`, in frames of
    /// at most `max_frame` bytes (the transmit slot), with `id` as the IP
    /// identification of its fragments (IPv4 uses the low 16 bits).
    pub fn new(
        link: Link,
        src: SocketAddr,
        dst: SocketAddr,
        payload: &'a [u8],
        id: u32,
        max_frame: usize,
    ) -> Result<Datagram<'a>, FrameError> {
        let v6 = match (src, dst) {
            (SocketAddr::V4(_), SocketAddr::V4(_)) => false,
            (SocketAddr::V6(_), SocketAddr::V6(_)) => true,
            _ => return Err(FrameError::Family),
        };
        let udp_len = UDP_LEN + payload.len();
        if udp_len > usize::from(u16::MAX) {
            return Err(FrameError::TooLarge(payload.len()));
        }
        let ip_len = if v6 { IPV6_LEN } else { IPV4_LEN };
        let unit = link.mtu.min(max_frame.saturating_sub(ETH_LEN));
        let (per_frame, frames) = if ip_len + udp_len <= unit {
            (udp_len, 1)
        } else {
            let room = unit.saturating_sub(ip_len + if v6 { FRAG6_LEN } else { 0 }) & !7;
            if room < 8 {
                return Err(FrameError::MtuTooSmall(unit));
            }
            (room, udp_len.div_ceil(room))
        };
        // IPv4: the last fragment's offset must fit 13 bits of 8-byte units, and the
        // whole packet 16 bits (a UDP length that fits always does).
        Ok(Datagram { link, src, dst, payload, id, partial: false, per_frame, frames })
    }

    /// The same datagram, but if it goes as one frame it leaves its UDP checksum for the
    /// device to finish ([`Datagram::checksum_offload`] says where): the field holds the
    /// pseudo-header's sum, and the payload is not summed here. A fragmented datagram's
    /// checksum covers fragments the device sees one at a time, so it is summed here in
    /// full.
    pub fn with_checksum_offload(self) -> Datagram<'a> {
        Datagram { partial: self.frames == 1, ..self }
    }

    /// Where the device finishes the UDP checksum, when it does: the transport header's
    /// offset in the frame and the checksum field's in that header.
    pub fn checksum_offload(&self) -> Option<(u16, u16)> {
        let ip = if self.v6() { IPV6_LEN } else { IPV4_LEN };
        self.partial.then_some(((ETH_LEN + ip) as u16, 6))
    }

    /// The one's complement sum of the pseudo-header: addresses, protocol, UDP length.
    fn pseudo_header_sum(&self) -> u64 {
        let (s, n) = ip_bytes(self.src.ip());
        let (d, _) = ip_bytes(self.dst.ip());
        sum16(sum16(0, &s[..n]), &d[..n]) + u64::from(IPPROTO_UDP) + self.udp_len() as u64
    }

    fn v6(&self) -> bool {
        self.src.is_ipv6()
    }

    fn udp_len(&self) -> usize {
        UDP_LEN + self.payload.len()
    }

    fn udp_header(&self, checksum: u16) -> [u8; UDP_LEN] {
        let mut h = [0u8; UDP_LEN];
        h[0..2].copy_from_slice(&self.src.port().to_be_bytes());
        h[2..4].copy_from_slice(&self.dst.port().to_be_bytes());
        h[4..6].copy_from_slice(&(self.udp_len() as u16).to_be_bytes());
        h[6..8].copy_from_slice(&checksum.to_be_bytes());
        h
    }

    /// The UDP checksum over the pseudo-header, header and payload (0 is sent as
    /// 0xffff: zero means "none" in IPv4 and is invalid in IPv6).
    fn udp_checksum(&self) -> u16 {
        let mut sum = sum16(self.pseudo_header_sum(), &self.udp_header(0));
        sum = sum16(sum, self.payload);
        match fold(sum) {
            0 => 0xffff,
            c => c,
        }
    }

    /// How many frames.
    pub fn frames(&self) -> usize {
        self.frames
    }

    /// Whether the datagram is sent as IP fragments.
    pub fn fragmented(&self) -> bool {
        self.frames > 1
    }

    /// Bytes of the UDP datagram (header included) frame `i` carries, and where they
    /// start.
    fn piece(&self, i: usize) -> (usize, usize) {
        let start = i.saturating_mul(self.per_frame).min(self.udp_len());
        (start, (self.udp_len() - start).min(self.per_frame))
    }

    fn header_len(&self) -> usize {
        ETH_LEN + if self.v6() { IPV6_LEN + if self.fragmented() { FRAG6_LEN } else { 0 } } else { IPV4_LEN }
    }

    /// Bytes of frame `i` (0 when there is no such frame).
    pub fn frame_len(&self, i: usize) -> usize {
        if i >= self.frames { 0 } else { self.header_len() + self.piece(i).1 }
    }

    /// Writes frame `i` into `out` and returns its length (0 when `i` is past the last
    /// frame or `out` is shorter than [`Datagram::frame_len`]).
    pub fn write(&self, i: usize, out: &mut [u8]) -> usize {
        let len = self.frame_len(i);
        if len == 0 || out.len() < len {
            return 0;
        }
        let (start, n) = self.piece(i);
        let more = i + 1 < self.frames;
        let out = &mut out[..len];
        out[0..6].copy_from_slice(&self.link.dst_mac);
        out[6..12].copy_from_slice(&self.link.src_mac);
        let (s, an) = ip_bytes(self.src.ip());
        let (d, _) = ip_bytes(self.dst.ip());
        let mut at = ETH_LEN;
        if self.v6() {
            out[12..14].copy_from_slice(&ETH_P_IPV6.to_be_bytes());
            let ip = &mut out[at..at + IPV6_LEN];
            ip[0..4].copy_from_slice(&0x6000_0000u32.to_be_bytes());
            let extra = if self.fragmented() { FRAG6_LEN } else { 0 };
            ip[4..6].copy_from_slice(&((extra + n) as u16).to_be_bytes());
            ip[6] = if self.fragmented() { IPPROTO_FRAGMENT } else { IPPROTO_UDP };
            ip[7] = HOP_LIMIT;
            ip[8..24].copy_from_slice(&s[..an]);
            ip[24..40].copy_from_slice(&d[..an]);
            at += IPV6_LEN;
            if self.fragmented() {
                let fh = &mut out[at..at + FRAG6_LEN];
                fh[0] = IPPROTO_UDP;
                fh[1] = 0;
                // Offset in 8-byte units in the top 13 bits, M flag in the lowest.
                let off = ((start / 8) as u16) << 3 | u16::from(more);
                fh[2..4].copy_from_slice(&off.to_be_bytes());
                fh[4..8].copy_from_slice(&self.id.to_be_bytes());
                at += FRAG6_LEN;
            }
        } else {
            out[12..14].copy_from_slice(&ETH_P_IP.to_be_bytes());
            let ip = &mut out[at..at + IPV4_LEN];
            ip[0] = 0x45;
            ip[1] = 0;
            ip[2..4].copy_from_slice(&((IPV4_LEN + n) as u16).to_be_bytes());
            ip[4..6].copy_from_slice(&(self.id as u16).to_be_bytes());
            let flags = if more { 0x2000u16 } else { 0 } | (start / 8) as u16;
            ip[6..8].copy_from_slice(&flags.to_be_bytes());
            ip[8] = HOP_LIMIT;
            ip[9] = IPPROTO_UDP;
            ip[10..12].copy_from_slice(&[0, 0]);
            ip[12..16].copy_from_slice(&s[..4]);
            ip[16..20].copy_from_slice(&d[..4]);
            let c = checksum(ip);
            ip[10..12].copy_from_slice(&c.to_be_bytes());
            at += IPV4_LEN;
        }
        // The UDP header is the first 8 bytes of the datagram: whole in frame 0.
        let checksum = if self.partial { !fold(self.pseudo_header_sum()) } else { self.udp_checksum() };
        let header = self.udp_header(checksum);
        let mut copied = 0;
        if start < UDP_LEN {
            let h = (UDP_LEN - start).min(n);
            out[at..at + h].copy_from_slice(&header[start..start + h]);
            copied = h;
        }
        let from = (start + copied).saturating_sub(UDP_LEN);
        let rest = n - copied;
        out[at + copied..at + n].copy_from_slice(&self.payload[from..from + rest]);
        len
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::packet::{FrameMeta, ServiceAddr, Skip, parse_frame};

    const LINK: Link = Link { src_mac: [2, 0, 0, 0, 0, 1], dst_mac: [2, 0, 0, 0, 0, 2], mtu: 1500 };

    fn payload(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    fn frames(d: &Datagram<'_>) -> Vec<Vec<u8>> {
        (0..d.frames())
            .map(|i| {
                let mut f = vec![0xaa; d.frame_len(i) + 3];
                let n = d.write(i, &mut f);
                assert_eq!(n, d.frame_len(i));
                f.truncate(n);
                f
            })
            .collect()
    }

    /// Reassembles the UDP datagram from fragments by their offsets (checking IP
    /// header checksums, ids, flags), as a receiver would.
    fn reassemble(fs: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut id = None;
        for (k, f) in fs.iter().enumerate() {
            let (off, more, data, fid) = if u16::from_be_bytes([f[12], f[13]]) == 0x0800 {
                let ip = &f[14..];
                assert_eq!(checksum(&ip[..20]), 0, "IPv4 header checksum");
                let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
                assert_eq!(total, ip.len());
                let fl = u16::from_be_bytes([ip[6], ip[7]]);
                (
                    usize::from(fl & 0x1fff) * 8,
                    fl & 0x2000 != 0,
                    &ip[20..],
                    u32::from(u16::from_be_bytes([ip[4], ip[5]])),
                )
            } else {
                let ip = &f[14..];
                let plen = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
                assert_eq!(plen + 40, ip.len());
                if ip[6] == 17 {
                    (0, false, &ip[40..], 0)
                } else {
                    assert_eq!(ip[6], 44);
                    let fh = &ip[40..48];
                    assert_eq!(fh[0], 17);
                    let o = u16::from_be_bytes([fh[2], fh[3]]);
                    (usize::from(o >> 3) * 8, o & 1 != 0, &ip[48..], u32::from_be_bytes([fh[4], fh[5], fh[6], fh[7]]))
                }
            };
            assert_eq!(*id.get_or_insert(fid), fid);
            assert_eq!(off, out.len(), "fragments in order, no gaps");
            assert_eq!(more, k + 1 < fs.len());
            if more {
                assert_eq!(data.len() % 8, 0);
            }
            out.extend_from_slice(data);
        }
        out
    }

    fn udp_checksum_ok(src: SocketAddr, dst: SocketAddr, udp: &[u8]) -> bool {
        let (s, n) = ip_bytes(src.ip());
        let (d, _) = ip_bytes(dst.ip());
        let mut sum = sum16(0, &s[..n]);
        sum = sum16(sum, &d[..n]);
        sum += 17 + udp.len() as u64;
        fold(sum16(sum, udp)) == 0
    }

    #[test]
    fn a_small_datagram_is_one_frame_our_parser_reads_back() {
        let src: SocketAddr = "10.0.0.1:7070".parse().unwrap();
        let dst: SocketAddr = "10.0.0.2:40000".parse().unwrap();
        let p = payload(1000);
        let d = Datagram::new(LINK, src, dst, &p, 9, 2048).unwrap();
        assert_eq!(d.frames(), 1);
        let f = &frames(&d)[0];
        assert_eq!(f.len(), 14 + 20 + 8 + 1000);
        assert_eq!(&f[0..6], &LINK.dst_mac);
        assert_eq!(&f[6..12], &LINK.src_mac);
        let u = parse_frame(f, ServiceAddr::port(40000), FrameMeta::UNKNOWN).unwrap();
        assert_eq!((u.src, u.dst, u.payload), (src, dst, &p[..]));
        assert!(udp_checksum_ok(src, dst, &f[34..]));
        assert_eq!(checksum(&f[14..34]), 0);
    }

    #[test]
    fn an_8k_response_is_fragmented_at_1500_and_reassembles_with_a_valid_checksum() {
        for (src, dst) in [("10.0.0.1:7070", "10.0.0.2:40000"), ("[fd00::1]:7070", "[fd00::2]:40000")] {
            let (src, dst): (SocketAddr, SocketAddr) = (src.parse().unwrap(), dst.parse().unwrap());
            let p = payload(8192);
            let d = Datagram::new(LINK, src, dst, &p, 0x1234_5678, 2048).unwrap();
            let fs = frames(&d);
            assert_eq!(fs.len(), d.frames());
            assert!(fs.len() == 6, "{} frames", fs.len());
            for f in &fs {
                assert!(f.len() <= 1514);
                assert_eq!(parse_frame(f, ServiceAddr::port(0), FrameMeta::UNKNOWN), Err(Skip::Fragment));
            }
            let udp = reassemble(&fs);
            assert_eq!(udp.len(), 8 + 8192);
            assert_eq!(&udp[8..], &p[..]);
            assert!(udp_checksum_ok(src, dst, &udp), "{src}");
        }
    }

    #[test]
    fn an_offloaded_datagram_leaves_the_pseudo_header_sum_for_the_device_to_finish() {
        use crate::proto::packet::Csum;
        let data = payload(1000);
        for (src, dst, at) in [("10.0.0.1:7070", "10.0.0.2:40000", 34u16), ("[fd00::1]:7070", "[fd00::2]:40000", 54)] {
            let (src, dst): (SocketAddr, SocketAddr) = (src.parse().unwrap(), dst.parse().unwrap());
            let d = Datagram::new(LINK, src, dst, &data, 1, 2048).unwrap().with_checksum_offload();
            assert_eq!(d.checksum_offload(), Some((at, 6)));
            let f = frames(&d).remove(0);
            let want = ServiceAddr::port(40000);
            // What offload leaves there is taken where a path cannot tell (AF_XDP), and
            // is wrong for a receiver that sums it.
            let partial = FrameMeta { csum: Csum::UnknownOrPartial, vlan_tci: None };
            assert_eq!(parse_frame(&f, want, partial).unwrap().payload, &data[..]);
            assert_eq!(parse_frame(&f, want, FrameMeta::UNKNOWN), Err(Skip::BadChecksum));
            // Finishing it as a device does (the sum from the UDP header on, folded into
            // the field) gives the checksum summed in full.
            let mut done = f.clone();
            let start = usize::from(at);
            let c = checksum(&done[start..]);
            done[start + 6..start + 8].copy_from_slice(&(if c == 0 { 0xffff } else { c }).to_be_bytes());
            let full = frames(&Datagram::new(LINK, src, dst, &data, 1, 2048).unwrap()).remove(0);
            assert_eq!(done, full);
            // Fragmented: summed here in full, nothing left to the device.
            let big = payload(4000);
            let d = Datagram::new(LINK, src, dst, &big, 1, 2048).unwrap().with_checksum_offload();
            assert_eq!((d.fragmented(), d.checksum_offload()), (true, None));
            assert_eq!(frames(&d), frames(&Datagram::new(LINK, src, dst, &big, 1, 2048).unwrap()));
        }
    }

    /// Two responses to one client with one IP identification (a counter that came back
    /// round): a client still holding the first's later fragments joins them to the
    /// second's first fragment. The UDP checksum fails here (it misses one such join in
    /// 65,536); the message's own checksum and its payload pattern refuse it whatever
    /// the UDP checksum says.
    #[test]
    fn fragments_of_two_responses_with_one_identification_misassemble_and_are_refused() {
        use super::super::wire::{self, Header, Kind};
        let (src, dst): (SocketAddr, SocketAddr) =
            ("10.0.0.1:7070".parse().unwrap(), "10.0.0.2:40000".parse().unwrap());
        let message = |id: u64| {
            let n = 8192;
            let h = Header {
                kind: Kind::Response,
                segment: 0,
                segments: 1,
                id,
                sent_ns: 0,
                payload_len: n,
                response_len: n,
                offset: 0,
            };
            let mut m = vec![0u8; h.datagram_len()];
            wire::encode(&h, &mut m).unwrap();
            m
        };
        let (early, late) = (message(1), message(2));
        let ip_id = 0x4242;
        let a = frames(&Datagram::new(LINK, src, dst, &early, ip_id, 2048).unwrap());
        let b = frames(&Datagram::new(LINK, src, dst, &late, ip_id, 2048).unwrap());
        // Each alone reassembles to its message.
        assert_eq!(&reassemble(&a)[8..], &early[..]);
        // The late response's first fragment, the early one's others.
        let joined: Vec<Vec<u8>> = std::iter::once(b[0].clone()).chain(a[1..].iter().cloned()).collect();
        let udp = reassemble(&joined);
        assert_eq!(udp.len(), 8 + late.len(), "lengths alike: nothing but the checks can tell");
        assert!(!udp_checksum_ok(src, dst, &udp));
        let e = wire::decode(&udp[8..]).unwrap_err();
        assert!(matches!(e, wire::WireError::Check { .. }), "{e:?}");
        // The body is the late response's as far as its first fragment goes (14 bytes of
        // Ethernet, 20 of IP, 8 of UDP and the message header before it), the early
        // one's after: the pattern tells them apart.
        let body = &udp[8 + wire::HEADER_LEN..];
        let head = b[0].len() - 14 - 20 - 8 - wire::HEADER_LEN;
        assert!(wire::pattern_matches(2, 0, &body[..head]));
        assert!(wire::pattern_matches(1, head as u32, &body[head..]));
        assert!(!wire::pattern_matches(2, 0, body));
    }

    #[test]
    fn the_slot_bounds_the_frame_when_the_mtu_does_not() {
        let src: SocketAddr = "10.0.0.1:1".parse().unwrap();
        let dst: SocketAddr = "10.0.0.2:2".parse().unwrap();
        let p = payload(8192);
        let jumbo = Link { mtu: 9000, ..LINK };
        assert_eq!(Datagram::new(jumbo, src, dst, &p, 1, 16384).unwrap().frames(), 1);
        let d = Datagram::new(jumbo, src, dst, &p, 1, 4096).unwrap();
        assert_eq!(d.frames(), 3);
        assert!(frames(&d).iter().all(|f| f.len() <= 4096));
        assert_eq!(&reassemble(&frames(&d))[8..], &p[..]);
    }

    #[test]
    fn impossible_datagrams_are_refused() {
        let v4: SocketAddr = "10.0.0.1:1".parse().unwrap();
        let v6: SocketAddr = "[::1]:1".parse().unwrap();
        assert_eq!(Datagram::new(LINK, v4, v6, b"x", 0, 2048).unwrap_err(), FrameError::Family);
        let big = vec![0u8; 65_528];
        assert_eq!(Datagram::new(LINK, v4, v4, &big, 0, 2048).unwrap_err(), FrameError::TooLarge(65_528));
        let tiny = Link { mtu: 27, ..LINK };
        assert_eq!(Datagram::new(tiny, v4, v4, &[0; 100], 0, 2048).unwrap_err(), FrameError::MtuTooSmall(27));
        // The largest datagram fragments within IPv4's 13-bit offset.
        let most = vec![1u8; 65_527];
        let d = Datagram::new(Link { mtu: 576, ..LINK }, v4, v4, &most, 0, 2048).unwrap();
        assert_eq!(&reassemble(&frames(&d))[8..], &most[..]);
        // Writing past the last frame, or into a short slot, writes nothing.
        assert_eq!(d.write(d.frames(), &mut [0; 2048]), 0);
        assert_eq!(d.write(0, &mut [0; 10]), 0);
    }

    #[test]
    fn checksum_matches_rfc1071_example() {
        // RFC 1071 section 3: the sum of these words is 0xddf2, so the checksum 0x220d.
        assert_eq!(checksum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]), 0x220d);
        // Odd lengths pad with zero.
        assert_eq!(checksum(&[0xff]), !0xff00);
        assert_eq!(checksum(&[]), 0xffff);
    }
}

//! The parser's and the filter's tests: frames found or skipped with their reason, the
//! filter against its interpreter, and both agreeing on what a service takes.

use super::*;
use crate::proto::crafted::seal;
use proptest::prelude::*;

/// An Ethernet + IPv4 + UDP frame, checksums filled in.
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
    seal(f)
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
    seal(f)
}

#[test]
fn udp_over_ipv4_and_ipv6_is_found() {
    let f = v4_frame(5000, 7070, b"hello", 0);
    let u = parse_frame(&f, ServiceAddr::port(7070), FrameMeta::UNKNOWN).unwrap();
    assert_eq!(u.src, "10.0.0.1:5000".parse().unwrap());
    assert_eq!(u.dst, "10.0.0.2:7070".parse().unwrap());
    assert_eq!(u.payload, b"hello");
    let f = v6_frame(17, 7070, b"hi");
    let u = parse_frame(&f, ServiceAddr::port(7070), FrameMeta::UNKNOWN).unwrap();
    assert_eq!(u.src, "[::1]:4000".parse().unwrap());
    assert_eq!(u.payload, b"hi");
}

#[test]
fn everything_else_is_skipped_with_its_reason() {
    assert_eq!(
        parse_frame(&v4_frame(1, 9, b"x", 0), ServiceAddr::port(7070), FrameMeta::UNKNOWN),
        Err(Skip::OtherPort)
    );
    assert_eq!(
        parse_frame(&v4_frame(1, 7070, b"x", 0x2000), ServiceAddr::port(7070), FrameMeta::UNKNOWN),
        Err(Skip::Fragment)
    );
    assert_eq!(
        parse_frame(&v4_frame(1, 7070, b"x", 0x0010), ServiceAddr::port(7070), FrameMeta::UNKNOWN),
        Err(Skip::Fragment)
    );
    assert_eq!(
        parse_frame(&v6_frame(44, 7070, b"xxxxxxxxxxxxxxxx"), ServiceAddr::port(7070), FrameMeta::UNKNOWN),
        Err(Skip::NotUdp),
        "a fragment header naming a protocol that is not UDP"
    );
    assert_eq!(parse_frame(&v6_frame(6, 7070, b"x"), ServiceAddr::port(7070), FrameMeta::UNKNOWN), Err(Skip::NotUdp));
    let f = v4_frame(1, 7070, b"abc", 0);
    assert_eq!(parse_frame(&f[..f.len() - 1], ServiceAddr::port(7070), FrameMeta::UNKNOWN), Err(Skip::Truncated));
    let mut bad = f.clone();
    bad[14 + 20 + 5] = 200; // UDP length past the packet
    assert_eq!(parse_frame(&bad, ServiceAddr::port(7070), FrameMeta::UNKNOWN), Err(Skip::BadLength));
    let mut arp = f.clone();
    arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
    assert_eq!(parse_frame(&arp, ServiceAddr::port(7070), FrameMeta::UNKNOWN), Err(Skip::NotIp));
    // Ethernet padding after a short packet is ignored (the IP length rules).
    let mut padded = v4_frame(1, 7070, b"a", 0);
    padded.extend_from_slice(&[0xee; 17]);
    assert_eq!(parse_frame(&padded, ServiceAddr::port(7070), FrameMeta::UNKNOWN).unwrap().payload, b"a");
}

#[test]
fn the_filter_passes_exactly_the_service_datagrams() {
    let prog = udp_service_filter(ServiceAddr::port(7070));
    assert!(run_filter(&prog, &v4_frame(1, 7070, b"x", 0)) > 0);
    assert_eq!(run_filter_as(&prog, &v4_frame(1, 7070, b"x", 0), PACKET_OTHERHOST), 0, "another host's frame");
    assert_eq!(run_filter_as(&prog, &v6_frame(17, 7070, b"x"), PACKET_OTHERHOST), 0, "another host's frame");
    assert!(run_filter_as(&prog, &v6_frame(17, 7070, b"x"), 1) > 0, "a broadcast frame");
    assert!(run_filter(&prog, &v4_frame(1, 7070, b"x", 0x2000)) > 0, "a first fragment");
    assert!(run_filter(&prog, &v4_frame(1, 7070, b"x", 0x0010)) > 0, "a later fragment, which has no port");
    assert!(run_filter(&prog, &v4_frame(1, 7071, b"x", 0x2000)) > 0, "whose it is shows once reassembled");
    let mut v6_frag = v6_frame(44, 7070, b"x");
    assert_eq!(run_filter(&prog, &v6_frag), 0, "a fragment header of another protocol");
    v6_frag[54] = 17;
    assert!(run_filter(&prog, &v6_frag) > 0, "an IPv6 fragment of UDP");
    let only = udp_service_filter(ServiceAddr::of_socket("10.0.0.2:7070".parse().unwrap(), true));
    assert!(run_filter(&only, &v4_frame(1, 7070, b"x", 0x0010)) > 0);
    let elsewhere = with_v4_dst(v4_frame(1, 7070, b"x", 0x0010), Ipv4Addr::new(10, 0, 0, 3));
    assert_eq!(run_filter(&only, &elsewhere), 0, "a fragment to another address");
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

fn with_v4_dst(mut f: Vec<u8>, a: Ipv4Addr) -> Vec<u8> {
    f[30..34].copy_from_slice(&a.octets());
    seal(f)
}

fn with_v6_dst(mut f: Vec<u8>, a: Ipv6Addr) -> Vec<u8> {
    f[38..54].copy_from_slice(&a.octets());
    seal(f)
}

#[test]
fn a_service_takes_only_what_its_socket_would_receive() {
    let s = ServiceAddr::of_socket("10.0.0.2:7070".parse().unwrap(), true);
    assert_eq!(s, ServiceAddr { port: 7070, v4: AddrMatch::Only(Ipv4Addr::new(10, 0, 0, 2)), v6: AddrMatch::No });
    assert_eq!(ServiceAddr::of_socket("0.0.0.0:7070".parse().unwrap(), true).v4, AddrMatch::Any);
    let any6 = ServiceAddr::of_socket("[::]:7070".parse().unwrap(), true);
    assert_eq!((any6.v4, any6.v6), (AddrMatch::No, AddrMatch::Any));
    let dual = ServiceAddr::of_socket("[::]:7070".parse().unwrap(), false);
    assert_eq!((dual.v4, dual.v6), (AddrMatch::Any, AddrMatch::Any));
    assert_eq!(ServiceAddr::of_socket("[::ffff:10.0.0.2]:7070".parse().unwrap(), false), s);
    let lo6 = ServiceAddr::of_socket("[::1]:7070".parse().unwrap(), true);
    assert_eq!((lo6.v4, lo6.v6), (AddrMatch::No, AddrMatch::Only(Ipv6Addr::LOCALHOST)));
    // The parser and the kernel's filter take the same frames.
    let v4 = v4_frame(1, 7070, b"x", 0);
    let v6 = v6_frame(17, 7070, b"x");
    let cases = [
        (v4.clone(), s, true),
        (with_v4_dst(v4.clone(), Ipv4Addr::new(10, 0, 0, 3)), s, false),
        (v4_frame(1, 7071, b"x", 0), s, false),
        (v6.clone(), s, false),
        (v6.clone(), lo6, true),
        (with_v6_dst(v6.clone(), Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 2)), lo6, false),
        (with_v6_dst(v6.clone(), Ipv6Addr::new(1, 0, 0, 0, 0, 0, 0, 1)), lo6, false),
        (v4.clone(), lo6, false),
        (v4.clone(), dual, true),
        (v6.clone(), dual, true),
        (v4.clone(), any6, false),
    ];
    for (i, (f, want, takes)) in cases.iter().enumerate() {
        assert_eq!(parse_frame(f, *want, FrameMeta::UNKNOWN).is_ok(), *takes, "case {i}: parser");
        assert_eq!(run_filter(&udp_service_filter(*want), f) > 0, *takes, "case {i}: filter");
    }
    assert_eq!(parse_frame(&v6, s, FrameMeta::UNKNOWN), Err(Skip::OtherAddress));
    assert_eq!(
        parse_frame(&with_v4_dst(v4, Ipv4Addr::new(10, 0, 0, 3)), s, FrameMeta::UNKNOWN),
        Err(Skip::OtherAddress)
    );
}

fn service_strategy() -> impl Strategy<Value = ServiceAddr> {
    let v4 = prop_oneof![
        Just(AddrMatch::No),
        Just(AddrMatch::Any),
        (1u8..4).prop_map(|b| AddrMatch::Only(Ipv4Addr::new(10, 0, 0, b)))
    ];
    let v6 = prop_oneof![
        Just(AddrMatch::No),
        Just(AddrMatch::Any),
        (0u16..3, 1u16..4).prop_map(|(w, b)| AddrMatch::Only(Ipv6Addr::new(w, 0, 0, 0, 0, 0, 0, b)))
    ];
    (7069u16..7072, v4, v6).prop_map(|(port, v4, v6)| ServiceAddr { port, v4, v6 })
}

proptest! {
    #[test]
    fn the_filter_and_the_parser_agree_on_addresses(want in service_strategy(), v6: bool, w in 0u16..3, b in 1u8..4, dport in 7069u16..7072) {
        let f = if v6 {
            with_v6_dst(v6_frame(17, dport, b"x"), Ipv6Addr::new(w, 0, 0, 0, 0, 0, 0, u16::from(b)))
        } else {
            with_v4_dst(v4_frame(1, dport, b"x", 0), Ipv4Addr::new(10, 0, 0, b))
        };
        prop_assert_eq!(parse_frame(&f, want, FrameMeta::UNKNOWN).is_ok(), run_filter(&udp_service_filter(want), &f) > 0);
    }

    #[test]
    fn the_parser_and_filter_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200), port: u16, want in service_strategy()) {
        let _ = parse_frame(&bytes, ServiceAddr::port(port), FrameMeta::UNKNOWN);
        let _ = parse_frame(&bytes, want, FrameMeta::UNKNOWN);
        let _ = run_filter(&udp_service_filter(want), &bytes);
    }

    #[test]
    fn the_filter_and_the_parser_agree(sport: u16, dport in 7068u16..7073, frag in prop_oneof![Just(0u16), Just(0x2000), Just(0x0008)], n in 0usize..64) {
        let f = v4_frame(sport, dport, &vec![7u8; n], frag);
        let parsed = parse_frame(&f, ServiceAddr::port(7070), FrameMeta::UNKNOWN).is_ok();
        let passed = run_filter(&udp_service_filter(ServiceAddr::port(7070)), &f) > 0;
        // The filter may pass a first fragment the parser then counts; never the
        // other way round.
        prop_assert!(!parsed || passed);
    }
}

mod fragments {
    use super::*;
    use crate::proto::frames::{Datagram, Link};
    use crate::proto::reasm::{ReasmLimits, Reassembler};

    const LINK: Link = Link { src_mac: [2, 0, 0, 0, 0, 1], dst_mac: [2, 0, 0, 0, 0, 2], mtu: 1500 };

    fn frames_of(src: &str, dst: &str, payload: &[u8], id: u32) -> Vec<Vec<u8>> {
        let d = Datagram::new(LINK, src.parse().unwrap(), dst.parse().unwrap(), payload, id, 2048).unwrap();
        (0..d.frames())
            .map(|i| {
                let mut f = vec![0; d.frame_len(i)];
                d.write(i, &mut f);
                f
            })
            .collect()
    }

    /// Feeds frames through the parser and a reassembler as a ring path does; the
    /// datagrams that come out, parsed for `want`.
    fn through(frames: &[Vec<u8>], want: ServiceAddr) -> Vec<Result<(SocketAddr, Vec<u8>), Skip>> {
        let mut r = Reassembler::new(ReasmLimits::KERNEL);
        let mut out = Vec::new();
        for f in frames {
            match parse_frame_or_fragment(f, want, FrameMeta::UNKNOWN) {
                Ok(Found::Datagram(u)) => out.push(Ok((u.src, u.payload.to_vec()))),
                Ok(Found::Fragment(frag)) => {
                    r.handle_fragment(0, frag);
                    if let Some(d) = r.poll_datagram() {
                        out.push(parse_reassembled(&d, want).map(|u| (u.src, u.payload.to_vec())));
                    }
                }
                Err(e) => out.push(Err(e)),
            }
        }
        out
    }

    fn message(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    #[test]
    fn an_8_kib_request_in_fragments_is_found_whole_over_either_family() {
        let m = message(8192, 1);
        for (src, dst) in [("10.0.0.1:40000", "10.0.0.2:7070"), ("[fd00::1]:40000", "[fd00::2]:7070")] {
            let mut fs = frames_of(src, dst, &m, 0x1234_5678);
            assert_eq!(fs.len(), 6, "{src}");
            fs.swap(0, 4);
            let got = through(&fs, ServiceAddr::port(7070));
            assert_eq!(got, vec![Ok((src.parse().unwrap(), m.clone()))], "{src}");
        }
    }

    #[test]
    fn a_reassembled_datagram_is_checked_as_a_whole_one() {
        let m = message(4000, 2);
        // Another port's: reassembled, then not taken.
        let got = through(&frames_of("10.0.0.1:40000", "10.0.0.2:7071", &m, 9), ServiceAddr::port(7070));
        assert_eq!(got, vec![Err(Skip::OtherPort)]);
        // Fragments to an address the service does not take are not held at all.
        let only = ServiceAddr::of_socket("10.0.0.2:7070".parse().unwrap(), true);
        let got = through(&frames_of("10.0.0.1:40000", "10.0.0.3:7070", &m, 9), only);
        assert_eq!(got, vec![Err(Skip::OtherAddress); 3]);
        // A byte changed on the way: the UDP checksum over the whole datagram fails.
        let mut fs = frames_of("10.0.0.1:40000", "10.0.0.2:7070", &m, 9);
        let last = fs.last_mut().unwrap();
        let at = last.len() - 5;
        last[at] ^= 0x40;
        assert_eq!(through(&fs, ServiceAddr::port(7070)), vec![Err(Skip::BadChecksum)]);
    }

    /// Two datagrams of alike length under one IP identification (a sender whose
    /// counter wrapped) with fragments lost: the late one's first fragment and the early
    /// one's others make a datagram of the right length, which the UDP checksum over
    /// the whole refuses.
    #[test]
    fn fragments_of_two_datagrams_under_one_identification_are_refused_when_mixed() {
        let (early, late) = (message(8192, 3), message(8192, 4));
        let a = frames_of("10.0.0.1:40000", "10.0.0.2:7070", &early, 0x4242);
        let b = frames_of("10.0.0.1:40000", "10.0.0.2:7070", &late, 0x4242);
        let mixed: Vec<Vec<u8>> = std::iter::once(b[0].clone()).chain(a[1..].iter().cloned()).collect();
        assert_eq!(through(&mixed, ServiceAddr::port(7070)), vec![Err(Skip::BadChecksum)]);
    }
}

//! The reassembler's tests: fragments in any order, the bounds, the kernel's rules.

use super::*;
use std::net::{Ipv4Addr, Ipv6Addr};

fn key(src: u8, id: u32) -> FragKey {
    FragKey { src: IpAddr::V4(Ipv4Addr::new(10, 0, 0, src)), dst: IpAddr::V4(Ipv4Addr::new(10, 0, 1, 1)), id }
}

fn frag(k: FragKey, offset: usize, more: bool, data: &[u8]) -> Fragment<'_> {
    Fragment { key: k, offset, more, data }
}

/// `len` bytes that say where they are.
fn payload(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

/// `data` cut into fragments of `size` bytes (a multiple of 8), each with its place.
fn cut(data: &[u8], size: usize) -> Vec<(usize, bool, &[u8])> {
    let n = data.len().div_ceil(size);
    (0..n).map(|i| (i * size, i + 1 < n, &data[i * size..((i + 1) * size).min(data.len())])).collect()
}

#[test]
fn fragments_in_any_order_make_the_datagram_once() {
    let data = payload(8200);
    let k = key(1, 7);
    let mut parts = cut(&data, 1480);
    parts.reverse();
    parts.swap(1, 3);
    let mut r = Reassembler::new(ReasmLimits::KERNEL);
    for (i, (o, more, d)) in parts.iter().enumerate() {
        r.handle_fragment(1000, frag(k, *o, *more, d));
        let got = r.poll_datagram();
        if i + 1 < parts.len() {
            assert_eq!(got, None, "not complete after {} of {}", i + 1, parts.len());
        } else {
            assert_eq!(got, Some(Reassembled { key: k, payload: data.clone() }));
        }
    }
    assert_eq!((r.pending(), r.bytes_held(), r.counters().reassembled), (0, 0, 1));
    // Its fragments again: a new datagram under the same id, which never completes.
    r.handle_fragment(2000, frag(k, 0, true, &data[..1480]));
    assert_eq!((r.poll_datagram(), r.pending()), (None, 1));
}

#[test]
fn datagrams_of_other_sources_and_ids_do_not_mix() {
    let (a, b) = (payload(3000), payload(3000).iter().map(|x| !x).collect::<Vec<u8>>());
    let six = |id| FragKey {
        src: IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1)),
        dst: IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2)),
        id,
    };
    let keys = [key(1, 5), key(2, 5), key(1, 6), six(5)];
    let mut r = Reassembler::new(ReasmLimits::KERNEL);
    let mut done = Vec::new();
    for round in 0..3 {
        for (n, k) in keys.iter().enumerate() {
            let data = if n % 2 == 0 { &a } else { &b };
            let (o, more, d) = cut(data, 1024)[round];
            r.handle_fragment(0, frag(*k, o, more, d));
            if let Some(x) = r.poll_datagram() {
                done.push(x);
            }
        }
    }
    assert_eq!(done.len(), 4);
    for (n, x) in done.iter().enumerate() {
        assert_eq!(x.key, keys[n]);
        assert_eq!(x.payload, if n % 2 == 0 { a.clone() } else { b.clone() });
    }
}

#[test]
fn an_overlap_drops_the_datagram_and_a_duplicate_drops_itself() {
    let data = payload(4000);
    let k = key(1, 1);
    let mut r = Reassembler::new(ReasmLimits::KERNEL);
    r.handle_fragment(0, frag(k, 0, true, &data[..1600]));
    r.handle_fragment(0, frag(k, 0, true, &data[..1600]));
    assert_eq!((r.counters().duplicates, r.pending()), (1, 1));
    // Overlapping the held one by 8 bytes: the whole datagram goes.
    r.handle_fragment(0, frag(k, 1592, true, &data[1592..2400]));
    assert_eq!((r.counters().overlaps, r.pending(), r.bytes_held()), (1, 0, 0));
    // What follows starts afresh and cannot complete with the old part gone.
    r.handle_fragment(0, frag(k, 1600, false, &data[1600..]));
    assert_eq!((r.poll_datagram(), r.pending()), (None, 1));
    // A fragment lying inside another, and one covering two, overlap too.
    r.handle_fragment(0, frag(k, 1608, true, &data[1608..1616]));
    assert_eq!((r.counters().overlaps, r.pending()), (2, 0));
    r.handle_fragment(0, frag(k, 0, true, &data[..800]));
    r.handle_fragment(0, frag(k, 1600, true, &data[1600..2400]));
    r.handle_fragment(0, frag(k, 0, true, &data[..2400]));
    assert_eq!((r.counters().overlaps, r.pending()), (3, 0));
}

#[test]
fn lengths_past_the_limits_or_the_last_fragment_drop_the_datagram() {
    let data = payload(2000);
    let mut r = Reassembler::new(ReasmLimits::KERNEL);
    // Past 65,535 bytes of IPv4 packet.
    r.handle_fragment(0, frag(key(1, 1), 0, true, &data[..1000]));
    r.handle_fragment(0, frag(key(1, 1), 65_512, false, &data[..8]));
    assert_eq!((r.counters().malformed, r.pending()), (1, 0));
    // Not a multiple of 8 with more to follow.
    r.handle_fragment(0, frag(key(1, 2), 0, true, &data[..1001]));
    assert_eq!(r.counters().malformed, 2);
    // Data past the end the last fragment gave, before or after it came.
    r.handle_fragment(0, frag(key(1, 3), 1600, false, &data[..400]));
    r.handle_fragment(0, frag(key(1, 3), 2000, true, &data[..8]));
    assert_eq!((r.counters().malformed, r.pending()), (3, 0));
    r.handle_fragment(0, frag(key(1, 4), 1600, true, &data[..16]));
    r.handle_fragment(0, frag(key(1, 4), 0, false, &data[..1000]));
    assert_eq!((r.counters().malformed, r.pending()), (4, 0));
    // Two last fragments that disagree.
    r.handle_fragment(0, frag(key(1, 5), 800, false, &data[..200]));
    r.handle_fragment(0, frag(key(1, 5), 800, false, &data[..208]));
    assert_eq!((r.counters().malformed, r.pending(), r.bytes_held()), (5, 0, 0));
}

#[test]
fn memory_is_bounded_overall_and_per_source_and_freed_on_timeout() {
    let limits = ReasmLimits { max_bytes: 64 << 10, max_bytes_per_source: 16 << 10, ..ReasmLimits::KERNEL };
    let mut r = Reassembler::new(limits);
    let chunk = payload(1024);
    // One source sends first fragments that never complete: it stops at its share.
    for id in 0..100 {
        r.handle_fragment(0, frag(key(1, id), 0, true, &chunk));
    }
    let per = 1024 + FRAGMENT_COST + DATAGRAM_COST;
    assert_eq!(r.pending(), (16 << 10) / per);
    assert!(r.bytes_held() <= 16 << 10);
    assert_eq!(r.counters().over_memory, 100 - r.pending() as u64);
    // Many sources: the whole stops at its bound, and someone's complete datagram
    // still gets in once the others time out.
    for src in 2..40 {
        for id in 0..20 {
            r.handle_fragment(1, frag(key(src, id), 0, true, &chunk));
        }
    }
    assert!(r.bytes_held() <= 64 << 10 && r.bytes_held() > (64 << 10) - 2 * per, "{}", r.bytes_held());
    let k = key(200, 1);
    r.handle_fragment(2, frag(k, 0, true, &chunk));
    r.handle_fragment(2, frag(k, 1024, false, &chunk));
    assert_eq!(r.poll_datagram(), None, "refused while full");
    r.handle_timeout(29_000_000_000);
    let held = r.pending();
    assert_eq!(held, (64 << 10) / per, "none timed out yet");
    r.handle_timeout(30_000_000_002);
    assert_eq!((r.pending(), r.bytes_held(), r.counters().timed_out), (0, 0, held as u64));
    r.handle_fragment(30_100_000_000, frag(k, 0, true, &chunk));
    r.handle_fragment(30_100_000_000, frag(k, 1024, false, &chunk));
    assert_eq!(r.poll_datagram().map(|d| d.payload.len()), Some(2048));
}

proptest::proptest! {
    #[test]
    fn any_fragments_stay_within_the_bounds_and_time_out(
        frags in proptest::collection::vec((0u8..4, 0u32..3, 0usize..9000, proptest::bool::ANY, 0usize..1600), 0..300)
    ) {
        let limits =
            ReasmLimits { timeout_ns: 1_000_000_000, max_bytes: 32 << 10, max_bytes_per_source: 12 << 10, max_dist: 64 };
        let mut r = Reassembler::new(limits);
        let data = payload(1600);
        for (i, (src, id, offset, more, len)) in frags.into_iter().enumerate() {
            r.handle_fragment(i as u64 * 1_000_000, frag(key(src, id), offset & !7, more, &data[..len]));
            if let Some(d) = r.poll_datagram() {
                proptest::prop_assert!(d.payload.len() <= 65_515);
            }
            proptest::prop_assert!(r.bytes_held() <= limits.max_bytes);
            proptest::prop_assert!(r.per_source.values().all(|s| s.bytes <= limits.max_bytes_per_source));
            proptest::prop_assert_eq!(r.per_source.values().map(|s| s.bytes).sum::<usize>(), r.bytes_held());
        }
        r.handle_timeout(10_000_000_000);
        proptest::prop_assert_eq!((r.pending(), r.bytes_held(), r.per_source.len()), (0, 0, 0));
    }
}

#[test]
fn a_datagram_missing_a_fragment_is_given_up_once_its_source_sends_64_more() {
    let data = payload(3000);
    let mut r = Reassembler::new(ReasmLimits::KERNEL);
    // Datagram 1 loses its first fragment on the way.
    r.handle_fragment(0, frag(key(1, 1), 1024, true, &data[1024..2048]));
    r.handle_fragment(0, frag(key(1, 1), 2048, false, &data[2048..]));
    // The source goes on: 32 datagrams of three fragments, each complete.
    for id in 2..34 {
        for (o, more, d) in cut(&data, 1024) {
            r.handle_fragment(0, frag(key(1, id), o, more, d));
        }
        assert!(r.poll_datagram().is_some());
    }
    // Another source's fragments do not count against it.
    for id in 0..100 {
        r.handle_fragment(0, frag(key(2, id), 0, true, &data[..1024]));
    }
    // Its identification comes round: 96 fragments later, the old parts are given up
    // rather than joined to the new first fragment.
    r.handle_fragment(0, frag(key(1, 1), 0, true, &data[..1024]));
    assert_eq!((r.poll_datagram(), r.counters().too_far), (None, 1));
    r.handle_fragment(0, frag(key(1, 1), 1024, true, &data[1024..2048]));
    r.handle_fragment(0, frag(key(1, 1), 2048, false, &data[2048..]));
    assert_eq!(r.poll_datagram().map(|d| d.payload), Some(data.clone()));
    // Within 64 fragments, a late fragment still completes its datagram.
    r.handle_fragment(0, frag(key(1, 40), 1024, false, &data[1024..]));
    for id in 41..61 {
        for (o, more, d) in cut(&data, 1024) {
            r.handle_fragment(0, frag(key(1, id), o, more, d));
        }
    }
    r.handle_fragment(0, frag(key(1, 40), 0, true, &data[..1024]));
    assert_eq!(r.poll_datagram().map(|d| d.payload), Some(data));
    assert_eq!(r.counters().too_far, 1);
}

#[test]
fn a_duplicate_without_the_more_flag_sets_no_end_and_tiny_fragments_in_any_order_complete() {
    let data = payload(3000);
    let k = key(1, 1);
    let mut r = Reassembler::new(ReasmLimits::KERNEL);
    r.handle_fragment(0, frag(k, 0, true, &data[..1024]));
    r.handle_fragment(0, frag(k, 1024, true, &data[1024..2048]));
    r.handle_fragment(0, frag(k, 1024, false, &data[1024..2048]));
    assert_eq!((r.counters().duplicates, r.counters().malformed), (1, 0));
    r.handle_fragment(0, frag(k, 2048, false, &data[2048..]));
    assert_eq!(r.poll_datagram().map(|d| d.payload), Some(data));
    // 8 KiB in 8-byte fragments, last first: each is placed in the tree as it comes.
    let big = payload(8192);
    let parts = cut(&big, 8);
    for (o, more, d) in parts.iter().rev() {
        r.handle_fragment(0, frag(key(2, 2), *o, *more, d));
    }
    assert_eq!(r.poll_datagram().map(|d| d.payload), Some(big));
}

#[test]
fn while_the_path_reorders_frames_the_distance_rule_waits() {
    let data = payload(3000);
    let mut r = Reassembler::new(ReasmLimits::KERNEL);
    r.handle_reordering_until(5_000);
    // Datagram 1's last two fragments come 96 fragments after its first (held back).
    r.handle_fragment(1_000, frag(key(1, 1), 0, true, &data[..1024]));
    for id in 2..34 {
        for (o, more, d) in cut(&data, 1024) {
            r.handle_fragment(2_000, frag(key(1, id), o, more, d));
        }
        assert!(r.poll_datagram().is_some());
    }
    r.handle_fragment(4_000, frag(key(1, 1), 1024, true, &data[1024..2048]));
    r.handle_fragment(4_000, frag(key(1, 1), 2048, false, &data[2048..]));
    assert_eq!((r.poll_datagram().map(|d| d.payload), r.counters().too_far), (Some(data.clone()), 0));
    // After that, the rule holds again.
    r.handle_fragment(6_000, frag(key(1, 40), 0, true, &data[..1024]));
    for id in 41..75 {
        for (o, more, d) in cut(&data, 1024) {
            r.handle_fragment(6_000, frag(key(1, id), o, more, d));
        }
    }
    r.handle_fragment(6_000, frag(key(1, 40), 1024, true, &data[1024..2048]));
    assert_eq!(r.counters().too_far, 1);
}

#[test]
fn a_timeout_is_checked_at_most_once_a_second_and_counts_from_the_first_fragment() {
    let mut r = Reassembler::new(ReasmLimits { timeout_ns: 5_000_000_000, ..ReasmLimits::KERNEL });
    let data = payload(3000);
    let k = key(1, 1);
    r.handle_fragment(0, frag(k, 0, true, &data[..1024]));
    // A later fragment does not restart the clock.
    r.handle_fragment(4_900_000_000, frag(k, 1024, true, &data[1024..2048]));
    r.handle_timeout(5_000_000_000);
    assert_eq!(r.pending(), 1, "within a second of the last look");
    r.handle_timeout(5_900_000_001);
    assert_eq!((r.pending(), r.counters().timed_out), (0, 1));
}

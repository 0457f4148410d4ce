//! Planning UDP GSO sends (sans-IO).
//!
//! With `UDP_SEGMENT` the application hands the kernel one buffer holding several
//! datagrams of `gso_size` bytes each (the last may be shorter); the kernel splits it
//! just before the device and the wire carries exactly the datagrams individual sends
//! would have produced (Linux 4.18, commit bec1f6f69736 "udp: generate gso with
//! UDP_SEGMENT"). The limits:
//!
//! - at most `UDP_MAX_SEGMENTS` segments (64; 128 in newer kernels; netlane uses 64);
//! - the whole buffer must fit one IP datagram: 65,507 bytes of UDP payload over IPv4,
//!   65,527 over IPv6;
//! - every segment but the last is exactly `gso_size`; a shorter one ends the send;
//! - a one-segment send is not GSO: some drivers reject a GSO cmsg with one segment, so
//!   the plan marks it and the sender omits the cmsg.
//!
//! [`plan`] groups a run of datagrams (same destination, in order) into sends that obey
//! these rules; [`GsoLimits`] says how large a send may be.

use netlane_sys::consts::{MAX_UDP_PAYLOAD_V4, MAX_UDP_PAYLOAD_V6, UDP_MAX_SEGMENTS};
use serde::Serialize;

/// How large one GSO send may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GsoLimits {
    /// Most segments per send (1 disables GSO).
    pub max_segments: usize,
    /// Most payload bytes per send (the IP datagram limit).
    pub max_payload: usize,
}

impl GsoLimits {
    /// The kernel's limits for IPv4 or IPv6 with `UDP_MAX_SEGMENTS` segments.
    pub fn for_family(ipv6: bool) -> Self {
        Self { max_segments: UDP_MAX_SEGMENTS, max_payload: if ipv6 { MAX_UDP_PAYLOAD_V6 } else { MAX_UDP_PAYLOAD_V4 } }
    }

    /// Limits with at most `segments` per send (clamped to `1..=UDP_MAX_SEGMENTS`).
    pub fn with_max_segments(self, segments: usize) -> Self {
        Self { max_segments: segments.clamp(1, UDP_MAX_SEGMENTS), ..self }
    }

    /// Segments of `gso_size` bytes that fit one send (at least 1).
    pub fn segments_per_send(&self, gso_size: usize) -> usize {
        if gso_size == 0 {
            return 1;
        }
        (self.max_payload / gso_size).clamp(1, self.max_segments.max(1))
    }
}

/// One planned send: datagrams `first..first + count` of the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GsoBatch {
    /// Index of the first datagram.
    pub first: usize,
    /// Number of datagrams (segments).
    pub count: usize,
    /// The segment size to pass as `UDP_SEGMENT` (the first datagram's length).
    pub segment_size: usize,
    /// Total payload bytes.
    pub bytes: usize,
}

impl GsoBatch {
    /// Whether this send needs a GSO segment size (more than one segment).
    pub fn is_gso(&self) -> bool {
        self.count > 1
    }
}

/// Groups datagrams with the given lengths into GSO sends, in order.
///
/// A batch starts with any datagram and takes the following ones while they are no
/// longer than the first, the previous one was full-sized, and the segment and byte
/// limits hold. Zero-length datagrams always travel alone (a GSO send cannot end in
/// an empty segment).
pub fn plan(lens: &[usize], limits: GsoLimits) -> Vec<GsoBatch> {
    let mut out = Vec::new();
    plan_into(lens, limits, &mut out);
    out
}

/// [`plan`] into a reused vector (cleared first).
pub fn plan_into(lens: &[usize], limits: GsoLimits, out: &mut Vec<GsoBatch>) {
    out.clear();
    let mut i = 0;
    while i < lens.len() {
        let seg = lens[i];
        let mut batch = GsoBatch { first: i, count: 1, segment_size: seg, bytes: seg };
        i += 1;
        if seg > 0 {
            while i < lens.len()
                && batch.count < limits.max_segments
                && lens[i] > 0
                && lens[i] <= seg
                && batch.bytes + lens[i] <= limits.max_payload
            {
                batch.count += 1;
                batch.bytes += lens[i];
                i += 1;
                if lens[i - 1] < seg {
                    break; // a short segment must be the last one
                }
            }
        }
        out.push(batch);
    }
}

/// Splits one contiguous buffer of `total` bytes into GSO sends of `gso_size`-byte
/// segments (the stream case: a bulk sender cutting its data into datagrams).
/// Returns `(offset, len)` pairs; each send holds at most
/// `limits.segments_per_send(gso_size)` segments, and only the very last segment of
/// the whole buffer may be short.
pub fn split_stream(total: usize, gso_size: usize, limits: GsoLimits) -> impl Iterator<Item = (usize, usize)> {
    let per_send = limits.segments_per_send(gso_size).saturating_mul(gso_size.max(1));
    let step = per_send.max(1);
    (0..total).step_by(step).map(move |off| (off, step.min(total - off)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const V4: GsoLimits = GsoLimits { max_segments: 64, max_payload: MAX_UDP_PAYLOAD_V4 };

    #[test]
    fn full_segments_fill_to_the_ip_limit() {
        // 1400-byte segments: 46 fit 65,507 bytes (64 x 1400 would not).
        assert_eq!(V4.segments_per_send(1400), 46);
        assert_eq!(GsoLimits::for_family(true).segments_per_send(1400), 46);
        assert_eq!(V4.segments_per_send(1000), 64);
        assert_eq!(V4.segments_per_send(65_507), 1);
        assert_eq!(V4.segments_per_send(0), 1);
        let lens = vec![1400; 100];
        let p = plan(&lens, V4);
        assert_eq!(p.iter().map(|b| b.count).collect::<Vec<_>>(), vec![46, 46, 8]);
        assert!(p.iter().all(|b| b.segment_size == 1400));
    }

    #[test]
    fn short_last_segment_closes_the_batch() {
        let p = plan(&[1200, 1200, 700, 1200, 1200], V4);
        assert_eq!(
            p,
            vec![
                GsoBatch { first: 0, count: 3, segment_size: 1200, bytes: 3100 },
                GsoBatch { first: 3, count: 2, segment_size: 1200, bytes: 2400 },
            ]
        );
    }

    #[test]
    fn larger_datagram_starts_a_new_batch() {
        let p = plan(&[500, 500, 900, 900], V4);
        assert_eq!(p.len(), 2);
        assert_eq!((p[0].count, p[0].segment_size), (2, 500));
        assert_eq!((p[1].count, p[1].segment_size), (2, 900));
    }

    #[test]
    fn single_segment_is_not_gso() {
        let p = plan(&[1400], V4);
        assert_eq!(p.len(), 1);
        assert!(!p[0].is_gso());
    }

    #[test]
    fn segment_limit_is_honoured() {
        let lens = vec![100; 200];
        let p = plan(&lens, V4.with_max_segments(10));
        assert!(p.iter().all(|b| b.count <= 10));
        assert_eq!(p.len(), 20);
        assert_eq!(V4.with_max_segments(0).max_segments, 1);
        assert_eq!(V4.with_max_segments(1000).max_segments, 64);
    }

    #[test]
    fn zero_length_datagrams_travel_alone() {
        let p = plan(&[0, 100, 0, 0, 100, 100], V4);
        assert_eq!(p.iter().map(|b| b.count).collect::<Vec<_>>(), vec![1, 1, 1, 1, 2]);
    }

    #[test]
    fn stream_split_leaves_only_the_last_segment_short() {
        let sends: Vec<_> = split_stream(100_000, 1400, V4).collect();
        assert_eq!(sends[0], (0, 64_400));
        assert_eq!(sends[1], (64_400, 35_600));
        assert_eq!(split_stream(0, 1400, V4).count(), 0);
    }

    proptest! {
        /// Any input: batches cover every datagram once, in order, and each batch is a
        /// valid GSO send.
        #[test]
        fn plans_are_valid(lens in proptest::collection::vec(0usize..3000, 0..300),
                           max_segs in 1usize..=64,
                           ipv6 in any::<bool>()) {
            let limits = GsoLimits::for_family(ipv6).with_max_segments(max_segs);
            let p = plan(&lens, limits);
            let mut next = 0;
            for b in &p {
                prop_assert_eq!(b.first, next);
                prop_assert!(b.count >= 1 && b.count <= limits.max_segments);
                let seg = &lens[b.first..b.first + b.count];
                prop_assert_eq!(b.segment_size, seg[0]);
                prop_assert_eq!(b.bytes, seg.iter().sum::<usize>());
                if b.count > 1 {
                    prop_assert!(b.bytes <= limits.max_payload);
                    prop_assert!(seg[..seg.len() - 1].iter().all(|&l| l == b.segment_size));
                    prop_assert!(seg[seg.len() - 1] > 0 && seg[seg.len() - 1] <= b.segment_size);
                }
                next += b.count;
            }
            prop_assert_eq!(next, lens.len());
        }
    }
}

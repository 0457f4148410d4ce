//! IP reassembly for the paths below the stack. A packet ring sees a fragmented request
//! as its fragments; this puts them together, bounded as the kernel bounds its own
//! reassembly (`net/ipv4/ip_fragment.c`, `net/ipv6/reassembly.c`, the `ipfrag_*`
//! sysctls), because every fragment is a peer's to choose:
//!
//! - a datagram is given up [`ReasmLimits::timeout_ns`] after its first fragment
//!   (`ipfrag_time`, 30 s), looked for at most once a second (the driver passes the
//!   clock in when frames come and when it wakes without any), or when
//!   [`ReasmLimits::max_dist`] fragments from its source came since its last one
//!   (`ipfrag_max_dist`, 64: a fragment lost on the way would otherwise wait out the
//!   timeout, and IPv4's 16-bit identification comes round at a few tens of thousands
//!   of datagrams a second, when the survivors would join the next datagram to take
//!   their identification; the kernel checks this for IPv4, this for both);
//! - the fragments held take at most [`ReasmLimits::max_bytes`] (`ipfrag_high_thresh`,
//!   4 MiB), counting each fragment's bytes and a fixed cost per fragment and per
//!   datagram; a fragment that would pass it is dropped, as the kernel drops new
//!   fragments over the threshold. One source address holds at most
//!   [`ReasmLimits::max_bytes_per_source`], so one sender alone cannot fill it;
//! - a reassembled datagram is at most 65,535 bytes of IP packet (IPv4, with its
//!   20-byte header) or of IPv6 payload;
//! - a fragment that overlaps one held drops the whole datagram (RFC 5722; the kernel
//!   does the same for IPv4); an exact duplicate is dropped alone;
//! - a fragment with more to follow must be a multiple of 8 bytes long (RFC 8200 4.5),
//!   and nothing may lie past the end the last fragment gives; a datagram that breaks
//!   either is dropped.
//!
//! Sans-IO: the driver passes fragments and the clock in ([`Reassembler::handle_fragment`],
//! [`Reassembler::handle_timeout`]) and takes whole datagrams out
//! ([`Reassembler::poll_datagram`]).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

/// What identifies the fragments of one datagram: its addresses and IP identification
/// (the protocol is always UDP here; the family is the addresses').
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FragKey {
    /// Sender.
    pub src: IpAddr,
    /// Destination.
    pub dst: IpAddr,
    /// IPv4's 16-bit or IPv6's 32-bit identification.
    pub id: u32,
}

/// One fragment as the parser found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fragment<'a> {
    /// Whose fragment.
    pub key: FragKey,
    /// Where its data starts in the datagram's IP payload, in bytes.
    pub offset: usize,
    /// Whether more fragments follow (IPv4 MF, IPv6 M).
    pub more: bool,
    /// Its part of the IP payload.
    pub data: &'a [u8],
}

/// The reassembler's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReasmLimits {
    /// How long after its first fragment a datagram is given up, in nanoseconds.
    pub timeout_ns: u64,
    /// Bytes all held fragments may take.
    pub max_bytes: usize,
    /// Bytes the fragments from one source address may take.
    pub max_bytes_per_source: usize,
    /// Fragments from a datagram's source after its last one, past which it is given
    /// up.
    pub max_dist: u64,
}

impl ReasmLimits {
    /// The kernel's defaults (30 s, 4 MiB, 64 fragments), and a quarter of the memory
    /// per source address, which the kernel does not limit.
    pub const KERNEL: ReasmLimits =
        ReasmLimits { timeout_ns: 30_000_000_000, max_bytes: 4 << 20, max_bytes_per_source: 1 << 20, max_dist: 64 };
}

/// What a fragment costs beyond its bytes (its place in the list), and a datagram
/// beyond its fragments (its entry, its key): so that a flood of tiny fragments, or of
/// first fragments of datagrams that never complete, is bounded by the same budget.
const FRAGMENT_COST: usize = 64;
const DATAGRAM_COST: usize = 256;

/// How often the held datagrams are checked for their timeout, at most.
const SCAN_EVERY_NS: u64 = 1_000_000_000;

/// What the reassembler did, by outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReasmCounters {
    /// Datagrams put back together.
    pub reassembled: u64,
    /// Datagrams given up after the timeout.
    pub timed_out: u64,
    /// Datagrams given up because their source sent more than `max_dist` fragments
    /// since their last.
    pub too_far: u64,
    /// Datagrams dropped for a fragment that overlapped one held.
    pub overlaps: u64,
    /// Fragments dropped because they would pass the memory bounds.
    pub over_memory: u64,
    /// Fragments refused (and their datagrams dropped) for lying past 65,535 bytes or
    /// past the last fragment's end, or for being empty or not a multiple of 8 bytes
    /// with more to follow.
    pub malformed: u64,
    /// Exact duplicates dropped.
    pub duplicates: u64,
}

/// A datagram put back together: its IP payload (a UDP header and its payload).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reassembled {
    /// Whose.
    pub key: FragKey,
    /// The IP payload.
    pub payload: Vec<u8>,
}

#[derive(Debug)]
struct Datagram {
    /// Fragments held by offset, none overlapping (a tree: fragments in any order cost
    /// a logarithm each, where a sorted list would move all the others on every insert).
    parts: BTreeMap<usize, Vec<u8>>,
    /// Bytes of data held.
    held: usize,
    /// The IP payload's length, once the last fragment came.
    total: Option<usize>,
    /// Budget charged for it.
    charged: usize,
    /// When its first fragment came.
    started_ns: u64,
    /// Its source's fragment count at its last fragment.
    last_seq: u64,
}

/// What one source has in the reassembler.
#[derive(Debug, Default)]
struct Source {
    /// Budget charged for its datagrams.
    bytes: usize,
    /// Fragments it sent while it had datagrams held.
    seq: u64,
}

/// Why a datagram is dropped.
enum Drop {
    Overlap,
    Malformed,
}

/// Puts fragmented datagrams back together within [`ReasmLimits`].
#[derive(Debug)]
pub struct Reassembler {
    limits: ReasmLimits,
    datagrams: HashMap<FragKey, Datagram>,
    bytes: usize,
    per_source: HashMap<IpAddr, Source>,
    next_scan_ns: u64,
    /// Until when the distance rule is off (the receive path reorders frames itself).
    no_distance_until_ns: u64,
    ready: Option<Reassembled>,
    counters: ReasmCounters,
}

impl Reassembler {
    /// An empty reassembler.
    pub fn new(limits: ReasmLimits) -> Reassembler {
        Reassembler {
            limits,
            datagrams: HashMap::new(),
            bytes: 0,
            per_source: HashMap::new(),
            next_scan_ns: 0,
            no_distance_until_ns: 0,
            ready: None,
            counters: ReasmCounters::default(),
        }
    }

    /// What it did so far.
    pub fn counters(&self) -> ReasmCounters {
        self.counters
    }

    /// Bytes charged for what it holds (fragments and their costs).
    pub fn bytes_held(&self) -> usize {
        self.bytes
    }

    /// Datagrams waiting for fragments.
    pub fn pending(&self) -> usize {
        self.datagrams.len()
    }

    /// Takes one fragment at `now_ns`. When it completes its datagram, the datagram is
    /// ready for [`Reassembler::poll_datagram`] (one at a time: take it before the next
    /// fragment, or it is replaced).
    pub fn handle_fragment(&mut self, now_ns: u64, f: Fragment<'_>) {
        self.handle_timeout(now_ns);
        let end = f.offset.saturating_add(f.data.len());
        let limit = if f.key.src.is_ipv4() { 65_535 - 20 } else { 65_535 };
        if end > limit || (f.more && (f.data.is_empty() || !f.data.len().is_multiple_of(8))) {
            self.counters.malformed += 1;
            self.drop_datagram(&f.key);
            return;
        }
        let seq = self.per_source.get(&f.key.src).map_or(0, |s| s.seq + 1);
        let far = |d: &Datagram| seq - d.last_seq > self.limits.max_dist && now_ns >= self.no_distance_until_ns;
        if self.datagrams.get(&f.key).is_some_and(far) {
            self.counters.too_far += 1;
            self.drop_datagram(&f.key);
        }
        let new = !self.datagrams.contains_key(&f.key);
        let cost = f.data.len() + FRAGMENT_COST + if new { DATAGRAM_COST } else { 0 };
        let source = self.per_source.get(&f.key.src).map_or(0, |s| s.bytes);
        if self.bytes + cost > self.limits.max_bytes || source + cost > self.limits.max_bytes_per_source {
            self.counters.over_memory += 1;
            return;
        }
        let seq = match self.per_source.get_mut(&f.key.src) {
            Some(s) => {
                s.seq += 1;
                s.seq
            }
            None => 0,
        };
        let d = self.datagrams.entry(f.key).or_insert_with(|| Datagram {
            parts: BTreeMap::new(),
            held: 0,
            total: None,
            charged: 0,
            started_ns: now_ns,
            last_seq: seq,
        });
        d.last_seq = seq;
        match d.insert(f.offset, end, f.more, f.data) {
            Ok(true) => {
                d.charged += cost;
                self.bytes += cost;
                self.per_source.entry(f.key.src).or_default().bytes += cost;
            }
            Ok(false) => {
                // (Never a new datagram's first fragment: it holds nothing to repeat.)
                self.counters.duplicates += 1;
                return;
            }
            Err(why) => {
                match why {
                    Drop::Overlap => self.counters.overlaps += 1,
                    Drop::Malformed => self.counters.malformed += 1,
                }
                self.drop_datagram(&f.key);
                return;
            }
        }
        if d.total == Some(d.held) {
            let d = self.datagrams.remove(&f.key).expect("the datagram just completed is held");
            self.release(f.key.src, d.charged);
            let mut payload = Vec::with_capacity(d.held);
            for data in d.parts.values() {
                payload.extend_from_slice(data);
            }
            self.counters.reassembled += 1;
            self.ready = Some(Reassembled { key: f.key, payload });
        }
    }

    /// The receive path delays some frames behind others until `until_ns` (an adaptive
    /// ring switch holds the old ring's open block until it retires): until then a
    /// fragment that far behind its datagram's others is not a lost one's survivor, so
    /// the distance rule waits (the timeout and the memory bounds still hold).
    pub fn handle_reordering_until(&mut self, until_ns: u64) {
        self.no_distance_until_ns = self.no_distance_until_ns.max(until_ns);
    }

    /// The datagram the last fragment completed, if it did.
    pub fn poll_datagram(&mut self) -> Option<Reassembled> {
        self.ready.take()
    }

    /// Gives up the datagrams whose time ran out by `now_ns` (looking at most once a
    /// second: a datagram lives at most a second past its timeout).
    pub fn handle_timeout(&mut self, now_ns: u64) {
        if now_ns < self.next_scan_ns {
            return;
        }
        self.next_scan_ns = now_ns.saturating_add(SCAN_EVERY_NS);
        let timeout = self.limits.timeout_ns;
        let expired: Vec<FragKey> = self
            .datagrams
            .iter()
            .filter(|(_, d)| now_ns.saturating_sub(d.started_ns) >= timeout)
            .map(|(k, _)| *k)
            .collect();
        for k in expired {
            self.counters.timed_out += 1;
            self.drop_datagram(&k);
        }
    }

    fn drop_datagram(&mut self, key: &FragKey) {
        if let Some(d) = self.datagrams.remove(key) {
            self.release(key.src, d.charged);
        }
    }

    /// Gives back a datagram's budget; a source with nothing held is forgotten (its
    /// fragment count only compares datagrams it has held).
    fn release(&mut self, src: IpAddr, charged: usize) {
        self.bytes -= charged;
        if let Some(s) = self.per_source.get_mut(&src) {
            s.bytes -= charged;
            if s.bytes == 0 {
                self.per_source.remove(&src);
            }
        }
    }
}

impl Datagram {
    /// Places `data` at `offset..end`: `Ok(true)` if held, `Ok(false)` for an exact
    /// duplicate, or why the datagram must be dropped.
    fn insert(&mut self, offset: usize, end: usize, more: bool, data: &[u8]) -> Result<bool, Drop> {
        if !more {
            // The last fragment: its end is the datagram's, and nothing held lies past it.
            if self.total.is_some_and(|t| t != end)
                || self.parts.last_key_value().is_some_and(|(o, d)| o + d.len() > end)
            {
                return Err(Drop::Malformed);
            }
        } else if self.total.is_some_and(|t| end > t) {
            return Err(Drop::Malformed);
        }
        if self.parts.get(&offset).is_some_and(|d| offset + d.len() == end) {
            return Ok(false);
        }
        let overlaps_before = self.parts.range(..offset).next_back().is_some_and(|(o, d)| o + d.len() > offset);
        let overlaps_after = self.parts.range(offset..).next().is_some_and(|(o, _)| *o < end);
        if overlaps_before || overlaps_after {
            return Err(Drop::Overlap);
        }
        // Only a fragment that is held sets the end (a duplicate of one with more to
        // follow, sent without the flag, does not).
        if !more {
            self.total = Some(end);
        }
        self.parts.insert(offset, data.to_vec());
        self.held += data.len();
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
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
}

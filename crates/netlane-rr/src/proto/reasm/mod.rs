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
mod tests;

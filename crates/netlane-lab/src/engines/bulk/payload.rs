//! The bulk payload format and its checks (sans-IO).
//!
//! Every UDP datagram starts with a 16-byte header, little-endian:
//! `magic: u32 = "NLBK"`, `run: u32` (identifies the run, so stray datagrams of an
//! earlier run are recognised), `seq: u64` (the datagram's index in the run). The
//! rest is a fixed pattern, `byte[i] = pattern(i)`, the same in every datagram: the
//! sender only rewrites the header per datagram, so it does no more memory work than
//! a sender that never touches its buffer, and the receiver can still verify every
//! byte.
//!
//! A TCP stream carries `byte[offset] = stream_byte(offset)`.

use serde::Serialize;

/// Header magic, "NLBK".
pub const MAGIC: u32 = u32::from_le_bytes(*b"NLBK");
/// Header length in bytes; datagrams must be at least this long.
pub const HEADER_LEN: usize = 16;

/// The pattern byte at position `i` of a datagram (positions below the header are
/// never compared).
#[inline]
pub fn pattern(i: usize) -> u8 {
    (i as u8).wrapping_mul(31).wrapping_add(7)
}

/// The byte at `offset` of a TCP bulk stream (period 251, a prime, so writes of any
/// power-of-two size see shifting content).
#[inline]
pub fn stream_byte(offset: u64) -> u8 {
    (offset % 251) as u8
}

/// Fills `buf` with the datagram pattern (done once per buffer).
pub fn fill_pattern(buf: &mut [u8], datagram_size: usize) {
    for chunk in buf.chunks_mut(datagram_size.max(1)) {
        for (i, b) in chunk.iter_mut().enumerate() {
            *b = pattern(i);
        }
    }
}

/// Writes headers for `count` datagrams of `datagram_size` bytes laid out back to
/// back in `buf`, numbered from `first_seq`.
pub fn stamp(buf: &mut [u8], datagram_size: usize, run: u32, first_seq: u64, count: usize) {
    for (k, chunk) in buf.chunks_mut(datagram_size).take(count).enumerate() {
        if chunk.len() < HEADER_LEN {
            continue;
        }
        chunk[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        chunk[4..8].copy_from_slice(&run.to_le_bytes());
        chunk[8..16].copy_from_slice(&(first_seq + k as u64).to_le_bytes());
    }
}

/// The header of a received datagram, if it has a valid one for `run`.
pub fn parse_header(d: &[u8], run: u32) -> Option<u64> {
    let h = d.get(..HEADER_LEN)?;
    let magic = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
    let r = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
    if magic != MAGIC || r != run {
        return None;
    }
    Some(u64::from_le_bytes([h[8], h[9], h[10], h[11], h[12], h[13], h[14], h[15]]))
}

/// How much of each datagram the receiver checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Verify {
    /// Count bytes only (for peers that do not send our format, e.g. udpgso_bench_tx).
    Count,
    /// Check the header: magic, run, sequence (loss, duplicates, reordering).
    Header,
    /// Check the header and every payload byte.
    Full,
}

/// What the receiver found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Integrity {
    /// Datagrams with a valid header for this run, counted once each.
    pub unique: u64,
    /// Datagrams whose sequence number was seen before.
    pub duplicates: u64,
    /// Datagrams that arrived after a higher sequence number.
    pub reordered: u64,
    /// Datagrams without a valid header (foreign, or corrupt header).
    pub foreign: u64,
    /// Datagrams whose payload differed from the pattern (Full only).
    pub corrupt: u64,
    /// Datagrams of an unexpected length.
    pub bad_length: u64,
    /// Highest sequence number seen plus one.
    pub high_water: u64,
}

/// Tracks which sequence numbers arrived (a growable bitmap).
#[derive(Debug, Clone, Default)]
pub struct SeqSet {
    bits: Vec<u64>,
}

impl SeqSet {
    /// Marks `seq`; returns false if it was already marked.
    pub fn insert(&mut self, seq: u64) -> bool {
        let word = (seq / 64) as usize;
        if word >= self.bits.len() {
            // Grow geometrically; sequence numbers come from our own sender and are
            // dense, but cap the growth a bogus number can cause (checked by caller).
            let want = (word + 1).max(self.bits.len() * 2).max(1024);
            self.bits.resize(want, 0);
        }
        let mask = 1u64 << (seq % 64);
        let had = self.bits[word] & mask != 0;
        self.bits[word] |= mask;
        !had
    }

    /// Whether `seq` is marked.
    pub fn contains(&self, seq: u64) -> bool {
        self.bits.get((seq / 64) as usize).is_some_and(|w| w & (1u64 << (seq % 64)) != 0)
    }

    /// Sequence numbers below `n` that are not marked.
    pub fn missing_below(&self, n: u64) -> u64 {
        (0..n).filter(|s| !self.contains(*s)).count() as u64
    }
}

/// Checks datagrams of one run as they arrive.
#[derive(Debug, Clone)]
pub struct Checker {
    run: u32,
    verify: Verify,
    datagram_size: usize,
    seen: SeqSet,
    /// Largest sequence number accepted (guards the bitmap against bogus values).
    seq_limit: u64,
    /// Counters.
    pub integrity: Integrity,
}

impl Checker {
    /// A checker for `run`, expecting datagrams of `datagram_size` bytes (the last one
    /// of a transfer may be shorter). Sequence numbers at or above `seq_limit` count as
    /// foreign.
    pub fn new(run: u32, verify: Verify, datagram_size: usize, seq_limit: u64) -> Self {
        Self { run, verify, datagram_size, seen: SeqSet::default(), seq_limit, integrity: Integrity::default() }
    }

    /// Checks one datagram.
    pub fn check(&mut self, d: &[u8]) {
        if self.verify == Verify::Count {
            self.integrity.unique += 1;
            return;
        }
        let Some(seq) = parse_header(d, self.run).filter(|s| *s < self.seq_limit) else {
            self.integrity.foreign += 1;
            return;
        };
        if d.len() > self.datagram_size {
            self.integrity.bad_length += 1;
        }
        if !self.seen.insert(seq) {
            self.integrity.duplicates += 1;
            return;
        }
        self.integrity.unique += 1;
        if seq + 1 < self.integrity.high_water {
            self.integrity.reordered += 1;
        }
        self.integrity.high_water = self.integrity.high_water.max(seq + 1);
        if self.verify == Verify::Full && d.iter().enumerate().skip(HEADER_LEN).any(|(i, b)| *b != pattern(i)) {
            self.integrity.corrupt += 1;
        }
    }

    /// The set of sequence numbers seen.
    pub fn seen(&self) -> &SeqSet {
        &self.seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn train(run: u32, first: u64, n: usize, size: usize) -> Vec<u8> {
        let mut b = vec![0u8; n * size];
        fill_pattern(&mut b, size);
        stamp(&mut b, size, run, first, n);
        b
    }

    #[test]
    fn stamped_datagrams_pass_full_verification() {
        let b = train(7, 100, 5, 200);
        let mut c = Checker::new(7, Verify::Full, 200, 1 << 40);
        for d in b.chunks(200) {
            c.check(d);
        }
        assert_eq!(c.integrity, Integrity { unique: 5, high_water: 105, ..Default::default() });
        assert_eq!(c.seen().missing_below(105), 100);
    }

    #[test]
    fn loss_duplicates_reordering_corruption_are_counted() {
        let b = train(1, 0, 6, 64);
        let d: Vec<&[u8]> = b.chunks(64).collect();
        let mut c = Checker::new(1, Verify::Full, 64, 1 << 40);
        c.check(d[0]);
        c.check(d[2]);
        c.check(d[1]); // reordered
        c.check(d[2]); // duplicate
        let mut bad = d[4].to_vec();
        bad[40] ^= 1;
        c.check(&bad); // corrupt payload
        c.check(b"not ours at all, definitely"); // foreign
        c.check(&train(2, 5, 1, 64)); // other run
        let i = c.integrity;
        assert_eq!((i.unique, i.duplicates, i.reordered, i.corrupt, i.foreign), (4, 1, 1, 1, 2));
        assert_eq!(c.seen().missing_below(6), 2); // 3 and 5
    }

    #[test]
    fn short_last_datagram_is_fine_and_long_ones_are_flagged() {
        let mut c = Checker::new(1, Verify::Full, 64, 1 << 40);
        let b = train(1, 0, 1, 64);
        c.check(&b[..30]);
        assert_eq!(c.integrity.bad_length, 0);
        let mut long = train(1, 1, 1, 100);
        long.truncate(100);
        c.check(&long);
        assert_eq!(c.integrity.bad_length, 1);
    }

    #[test]
    fn bogus_sequence_numbers_cannot_grow_the_bitmap() {
        let mut c = Checker::new(1, Verify::Header, 64, 1000);
        let b = train(1, u64::MAX / 2, 1, 64);
        c.check(&b);
        assert_eq!(c.integrity.foreign, 1);
    }

    #[test]
    fn count_mode_accepts_anything() {
        let mut c = Checker::new(1, Verify::Count, 64, 10);
        c.check(b"x");
        assert_eq!(c.integrity.unique, 1);
    }

    #[test]
    fn stream_pattern_has_period_251() {
        assert_eq!(stream_byte(0), 0);
        assert_eq!(stream_byte(251), 0);
        assert_eq!(stream_byte(252), 1);
    }
}

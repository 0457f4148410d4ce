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

/// Header length of a datagram of a many-flow sender: the header, then the flow's
/// number (`u32`) and the datagram's index in its flow (`u64`), little-endian.
pub const FLOW_HEADER_LEN: usize = HEADER_LEN + 12;

/// Writes the flow part of the headers of `count` datagrams laid out back to back in
/// `buf`: flow `flow`, numbered within it from `first`.
pub fn stamp_flow(buf: &mut [u8], datagram_size: usize, flow: u32, first: u64, count: usize) {
    for (k, chunk) in buf.chunks_mut(datagram_size).take(count).enumerate() {
        if let Some(h) = chunk.get_mut(HEADER_LEN..FLOW_HEADER_LEN) {
            h[0..4].copy_from_slice(&flow.to_le_bytes());
            h[4..12].copy_from_slice(&(first + k as u64).to_le_bytes());
        }
    }
}

/// The flow part of a received datagram's header: (flow, index in the flow).
pub fn parse_flow(d: &[u8]) -> Option<(u32, u64)> {
    let h = d.get(HEADER_LEN..FLOW_HEADER_LEN)?;
    let flow = u32::from_le_bytes(h[0..4].try_into().ok()?);
    Some((flow, u64::from_le_bytes(h[4..12].try_into().ok()?)))
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
pub enum Verify {
    /// Count bytes only (for peers that do not send our format, e.g. udpgso_bench_tx).
    Count,
    /// Check the header: magic, run, sequence (loss, duplicates, reordering).
    Header,
    /// Check the header and every payload byte.
    Full,
}

/// What the receiver found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema)]
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
    /// Datagrams below the sequence window (older than 2^24 datagrams before the
    /// highest one): not counted as unique, since they cannot be told from duplicates.
    pub too_old: u64,
    /// Highest sequence number seen plus one.
    pub high_water: u64,
}

/// Sequence numbers tracked at once: 2^24 datagrams (2 MiB of bits), far more than
/// can be in flight or reordered on any path the lab builds.
pub const SEQ_WINDOW: u64 = 1 << 24;

/// What [`SeqWindow::insert`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// First time.
    New,
    /// Seen before (within the window).
    Duplicate,
    /// Below the window: too old to tell.
    TooOld,
}

/// Which sequence numbers arrived, over a window of [`SEQ_WINDOW`] numbers that slides
/// forward with the highest one seen. Memory is fixed at construction: a datagram with
/// a huge sequence number (a forged one, say) only slides the window, it cannot make
/// the receiver allocate.
#[derive(Debug, Clone)]
pub struct SeqWindow {
    /// Bit `seq % SEQ_WINDOW` says whether `seq` arrived, for `base <= seq < base + SEQ_WINDOW`.
    bits: Vec<u64>,
    /// Lowest sequence number tracked (a multiple of 64).
    base: u64,
}

impl Default for SeqWindow {
    fn default() -> Self {
        SeqWindow { bits: vec![0; (SEQ_WINDOW / 64) as usize], base: 0 }
    }
}

impl SeqWindow {
    fn slot(seq: u64) -> (usize, u64) {
        let i = seq % SEQ_WINDOW;
        ((i / 64) as usize, 1u64 << (i % 64))
    }

    /// Marks `seq`.
    pub fn insert(&mut self, seq: u64) -> Seen {
        if seq < self.base {
            return Seen::TooOld;
        }
        if seq - self.base >= SEQ_WINDOW {
            // Slide: the words that fall out of the window are reused for the new top.
            let new_base = (seq - SEQ_WINDOW + 1).next_multiple_of(64);
            let dropped = new_base - self.base;
            if dropped >= SEQ_WINDOW {
                self.bits.fill(0);
            } else {
                for w in (self.base / 64)..(new_base / 64) {
                    self.bits[(w % (SEQ_WINDOW / 64)) as usize] = 0;
                }
            }
            self.base = new_base;
        }
        let (w, m) = Self::slot(seq);
        let had = self.bits[w] & m != 0;
        self.bits[w] |= m;
        if had { Seen::Duplicate } else { Seen::New }
    }

    /// Whether `seq` is marked (false below the window).
    pub fn contains(&self, seq: u64) -> bool {
        if seq < self.base || seq - self.base >= SEQ_WINDOW {
            return false;
        }
        let (w, m) = Self::slot(seq);
        self.bits[w] & m != 0
    }

    /// Sequence numbers below `n` that are not marked (for tests: walks the range).
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
    header_len: usize,
    seen: SeqWindow,
    /// Counters.
    pub integrity: Integrity,
}

impl Checker {
    /// A checker for `run`, expecting datagrams of `datagram_size` bytes (the last one
    /// of a transfer may be shorter).
    pub fn new(run: u32, verify: Verify, datagram_size: usize) -> Self {
        let header_len = HEADER_LEN;
        Self { run, verify, datagram_size, header_len, seen: SeqWindow::default(), integrity: Integrity::default() }
    }

    /// The same for a many-flow sender's datagrams (of up to `datagram_size` bytes):
    /// their flow part is header, not pattern.
    pub fn with_flows(self) -> Self {
        Self { header_len: FLOW_HEADER_LEN, ..self }
    }

    /// Checks one datagram.
    pub fn check(&mut self, d: &[u8]) {
        if self.verify == Verify::Count {
            self.integrity.unique += 1;
            return;
        }
        let Some(seq) = parse_header(d, self.run) else {
            self.integrity.foreign += 1;
            return;
        };
        if d.len() > self.datagram_size {
            self.integrity.bad_length += 1;
        }
        match self.seen.insert(seq) {
            Seen::New => {}
            Seen::Duplicate => {
                self.integrity.duplicates += 1;
                return;
            }
            Seen::TooOld => {
                self.integrity.too_old += 1;
                return;
            }
        }
        self.integrity.unique += 1;
        if seq.saturating_add(1) < self.integrity.high_water {
            self.integrity.reordered += 1;
        }
        self.integrity.high_water = self.integrity.high_water.max(seq.saturating_add(1));
        if self.verify == Verify::Full && d.iter().enumerate().skip(self.header_len).any(|(i, b)| *b != pattern(i)) {
            self.integrity.corrupt += 1;
        }
    }

    /// The sequence numbers seen.
    pub fn seen(&self) -> &SeqWindow {
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
        let mut c = Checker::new(7, Verify::Full, 200);
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
        let mut c = Checker::new(1, Verify::Full, 64);
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
        let mut c = Checker::new(1, Verify::Full, 64);
        let b = train(1, 0, 1, 64);
        c.check(&b[..30]);
        assert_eq!(c.integrity.bad_length, 0);
        let mut long = train(1, 1, 1, 100);
        long.truncate(100);
        c.check(&long);
        assert_eq!(c.integrity.bad_length, 1);
    }

    #[test]
    fn a_forged_sequence_number_cannot_make_the_receiver_allocate() {
        // u64::MAX / 4 was the old guard: one datagram just below it made the bitmap
        // grow to 2^58 bytes and aborted the process.
        let mut c = Checker::new(1, Verify::Header, 64);
        for first in [0, u64::MAX / 4 - 1, u64::MAX - 1, 3] {
            c.check(&train(1, first, 1, 64));
        }
        assert_eq!(c.seen.bits.len() as u64, SEQ_WINDOW / 64, "the window never grows");
        // The forged jump slid the window: the late, low number is too old to judge.
        assert_eq!((c.integrity.unique, c.integrity.too_old), (3, 1));
        assert_eq!(c.integrity.high_water, u64::MAX);
    }

    #[test]
    fn the_window_slides_and_still_finds_duplicates() {
        let mut w = SeqWindow::default();
        assert_eq!(w.insert(5), Seen::New);
        assert_eq!(w.insert(5), Seen::Duplicate);
        let top = SEQ_WINDOW + 1000;
        assert_eq!(w.insert(top), Seen::New);
        assert_eq!(w.insert(5), Seen::TooOld, "slid out of the window");
        assert_eq!(w.insert(top), Seen::Duplicate);
        assert_eq!(w.insert(top - 10), Seen::New, "below the top, inside the window");
        assert!(!w.contains(top - 11) && w.contains(top - 10));
        // A slot reused after sliding starts empty.
        assert_eq!(w.insert(SEQ_WINDOW + 5), Seen::New);
    }

    #[test]
    fn count_mode_accepts_anything() {
        let mut c = Checker::new(1, Verify::Count, 64);
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

//! A connection's unsent output: reply bytes, with large values served by reference to
//! the stored item instead of copied (memcached sends an item's memory the same way).
//!
//! Replies are written into a byte buffer (this type dereferences to it); a value of at
//! least [`SHARE_MIN`] bytes is recorded as a reference to the item's data at its place
//! in the stream. The driver writes the stream with [`Out::slices`] (vectored I/O) and
//! reports what went with [`Out::written`]. The store keeps the memory of a replaced or
//! evicted item charged to its limit while a reply still refers to it.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::ops::{Deref, DerefMut, Range};
use std::sync::Arc;

/// Values this large or larger are sent by reference; smaller ones are copied (a copy
/// of a few hundred bytes costs less than sharing it).
pub const SHARE_MIN: usize = 4096;

/// Sent bytes at the head of the buffer are dropped once there are this many.
const COMPACT_AT: usize = 64 << 10;

#[derive(Debug)]
struct Shared {
    /// Where in the buffer it goes.
    at: usize,
    data: Arc<[u8]>,
    range: Range<usize>,
}

/// A position to roll back to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    buf: usize,
    shared: usize,
}

/// Unsent output.
#[derive(Debug, Default)]
pub struct Out {
    buf: Vec<u8>,
    shared: VecDeque<Shared>,
    shared_bytes: usize,
    /// Bytes of the stream already sent.
    sent: usize,
}

impl Deref for Out {
    type Target = Vec<u8>;
    fn deref(&self) -> &Vec<u8> {
        &self.buf
    }
}

impl DerefMut for Out {
    fn deref_mut(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }
}

impl Out {
    /// Empty.
    pub fn new() -> Out {
        Out::default()
    }

    /// Appends `data[range]`, by reference when it is large.
    pub fn push_value(&mut self, data: &Arc<[u8]>, range: Range<usize>) {
        if range.len() < SHARE_MIN {
            self.buf.extend_from_slice(&data[range]);
        } else {
            self.shared_bytes += range.len();
            self.shared.push_back(Shared { at: self.buf.len(), data: data.clone(), range });
        }
    }

    /// The stream's length so far, sent bytes included.
    fn total(&self) -> usize {
        self.buf.len() + self.shared_bytes
    }

    /// Bytes not yet sent.
    pub fn unsent(&self) -> usize {
        self.total() - self.sent
    }

    /// Where the stream ends now.
    pub fn mark(&self) -> Mark {
        Mark { buf: self.buf.len(), shared: self.shared.len() }
    }

    /// Drops what was appended after `m`.
    pub fn truncate(&mut self, m: Mark) {
        while self.shared.len() > m.shared {
            if let Some(s) = self.shared.pop_back() {
                self.shared_bytes -= s.range.len();
            }
        }
        self.buf.truncate(m.buf);
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        self.buf.clear();
        self.shared.clear();
        self.shared_bytes = 0;
        self.sent = 0;
    }

    /// Fills `dst` with the unsent stream's first slices, in order; returns how many.
    pub fn slices<'a>(&'a self, dst: &mut [IoSlice<'a>]) -> usize {
        /// Adds `seg` less what was sent of it; false once `dst` is full.
        fn take<'a>(seg: &'a [u8], skip: &mut usize, n: &mut usize, dst: &mut [IoSlice<'a>]) -> bool {
            if *n == dst.len() {
                return false;
            }
            if *skip >= seg.len() {
                *skip -= seg.len();
            } else {
                dst[*n] = IoSlice::new(&seg[*skip..]);
                *skip = 0;
                *n += 1;
            }
            true
        }
        let (mut n, mut skip, mut from) = (0, self.sent, 0);
        for sh in &self.shared {
            if !take(&self.buf[from..sh.at], &mut skip, &mut n, dst)
                || !take(&sh.data[sh.range.clone()], &mut skip, &mut n, dst)
            {
                return n;
            }
            from = sh.at;
        }
        take(&self.buf[from..], &mut skip, &mut n, dst);
        n
    }

    /// The unsent stream copied out (UDP datagrams, tests).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.unsent());
        let mut s = vec![IoSlice::new(&[]); self.shared.len() * 2 + 1];
        let n = self.slices(&mut s);
        for x in &s[..n] {
            v.extend_from_slice(x);
        }
        v
    }

    /// `n` more bytes were sent.
    pub fn written(&mut self, n: usize) {
        self.sent = (self.sent + n).min(self.total());
        if self.sent == self.total() {
            self.clear();
        } else if self.sent >= COMPACT_AT {
            self.drop_sent();
        }
    }

    /// Drops the sent head of the stream: the buffer's sent bytes and the references
    /// wholly sent.
    fn drop_sent(&mut self) {
        let mut left = self.sent;
        let mut cut = 0;
        while let Some(front) = self.shared.front_mut() {
            let before = front.at - cut;
            if left < before {
                break;
            }
            left -= before;
            cut = front.at;
            if left >= front.range.len() {
                left -= front.range.len();
                self.shared_bytes -= front.range.len();
                self.shared.pop_front();
            } else {
                // Partly sent: keep its rest.
                front.range.start += left;
                self.shared_bytes -= left;
                left = 0;
                break;
            }
        }
        cut += left.min(self.buf.len() - cut);
        self.buf.drain(..cut);
        for s in &mut self.shared {
            s.at -= cut;
        }
        self.sent = 0;
    }

    /// Buffer memory held (its capacity; shared values belong to the store).
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Gives back buffer memory beyond `keep` when empty.
    pub fn shrink(&mut self, keep: usize) {
        if self.total() == 0 && self.buf.capacity() > keep {
            self.buf = Vec::with_capacity(keep);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(o: &Out) -> Vec<u8> {
        o.to_vec()
    }

    #[test]
    fn shared_values_go_out_in_place_and_partial_writes_resume() {
        let big: Arc<[u8]> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let mut o = Out::new();
        o.extend_from_slice(b"VALUE a 0 10000\r\n");
        o.push_value(&big, 0..10_000);
        o.extend_from_slice(b"\r\nEND\r\n");
        o.push_value(&big, 5..10);
        let want = [b"VALUE a 0 10000\r\n".as_slice(), &big[..], b"\r\nEND\r\n", &big[5..10]].concat();
        assert_eq!(stream(&o), want);
        assert_eq!(o.unsent(), want.len());
        // Written in odd pieces, the rest is always what is left of the stream.
        let mut at = 0;
        for n in [3, 17, 4000, 1, 6000, 5] {
            o.written(n);
            at += n;
            assert_eq!(stream(&o), want[at..], "after {at}");
        }
        let m = o.mark();
        o.push_value(&big, 0..5000);
        o.extend_from_slice(b"x");
        o.truncate(m);
        assert_eq!(stream(&o), want[at..]);
        o.written(want.len() - at);
        assert_eq!(o.unsent(), 0);
    }

    #[test]
    fn the_sent_head_is_dropped_while_a_slow_reader_drains() {
        let big: Arc<[u8]> = vec![7u8; 50_000].into();
        let mut o = Out::new();
        let mut want = Vec::new();
        for i in 0..40u8 {
            o.extend_from_slice(&[i; 3000]);
            want.extend_from_slice(&[i; 3000]);
            o.push_value(&big, 0..50_000);
            want.extend_from_slice(&big);
            let n = o.unsent() - 10_000;
            o.written(n);
            want.drain(..n);
            assert_eq!(stream(&o), want);
            assert!(o.capacity() < 200_000, "the buffer grew to {}", o.capacity());
        }
    }
}

//! The messages over a byte stream (the TCP comparator: one connection per client, as
//! RDS over TCP carries them). A message is what a datagram would be, header and payload;
//! its length comes from its header, so messages follow one another with nothing
//! between them. Sans-IO and bounded: [`Framer`] holds at most one largest message and
//! one read's worth of bytes, and refuses a header it cannot trust before waiting for
//! the bytes it announces.

use thiserror::Error;

use super::wire::{HEADER_LEN, MAGIC, VERSION};

/// Bytes one read may add beyond the largest message.
pub const READ_CHUNK: usize = 64 * 1024;
/// A framer's buffer to begin with: it grows (up to a largest message and a read) only
/// for a connection that sends large messages.
const FIRST_BUFFER: usize = 8 * 1024;
/// The least room a read is given.
const MIN_READ: usize = 2 * 1024;

/// Why a stream cannot be read on: the connection is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum FrameError {
    /// The bytes where a header belongs are not one (wrong magic or version).
    #[error("not a message header (magic {magic:#010x}, version {version})")]
    NotAHeader {
        /// The magic found.
        magic: u32,
        /// The version found.
        version: u8,
    },
    /// The header announces a message longer than the largest taken.
    #[error("a message of {len} bytes announced; at most {max} are taken")]
    TooLong {
        /// Announced.
        len: usize,
        /// The limit.
        max: usize,
    },
}

/// Splits a byte stream into messages.
#[derive(Debug)]
pub struct Framer {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    max_message: usize,
}

impl Framer {
    /// A framer taking messages of at most `max_message` bytes (at least a header).
    pub fn new(max_message: usize) -> Framer {
        let max_message = max_message.max(HEADER_LEN);
        Framer { buf: vec![0; FIRST_BUFFER.min(Self::most(max_message))], start: 0, end: 0, max_message }
    }

    /// The most a framer for messages of `max_message` bytes ever holds.
    pub fn most(max_message: usize) -> usize {
        max_message.max(HEADER_LEN) + READ_CHUNK
    }

    /// Bytes received and not yet taken as messages.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Where the next read goes: room for a read once every whole message has been
    /// taken (a message not yet whole and a read fit in the most the framer holds).
    pub fn read_space(&mut self) -> &mut [u8] {
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        } else if self.buf.len() - self.end < MIN_READ {
            self.buf.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
        }
        if self.buf.len() - self.end < MIN_READ {
            let grown = (self.buf.len() * 2).min(Self::most(self.max_message));
            self.buf.resize(grown, 0);
        }
        &mut self.buf[self.end..]
    }

    /// `n` bytes were read into [`Self::read_space`] (at most its length).
    pub fn filled(&mut self, n: usize) {
        debug_assert!(self.end + n <= self.buf.len(), "more bytes filled than there was room for");
        self.end = (self.end + n).min(self.buf.len());
    }

    /// The next whole message, or `None` until more bytes come; an error when the
    /// stream cannot be a stream of messages (the connection should be closed).
    pub fn poll_message(&mut self) -> Result<Option<&[u8]>, FrameError> {
        let have = &self.buf[self.start..self.end];
        if have.len() < HEADER_LEN {
            return Ok(None);
        }
        let magic = u32::from_be_bytes([have[0], have[1], have[2], have[3]]);
        let version = have[4];
        if magic != MAGIC || version != VERSION {
            return Err(FrameError::NotAHeader { magic, version });
        }
        let payload = u32::from_be_bytes([have[24], have[25], have[26], have[27]]) as usize;
        let len = HEADER_LEN.saturating_add(payload);
        if len > self.max_message {
            return Err(FrameError::TooLong { len, max: self.max_message });
        }
        if have.len() < len {
            return Ok(None);
        }
        let at = self.start;
        self.start += len;
        Ok(Some(&self.buf[at..at + len]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::wire::{self, Header, MAX_DATAGRAM};

    fn message(id: u64, payload: u32) -> Vec<u8> {
        let mut h = Header::request(id, 7, payload, 100);
        h.payload_len = payload;
        let mut out = vec![0u8; HEADER_LEN + payload as usize];
        let n = wire::encode(&h, &mut out).unwrap();
        out.truncate(n);
        out
    }

    /// Feeds `stream` in reads of `step` bytes; returns the ids of the messages taken.
    fn feed(f: &mut Framer, stream: &[u8], step: usize) -> Result<Vec<u64>, FrameError> {
        let mut ids = Vec::new();
        for mut chunk in stream.chunks(step) {
            // A read takes what fits; the rest comes in the next.
            while !chunk.is_empty() {
                let space = f.read_space();
                let n = chunk.len().min(space.len());
                assert!(n > 0, "no room to read with every whole message taken");
                space[..n].copy_from_slice(&chunk[..n]);
                f.filled(n);
                chunk = &chunk[n..];
                while let Some(m) = f.poll_message()? {
                    ids.push(wire::decode(m).expect("a whole message").0.id);
                }
            }
        }
        Ok(ids)
    }

    #[test]
    fn messages_split_anywhere_come_out_whole_and_in_order() {
        let stream: Vec<u8> = (0..20).flat_map(|i| message(i, (i as u32 * 97) % 3000)).collect();
        for step in [1, 7, 40, 41, 1000, stream.len()] {
            let mut f = Framer::new(4096);
            assert_eq!(feed(&mut f, &stream, step).unwrap(), (0..20).collect::<Vec<_>>(), "reads of {step}");
            assert_eq!(f.buffered(), 0);
        }
    }

    #[test]
    fn the_largest_message_fits_beside_a_read_and_a_longer_one_is_refused_at_its_header() {
        let big = message(1, (MAX_DATAGRAM - HEADER_LEN) as u32);
        let mut f = Framer::new(MAX_DATAGRAM);
        let two: Vec<u8> = [big.clone(), big.clone()].concat();
        assert_eq!(feed(&mut f, &two, READ_CHUNK).unwrap(), [1, 1]);
        let mut small = Framer::new(1000);
        let e = feed(&mut small, &big[..HEADER_LEN], HEADER_LEN).unwrap_err();
        assert_eq!(e, FrameError::TooLong { len: MAX_DATAGRAM, max: 1000 });
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_in_any_reads_never_panic_or_outgrow_the_buffer(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..3000),
            step in 1usize..500,
            valid in proptest::bool::ANY,
        ) {
            // Half the cases start with a real message, so the length field is reached.
            let stream = if valid { [message(9, 50), bytes].concat() } else { bytes };
            let mut f = Framer::new(1000);
            for chunk in stream.chunks(step) {
                let space = f.read_space();
                proptest::prop_assert!(space.len() >= MIN_READ && space.len() >= chunk.len().min(MIN_READ));
                proptest::prop_assert!(f.buf.len() <= Framer::most(1000));
                let space = f.read_space();
                let chunk = &chunk[..chunk.len().min(space.len())];
                space[..chunk.len()].copy_from_slice(chunk);
                f.filled(chunk.len());
                loop {
                    match f.poll_message() {
                        Ok(Some(m)) => proptest::prop_assert!(m.len() <= 1000),
                        Ok(None) => break,
                        Err(_) => return Ok(()),
                    }
                }
                proptest::prop_assert!(f.buffered() < 1000);
            }
        }
    }

    #[test]
    fn bytes_that_are_not_a_header_close_the_stream() {
        let mut f = Framer::new(4096);
        let mut junk = message(1, 10);
        junk[0] ^= 0xff;
        assert!(matches!(feed(&mut f, &junk, 100), Err(FrameError::NotAHeader { .. })));
    }
}

//! The request/response message format.
//!
//! Every datagram starts with a 40-byte header (big-endian):
//!
//! ```text
//!  0  magic        u32  "NLRR"
//!  4  version      u8   1
//!  5  kind         u8   1 request, 2 response, 3 retry, 4 refused
//!  6  segment      u8   this segment's index (0 for an unsegmented message)
//!  7  segments     u8   how many segments the message has (1: unsegmented)
//!  8  id           u64  request id, chosen by the client (unique per client socket)
//! 16  sent_ns      u64  the client's send time, echoed back unchanged
//! 24  payload_len  u32  payload bytes after this header, in this datagram
//! 28  response_len u32  payload bytes of the whole response (asked for / carried)
//! 32  offset       u32  where this datagram's payload sits in the whole response; in a
//!                       request or a retry, the server's cookie (0: none)
//! 36  check        u32  CRC32C of the header (with this field zero) and the payload
//! ```
//!
//! A retry (the server asks for the request again with the cookie it carries, see
//! `guard`) and a refusal (the request asks for more than the server sends: the most it
//! sends is in response_len) are a header alone, never larger than the request.
//!
//! The payload is a pattern derived from the id and the offset, so a segment placed at
//! the wrong offset (misassembled) fails [`pattern_matches`] even when its own checksum is
//! right. Decoding never panics: every length is checked against the buffer first.

use thiserror::Error;

/// "NLRR".
pub const MAGIC: u32 = 0x4e4c_5252;
/// The only version.
pub const VERSION: u8 = 1;
/// Header bytes.
pub const HEADER_LEN: usize = 40;
/// The largest UDP payload over IPv4 (65,535 - 20 - 8): no message may be longer.
pub const MAX_DATAGRAM: usize = 65_507;
/// Most segments in one response (a `u8` on the wire; GSO sends at most 64 at once, and
/// larger responses are sent in several GSO batches).
pub const MAX_SEGMENTS: usize = 255;

const CHECK_AT: usize = 36;

/// What a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// From a client.
    Request,
    /// From the server.
    Response,
    /// From the server: send the request again with the cookie in `offset`.
    Retry,
    /// From the server: the request asks for more than `response_len`, the most it sends.
    Refused,
}

impl Kind {
    fn code(self) -> u8 {
        match self {
            Kind::Request => 1,
            Kind::Response => 2,
            Kind::Retry => 3,
            Kind::Refused => 4,
        }
    }
}

/// A decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Request or response.
    pub kind: Kind,
    /// Index of this segment.
    pub segment: u8,
    /// Segments in the whole message (at least 1).
    pub segments: u8,
    /// The request id.
    pub id: u64,
    /// The client's send time (opaque to the server).
    pub sent_ns: u64,
    /// Payload bytes in this datagram.
    pub payload_len: u32,
    /// Payload bytes of the whole response: asked for in a request, carried in a response.
    pub response_len: u32,
    /// Offset of this datagram's payload within the whole response.
    pub offset: u32,
}

impl Header {
    /// An unsegmented request with `payload_len` payload bytes asking for `response_len`.
    pub fn request(id: u64, sent_ns: u64, payload_len: u32, response_len: u32) -> Self {
        Header { kind: Kind::Request, segment: 0, segments: 1, id, sent_ns, payload_len, response_len, offset: 0 }
    }

    /// The server's answer to `req` asking it to send the request again with `cookie`.
    pub fn retry(req: &Header, cookie: u32) -> Self {
        Header { kind: Kind::Retry, payload_len: 0, response_len: 0, offset: cookie, ..*req }
    }

    /// The server's answer to `req` when it asks for more than `limit` bytes.
    pub fn refused(req: &Header, limit: u32) -> Self {
        Header { kind: Kind::Refused, payload_len: 0, response_len: limit, offset: 0, ..*req }
    }

    /// Bytes of the datagram this header starts.
    pub fn datagram_len(&self) -> usize {
        HEADER_LEN + self.payload_len as usize
    }
}

/// Why a datagram is not a valid message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum WireError {
    /// Shorter than a header.
    #[error("{len} bytes: shorter than the {HEADER_LEN}-byte header")]
    Short {
        /// Bytes received.
        len: usize,
    },
    /// Not our magic.
    #[error("bad magic {0:#010x}")]
    Magic(u32),
    /// A version we do not speak.
    #[error("version {0}, expected {VERSION}")]
    Version(u8),
    /// Neither request nor response.
    #[error("unknown kind {0}")]
    Kind(u8),
    /// The header's payload length disagrees with the datagram.
    #[error("header says {declared} payload bytes, datagram has {actual}")]
    Length {
        /// From the header.
        declared: u32,
        /// From the datagram.
        actual: usize,
    },
    /// Segment fields that cannot be: no segments, an index past the count, a payload
    /// past the response's end.
    #[error("segment {segment} of {segments} at offset {offset}+{payload_len} in a {response_len}-byte response")]
    Segment {
        /// Index.
        segment: u8,
        /// Count.
        segments: u8,
        /// Offset.
        offset: u32,
        /// Payload bytes.
        payload_len: u32,
        /// Whole response.
        response_len: u32,
    },
    /// The checksum does not match: the datagram was corrupted.
    #[error("checksum {actual:#010x}, header says {expected:#010x}")]
    Check {
        /// From the header.
        expected: u32,
        /// Computed.
        actual: u32,
    },
    /// The output buffer cannot hold the message.
    #[error("a {needed}-byte message does not fit a {capacity}-byte buffer")]
    NoRoom {
        /// Bytes needed.
        needed: usize,
        /// Bytes available.
        capacity: usize,
    },
}

/// Writes `h` and its payload pattern into `out`, computing the checksum. Returns the
/// datagram length.
pub fn encode(h: &Header, out: &mut [u8]) -> Result<usize, WireError> {
    let len = h.datagram_len();
    if len > out.len() || len > MAX_DATAGRAM {
        return Err(WireError::NoRoom { needed: len, capacity: out.len().min(MAX_DATAGRAM) });
    }
    let (head, rest) = out.split_at_mut(HEADER_LEN);
    write_header(h, head);
    let payload = &mut rest[..h.payload_len as usize];
    fill_pattern(h.id, h.offset, payload);
    let check = checksum(head, payload);
    head[CHECK_AT..CHECK_AT + 4].copy_from_slice(&check.to_be_bytes());
    Ok(len)
}

fn write_header(h: &Header, head: &mut [u8]) {
    head[0..4].copy_from_slice(&MAGIC.to_be_bytes());
    head[4] = VERSION;
    head[5] = h.kind.code();
    head[6] = h.segment;
    head[7] = h.segments;
    head[8..16].copy_from_slice(&h.id.to_be_bytes());
    head[16..24].copy_from_slice(&h.sent_ns.to_be_bytes());
    head[24..28].copy_from_slice(&h.payload_len.to_be_bytes());
    head[28..32].copy_from_slice(&h.response_len.to_be_bytes());
    head[32..36].copy_from_slice(&h.offset.to_be_bytes());
    head[36..40].fill(0);
}

/// CRC32C over the header with its check field taken as zero, then the payload.
fn checksum(head: &[u8], payload: &[u8]) -> u32 {
    let c = crc32c::crc32c(&head[..CHECK_AT]);
    let c = crc32c::crc32c_append(c, &[0; 4]);
    crc32c::crc32c_append(c, payload)
}

/// Recomputes the checksum of an encoded datagram (tests forge valid-looking ones).
#[cfg(test)]
pub(crate) fn reseal(datagram: &mut [u8]) {
    let (head, payload) = datagram.split_at_mut(HEADER_LEN);
    let check = checksum(head, payload);
    head[CHECK_AT..CHECK_AT + 4].copy_from_slice(&check.to_be_bytes());
}

fn be32(b: &[u8], at: usize) -> u32 {
    let mut a = [0; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_be_bytes(a)
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut a = [0; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

/// Decodes one datagram: the header and its payload, checksum verified.
pub fn decode(datagram: &[u8]) -> Result<(Header, &[u8]), WireError> {
    if datagram.len() < HEADER_LEN {
        return Err(WireError::Short { len: datagram.len() });
    }
    let (head, payload) = datagram.split_at(HEADER_LEN);
    let magic = be32(head, 0);
    if magic != MAGIC {
        return Err(WireError::Magic(magic));
    }
    if head[4] != VERSION {
        return Err(WireError::Version(head[4]));
    }
    let kind = match head[5] {
        1 => Kind::Request,
        2 => Kind::Response,
        3 => Kind::Retry,
        4 => Kind::Refused,
        k => return Err(WireError::Kind(k)),
    };
    let h = Header {
        kind,
        segment: head[6],
        segments: head[7],
        id: be64(head, 8),
        sent_ns: be64(head, 16),
        payload_len: be32(head, 24),
        response_len: be32(head, 28),
        offset: be32(head, 32),
    };
    if h.payload_len as usize != payload.len() {
        return Err(WireError::Length { declared: h.payload_len, actual: payload.len() });
    }
    let end = u64::from(h.offset) + u64::from(h.payload_len);
    let segment_ok = h.segments >= 1
        && h.segment < h.segments
        && match kind {
            // A request is one datagram; its offset is the cookie.
            Kind::Request => h.segments == 1,
            Kind::Response => end <= u64::from(h.response_len),
            Kind::Retry | Kind::Refused => h.segments == 1 && h.payload_len == 0,
        };
    if !segment_ok {
        return Err(WireError::Segment {
            segment: h.segment,
            segments: h.segments,
            offset: h.offset,
            payload_len: h.payload_len,
            response_len: h.response_len,
        });
    }
    let expected = be32(head, CHECK_AT);
    let actual = checksum(head, payload);
    if expected != actual {
        return Err(WireError::Check { expected, actual });
    }
    Ok((h, payload))
}

/// The payload byte at `pos` of a message with this id.
#[inline]
fn pattern_byte(seed: u8, pos: u32) -> u8 {
    // A byte counter offset by the id, with the position's second byte mixed in so a
    // shift by a multiple of 256 is still caught.
    seed.wrapping_add(pos as u8) ^ ((pos >> 8) as u8).wrapping_mul(0x1d)
}

fn seed(id: u64) -> u8 {
    id.to_le_bytes().iter().fold(0x5a, |a, b| a ^ b)
}

/// Fills `buf` with the pattern of request `id` starting at response offset `offset`.
pub fn fill_pattern(id: u64, offset: u32, buf: &mut [u8]) {
    let s = seed(id);
    for (i, b) in buf.iter_mut().enumerate() {
        *b = pattern_byte(s, offset.wrapping_add(i as u32));
    }
}

/// Whether `buf` holds the pattern of request `id` at `offset` (what a correctly
/// assembled response carries there).
pub fn pattern_matches(id: u64, offset: u32, buf: &[u8]) -> bool {
    let s = seed(id);
    buf.iter().enumerate().all(|(i, b)| *b == pattern_byte(s, offset.wrapping_add(i as u32)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn response(id: u64, segment: u8, segments: u8, offset: u32, payload: u32, total: u32) -> Header {
        Header {
            kind: Kind::Response,
            segment,
            segments,
            id,
            sent_ns: 77,
            payload_len: payload,
            response_len: total,
            offset,
        }
    }

    #[test]
    fn a_request_round_trips() {
        let h = Header::request(42, 1_000, 472, 8152);
        let mut buf = [0u8; 600];
        let n = encode(&h, &mut buf).unwrap();
        assert_eq!(n, 512);
        let (d, p) = decode(&buf[..n]).unwrap();
        assert_eq!(d, h);
        assert!(pattern_matches(42, 0, p));
    }

    #[test]
    fn every_flipped_bit_is_caught() {
        let h = response(9, 1, 3, 100, 60, 300);
        let mut buf = [0u8; 100];
        let n = encode(&h, &mut buf).unwrap();
        for bit in 0..n * 8 {
            let mut b = buf;
            b[bit / 8] ^= 1 << (bit % 8);
            assert!(decode(&b[..n]).is_err(), "bit {bit} flipped and accepted");
        }
    }

    #[test]
    fn a_segment_at_the_wrong_offset_fails_the_pattern() {
        let mut a = [0u8; 1000];
        fill_pattern(5, 0, &mut a);
        assert!(pattern_matches(5, 0, &a));
        assert!(!pattern_matches(5, 256, &a));
        assert!(!pattern_matches(5, 1, &a));
        assert!(!pattern_matches(6, 0, &a));
    }

    #[test]
    fn impossible_headers_are_refused() {
        let mut buf = [0u8; 200];
        // Encode a good response, then break fields and re-check: decode refuses before
        // it gets to the checksum.
        let n = encode(&response(1, 0, 1, 0, 100, 100), &mut buf).unwrap();
        let mut b = buf;
        b[7] = 0;
        assert!(matches!(decode(&b[..n]), Err(WireError::Segment { .. })));
        let mut b = buf;
        b[6] = 1;
        assert!(matches!(decode(&b[..n]), Err(WireError::Segment { .. })));
        let mut b = buf;
        b[28..32].copy_from_slice(&50u32.to_be_bytes());
        assert!(matches!(decode(&b[..n]), Err(WireError::Segment { .. })));
        assert!(matches!(decode(&buf[..n - 1]), Err(WireError::Length { .. })));
        assert!(matches!(decode(&buf[..10]), Err(WireError::Short { len: 10 })));
        let mut b = buf;
        b[4] = 2;
        assert_eq!(decode(&b[..n]), Err(WireError::Version(2)));
        let mut b = buf;
        b[5] = 9;
        assert_eq!(decode(&b[..n]), Err(WireError::Kind(9)));
    }

    #[test]
    fn a_message_that_does_not_fit_is_refused() {
        let mut buf = [0u8; 100];
        let e = encode(&Header::request(1, 0, 61, 0), &mut buf).unwrap_err();
        assert_eq!(e, WireError::NoRoom { needed: 101, capacity: 100 });
        let mut big = vec![0u8; 70_000];
        assert!(encode(&Header::request(1, 0, 65_500, 0), &mut big).is_err());
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn encoded_responses_decode(id: u64, seg in 0u8..4, extra in 0u8..4, off in 0u32..5000, len in 0u32..2000) {
            let h = response(id, seg, seg + 1 + extra, off, len, off + len);
            let mut buf = vec![0u8; HEADER_LEN + len as usize];
            let n = encode(&h, &mut buf).unwrap();
            let (d, p) = decode(&buf[..n]).unwrap();
            prop_assert_eq!(d, h);
            prop_assert!(pattern_matches(id, off, p));
        }
    }
}

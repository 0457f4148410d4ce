//! Control messages (ancillary data) as plain bytes.
//!
//! Linux lays out a control buffer as a sequence of
//! `struct cmsghdr { size_t cmsg_len; int cmsg_level; int cmsg_type; }` each followed by
//! its data, every header starting at an offset aligned to `sizeof(size_t)` (cmsg(3)).
//! `cmsg_len` counts the header and the data but not the trailing padding.
//!
//! The kernel copies control data with `copy_from_user`/`put_cmsg`, so only the offsets
//! inside the buffer matter, not the buffer's address. That lets this module encode and
//! decode with byte copies: no pointer casts, no `unsafe`, and a decoder that returns an
//! error instead of reading out of bounds on a malformed or truncated buffer.
//!
//! [`CmsgBuf`] is still 8-byte aligned so it can be handed to code that uses the C macros.

use std::fmt;

use crate::errqueue::ExtendedErr;

/// Alignment of each control message (`sizeof(size_t)` on Linux).
pub const ALIGN: usize = std::mem::size_of::<usize>();
/// Size of `struct cmsghdr`.
pub const HDR_LEN: usize = std::mem::size_of::<usize>() + 2 * std::mem::size_of::<i32>();

/// `CMSG_ALIGN`: rounds `len` up to the control-message alignment.
pub const fn align(len: usize) -> usize {
    (len + ALIGN - 1) & !(ALIGN - 1)
}

/// `CMSG_SPACE`: bytes one message with `data_len` bytes of data occupies in a buffer.
pub const fn space(data_len: usize) -> usize {
    align(HDR_LEN) + align(data_len)
}

/// `CMSG_LEN`: the value of `cmsg_len` for `data_len` bytes of data.
pub const fn len(data_len: usize) -> usize {
    align(HDR_LEN) + data_len
}

/// An 8-byte aligned byte buffer of `N` bytes for control messages, plus how many of
/// them are in use.
///
/// Used both ways: [`CmsgBuf::push`] encodes messages for `sendmsg`; after a `recvmsg`
/// the caller sets the length the kernel reported with [`CmsgBuf::set_len`] and
/// iterates with [`CmsgBuf::iter`].
#[derive(Clone)]
#[repr(C, align(8))]
pub struct CmsgBuf<const N: usize> {
    bytes: [u8; N],
    len: usize,
}

impl<const N: usize> Default for CmsgBuf<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> fmt::Debug for CmsgBuf<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// A control message did not fit in the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferFull {
    /// Bytes the message needed.
    pub needed: usize,
    /// Bytes left in the buffer.
    pub available: usize,
}

impl fmt::Display for BufferFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "control message needs {} bytes, {} left in the buffer", self.needed, self.available)
    }
}

impl std::error::Error for BufferFull {}

impl<const N: usize> CmsgBuf<N> {
    /// An empty, zeroed buffer.
    pub const fn new() -> Self {
        Self { bytes: [0; N], len: 0 }
    }

    /// Bytes in use (what goes into `msg_controllen` for a send).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no message has been written.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Capacity in bytes.
    pub const fn capacity(&self) -> usize {
        N
    }

    /// Forgets all messages.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// The encoded messages.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// The whole buffer, for the kernel to fill on receive.
    pub fn as_mut_capacity(&mut self) -> &mut [u8] {
        &mut self.bytes
    }

    /// Records how many bytes the kernel wrote (`msg_controllen` after `recvmsg`);
    /// clamped to the capacity.
    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(N);
    }

    /// Appends one message with raw data.
    pub fn push(&mut self, level: i32, ty: i32, data: &[u8]) -> Result<(), BufferFull> {
        let need = space(data.len());
        let available = N - self.len;
        if need > available {
            return Err(BufferFull { needed: need, available });
        }
        let start = self.len;
        let hdr = &mut self.bytes[start..start + HDR_LEN];
        hdr[..ALIGN].copy_from_slice(&len(data.len()).to_ne_bytes());
        hdr[ALIGN..ALIGN + 4].copy_from_slice(&level.to_ne_bytes());
        hdr[ALIGN + 4..ALIGN + 8].copy_from_slice(&ty.to_ne_bytes());
        let data_start = start + align(HDR_LEN);
        self.bytes[data_start..data_start + data.len()].copy_from_slice(data);
        // Zero the padding so the buffer's bytes are deterministic.
        self.bytes[data_start + data.len()..start + need].fill(0);
        self.len = start + need;
        Ok(())
    }

    /// Appends a `SOL_UDP`/`UDP_SEGMENT` message: the GSO segment size for this send
    /// (a `u16`; the kernel rejects any other length with EINVAL).
    pub fn push_udp_segment(&mut self, gso_size: u16) -> Result<(), BufferFull> {
        self.push(libc::SOL_UDP, libc::UDP_SEGMENT, &gso_size.to_ne_bytes())
    }

    /// Appends a `SOL_SOCKET`/`SCM_TXTIME` message: the release time in nanoseconds of
    /// the clock chosen with `SO_TXTIME` (a `u64`).
    pub fn push_txtime(&mut self, txtime_ns: u64) -> Result<(), BufferFull> {
        self.push(libc::SOL_SOCKET, libc::SCM_TXTIME, &txtime_ns.to_ne_bytes())
    }

    /// Iterates over the messages in use.
    pub fn iter(&self) -> CmsgIter<'_> {
        CmsgIter::new(self.as_bytes())
    }
}

/// One control message, undecoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawCmsg<'a> {
    /// `cmsg_level`, e.g. `SOL_UDP`.
    pub level: i32,
    /// `cmsg_type`, e.g. `UDP_GRO`.
    pub ty: i32,
    /// The data, without header or padding.
    pub data: &'a [u8],
}

/// A malformed control buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmsgError {
    /// Fewer bytes left than a header, but more than zero.
    TruncatedHeader {
        /// Offset of the partial header.
        offset: usize,
    },
    /// `cmsg_len` smaller than a header or running past the end of the buffer.
    BadLength {
        /// Offset of the message.
        offset: usize,
        /// The `cmsg_len` found there.
        cmsg_len: usize,
    },
}

impl fmt::Display for CmsgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CmsgError::TruncatedHeader { offset } => {
                write!(f, "control buffer ends inside a header at offset {offset}")
            }
            CmsgError::BadLength { offset, cmsg_len } => {
                write!(f, "control message at offset {offset} has bad cmsg_len {cmsg_len}")
            }
        }
    }
}

impl std::error::Error for CmsgError {}

/// Iterator over the control messages in a byte buffer (the `CMSG_FIRSTHDR` /
/// `CMSG_NXTHDR` walk). Yields one `Err` on a malformed buffer and then stops.
#[derive(Debug, Clone)]
pub struct CmsgIter<'a> {
    buf: &'a [u8],
    offset: usize,
    failed: bool,
}

impl<'a> CmsgIter<'a> {
    /// Walks `buf`, which holds `msg_controllen` bytes as returned by the kernel.
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, offset: 0, failed: false }
    }
}

impl<'a> Iterator for CmsgIter<'a> {
    type Item = Result<RawCmsg<'a>, CmsgError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.offset >= self.buf.len() {
            return None;
        }
        let offset = self.offset;
        let rest = &self.buf[offset..];
        let Some(hdr) = rest.get(..HDR_LEN) else {
            self.failed = true;
            return Some(Err(CmsgError::TruncatedHeader { offset }));
        };
        let cmsg_len = usize::from_ne_bytes(read_array(&hdr[..ALIGN]));
        let level = i32::from_ne_bytes(read_array(&hdr[ALIGN..ALIGN + 4]));
        let ty = i32::from_ne_bytes(read_array(&hdr[ALIGN + 4..ALIGN + 8]));
        let data_start = align(HDR_LEN);
        if cmsg_len < data_start || cmsg_len > rest.len() {
            self.failed = true;
            return Some(Err(CmsgError::BadLength { offset, cmsg_len }));
        }
        let data = &rest[data_start..cmsg_len];
        // The next header starts after the padding; a final message may omit it.
        self.offset = offset.saturating_add(align(cmsg_len));
        Some(Ok(RawCmsg { level, ty, data }))
    }
}

/// Copies the first `M` bytes of `bytes` into an array; callers pass exactly `M` bytes.
fn read_array<const M: usize>(bytes: &[u8]) -> [u8; M] {
    let mut out = [0u8; M];
    let n = M.min(bytes.len());
    out[..n].copy_from_slice(&bytes[..n]);
    out
}

/// The control messages netlane understands, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmsg<'a> {
    /// `SOL_UDP`/`UDP_SEGMENT` (on send): the GSO segment size.
    UdpSegment(u16),
    /// `SOL_UDP`/`UDP_GRO` (on receive): the coalesced read holds segments of this size
    /// (the "stride"); the last one may be shorter.
    UdpGro(u16),
    /// `SOL_SOCKET`/`SCM_TXTIME`: a release time in nanoseconds.
    TxTime(u64),
    /// `SOL_IP`/`IP_RECVERR` or `SOL_IPV6`/`IPV6_RECVERR`: an error-queue record.
    RecvErr(ExtendedErr),
    /// Anything else, or a known type with an unexpected data length.
    Other(RawCmsg<'a>),
}

impl<'a> Cmsg<'a> {
    /// Decodes a raw message. Data of the wrong size yields [`Cmsg::Other`] rather than a
    /// guess.
    pub fn decode(raw: RawCmsg<'a>) -> Self {
        match (raw.level, raw.ty, raw.data.len()) {
            (libc::SOL_UDP, libc::UDP_SEGMENT, 2) => Cmsg::UdpSegment(u16::from_ne_bytes(read_array(raw.data))),
            // The kernel reports the GRO size as an int (udp_cmsg_recv in net/ipv4/udp.c);
            // GSO sizes are at most 16 bits, anything larger is malformed.
            (libc::SOL_UDP, libc::UDP_GRO, 4) => match u16::try_from(i32::from_ne_bytes(read_array(raw.data))) {
                Ok(size) => Cmsg::UdpGro(size),
                Err(_) => Cmsg::Other(raw),
            },
            (libc::SOL_SOCKET, libc::SCM_TXTIME, 8) => Cmsg::TxTime(u64::from_ne_bytes(read_array(raw.data))),
            (libc::SOL_IP, libc::IP_RECVERR, _) | (libc::SOL_IPV6, libc::IPV6_RECVERR, _) => {
                match ExtendedErr::parse(raw.data) {
                    Some(ee) => Cmsg::RecvErr(ee),
                    None => Cmsg::Other(raw),
                }
            }
            _ => Cmsg::Other(raw),
        }
    }
}

/// Finds the `UDP_GRO` stride in a received control buffer, if any.
pub fn find_gro_size(control: &[u8]) -> Option<u16> {
    CmsgIter::new(control).filter_map(Result::ok).find_map(|raw| match Cmsg::decode(raw) {
        Cmsg::UdpGro(size) => Some(size),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a control buffer byte by byte, the way the kernel lays it out, without
    /// going through `CmsgBuf::push` (so encoder and decoder are checked independently).
    fn hand_built(msgs: &[(usize, i32, i32, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for &(cmsg_len, level, ty, data) in msgs {
            out.extend_from_slice(&cmsg_len.to_ne_bytes());
            out.extend_from_slice(&level.to_ne_bytes());
            out.extend_from_slice(&ty.to_ne_bytes());
            out.extend_from_slice(data);
            while !out.len().is_multiple_of(8) {
                out.push(0);
            }
        }
        out
    }

    #[test]
    fn sizes_match_the_c_macros() {
        // CMSG_LEN(sizeof(u16)) = 18, CMSG_SPACE(sizeof(u16)) = 24 on x86_64/aarch64.
        assert_eq!(HDR_LEN, 16);
        assert_eq!(len(2), 18);
        assert_eq!(space(2), 24);
        assert_eq!(space(4), 24);
        assert_eq!(space(8), 24);
        assert_eq!(space(16), 32);
        assert_eq!(len(16 + 16), 48);
    }

    #[test]
    fn udp_segment_encodes_like_the_kernel_expects() {
        let mut buf = CmsgBuf::<64>::new();
        buf.push_udp_segment(1400).unwrap();
        let expected = hand_built(&[(18, libc::SOL_UDP, libc::UDP_SEGMENT, &1400u16.to_ne_bytes())]);
        assert_eq!(buf.as_bytes(), expected.as_slice());
        assert_eq!(buf.len(), 24);
        let decoded: Vec<_> = buf.iter().map(|m| Cmsg::decode(m.unwrap())).collect();
        assert_eq!(decoded, vec![Cmsg::UdpSegment(1400)]);
    }

    #[test]
    fn udp_segment_and_txtime_together() {
        // quiche-style: GSO size and a release time in the same sendmsg.
        let mut buf = CmsgBuf::<64>::new();
        buf.push_udp_segment(1200).unwrap();
        buf.push_txtime(0x0102_0304_0506_0708).unwrap();
        let expected = hand_built(&[
            (18, libc::SOL_UDP, libc::UDP_SEGMENT, &1200u16.to_ne_bytes()),
            (24, libc::SOL_SOCKET, libc::SCM_TXTIME, &0x0102_0304_0506_0708u64.to_ne_bytes()),
        ]);
        assert_eq!(buf.as_bytes(), expected.as_slice());
        let decoded: Vec<_> = buf.iter().map(|m| Cmsg::decode(m.unwrap())).collect();
        assert_eq!(decoded, vec![Cmsg::UdpSegment(1200), Cmsg::TxTime(0x0102_0304_0506_0708)]);
    }

    #[test]
    fn gro_size_is_read_from_an_int() {
        let buf = hand_built(&[(20, libc::SOL_UDP, libc::UDP_GRO, &1400i32.to_ne_bytes())]);
        assert_eq!(find_gro_size(&buf), Some(1400));
        let msgs: Vec<_> = CmsgIter::new(&buf).collect();
        assert_eq!(msgs.len(), 1);
        assert_eq!(Cmsg::decode(msgs[0].unwrap()), Cmsg::UdpGro(1400));
    }

    #[test]
    fn gro_size_out_of_range_is_not_trusted() {
        let buf = hand_built(&[(20, libc::SOL_UDP, libc::UDP_GRO, &70000i32.to_ne_bytes())]);
        assert_eq!(find_gro_size(&buf), None);
        let buf = hand_built(&[(20, libc::SOL_UDP, libc::UDP_GRO, &(-1i32).to_ne_bytes())]);
        assert_eq!(find_gro_size(&buf), None);
    }

    #[test]
    fn gro_found_after_other_messages() {
        let ts = [0u8; 16];
        let buf = hand_built(&[
            (32, libc::SOL_SOCKET, libc::SCM_TIMESTAMPNS, &ts),
            (20, libc::SOL_UDP, libc::UDP_GRO, &1200i32.to_ne_bytes()),
        ]);
        assert_eq!(find_gro_size(&buf), Some(1200));
    }

    #[test]
    fn last_message_without_padding_is_accepted() {
        let mut buf = hand_built(&[(20, libc::SOL_UDP, libc::UDP_GRO, &1400i32.to_ne_bytes())]);
        buf.truncate(20);
        assert_eq!(find_gro_size(&buf), Some(1400));
    }

    #[test]
    fn txtime_wrong_length_is_other() {
        let buf = hand_built(&[(20, libc::SOL_SOCKET, libc::SCM_TXTIME, &[1, 2, 3, 4])]);
        let m = CmsgIter::new(&buf).next().unwrap().unwrap();
        assert!(matches!(Cmsg::decode(m), Cmsg::Other(_)));
    }

    #[test]
    fn malformed_buffers_are_errors_not_panics() {
        // Partial header.
        let buf = [0u8; 7];
        let all: Vec<_> = CmsgIter::new(&buf).collect();
        assert_eq!(all, vec![Err(CmsgError::TruncatedHeader { offset: 0 })]);

        // cmsg_len shorter than a header.
        let buf = hand_built(&[(3, libc::SOL_UDP, libc::UDP_GRO, &[0; 4])]);
        let all: Vec<_> = CmsgIter::new(&buf).collect();
        assert_eq!(all, vec![Err(CmsgError::BadLength { offset: 0, cmsg_len: 3 })]);

        // cmsg_len past the end.
        let buf = hand_built(&[(200, libc::SOL_UDP, libc::UDP_GRO, &[0; 4])]);
        let all: Vec<_> = CmsgIter::new(&buf).collect();
        assert_eq!(all, vec![Err(CmsgError::BadLength { offset: 0, cmsg_len: 200 })]);

        // Good message, then garbage: the good one is still returned.
        let mut buf = hand_built(&[(20, libc::SOL_UDP, libc::UDP_GRO, &1400i32.to_ne_bytes())]);
        buf.extend_from_slice(&[0xff; 5]);
        let all: Vec<_> = CmsgIter::new(&buf).collect();
        assert_eq!(all.len(), 2);
        assert!(all[0].is_ok());
        assert_eq!(all[1], Err(CmsgError::TruncatedHeader { offset: 24 }));

        // Huge cmsg_len does not overflow.
        let buf = hand_built(&[(usize::MAX, libc::SOL_UDP, libc::UDP_GRO, &[0; 4])]);
        assert!(CmsgIter::new(&buf).next().unwrap().is_err());
    }

    #[test]
    fn every_prefix_of_a_valid_buffer_decodes_without_panicking() {
        let mut buf = CmsgBuf::<128>::new();
        buf.push_udp_segment(1400).unwrap();
        buf.push_txtime(42).unwrap();
        buf.push(libc::SOL_IP, libc::IP_RECVERR, &[7u8; 32]).unwrap();
        let bytes = buf.as_bytes();
        for cut in 0..=bytes.len() {
            for m in CmsgIter::new(&bytes[..cut]).flatten() {
                let _ = Cmsg::decode(m);
            }
        }
    }

    #[test]
    fn full_buffer_is_reported() {
        let mut buf = CmsgBuf::<32>::new();
        buf.push_udp_segment(1400).unwrap();
        let err = buf.push_txtime(1).unwrap_err();
        assert_eq!(err, BufferFull { needed: 24, available: 8 });
        assert_eq!(buf.len(), 24, "a failed push leaves the buffer unchanged");
    }

    #[test]
    fn set_len_is_clamped() {
        let mut buf = CmsgBuf::<32>::new();
        buf.set_len(1000);
        assert_eq!(buf.len(), 32);
    }
}

//! Splitting UDP GRO reads back into datagrams (sans-IO).
//!
//! A socket with `UDP_GRO` enabled (Linux 5.0) may receive a train of datagrams
//! coalesced into one read; a `SOL_UDP`/`UDP_GRO` control message then carries the
//! segment size (the "stride"). Every segment but the last is exactly `stride` bytes;
//! the last may be shorter. A read without the control message is one datagram.

/// Iterator over the datagrams in one read.
#[derive(Debug, Clone)]
pub struct Segments<'a> {
    rest: &'a [u8],
    stride: usize,
    done: bool,
}

/// The datagrams in `buf`, given the stride from the `UDP_GRO` control message
/// (`None`, or 0, means the read is a single datagram, possibly empty).
pub fn segments(buf: &[u8], stride: Option<u16>) -> Segments<'_> {
    let stride = match stride {
        Some(s) if s > 0 => usize::from(s),
        _ => usize::MAX,
    };
    Segments { rest: buf, stride, done: false }
}

/// How many datagrams a read of `len` bytes with `stride` holds.
pub fn segment_count(len: usize, stride: Option<u16>) -> usize {
    match stride {
        Some(s) if s > 0 && len > 0 => len.div_ceil(usize::from(s)),
        _ => 1,
    }
}

impl<'a> Iterator for Segments<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.done {
            return None;
        }
        let n = self.stride.min(self.rest.len());
        let (seg, rest) = self.rest.split_at(n);
        self.rest = rest;
        if self.rest.is_empty() {
            self.done = true;
        }
        Some(seg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_on_stride_with_short_tail() {
        let buf: Vec<u8> = (0..3500u32).map(|i| i as u8).collect();
        let segs: Vec<&[u8]> = segments(&buf, Some(1400)).collect();
        assert_eq!(segs.iter().map(|s| s.len()).collect::<Vec<_>>(), vec![1400, 1400, 700]);
        assert_eq!(segs.concat(), buf);
        assert_eq!(segment_count(buf.len(), Some(1400)), 3);
    }

    #[test]
    fn exact_multiple_has_no_empty_tail() {
        let buf = vec![7u8; 2800];
        assert_eq!(segments(&buf, Some(1400)).count(), 2);
        assert_eq!(segment_count(2800, Some(1400)), 2);
    }

    #[test]
    fn no_cmsg_is_one_datagram() {
        let buf = vec![1u8; 5000];
        let segs: Vec<_> = segments(&buf, None).collect();
        assert_eq!(segs.len(), 1);
        assert_eq!(segs[0].len(), 5000);
        assert_eq!(segments(&buf, Some(0)).count(), 1);
    }

    #[test]
    fn empty_read_is_one_empty_datagram() {
        let segs: Vec<_> = segments(&[], None).collect();
        assert_eq!(segs, vec![&[] as &[u8]]);
        let segs: Vec<_> = segments(&[], Some(1400)).collect();
        assert_eq!(segs, vec![&[] as &[u8]]);
        assert_eq!(segment_count(0, Some(1400)), 1);
    }

    #[test]
    fn stride_larger_than_buffer() {
        let buf = vec![1u8; 100];
        assert_eq!(segments(&buf, Some(1400)).collect::<Vec<_>>(), vec![&buf[..]]);
    }
}

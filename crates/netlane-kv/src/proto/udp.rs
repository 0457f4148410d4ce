//! memcached's UDP frame header: every datagram starts with four big-endian `u16`s
//! (request id, sequence number, datagram count, reserved 0). A request is one
//! datagram; a reply is split into datagrams of at most [`UDP_MAX_PAYLOAD`] bytes,
//! header included, numbered 0..n-1 (doc/protocol.txt, "UDP protocol").

/// Header length.
pub const UDP_HEADER: usize = 8;
/// Largest datagram a reply is split into (memcached's `UDP_MAX_PAYLOAD_SIZE`).
pub const UDP_MAX_PAYLOAD: usize = 1400;
/// Reply bytes per datagram.
pub const UDP_DATA: usize = UDP_MAX_PAYLOAD - UDP_HEADER;
/// Largest reply: what 65535 datagrams carry.
pub const UDP_MAX_REPLY: usize = UDP_DATA * u16::MAX as usize;

/// A datagram's frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    /// The client's request id, echoed.
    pub request_id: u16,
    /// This datagram's index.
    pub seq: u16,
    /// Datagrams in the message.
    pub total: u16,
}

/// Why a request datagram is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// No request after the header.
    #[error("datagram of no more than the 8-byte frame header")]
    Short,
    /// Spread over several datagrams (memcached does not take those either).
    #[error("multi-datagram requests are not supported")]
    MultiDatagram,
}

/// Splits a request datagram into its header and command bytes. As memcached reads
/// it: only the datagram count is checked (it must be 1); the sequence number and the
/// reserved field are not looked at.
pub fn parse_request(d: &[u8]) -> Result<(Frame, &[u8]), FrameError> {
    let Some((h, body)) = d.split_first_chunk::<UDP_HEADER>() else { return Err(FrameError::Short) };
    if body.is_empty() {
        return Err(FrameError::Short);
    }
    let word = |i: usize| u16::from_be_bytes([h[i], h[i + 1]]);
    let f = Frame { request_id: word(0), seq: word(2), total: word(4) };
    if f.total != 1 {
        return Err(FrameError::MultiDatagram);
    }
    Ok((f, body))
}

/// The header of datagram `seq` of `total` answering `request_id`.
pub fn header(request_id: u16, seq: u16, total: u16) -> [u8; UDP_HEADER] {
    let mut h = [0u8; UDP_HEADER];
    h[0..2].copy_from_slice(&request_id.to_be_bytes());
    h[2..4].copy_from_slice(&seq.to_be_bytes());
    h[4..6].copy_from_slice(&total.to_be_bytes());
    h
}

/// The datagrams of a reply: (header, payload) pairs. A reply over [`UDP_MAX_REPLY`] is
/// cut there (the caller bounds replies below it).
pub fn datagrams(request_id: u16, reply: &[u8]) -> impl Iterator<Item = ([u8; UDP_HEADER], &[u8])> {
    let reply = &reply[..reply.len().min(UDP_MAX_REPLY)];
    let total = reply.len().div_ceil(UDP_DATA).max(1) as u16;
    let chunks: Box<dyn Iterator<Item = &[u8]>> =
        if reply.is_empty() { Box::new(std::iter::once(reply)) } else { Box::new(reply.chunks(UDP_DATA)) };
    chunks.enumerate().map(move |(i, c)| (header(request_id, i as u16, total), c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_parse_and_replies_split() {
        let mut d = header(0xbeef, 0, 1).to_vec();
        d.extend_from_slice(b"get a\r\n");
        let (f, body) = parse_request(&d).unwrap();
        assert_eq!(f, Frame { request_id: 0xbeef, seq: 0, total: 1 });
        assert_eq!(body, b"get a\r\n");
        assert_eq!(parse_request(&d[..5]), Err(FrameError::Short));
        assert_eq!(parse_request(&header(1, 0, 1)), Err(FrameError::Short), "a header alone");
        let mut two = header(1, 0, 2).to_vec();
        two.push(b'x');
        assert_eq!(parse_request(&two), Err(FrameError::MultiDatagram));
        // The sequence number and the reserved field are not checked (memcached).
        let mut r = header(1, 5, 1).to_vec();
        r[7] = 1;
        r.extend_from_slice(b"mn\r\n");
        assert_eq!(parse_request(&r).map(|(f, b)| (f.seq, b)), Ok((5, &b"mn\r\n"[..])));

        let reply = vec![7u8; UDP_DATA * 2 + 5];
        let parts: Vec<_> = datagrams(9, &reply).collect();
        assert_eq!(parts.len(), 3);
        for (i, (h, p)) in parts.iter().enumerate() {
            assert_eq!(h, &header(9, i as u16, 3));
            assert!(p.len() + UDP_HEADER <= UDP_MAX_PAYLOAD);
        }
        assert_eq!(parts.iter().map(|(_, p)| p.len()).sum::<usize>(), reply.len());
        assert_eq!(datagrams(1, b"").count(), 1);
    }
}

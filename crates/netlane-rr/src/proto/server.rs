//! The server's side: a request in, the response datagrams out. Stateless: the
//! request's 4-tuple (known to the driver) and id identify it.

use thiserror::Error;

use super::wire::{self, HEADER_LEN, Header, Kind, MAX_DATAGRAM, MAX_SEGMENTS, WireError};

/// How the server answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponderConfig {
    /// Largest response payload a request may ask for.
    pub max_response: u32,
    /// Split responses into datagrams of this many bytes (header included), each a
    /// message of its own, for a GSO send; `None`: one datagram per response (fragmented
    /// by IP when it exceeds the MTU).
    pub segment: Option<usize>,
    /// Answer every datagram with its own bytes (a standard UDP echo server).
    pub echo: bool,
}

impl Default for ResponderConfig {
    fn default() -> Self {
        ResponderConfig { max_response: (MAX_DATAGRAM - HEADER_LEN) as u32, segment: None, echo: false }
    }
}

/// A configuration that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// A segment cannot hold a header and some payload, or exceeds a datagram.
    #[error("segment size {0}: must be {min}..={MAX_DATAGRAM} bytes (a {HEADER_LEN}-byte header and payload)", min = HEADER_LEN + 1)]
    Segment(usize),
    /// Responses larger than one datagram (unsegmented) or 255 segments.
    #[error("largest response {asked} bytes: at most {limit} ({why})")]
    MaxResponse {
        /// Configured.
        asked: u32,
        /// The most this configuration can send.
        limit: usize,
        /// What sets the limit.
        why: &'static str,
    },
}

impl ResponderConfig {
    /// Checks the configuration.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let (limit, why) = match self.segment {
            Some(s) if !(HEADER_LEN + 1..=MAX_DATAGRAM).contains(&s) => return Err(ConfigError::Segment(s)),
            Some(s) => (MAX_SEGMENTS * (s - HEADER_LEN), "255 segments"),
            None => (MAX_DATAGRAM - HEADER_LEN, "an unsegmented response is one datagram"),
        };
        if self.max_response as usize > limit {
            return Err(ConfigError::MaxResponse { asked: self.max_response, limit, why });
        }
        Ok(())
    }

    /// Bytes of all the datagrams of a response of `response_len` payload bytes (not in
    /// echo mode: an echo is the request's size).
    pub fn reply_bytes(&self, response_len: u32) -> usize {
        let total = response_len as usize;
        match self.segment {
            None => HEADER_LEN + total,
            Some(s) => {
                let per = s.saturating_sub(HEADER_LEN).max(1);
                total.div_ceil(per).max(1) * HEADER_LEN + total
            }
        }
    }

    /// The largest response in bytes (all its datagrams together), for sizing buffers.
    pub fn max_reply_bytes(&self) -> usize {
        match self.segment {
            _ if self.echo => MAX_DATAGRAM,
            None => HEADER_LEN + self.max_response as usize,
            Some(s) => {
                let per = s - HEADER_LEN;
                let n = (self.max_response as usize).div_ceil(per).clamp(1, MAX_SEGMENTS);
                n * s
            }
        }
    }
}

/// The response written into the caller's buffer: `segments` datagrams of
/// `segment_len` bytes back to back (the last may be shorter), `len` bytes in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    /// Datagrams.
    pub segments: usize,
    /// Bytes of each but the last.
    pub segment_len: usize,
    /// Bytes in all.
    pub len: usize,
}

/// Why a datagram got no response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum Refusal {
    /// Not a valid message (counted by reason).
    #[error("not a valid request")]
    Malformed(#[from] WireError),
    /// A response where a request belongs.
    #[error("a response sent to the server")]
    NotARequest,
    /// Asks for more than the server sends.
    #[error("asks for {asked} response bytes, the limit is {limit}")]
    TooLarge {
        /// Asked.
        asked: u32,
        /// Configured limit.
        limit: u32,
    },
}

/// Answers one request into `out`.
pub fn respond(cfg: &ResponderConfig, request: &[u8], out: &mut [u8]) -> Result<Reply, Refusal> {
    if cfg.echo {
        if request.len() > out.len() {
            return Err(WireError::NoRoom { needed: request.len(), capacity: out.len() }.into());
        }
        out[..request.len()].copy_from_slice(request);
        return Ok(Reply { segments: 1, segment_len: request.len(), len: request.len() });
    }
    let (req, _) = wire::decode(request)?;
    respond_to(cfg, &req, out)
}

/// Answers a request already decoded (the driver decodes once to decide whether to
/// answer at all) into `out`.
pub fn respond_to(cfg: &ResponderConfig, req: &Header, out: &mut [u8]) -> Result<Reply, Refusal> {
    if req.kind != Kind::Request {
        return Err(Refusal::NotARequest);
    }
    if req.response_len > cfg.max_response {
        return Err(Refusal::TooLarge { asked: req.response_len, limit: cfg.max_response });
    }
    let total = req.response_len as usize;
    let per = match cfg.segment {
        Some(s) => s.saturating_sub(HEADER_LEN).max(1),
        None => total.max(1),
    };
    let segments = total.div_ceil(per).max(1);
    if segments > MAX_SEGMENTS {
        return Err(Refusal::TooLarge { asked: req.response_len, limit: (MAX_SEGMENTS * per) as u32 });
    }
    let segment_len = HEADER_LEN + per.min(total);
    let mut at = 0;
    for i in 0..segments {
        let offset = i * per;
        let payload = per.min(total - offset);
        let h = Header {
            kind: Kind::Response,
            segment: i as u8,
            segments: segments as u8,
            id: req.id,
            sent_ns: req.sent_ns,
            payload_len: payload as u32,
            response_len: req.response_len,
            offset: offset as u32,
        };
        let room = out.len();
        at += wire::encode(&h, &mut out[at.min(room)..])?;
    }
    Ok(Reply { segments, segment_len, len: at })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(id: u64, response_len: u32) -> Vec<u8> {
        let mut b = vec![0u8; 512];
        let n = wire::encode(&Header::request(id, 5, 472, response_len), &mut b).unwrap();
        b.truncate(n);
        b
    }

    #[test]
    fn an_unsegmented_response_is_one_datagram() {
        let cfg = ResponderConfig::default();
        let mut out = vec![0u8; cfg.max_reply_bytes()];
        let r = respond(&cfg, &request(3, 8152), &mut out).unwrap();
        assert_eq!(r, Reply { segments: 1, segment_len: 8192, len: 8192 });
        let (h, p) = wire::decode(&out[..r.len]).unwrap();
        assert_eq!((h.kind, h.id, h.sent_ns, h.response_len), (Kind::Response, 3, 5, 8152));
        assert!(wire::pattern_matches(3, 0, p));
    }

    #[test]
    fn segments_cover_the_response_in_order() {
        let cfg = ResponderConfig { segment: Some(1440), ..ResponderConfig::default() };
        let mut out = vec![0u8; cfg.max_reply_bytes()];
        let r = respond(&cfg, &request(8, 8152), &mut out).unwrap();
        // 1400 payload bytes per segment: 5 full and 1 of 1152.
        assert_eq!(r, Reply { segments: 6, segment_len: 1440, len: 5 * 1440 + 40 + 1152 });
        let mut covered = 0;
        for (i, seg) in out[..r.len].chunks(1440).enumerate() {
            let (h, p) = wire::decode(seg).unwrap();
            assert_eq!((h.segment as usize, h.segments, h.offset as usize), (i, 6, covered));
            assert!(wire::pattern_matches(8, h.offset, p));
            covered += p.len();
        }
        assert_eq!(covered, 8152);
    }

    #[test]
    fn an_empty_response_is_one_header() {
        let cfg = ResponderConfig { segment: Some(1000), ..ResponderConfig::default() };
        let mut out = vec![0u8; 2000];
        let r = respond(&cfg, &request(1, 0), &mut out).unwrap();
        assert_eq!(r, Reply { segments: 1, segment_len: HEADER_LEN, len: HEADER_LEN });
    }

    #[test]
    fn bad_requests_get_no_response() {
        let cfg = ResponderConfig { max_response: 1000, ..ResponderConfig::default() };
        let mut out = vec![0u8; cfg.max_reply_bytes()];
        assert_eq!(respond(&cfg, &request(1, 1001), &mut out), Err(Refusal::TooLarge { asked: 1001, limit: 1000 }));
        assert!(matches!(respond(&cfg, b"hello", &mut out), Err(Refusal::Malformed(WireError::Short { .. }))));
        let mut r = request(1, 10);
        r[100] ^= 1;
        assert!(matches!(respond(&cfg, &r, &mut out), Err(Refusal::Malformed(WireError::Check { .. }))));
        let mut resp = vec![0u8; 100];
        respond(&cfg, &request(1, 10), &mut resp).unwrap();
        assert_eq!(respond(&cfg, &resp[..50], &mut out), Err(Refusal::NotARequest));
    }

    #[test]
    fn echo_returns_any_bytes() {
        let cfg = ResponderConfig { echo: true, ..ResponderConfig::default() };
        let mut out = vec![0u8; 10];
        assert_eq!(respond(&cfg, b"abc", &mut out).unwrap().len, 3);
        assert_eq!(&out[..3], b"abc");
        assert!(respond(&cfg, &[0; 11], &mut out).is_err());
    }

    #[test]
    fn impossible_configurations_are_refused() {
        let c = |segment, max_response| ResponderConfig { segment, max_response, echo: false }.validate();
        assert!(c(Some(40), 100).is_err());
        assert!(c(Some(70_000), 100).is_err());
        assert!(c(None, 65_468).is_err());
        assert!(c(None, 65_467).is_ok());
        assert!(c(Some(1472), 255 * 1432).is_ok());
        assert!(c(Some(1472), 255 * 1432 + 1).is_err());
    }
}

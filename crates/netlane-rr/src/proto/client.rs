//! One client's side: requests out, responses matched to them (reassembled from
//! segments), timeouts and retransmissions. The driver supplies the clock and the
//! socket; this keeps the state and decides.

use thiserror::Error;

use super::wire::{self, HEADER_LEN, Header, Kind, MAX_DATAGRAM, MAX_SEGMENTS, WireError};

/// What a client asks for and how patiently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientConfig {
    /// Request datagram bytes (header included).
    pub request_len: usize,
    /// Response payload bytes asked for (ignored in echo mode: the echo is the request).
    pub response_len: u32,
    /// The server echoes requests back (a standard UDP echo server).
    pub echo: bool,
    /// Time to wait for a response before sending the request again.
    pub timeout_ns: u64,
    /// Retransmissions before the request is given up (counted as lost).
    pub max_retries: u32,
    /// Requests in flight at once (1: closed loop).
    pub max_outstanding: usize,
}

/// A configuration that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ClientConfigError {
    /// The request must hold a header and fit a datagram.
    #[error("request size {0}: must be {HEADER_LEN}..={MAX_DATAGRAM} bytes")]
    RequestLen(usize),
    /// Zero timeout or outstanding.
    #[error("{0} must be positive")]
    Zero(&'static str),
    /// More than the bound on requests in flight.
    #[error("{0} requests in flight per client: at most {MAX_OUTSTANDING}")]
    Outstanding(usize),
}

/// The most requests one client may have in flight.
pub const MAX_OUTSTANDING: usize = 1024;

impl ClientConfig {
    /// Checks the configuration.
    pub fn validate(&self) -> Result<(), ClientConfigError> {
        if !(HEADER_LEN..=MAX_DATAGRAM).contains(&self.request_len) {
            return Err(ClientConfigError::RequestLen(self.request_len));
        }
        if self.timeout_ns == 0 {
            return Err(ClientConfigError::Zero("timeout"));
        }
        match self.max_outstanding {
            0 => Err(ClientConfigError::Zero("requests in flight")),
            n if n > MAX_OUTSTANDING => Err(ClientConfigError::Outstanding(n)),
            _ => Ok(()),
        }
    }
}

/// What became of one received datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// A response completed: its latency from the first send, and how many times the
    /// request had been sent again.
    Completed {
        /// Nanoseconds from the first transmission to the last datagram of the response.
        latency_ns: u64,
        /// Retransmissions of this request.
        retries: u32,
    },
    /// A segment of a response still missing others.
    Partial,
    /// A segment received before (a retransmission's second answer, or a duplicate).
    Duplicate,
    /// A valid response to no request in flight: late (after it was given up or already
    /// answered).
    Late,
    /// Not a valid message: corrupted in transit (checksum), or not ours.
    Corrupt(WireError),
    /// A valid datagram whose content disagrees with the request: wrong size, wrong
    /// segment layout, payload not what belongs at its offset (misassembled).
    Mismatch,
    /// The server asked for the request again with its cookie: `expire` now
    /// writes it (not counted as a retransmission).
    Retry,
    /// The server refused the request: it sends at most `limit` payload bytes. The
    /// request is given up.
    Refused {
        /// The most the server sends.
        limit: u32,
    },
}

/// Counters over a client's life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Requests started (first transmissions).
    pub requests: u64,
    /// Retransmissions.
    pub retransmits: u64,
    /// Responses completed.
    pub responses: u64,
    /// Requests given up after the last retransmission timed out.
    pub lost: u64,
    /// Datagrams that were segments of incomplete responses.
    pub partial: u64,
    /// Duplicate segments.
    pub duplicates: u64,
    /// Valid responses to nothing in flight.
    pub late: u64,
    /// Invalid datagrams (checksum, format).
    pub corrupt: u64,
    /// Valid datagrams that did not belong where they claimed to.
    pub mismatched: u64,
    /// Retries the server asked for (the request sent again with its cookie).
    pub retried: u64,
    /// Requests the server refused as too large.
    pub refused: u64,
}

#[derive(Debug, Clone)]
struct Pending {
    id: u64,
    first_sent_ns: u64,
    deadline_ns: u64,
    retries: u32,
    /// Segments received, one bit each.
    got: [u64; 4],
    segments: u8,
    bytes: u32,
    /// The server sent a Retry: send again now, with the cookie.
    retry_now: bool,
}

impl Pending {
    fn has(&self, i: u8) -> bool {
        self.got[usize::from(i) / 64] & (1 << (i % 64)) != 0
    }
    fn set(&mut self, i: u8) {
        self.got[usize::from(i) / 64] |= 1 << (i % 64);
    }
}

/// What a timer tick asks of the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// Send request `len` bytes (already written into the buffer) again.
    Resend(usize),
    /// A request was given up.
    Lost,
}

/// One client: a sans-IO core. The driver passes in the time and every datagram it
/// receives, and sends what the core writes.
///
/// ```
/// use netlane_rr::proto::client::{Client, ClientConfig, Received};
/// use netlane_rr::proto::server::{ResponderConfig, respond};
///
/// let cfg = ClientConfig {
///     request_len: 64,
///     response_len: 512,
///     echo: false,
///     timeout_ns: 5_000_000,
///     max_retries: 2,
///     max_outstanding: 1,
/// };
/// let mut client = Client::new(cfg, 1);
/// let server = ResponderConfig::default();
/// let (mut request, mut reply) = ([0u8; 64], vec![0u8; server.max_reply_bytes()]);
/// let n = client.poll_transmit(0, &mut request)?.expect("room for one");
/// assert!(client.poll_transmit(0, &mut request)?.is_none(), "closed loop: one in flight");
/// let r = respond(&server, &request[..n], &mut reply).expect("a valid request");
/// let got = client.handle_datagram(250_000, &reply[..r.len]);
/// assert_eq!(got, Received::Completed { latency_ns: 250_000, retries: 0 });
/// # Ok::<(), netlane_rr::proto::wire::WireError>(())
/// ```
///
/// `examples/sans_io.rs` adds a lost request and its retransmission.
#[derive(Debug)]
pub struct Client {
    cfg: ClientConfig,
    next_id: u64,
    pending: Vec<Pending>,
    stats: ClientStats,
    /// The server's cookie for this client's address, sent with every request once
    /// the server gave one (0: none yet).
    cookie: u32,
}

impl Client {
    /// A client whose request ids start at `first_id` (distinct per client helps reading
    /// captures; the 4-tuple already separates clients).
    pub fn new(cfg: ClientConfig, first_id: u64) -> Self {
        Client { cfg, next_id: first_id, pending: Vec::new(), stats: ClientStats::default(), cookie: 0 }
    }

    /// Counters so far.
    pub fn stats(&self) -> ClientStats {
        self.stats
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Whether another request may start now.
    pub fn can_send(&self) -> bool {
        self.pending.len() < self.cfg.max_outstanding
    }

    /// The earliest retransmission deadline.
    pub fn next_deadline(&self) -> Option<u64> {
        self.pending.iter().map(|p| p.deadline_ns).min()
    }

    fn header(&self, id: u64, sent_ns: u64) -> Header {
        let response_len = if self.cfg.echo { 0 } else { self.cfg.response_len };
        let h = Header::request(id, sent_ns, (self.cfg.request_len - HEADER_LEN) as u32, response_len);
        Header { offset: self.cookie, ..h }
    }

    /// Starts a request at `now_ns`: writes it into `out` and returns its length, or
    /// `None` when the client already has its most requests in flight.
    pub fn poll_transmit(&mut self, now_ns: u64, out: &mut [u8]) -> Result<Option<usize>, WireError> {
        if !self.can_send() {
            return Ok(None);
        }
        let id = self.next_id;
        let n = wire::encode(&self.header(id, now_ns), out)?;
        self.next_id = self.next_id.wrapping_add(1);
        self.pending.push(Pending {
            id,
            first_sent_ns: now_ns,
            deadline_ns: now_ns.saturating_add(self.cfg.timeout_ns),
            retries: 0,
            got: [0; 4],
            segments: 0,
            bytes: 0,
            retry_now: false,
        });
        self.stats.requests += 1;
        Ok(Some(n))
    }

    /// Handles the requests whose deadline passed by `now_ns`: the first one found is
    /// either rewritten into `out` to be sent again, or given up. Call until it returns
    /// `None`.
    pub fn handle_timeout(&mut self, now_ns: u64, out: &mut [u8]) -> Result<Option<Expired>, WireError> {
        let Some(i) = self.pending.iter().position(|p| p.deadline_ns <= now_ns) else {
            return Ok(None);
        };
        if self.pending[i].retry_now {
            let p = &mut self.pending[i];
            p.retry_now = false;
            p.deadline_ns = now_ns.saturating_add(self.cfg.timeout_ns);
            let (id, sent) = (p.id, p.first_sent_ns);
            return Ok(Some(Expired::Resend(wire::encode(&self.header(id, sent), out)?)));
        }
        if self.pending[i].retries >= self.cfg.max_retries {
            self.pending.swap_remove(i);
            self.stats.lost += 1;
            return Ok(Some(Expired::Lost));
        }
        let p = &self.pending[i];
        // The same bytes as the first transmission: same id and send time, so any answer
        // to either completes it (and the other is then a duplicate).
        let n = wire::encode(&self.header(p.id, p.first_sent_ns), out)?;
        let p = &mut self.pending[i];
        p.retries += 1;
        p.deadline_ns = now_ns.saturating_add(self.cfg.timeout_ns);
        self.stats.retransmits += 1;
        Ok(Some(Expired::Resend(n)))
    }

    /// Matches one received datagram at `now_ns`.
    pub fn handle_datagram(&mut self, now_ns: u64, datagram: &[u8]) -> Received {
        let r = self.classify(now_ns, datagram);
        let s = &mut self.stats;
        match r {
            Received::Completed { .. } => s.responses += 1,
            Received::Partial => s.partial += 1,
            Received::Duplicate => s.duplicates += 1,
            Received::Late => s.late += 1,
            Received::Corrupt(_) => s.corrupt += 1,
            Received::Mismatch => s.mismatched += 1,
            Received::Retry => s.retried += 1,
            Received::Refused { .. } => s.refused += 1,
        }
        r
    }

    fn classify(&mut self, now_ns: u64, datagram: &[u8]) -> Received {
        let (h, payload) = match wire::decode(datagram) {
            Ok(d) => d,
            Err(e) => return Received::Corrupt(e),
        };
        let Some(i) = self.pending.iter().position(|p| p.id == h.id) else {
            return Received::Late;
        };
        match h.kind {
            Kind::Retry if !self.cfg.echo => {
                self.cookie = h.offset;
                let p = &mut self.pending[i];
                p.retry_now = true;
                p.deadline_ns = now_ns;
                return Received::Retry;
            }
            Kind::Refused if !self.cfg.echo => {
                self.pending.swap_remove(i);
                return Received::Refused { limit: h.response_len };
            }
            _ => {}
        }
        let expected_kind = if self.cfg.echo { Kind::Request } else { Kind::Response };
        let asked = if self.cfg.echo { (self.cfg.request_len - HEADER_LEN) as u32 } else { self.cfg.response_len };
        let total = if self.cfg.echo { h.payload_len } else { h.response_len };
        if h.kind != expected_kind || total != asked || !wire::pattern_matches(h.id, h.offset, payload) {
            return Received::Mismatch;
        }
        let p = &mut self.pending[i];
        if p.segments == 0 {
            p.segments = h.segments;
        } else if p.segments != h.segments {
            return Received::Mismatch;
        }
        if p.has(h.segment) {
            return Received::Duplicate;
        }
        // Segments must tile the response: their payloads add up to exactly its size.
        let bytes = p.bytes.saturating_add(h.payload_len);
        if bytes > total {
            return Received::Mismatch;
        }
        p.set(h.segment);
        p.bytes = bytes;
        let all = (0..p.segments).all(|s| p.has(s));
        debug_assert!(usize::from(p.segments) <= MAX_SEGMENTS);
        if !all {
            return Received::Partial;
        }
        if p.bytes != total {
            self.pending.swap_remove(i);
            return Received::Mismatch;
        }
        let p = self.pending.swap_remove(i);
        Received::Completed { latency_ns: now_ns.saturating_sub(p.first_sent_ns), retries: p.retries }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::server::{ResponderConfig, respond};

    fn cfg() -> ClientConfig {
        ClientConfig {
            request_len: 512,
            response_len: 8152,
            echo: false,
            timeout_ns: 1_000,
            max_retries: 2,
            max_outstanding: 1,
        }
    }

    fn serve(req: &[u8], segment: Option<usize>) -> Vec<Vec<u8>> {
        let rc = ResponderConfig { segment, ..ResponderConfig::default() };
        let mut out = vec![0u8; rc.max_reply_bytes()];
        let r = respond(&rc, req, &mut out).unwrap();
        out[..r.len].chunks(r.segment_len).map(<[u8]>::to_vec).collect()
    }

    #[test]
    fn a_closed_loop_client_completes_one_request_at_a_time() {
        let mut c = Client::new(cfg(), 100);
        let mut buf = [0u8; 512];
        let n = c.poll_transmit(10, &mut buf).unwrap().unwrap();
        assert_eq!(c.poll_transmit(11, &mut buf).unwrap(), None, "closed loop: one in flight");
        let resp = serve(&buf[..n], None);
        assert_eq!(c.handle_datagram(60, &resp[0]), Received::Completed { latency_ns: 50, retries: 0 });
        assert_eq!(c.handle_datagram(61, &resp[0]), Received::Late);
        assert!(c.can_send());
    }

    #[test]
    fn segments_in_any_order_complete_once() {
        let mut c = Client::new(cfg(), 0);
        let mut buf = [0u8; 512];
        let n = c.poll_transmit(0, &mut buf).unwrap().unwrap();
        let mut segs = serve(&buf[..n], Some(1440));
        segs.reverse();
        let last = segs.pop().unwrap();
        for s in &segs {
            assert_eq!(c.handle_datagram(5, s), Received::Partial);
        }
        assert_eq!(c.handle_datagram(6, &segs[0]), Received::Duplicate);
        assert_eq!(c.handle_datagram(7, &last), Received::Completed { latency_ns: 7, retries: 0 });
        assert_eq!(c.stats().responses, 1);
    }

    #[test]
    fn corrupted_and_misplaced_segments_are_never_accepted() {
        let mut c = Client::new(cfg(), 0);
        let mut buf = [0u8; 512];
        let n = c.poll_transmit(0, &mut buf).unwrap().unwrap();
        let segs = serve(&buf[..n], Some(1440));
        let mut bad = segs[2].clone();
        bad[500] ^= 0x10;
        assert!(matches!(c.handle_datagram(1, &bad), Received::Corrupt(WireError::Check { .. })));
        // A segment moved to another offset, its checksum made right again (as a
        // misassembly would look): the pattern catches it.
        let mut moved = segs[2].clone();
        let (h, _) = wire::decode(&moved).unwrap();
        moved[6] = h.segment + 1;
        moved[32..36].copy_from_slice(&(h.offset + 1400).to_be_bytes());
        wire::reseal(&mut moved);
        assert!(wire::decode(&moved).is_ok());
        assert_eq!(c.handle_datagram(1, &moved), Received::Mismatch);
        // A valid response of the wrong size.
        let mut other = cfg();
        other.response_len = 100;
        let mut o = Client::new(other, 0);
        let mut b2 = [0u8; 512];
        let n2 = o.poll_transmit(0, &mut b2).unwrap().unwrap();
        let small = serve(&b2[..n2], None);
        assert_eq!(c.handle_datagram(1, &small[0]), Received::Mismatch);
        assert_eq!(c.stats().corrupt + c.stats().mismatched, 3);
        // The real segments still complete it.
        let got: Vec<_> = segs.iter().map(|s| c.handle_datagram(2, s)).collect();
        assert_eq!(got.last(), Some(&Received::Completed { latency_ns: 2, retries: 0 }));
    }

    #[test]
    fn timeouts_resend_then_give_up() {
        let mut c = Client::new(cfg(), 7);
        let mut first = [0u8; 512];
        let n = c.poll_transmit(0, &mut first).unwrap().unwrap();
        assert_eq!(c.next_deadline(), Some(1_000));
        let mut buf = [0u8; 512];
        assert_eq!(c.handle_timeout(999, &mut buf).unwrap(), None);
        assert_eq!(c.handle_timeout(1_000, &mut buf).unwrap(), Some(Expired::Resend(n)));
        assert_eq!(buf, first, "a retransmission is the same request");
        assert_eq!(c.handle_timeout(2_000, &mut buf).unwrap(), Some(Expired::Resend(n)));
        assert_eq!(c.handle_timeout(3_000, &mut buf).unwrap(), Some(Expired::Lost));
        assert_eq!(c.in_flight(), 0);
        let s = c.stats();
        assert_eq!((s.requests, s.retransmits, s.lost), (1, 2, 1));
        // Its answer, arriving after all that, is late, never a completion.
        let resp = serve(&first[..n], None);
        assert_eq!(c.handle_datagram(3_500, &resp[0]), Received::Late);
    }

    #[test]
    fn a_retransmitted_request_completes_from_its_first_send() {
        let mut c = Client::new(cfg(), 7);
        let mut buf = [0u8; 512];
        let n = c.poll_transmit(0, &mut buf).unwrap().unwrap();
        c.handle_timeout(1_000, &mut buf).unwrap();
        let resp = serve(&buf[..n], None);
        assert_eq!(c.handle_datagram(1_500, &resp[0]), Received::Completed { latency_ns: 1_500, retries: 1 });
        assert_eq!(c.handle_datagram(1_600, &resp[0]), Received::Late);
    }

    #[test]
    fn echo_mode_takes_the_request_back() {
        let mut c = Client::new(ClientConfig { echo: true, ..cfg() }, 1);
        let mut buf = [0u8; 512];
        let n = c.poll_transmit(0, &mut buf).unwrap().unwrap();
        assert_eq!(c.handle_datagram(9, &buf[..n]), Received::Completed { latency_ns: 9, retries: 0 });
    }

    #[test]
    fn open_loop_clients_track_many_requests() {
        let mut c = Client::new(ClientConfig { max_outstanding: 3, ..cfg() }, 0);
        let mut bufs = [[0u8; 512]; 3];
        for (t, b) in bufs.iter_mut().enumerate() {
            c.poll_transmit(t as u64, b).unwrap().unwrap();
        }
        assert!(!c.can_send());
        let r1 = serve(&bufs[1], None);
        assert_eq!(c.handle_datagram(10, &r1[0]), Received::Completed { latency_ns: 9, retries: 0 });
        assert_eq!(c.in_flight(), 2);
    }

    #[test]
    fn bad_configurations_are_refused() {
        let v = |f: fn(&mut ClientConfig)| {
            let mut c = cfg();
            f(&mut c);
            c.validate()
        };
        assert!(v(|_| {}).is_ok());
        assert_eq!(v(|c| c.request_len = 39), Err(ClientConfigError::RequestLen(39)));
        assert_eq!(v(|c| c.request_len = 70_000), Err(ClientConfigError::RequestLen(70_000)));
        assert!(v(|c| c.timeout_ns = 0).is_err());
        assert!(v(|c| c.max_outstanding = 0).is_err());
        assert!(v(|c| c.max_outstanding = 5000).is_err());
    }

    #[test]
    fn a_retry_sends_the_request_again_with_the_cookie_and_a_refusal_gives_it_up() {
        let mut c = Client::new(cfg(), 7);
        let mut out = vec![0u8; 1024];
        let n = c.poll_transmit(100, &mut out).unwrap().unwrap();
        let (req, _) = wire::decode(&out[..n]).unwrap();
        assert_eq!(req.offset, 0, "no cookie yet");
        let mut retry = vec![0u8; HEADER_LEN];
        wire::encode(&Header::retry(&req, 0xc00c1e), &mut retry).unwrap();
        assert_eq!(c.handle_datagram(150, &retry), Received::Retry);
        assert_eq!(c.next_deadline(), Some(150), "sent again at once");
        let Some(Expired::Resend(n)) = c.handle_timeout(150, &mut out).unwrap() else { panic!("a resend") };
        let (again, _) = wire::decode(&out[..n]).unwrap();
        assert_eq!((again.id, again.sent_ns, again.offset), (req.id, req.sent_ns, 0xc00c1e));
        assert_eq!((c.stats().retransmits, c.stats().retried), (0, 1));
        // Every later request carries the cookie.
        let mut refused = vec![0u8; HEADER_LEN];
        wire::encode(&Header::refused(&again, 4096), &mut refused).unwrap();
        assert_eq!(c.handle_datagram(200, &refused), Received::Refused { limit: 4096 });
        assert_eq!(c.in_flight(), 0);
        let n = c.poll_transmit(300, &mut out).unwrap().unwrap();
        assert_eq!(wire::decode(&out[..n]).unwrap().0.offset, 0xc00c1e);
        // A retry for a request not in flight changes nothing.
        assert_eq!(c.handle_datagram(310, &retry), Received::Late);
    }
}

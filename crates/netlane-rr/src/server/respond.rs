//! One request's way back: answered (a response, a Retry for an unverified source held
//! to less, a refusal), then delivered paced, as frames, or through the socket.

use super::*;

/// Sends the frames queued while answering a batch.
pub(super) fn flush(raw: &mut Option<RawTx>, st: &mut ServerStats) {
    if let Some(r) = raw
        && let Err(e) = r.flush()
    {
        tracing::debug!(error = %e, "transmit ring flush failed");
        st.counters.send_errors += 1;
    }
}

/// A receive error: whether to try again (EINTR) or stop draining. ICMP errors queued
/// on the socket (a client went away) surface here: counted, never fatal.
pub(super) fn recv_error(e: io::Error, st: &mut ServerStats) -> bool {
    match e.kind() {
        io::ErrorKind::WouldBlock => false,
        io::ErrorKind::Interrupted => true,
        _ => {
            tracing::debug!(error = %e, "receive error");
            st.counters.recv_errors += 1;
            false
        }
    }
}

/// Answers one request: the response, a Retry when the guard holds an unverified
/// source to less, a refusal when it asks for more than the server sends.
pub(super) fn answer(
    cfg: &ServerConfig,
    senders: (&mut Tx<'_>, &mut Option<RawTx>, &mut Option<Paced>),
    guard: &mut Guard,
    out: &mut [u8],
    st: &mut ServerStats,
    request: &[u8],
    from: SocketAddr,
) {
    // Echo answers a datagram with itself: never larger than what came in.
    let result = if cfg.responder.echo {
        respond(&cfg.responder, request, out)
    } else {
        match wire::decode(request) {
            Err(e) => Err(Refusal::Malformed(e)),
            Ok((h, _)) if h.kind != Kind::Request => Err(Refusal::NotARequest),
            Ok((h, _)) => {
                let control = if h.response_len > cfg.responder.max_response {
                    st.counters.refused_too_large += 1;
                    Some(Header::refused(&h, cfg.responder.max_response))
                } else {
                    let reply = cfg.responder.reply_bytes(h.response_len);
                    match guard.handle_request(from, h.offset, request.len(), reply, monotonic_ns()) {
                        Admit::Send { verified } => {
                            st.counters.verified_requests += u64::from(verified);
                            None
                        }
                        Admit::Retry(cookie) => {
                            st.counters.retries_sent += 1;
                            Some(Header::retry(&h, cookie))
                        }
                    }
                };
                if let Some(c) = control {
                    if let Ok(n) = wire::encode(&c, out) {
                        deliver(senders, &out[..n], 1, n, from, st);
                    }
                    return;
                }
                respond_to(&cfg.responder, &h, out)
            }
        }
    };
    match result {
        Ok(reply) => {
            st.counters.responses += 1;
            deliver(senders, &out[..reply.len], reply.segments, reply.segment_len, from, st);
        }
        Err(Refusal::Malformed(_)) => st.counters.refused_malformed += 1,
        Err(Refusal::NotARequest) => st.counters.refused_not_request += 1,
        Err(Refusal::TooLarge { .. }) => st.counters.refused_too_large += 1,
    }
}

/// Sends `reply` (`segments` datagrams of `segment_len` bytes) to `from`: paced, as
/// frames, or through the socket.
fn deliver(
    (tx, raw, paced): (&mut Tx<'_>, &mut Option<RawTx>, &mut Option<Paced>),
    reply: &[u8],
    segments: usize,
    segment_len: usize,
    from: SocketAddr,
    st: &mut ServerStats,
) {
    if let Some(p) = paced {
        if !p.push(reply, from) {
            st.counters.send_dropped += 1;
        }
        return;
    }
    if let Some(r) = raw {
        match r.send(reply, segment_len, from) {
            Ok(Sent::Frames) => {
                st.counters.datagrams_sent += segments as u64;
                st.counters.bytes_sent += reply.len() as u64;
                return;
            }
            Ok(Sent::Dropped) => {
                st.counters.send_dropped += 1;
                return;
            }
            Ok(Sent::UseSocket) => {}
            Err(e) => {
                tracing::debug!(error = %e, %from, "frame transmit failed");
                st.counters.send_errors += 1;
                return;
            }
        }
    }
    match tx.send(reply, segment_len, from) {
        Ok(()) => {
            st.counters.datagrams_sent += segments as u64;
            st.counters.bytes_sent += reply.len() as u64;
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => st.counters.send_dropped += 1,
        Err(e) => {
            tracing::debug!(error = %e, %from, "send failed");
            st.counters.send_errors += 1;
        }
    }
}

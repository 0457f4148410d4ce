//! The fuzz targets' bodies, here so the stable test suite runs them over the seed
//! corpus too (`fuzz/fuzz_targets/rr_exchange.rs` is the cargo-fuzz wrapper).

use super::client::{Client, ClientConfig};
use super::server::{ResponderConfig, respond};
use super::wire::{HEADER_LEN, MAX_DATAGRAM, MAX_SEGMENTS};

/// Input layout: one mode byte (bits 0-1: segment size none/41/1440/9000; bit 2: echo),
/// then datagrams, each behind a big-endian `u16` length. The first datagram goes to
/// the server as a request; every datagram goes to a client that has one request in
/// flight, and then the server's genuine answer to that request, so the input can race
/// it with forgeries.
pub fn exchange(data: &[u8]) {
    let Some((&mode, mut rest)) = data.split_first() else { return };
    let segment = match mode & 3 {
        0 => None,
        1 => Some(HEADER_LEN + 1),
        2 => Some(1440),
        _ => Some(9000),
    };
    let limit = segment.map_or(MAX_DATAGRAM - HEADER_LEN, |s| MAX_SEGMENTS * (s - HEADER_LEN));
    let echo = mode & 4 != 0;
    let rc = ResponderConfig { segment, echo, max_response: limit.min(16_384) as u32 };
    let mut out = vec![0u8; rc.max_reply_bytes()];
    let cc = ClientConfig {
        request_len: 512,
        response_len: 200,
        echo,
        timeout_ns: 1_000,
        max_retries: 2,
        max_outstanding: 2,
    };
    let mut client = Client::new(cc, u64::from(mode));
    let mut req = [0u8; 512];
    let Ok(Some(n)) = client.start(0, &mut req) else { return };
    let mut first = true;
    let mut now = 1;
    while rest.len() >= 2 {
        let len = usize::from(u16::from_be_bytes([rest[0], rest[1]])).min(rest.len() - 2);
        let d = &rest[2..2 + len];
        rest = &rest[2 + len..];
        if first {
            let _ = respond(&rc, d, &mut out);
            first = false;
        }
        let _ = client.receive(now, d);
        let _ = client.expire(now, &mut req);
        now += 400;
    }
    if let Ok(r) = respond(&rc, &req[..n], &mut out) {
        for seg in out[..r.len].chunks(r.segment_len.max(1)) {
            let _ = client.receive(now, seg);
        }
    }
}

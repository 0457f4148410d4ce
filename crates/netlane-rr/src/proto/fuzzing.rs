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
    let Ok(Some(n)) = client.poll_transmit(0, &mut req) else { return };
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
        let _ = client.handle_datagram(now, d);
        let _ = client.handle_timeout(now, &mut req);
        now += 400;
    }
    if let Ok(r) = respond(&rc, &req[..n], &mut out) {
        for seg in out[..r.len].chunks(r.segment_len.max(1)) {
            let _ = client.handle_datagram(now, seg);
        }
    }
}

/// Input layout for the frame builder: MTU (`u16`), slot size (`u16`), a flags byte
/// (bit 0: IPv6), the IP id (`u32`), then the payload. Every frame must fit its slot,
/// a whole datagram must parse back to itself, fragments must be recognised as such,
/// and the fragments' bytes must add up to the datagram.
pub fn frames(data: &[u8]) {
    use super::frames::{Datagram, Link};
    use super::packet::{ETH_LEN, FrameMeta, ServiceAddr, Skip, parse_frame};
    use std::net::SocketAddr;
    let [m0, m1, s0, s1, flags, i0, i1, i2, i3, payload @ ..] = data else { return };
    let link = Link {
        src_mac: [2, 0, 0, 0, 0, 1],
        dst_mac: [2, 0, 0, 0, 0, 2],
        mtu: usize::from(u16::from_be_bytes([*m0, *m1])),
    };
    let slot = usize::from(u16::from_be_bytes([*s0, *s1]));
    let (src, dst): (SocketAddr, SocketAddr) = if flags & 1 == 0 {
        (SocketAddr::from(([10, 0, 0, 1], 7070)), SocketAddr::from(([10, 0, 0, 2], 40_000)))
    } else {
        (
            SocketAddr::from(([0xfd00, 0, 0, 0, 0, 0, 0, 1], 7070)),
            SocketAddr::from(([0xfd00, 0, 0, 0, 0, 0, 0, 2], 40_000)),
        )
    };
    let Ok(d) = Datagram::new(link, src, dst, payload, u32::from_be_bytes([*i0, *i1, *i2, *i3]), slot) else { return };
    let mut buf = vec![0u8; slot.max(64)];
    let mut carried = 0;
    for i in 0..d.frames() {
        let n = d.write(i, &mut buf);
        assert!(n > ETH_LEN && n <= slot && n == d.frame_len(i), "frame {i}: {n} bytes, slot {slot}");
        let header = ETH_LEN + if src.is_ipv6() { 40 + if d.fragmented() { 8 } else { 0 } } else { 20 };
        carried += n - header;
        match parse_frame(&buf[..n], ServiceAddr::of_socket(dst, true), FrameMeta::UNKNOWN) {
            Ok(u) => assert!(!d.fragmented() && u.payload == payload && u.src == src),
            Err(Skip::Fragment) => assert!(d.fragmented()),
            Err(e) => panic!("frame {i} did not parse: {e:?}"),
        }
    }
    assert_eq!(carried, 8 + payload.len(), "the frames carry the datagram");
    assert_eq!(d.write(d.frames(), &mut buf), 0);
}

/// Input layout for the stream framer: a read size (`u8`, 0 read as 1), then the bytes a
/// peer sent. Read in pieces of that size, every message taken must be whole (its
/// header's length), none longer than the largest, and the framer must always leave room
/// for the next read once its whole messages are taken; a stream that is not messages
/// stops with an error, never a panic.
pub fn stream(data: &[u8]) {
    use super::stream::Framer;
    use super::wire::{HEADER_LEN, MAX_DATAGRAM};
    let [step, bytes @ ..] = data else { return };
    let mut f = Framer::new(MAX_DATAGRAM);
    for mut chunk in bytes.chunks(usize::from(*step).max(1)) {
        while !chunk.is_empty() {
            let space = f.read_space();
            assert!(!space.is_empty(), "no room to read with every whole message taken");
            let n = chunk.len().min(space.len());
            space[..n].copy_from_slice(&chunk[..n]);
            f.filled(n);
            chunk = &chunk[n..];
            loop {
                match f.poll_message() {
                    Ok(Some(m)) => {
                        assert!((HEADER_LEN..=MAX_DATAGRAM).contains(&m.len()));
                        let payload = u32::from_be_bytes([m[24], m[25], m[26], m[27]]) as usize;
                        assert_eq!(m.len(), HEADER_LEN + payload);
                    }
                    Ok(None) => break,
                    Err(_) => return,
                }
            }
        }
    }
}

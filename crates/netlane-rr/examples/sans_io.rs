//! The request/response protocol without sockets: a client's sans-IO core and the
//! server's `respond`, with datagrams handed between them in memory, one lost on the way
//! and sent again when its timeout passes. A driver of your own (io_uring, a DPDK port, a
//! simulator) does what `main` does with its own I/O and clock.
//!
//! `cargo run -p netlane-rr --example sans_io`

use std::error::Error;

use netlane_rr::proto::client::{Client, ClientConfig, Expired, Received};
use netlane_rr::proto::server::{ResponderConfig, respond};
use netlane_rr::proto::wire::MAX_DATAGRAM;

const MS: u64 = 1_000_000;

fn main() -> Result<(), Box<dyn Error>> {
    let cfg = ClientConfig {
        request_len: 64,
        response_len: 4000,
        echo: false,
        timeout_ns: 10 * MS,
        max_retries: 3,
        max_outstanding: 4,
    };
    cfg.validate()?;
    let mut client = Client::new(cfg, 1);
    // Responses split into datagrams of 1400 bytes, as a GSO send would carry them.
    let server = ResponderConfig { segment: Some(1400), ..ResponderConfig::default() };
    let (mut request, mut reply) = (vec![0u8; MAX_DATAGRAM], vec![0u8; server.max_reply_bytes()]);

    // `now` is the driver's clock: nanoseconds, passed in, never read by the core.
    let mut now = 0;
    // Ten requests, at most four in flight, each answered a millisecond later; the
    // network loses the first one. Time only moves forward.
    for i in 0..10 {
        let Some(n) = client.poll_transmit(now, &mut request)? else { break };
        now += MS;
        if i > 0 {
            deliver(&mut client, &server, &request[..n], &mut reply, now)?;
        }
    }
    // By now the lost request's 10 ms timeout has passed: the core writes it again.
    now += MS;
    while let Some(e) = client.handle_timeout(now, &mut request)? {
        if let Expired::Resend(n) = e {
            deliver(&mut client, &server, &request[..n], &mut reply, now + MS)?;
        }
    }
    let s = client.stats();
    println!(
        "{} requests, {} responses, {} retransmits, {} lost, {} in flight",
        s.requests,
        s.responses,
        s.retransmits,
        s.lost,
        client.in_flight()
    );
    if s.responses != s.requests || client.in_flight() != 0 {
        return Err("not every request was answered".into());
    }
    Ok(())
}

/// The server answers `request`; its datagrams reach the client at `at`.
fn deliver(
    client: &mut Client,
    server: &ResponderConfig,
    request: &[u8],
    reply: &mut [u8],
    at: u64,
) -> Result<(), Box<dyn Error>> {
    let r = respond(server, request, reply)?;
    for datagram in reply[..r.len].chunks(r.segment_len) {
        if let Received::Completed { latency_ns, retries } = client.handle_datagram(at, datagram) {
            println!(
                "a {}-byte response in {} datagrams after {} ms, {retries} retries",
                r.len,
                r.segments,
                latency_ns / MS
            );
        }
    }
    Ok(())
}

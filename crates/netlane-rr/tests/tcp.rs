//! The TCP comparator over loopback: the server's answers as messages over a connection
//! per client, the closed-loop clients reading them, and peers that send what is not a
//! stream of messages, too much, or too many connections.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use netlane_rr::clients::{self, ClientsConfig, ClientsError, Transport};
use netlane_rr::proto::wire::{self, HEADER_LEN, Header, Kind};
use netlane_rr::server::ServerConfig;

mod common;
use common::{client, population, with_server};

fn tcp_server(listen: &str) -> ServerConfig {
    ServerConfig { listen: listen.parse().unwrap(), transport: Transport::Tcp, ..ServerConfig::default() }
}

fn tcp_clients(addr: SocketAddr, n: usize, request: usize, response: usize) -> ClientsConfig {
    ClientsConfig { transport: Transport::Tcp, ..population(addr, n, client(request, response)) }
}

/// A request asking for `response_len` payload bytes, as its bytes.
fn request(id: u64, response_len: u32) -> Vec<u8> {
    let mut out = vec![0u8; 256];
    let n = wire::encode(&Header::request(id, 1, 256 - HEADER_LEN as u32, response_len), &mut out).unwrap();
    out.truncate(n);
    out
}

/// Reads one whole message from `s` (its length from its header).
fn read_message(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut head = vec![0u8; HEADER_LEN];
    s.read_exact(&mut head)?;
    let payload = u32::from_be_bytes([head[24], head[25], head[26], head[27]]) as usize;
    let mut rest = vec![0u8; payload];
    s.read_exact(&mut rest)?;
    head.extend(rest);
    Ok(head)
}

#[test]
fn every_tcp_client_is_answered_over_ipv4_and_ipv6_small_and_large() {
    for listen in ["127.0.0.1:0", "[::1]:0"] {
        for (n, response) in [(32, 8192), (4, 60_000)] {
            let (r, st) = with_server(tcp_server(listen), |addr| {
                clients::run(&tcp_clients(addr, n, 512, response), &AtomicBool::new(false)).unwrap()
            });
            assert!(r.responses > 100, "{listen} {response}: {r:?}");
            let errors = (r.corrupt, r.mismatched, r.lost, r.retransmits, r.send_errors, r.recv_errors);
            assert_eq!(errors, (0, 0, 0, 0, 0, 0), "{r:?}");
            assert!(r.latency_ns.count == r.responses && r.latency_ns.p50 > 0, "{r:?}");
            let c = &st.counters;
            assert_eq!((c.connections, c.connections_refused), (n as u64, 0), "{st:?}");
            assert!(c.responses >= r.responses && c.frames == c.responses, "{st:?}");
            assert_eq!(c.refused_malformed + c.refused_too_large + c.send_errors, 0, "{st:?}");
            assert_eq!(st.path, "tcp");
        }
    }
}

#[test]
fn a_request_split_anywhere_is_answered_and_one_asking_too_much_is_refused_by_name() {
    let cfg = ServerConfig { max_connections: 4, ..tcp_server("127.0.0.1:0") };
    let (_, st) = with_server(cfg, |addr| {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // Byte by byte: the server waits for the whole message.
        for b in request(1, 1000) {
            s.write_all(&[b]).unwrap();
        }
        let (h, payload) = wire::decode(&read_message(&mut s).unwrap()).map(|(h, p)| (h, p.len())).unwrap();
        assert_eq!((h.kind, h.id, payload), (Kind::Response, 1, 1000));
        // Two at once: two answers, in order.
        s.write_all(&[request(2, 10), request(3, 20)].concat()).unwrap();
        for id in [2, 3] {
            assert_eq!(wire::decode(&read_message(&mut s).unwrap()).unwrap().0.id, id);
        }
        let asked = clients::run(&tcp_clients(addr, 1, 512, 2_000_000), &AtomicBool::new(false));
        assert!(
            matches!(asked, Err(ClientsError::Refused { limit, .. }) if limit as usize == wire::MAX_DATAGRAM - HEADER_LEN)
        );
    });
    assert_eq!((st.counters.responses, st.counters.refused_too_large), (3, 1), "{st:?}");
}

#[test]
fn a_stream_of_junk_a_header_announcing_too_much_and_a_connection_too_many_are_closed() {
    let cfg = ServerConfig { max_connections: 2, ..tcp_server("127.0.0.1:0") };
    let (_, st) = with_server(cfg, |addr| {
        let closed = |s: &mut TcpStream| {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut b = [0u8; 1];
            matches!(s.read(&mut b), Ok(0) | Err(_))
        };
        let mut junk = TcpStream::connect(addr).unwrap();
        junk.write_all(&[0x55; 64]).unwrap();
        assert!(closed(&mut junk), "junk kept open");
        let mut long = TcpStream::connect(addr).unwrap();
        let mut head = request(1, 10);
        head[24..28].copy_from_slice(&u32::MAX.to_be_bytes());
        long.write_all(&head[..HEADER_LEN]).unwrap();
        assert!(closed(&mut long), "an announced 4 GiB message kept open");
        // Two held open: the third is closed as it comes.
        let _a = TcpStream::connect(addr).unwrap();
        let _b = TcpStream::connect(addr).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let mut c = TcpStream::connect(addr).unwrap();
        assert!(closed(&mut c), "a third connection kept open");
    });
    assert_eq!(st.counters.refused_malformed, 2, "{st:?}");
    assert_eq!((st.counters.connections, st.counters.connections_refused), (4, 1), "{st:?}");
}

#[test]
fn tcp_options_the_server_cannot_honour_are_refused_before_it_starts() {
    let bad = [
        ServerConfig { max_connections: 0, ..tcp_server("127.0.0.1:0") },
        ServerConfig { path: netlane_rr::server::PathKind::TpacketV3, ..tcp_server("127.0.0.1:0") },
    ];
    for cfg in bad {
        let e = netlane_rr::server::Server::start(cfg).expect_err("refused").to_string();
        assert!(e.starts_with("tcp: "), "{e}");
    }
    let open = ClientsConfig {
        load: clients::Load::Open { rate: 1000.0 },
        ..tcp_clients("127.0.0.1:9".parse().unwrap(), 1, 512, 1024)
    };
    let e = clients::run(&open, &AtomicBool::new(false)).unwrap_err().to_string();
    assert!(e.contains("closed loop"), "{e}");
}

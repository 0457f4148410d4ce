//! The cache server's memory against a client that sends requests and never reads the
//! replies. A test binary of its own: it measures the process's resident memory, which
//! other tests running beside it in one process would grow too.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use netlane_kv::proto::Limits;
use netlane_kv::server::{Server, ServerConfig};
use netlane_kv::store::StoreConfig;

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn a_client_that_does_not_read_cannot_grow_the_servers_memory() {
    let cfg = ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        threads: 2,
        store: StoreConfig::new(16 << 20, 128 << 10, 4),
        limits: Limits { output_pause: 64 << 10, ..Limits::default() },
        ..ServerConfig::default()
    };
    let server = Server::start(cfg).unwrap();
    let mut s = TcpStream::connect(server.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let value = vec![b'v'; 100_000];
    s.write_all(format!("set big 0 0 {}\r\n", value.len()).as_bytes()).unwrap();
    s.write_all(&value).unwrap();
    s.write_all(b"\r\n").unwrap();
    let mut reply = [0u8; 8];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"STORED\r\n");
    let before = rss_kib();
    // Gets of 100 KB, never a reply read, for two seconds: once the server's output is
    // paused it stops reading, the socket buffers fill, and the writes stop being taken.
    s.set_nonblocking(true).unwrap();
    let req = b"get big\r\n".repeat(1000);
    let mut accepted = 0usize;
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until && accepted < 200 << 20 {
        match s.write(&req) {
            Ok(n) => accepted += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => panic!("write: {e}"),
        }
    }
    let grown = rss_kib().saturating_sub(before);
    // Loopback socket buffers take a few MB; an unbounded server takes all 200 MB.
    assert!(accepted < 32 << 20, "the server kept reading requests it could not answer: {accepted} bytes");
    assert!(grown < 32 << 10, "server memory grew by {grown} KiB for one client");
    server.stop();
}

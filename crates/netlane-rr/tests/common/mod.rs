//! What the integration tests share: the workload, a server run beside a closure, and a
//! child process that is killed and reaped when the test ends (or fails).

#![allow(dead_code)] // each test file uses its own part of this

pub mod veth;

use std::net::SocketAddr;
use std::process::Child;
use std::sync::Mutex;
use std::time::Duration;

use netlane::serve::Running;
use netlane_rr::clients::{ClientsConfig, Load};
use netlane_rr::proto::client::ClientConfig;
use netlane_rr::proto::wire::HEADER_LEN;
use netlane_rr::server::{self, PathKind, ServerConfig, ServerStats};

/// A closed-loop client sending `request`-byte requests for `response`-byte responses
/// (headers included), 200 ms timeout, 3 retries.
pub fn client(request: usize, response: usize) -> ClientConfig {
    ClientConfig {
        request_len: request,
        response_len: (response - HEADER_LEN) as u32,
        echo: false,
        timeout_ns: 200_000_000,
        max_retries: 3,
        max_outstanding: 1,
    }
}

/// `clients` such clients on one thread: 100 ms warm-up, 500 ms measured.
pub fn population(server: SocketAddr, clients: usize, c: ClientConfig) -> ClientsConfig {
    ClientsConfig {
        server,
        clients,
        threads: 1,
        cpus: None,
        client: c,
        load: Load::Closed { think: Duration::ZERO },
        ramp: Duration::from_millis(100),
        duration: Duration::from_millis(500),
        gro: false,
        seed: 0,
        transport: netlane_rr::clients::Transport::Udp,
    }
}

/// Loopback has one queue, which takes one AF_XDP socket: AF_XDP servers take turns.
static LO_QUEUE: Mutex<()> = Mutex::new(());

/// Runs a server on `cfg` in a thread, hands its address to `f`, stops it, returns both.
pub fn with_server<T>(cfg: ServerConfig, f: impl FnOnce(SocketAddr) -> T) -> (T, ServerStats) {
    let _turn = (cfg.path == PathKind::AfXdp).then(|| LO_QUEUE.lock().unwrap_or_else(|p| p.into_inner()));
    let server = server::Server::start(cfg).unwrap_or_else(|e| panic!("the server did not come up: {e}"));
    let out = f(server.local_addr());
    (out, server.stop().expect("the server ran"))
}

/// A child process, killed and reaped on drop.
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

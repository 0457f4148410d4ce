//! Two namespaces joined by a veth, a server in one and clients in the other, and the
//! client namespace's counters: what the veth tests share.

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
use std::time::Duration;

use netlane::serve::Stop;
use netlane::topology::{LinkConfig, RxTuning, TwoHosts};
use netlane_rr::clients::{self, ClientsConfig, ClientsReport};
use netlane_rr::server::{self, PathKind, ServerConfig, ServerStats};

/// Two namespaces joined by a veth of `mtu`, the rx end's NAPI threaded.
pub fn hosts(label: &str, mtu: u32) -> TwoHosts {
    TwoHosts::create(label, LinkConfig { mtu, queues: 1, rx: RxTuning::threaded_napi() }).expect("two namespaces")
}

/// Runs the server in the "rx" namespace and `clients` in the "tx" one.
pub fn exchange(
    h: &TwoHosts,
    cfg: ServerConfig,
    p: impl FnOnce(SocketAddr) -> ClientsConfig,
) -> (ClientsReport, ServerStats) {
    let stop = Stop::new().unwrap();
    let (tx, rx) = mpsc::channel();
    let s = stop.clone();
    let server = h.rx.spawn("rr-server", move || server::serve(&cfg, &s, |a| tx.send(a).unwrap())).unwrap();
    let addr = match rx.recv_timeout(Duration::from_secs(5)) {
        Ok(a) => a,
        Err(_) => panic!("the server did not come up: {:?}", server.join()),
    };
    let pop = p(addr);
    let r = h.tx.run(move || clients::run(&pop, &AtomicBool::new(false))).unwrap().unwrap();
    stop.stop();
    (r, server.join().unwrap().expect("the server ran"))
}

/// A counter of the client namespace's /proc/net/snmp (`table` "Ip:", "Udp:", ...).
pub fn snmp(h: &TwoHosts, table: &str, name: &str) -> u64 {
    let snmp = h.tx.read_proc_net("snmp").unwrap();
    let mut lines = snmp.lines().filter(|l| l.starts_with(table));
    let (names, values) = (lines.next().unwrap(), lines.next().unwrap());
    let i = names.split_whitespace().position(|n| n == name).unwrap();
    values.split_whitespace().nth(i).unwrap().parse().unwrap()
}

/// IP reassemblies completed in the client namespace.
pub fn reassembled(h: &TwoHosts) -> u64 {
    snmp(h, "Ip:", "ReasmOKs")
}

/// UDP datagrams the client namespace dropped for a bad checksum (IPv4 and IPv6).
pub fn checksum_errors(h: &TwoHosts) -> u64 {
    let v6 = h.tx.read_proc_net("snmp6").unwrap();
    let v6: u64 = v6.lines().find_map(|l| l.strip_prefix("Udp6InCsumErrors")).map_or(0, |v| v.trim().parse().unwrap());
    snmp(h, "Udp:", "InCsumErrors") + v6
}

/// A server of `path` on the rx namespace's address (IPv6 or 4), any port.
pub fn server_cfg(h: &TwoHosts, path: PathKind, ipv6: bool) -> ServerConfig {
    ServerConfig { listen: SocketAddr::new(h.rx_addr(ipv6), 0), path, ..ServerConfig::default() }
}

/// Many responses, none corrupt, mismatched or lost.
pub fn assert_clean(what: &str, r: &ClientsReport) {
    assert!(r.responses > 50, "{what}: too few responses: {r:?}");
    assert_eq!((r.corrupt, r.mismatched, r.lost), (0, 0, 0), "{what}: {r:?}");
}

//! The UDP datagram paths across a real veth pair between namespaces (needs root):
//! GSO, GRO, zerocopy, the GSO fallback, pacing. IPv4 and IPv6.

use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::time::Duration;

use netlane::topology::{LinkConfig, RxTuning, TwoHosts};
use netlane::udp::{
    Batching, GsoMode, Receiver, ReceiverConfig, RxBatching, Sender, SenderConfig, TxSyscalls, UdpSocket,
};
use socket2::SockAddr;

fn hosts(label: &str, rx: RxTuning) -> TwoHosts {
    TwoHosts::create(label, LinkConfig { rx, ..LinkConfig::default() }).expect("build topology")
}

/// A receiving socket in the rx namespace and a connected sending socket in tx.
fn sockets(h: &TwoHosts, ipv6: bool, gro: bool) -> (UdpSocket, UdpSocket) {
    let bind = SocketAddr::new(h.rx_addr(ipv6), 0);
    let rx =
        h.rx.run(move || {
            let s = UdpSocket::bind(bind).unwrap();
            s.set_recv_buffer(32 << 20).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
            if gro {
                s.enable_gro().unwrap();
            }
            s
        })
        .unwrap();
    let dst = SocketAddr::new(h.rx_addr(ipv6), rx.local_addr().unwrap().port());
    let tx = h.tx.run(move || UdpSocket::connect_to(dst).unwrap()).unwrap();
    (tx, rx)
}

/// Reads datagrams until `n` arrived or the socket stays quiet for its timeout.
fn collect(rx: &UdpSocket, rcv: &mut Receiver, n: usize) -> Vec<(Option<u16>, Vec<u8>)> {
    let mut got = Vec::new();
    while got.len() < n {
        match rcv.recv(rx.as_fd(), |d| got.push((d.stride, d.data.to_vec()))) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("receive: {e}"),
        }
    }
    got
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(13).wrapping_add(salt)).collect()
}

#[test]
fn gso_sends_arrive_as_the_exact_datagrams() {
    if !netlane_testkit::privileged("gso_sends_arrive_as_the_exact_datagrams") {
        return;
    }
    let h = hosts("gso-exact", RxTuning::threaded_napi());
    for ipv6 in [false, true] {
        for mode in [GsoMode::Cmsg, GsoMode::Sockopt] {
            let (tx, rx) = sockets(&h, ipv6, false);
            let mut sender = Sender::new(tx, SenderConfig { gso: mode, ..SenderConfig::plain(ipv6) });
            // Full trains, a short last segment, a train below the limit, one segment.
            let seg = if ipv6 { 1200 } else { 1400 };
            let bufs = [pattern(46 * seg, 1), pattern(10 * seg + 333, 2), pattern(3 * seg, 3), pattern(seg, 4)];
            let mut want = Vec::new();
            for b in &bufs {
                let r = sender.send(b, seg, None).unwrap();
                assert_eq!(r.datagrams as usize, b.len().div_ceil(seg));
                want.extend(b.chunks(seg).map(<[u8]>::to_vec));
            }
            assert_eq!(sender.stats().gso_sends, 3, "the single-segment send goes without GSO");
            assert_eq!(sender.stats().gso_fallbacks, 0);
            let mut rcv = Receiver::new(ReceiverConfig::new(RxBatching::Mmsg(32)));
            let got: Vec<Vec<u8>> = collect(&rx, &mut rcv, want.len()).into_iter().map(|g| g.1).collect();
            assert_eq!(got.len(), want.len(), "ipv6={ipv6} {mode:?}: datagram count");
            assert!(got == want, "ipv6={ipv6} {mode:?}: sizes or bytes differ");
        }
    }
}

#[test]
fn gro_reads_split_back_into_the_exact_datagrams() {
    if !netlane_testkit::privileged("gro_reads_split_back_into_the_exact_datagrams") {
        return;
    }
    let h = hosts("gro-exact", RxTuning::threaded_napi());
    for ipv6 in [false, true] {
        // Individually sent datagrams (sendmmsg bursts): GRO in the receiver's NAPI
        // coalesces them; the UDP_GRO socket gets trains and must split them exactly.
        // Coalescing depends on timing, so try a few rounds until some happened.
        let mut coalesced = false;
        for round in 0..8u8 {
            let (tx, rx) = sockets(&h, ipv6, true);
            let mut sender = Sender::new(tx, SenderConfig { batching: Batching::Mmsg, ..SenderConfig::plain(ipv6) });
            let mut want = Vec::new();
            for burst in 0..20u8 {
                let b = pattern(64 * 1000, round.wrapping_mul(31).wrapping_add(burst));
                sender.send(&b, 1000, None).unwrap();
                want.extend(b.chunks(1000).map(<[u8]>::to_vec));
            }
            let mut rcv = Receiver::new(ReceiverConfig::new(RxBatching::Mmsg(8)));
            let got = collect(&rx, &mut rcv, want.len());
            let datagrams: Vec<Vec<u8>> = got.iter().map(|g| g.1.clone()).collect();
            assert_eq!(datagrams.len(), want.len(), "ipv6={ipv6}: every datagram arrives");
            assert!(datagrams == want, "ipv6={ipv6}: GRO split changed sizes, bytes or order");
            if rcv.stats().gro_reads > 0 && rcv.stats().gro_datagrams > rcv.stats().gro_reads {
                coalesced = true;
                assert!(got.iter().all(|g| g.0.is_none_or(|s| s == 1000)), "stride is the datagram size");
                break;
            }
        }
        assert!(coalesced, "ipv6={ipv6}: GRO never coalesced, so the split was not exercised");
    }
}

#[test]
fn gso_train_to_a_gro_socket_is_split_exactly() {
    if !netlane_testkit::privileged("gso_train_to_a_gro_socket_is_split_exactly") {
        return;
    }
    let h = hosts("gso-gro", RxTuning::threaded_napi());
    for ipv6 in [false, true] {
        let (tx, rx) = sockets(&h, ipv6, true);
        let mut sender = Sender::new(tx, SenderConfig { gso: GsoMode::Cmsg, ..SenderConfig::plain(ipv6) });
        let b = pattern(30 * 1100 + 7, 9);
        sender.send(&b, 1100, None).unwrap();
        let mut rcv = Receiver::new(ReceiverConfig::new(RxBatching::Mmsg(8)));
        let got = collect(&rx, &mut rcv, 31);
        let want: Vec<Vec<u8>> = b.chunks(1100).map(<[u8]>::to_vec).collect();
        assert!(got.iter().map(|g| &g.1).eq(want.iter()), "ipv6={ipv6}");
        assert_eq!(rcv.stats().gro_reads, 1, "ipv6={ipv6}: the train crossed veth whole");
    }
}

/// Wraps a real socket and fails the first `fail` GSO sends with `errno`, as a device
/// without checksum offload does (EIO).
struct FailingGso {
    sock: UdpSocket,
    fail: usize,
    errno: i32,
}

impl TxSyscalls for FailingGso {
    fn sendmsg(
        &mut self,
        dst: Option<&SockAddr>,
        iov: &[IoSlice<'_>],
        control: &[u8],
        flags: i32,
    ) -> io::Result<usize> {
        let is_gso = has_udp_segment_cmsg(control) || netlane::sockopt::udp_segment(self.sock.as_fd())? != 0;
        let len: usize = iov.iter().map(|s| s.len()).sum();
        if is_gso && self.fail > 0 && len > 1400 {
            self.fail -= 1;
            return Err(io::Error::from_raw_os_error(self.errno));
        }
        self.sock.sendmsg(dst, iov, control, flags)
    }
    fn sendmmsg(&mut self, dst: Option<&SockAddr>, d: &[IoSlice<'_>], control: &[u8], flags: i32) -> io::Result<usize> {
        self.sock.sendmmsg(dst, d, control, flags)
    }
    fn set_udp_segment(&mut self, gso_size: u16) -> io::Result<()> {
        self.sock.set_udp_segment(gso_size)
    }
}

fn has_udp_segment_cmsg(control: &[u8]) -> bool {
    // UDP_SEGMENT is SOL_UDP (17) / 103; read the first header without extra crates.
    control.len() >= 16
        && i32::from_ne_bytes(control[8..12].try_into().unwrap()) == libc::SOL_UDP
        && i32::from_ne_bytes(control[12..16].try_into().unwrap()) == libc::UDP_SEGMENT
}

#[test]
fn gso_fallback_loses_nothing() {
    if !netlane_testkit::privileged("gso_fallback_loses_nothing") {
        return;
    }
    let h = hosts("gso-fallback", RxTuning::threaded_napi());
    for ipv6 in [false, true] {
        for (mode, batching) in [(GsoMode::Cmsg, Batching::Single), (GsoMode::Sockopt, Batching::Mmsg)] {
            let (tx, rx) = sockets(&h, ipv6, false);
            let io = FailingGso { sock: tx, fail: 1, errno: libc::EIO };
            let mut sender = Sender::new(io, SenderConfig { gso: mode, batching, ..SenderConfig::plain(ipv6) });
            let mut want = Vec::new();
            for k in 0..5u8 {
                let b = pattern(20 * 1200 + 100, k);
                sender.send(&b, 1200, None).unwrap();
                want.extend(b.chunks(1200).map(<[u8]>::to_vec));
            }
            let st = sender.stats();
            assert_eq!(st.gso_fallbacks, 1);
            assert_eq!(st.gso_resent_datagrams, 21);
            assert!(!sender.gso_active());
            let mut rcv = Receiver::new(ReceiverConfig::new(RxBatching::Mmsg(32)));
            let got: Vec<Vec<u8>> = collect(&rx, &mut rcv, want.len()).into_iter().map(|g| g.1).collect();
            assert_eq!(got.len(), want.len(), "ipv6={ipv6} {mode:?}: datagrams lost in the fallback");
            assert!(got == want, "ipv6={ipv6} {mode:?}: content or order changed");
        }
    }
}

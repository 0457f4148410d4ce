//! The UDP datagram paths across a real veth pair between namespaces (needs root):
//! GSO, GRO, zerocopy, the GSO fallback, pacing. IPv4 and IPv6.

mod common;

use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::time::Duration;

use netlane::bulk::{self, BulkRun, Endpoints, Pacing, RxSpec, TxSource, TxSpec, Verify};
use netlane::pace::Quantum;
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
    if !common::privileged("gso_sends_arrive_as_the_exact_datagrams") {
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
    if !common::privileged("gro_reads_split_back_into_the_exact_datagrams") {
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
    if !common::privileged("gso_train_to_a_gro_socket_is_split_exactly") {
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
    if !common::privileged("gso_fallback_loses_nothing") {
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

fn bulk_run(tx: TxSpec, rx: RxSpec, ipv6: bool) -> BulkRun {
    BulkRun { tx: TxSource::Netlane(tx), rx, ipv6, run_id: 7 }
}

#[test]
fn zerocopy_sends_each_complete_exactly_once() {
    if !common::privileged("zerocopy_sends_each_complete_exactly_once") {
        return;
    }
    let h = hosts("zc", RxTuning::threaded_napi());
    for ipv6 in [false, true] {
        let tx = TxSpec {
            gso: GsoMode::Cmsg,
            zerocopy: true,
            segments_per_send: 40,
            duration: Duration::from_millis(400),
            ..TxSpec::udp()
        };
        let r = bulk::run(Endpoints::Veth(&h), &bulk_run(tx, RxSpec { verify: Verify::Full, ..RxSpec::udp() }, ipv6))
            .unwrap();
        let z = r.tx.zerocopy.expect("zerocopy stats");
        assert!(z.sends > 100, "ipv6={ipv6}: only {} zerocopy sends", z.sends);
        assert_eq!(z.completed, z.sends, "ipv6={ipv6}: every send completes");
        assert_eq!(z.unexpected, 0, "ipv6={ipv6}: no completion twice or for an unknown send");
        assert!(z.copied <= z.completed);
        assert_eq!(r.rx.integrity.corrupt, 0, "buffers were not reused before completion");
        assert_eq!(r.rx.integrity.duplicates, 0);
    }
    // TCP zerocopy too.
    let tx = TxSpec { zerocopy: true, duration: Duration::from_millis(300), ..TxSpec::tcp() };
    let r =
        bulk::run(Endpoints::Veth(&h), &bulk_run(tx, RxSpec { verify: Verify::Full, ..RxSpec::tcp() }, false)).unwrap();
    let z = r.tx.zerocopy.expect("zerocopy stats");
    assert!(z.sends > 10);
    assert_eq!((z.completed, z.unexpected), (z.sends, 0));
    assert_eq!(r.rx.bytes, r.tx.bytes, "TCP delivers every byte");
    assert_eq!(r.rx.integrity.corrupt, 0);
}

#[test]
fn pacer_holds_a_low_rate() {
    if !common::privileged("pacer_holds_a_low_rate") {
        return;
    }
    let h = hosts("pace", RxTuning::threaded_napi());
    let rate = 20_000_000;
    let tx = TxSpec {
        gso: GsoMode::Cmsg,
        segments_per_send: 20,
        pacing: Some(Pacing { rate, quantum: Quantum::Fixed(2_000_000) }),
        duration: Duration::from_secs(1),
        ..TxSpec::udp()
    };
    let r = bulk::run(Endpoints::Veth(&h), &bulk_run(tx, RxSpec::udp(), false)).unwrap();
    let p = r.tx.pacing.expect("pacing report");
    assert!((p.accuracy - 1.0).abs() < 0.2, "sender achieved {} of the target", p.accuracy);
    let rx_rate = r.rx.bytes as f64 / r.tx.seconds;
    assert!((rx_rate / rate as f64 - 1.0).abs() < 0.2, "receiver saw {rx_rate} B/s for a {rate} B/s target");
    assert!(r.loss < 0.01, "loss {}", r.loss);
    assert!(r.tx.path.iter().any(|p| p.contains("user-space pacer")), "{:?}", r.tx.path);
}

#[test]
fn every_mode_delivers_verified_data_over_veth() {
    if !common::privileged("every_mode_delivers_verified_data_over_veth") {
        return;
    }
    let h = hosts("modes", RxTuning::threaded_napi());
    let d = Duration::from_millis(250);
    // Paced so that nothing is lost: this checks integrity, not speed.
    let pace = Some(Pacing { rate: 50_000_000, quantum: Quantum::Auto });
    let cases = [
        (
            TxSpec { duration: d, pacing: pace, ..TxSpec::udp() },
            RxSpec { batching: RxBatching::Single, ..RxSpec::udp() },
        ),
        (
            TxSpec { duration: d, batching: Batching::Mmsg, segments_per_send: 32, pacing: pace, ..TxSpec::udp() },
            RxSpec::udp(),
        ),
        (
            TxSpec { duration: d, gso: GsoMode::Sockopt, segments_per_send: 46, pacing: pace, ..TxSpec::udp() },
            RxSpec::udp(),
        ),
        (
            TxSpec { duration: d, gso: GsoMode::Cmsg, segments_per_send: 46, pacing: pace, ..TxSpec::udp() },
            RxSpec { gro: true, batching: RxBatching::Mmsg(8), ..RxSpec::udp() },
        ),
    ];
    for ipv6 in [false, true] {
        for (tx, rx) in &cases {
            let r = bulk::run(Endpoints::Veth(&h), &bulk_run(tx.clone(), RxSpec { verify: Verify::Full, ..*rx }, ipv6))
                .unwrap();
            let i = r.rx.integrity;
            assert!(r.tx.datagrams > 0);
            assert_eq!(i.unique, r.tx.datagrams, "ipv6={ipv6} {:?}: lost datagrams", r.tx.path);
            assert_eq!((i.corrupt, i.duplicates, i.foreign, i.bad_length), (0, 0, 0, 0), "{:?}", r.tx.path);
        }
    }
}

#[test]
fn loopback_runs_without_namespaces_and_counts_syscalls() {
    // No root needed: this one always runs.
    let tx = TxSpec {
        batching: Batching::Mmsg,
        segments_per_send: 46,
        duration: Duration::from_millis(200),
        pacing: Some(Pacing { rate: 30_000_000, quantum: Quantum::Auto }),
        ..TxSpec::udp()
    };
    let r =
        bulk::run(Endpoints::Loopback, &bulk_run(tx, RxSpec { verify: Verify::Full, ..RxSpec::udp() }, false)).unwrap();
    assert_eq!(r.tx.gso_fallbacks, 0);
    // Every release is a whole number of 46-datagram sendmmsg calls, except partial
    // tails: never more than one call per 46 datagrams plus one per release.
    let releases = r.tx.pacing.unwrap().stats.releases as f64;
    let calls = r.tx.syscalls as f64;
    assert!(calls <= r.tx.datagrams as f64 / 46.0 + releases + 1.0, "{calls} calls for {} datagrams", r.tx.datagrams);
    assert_eq!(r.rx.integrity.unique, r.tx.datagrams);
    assert_eq!(r.rx.integrity.corrupt, 0);
}

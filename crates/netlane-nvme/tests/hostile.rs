//! Hosts that try to exhaust the target, over loopback: more commands than the queue
//! has entries, a flood of writes that each want an R2T, responses never read,
//! connections that never finish setting up, more connections than allowed; and a slow
//! Flush on one connection while another keeps reading. Each prints the target's
//! peak memory growth (VmHWM, reset before the attack); the bounds asserted are loose
//! (tens of MiB) against what an unbounded target grows by (hundreds of MiB to GiB).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use netlane_nvme::host::{ConnectOptions, Controller};
use netlane_nvme::proto::cmd::{PSDT_SGL, SGL_TRANSPORT, SglDesc, Sqe, nvm};
use netlane_nvme::proto::namespace::{MemNamespace, Namespace};
use netlane_nvme::proto::pdu::TxConfig;
use netlane_nvme::proto::target::{Subsystem, TargetConfig};
use netlane_nvme::target::{TargetOptions, TargetServer};

const NQN: &str = "nqn.2026-11.io.netlane:hostile";
const MIB: u64 = 1 << 20;

/// One attack at a time: the memory figures are the whole process's.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn status_kib(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"))
}

/// Peak resident memory since the last reset, measured from a reset: resets VmHWM to
/// the current RSS (`/proc/self/clear_refs` 5) and returns that RSS.
struct Peak(u64);
impl Peak {
    fn start() -> Peak {
        std::fs::write("/proc/self/clear_refs", "5").unwrap();
        Peak(status_kib("VmRSS:") * 1024)
    }
    /// Growth of the peak over the starting RSS, in bytes.
    fn growth(&self) -> u64 {
        (status_kib("VmHWM:") * 1024).saturating_sub(self.0)
    }
}

fn start(cfg: TargetConfig, opts: impl FnOnce(&mut TargetOptions), ns: Arc<dyn Namespace>) -> TargetServer {
    let subsys = Subsystem::new(TargetConfig { nqn: NQN.into(), ..cfg }, vec![ns]).unwrap();
    let mut o = TargetOptions::new("127.0.0.1:0".parse().unwrap());
    opts(&mut o);
    TargetServer::start(subsys, &o).unwrap()
}

fn mem_ns() -> Arc<dyn Namespace> {
    let ns = MemNamespace::new(64 * MIB, 4096).unwrap();
    // Touch every page so reads copy real memory and the namespace's own pages are
    // resident before any measurement starts.
    ns.write_zeroes(0, 64 * MIB).unwrap();
    for off in (0..64 * MIB).step_by(4096) {
        ns.write(off, &[1]).unwrap();
    }
    Arc::new(ns)
}

fn controller(addr: SocketAddr) -> Controller {
    let mut o = ConnectOptions::new(addr, NQN);
    o.kato_ms = 0;
    o.timeout = Duration::from_secs(10);
    Controller::connect(&o, 2).unwrap()
}

/// An I/O queue of `depth` entries (SQSIZE depth - 1) as a raw socket.
fn raw_queue(ctrl: &Controller, depth: u16) -> TcpStream {
    let (sock, _q, rest) = ctrl.connect_io_queue(1, depth).unwrap().into_parts();
    assert!(rest.is_empty());
    sock
}

/// A command moving `bytes` by the transport (C2HData for a read, R2T for a write).
fn cmd(op: u8, cid: u16, slba: u64, bytes: u32) -> Vec<u8> {
    let mut s = Sqe::default();
    s.set_opcode(op);
    s.set_flags(PSDT_SGL);
    s.set_cid(cid);
    s.set_nsid(1);
    s.set_lba_range(slba, bytes / 4096);
    s.set_sgl(SglDesc { addr: 0, len: bytes, id: SGL_TRANSPORT });
    let mut out = Vec::new();
    TxConfig::default().capsule_cmd(&mut out, &s, &[]);
    out
}

/// Writes as much of `bytes` as the socket takes within `time` (the target may stop
/// reading, or close).
fn push(sock: &mut TcpStream, bytes: &[u8], time: Duration) -> usize {
    sock.set_write_timeout(Some(Duration::from_millis(200))).unwrap();
    let deadline = Instant::now() + time;
    let mut sent = 0;
    while sent < bytes.len() && Instant::now() < deadline {
        match sock.write(&bytes[sent..]) {
            Ok(0) => break,
            Ok(n) => sent += n,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    sent
}

/// Reads until the target closes (or `time` passes); returns the PDU types received, in
/// order, and whether the connection was closed.
fn drain(sock: &mut TcpStream, time: Duration) -> (Vec<u8>, bool) {
    let (types, closed, _) = drain_counting(sock, time);
    (types, closed)
}

/// [`drain`], also counting the bytes received.
fn drain_counting(sock: &mut TcpStream, time: Duration) -> (Vec<u8>, bool, u64) {
    let deadline = Instant::now() + time;
    let (mut got, mut types, mut buf) = (Vec::new(), Vec::new(), vec![0u8; 1 << 16]);
    let (mut closed, mut bytes) = (false, 0u64);
    while let Some(left) = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) {
        sock.set_read_timeout(Some(left.min(Duration::from_millis(50)))).unwrap();
        match sock.read(&mut buf) {
            Ok(0) => {
                closed = true;
                break;
            }
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                bytes += n as u64;
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(_) => {
                closed = true;
                break;
            }
        }
        // Keep only whole PDUs' types; drop their bytes.
        let mut at = 0;
        while got.len() >= at + 8 {
            let plen = u32::from_le_bytes([got[at + 4], got[at + 5], got[at + 6], got[at + 7]]) as usize;
            if plen < 8 || got.len() < at + plen {
                break;
            }
            types.push(got[at]);
            at += plen;
        }
        got.drain(..at);
    }
    (types, closed, bytes)
}

const C2H_TERM_REQ: u8 = 0x03;
const CAPSULE_RESP: u8 = 0x05;
const C2H_DATA: u8 = 0x07;
const R2T: u8 = 0x09;

/// What a flood of commands on a fresh queue did to the target.
struct Flood {
    server: TargetServer,
    /// Commands the socket took.
    sent: usize,
    /// Peak memory growth while the commands sat in the target.
    grown: u64,
    /// PDU types the target sent back, in order, and whether it closed the queue.
    types: Vec<u8>,
    closed: bool,
}

/// Connects a queue of `depth` entries, sends `count` commands of `bytes` each (`op`,
/// data by the transport), reads nothing for 300 ms, measures, then drains.
fn flood(depth: u16, op: u8, count: u16, bytes: u32) -> Flood {
    let server = start(TargetConfig::default(), |_| {}, mem_ns());
    let ctrl = controller(server.local_addr());
    let mut sock = raw_queue(&ctrl, depth);
    let peak = Peak::start();
    let blocks = u64::from(bytes / 4096);
    let spread = 16384 / blocks; // stay inside the 64 MiB namespace
    let cmds: Vec<u8> = (0..count).flat_map(|i| cmd(op, i, (u64::from(i) % spread) * blocks, bytes)).collect();
    let sent = push(&mut sock, &cmds, Duration::from_secs(3)) / (cmds.len() / usize::from(count));
    std::thread::sleep(Duration::from_millis(300));
    let grown = peak.growth();
    let (types, closed) = drain(&mut sock, Duration::from_secs(10));
    Flood { server, sent, grown, types, closed }
}

fn count(types: &[u8], t: u8) -> usize {
    types.iter().filter(|&&x| x == t).count()
}

/// SQSIZE 2 (three entries), 1000 reads of 2 MiB sent at once and nothing read back:
/// the target answers what fits, terminates the queue at the first command beyond
/// SQSIZE + 1 outstanding (Linux's nvmet-tcp has exactly that many command slots per
/// queue and fails the queue when `nvmet_tcp_get_cmd` finds none), and holds at most a
/// few MiB meanwhile.
#[test]
fn a_host_cannot_submit_beyond_the_queue_size() {
    let _one = one_at_a_time();
    let f = flood(3, nvm::READ, 1000, 2 << 20);
    eprintln!(
        "sqsize 2, {} of 1000 x 2 MiB reads sent: target peak +{:.1} MiB; {} C2HData, {} responses, closed {}",
        f.sent,
        f.grown as f64 / MIB as f64,
        count(&f.types, C2H_DATA),
        count(&f.types, CAPSULE_RESP),
        f.closed
    );
    assert!(f.closed, "the target kept the queue open");
    assert_eq!(f.types.last(), Some(&C2H_TERM_REQ), "ends with a termination request: {:?}", f.types);
    assert!(f.grown < 48 * MIB, "the target grew by {} MiB", f.grown / MIB);
    let stats = f.server.stop();
    assert_eq!(stats.subsystem.terminations, 1);
    assert!(stats.subsystem.read_cmds <= 3, "served {} reads on a 3-entry queue", stats.subsystem.read_cmds);
}

/// SQSIZE 31, 4000 writes of 1 MiB whose data the target must ask for by R2T, and no
/// data ever sent: the target asks for what its budget allows, allocates nothing for
/// data that has not arrived, and terminates the queue at the 33rd command.
#[test]
fn a_flood_of_writes_waiting_for_r2t_is_bounded() {
    let _one = one_at_a_time();
    let f = flood(32, nvm::WRITE, 4000, 1 << 20);
    let r2ts = count(&f.types, R2T);
    eprintln!(
        "sqsize 31, {} of 4000 x 1 MiB writes sent, no data: target peak +{:.1} MiB; {r2ts} R2Ts, closed {}",
        f.sent,
        f.grown as f64 / MIB as f64,
        f.closed
    );
    assert!(f.closed && f.types.last() == Some(&C2H_TERM_REQ), "{:?}", f.types);
    assert!(r2ts <= 32, "{r2ts} R2Ts for a 32-entry queue");
    assert!(f.grown < 32 * MIB, "the target grew by {} MiB", f.grown / MIB);
    assert_eq!(f.server.stop().subsystem.write_cmds, 0);
}

/// Within the queue size (128 reads of 2 MiB, 256 MiB in all) but never reading the
/// answers: the target stops reading storage for the queue once its budget (4 MiB by
/// default) is held, so its memory stays flat; when the host reads again, every answer
/// arrives, none lost.
#[test]
fn unread_responses_hold_only_the_queue_budget() {
    let _one = one_at_a_time();
    let server = start(TargetConfig::default(), |_| {}, mem_ns());
    let ctrl = controller(server.local_addr());
    let mut sock = raw_queue(&ctrl, 128);
    let peak = Peak::start();
    let reads: Vec<u8> = (0..128u16).flat_map(|i| cmd(nvm::READ, i, u64::from(i % 32) * 512, 2 << 20)).collect();
    assert_eq!(push(&mut sock, &reads, Duration::from_secs(5)), reads.len());
    std::thread::sleep(Duration::from_secs(1));
    let grown = peak.growth();
    eprintln!("128 x 2 MiB reads outstanding, none read: target peak +{:.1} MiB", grown as f64 / MIB as f64);
    assert!(grown < 48 * MIB, "the target grew by {} MiB holding unread answers", grown / MIB);
    // Now read: all 256 MiB arrive (in C2HData PDUs, the last of each read marked
    // SUCCESS, or followed by a response capsule).
    let mut bytes = 0u64;
    let deadline = Instant::now() + Duration::from_secs(30);
    while bytes < 256 * MIB && Instant::now() < deadline {
        let (types, closed, n) = drain_counting(&mut sock, Duration::from_millis(500));
        assert!(!closed && !types.contains(&C2H_TERM_REQ), "the target closed the queue");
        bytes += n;
    }
    let stats = server.stop();
    assert!(bytes >= 256 * MIB, "{bytes} bytes of 256 MiB arrived");
    assert_eq!(stats.subsystem.read_cmds, 128, "every read was served");
}

/// Connections that never send ICReq, or stop after it without a Connect, are closed at
/// the setup deadline; a proper host is served meanwhile.
/// Sends an ICReq on `s` and nothing more: a connection that never finishes setting up.
fn icreq_only(mut s: TcpStream) -> TcpStream {
    let mut ic = Vec::new();
    TxConfig::ic_req(
        &mut ic,
        &netlane_nvme::proto::pdu::IcReq { pfv: 0, hpda: 0, hdgst: false, ddgst: false, maxr2t: 0 },
    );
    s.write_all(&ic).unwrap();
    s
}

#[test]
fn connections_that_never_set_up_are_closed_at_the_deadline() {
    let _one = one_at_a_time();
    let cfg = TargetConfig { setup_timeout_ms: 500, ..TargetConfig::default() };
    let server = start(cfg, |_| {}, mem_ns());
    let addr = server.local_addr();
    let mut silent: Vec<TcpStream> = (0..20).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let mut half: Vec<TcpStream> = (0..20).map(|_| icreq_only(TcpStream::connect(addr).unwrap())).collect();
    let ctrl = controller(addr);
    let started = Instant::now();
    for s in silent.iter_mut().chain(half.iter_mut()) {
        let (_, closed) = drain(s, Duration::from_secs(5));
        assert!(closed, "still open after {:?}", started.elapsed());
    }
    let waited = started.elapsed();
    eprintln!("40 stalled connections closed {waited:?} after the host connected (deadline 500 ms)");
    assert!(waited < Duration::from_secs(4));
    ctrl.shutdown().unwrap();
    let stats = server.stop();
    let timeouts: u64 = stats.closed.iter().filter(|(reason, _)| reason.contains("setup")).map(|(_, n)| *n).sum();
    assert_eq!(timeouts, 40, "{:?}", stats.closed);
}

/// Beyond `max_connections` a connection is accepted and closed at once; when the
/// others go, a host connects again.
#[test]
fn the_connection_limit_holds_and_frees() {
    let _one = one_at_a_time();
    let server = start(TargetConfig::default(), |o| o.max_connections = 8, mem_ns());
    let addr = server.local_addr();
    let mut conns: Vec<TcpStream> = (0..20).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let mut open = 0;
    for s in &mut conns {
        let (_, closed) = drain(s, Duration::from_millis(300));
        open += usize::from(!closed);
    }
    assert_eq!(open, 8, "connections left open at a limit of 8");
    assert_eq!(server.stats().refused, 12);
    drop(conns);
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.live_connections() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let ctrl = controller(addr);
    ctrl.shutdown().unwrap();
    server.stop();
}

/// One source opening connections that stop after ICReq holds at most its share of
/// the slots in setup: a host from another address still connects and reads.
#[test]
fn one_source_cannot_take_every_slot_with_connections_in_setup() {
    let _one = one_at_a_time();
    let cfg = TargetConfig { setup_timeout_ms: 30_000, ..TargetConfig::default() };
    let server = start(
        cfg,
        |o| {
            o.max_connections = 32;
            o.max_setup_per_source = 8;
        },
        mem_ns(),
    );
    let addr = server.local_addr();
    let attacker: SocketAddr = "127.0.0.2:0".parse().unwrap();
    let mut stalled: Vec<TcpStream> = (0..40)
        .map(|_| {
            let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            s.bind(&attacker.into()).unwrap();
            s.connect(&addr.into()).unwrap();
            icreq_only(TcpStream::from(s))
        })
        .collect();
    let mut open = 0;
    for s in &mut stalled {
        let (_, closed) = drain(s, Duration::from_millis(200));
        open += usize::from(!closed);
    }
    assert_eq!(open, 8, "connections in setup left open from one source");
    let ctrl = controller(addr);
    let mut q = raw_queue(&ctrl, 8);
    q.write_all(&cmd(nvm::READ, 1, 0, 4096)).unwrap();
    let (types, _) = drain(&mut q, Duration::from_millis(500));
    assert_eq!(count(&types, C2H_DATA), 1, "the read's data came back: {types:?}");
    drop(q);
    ctrl.shutdown().unwrap();
    let stats = server.stop();
    assert_eq!(stats.refused_in_setup, 32);
    assert_eq!(stats.refused, 0);
}

/// A namespace whose Flush takes `delay` and says while one is running.
#[derive(Debug)]
struct SlowFlush {
    inner: MemNamespace,
    delay: Duration,
    flushing: AtomicBool,
}

impl Namespace for SlowFlush {
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn blocks(&self) -> u64 {
        self.inner.blocks()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.inner.write(offset, data)
    }
    fn flush(&self) -> io::Result<()> {
        self.flushing.store(true, Ordering::SeqCst);
        std::thread::sleep(self.delay);
        self.flushing.store(false, Ordering::SeqCst);
        Ok(())
    }
}

/// One reactor; one connection's Flush takes 2 s; another connection's reads on the
/// same reactor keep completing in the meantime.
#[test]
fn a_slow_flush_does_not_stall_another_connection() {
    let _one = one_at_a_time();
    let ns = Arc::new(SlowFlush {
        inner: MemNamespace::new(16 * MIB, 4096).unwrap(),
        delay: Duration::from_secs(2),
        flushing: AtomicBool::new(false),
    });
    let server = start(TargetConfig::default(), |o| o.cpus = vec![0], ns.clone());
    let addr = server.local_addr();
    let a = controller(addr);
    let b = controller(addr);
    let mut qa = raw_queue(&a, 8);
    let mut qb = raw_queue(&b, 8);
    let mut flush = Sqe::default();
    flush.set_opcode(nvm::FLUSH);
    flush.set_flags(PSDT_SGL);
    flush.set_nsid(1);
    let mut f = Vec::new();
    TxConfig::default().capsule_cmd(&mut f, &flush, &[]);
    qa.write_all(&f).unwrap();
    let deadline = Instant::now() + Duration::from_secs(1);
    while !ns.flushing.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the flush never started: {:?}", drain(&mut qa, Duration::from_millis(100)));
        std::thread::sleep(Duration::from_millis(1));
    }
    // While it runs: 20 reads on the other connection, one at a time.
    let started = Instant::now();
    let mut done = 0;
    for i in 0..20u16 {
        qb.write_all(&cmd(nvm::READ, i, u64::from(i), 4096)).unwrap();
        let mut seen_resp = false;
        let until = Instant::now() + Duration::from_secs(1);
        while !seen_resp && Instant::now() < until {
            let (types, _) = drain(&mut qb, Duration::from_millis(20));
            seen_resp = types.contains(&CAPSULE_RESP) || types.contains(&C2H_DATA);
        }
        done += usize::from(seen_resp);
    }
    let took = started.elapsed();
    let still_flushing = ns.flushing.load(Ordering::SeqCst);
    eprintln!("20 reads on another connection in {took:?} while a 2 s Flush ran (still flushing: {still_flushing})");
    assert_eq!(done, 20, "reads stalled behind the flush");
    assert!(still_flushing, "the reads were not measured during the flush ({took:?})");
    let (types, _) = drain(&mut qa, Duration::from_secs(3));
    assert!(types.contains(&CAPSULE_RESP), "the flush completed");
    drop((qa, qb));
    server.stop();
}

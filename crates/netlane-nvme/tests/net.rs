//! NVMe/TCP host and target over real sockets: loopback, a veth pair between namespaces
//! (root), a tshark decode of the traffic (root), malformed input, keep-alive expiry.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use netlane::topology::{LinkConfig, TwoHosts};
use netlane_nvme::host::{Controller, QueueConn};
use netlane_nvme::perf::{self, JobGroup, PerfOptions};
use netlane_nvme::proto::cmd::{SGL_ICD, SglDesc, Sqe, Status, admin, nvm};
use netlane_nvme::proto::fabrics;
use netlane_nvme::proto::pdu::TxConfig;
use netlane_nvme::proto::target::{Subsystem, TargetConfig};
use netlane_nvme::store::open_namespace;
use netlane_nvme::target::{TargetOptions, TargetServer};

const T: Duration = Duration::from_secs(5);

mod common;
use common::{NQN, opts, perf_options, target};

fn sqe(op: u8, nsid: u32, cdw10: u32) -> Sqe {
    let mut s = Sqe::default();
    s.set_opcode(op);
    s.set_nsid(nsid);
    s.set_cdw(10, cdw10);
    s
}

fn rw(op: u8, nsid: u32, slba: u64, nlb: u32) -> Sqe {
    let mut s = sqe(op, nsid, 0);
    s.set_lba_range(slba, nlb);
    s
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(73).wrapping_add(seed) ^ (i >> 8) as u8).collect()
}

/// Every admin and I/O command the host uses, with the data checked byte for byte.
fn exercise(addr: SocketAddr, hd: bool, dd: bool, file: &std::path::Path) {
    let o = opts(addr, hd, dd);
    let ctrl = Controller::connect(&o, 4).unwrap();
    assert_eq!(ctrl.namespaces.iter().map(|n| n.nsid).collect::<Vec<_>>(), vec![1, 2]);
    assert_eq!(ctrl.info.subnqn, NQN);
    assert_eq!(ctrl.io_queues, 4);
    for (op, cdw10, nsid, len) in [
        (admin::IDENTIFY, 3, 1, 4096),
        // Two error-log entries: Wireshark 4.0's dissector reads 24 reserved bytes at
        // offset 42 of an entry (the spec has 22), so a lone 64-byte entry decodes as
        // "malformed" there although it is not.
        (admin::GET_LOG_PAGE, 1 | (31 << 16), 0xffff_ffff, 128),
        (admin::GET_LOG_PAGE, 2 | (127 << 16), 0xffff_ffff, 512),
        (admin::GET_LOG_PAGE, 3 | (127 << 16), 0, 512),
        (admin::GET_FEATURES, 7, 0, 0),
        (admin::KEEP_ALIVE, 0, 0, 0),
    ] {
        let c = ctrl.admin_run(sqe(op, nsid, cdw10), vec![0; len], "admin").unwrap();
        assert!(c.cqe.status.is_success(), "admin {op:#x}: {}", c.cqe.status);
    }
    for nsid in [1u32, 2] {
        let mut q = ctrl.connect_io_queue(nsid as u16, 16).unwrap();
        // In-capsule write, R2T write of 200 KiB (4 R2Ts, 7 H2CData), split read back.
        let small = pattern(4096, nsid as u8);
        assert!(q.run(rw(nvm::WRITE, nsid, 3, 1), small.clone(), T, "write").unwrap().cqe.status.is_success());
        let big = pattern(200 * 1024, 7 + nsid as u8);
        let c = q.run(rw(nvm::WRITE, nsid, 100, 50), big.clone(), T, "write").unwrap();
        assert!(c.cqe.status.is_success(), "{}", c.cqe.status);
        assert!(q.q.stats.r2ts >= 4 && q.q.stats.h2c_pdus >= 7, "{:?}", q.q.stats);
        let c = q.run(rw(nvm::READ, nsid, 100, 50), vec![0; 200 * 1024], T, "read").unwrap();
        assert!(c.cqe.status.is_success());
        assert!(c.data == big, "200 KiB read back differs (nsid {nsid})");
        let c = q.run(rw(nvm::READ, nsid, 3, 1), vec![0; 4096], T, "read").unwrap();
        assert!(c.data == small);
        assert!(q.run(rw(nvm::WRITE_ZEROES, nsid, 100, 1), vec![], T, "wz").unwrap().cqe.status.is_success());
        let c = q.run(rw(nvm::READ, nsid, 100, 2), vec![0; 8192], T, "read").unwrap();
        assert!(c.data[..4096].iter().all(|&b| b == 0) && c.data[4096..] == big[4096..8192]);
        assert!(q.run(rw(nvm::FLUSH, nsid, 0, 1), vec![], T, "flush").unwrap().cqe.status.is_success());
        assert_eq!(
            q.run(rw(nvm::READ, nsid, 1 << 40, 1), vec![0; 4096], T, "read").unwrap().cqe.status,
            Status::LBA_RANGE
        );
        if nsid == 2 {
            // The file namespace really holds the data, and Flush made it durable.
            let on_disk = std::fs::read(file).unwrap();
            assert!(on_disk[3 * 4096..4 * 4096] == small[..]);
            assert!(on_disk[101 * 4096..150 * 4096] == big[4096..]);
        }
        let c = q.run(fabrics::disconnect(0), vec![], T, "disconnect").unwrap();
        assert!(c.cqe.status.is_success());
        let mut b = [0u8; 1];
        q.sock.set_read_timeout(Some(T)).unwrap();
        assert_eq!(q.sock.read(&mut b).unwrap_or(0), 0, "the target closes a disconnected queue");
    }
    ctrl.shutdown().unwrap();
}

fn run_perf_verify(addr: SocketAddr) {
    let o = PerfOptions {
        connect: opts(addr, true, true),
        groups: vec![
            JobGroup::parse("name=mix,rw=randrw,bs=8k,qd=8,jobs=2").unwrap(),
            JobGroup::parse("name=big,rw=write,bs=256k,qd=2,jobs=1").unwrap(),
        ],
        duration: Duration::from_millis(700),
        queues: 2,
        read_queues: 1,
        direct_send: true,
        verify: netlane_nvme::perf::VerifyMode::Write,
        ..perf_options(addr, "name=mix,rw=randrw,bs=8k,qd=8,jobs=2")
    };
    let r = perf::run(&o).unwrap();
    for g in &r.groups {
        assert_eq!((g.errors, g.mismatches), (0, 0), "{}", g.name);
        assert!(g.ops > 0, "{} did no I/O", g.name);
    }
    assert!(r.groups[0].reads > 0 && r.groups[0].writes > 0);
}

#[test]
fn loopback_round_trip_every_command_and_digest_setting() {
    let f = target("127.0.0.1:0".parse().unwrap(), "lo");
    let addr = f.server.local_addr();
    for (hd, dd) in [(false, false), (true, false), (false, true), (true, true)] {
        exercise(addr, hd, dd, &f.file);
    }
    run_perf_verify(addr);
    assert_eq!(f.subsys.stats.counts.terminations.load(Ordering::Relaxed), 0);
}

/// More commands than the queues have slots (4 jobs x qd 16 on two queues of depth 8):
/// the excess waits in order and the run ends on time; the verify prefill ends with a
/// Flush per job.
#[test]
fn more_commands_than_queue_slots_wait_their_turn() {
    let f = target("127.0.0.1:0".parse().unwrap(), "overcommit");
    let o = PerfOptions {
        duration: Duration::from_millis(500),
        queues: 2,
        queue_depth: 8,
        verify: netlane_nvme::perf::VerifyMode::Write,
        size: Some(4 << 20),
        ..perf_options(f.server.local_addr(), "name=many,rw=randrw,bs=4k,qd=16,jobs=4")
    };
    let started = Instant::now();
    let r = perf::run(&o).unwrap();
    assert!(started.elapsed() < Duration::from_secs(20), "the run took {:?}", started.elapsed());
    let g = &r.groups[0];
    assert_eq!((g.errors, g.mismatches), (0, 0));
    assert!(g.reads > 100 && g.writes > 100, "{} reads, {} writes", g.reads, g.writes);
    assert_eq!(f.subsys.stats.counts.flush_cmds.load(Ordering::Relaxed), 4, "one Flush per job after its prefill");
}

#[test]
fn busy_polling_target_serves_verified_io() {
    let namespaces = vec![open_namespace("mem:32M").unwrap()];
    let subsys = Subsystem::new(TargetConfig { nqn: NQN.into(), ..TargetConfig::default() }, namespaces).unwrap();
    let opts = TargetOptions {
        cpus: vec![0, 0],
        busy_poll: Some(50),
        spin: true,
        ..TargetOptions::new("127.0.0.1:0".parse().unwrap())
    };
    let server = TargetServer::start(subsys, &opts).unwrap();
    run_perf_verify(server.local_addr());
    let stats = server.stop();
    assert!(stats.rounds > stats.commands, "a spinning reactor runs rounds without events");
    assert!(stats.commands > 1000);
}

#[test]
fn veth_round_trip_decoded_by_tshark_without_errors() {
    if !netlane_testkit::privileged("veth_round_trip_decoded_by_tshark_without_errors") {
        return;
    }
    let hosts = TwoHosts::create("nvme-test", LinkConfig::default()).unwrap();
    let listen = SocketAddr::new(hosts.rx_addr(false), netlane_nvme::DEFAULT_PORT);
    let f = hosts.rx.run(move || target(listen, "veth")).unwrap();
    // A capture that lost a segment proves nothing about the decode: on a loaded
    // two-CPU runner the capture child can fall behind. Such an attempt is repeated
    // (each one exercises the target afresh); three losses in a row fail the test.
    let mut lost = Vec::new();
    let text = loop {
        let capture = capture_exercise(&hosts, listen, &f.file);
        if !capture.lost() {
            break capture.decoded;
        }
        lost.push(capture.loss_summary());
        assert!(lost.len() < 3, "every capture lost packets: {lost:?}");
    };
    let mut types = std::collections::BTreeMap::new();
    let (mut hd_good, mut dd_good) = (0, 0);
    for line in text.lines() {
        let cols: Vec<&str> = line.split(';').collect();
        for t in cols[0].split(',').filter(|s| !s.is_empty()) {
            *types.entry(t.to_string()).or_insert(0u64) += 1;
        }
        for (col, good) in [(1, &mut hd_good), (2, &mut dd_good)] {
            for s in cols.get(col).unwrap_or(&"").split(',').filter(|s| !s.is_empty()) {
                assert_eq!(s, "1", "digest status {s} (0 = bad) in {line:?}");
                *good += 1;
            }
        }
        // A TCP retransmission (the receiver's window filled while the target applied
        // backpressure, or veth dropped under load) makes Wireshark's reassembly see a
        // segment overlapping data it already has: marked malformed, but the bytes agree
        // (differing bytes would say "Conflicting data"). That is TCP, not NVMe/TCP.
        let retransmitted =
            line.contains("New fragment overlaps old data (retransmission?)") && !line.contains("Conflicting data");
        assert!(cols.get(3).is_none_or(|m| m.is_empty()) || retransmitted, "malformed PDU: {line}");
        if retransmitted {
            continue;
        }
        // Expert notes of warning severity (0x600000) or worse fail the test, except TCP
        // sequence notes (group 0x2000000) about connection set-up and teardown.
        let sevs: Vec<&str> = cols.get(4).unwrap_or(&"").split(',').filter(|s| !s.is_empty()).collect();
        let groups: Vec<&str> = cols.get(5).unwrap_or(&"").split(',').filter(|s| !s.is_empty()).collect();
        for (sev, group) in sevs.iter().zip(groups.iter()) {
            let sev: u64 = sev.parse().unwrap_or(0);
            let group: u64 = group.parse().unwrap_or(0);
            assert!(sev < 0x60_0000 || group == 0x200_0000, "expert note in {line:?}");
        }
    }
    // ICReq 0, ICResp 1, CapsuleCmd 4, CapsuleResp 5, H2CData 6, C2HData 7, R2T 9.
    for t in ["0", "1", "4", "5", "6", "7", "9"] {
        assert!(types.get(t).copied().unwrap_or(0) > 0, "no PDU of type {t} decoded: {types:?}");
    }
    assert!(hd_good > 50 && dd_good > 20, "digests checked: header {hd_good}, data {dd_good}");
    // The same host and target under load, with verification.
    hosts.tx.run(move || run_perf_verify(listen)).unwrap();
    drop(f);
}

/// One capture of the host exercising the target, decoded by tshark.
struct Capture {
    /// One line per packet: `;`-separated fields (see `capture_exercise`).
    decoded: String,
    /// What the capturing tshark printed when it stopped (its packet and drop counts).
    report: String,
}

impl Capture {
    /// Whether the capture itself missed packets: the capture child counted drops, or
    /// the decode found a sequence gap ("Previous segment(s) not captured").
    fn lost(&self) -> bool {
        self.decoded.lines().any(|l| l.contains("not captured"))
            || self.report.lines().any(|l| l.contains("dropped") && !l.trim_start().starts_with('0'))
    }

    fn loss_summary(&self) -> String {
        let gap = self.decoded.lines().find(|l| l.contains("not captured")).unwrap_or("");
        format!("{} {gap}", self.report.trim().replace('\n', "; "))
    }
}

/// Captures on the host's end of the veth (inside its namespace) while the host runs
/// both digest settings against the target, then decodes the capture with the
/// NVMe/TCP dissector checking every digest.
fn capture_exercise(hosts: &TwoHosts, listen: SocketAddr, file: &std::path::Path) -> Capture {
    let pcap = std::env::temp_dir().join(format!("netlane-nvme-{}.pcapng", std::process::id()));
    let _ = std::fs::remove_file(&pcap);
    // tshark says "Capturing on" before its capture child is really running, so probe
    // with UDP datagrams to our own namespace until one shows up in its packet list.
    let mut cap = hosts
        .tx
        .command("tshark")
        .args(["-i", &hosts.tx_if, "-B", "64", "-P", "-f", "tcp port 4420 or udp port 9999", "-w"])
        .arg(&pcap)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("tshark (Debian package tshark; scripts/setup.sh installs it)");
    let mut listing = cap.stdout.take().unwrap();
    let mut stderr = cap.stderr.take().unwrap();
    let report = std::thread::spawn(move || {
        let mut all = String::new();
        let _ = stderr.read_to_string(&mut all);
        all
    });
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut all = String::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = listing.read(&mut buf) {
            if n == 0 {
                break;
            }
            all.push_str(&String::from_utf8_lossy(&buf[..n]));
            if all.contains("9999") {
                let _ = tx.send(());
            }
        }
    });
    let probe_to = SocketAddr::new(hosts.rx_addr(false), 9999);
    let probe = hosts.tx.run(|| std::net::UdpSocket::bind("0.0.0.0:0").unwrap()).unwrap();
    let started = Instant::now();
    loop {
        let _ = probe.send_to(b"capture probe", probe_to);
        if rx.recv_timeout(Duration::from_millis(100)).is_ok() {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "tshark never started capturing");
    }
    let file = file.to_path_buf();
    hosts
        .tx
        .run(move || {
            exercise(listen, true, true, &file);
            exercise(listen, false, false, &file);
        })
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(cap.id() as i32), nix::sys::signal::Signal::SIGINT).unwrap();
    let _ = cap.wait();
    let report = report.join().unwrap_or_default();
    let out = std::process::Command::new("tshark")
        .arg("-r")
        .arg(&pcap)
        .args(["-o", "nvme-tcp.check_hdgst:TRUE", "-o", "nvme-tcp.check_ddgst:TRUE"])
        .args(["-T", "fields", "-E", "separator=;"])
        .args(["-e", "nvme-tcp.type", "-e", "nvme-tcp.hdgst.status", "-e", "nvme-tcp.ddgst.status"])
        .args([
            "-e",
            "_ws.malformed",
            "-e",
            "_ws.expert.severity",
            "-e",
            "_ws.expert.group",
            "-e",
            "_ws.expert.message",
        ])
        .output()
        .unwrap();
    if std::env::var_os("NETLANE_KEEP_PCAP").is_none() {
        let _ = std::fs::remove_file(&pcap);
    }
    assert!(out.status.success(), "tshark -r: {}", String::from_utf8_lossy(&out.stderr));
    Capture { decoded: String::from_utf8_lossy(&out.stdout).into_owned(), report }
}

/// Opens I/O queue `qid` and returns its raw socket.
fn raw_queue(ctrl: &Controller, qid: u16) -> (TcpStream, TxConfig) {
    let q: QueueConn = ctrl.connect_io_queue(qid, 8).unwrap();
    let (sock, _hq, rest) = q.into_parts();
    assert!(rest.is_empty());
    sock.set_read_timeout(Some(T)).unwrap();
    (sock, TxConfig::default())
}

/// Sends `bytes`, then returns (FES, FEI) of the termination request and whether the
/// connection was closed after it.
fn term_after(mut sock: TcpStream, bytes: &[u8]) -> (u16, u32, bool) {
    sock.write_all(bytes).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match sock.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => panic!("no close after the termination request: {e} (got {got:?})"),
        }
    }
    assert!(got.len() >= 24 && got[0] == 0x03, "C2H termination request expected, got {got:?}");
    (u16::from_le_bytes([got[8], got[9]]), u32::from_le_bytes([got[10], got[11], got[12], got[13]]), true)
}

#[test]
fn malformed_input_is_terminated_and_other_hosts_keep_working() {
    let f = target("127.0.0.1:0".parse().unwrap(), "bad");
    let addr = f.server.local_addr();
    let ctrl = Controller::connect(&opts(addr, false, false), 8).unwrap();
    let mut w = rw(nvm::WRITE, 1, 0, 1);
    w.set_sgl(SglDesc { addr: 0, len: 4096, id: SGL_ICD });
    let mut good = Vec::new();
    TxConfig::default().capsule_cmd(&mut good, &w, &[0xee; 4096]);
    let mut beyond_cmd = w;
    beyond_cmd.set_sgl(SglDesc { addr: 0, len: 1024, id: SGL_ICD });
    let mut beyond = Vec::new();
    TxConfig::default().capsule_cmd(&mut beyond, &beyond_cmd, &[0xee; 4096]);
    let mut unknown_ttag = Vec::new();
    TxConfig::default().h2c_data(&mut unknown_ttag, 0, 9, 0, &[0xee; 4096], true);
    let cases: Vec<(&str, Vec<u8>, u16, u32)> = vec![
        (
            "hlen in dwords",
            {
                let mut b = good.clone();
                b[2] = 18;
                b
            },
            1,
            2,
        ),
        (
            "pdo inside the header",
            {
                let mut b = good.clone();
                b[3] = 64;
                b
            },
            1,
            3,
        ),
        (
            "plen shorter than the header",
            {
                let mut b = good.clone();
                b[4..8].copy_from_slice(&50u32.to_le_bytes());
                b
            },
            1,
            3,
        ),
        (
            "controller-to-host type",
            {
                let mut b = good.clone();
                b[0] = 0x07;
                b
            },
            1,
            0,
        ),
        (
            "digest flag not negotiated",
            {
                let mut b = good.clone();
                b[1] = 1;
                b
            },
            1,
            1,
        ),
        ("data beyond the command's length", beyond, 4, 0),
        ("H2CData without an R2T", unknown_ttag, 1, 10),
    ];
    for (i, (name, bytes, fes, fei)) in cases.into_iter().enumerate() {
        let (sock, _) = raw_queue(&ctrl, i as u16 + 1);
        let (got_fes, got_fei, closed) = term_after(sock, &bytes);
        assert_eq!((got_fes, got_fei), (fes, fei), "{name}");
        assert!(closed, "{name}");
    }
    // Header digest error on a queue that negotiated header digests.
    {
        let c2 = Controller::connect(&opts(addr, true, false), 2).unwrap();
        let q = c2.connect_io_queue(1, 8).unwrap();
        let (sock, _, _) = q.into_parts();
        sock.set_read_timeout(Some(T)).unwrap();
        let mut b = Vec::new();
        TxConfig { hdgst: true, ddgst: false, pda: 4 }.capsule_cmd(&mut b, &w, &[0xee; 4096]);
        b[20] ^= 0x55;
        assert_eq!(term_after(sock, &b).0, 3, "header digest error");
    }
    // Truncated PDU, then the host goes away: nothing written.
    {
        let (mut sock, _) = raw_queue(&ctrl, 8);
        sock.write_all(&good[..good.len() - 100]).unwrap();
        drop(sock);
    }
    std::thread::sleep(Duration::from_millis(200));
    // Another host still works, and no malformed write reached the namespace.
    let other = Controller::connect(&opts(addr, false, false), 1).unwrap();
    let mut q = other.connect_io_queue(1, 8).unwrap();
    let c = q.run(rw(nvm::READ, 1, 0, 1), vec![1; 4096], T, "read").unwrap();
    assert!(c.cqe.status.is_success());
    assert!(c.data.iter().all(|&b| b == 0), "a malformed command wrote data");
    assert!(f.subsys.stats.counts.terminations.load(Ordering::Relaxed) >= 8);
    // The first controller's admin queue is still alive too.
    assert!(ctrl.admin_run(sqe(admin::KEEP_ALIVE, 0, 0), vec![], "keep alive").unwrap().cqe.status.is_success());
    // A second Connect for a connected queue is refused with a sequence error.
    let dup = ctrl.connect_io_queue(1, 8);
    assert!(dup.is_ok(), "queue 1 of the first controller was freed by its termination");
    let again = ctrl.connect_io_queue(1, 8).unwrap_err().to_string();
    assert!(again.contains("SC 0x0c"), "{again}");
}

#[test]
fn keep_alive_expiry_tears_down_the_controller_and_reconnect_works() {
    let f = target("127.0.0.1:0".parse().unwrap(), "ka");
    let addr = f.server.local_addr();
    let mut o = opts(addr, false, false);
    // Long enough that a stall of the host's keep-alive thread on a loaded two-CPU
    // machine (tests run beside spinning reactors) does not expire it early.
    o.kato_ms = 1000;
    let mut ctrl = Controller::connect(&o, 2).unwrap();
    let q = ctrl.connect_io_queue(1, 8).unwrap();
    // With keep-alive running, the controller outlives several KATOs.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(f.subsys.controller_count(), 1);
    ctrl.stop_keepalive();
    let (mut sock, _, _) = q.into_parts();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let start = Instant::now();
    let mut b = [0u8; 64];
    assert_eq!(sock.read(&mut b).unwrap_or(0), 0, "the I/O queue is closed when the controller expires");
    let waited = start.elapsed();
    assert!(waited < Duration::from_secs(3), "expiry took {waited:?} (KATO 1 s)");
    assert_eq!(f.subsys.controller_count(), 0);
    assert_eq!(f.subsys.stats.counts.keepalive_expiries.load(Ordering::Relaxed), 1);
    // Reconnect: a new controller, queue 1 connects again, I/O works.
    let ctrl2 = Controller::connect(&o, 2).unwrap();
    assert_ne!(ctrl2.cntlid, ctrl.cntlid);
    let mut q2 = ctrl2.connect_io_queue(1, 8).unwrap();
    assert!(q2.run(rw(nvm::READ, 1, 0, 1), vec![0; 4096], T, "read").unwrap().cqe.status.is_success());
    assert_eq!(f.server.stats().connections, 4);
}

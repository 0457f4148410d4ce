//! Host and controller state machines wired back to back in memory: every admin and I/O
//! command, digests on and off, in-capsule and R2T writes, split reads, and malformed
//! input, without sockets.

use std::sync::Arc;

use netlane_nvme::proto::cmd::{Cqe, Sqe, Status, admin, nvm};
use netlane_nvme::proto::fabrics::{self, Connect, Property, reg};
use netlane_nvme::proto::host::{Completion, HostQueue, HostQueueConfig};
use netlane_nvme::proto::identify::{self, ControllerInfo, NamespaceInfo};
use netlane_nvme::proto::namespace::{MemNamespace, Namespace};
use netlane_nvme::proto::pdu::{self, Fes, Role, TxConfig};
use netlane_nvme::proto::target::{CloseReason, Subsystem, TargetConfig, TargetQueue};

const NQN: &str = "nqn.2026-11.io.netlane:sim";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:sim-host";

struct Pair {
    host: HostQueue,
    target: TargetQueue,
    to_target: Vec<u8>,
    to_host: Vec<u8>,
    now: u64,
}

impl Pair {
    fn new(subsys: &Arc<Subsystem>, cfg: HostQueueConfig) -> Pair {
        let mut p = Pair {
            host: HostQueue::new(cfg),
            target: TargetQueue::new(subsys.clone(), 0),
            to_target: Vec::new(),
            to_host: Vec::new(),
            now: 0,
        };
        p.pump();
        assert!(p.host.is_ready());
        p
    }

    /// Moves bytes both ways, in odd-sized pieces, until nothing moves.
    fn pump(&mut self) {
        loop {
            let mut moved = false;
            let h = self.host.poll_output().to_vec();
            if !h.is_empty() {
                self.host.handle_written(h.len());
                self.to_target.extend_from_slice(&h);
                moved = true;
            }
            // Feed the target in 1000-byte steps to exercise partial PDUs.
            while !self.to_target.is_empty() && self.target.close_reason().is_none() {
                let n = self.to_target.len().min(1000);
                let mut window = self.to_target[..n].to_vec();
                let mut used = self.target.handle_input(&window, self.now);
                while used == 0 && n < self.to_target.len() && self.target.close_reason().is_none() {
                    window = self.to_target[..(window.len() + 1000).min(self.to_target.len())].to_vec();
                    used = self.target.handle_input(&window, self.now);
                    if window.len() == self.to_target.len() {
                        break;
                    }
                }
                self.target.run_storage(self.now);
                if used == 0 {
                    break;
                }
                self.to_target.drain(..used);
                moved = true;
            }
            let t = self.target.poll_output().to_vec();
            if !t.is_empty() {
                self.target.handle_written(t.len());
                self.to_host.extend_from_slice(&t);
                moved = true;
            }
            if !self.to_host.is_empty() {
                let used = self.host.handle_input(&self.to_host).expect("host input");
                if used > 0 {
                    self.to_host.drain(..used);
                    moved = true;
                }
            }
            if !moved {
                return;
            }
        }
    }

    fn run(&mut self, sqe: Sqe, data: Vec<u8>) -> Completion {
        self.host.submit(sqe, data, 99).expect("submit");
        self.pump();
        self.host.pop_completion().expect("a completion")
    }
}

fn subsystem(cfg: TargetConfig) -> (Arc<Subsystem>, Arc<MemNamespace>) {
    let ns = Arc::new(MemNamespace::new(16 << 20, 4096).unwrap());
    let s = Subsystem::new(TargetConfig { nqn: NQN.into(), ..cfg }, vec![ns.clone() as Arc<dyn Namespace>]).unwrap();
    (s, ns)
}

fn connect(p: &mut Pair, qid: u16, cntlid: u16, kato: u32) -> Cqe {
    let c = Connect {
        recfmt: 0,
        qid,
        sqsize: 31,
        cattr: fabrics::CATTR_DISABLE_SQFLOW,
        kato_ms: kato,
        hostid: [1; 16],
        cntlid,
        subnqn: NQN.into(),
        hostnqn: HOSTNQN.into(),
    };
    let (sqe, data) = c.encode(0);
    p.run(sqe, data).cqe
}

fn admin_cmd(op: u8, cdw10: u32, nsid: u32) -> Sqe {
    let mut s = Sqe::default();
    s.set_opcode(op);
    s.set_nsid(nsid);
    s.set_cdw(10, cdw10);
    s
}

/// Connects and enables a controller; returns the admin pair and the CNTLID.
fn bring_up(subsys: &Arc<Subsystem>, hd: bool, dd: bool) -> (Pair, u16) {
    let mut a = Pair::new(subsys, HostQueueConfig::admin(hd, dd));
    let cqe = connect(&mut a, 0, fabrics::CNTLID_DYNAMIC, 2000);
    assert!(cqe.status.is_success(), "{}", cqe.status);
    let cntlid = cqe.dw0 as u16;
    let cap = a.run(Property::get(0, reg::CAP, true), vec![]).cqe;
    assert_eq!(cap.dw0 & 0xffff, 127, "MQES");
    assert!(a.run(Property::set(0, reg::CC, u64::from(fabrics::CC_ENABLE), false), vec![]).cqe.status.is_success());
    let csts = a.run(Property::get(0, reg::CSTS, false), vec![]).cqe;
    assert_eq!(csts.dw0 & 1, 1, "CSTS.RDY");
    (a, cntlid)
}

fn io_queue(subsys: &Arc<Subsystem>, cntlid: u16, qid: u16, hd: bool, dd: bool, icd: u32) -> Pair {
    let cfg = HostQueueConfig { qid, depth: 32, in_capsule: icd, maxr2t: 3, ..HostQueueConfig::admin(hd, dd) };
    let mut q = Pair::new(subsys, cfg);
    let cqe = connect(&mut q, qid, cntlid, 0);
    assert!(cqe.status.is_success(), "I/O connect: {}", cqe.status);
    q
}

fn rw(op: u8, slba: u64, nlb: u32) -> Sqe {
    let mut s = Sqe::default();
    s.set_opcode(op);
    s.set_nsid(1);
    s.set_lba_range(slba, nlb);
    s
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
fn every_admin_and_io_command_round_trips_with_all_digest_settings() {
    for (hd, dd) in [(false, false), (true, false), (false, true), (true, true)] {
        // Small C2H and R2T chunks force split reads and several R2Ts per write.
        let (subsys, ns) = subsystem(TargetConfig { c2h_max: 16384, r2t_max: 32768, ..TargetConfig::default() });
        let (mut a, cntlid) = bring_up(&subsys, hd, dd);

        let c = a.run(admin_cmd(admin::IDENTIFY, 1, 0), vec![0; 4096]);
        assert!(c.cqe.status.is_success());
        let info = ControllerInfo::parse(&c.data).unwrap();
        assert_eq!(info.cntlid, cntlid);
        assert_eq!(info.subnqn, NQN);
        assert_eq!(info.nn, 1);
        let c = a.run(admin_cmd(admin::IDENTIFY, 2, 0), vec![0; 4096]);
        assert_eq!(identify::parse_ns_list(&c.data), vec![1]);
        let c = a.run(admin_cmd(admin::IDENTIFY, 0, 1), vec![0; 4096]);
        let nsi = NamespaceInfo::parse(&c.data).unwrap();
        assert_eq!((nsi.blocks, nsi.block_size), (4096, 4096));
        let c = a.run(admin_cmd(admin::IDENTIFY, 3, 1), vec![0; 4096]);
        assert_eq!(c.data[0], 2);
        assert_eq!(a.run(admin_cmd(admin::IDENTIFY, 0, 7), vec![0; 4096]).cqe.status, Status::INVALID_NS);
        // Number of queues: ask for 4, get 4.
        let mut s = admin_cmd(admin::SET_FEATURES, 7, 0);
        s.set_cdw(11, 3 | (3 << 16));
        assert_eq!(a.run(s, vec![]).cqe.dw0, 3 | (3 << 16));
        // Async event configuration: notices not advertised in OAES are refused (as
        // nvmet does); the SMART warning bits are accepted and read back.
        let mut s = admin_cmd(admin::SET_FEATURES, 0x0b, 0);
        s.set_cdw(11, 0x100);
        assert_eq!(a.run(s, vec![]).cqe.status, Status::INVALID_FIELD);
        let mut s = admin_cmd(admin::SET_FEATURES, 0x0b, 0);
        s.set_cdw(11, 0x07);
        assert!(a.run(s, vec![]).cqe.status.is_success());
        assert_eq!(a.run(admin_cmd(admin::GET_FEATURES, 0x0b, 0), vec![]).cqe.dw0, 0x07);
        assert_eq!(a.run(admin_cmd(admin::GET_FEATURES, 0x0f, 0), vec![]).cqe.dw0, 2000);
        for lid in [1u32, 2, 3] {
            let c = a.run(admin_cmd(admin::GET_LOG_PAGE, lid | (127 << 16), 0xffff_ffff), vec![0; 512]);
            assert!(c.cqe.status.is_success(), "log {lid}");
        }
        assert_eq!(
            a.run(admin_cmd(admin::GET_LOG_PAGE, 0x70 | (127 << 16), 0), vec![0; 512]).cqe.status,
            Status::INVALID_LOG_PAGE
        );
        assert!(a.run(admin_cmd(admin::KEEP_ALIVE, 0, 0), vec![]).cqe.status.is_success());
        // An AER is held: no completion.
        a.host.submit(admin_cmd(admin::ASYNC_EVENT, 0, 0), vec![], 5).unwrap();
        a.pump();
        assert!(a.host.pop_completion().is_none());
        assert_eq!(a.host.in_flight(), 1);

        let mut q = io_queue(&subsys, cntlid, 1, hd, dd, 8192);
        // In-capsule write (8 KiB), R2T write (200 KiB: 7 R2Ts of 32 KiB, several
        // H2CData each of MAXH2CDATA), split read back, write zeroes, flush.
        let small = pattern(8192, 1);
        let c = q.run(rw(nvm::WRITE, 0, 2), small.clone());
        assert!(c.cqe.status.is_success());
        let big = pattern(200 * 1024, 2);
        let c = q.run(rw(nvm::WRITE, 10, 50), big.clone());
        assert!(c.cqe.status.is_success(), "{}", c.cqe.status);
        assert!(q.target.stats.r2ts >= 7);
        let c = q.run(rw(nvm::READ, 10, 50), vec![0; 200 * 1024]);
        assert!(c.cqe.status.is_success());
        assert!(c.data == big, "read back differs");
        let c = q.run(rw(nvm::READ, 0, 2), vec![0; 8192]);
        assert!(c.data == small);
        let mut direct = vec![0; 8192];
        ns.read(0, &mut direct).unwrap();
        assert!(direct == small, "namespace holds what was written");
        assert!(q.run(rw(nvm::WRITE_ZEROES, 0, 1), vec![]).cqe.status.is_success());
        let c = q.run(rw(nvm::READ, 0, 2), vec![0; 8192]);
        assert!(c.data[..4096].iter().all(|&b| b == 0) && c.data[4096..] == small[4096..]);
        assert!(q.run(rw(nvm::FLUSH, 0, 1), vec![]).cqe.status.is_success());
        assert_eq!(q.run(rw(nvm::READ, 4090, 10), vec![0; 40960]).cqe.status, Status::LBA_RANGE);
        // The SUCCESS optimisation was used (the host disabled SQ flow control).
        assert!(q.host.stats.success_flag > 0);
        let smart = a.run(admin_cmd(admin::GET_LOG_PAGE, 2 | (127 << 16), 0xffff_ffff), vec![0; 512]);
        assert!(u128::from_le_bytes(smart.data[80..96].try_into().unwrap()) >= 2, "SMART write commands");
        // Disconnect the I/O queue.
        let c = q.run(fabrics::disconnect(0), vec![]);
        assert!(c.cqe.status.is_success());
        assert_eq!(q.target.close_reason(), Some(&CloseReason::Disconnected));
    }
}

#[test]
fn c2h_success_switch_off_sends_response_capsules() {
    let (subsys, _) = subsystem(TargetConfig { c2h_success: false, ..TargetConfig::default() });
    let (_a, cntlid) = bring_up(&subsys, false, false);
    let mut q = io_queue(&subsys, cntlid, 1, false, false, 8192);
    assert!(q.run(rw(nvm::READ, 0, 1), vec![0; 4096]).cqe.status.is_success());
    assert_eq!(q.host.stats.success_flag, 0);
    assert_eq!(q.target.stats.success_flag, 0);
}

#[test]
fn connect_rules() {
    let (subsys, _) = subsystem(TargetConfig::default());
    let (mut a, cntlid) = bring_up(&subsys, false, false);
    // Second Connect on a connected queue.
    assert_eq!(connect(&mut a, 0, fabrics::CNTLID_DYNAMIC, 0).status, Status::CMD_SEQ_ERROR);
    let _q = io_queue(&subsys, cntlid, 1, false, false, 8192);
    // Same QID again from another connection.
    let mut dup = Pair::new(&subsys, HostQueueConfig { qid: 1, ..HostQueueConfig::admin(false, false) });
    assert_eq!(connect(&mut dup, 1, cntlid, 0).status, Status::CMD_SEQ_ERROR);
    // Unknown controller, wrong NQN, wrong host.
    let mut x = Pair::new(&subsys, HostQueueConfig { qid: 2, ..HostQueueConfig::admin(false, false) });
    let c = connect(&mut x, 2, cntlid + 100, 0);
    assert_eq!((c.status, c.dw0), (Status::CONNECT_INVALID_PARAM, (1 << 16) | 16));
    let mut y = Pair::new(&subsys, HostQueueConfig::admin(false, false));
    let mut bad = Connect {
        recfmt: 0,
        qid: 0,
        sqsize: 31,
        cattr: 0,
        kato_ms: 0,
        hostid: [0; 16],
        cntlid: 0xffff,
        subnqn: "nqn.wrong".into(),
        hostnqn: HOSTNQN.into(),
    };
    let (sqe, data) = bad.encode(0);
    let c = y.run(sqe, data);
    assert_eq!((c.cqe.status, c.cqe.dw0), (Status::CONNECT_INVALID_PARAM, (1 << 16) | 256));
    bad.subnqn = NQN.into();
    bad.hostnqn = "nqn.other-host".into();
    bad.qid = 2;
    bad.cntlid = cntlid;
    let (sqe, data) = bad.encode(0);
    assert_eq!(y.run(sqe, data).cqe.status, Status::CONNECT_INVALID_HOST);
    // Commands before Connect.
    let mut z = Pair::new(&subsys, HostQueueConfig::admin(false, false));
    assert_eq!(z.run(admin_cmd(admin::KEEP_ALIVE, 0, 0), vec![]).cqe.status, Status::CMD_SEQ_ERROR);
    // SQSIZE 65535 (65536 entries: once an overflow in the SQ head arithmetic) and
    // anything above CAP.MQES are refused as an invalid SQSIZE (attribute offset 42).
    for (qid, sqsize) in [(0u16, 65535u16), (0, 128), (1, 65535), (1, 128)] {
        let mut q = Pair::new(&subsys, HostQueueConfig { qid, ..HostQueueConfig::admin(false, false) });
        let c = Connect {
            recfmt: 0,
            qid,
            sqsize,
            cattr: 0,
            kato_ms: 0,
            hostid: [1; 16],
            cntlid: if qid == 0 { fabrics::CNTLID_DYNAMIC } else { cntlid },
            subnqn: NQN.into(),
            hostnqn: HOSTNQN.into(),
        };
        let (sqe, data) = c.encode(0);
        let cqe = q.run(sqe, data).cqe;
        assert_eq!(cqe.status, Status::CONNECT_INVALID_PARAM, "qid {qid} sqsize {sqsize}");
    }
}

#[test]
fn target_settings_a_peer_could_abuse_are_bounded() {
    use netlane_nvme::proto::target::{MAX_H2C_DATA, MAX_IN_CAPSULE, MAX_QUEUE_BUDGET};
    let ok = TargetConfig::default();
    assert_eq!(ok.validate(), Ok(()));
    let cases: Vec<(&str, TargetConfig)> = vec![
        ("in-capsule above the bound", TargetConfig { in_capsule: MAX_IN_CAPSULE + 16, ..ok.clone() }),
        ("in-capsule not a multiple of 16", TargetConfig { in_capsule: 8200, ..ok.clone() }),
        ("maxh2cdata above the bound", TargetConfig { maxh2cdata: MAX_H2C_DATA + 4096, ..ok.clone() }),
        ("maxh2cdata u32::MAX", TargetConfig { maxh2cdata: u32::MAX, ..ok.clone() }),
        ("queue budget above the bound", TargetConfig { queue_budget: MAX_QUEUE_BUDGET + 1, ..ok.clone() }),
        ("setup timeout 0", TargetConfig { setup_timeout_ms: 0, ..ok.clone() }),
        ("mdts 13", TargetConfig { mdts: 13, ..ok.clone() }),
    ];
    for (what, cfg) in cases {
        assert!(cfg.validate().is_err(), "{what} was accepted");
        let ns = Arc::new(MemNamespace::new(1 << 20, 512).unwrap()) as Arc<dyn Namespace>;
        assert!(Subsystem::new(TargetConfig { nqn: NQN.into(), ..cfg }, vec![ns]).is_err(), "{what}");
    }
}

#[test]
fn connect_data_by_r2t_is_accepted() {
    let (subsys, _) = subsystem(TargetConfig::default());
    // An in-capsule limit below 1024 makes the host send the Connect data by R2T.
    let mut a = Pair::new(&subsys, HostQueueConfig { in_capsule: 512, ..HostQueueConfig::admin(true, true) });
    let cqe = connect(&mut a, 0, fabrics::CNTLID_DYNAMIC, 0);
    assert!(cqe.status.is_success(), "{}", cqe.status);
    assert_eq!(a.target.stats.r2ts, 1);
}

#[test]
fn keep_alive_expiry_removes_the_controller_and_its_queues() {
    let (subsys, _) = subsystem(TargetConfig::default());
    let (mut a, cntlid) = bring_up(&subsys, false, false);
    let mut q = io_queue(&subsys, cntlid, 1, false, false, 8192);
    a.now = 1_500_000_000;
    assert!(a.run(admin_cmd(admin::KEEP_ALIVE, 0, 0), vec![]).cqe.status.is_success());
    assert!(!a.target.poll(3_000_000_000), "keep-alive at 1.5 s pushes expiry to 3.5 s");
    assert!(a.target.poll(3_600_000_000));
    assert_eq!(a.target.close_reason(), Some(&CloseReason::KeepAliveExpired));
    assert_eq!(subsys.controller_count(), 0);
    assert!(q.target.poll(3_600_000_000));
    assert_eq!(q.target.close_reason(), Some(&CloseReason::ControllerGone));
    // Reconnect: a new controller, and QID 1 is free again on it.
    let (_a2, cntlid2) = bring_up(&subsys, false, false);
    assert_ne!(cntlid2, 0);
    let _q2 = io_queue(&subsys, cntlid2, 1, false, false, 8192);
    assert_eq!(subsys.controller_count(), 1);
    drop(q);
}

/// Feeds raw bytes to a connected I/O queue and returns the termination request it sent.
fn violation_after(subsys: &Arc<Subsystem>, cntlid: u16, hd: bool, bytes: &[u8]) -> (u16, u32, bool) {
    let mut q = io_queue(subsys, cntlid, 1, hd, false, 8192);
    let used = q.target.handle_input(bytes, 0);
    q.target.run_storage(0);
    let out = q.target.poll_output().to_vec();
    let closed = q.target.close_reason().is_some();
    assert!(used <= bytes.len());
    if out.is_empty() {
        return (0, 0, closed);
    }
    assert_eq!(out[0], 0x03, "C2H termination request");
    (u16::from_le_bytes([out[8], out[9]]), u32::from_le_bytes([out[10], out[11], out[12], out[13]]), closed)
}

#[test]
fn malformed_input_gets_the_right_termination_and_writes_nothing() {
    let (subsys, ns) = subsystem(TargetConfig::default());
    let (_a, cntlid) = bring_up(&subsys, false, false);
    let tx = TxConfig::default();
    let mut write = rw(nvm::WRITE, 0, 1);
    write.set_sgl(netlane_nvme::proto::cmd::SglDesc { addr: 0, len: 4096, id: netlane_nvme::proto::cmd::SGL_ICD });
    let mut good = Vec::new();
    tx.capsule_cmd(&mut good, &write, &[0xee; 4096]);

    let cases: Vec<(&str, Vec<u8>, bool, u16, u32)> = vec![
        (
            "bad hlen",
            {
                let mut b = good.clone();
                b[2] = 18;
                b
            },
            false,
            Fes::InvalidHeaderField as u16,
            2,
        ),
        (
            "bad pdo",
            {
                let mut b = good.clone();
                b[3] = 70;
                b
            },
            false,
            Fes::InvalidHeaderField as u16,
            3,
        ),
        (
            "plen shorter than the header",
            {
                let mut b = good.clone();
                b[4..8].copy_from_slice(&40u32.to_le_bytes());
                b
            },
            false,
            1,
            3,
        ),
        (
            "wrong direction",
            {
                let mut b = good.clone();
                b[0] = 0x05;
                b
            },
            false,
            1,
            0,
        ),
        (
            "header digest",
            {
                let mut b = Vec::new();
                TxConfig { hdgst: true, ..tx }.capsule_cmd(&mut b, &write, &[0xee; 4096]);
                b[30] ^= 0xff;
                b
            },
            true,
            Fes::HeaderDigestError as u16,
            0,
        ),
        (
            "in-capsule data beyond the command",
            {
                let mut w = write;
                w.set_sgl(netlane_nvme::proto::cmd::SglDesc {
                    addr: 0,
                    len: 2048,
                    id: netlane_nvme::proto::cmd::SGL_ICD,
                });
                let mut b = Vec::new();
                tx.capsule_cmd(&mut b, &w, &[0xee; 4096]);
                b
            },
            false,
            Fes::DataOutOfRange as u16,
            0,
        ),
        (
            "H2CData for an unknown ttag",
            {
                let mut b = Vec::new();
                tx.h2c_data(&mut b, 0, 77, 0, &[0xee; 4096], true);
                b
            },
            false,
            1,
            10,
        ),
        (
            "digests not negotiated",
            {
                let mut b = Vec::new();
                TxConfig { hdgst: true, ..tx }.capsule_cmd(&mut b, &write, &[0xee; 4096]);
                b
            },
            false,
            1,
            1,
        ),
    ];
    for (name, bytes, hd, fes, fei) in cases {
        let (got_fes, got_fei, closed) = violation_after(&subsys, cntlid, hd, &bytes);
        assert_eq!((got_fes, got_fei), (fes, fei), "{name}");
        assert!(closed, "{name}: connection closed");
    }
    // Truncated PDU: nothing consumed, nothing sent, nothing written.
    let (fes, _, closed) = violation_after(&subsys, cntlid, false, &good[..good.len() - 1]);
    assert_eq!((fes, closed), (0, false));
    let mut back = vec![0u8; 4096];
    ns.read(0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0), "no malformed write reached the namespace");
    // H2CData beyond the R2T: set up an R2T write, then overrun it.
    let mut q = io_queue(&subsys, cntlid, 1, false, false, 0);
    q.host.submit(rw(nvm::WRITE, 0, 1), vec![0xee; 4096], 1).unwrap();
    let cap = q.host.poll_output().to_vec();
    q.host.handle_written(cap.len());
    q.target.handle_input(&cap, 0);
    let r2t = q.target.poll_output().to_vec();
    q.target.handle_written(r2t.len());
    assert_eq!(r2t[0], 0x09);
    let ttag = u16::from_le_bytes([r2t[10], r2t[11]]);
    let mut over = Vec::new();
    tx.h2c_data(&mut over, 0, ttag, 0, &[0xee; 8192], true);
    q.target.handle_input(&over, 0);
    let out = q.target.poll_output();
    assert_eq!((out[0], out[8]), (0x03, Fes::DataOutOfRange as u8));
    ns.read(0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0));
    // Data digest error on in-capsule data: the command fails, the connection stays.
    let mut q = io_queue(&subsys, cntlid, 2, false, true, 8192);
    let mut b = Vec::new();
    let mut w = write;
    w.set_cid(3);
    TxConfig { ddgst: true, ..tx }.capsule_cmd(&mut b, &w, &[0xee; 4096]);
    let n = b.len();
    b[n - 100] ^= 1;
    q.target.handle_input(&b, 0);
    q.target.run_storage(0);
    q.to_host.extend_from_slice(q.target.poll_output());
    assert!(q.target.close_reason().is_none());
    let rsp = pdu::decode(
        q.target.poll_output(),
        &pdu::RxConfig {
            role: Role::Host,
            established: true,
            hdgst: false,
            ddgst: true,
            pda: 4,
            max_icd: 0,
            max_data: 1 << 20,
        },
    )
    .unwrap();
    match rsp.pdu {
        pdu::Pdu::CapsuleResp { cqe } => assert_eq!(cqe.status, Status::TRANSIENT_TRANSPORT),
        other => panic!("{other:?}"),
    }
    ns.read(0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0));
    // Other controllers keep working.
    let (_a2, c2) = bring_up(&subsys, false, false);
    let mut q2 = io_queue(&subsys, c2, 1, false, false, 8192);
    assert!(q2.run(rw(nvm::READ, 0, 1), vec![0; 4096]).cqe.status.is_success());
}

#[test]
fn host_refuses_a_mismatched_icresp_and_bad_c2h() {
    // ICResp digest bits not echoed.
    let mut h = HostQueue::new(HostQueueConfig::admin(true, false));
    let mut b = Vec::new();
    TxConfig::ic_resp(&mut b, &pdu::IcResp { pfv: 0, cpda: 0, hdgst: false, ddgst: false, maxh2cdata: 65536 });
    assert!(h.handle_input(&b).is_err());
    // maxh2cdata too small.
    let mut h = HostQueue::new(HostQueueConfig::admin(false, false));
    let mut b = Vec::new();
    TxConfig::ic_resp(&mut b, &pdu::IcResp { pfv: 0, cpda: 0, hdgst: false, ddgst: false, maxh2cdata: 1024 });
    assert!(h.handle_input(&b).is_err());
    // C2HData out of order: H2C termination request, and fail_all returns the command.
    let mut h = HostQueue::new(HostQueueConfig::admin(false, false));
    let mut b = Vec::new();
    TxConfig::ic_resp(&mut b, &pdu::IcResp { pfv: 0, cpda: 0, hdgst: false, ddgst: false, maxh2cdata: 65536 });
    h.handle_input(&b).unwrap();
    let cid = h.submit(rw(nvm::READ, 0, 2), vec![0; 8192], 42).unwrap();
    let mut b = Vec::new();
    TxConfig::default().c2h_data_with(&mut b, cid, 4096, 4096, true, false, |d| d.fill(1));
    assert!(h.handle_input(&b).is_err());
    assert!(h.poll_output().ends_with(&[]) && h.poll_output().iter().any(|_| true));
    let failed = h.fail_all();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].token, 42);
    assert_eq!(failed[0].cqe.status, Status::TRANSIENT_TRANSPORT);
}

#[test]
fn host_sends_each_r2t_range_once() {
    let mut h = HostQueue::new(HostQueueConfig { qid: 1, in_capsule: 0, ..HostQueueConfig::admin(false, false) });
    let mut b = Vec::new();
    TxConfig::ic_resp(&mut b, &pdu::IcResp { pfv: 0, cpda: 0, hdgst: false, ddgst: false, maxh2cdata: 65536 });
    h.handle_input(&b).unwrap();
    let cid = h.submit(rw(nvm::WRITE, 0, 4), pattern(16384, 3), 7).unwrap();
    let sent = |h: &mut HostQueue| {
        let n = h.poll_output().len();
        h.handle_written(n);
        n
    };
    sent(&mut h);
    // Two halves, in order: both answered.
    for off in [0u32, 8192] {
        let mut r = Vec::new();
        TxConfig::default().r2t(&mut r, cid, 1, off, 8192);
        h.handle_input(&r).unwrap();
        assert_eq!(sent(&mut h), 24 + 8192, "one H2CData PDU for the range at {off}");
    }
    // The same range again, or one overlapping what was sent: a violation, nothing resent.
    for (off, len) in [(8192u32, 8192u32), (4096, 4096)] {
        let mut h2 = HostQueue::new(HostQueueConfig { qid: 1, in_capsule: 0, ..HostQueueConfig::admin(false, false) });
        h2.handle_input(&b).unwrap();
        let cid = h2.submit(rw(nvm::WRITE, 0, 4), pattern(16384, 3), 7).unwrap();
        sent(&mut h2);
        let mut r = Vec::new();
        TxConfig::default().r2t(&mut r, cid, 1, 0, 12288);
        h2.handle_input(&r).unwrap();
        sent(&mut h2);
        let mut r = Vec::new();
        TxConfig::default().r2t(&mut r, cid, 1, off, len);
        assert!(h2.handle_input(&r).is_err(), "R2T at {off}+{len} after 0+12288 was accepted");
        let out = h2.poll_output();
        assert_eq!(out.first(), Some(&0x02), "an H2C termination request, not data: {:?}", &out[..out.len().min(8)]);
        assert_eq!(h2.stats.h2c_pdus, 1);
    }
}

#[test]
fn term_req_from_the_host_closes_the_queue() {
    let (subsys, _) = subsystem(TargetConfig::default());
    let (mut a, _) = bring_up(&subsys, false, false);
    let mut b = Vec::new();
    TxConfig::term_req(&mut b, Role::Host, Fes::PduSequenceError, 0, &[]);
    a.target.handle_input(&b, 0);
    assert_eq!(a.target.close_reason(), Some(&CloseReason::PeerTerminated { fes: 2 }));
    assert_eq!(subsys.controller_count(), 0, "closing the admin queue removes the controller");
}

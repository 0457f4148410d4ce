//! The controller (target) side: a subsystem shared by every connection, and one
//! [`TargetQueue`] state machine per TCP connection.
//!
//! A queue is driven by bytes: [`TargetQueue::handle_input`] consumes whole PDUs from the
//! front of the receive buffer and appends the replies to an output buffer the driver
//! sends ([`TargetQueue::pending_output`] / [`TargetQueue::advance_output`]). Time is an
//! argument (`now_ns`, any monotonic origin), used only for the keep-alive timer.
//!
//! Invariants:
//! - nothing in here blocks or panics on network input; a protocol violation appends a
//!   C2H termination request and moves the queue to closed, after which no input is
//!   processed;
//! - data reaches the namespace only after every byte of the command arrived with a good
//!   digest and inside the command's range; a failed command writes nothing;
//! - the controller registry lock is taken only on Connect, queue teardown and keep-alive
//!   expiry, never on the I/O path.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::cmd::{self, Cqe, DataDir, SGL_ICD, SGL_TRANSPORT, Sqe, Status, admin, nvm};
use crate::fabrics::{self, Connect, InvalidParam, Property, fctype, reg};
use crate::identify::{self, ControllerInfo, NamespaceInfo, cns, fid, lid};
use crate::namespace::Namespace;
use crate::pdu::{self, DecodeError, Fes, H2cData, IcResp, OutBuf, Pdu, Role, RxConfig, TxConfig, Violation};

/// Subsystem-wide settings.
#[derive(Debug, Clone)]
pub struct TargetConfig {
    /// Subsystem NQN hosts must connect to.
    pub nqn: String,
    /// Serial number reported by Identify.
    pub serial: String,
    /// Model reported by Identify.
    pub model: String,
    /// Largest transfer: 4 KiB << mdts bytes.
    pub mdts: u8,
    /// Largest H2CData payload accepted (MAXH2CDATA), bytes.
    pub maxh2cdata: u32,
    /// In-capsule data accepted on I/O queues, bytes.
    pub in_capsule: u32,
    /// In-capsule data accepted on the admin queue, bytes (Connect needs 1024).
    pub admin_in_capsule: u32,
    /// Most I/O queues per controller.
    pub max_io_queues: u16,
    /// Maximum queue entries supported, 0's based (CAP.MQES).
    pub mqes: u16,
    /// Largest C2HData payload sent; longer reads are split.
    pub c2h_max: u32,
    /// Largest R2T; longer writes take several.
    pub r2t_max: u32,
    /// Use the C2HData SUCCESS flag instead of a response capsule when the host disabled
    /// SQ flow control. Some hosts have broken on it; this turns it off.
    pub c2h_success: bool,
    /// Keep-alive granularity reported (KAS), 100 ms units.
    pub kas: u16,
}

impl Default for TargetConfig {
    fn default() -> Self {
        TargetConfig {
            nqn: "nqn.2026-11.io.netlane:target".into(),
            serial: "netlane0001".into(),
            model: "netlane user-space NVMe/TCP".into(),
            mdts: 9,
            maxh2cdata: 128 * 1024,
            in_capsule: 8192,
            admin_in_capsule: 8192,
            max_io_queues: 64,
            mqes: 127,
            c2h_max: 128 * 1024,
            r2t_max: 4 * 1024 * 1024,
            c2h_success: true,
            kas: 1,
        }
    }
}

impl TargetConfig {
    /// Checks the settings a user can get wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.nqn.is_empty() || self.nqn.len() > 223 {
            return Err(format!("subsystem NQN must be 1..=223 bytes, got {}", self.nqn.len()));
        }
        if self.maxh2cdata < 4096 || !self.maxh2cdata.is_multiple_of(4) {
            return Err(format!("maxh2cdata {} must be >= 4096 and a multiple of 4", self.maxh2cdata));
        }
        if self.admin_in_capsule < fabrics::CONNECT_DATA_LEN as u32 {
            return Err("admin in-capsule data must hold the 1024-byte Connect data".into());
        }
        if self.c2h_max == 0 || self.r2t_max == 0 {
            return Err("c2h_max and r2t_max must be non-zero".into());
        }
        if self.mqes == 0 || self.max_io_queues == 0 {
            return Err("queue size and count must be non-zero".into());
        }
        if self.mdts == 0 || self.mdts > 12 {
            return Err(format!("mdts {} must be 1..=12 (8 KiB..16 MiB)", self.mdts));
        }
        Ok(())
    }

    fn max_transfer(&self) -> u64 {
        4096u64 << self.mdts
    }
}

/// Counters kept per subsystem for the SMART log and reports.
#[derive(Debug, Default)]
pub struct SubsystemStats {
    /// 512-byte units read.
    pub sectors_read: AtomicU64,
    /// 512-byte units written.
    pub sectors_written: AtomicU64,
    /// Read commands completed.
    pub read_cmds: AtomicU64,
    /// Write commands completed.
    pub write_cmds: AtomicU64,
    /// Connections terminated for a protocol violation.
    pub terminations: AtomicU64,
    /// Data digest errors seen.
    pub data_digest_errors: AtomicU64,
    /// Controllers removed because their keep-alive timer expired.
    pub keepalive_expiries: AtomicU64,
}

/// One controller: the admin queue and its I/O queues, possibly on several connections
/// and threads.
#[derive(Debug)]
pub struct Controller {
    /// Controller ID.
    pub cntlid: u16,
    /// Host NQN that created it; I/O queues must come from the same host.
    pub hostnqn: String,
    /// Keep-alive timeout in ms (0 = none).
    pub kato_ms: u32,
    cc: AtomicU32,
    csts: AtomicU32,
    io_queues: AtomicU16,
    aen_config: AtomicU32,
    alive: AtomicBool,
    connected: Mutex<Vec<bool>>,
}

impl Controller {
    /// Whether the controller still exists (false after keep-alive expiry or when its
    /// admin queue went away).
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }
    fn ready(&self) -> bool {
        self.csts.load(Ordering::Acquire) & fabrics::CSTS_RDY != 0
    }
}

/// A subsystem: its namespaces and live controllers.
#[derive(Debug)]
pub struct Subsystem {
    /// Settings.
    pub config: TargetConfig,
    namespaces: Vec<Arc<dyn Namespace>>,
    controllers: Mutex<HashMap<u16, Arc<Controller>>>,
    next_cntlid: Mutex<u16>,
    /// Counters.
    pub stats: SubsystemStats,
}

impl Subsystem {
    /// A subsystem serving `namespaces` as NSIDs 1, 2, ...
    pub fn new(config: TargetConfig, namespaces: Vec<Arc<dyn Namespace>>) -> Result<Arc<Subsystem>, String> {
        config.validate()?;
        if namespaces.is_empty() {
            return Err("a subsystem needs at least one namespace".into());
        }
        for (i, ns) in namespaces.iter().enumerate() {
            if u64::from(ns.block_size()) > config.max_transfer() {
                return Err(format!("namespace {} block size exceeds the maximum transfer", i + 1));
            }
        }
        Ok(Arc::new(Subsystem {
            config,
            namespaces,
            controllers: Mutex::new(HashMap::new()),
            next_cntlid: Mutex::new(1),
            stats: SubsystemStats::default(),
        }))
    }

    /// Number of live controllers.
    pub fn controller_count(&self) -> usize {
        self.controllers.lock().map(|c| c.len()).unwrap_or(0)
    }

    fn namespace(&self, nsid: u32) -> Option<&Arc<dyn Namespace>> {
        (nsid as usize).checked_sub(1).and_then(|i| self.namespaces.get(i))
    }

    fn nsinfo(&self, nsid: u32, ns: &dyn Namespace) -> NamespaceInfo {
        let mut nguid = [0u8; 16];
        let tag = crate::digest::crc32c(self.config.nqn.as_bytes());
        nguid[..4].copy_from_slice(&tag.to_be_bytes());
        nguid[12..].copy_from_slice(&nsid.to_be_bytes());
        NamespaceInfo { blocks: ns.blocks(), block_size: ns.block_size(), nguid }
    }

    fn create_controller(&self, hostnqn: &str, kato_ms: u32) -> Option<Arc<Controller>> {
        let mut ctrls = self.controllers.lock().ok()?;
        let mut next = self.next_cntlid.lock().ok()?;
        // CNTLIDs 1..=0xffef are valid for dynamic controllers.
        for _ in 0..0xffef {
            let id = *next;
            *next = if id >= 0xffef { 1 } else { id + 1 };
            if let std::collections::hash_map::Entry::Vacant(e) = ctrls.entry(id) {
                let c = Arc::new(Controller {
                    cntlid: id,
                    hostnqn: hostnqn.to_string(),
                    kato_ms,
                    cc: AtomicU32::new(0),
                    csts: AtomicU32::new(0),
                    io_queues: AtomicU16::new(self.config.max_io_queues),
                    aen_config: AtomicU32::new(0),
                    alive: AtomicBool::new(true),
                    connected: Mutex::new(vec![false; usize::from(self.config.max_io_queues) + 1]),
                });
                c.connected.lock().ok()?[0] = true;
                e.insert(c.clone());
                return Some(c);
            }
        }
        None
    }

    fn find_controller(&self, cntlid: u16) -> Option<Arc<Controller>> {
        self.controllers.lock().ok()?.get(&cntlid).cloned()
    }

    fn remove_controller(&self, c: &Controller) {
        c.alive.store(false, Ordering::Release);
        if let Ok(mut ctrls) = self.controllers.lock() {
            ctrls.remove(&c.cntlid);
        }
    }
}

/// Why a queue closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseReason {
    /// We found a protocol violation and sent a termination request.
    Violation(Violation),
    /// The host sent a termination request.
    PeerTerminated {
        /// The host's Fatal Error Status.
        fes: u16,
    },
    /// A termination request with an invalid length: closed without reply.
    InvalidTermReq,
    /// The host disconnected the queue with a Disconnect command.
    Disconnected,
    /// The controller's keep-alive timer expired.
    KeepAliveExpired,
    /// The controller went away (its admin queue closed or expired).
    ControllerGone,
}

#[derive(Debug)]
enum State {
    AwaitIcReq,
    AwaitConnect,
    Live,
    Closed(CloseReason),
}

/// A command whose host-to-controller data arrives by R2T/H2CData.
#[derive(Debug)]
struct Inbound {
    sqe: Sqe,
    buf: Vec<u8>,
    next_r2to: u32,
    received: u32,
    outstanding: u32,
    failed: Option<Status>,
}

/// One outstanding R2T.
#[derive(Debug, Clone, Copy)]
struct R2tState {
    cid: u16,
    r2to: u32,
    r2tl: u32,
    got: u32,
}

/// Per-queue counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct QueueStats {
    /// Commands received.
    pub commands: u64,
    /// Response capsules sent.
    pub responses: u64,
    /// C2HData PDUs sent.
    pub c2h_pdus: u64,
    /// R2Ts sent.
    pub r2ts: u64,
    /// Completions carried by the C2HData SUCCESS flag.
    pub success_flag: u64,
}

/// Outcome of executing a command.
enum Outcome {
    Done(Status, u32),
    /// Success with a 64-bit value in DW0/DW1 (Property Get).
    Value(u64),
    Data(Vec<u8>),
    ReadNs {
        nsid: u32,
        offset: u64,
        len: u32,
    },
    Hold,
}

/// One NVMe/TCP connection on the controller side.
#[derive(Debug)]
pub struct TargetQueue {
    subsys: Arc<Subsystem>,
    rx: RxConfig,
    tx: TxConfig,
    maxr2t: u32,
    state: State,
    qid: u16,
    ctrl: Option<Arc<Controller>>,
    sqsize: u16,
    sqhd: u16,
    sqflow_disabled: bool,
    inbound: HashMap<u16, Inbound>,
    r2ts: HashMap<u16, R2tState>,
    next_ttag: u16,
    held_aers: Vec<u16>,
    last_keepalive_ns: u64,
    out: OutBuf,
    /// Counters.
    pub stats: QueueStats,
}

impl TargetQueue {
    /// A new connection to `subsys`, accepted at `now_ns`.
    pub fn new(subsys: Arc<Subsystem>, now_ns: u64) -> TargetQueue {
        TargetQueue {
            subsys,
            rx: RxConfig::initial(Role::Controller),
            tx: TxConfig::default(),
            maxr2t: 0,
            state: State::AwaitIcReq,
            qid: 0,
            ctrl: None,
            sqsize: 0,
            sqhd: 0,
            sqflow_disabled: false,
            inbound: HashMap::new(),
            r2ts: HashMap::new(),
            next_ttag: 0,
            held_aers: Vec::new(),
            last_keepalive_ns: now_ns,
            out: OutBuf::with_capacity(64 * 1024),
            stats: QueueStats::default(),
        }
    }

    /// Bytes waiting to be sent.
    pub fn pending_output(&self) -> &[u8] {
        self.out.pending()
    }

    /// Marks `n` bytes of [`Self::pending_output`] as sent.
    pub fn advance_output(&mut self, n: usize) {
        self.out.advance(n);
    }

    /// Why the queue closed, once it has. The driver closes the socket after sending the
    /// pending output (a termination request or a Disconnect's response).
    pub fn close_reason(&self) -> Option<&CloseReason> {
        match &self.state {
            State::Closed(r) => Some(r),
            _ => None,
        }
    }

    /// The queue ID once connected.
    pub fn qid(&self) -> Option<u16> {
        matches!(self.state, State::Live).then_some(self.qid)
    }

    /// The controller ID once connected.
    pub fn cntlid(&self) -> Option<u16> {
        self.ctrl.as_ref().map(|c| c.cntlid)
    }

    /// Consumes whole PDUs from the front of `buf`, appending replies to the output, and
    /// returns how many bytes were consumed (the rest is an incomplete PDU; keep it and
    /// call again with more). Once the queue is closed nothing more is consumed.
    pub fn handle_input(&mut self, buf: &[u8], now_ns: u64) -> usize {
        let mut off = 0;
        while !matches!(self.state, State::Closed(_)) {
            let rest = &buf[off..];
            match pdu::decode(rest, &self.rx) {
                Ok(d) => {
                    let raw = &rest[..d.len];
                    if let Err(v) = self.on_pdu(d.pdu, now_ns) {
                        self.terminate(v, raw);
                    }
                    off += d.len;
                }
                Err(DecodeError::Incomplete(_)) => break,
                Err(DecodeError::Violation(v)) => {
                    self.terminate(v, pdu::offending_header(rest));
                }
                Err(DecodeError::Reset) => self.close(CloseReason::InvalidTermReq),
            }
        }
        off
    }

    /// How many bytes the next PDU needs in total, given what is buffered (so the driver
    /// can size its receive buffer); `None` when the header is not in yet.
    pub fn needed(&self, buf: &[u8]) -> Option<usize> {
        match pdu::decode(buf, &self.rx) {
            Err(DecodeError::Incomplete(n)) if n > pdu::CH_LEN => Some(n),
            _ => None,
        }
    }

    /// Runs timers: keep-alive expiry on the admin queue, controller loss on I/O queues.
    /// Returns true when the queue has closed.
    pub fn poll(&mut self, now_ns: u64) -> bool {
        if let (State::Live, Some(ctrl)) = (&self.state, &self.ctrl) {
            if !ctrl.is_alive() {
                self.close(CloseReason::ControllerGone);
            } else if self.qid == 0 && ctrl.kato_ms != 0 {
                let limit = u64::from(ctrl.kato_ms) * 1_000_000;
                if now_ns.saturating_sub(self.last_keepalive_ns) > limit {
                    self.subsys.stats.keepalive_expiries.fetch_add(1, Ordering::Relaxed);
                    self.close(CloseReason::KeepAliveExpired);
                }
            }
        }
        matches!(self.state, State::Closed(_))
    }

    /// When [`Self::poll`] next needs to run, in ns on the same clock, if ever.
    pub fn next_deadline(&self) -> Option<u64> {
        match (&self.state, &self.ctrl) {
            (State::Live, Some(c)) if self.qid == 0 && c.kato_ms != 0 => {
                Some(self.last_keepalive_ns + u64::from(c.kato_ms) * 1_000_000 + 1)
            }
            _ => None,
        }
    }

    fn close(&mut self, reason: CloseReason) {
        if matches!(self.state, State::Closed(_)) {
            return;
        }
        self.state = State::Closed(reason);
        self.inbound.clear();
        self.r2ts.clear();
        self.release();
    }

    /// Gives the queue back to its controller (and removes the controller with its admin
    /// queue).
    fn release(&mut self) {
        if let Some(ctrl) = self.ctrl.take() {
            if self.qid == 0 {
                self.subsys.remove_controller(&ctrl);
            } else if let Ok(mut c) = ctrl.connected.lock()
                && let Some(slot) = c.get_mut(usize::from(self.qid))
            {
                *slot = false;
            }
        }
    }

    fn terminate(&mut self, v: Violation, offending: &[u8]) {
        tracing::debug!(qid = self.qid, "terminating queue: {v}");
        self.subsys.stats.terminations.fetch_add(1, Ordering::Relaxed);
        TxConfig::term_req(self.out.vec(), Role::Controller, v.fes, v.fei, offending);
        self.close(CloseReason::Violation(v));
    }

    fn on_pdu(&mut self, p: Pdu<'_>, now_ns: u64) -> Result<(), Violation> {
        match p {
            Pdu::IcReq(req) => self.on_icreq(req),
            Pdu::TermReq { fes, .. } => {
                self.close(CloseReason::PeerTerminated { fes });
                Ok(())
            }
            Pdu::CapsuleCmd { sqe, data, ddgst_ok } => {
                self.stats.commands += 1;
                self.sqhd = if self.sqsize == 0 { 0 } else { (self.sqhd + 1) % (self.sqsize.saturating_add(1)) };
                self.on_command(sqe, data, ddgst_ok, now_ns)
            }
            Pdu::H2cData(h) => self.on_h2c_data(h, now_ns),
            // validate_header refuses odd types at a controller.
            Pdu::IcResp(_) | Pdu::CapsuleResp { .. } | Pdu::C2hData { .. } | Pdu::R2t { .. } => {
                Err(Violation::new(Fes::InvalidHeaderField, 0, "controller-to-host PDU"))
            }
        }
    }

    fn on_icreq(&mut self, req: pdu::IcReq) -> Result<(), Violation> {
        if req.pfv != 0 {
            return Err(Violation::new(Fes::UnsupportedParameter, 8, "unsupported PDU format version"));
        }
        if req.hpda > 31 {
            return Err(Violation::new(Fes::UnsupportedParameter, 10, "HPDA above 31"));
        }
        let cfg = &self.subsys.config;
        self.maxr2t = req.maxr2t;
        self.tx = TxConfig { hdgst: req.hdgst, ddgst: req.ddgst, pda: (u32::from(req.hpda) + 1) * 4 };
        self.rx = RxConfig {
            role: Role::Controller,
            established: true,
            hdgst: req.hdgst,
            ddgst: req.ddgst,
            pda: 4, // CPDA 0: no alignment beyond dwords
            max_icd: cfg.admin_in_capsule.max(cfg.in_capsule),
            max_data: cfg.maxh2cdata,
        };
        TxConfig::ic_resp(
            self.out.vec(),
            &IcResp { pfv: 0, cpda: 0, hdgst: req.hdgst, ddgst: req.ddgst, maxh2cdata: cfg.maxh2cdata },
        );
        self.state = State::AwaitConnect;
        Ok(())
    }

    fn respond(&mut self, cid: u16, status: Status, dw0: u32) {
        self.respond_value(cid, status, u64::from(dw0));
    }

    fn respond_value(&mut self, cid: u16, status: Status, value: u64) {
        let cqe = Cqe { dw0: value as u32, dw1: (value >> 32) as u32, sqhd: self.sqhd, sqid: self.qid, cid, status };
        self.tx.capsule_resp(self.out.vec(), &cqe);
        self.stats.responses += 1;
    }

    fn on_command(&mut self, sqe: Sqe, data: &[u8], ddgst_ok: bool, now_ns: u64) -> Result<(), Violation> {
        let cid = sqe.cid();
        if self.inbound.contains_key(&cid) || self.held_aers.contains(&cid) {
            self.respond(cid, Status::CMD_SEQ_ERROR, 0);
            return Ok(());
        }
        let sgl = sqe.sgl();
        if sqe.flags() & 0xc0 != cmd::PSDT_SGL {
            self.respond(cid, Status::INVALID_FIELD, 0);
            return Ok(());
        }
        let dir = sqe.data_dir();
        if !data.is_empty() {
            // In-capsule data: an offset SGL at 0 whose length covers exactly the data.
            let limit = if self.qid == 0 { self.subsys.config.admin_in_capsule } else { self.subsys.config.in_capsule };
            if data.len() as u64 > u64::from(sgl.len) || data.len() > limit as usize {
                return Err(Violation::new(Fes::DataOutOfRange, 0, "in-capsule data beyond the command's length"));
            }
            if sgl.id != SGL_ICD || dir != DataDir::ToController {
                self.respond(cid, Status::SGL_TYPE_INVALID, 0);
                return Ok(());
            }
            if sgl.addr != 0 {
                self.respond(cid, Status::SGL_OFFSET_INVALID, 0);
                return Ok(());
            }
            if (data.len() as u64) < u64::from(sgl.len) {
                self.respond(cid, Status::SGL_LENGTH_INVALID, 0);
                return Ok(());
            }
            if !ddgst_ok {
                self.subsys.stats.data_digest_errors.fetch_add(1, Ordering::Relaxed);
                self.respond(cid, Status::TRANSIENT_TRANSPORT, 0);
                return Ok(());
            }
            self.execute(sqe, data, now_ns);
            return Ok(());
        }
        if dir == DataDir::ToController && sgl.len > 0 {
            if sgl.id != SGL_TRANSPORT {
                self.respond(cid, Status::SGL_TYPE_INVALID, 0);
                return Ok(());
            }
            // Refuse what could never be accepted before asking the host for data.
            if let Some(status) = self.precheck_inbound(&sqe) {
                self.respond(cid, status, 0);
                return Ok(());
            }
            self.inbound.insert(
                cid,
                Inbound {
                    sqe,
                    buf: vec![0u8; sgl.len as usize],
                    next_r2to: 0,
                    received: 0,
                    outstanding: 0,
                    failed: None,
                },
            );
            self.issue_r2ts(cid);
            return Ok(());
        }
        self.execute(sqe, &[], now_ns);
        Ok(())
    }

    /// Checks a command expecting host data before any R2T goes out.
    fn precheck_inbound(&self, sqe: &Sqe) -> Option<Status> {
        let len = u64::from(sqe.sgl().len);
        match (self.qid, sqe.opcode()) {
            (0, cmd::FABRICS) if sqe.fctype() == fctype::CONNECT => {
                (len != fabrics::CONNECT_DATA_LEN as u64).then_some(Status::SGL_LENGTH_INVALID)
            }
            (q, nvm::WRITE) if q != 0 => self.check_rw(sqe).err(),
            _ => Some(Status::INVALID_OPCODE),
        }
    }

    fn issue_r2ts(&mut self, cid: u16) {
        let max_out = (self.maxr2t.saturating_add(1)).min(16);
        let r2t_max = self.subsys.config.r2t_max;
        loop {
            let Some(cmd) = self.inbound.get_mut(&cid) else { return };
            let total = cmd.buf.len() as u32;
            if cmd.outstanding >= max_out || cmd.next_r2to >= total {
                return;
            }
            let r2to = cmd.next_r2to;
            let r2tl = (total - r2to).min(r2t_max);
            cmd.next_r2to += r2tl;
            cmd.outstanding += 1;
            let mut ttag = self.next_ttag;
            while self.r2ts.contains_key(&ttag) {
                ttag = ttag.wrapping_add(1);
            }
            self.next_ttag = ttag.wrapping_add(1);
            self.r2ts.insert(ttag, R2tState { cid, r2to, r2tl, got: 0 });
            self.tx.r2t(self.out.vec(), cid, ttag, r2to, r2tl);
            self.stats.r2ts += 1;
        }
    }

    fn on_h2c_data(&mut self, h: H2cData<'_>, now_ns: u64) -> Result<(), Violation> {
        let H2cData { cccid, ttag, datao, last, data, ddgst_ok } = h;
        let Some(r2t) = self.r2ts.get_mut(&ttag) else {
            return Err(Violation::new(Fes::InvalidHeaderField, 10, "H2CData for an unknown transfer tag"));
        };
        if r2t.cid != cccid {
            return Err(Violation::new(Fes::InvalidHeaderField, 8, "H2CData CCCID differs from its R2T's"));
        }
        let len = data.len() as u32;
        let end = u64::from(datao) + u64::from(len);
        if datao < r2t.r2to || end > u64::from(r2t.r2to) + u64::from(r2t.r2tl) {
            return Err(Violation::new(Fes::DataOutOfRange, 0, "H2CData outside the R2T's range"));
        }
        if datao != r2t.r2to + r2t.got {
            return Err(Violation::new(Fes::PduSequenceError, 0, "H2CData out of order"));
        }
        let done = r2t.got + len == r2t.r2tl;
        if last != done {
            return Err(Violation::new(Fes::PduSequenceError, 0, "LAST flag does not end the R2T's data"));
        }
        r2t.got += len;
        let Some(cmd) = self.inbound.get_mut(&cccid) else {
            return Err(Violation::new(Fes::InvalidHeaderField, 8, "H2CData for no command"));
        };
        let dst = datao as usize;
        cmd.buf[dst..dst + data.len()].copy_from_slice(data);
        cmd.received += len;
        if !ddgst_ok && cmd.failed.is_none() {
            self.subsys.stats.data_digest_errors.fetch_add(1, Ordering::Relaxed);
            cmd.failed = Some(Status::TRANSIENT_TRANSPORT);
        }
        if !done {
            return Ok(());
        }
        self.r2ts.remove(&ttag);
        cmd.outstanding -= 1;
        if cmd.received as usize == cmd.buf.len() {
            let Some(cmd) = self.inbound.remove(&cccid) else { return Ok(()) };
            match cmd.failed {
                Some(status) => self.respond(cccid, status, 0),
                None => self.execute(cmd.sqe, &cmd.buf, now_ns),
            }
        } else {
            self.issue_r2ts(cccid);
        }
        Ok(())
    }

    /// Runs a command whose data (if any) is all here, and sends its completion.
    fn execute(&mut self, sqe: Sqe, data: &[u8], now_ns: u64) {
        let cid = sqe.cid();
        let outcome = match self.state {
            State::AwaitConnect => {
                if sqe.opcode() == cmd::FABRICS && sqe.fctype() == fctype::CONNECT {
                    self.connect(&sqe, data, now_ns)
                } else {
                    Outcome::Done(Status::CMD_SEQ_ERROR, 0)
                }
            }
            State::Live if sqe.opcode() == cmd::FABRICS => self.fabrics(&sqe),
            State::Live if self.qid == 0 => self.admin(&sqe, now_ns),
            State::Live => self.io(&sqe, data),
            _ => return,
        };
        match outcome {
            Outcome::Done(status, dw0) => self.respond(cid, status, dw0),
            Outcome::Value(v) => self.respond_value(cid, Status::SUCCESS, v),
            Outcome::Hold => {}
            Outcome::Data(bytes) => {
                let len = (sqe.sgl().len as usize).min(bytes.len());
                self.send_c2h(cid, len, |off, dst| {
                    dst.copy_from_slice(&bytes[off..off + dst.len()]);
                    Ok(())
                });
            }
            Outcome::ReadNs { nsid, offset, len } => {
                let Some(ns) = self.subsys.namespace(nsid).cloned() else {
                    self.respond(cid, Status::INVALID_NS, 0);
                    return;
                };
                if self.send_c2h(cid, len as usize, |off, dst| ns.read(offset + off as u64, dst)) {
                    let st = &self.subsys.stats;
                    st.read_cmds.fetch_add(1, Ordering::Relaxed);
                    st.sectors_read.fetch_add(u64::from(len) / 512, Ordering::Relaxed);
                }
            }
        }
        if matches!(sqe.opcode(), cmd::FABRICS) && sqe.fctype() == fctype::DISCONNECT && self.qid != 0 {
            self.close(CloseReason::Disconnected);
        }
    }

    /// Sends `len` bytes as C2HData PDUs filled by `fill(offset, dst)`, then the
    /// completion (a response capsule, or the SUCCESS flag when allowed). On a fill
    /// error the PDUs are taken back and the command fails; returns success.
    fn send_c2h(
        &mut self,
        cid: u16,
        len: usize,
        mut fill: impl FnMut(usize, &mut [u8]) -> std::io::Result<()>,
    ) -> bool {
        let mark = self.out.vec().len();
        let success_flag = self.sqflow_disabled && self.subsys.config.c2h_success;
        let chunk = self.subsys.config.c2h_max as usize;
        let mut off = 0;
        let mut pdus = 0;
        while off < len {
            let n = (len - off).min(chunk);
            let last = off + n == len;
            let r = self.tx.c2h_data_with(self.out.vec(), cid, off as u32, n, last, success_flag, |d| fill(off, d));
            if let Err(e) = r {
                tracing::warn!(cid, "read failed: {e}");
                self.out.vec().truncate(mark);
                self.respond(cid, Status::READ_ERROR, 0);
                return false;
            }
            off += n;
            pdus += 1;
        }
        self.stats.c2h_pdus += pdus;
        if success_flag && len > 0 {
            self.stats.success_flag += 1;
        } else {
            self.respond(cid, Status::SUCCESS, 0);
        }
        true
    }

    fn connect(&mut self, sqe: &Sqe, data: &[u8], now_ns: u64) -> Outcome {
        let Some(c) = Connect::parse(sqe, data) else {
            return Outcome::Done(Status::SGL_LENGTH_INVALID, 0);
        };
        let bad =
            |in_data, offset| Outcome::Done(Status::CONNECT_INVALID_PARAM, InvalidParam { in_data, offset }.dw0());
        if c.recfmt != 0 {
            return Outcome::Done(Status::CONNECT_INCOMPATIBLE, 0);
        }
        let cfg = &self.subsys.config;
        if c.subnqn != cfg.nqn {
            return bad(true, 256);
        }
        if c.hostnqn.is_empty() {
            return bad(true, 512);
        }
        if c.sqsize == 0 || c.sqsize > cfg.mqes {
            return bad(false, 44);
        }
        let ctrl = if c.qid == 0 {
            if c.cntlid != fabrics::CNTLID_DYNAMIC {
                return bad(true, 16);
            }
            match self.subsys.create_controller(&c.hostnqn, c.kato_ms) {
                Some(ctrl) => ctrl,
                None => return Outcome::Done(Status::CONNECT_BUSY, 0),
            }
        } else {
            let Some(ctrl) = self.subsys.find_controller(c.cntlid) else {
                return bad(true, 16);
            };
            if ctrl.hostnqn != c.hostnqn {
                return Outcome::Done(Status::CONNECT_INVALID_HOST, 0);
            }
            if !ctrl.ready() {
                return Outcome::Done(Status::CMD_SEQ_ERROR, 0);
            }
            if c.qid > ctrl.io_queues.load(Ordering::Acquire) {
                return bad(false, 42);
            }
            let Ok(mut connected) = ctrl.connected.lock() else {
                return Outcome::Done(Status::INTERNAL, 0);
            };
            match connected.get_mut(usize::from(c.qid)) {
                Some(slot) if !*slot => *slot = true,
                // A second Connect for a queue that is already connected.
                _ => return Outcome::Done(Status::CMD_SEQ_ERROR, 0),
            }
            drop(connected);
            ctrl
        };
        let cntlid = ctrl.cntlid;
        self.ctrl = Some(ctrl);
        self.qid = c.qid;
        self.sqsize = c.sqsize;
        self.sqhd = 1 % (c.sqsize + 1);
        self.sqflow_disabled = c.cattr & fabrics::CATTR_DISABLE_SQFLOW != 0;
        self.last_keepalive_ns = now_ns;
        if c.qid != 0 {
            self.rx.max_icd = cfg.in_capsule;
        } else {
            self.rx.max_icd = cfg.admin_in_capsule;
        }
        self.state = State::Live;
        Outcome::Done(Status::SUCCESS, u32::from(cntlid))
    }

    fn fabrics(&mut self, sqe: &Sqe) -> Outcome {
        let Some(ctrl) = self.ctrl.clone() else { return Outcome::Done(Status::CMD_SEQ_ERROR, 0) };
        match sqe.fctype() {
            fctype::CONNECT => Outcome::Done(Status::CMD_SEQ_ERROR, 0),
            fctype::DISCONNECT => Outcome::Done(Status::SUCCESS, 0),
            fctype::PROPERTY_GET if self.qid == 0 => {
                let p = Property::parse(sqe);
                let v = match (p.offset, p.wide) {
                    (reg::CAP, true) => Some(self.cap()),
                    (reg::VS, false) => Some(0x0001_0400),
                    (reg::CC, false) => Some(u64::from(ctrl.cc.load(Ordering::Acquire))),
                    (reg::CSTS, false) => Some(u64::from(ctrl.csts.load(Ordering::Acquire))),
                    _ => None,
                };
                v.map_or(Outcome::Done(Status::INVALID_FIELD, 0), Outcome::Value)
            }
            fctype::PROPERTY_SET if self.qid == 0 => {
                let p = Property::parse(sqe);
                if p.offset != reg::CC || p.wide {
                    return Outcome::Done(Status::INVALID_FIELD, 0);
                }
                let cc = p.value as u32;
                let was = ctrl.cc.swap(cc, Ordering::AcqRel);
                let mut csts = ctrl.csts.load(Ordering::Acquire);
                if cc & fabrics::CC_EN != 0 && was & fabrics::CC_EN == 0 {
                    // IOSQES/IOCQES must describe 64/16-byte entries.
                    if (cc >> 16) & 0xf != 6 || (cc >> 20) & 0xf != 4 {
                        csts |= 2; // CFS: controller fatal status
                    } else {
                        csts |= fabrics::CSTS_RDY;
                    }
                } else if cc & fabrics::CC_EN == 0 {
                    csts &= !fabrics::CSTS_RDY;
                }
                if cc & fabrics::CC_SHN_MASK != 0 {
                    csts = (csts & !(3 << 2)) | fabrics::CSTS_SHST_COMPLETE;
                }
                ctrl.csts.store(csts, Ordering::Release);
                Outcome::Done(Status::SUCCESS, 0)
            }
            _ => Outcome::Done(Status::INVALID_OPCODE, 0),
        }
    }

    fn cap(&self) -> u64 {
        let cfg = &self.subsys.config;
        u64::from(cfg.mqes) // MQES
            | (1 << 16) // CQR: contiguous queues required
            | (15 << 24) // TO: 7.5 s in 500 ms units
            | (1 << 37) // CSS: NVM command set
    }

    fn controller_info(&self, ctrl: &Controller) -> ControllerInfo {
        let cfg = &self.subsys.config;
        ControllerInfo {
            serial: cfg.serial.clone(),
            model: cfg.model.clone(),
            firmware: env!("CARGO_PKG_VERSION").chars().take(8).collect(),
            mdts: cfg.mdts,
            cntlid: ctrl.cntlid,
            version: 0x0001_0400,
            kas: cfg.kas,
            maxcmd: cfg.mqes.saturating_add(1),
            nn: self.subsys.namespaces.len() as u32,
            aerl: 3,
            ioccsz: (64 + cfg.in_capsule) / 16,
            iorcsz: 1,
            subnqn: cfg.nqn.clone(),
        }
    }

    fn admin(&mut self, sqe: &Sqe, now_ns: u64) -> Outcome {
        let Some(ctrl) = self.ctrl.clone() else { return Outcome::Done(Status::CMD_SEQ_ERROR, 0) };
        if ctrl.cc.load(Ordering::Acquire) & fabrics::CC_EN == 0 {
            return Outcome::Done(Status::CMD_SEQ_ERROR, 0);
        }
        match sqe.opcode() {
            admin::IDENTIFY => {
                let nn = self.subsys.namespaces.len() as u32;
                match (sqe.cdw(10) & 0xff) as u8 {
                    cns::CONTROLLER => Outcome::Data(self.controller_info(&ctrl).encode()),
                    cns::NAMESPACE | cns::NS_DESCRIPTORS => {
                        let nsid = sqe.nsid();
                        let Some(ns) = self.subsys.namespace(nsid) else {
                            return Outcome::Done(Status::INVALID_NS, 0);
                        };
                        let info = self.subsys.nsinfo(nsid, ns.as_ref());
                        if (sqe.cdw(10) & 0xff) as u8 == cns::NAMESPACE {
                            Outcome::Data(info.encode())
                        } else {
                            Outcome::Data(info.descriptors())
                        }
                    }
                    cns::ACTIVE_NS_LIST => {
                        if sqe.nsid() >= 0xffff_fffe {
                            return Outcome::Done(Status::INVALID_NS, 0);
                        }
                        Outcome::Data(identify::active_ns_list(nn, sqe.nsid()))
                    }
                    _ => Outcome::Done(Status::INVALID_FIELD, 0),
                }
            }
            admin::GET_LOG_PAGE => {
                let numd = ((sqe.cdw(10) >> 16) | ((sqe.cdw(11) & 0xffff) << 16)) as u64 + 1;
                let offset = u64::from(sqe.cdw(12)) | (u64::from(sqe.cdw(13)) << 32);
                let page = match (sqe.cdw(10) & 0xff) as u8 {
                    lid::ERROR => vec![0u8; 64 * 64],
                    lid::SMART => {
                        let s = &self.subsys.stats;
                        identify::Smart {
                            sectors_read: s.sectors_read.load(Ordering::Relaxed),
                            sectors_written: s.sectors_written.load(Ordering::Relaxed),
                            read_cmds: s.read_cmds.load(Ordering::Relaxed),
                            write_cmds: s.write_cmds.load(Ordering::Relaxed),
                        }
                        .encode()
                    }
                    lid::FIRMWARE => identify::firmware_log(env!("CARGO_PKG_VERSION")),
                    _ => return Outcome::Done(Status::INVALID_LOG_PAGE, 0),
                };
                if offset % 4 != 0 || offset > page.len() as u64 {
                    return Outcome::Done(Status::INVALID_FIELD, 0);
                }
                let mut out = page[offset as usize..].to_vec();
                // Bytes past the end of the page read as zero (NVMe Base 5.16).
                out.resize((numd * 4).min(1 << 20) as usize, 0);
                Outcome::Data(out)
            }
            admin::SET_FEATURES => {
                let v = sqe.cdw(11);
                match (sqe.cdw(10) & 0xff) as u8 {
                    fid::NUM_QUEUES => {
                        if v & 0xffff == 0xffff || v >> 16 == 0xffff {
                            return Outcome::Done(Status::INVALID_FIELD, 0);
                        }
                        let max = self.subsys.config.max_io_queues;
                        let want = ((v & 0xffff) as u16).max((v >> 16) as u16).saturating_add(1);
                        let n = want.min(max);
                        ctrl.io_queues.store(n, Ordering::Release);
                        let z = u32::from(n - 1);
                        Outcome::Done(Status::SUCCESS, z | (z << 16))
                    }
                    fid::ASYNC_EVENT_CONFIG => {
                        ctrl.aen_config.store(v, Ordering::Release);
                        Outcome::Done(Status::SUCCESS, 0)
                    }
                    fid::KEEP_ALIVE | fid::ARBITRATION | fid::POWER_MGMT | fid::VOLATILE_WC => {
                        Outcome::Done(Status::SUCCESS, 0)
                    }
                    _ => Outcome::Done(Status::INVALID_FIELD, 0),
                }
            }
            admin::GET_FEATURES => match (sqe.cdw(10) & 0xff) as u8 {
                fid::NUM_QUEUES => {
                    let z = u32::from(ctrl.io_queues.load(Ordering::Acquire).saturating_sub(1));
                    Outcome::Done(Status::SUCCESS, z | (z << 16))
                }
                fid::ASYNC_EVENT_CONFIG => Outcome::Done(Status::SUCCESS, ctrl.aen_config.load(Ordering::Acquire)),
                fid::KEEP_ALIVE => Outcome::Done(Status::SUCCESS, ctrl.kato_ms),
                fid::VOLATILE_WC => Outcome::Done(Status::SUCCESS, 1),
                fid::ARBITRATION | fid::POWER_MGMT => Outcome::Done(Status::SUCCESS, 0),
                _ => Outcome::Done(Status::INVALID_FIELD, 0),
            },
            admin::ASYNC_EVENT => {
                if self.held_aers.len() >= 4 {
                    Outcome::Done(Status::AER_LIMIT, 0)
                } else {
                    // Held until an event occurs; netlane raises none, so it stays
                    // outstanding for the controller's life, as on real controllers.
                    self.held_aers.push(sqe.cid());
                    Outcome::Hold
                }
            }
            admin::KEEP_ALIVE => {
                self.last_keepalive_ns = now_ns.max(self.last_keepalive_ns);
                Outcome::Done(Status::SUCCESS, 0)
            }
            _ => Outcome::Done(Status::INVALID_OPCODE, 0),
        }
    }

    /// Checks an NVM read/write's namespace, range and transfer length; returns the byte
    /// offset and length.
    fn check_rw(&self, sqe: &Sqe) -> Result<(u64, u32), Status> {
        let ns = self.subsys.namespace(sqe.nsid()).ok_or(Status::INVALID_NS)?;
        let bs = u64::from(ns.block_size());
        let nlb = u64::from(sqe.nlb());
        let end = sqe.slba().checked_add(nlb).ok_or(Status::LBA_RANGE)?;
        if end > ns.blocks() {
            return Err(Status::LBA_RANGE);
        }
        let bytes = nlb * bs;
        if bytes > self.subsys.config.max_transfer() {
            return Err(Status::INVALID_FIELD);
        }
        if u64::from(sqe.sgl().len) != bytes {
            return Err(Status::SGL_LENGTH_INVALID);
        }
        Ok((sqe.slba() * bs, bytes as u32))
    }

    fn io(&mut self, sqe: &Sqe, data: &[u8]) -> Outcome {
        let ctrl_ready = self.ctrl.as_ref().is_some_and(|c| c.ready());
        if !ctrl_ready {
            return Outcome::Done(Status::CMD_SEQ_ERROR, 0);
        }
        match sqe.opcode() {
            nvm::READ => match self.check_rw(sqe) {
                Ok((offset, len)) => Outcome::ReadNs { nsid: sqe.nsid(), offset, len },
                Err(s) => Outcome::Done(s, 0),
            },
            nvm::WRITE => {
                let (offset, len) = match self.check_rw(sqe) {
                    Ok(v) => v,
                    Err(s) => return Outcome::Done(s, 0),
                };
                if data.len() != len as usize {
                    return Outcome::Done(Status::SGL_LENGTH_INVALID, 0);
                }
                let Some(ns) = self.subsys.namespace(sqe.nsid()) else { return Outcome::Done(Status::INVALID_NS, 0) };
                match ns.write(offset, data) {
                    Ok(()) => {
                        let st = &self.subsys.stats;
                        st.write_cmds.fetch_add(1, Ordering::Relaxed);
                        st.sectors_written.fetch_add(u64::from(len) / 512, Ordering::Relaxed);
                        Outcome::Done(Status::SUCCESS, 0)
                    }
                    Err(e) => {
                        tracing::warn!("write failed: {e}");
                        Outcome::Done(Status::WRITE_FAULT, 0)
                    }
                }
            }
            nvm::FLUSH => {
                let result = if sqe.nsid() == 0xffff_ffff {
                    self.subsys.namespaces.iter().try_for_each(|ns| ns.flush())
                } else if let Some(ns) = self.subsys.namespace(sqe.nsid()) {
                    ns.flush()
                } else {
                    return Outcome::Done(Status::INVALID_NS, 0);
                };
                match result {
                    Ok(()) => Outcome::Done(Status::SUCCESS, 0),
                    Err(e) => {
                        tracing::warn!("flush failed: {e}");
                        Outcome::Done(Status::WRITE_FAULT, 0)
                    }
                }
            }
            nvm::WRITE_ZEROES => {
                let Some(ns) = self.subsys.namespace(sqe.nsid()) else { return Outcome::Done(Status::INVALID_NS, 0) };
                let bs = u64::from(ns.block_size());
                let nlb = u64::from(sqe.nlb());
                match sqe.slba().checked_add(nlb) {
                    Some(end) if end <= ns.blocks() => {}
                    _ => return Outcome::Done(Status::LBA_RANGE, 0),
                }
                match ns.write_zeroes(sqe.slba() * bs, nlb * bs) {
                    Ok(()) => Outcome::Done(Status::SUCCESS, 0),
                    Err(e) => {
                        tracing::warn!("write zeroes failed: {e}");
                        Outcome::Done(Status::WRITE_FAULT, 0)
                    }
                }
            }
            _ => Outcome::Done(Status::INVALID_OPCODE, 0),
        }
    }
}

impl Drop for TargetQueue {
    fn drop(&mut self) {
        self.release();
    }
}

//! The queue state machine: one NVMe/TCP connection on the controller side, from the
//! ICReq through Connect to live command processing, R2T/H2CData flow and C2HData,
//! until it closes. The data transfers it starts (R2Ts and the H2CData that answers
//! them, C2HData) are in `transfer.rs`, its counters in `stats.rs`.

use std::borrow::Cow;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::stats::QueueStats;
use super::storage::Storage;
use super::transfer::{Inbound, R2tState};
use super::{Controller, Subsystem};
use crate::proto::cmd::{self, Cqe, DataDir, SGL_ICD, SGL_TRANSPORT, Sqe, Status};
use crate::proto::fabrics::fctype;
use crate::proto::pdu::{self, DecodeError, Fes, IcResp, OutBuf, Pdu, Role, RxConfig, TxConfig, Violation};

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
    /// The host did not finish ICReq and Connect within the setup timeout.
    SetupTimeout,
}

#[derive(Debug)]
pub(super) enum State {
    AwaitIcReq,
    AwaitConnect,
    Live,
    Closed(CloseReason),
}

/// Outcome of executing a command.
pub(super) enum Outcome {
    Done(Status, u32),
    /// Success with a 64-bit value in DW0/DW1 (Property Get).
    Value(u64),
    Data(Vec<u8>),
    /// Held: an Asynchronous Event Request, or a storage request whose completion
    /// answers the command.
    Hold,
}

/// Commands a queue accepts before Connect has set its size (the admin queue depth
/// Linux uses, NVME_AQ_DEPTH).
const SETUP_QUEUE_DEPTH: u32 = 32;

/// One NVMe/TCP connection on the controller side.
#[derive(Debug)]
pub struct TargetQueue {
    pub(super) subsys: Arc<Subsystem>,
    pub(super) rx: RxConfig,
    pub(super) tx: TxConfig,
    pub(super) maxr2t: u32,
    pub(super) state: State,
    pub(super) qid: u16,
    pub(super) ctrl: Option<Arc<Controller>>,
    pub(super) sqsize: u16,
    pub(super) sqhd: u16,
    pub(super) sqflow_disabled: bool,
    pub(super) inbound: HashMap<u16, Inbound>,
    pub(super) r2ts: HashMap<u16, R2tState>,
    pub(super) next_ttag: u16,
    pub(super) held_aers: Vec<u16>,
    pub(super) last_keepalive_ns: u64,
    /// ICReq and Connect must be done by then.
    pub(super) setup_deadline_ns: u64,
    /// Commands received and not yet completed.
    pub(super) outstanding: u32,
    pub(super) storage: Storage,
    /// The address the host reached (for the discovery log).
    pub(super) local: Option<SocketAddr>,
    /// Arrival time of each outstanding command, for its latency.
    pub(super) arrivals: HashMap<u16, u64>,
    /// The latest time the driver gave.
    pub(super) now_ns: u64,
    pub(super) out: OutBuf,
    /// Counters.
    pub stats: QueueStats,
}

impl TargetQueue {
    /// A new connection to `subsys`, accepted at `now_ns`.
    pub fn new(subsys: Arc<Subsystem>, now_ns: u64) -> TargetQueue {
        let subsys_setup_ms = subsys.config.setup_timeout_ms;
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
            setup_deadline_ns: now_ns.saturating_add(u64::from(subsys_setup_ms) * 1_000_000),
            outstanding: 0,
            storage: Storage::default(),
            local: None,
            arrivals: HashMap::new(),
            now_ns,
            out: OutBuf::with_capacity(16 * 1024),
            stats: QueueStats::default(),
        }
    }

    /// Records the local address the host connected to: the discovery log reports it
    /// when the subsystem's configured ports leave the address unspecified.
    pub fn set_local_addr(&mut self, addr: SocketAddr) {
        self.local = Some(addr);
    }

    /// Bytes waiting to be sent.
    pub fn poll_output(&self) -> &[u8] {
        self.out.pending()
    }

    /// Marks `n` bytes of [`Self::poll_output`] as sent.
    pub fn handle_written(&mut self, n: usize) {
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
        self.now_ns = now_ns;
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
                Err(DecodeError::Incomplete(_)) => {
                    // Refuse H2CData that matches no R2T as soon as its header is in,
                    // before buffering up to MAXH2CDATA of it.
                    if let Some(v) = self.early_h2c_check(rest) {
                        self.terminate(v, pdu::offending_header(rest));
                    }
                    break;
                }
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

    /// Checks the header of an incomplete H2CData PDU against the R2Ts outstanding.
    fn early_h2c_check(&self, rest: &[u8]) -> Option<Violation> {
        if rest.len() < pdu::DATA_HLEN || rest[0] != pdu::PduType::H2cData as u8 || !self.rx.established {
            return None;
        }
        let le16 = |o: usize| u16::from_le_bytes([rest[o], rest[o + 1]]);
        let le32 = |o: usize| u32::from_le_bytes([rest[o], rest[o + 1], rest[o + 2], rest[o + 3]]);
        let (ttag, datao, datal) = (le16(10), le32(12), le32(16));
        let Some(r2t) = self.r2ts.get(&ttag) else {
            return Some(Violation::new(Fes::InvalidHeaderField, 10, "H2CData for an unknown transfer tag"));
        };
        let end = u64::from(datao) + u64::from(datal);
        if datao < r2t.r2to || end > u64::from(r2t.r2to) + u64::from(r2t.r2tl) {
            return Some(Violation::new(Fes::DataOutOfRange, 0, "H2CData outside the R2T's range"));
        }
        None
    }

    /// Runs timers: the setup deadline, keep-alive expiry on the admin queue, controller
    /// loss on I/O queues. Returns true when the queue has closed.
    pub fn poll(&mut self, now_ns: u64) -> bool {
        self.now_ns = self.now_ns.max(now_ns);
        if matches!(self.state, State::AwaitIcReq | State::AwaitConnect) && now_ns > self.setup_deadline_ns {
            self.close(CloseReason::SetupTimeout);
        }
        if let (State::Live, Some(ctrl)) = (&self.state, &self.ctrl) {
            if !ctrl.is_alive() {
                self.close(CloseReason::ControllerGone);
            } else if self.qid == 0 && ctrl.kato_ms != 0 {
                let limit = u64::from(ctrl.kato_ms) * 1_000_000;
                if now_ns.saturating_sub(self.last_keepalive_ns) > limit {
                    self.subsys.stats.counts.keepalive_expiries.fetch_add(1, Ordering::Relaxed);
                    self.close(CloseReason::KeepAliveExpired);
                }
            }
        }
        matches!(self.state, State::Closed(_))
    }

    /// When [`Self::poll`] next needs to run, in ns on the same clock, if ever.
    pub fn next_deadline(&self) -> Option<u64> {
        match (&self.state, &self.ctrl) {
            (State::AwaitIcReq | State::AwaitConnect, _) => Some(self.setup_deadline_ns + 1),
            (State::Live, Some(c)) if self.qid == 0 && c.kato_ms != 0 => {
                Some(self.last_keepalive_ns + u64::from(c.kato_ms) * 1_000_000 + 1)
            }
            _ => None,
        }
    }

    pub(super) fn close(&mut self, reason: CloseReason) {
        if matches!(self.state, State::Closed(_)) {
            return;
        }
        self.inbound.clear();
        self.r2ts.clear();
        self.arrivals.clear();
        self.drop_storage(&reason);
        self.state = State::Closed(reason);
        self.release();
    }

    /// Gives the queue back to its controller (and removes the controller with its admin
    /// queue).
    pub(super) fn release(&mut self) {
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

    pub(super) fn terminate(&mut self, v: Violation, offending: &[u8]) {
        tracing::debug!(qid = self.qid, "terminating queue: {v}");
        self.subsys.stats.counts.terminations.fetch_add(1, Ordering::Relaxed);
        TxConfig::term_req(self.out.vec(), Role::Controller, v.fes, v.fei, offending);
        self.close(CloseReason::Violation(v));
    }

    pub(super) fn on_pdu(&mut self, p: Pdu<'_>, now_ns: u64) -> Result<(), Violation> {
        match p {
            Pdu::IcReq(req) => self.on_icreq(req),
            Pdu::TermReq { fes, .. } => {
                self.close(CloseReason::PeerTerminated { fes });
                Ok(())
            }
            Pdu::CapsuleCmd { sqe, data, ddgst_ok } => {
                self.stats.commands += 1;
                // A queue holds SQSIZE + 1 commands (0's based); a host with more
                // outstanding has overrun it. nvmet-tcp fails the connection the same
                // way when it runs out of command slots (drivers/nvme/target/tcp.c,
                // "out of commands").
                let depth = match self.state {
                    State::Live => u32::from(self.sqsize) + 1,
                    _ => SETUP_QUEUE_DEPTH,
                };
                if self.outstanding >= depth {
                    return Err(Violation::new(
                        Fes::PduSequenceError,
                        0,
                        "more outstanding commands than the queue holds (SQSIZE + 1)",
                    ));
                }
                self.outstanding += 1;
                self.arrivals.insert(sqe.cid(), now_ns);
                self.sqhd = next_sqhd(self.sqhd, self.sqsize);
                self.on_command(sqe, data, ddgst_ok, now_ns)
            }
            Pdu::H2cData(h) => self.on_h2c_data(h, now_ns),
            // validate_header refuses odd types at a controller.
            Pdu::IcResp(_) | Pdu::CapsuleResp { .. } | Pdu::C2hData { .. } | Pdu::R2t { .. } => {
                Err(Violation::new(Fes::InvalidHeaderField, 0, "controller-to-host PDU"))
            }
        }
    }

    pub(super) fn on_icreq(&mut self, req: pdu::IcReq) -> Result<(), Violation> {
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

    pub(super) fn respond(&mut self, cid: u16, status: Status, dw0: u32) {
        self.respond_value(cid, status, u64::from(dw0));
    }

    /// Counts a command's completion: latency, and the status when it failed.
    pub(super) fn completed(&mut self, cid: u16, status: Status) {
        self.outstanding = self.outstanding.saturating_sub(1);
        if let Some(t) = self.arrivals.remove(&cid) {
            self.stats.latency.record(self.now_ns.saturating_sub(t));
        }
        if !status.is_success() {
            *self.stats.errors.entry(status.0 & 0x7ff).or_default() += 1;
        }
    }

    pub(super) fn respond_value(&mut self, cid: u16, status: Status, value: u64) {
        self.completed(cid, status);
        let cqe = Cqe { dw0: value as u32, dw1: (value >> 32) as u32, sqhd: self.sqhd, sqid: self.qid, cid, status };
        self.tx.capsule_resp(self.out.vec(), &cqe);
        self.stats.responses += 1;
    }

    pub(super) fn on_command(&mut self, sqe: Sqe, data: &[u8], ddgst_ok: bool, now_ns: u64) -> Result<(), Violation> {
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
                self.subsys.stats.counts.data_digest_errors.fetch_add(1, Ordering::Relaxed);
                self.respond(cid, Status::TRANSIENT_TRANSPORT, 0);
                return Ok(());
            }
            self.execute(sqe, Cow::Borrowed(data), now_ns);
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
            // The buffer is allocated, and the R2Ts sent, when the queue's data budget
            // has room (storage.rs).
            self.inbound.insert(
                cid,
                Inbound {
                    sqe,
                    total: sgl.len,
                    buf: Vec::new(),
                    next_r2to: 0,
                    received: 0,
                    outstanding: 0,
                    failed: None,
                },
            );
            self.storage.r2t_wait.push_back(cid);
            self.admit_inbound();
            return Ok(());
        }
        self.execute(sqe, Cow::Borrowed(&[]), now_ns);
        Ok(())
    }

    /// Runs a command whose data (if any) is all here, and sends its completion (or
    /// leaves it to a storage request).
    pub(super) fn execute(&mut self, sqe: Sqe, data: Cow<'_, [u8]>, now_ns: u64) {
        let cid = sqe.cid();
        let discovery = self.ctrl.as_ref().is_some_and(|c| c.discovery);
        let outcome = match self.state {
            State::AwaitConnect => {
                if sqe.opcode() == cmd::FABRICS && sqe.fctype() == fctype::CONNECT {
                    self.connect(&sqe, &data, now_ns)
                } else {
                    Outcome::Done(Status::CMD_SEQ_ERROR, 0)
                }
            }
            State::Live if sqe.opcode() == cmd::FABRICS => self.fabrics(&sqe),
            State::Live if self.qid == 0 && discovery => self.discovery_admin(&sqe, now_ns),
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
        }
        if matches!(sqe.opcode(), cmd::FABRICS) && sqe.fctype() == fctype::DISCONNECT && self.qid != 0 {
            self.close(CloseReason::Disconnected);
        }
    }
}

/// The submission queue head after one more command, on a queue of `sqsize + 1` slots
/// (in u32: SQSIZE 65535 means 65536 slots).
pub(super) fn next_sqhd(sqhd: u16, sqsize: u16) -> u16 {
    ((u32::from(sqhd) + 1) % (u32::from(sqsize) + 1)) as u16
}

impl Drop for TargetQueue {
    fn drop(&mut self) {
        self.release();
    }
}

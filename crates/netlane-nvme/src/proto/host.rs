//! The host side of one NVMe/TCP queue: command identifiers, in-capsule data or the
//! R2T/H2CData flow, C2HData reassembly, completions.
//!
//! [`HostQueue::submit`] appends a command's PDUs to the output buffer;
//! [`HostQueue::handle_input`] consumes PDUs from the controller and queues
//! [`Completion`]s, each carrying the caller's token and the command's buffer back (the
//! read data, or the write data to reuse). A controller that breaks the protocol gets an
//! H2C termination request and the queue fails; every outstanding command is then
//! returned by [`HostQueue::fail_all`] with a transport error, so nothing is lost
//! silently.

use std::collections::VecDeque;

use crate::proto::cmd::{Cqe, DataDir, SGL_ICD, SGL_TRANSPORT, SglDesc, Sqe, Status};
use crate::proto::pdu::{self, DecodeError, Fes, IcReq, IcResp, OutBuf, Pdu, Role, RxConfig, TxConfig, Violation};

/// Settings of one host queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostQueueConfig {
    /// Queue ID (0 = admin).
    pub qid: u16,
    /// Ask for header digests.
    pub hdgst: bool,
    /// Ask for data digests.
    pub ddgst: bool,
    /// Host PDU data alignment, 0's based dwords.
    pub hpda: u8,
    /// Outstanding R2Ts per command we accept, 0's based.
    pub maxr2t: u32,
    /// Commands in flight at most (CIDs 0..depth).
    pub depth: u16,
    /// In-capsule data limit, bytes (8 KiB on the admin queue; IOCCSZ-derived on I/O).
    pub in_capsule: u32,
    /// Largest C2HData accepted in one PDU.
    pub max_c2h: u32,
}

impl HostQueueConfig {
    /// An admin queue of depth 32 with the given digests.
    pub fn admin(hdgst: bool, ddgst: bool) -> Self {
        HostQueueConfig { qid: 0, hdgst, ddgst, hpda: 0, maxr2t: 0, depth: 32, in_capsule: 8192, max_c2h: 16 << 20 }
    }
}

/// A completed command.
#[derive(Debug)]
pub struct Completion {
    /// The token given to [`HostQueue::submit`].
    pub token: u64,
    /// The completion entry (synthesised for a C2HData SUCCESS completion).
    pub cqe: Cqe,
    /// The command's buffer: read data for reads, the written data for writes.
    pub data: Vec<u8>,
}

/// Why a submission was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// Every command identifier is in use.
    #[error("queue full")]
    Full,
    /// The queue is not initialised yet, or has failed.
    #[error("queue not ready")]
    NotReady,
}

/// What failed a queue.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    /// The controller broke the protocol; we sent a termination request.
    #[error("controller protocol violation: {0}")]
    Violation(Violation),
    /// The controller sent a termination request.
    #[error("controller terminated the connection: FES {fes:#x} FEI {fei:#x}")]
    Terminated {
        /// Its Fatal Error Status.
        fes: u16,
        /// Its Fatal Error Information.
        fei: u32,
    },
    /// ICResp was not acceptable.
    #[error("unacceptable ICResp: {0}")]
    BadIcResp(&'static str),
}

#[derive(Debug)]
struct Inflight {
    token: u64,
    dir: DataDir,
    buf: Vec<u8>,
    in_capsule: bool,
    received: usize,
    r2ts: u32,
    /// End of the host data already sent for R2Ts: a later R2T must start at or after
    /// it, so a controller can never make the host send a byte twice.
    r2t_sent: u64,
    digest_error: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    AwaitIcResp,
    Ready,
    Failed,
}

/// Per-queue counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct HostQueueStats {
    /// Commands submitted.
    pub submitted: u64,
    /// Commands completed.
    pub completed: u64,
    /// Completions that arrived as the C2HData SUCCESS flag.
    pub success_flag: u64,
    /// R2Ts answered.
    pub r2ts: u64,
    /// H2CData PDUs sent.
    pub h2c_pdus: u64,
    /// Data digest errors seen.
    pub digest_errors: u64,
}

/// One host queue (one TCP connection).
#[derive(Debug)]
pub struct HostQueue {
    cfg: HostQueueConfig,
    rx: RxConfig,
    tx: TxConfig,
    maxh2cdata: u32,
    state: State,
    slots: Vec<Option<Inflight>>,
    free: Vec<u16>,
    out: OutBuf,
    done: VecDeque<Completion>,
    /// Counters.
    pub stats: HostQueueStats,
}

impl HostQueue {
    /// A queue that starts by emitting its ICReq.
    pub fn new(cfg: HostQueueConfig) -> HostQueue {
        let depth = cfg.depth.max(1);
        let mut q = HostQueue {
            cfg,
            rx: RxConfig::initial(Role::Host),
            tx: TxConfig::default(),
            maxh2cdata: 0,
            state: State::AwaitIcResp,
            slots: (0..depth).map(|_| None).collect(),
            free: (0..depth).rev().collect(),
            out: OutBuf::with_capacity(16 * 1024),
            done: VecDeque::new(),
            stats: HostQueueStats::default(),
        };
        TxConfig::ic_req(
            q.out.vec(),
            &IcReq { pfv: 0, hpda: cfg.hpda, hdgst: cfg.hdgst, ddgst: cfg.ddgst, maxr2t: cfg.maxr2t },
        );
        q
    }

    /// Whether initialisation finished and the queue has not failed.
    pub fn is_ready(&self) -> bool {
        self.state == State::Ready
    }

    /// The queue's settings.
    pub fn config(&self) -> &HostQueueConfig {
        &self.cfg
    }

    /// Changes the in-capsule data limit (after Identify reports IOCCSZ).
    pub fn set_in_capsule(&mut self, bytes: u32) {
        self.cfg.in_capsule = bytes;
    }

    /// MAXH2CDATA from the controller (0 before ICResp).
    pub fn maxh2cdata(&self) -> u32 {
        self.maxh2cdata
    }

    /// Commands in flight.
    pub fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Free command slots.
    pub fn free_slots(&self) -> usize {
        self.free.len()
    }

    /// Bytes waiting to be sent.
    pub fn poll_output(&self) -> &[u8] {
        self.out.pending()
    }

    /// Marks `n` bytes of output as sent.
    pub fn handle_written(&mut self, n: usize) {
        self.out.advance(n);
    }

    /// Takes the next completion.
    pub fn pop_completion(&mut self) -> Option<Completion> {
        self.done.pop_front()
    }

    /// Queues a command. `data` is the write data for host-to-controller commands, or
    /// the buffer to fill (its length is the transfer length) for controller-to-host
    /// ones; empty for neither. The SQE's CID and SGL are set here.
    pub fn submit(&mut self, mut sqe: Sqe, data: Vec<u8>, token: u64) -> Result<u16, (SubmitError, Vec<u8>)> {
        if self.state != State::Ready {
            return Err((SubmitError::NotReady, data));
        }
        let Some(cid) = self.free.pop() else { return Err((SubmitError::Full, data)) };
        sqe.set_cid(cid);
        let dir = sqe.data_dir();
        let len = data.len() as u32;
        let in_capsule = dir == DataDir::ToController && len > 0 && len <= self.cfg.in_capsule;
        let id = if in_capsule { SGL_ICD } else { SGL_TRANSPORT };
        sqe.set_sgl(SglDesc { addr: 0, len, id });
        self.tx.capsule_cmd(self.out.vec(), &sqe, if in_capsule { &data } else { &[] });
        self.slots[usize::from(cid)] = Some(Inflight {
            token,
            dir,
            buf: data,
            in_capsule,
            received: 0,
            r2ts: 0,
            r2t_sent: 0,
            digest_error: false,
        });
        self.stats.submitted += 1;
        Ok(cid)
    }

    /// Consumes whole PDUs from the front of `buf`; returns the bytes consumed. On a
    /// controller violation an H2C termination request is queued and the error returned;
    /// the queue is then failed.
    pub fn handle_input(&mut self, buf: &[u8]) -> Result<usize, QueueError> {
        self.handle_input_until(buf, usize::MAX)
    }

    /// Like [`Self::handle_input`], but stops before the next PDU once `max_output`
    /// bytes wait to be sent (an R2T can produce megabytes of H2CData), so a driver can
    /// bound the work of one round and let other threads run, as the kernel host's
    /// `io_work` bounds itself to a time budget.
    pub fn handle_input_until(&mut self, buf: &[u8], max_output: usize) -> Result<usize, QueueError> {
        let mut off = 0;
        while self.state != State::Failed && self.poll_output().len() < max_output {
            let rest = &buf[off..];
            match pdu::decode(rest, &self.rx) {
                Ok(d) => {
                    let raw = &rest[..d.len];
                    match self.on_pdu(d.pdu) {
                        Ok(()) => off += d.len,
                        Err(QueueError::Violation(v)) => return Err(self.terminate(v, raw)),
                        Err(e) => {
                            self.state = State::Failed;
                            return Err(e);
                        }
                    }
                }
                Err(DecodeError::Incomplete(_)) => break,
                Err(DecodeError::Violation(v)) => {
                    return Err(self.terminate(v, pdu::offending_header(rest)));
                }
                Err(DecodeError::Reset) => {
                    self.state = State::Failed;
                    return Err(QueueError::Terminated { fes: 0, fei: 0 });
                }
            }
        }
        Ok(off)
    }

    /// Fails every command in flight with a transport error and returns them all (for a
    /// connection that died).
    pub fn fail_all(&mut self) -> Vec<Completion> {
        self.state = State::Failed;
        let mut v: Vec<Completion> = self.done.drain(..).collect();
        for cid in 0..self.slots.len() {
            if let Some(f) = self.slots[cid].take() {
                self.free.push(cid as u16);
                let cqe =
                    Cqe { cid: cid as u16, sqid: self.cfg.qid, status: Status::TRANSIENT_TRANSPORT, ..Cqe::default() };
                v.push(Completion { token: f.token, cqe, data: f.buf });
            }
        }
        v
    }

    fn terminate(&mut self, v: Violation, offending: &[u8]) -> QueueError {
        TxConfig::term_req(self.out.vec(), Role::Host, v.fes, v.fei, offending);
        self.state = State::Failed;
        QueueError::Violation(v)
    }

    fn slot(&mut self, cid: u16, fei: u32) -> Result<&mut Inflight, QueueError> {
        self.slots.get_mut(usize::from(cid)).and_then(Option::as_mut).ok_or(QueueError::Violation(Violation::new(
            Fes::InvalidHeaderField,
            fei,
            "unknown command identifier",
        )))
    }

    fn complete(&mut self, cid: u16, mut cqe: Cqe) {
        if let Some(f) = self.slots.get_mut(usize::from(cid)).and_then(Option::take) {
            self.free.push(cid);
            if cqe.status.is_success() {
                if f.digest_error {
                    cqe.status = Status::TRANSIENT_TRANSPORT;
                } else if f.dir == DataDir::ToHost && f.received != f.buf.len() {
                    // Success without all the data: never hand back a short buffer.
                    cqe.status = Status::DATA_XFER_ERROR;
                }
            }
            self.stats.completed += 1;
            self.done.push_back(Completion { token: f.token, cqe, data: f.buf });
        }
    }

    /// Hands a decoded PDU to its handler; a controller-bound type is a violation.
    fn on_pdu(&mut self, p: Pdu<'_>) -> Result<(), QueueError> {
        match p {
            Pdu::IcResp(r) => self.handle_ic_resp(r),
            Pdu::TermReq { fes, fei } => Err(QueueError::Terminated { fes, fei }),
            Pdu::CapsuleResp { cqe } => self.handle_capsule_resp(cqe),
            Pdu::C2hData { cccid, datao, last, success, data, ddgst_ok } => {
                self.handle_c2h_data(cccid, datao, last, success, data, ddgst_ok)
            }
            Pdu::R2t { cccid, ttag, r2to, r2tl } => self.handle_r2t(cccid, ttag, r2to, r2tl),
            Pdu::IcReq(_) | Pdu::CapsuleCmd { .. } | Pdu::H2cData(_) => {
                Err(QueueError::Violation(Violation::new(Fes::InvalidHeaderField, 0, "host-to-controller PDU")))
            }
        }
    }

    /// ICResp: checks what the controller granted and takes its digests and alignment.
    fn handle_ic_resp(&mut self, r: IcResp) -> Result<(), QueueError> {
        if r.pfv != 0 {
            return Err(QueueError::BadIcResp("PFV is not 0"));
        }
        if r.hdgst != self.cfg.hdgst || r.ddgst != self.cfg.ddgst {
            return Err(QueueError::BadIcResp("digest settings differ from what was asked"));
        }
        if r.maxh2cdata < 4096 || !r.maxh2cdata.is_multiple_of(4) {
            return Err(QueueError::BadIcResp("MAXH2CDATA below 4096 or not a multiple of 4"));
        }
        if r.cpda > 31 {
            return Err(QueueError::BadIcResp("CPDA above 31"));
        }
        self.maxh2cdata = r.maxh2cdata;
        self.tx = TxConfig { hdgst: r.hdgst, ddgst: r.ddgst, pda: (u32::from(r.cpda) + 1) * 4 };
        self.rx = RxConfig {
            role: Role::Host,
            established: true,
            hdgst: r.hdgst,
            ddgst: r.ddgst,
            pda: (u32::from(self.cfg.hpda) + 1) * 4,
            max_icd: 0,
            max_data: self.cfg.max_c2h,
        };
        self.state = State::Ready;
        Ok(())
    }

    /// A response capsule: completes its command.
    fn handle_capsule_resp(&mut self, cqe: Cqe) -> Result<(), QueueError> {
        self.slot(cqe.cid, 20)?;
        self.complete(cqe.cid, cqe);
        Ok(())
    }

    /// C2HData: the next part of a read's data, in order, and with the SUCCESS flag its
    /// completion.
    fn handle_c2h_data(
        &mut self,
        cccid: u16,
        datao: u32,
        last: bool,
        success: bool,
        data: &[u8],
        ddgst_ok: bool,
    ) -> Result<(), QueueError> {
        let qid = self.cfg.qid;
        let f = self.slot(cccid, 8)?;
        if f.dir != DataDir::ToHost {
            return Err(QueueError::Violation(Violation::new(
                Fes::InvalidHeaderField,
                8,
                "C2HData for a command without controller-to-host data",
            )));
        }
        let end = datao as usize + data.len();
        if end > f.buf.len() {
            return Err(QueueError::Violation(Violation::new(
                Fes::DataOutOfRange,
                0,
                "C2HData beyond the command's buffer",
            )));
        }
        if datao as usize != f.received {
            return Err(QueueError::Violation(Violation::new(
                Fes::PduSequenceError,
                0,
                "C2HData offset is not where the previous one ended",
            )));
        }
        f.buf[datao as usize..end].copy_from_slice(data);
        f.received = end;
        let short_last = last && end != f.buf.len();
        if !ddgst_ok {
            f.digest_error = true;
            self.stats.digest_errors += 1;
        }
        if short_last {
            return Err(QueueError::Violation(Violation::new(
                Fes::PduSequenceError,
                0,
                "LAST C2HData before the end of the data",
            )));
        }
        if success {
            self.stats.success_flag += 1;
            let cqe = Cqe { cid: cccid, sqid: qid, status: Status::SUCCESS, ..Cqe::default() };
            self.complete(cccid, cqe);
        }
        Ok(())
    }

    /// R2T: sends the part of a write's data asked for, in H2CData PDUs of at most
    /// MAXH2CDATA.
    fn handle_r2t(&mut self, cccid: u16, ttag: u16, r2to: u32, r2tl: u32) -> Result<(), QueueError> {
        let maxh2c = self.maxh2cdata as usize;
        let f = self.slot(cccid, 8)?;
        if f.dir != DataDir::ToController || f.in_capsule {
            return Err(QueueError::Violation(Violation::new(
                Fes::InvalidHeaderField,
                8,
                "R2T for a command with no outstanding host data",
            )));
        }
        let end = u64::from(r2to) + u64::from(r2tl);
        if r2tl == 0 || end > f.buf.len() as u64 {
            return Err(QueueError::Violation(Violation::new(
                Fes::DataOutOfRange,
                0,
                "R2T outside the command's data",
            )));
        }
        // A controller asks for each part of the data once, in order; Linux's
        // host refuses an offset below what it already sent the same way
        // ("Unexpected r2t offset", nvme_tcp_handle_r2t in drivers/nvme/host/tcp.c).
        if u64::from(r2to) < f.r2t_sent {
            return Err(QueueError::Violation(Violation::new(
                Fes::DataOutOfRange,
                0,
                "R2T asks again for data already sent",
            )));
        }
        f.r2t_sent = end;
        // Each R2T is answered in full at once, so at most one is ever
        // outstanding from this host's side, within any MAXR2T.
        f.r2ts += 1;
        let (buf, tx) = (std::mem::take(&mut f.buf), self.tx);
        let mut off = r2to as usize;
        let end = end as usize;
        let mut pdus = 0;
        while off < end {
            let n = (end - off).min(maxh2c);
            tx.h2c_data(self.out.vec(), cccid, ttag, off as u32, &buf[off..off + n], off + n == end);
            off += n;
            pdus += 1;
        }
        if let Some(f) = self.slots[usize::from(cccid)].as_mut() {
            f.buf = buf;
        }
        self.stats.r2ts += 1;
        self.stats.h2c_pdus += pdus;
        Ok(())
    }
}

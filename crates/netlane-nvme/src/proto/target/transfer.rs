//! Data transfer on a queue: a command's host data asked for by R2T and received in
//! H2CData PDUs, and controller data sent as C2HData PDUs with the completion.

use std::borrow::Cow;
use std::sync::atomic::Ordering;

use super::queue::TargetQueue;
use crate::proto::cmd::{self, Sqe, Status, nvm};
use crate::proto::fabrics::{self, fctype};
use crate::proto::pdu::{Fes, H2cData, Violation};

/// A command whose host-to-controller data arrives by R2T/H2CData.
#[derive(Debug)]
pub(super) struct Inbound {
    pub(super) sqe: Sqe,
    /// The command's data length.
    pub(super) total: u32,
    /// Where the data lands; allocated when the first R2T goes out.
    pub(super) buf: Vec<u8>,
    pub(super) next_r2to: u32,
    pub(super) received: u32,
    pub(super) outstanding: u32,
    pub(super) failed: Option<Status>,
}

/// One outstanding R2T.
#[derive(Debug, Clone, Copy)]
pub(super) struct R2tState {
    pub(super) cid: u16,
    pub(super) r2to: u32,
    pub(super) r2tl: u32,
    pub(super) got: u32,
}

impl TargetQueue {
    /// Checks a command expecting host data before any R2T goes out.
    pub(super) fn precheck_inbound(&self, sqe: &Sqe) -> Option<Status> {
        let len = u64::from(sqe.sgl().len);
        match (self.qid, sqe.opcode()) {
            (0, cmd::FABRICS) if sqe.fctype() == fctype::CONNECT => {
                (len != fabrics::CONNECT_DATA_LEN as u64).then_some(Status::SGL_LENGTH_INVALID)
            }
            (q, nvm::WRITE | nvm::COMPARE) if q != 0 => self.check_rw(sqe).err(),
            (q, nvm::DSM) if q != 0 => self.check_dsm(sqe).err(),
            _ => Some(Status::INVALID_OPCODE),
        }
    }

    pub(super) fn issue_r2ts(&mut self, cid: u16) {
        let max_out = (self.maxr2t.saturating_add(1)).min(16);
        let r2t_max = self.subsys.config.r2t_max;
        loop {
            let Some(cmd) = self.inbound.get_mut(&cid) else { return };
            let total = cmd.total;
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

    pub(super) fn on_h2c_data(&mut self, h: H2cData<'_>, now_ns: u64) -> Result<(), Violation> {
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
            self.subsys.stats.counts.data_digest_errors.fetch_add(1, Ordering::Relaxed);
            cmd.failed = Some(Status::TRANSIENT_TRANSPORT);
        }
        if !done {
            return Ok(());
        }
        self.r2ts.remove(&ttag);
        cmd.outstanding -= 1;
        if cmd.received == cmd.total {
            let Some(cmd) = self.inbound.remove(&cccid) else { return Ok(()) };
            self.storage.write_bytes -= u64::from(cmd.total);
            match cmd.failed {
                Some(status) => self.respond(cccid, status, 0),
                None => self.execute(cmd.sqe, Cow::Owned(cmd.buf), now_ns),
            }
            self.admit_inbound();
        } else {
            self.issue_r2ts(cccid);
        }
        Ok(())
    }

    /// Sends `len` bytes as C2HData PDUs filled by `fill(offset, dst)`, then the
    /// completion (a response capsule, or the SUCCESS flag when allowed). On a fill
    /// error the PDUs are taken back and the command fails; returns success.
    pub(super) fn send_c2h(
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
                self.subsys.stats.storage_failed(cid, "read", &e);
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
            self.completed(cid, Status::SUCCESS);
        } else {
            self.respond(cid, Status::SUCCESS, 0);
        }
        true
    }
}

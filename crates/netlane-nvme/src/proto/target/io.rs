//! The NVM I/O command set: Read, Write, Flush and Write Zeroes against the
//! namespace, with range checks.

use std::sync::atomic::Ordering;

use super::queue::{Outcome, TargetQueue};
use crate::proto::cmd::{Sqe, Status, nvm};

impl TargetQueue {
    /// Checks an NVM read/write's namespace, range and transfer length; returns the byte
    /// offset and length.
    pub(super) fn check_rw(&self, sqe: &Sqe) -> Result<(u64, u32), Status> {
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

    pub(super) fn io(&mut self, sqe: &Sqe, data: &[u8]) -> Outcome {
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

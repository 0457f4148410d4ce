//! The NVM I/O command set: Read, Write, Flush, Compare, Write Zeroes, Dataset
//! Management (deallocate) and Verify. Each is checked against the namespace here and
//! becomes a storage request (`storage.rs`); its completion answers the command.

use std::borrow::Cow;
use std::sync::atomic::Ordering;

use super::queue::{Outcome, TargetQueue};
use super::storage::{ALL_NAMESPACES, Job, StorageOp};
use crate::proto::cmd::{Sqe, Status, nvm};

/// Most ranges in one Dataset Management command (NR is 0's based in 8 bits).
const DSM_MAX_RANGES: usize = 256;
/// Bytes per Dataset Management range.
const DSM_RANGE_LEN: usize = 16;
/// Dataset Management CDW11 bit 2: Attribute – Deallocate.
const DSM_AD: u32 = 1 << 2;
/// Write Zeroes CDW12 bit 25: Deallocate.
const WZ_DEAC: u32 = 1 << 25;

impl TargetQueue {
    /// Checks an NVM command's namespace and LBA range; returns the byte offset and
    /// length.
    fn check_range(&self, sqe: &Sqe) -> Result<(u64, u64), Status> {
        let ns = self.subsys.namespace(sqe.nsid()).ok_or(Status::INVALID_NS)?;
        let bs = u64::from(ns.block_size());
        let nlb = u64::from(sqe.nlb());
        let end = sqe.slba().checked_add(nlb).ok_or(Status::LBA_RANGE)?;
        if end > ns.blocks() {
            return Err(Status::LBA_RANGE);
        }
        Ok((sqe.slba() * bs, nlb * bs))
    }

    /// Checks a command that moves data (Read, Write, Compare): range, transfer size,
    /// and the SGL length matching the blocks; returns the byte offset and length.
    pub(super) fn check_rw(&self, sqe: &Sqe) -> Result<(u64, u32), Status> {
        let (offset, bytes) = self.check_range(sqe)?;
        if bytes > self.subsys.config.max_transfer() {
            return Err(Status::INVALID_FIELD);
        }
        if u64::from(sqe.sgl().len) != bytes {
            return Err(Status::SGL_LENGTH_INVALID);
        }
        Ok((offset, bytes as u32))
    }

    /// Checks a Dataset Management command before its range list arrives.
    pub(super) fn check_dsm(&self, sqe: &Sqe) -> Result<(), Status> {
        self.subsys.namespace(sqe.nsid()).ok_or(Status::INVALID_NS)?;
        let ranges = (sqe.cdw(10) & 0xff) as usize + 1;
        let len = sqe.sgl().len as usize;
        if len < ranges * DSM_RANGE_LEN || len > DSM_MAX_RANGES * DSM_RANGE_LEN {
            return Err(Status::SGL_LENGTH_INVALID);
        }
        Ok(())
    }

    pub(super) fn io(&mut self, sqe: &Sqe, data: Cow<'_, [u8]>) -> Outcome {
        let ctrl_ready = self.ctrl.as_ref().is_some_and(|c| c.ready());
        if !ctrl_ready {
            return Outcome::Done(Status::CMD_SEQ_ERROR, 0);
        }
        let (cid, nsid) = (sqe.cid(), sqe.nsid());
        match sqe.opcode() {
            nvm::READ => match self.check_rw(sqe) {
                Ok((offset, len)) => {
                    self.submit(nsid, StorageOp::Read { offset, len }, Job::Read { cid, len });
                    Outcome::Hold
                }
                Err(s) => Outcome::Done(s, 0),
            },
            nvm::WRITE | nvm::COMPARE => {
                let (offset, len) = match self.check_rw(sqe) {
                    Ok(v) => v,
                    Err(s) => return Outcome::Done(s, 0),
                };
                if data.len() != len as usize {
                    return Outcome::Done(Status::SGL_LENGTH_INVALID, 0);
                }
                let data = self.hold(data);
                if sqe.opcode() == nvm::WRITE {
                    self.submit(nsid, StorageOp::Write { offset, data }, Job::Write { cid, len });
                } else {
                    self.submit(nsid, StorageOp::Read { offset, len }, Job::Compare { cid, data });
                }
                Outcome::Hold
            }
            nvm::FLUSH => {
                if nsid != ALL_NAMESPACES && self.subsys.namespace(nsid).is_none() {
                    return Outcome::Done(Status::INVALID_NS, 0);
                }
                self.subsys.stats.counts.flush_cmds.fetch_add(1, Ordering::Relaxed);
                self.submit(nsid, StorageOp::Flush, Job::Plain { cid, failure: Status::WRITE_FAULT });
                Outcome::Hold
            }
            nvm::WRITE_ZEROES => match self.check_range(sqe) {
                Ok((offset, len)) => {
                    let deallocate = sqe.cdw(12) & WZ_DEAC != 0;
                    let op = StorageOp::WriteZeroes { offset, len, deallocate };
                    self.submit(nsid, op, Job::Plain { cid, failure: Status::WRITE_FAULT });
                    Outcome::Hold
                }
                Err(s) => Outcome::Done(s, 0),
            },
            nvm::VERIFY => match self.check_range(sqe) {
                // VSL (Identify, CNS 06h) bounds Verify like a transfer.
                Ok((_, len)) if len > self.subsys.config.max_transfer() => Outcome::Done(Status::INVALID_FIELD, 0),
                Ok((offset, len)) => {
                    self.submit(
                        nsid,
                        StorageOp::Verify { offset, len },
                        Job::Plain { cid, failure: Status::READ_ERROR },
                    );
                    Outcome::Hold
                }
                Err(s) => Outcome::Done(s, 0),
            },
            nvm::DSM => self.dsm(sqe, &data),
            _ => Outcome::Done(Status::INVALID_OPCODE, 0),
        }
    }

    /// Dataset Management: with the Deallocate attribute, deallocates every range (all
    /// are checked first: a bad one fails the command and nothing is deallocated);
    /// without it there is nothing to do.
    fn dsm(&mut self, sqe: &Sqe, data: &[u8]) -> Outcome {
        if let Err(s) = self.check_dsm(sqe) {
            return Outcome::Done(s, 0);
        }
        let Some(ns) = self.subsys.namespace(sqe.nsid()) else { return Outcome::Done(Status::INVALID_NS, 0) };
        let (bs, blocks) = (u64::from(ns.block_size()), ns.blocks());
        let nr = (sqe.cdw(10) & 0xff) as usize + 1;
        if data.len() < nr * DSM_RANGE_LEN {
            return Outcome::Done(Status::SGL_LENGTH_INVALID, 0);
        }
        if sqe.cdw(11) & DSM_AD == 0 {
            return Outcome::Done(Status::SUCCESS, 0);
        }
        let mut ranges = Vec::with_capacity(nr);
        for r in data.chunks_exact(DSM_RANGE_LEN).take(nr) {
            // Context attributes (0..4), length in blocks (4..8), starting LBA (8..16).
            let nlb = u64::from(u32::from_le_bytes([r[4], r[5], r[6], r[7]]));
            let slba = u64::from_le_bytes([r[8], r[9], r[10], r[11], r[12], r[13], r[14], r[15]]);
            match slba.checked_add(nlb) {
                Some(end) if end <= blocks => {}
                _ => return Outcome::Done(Status::LBA_RANGE, 0),
            }
            if nlb > 0 {
                ranges.push((slba * bs, nlb * bs));
            }
        }
        let cid = sqe.cid();
        self.submit(sqe.nsid(), StorageOp::Deallocate { ranges }, Job::Plain { cid, failure: Status::WRITE_FAULT });
        Outcome::Hold
    }
}

//! Storage requests: what a queue needs done on its namespaces. The queue hands them to
//! the driver ([`TargetQueue::poll_storage`]) and takes the results back
//! ([`TargetQueue::complete`], [`TargetQueue::complete_read`]), so the protocol core
//! never waits on a disk; the driver runs each request where it likes (on the reactor
//! for memory, on a worker for a file, whose `fdatasync` can take milliseconds).
//!
//! Each queue bounds the data it holds for commands, whatever the host sends: reads are
//! started only while the bytes being read plus the output not yet sent stay within
//! the queue's data budget, and writes are asked for (R2T) only while the buffers they
//! need stay within it. Commands past the budget wait their turn, and commands past the
//! queue size are a protocol violation, so memory per connection is bounded.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::Ordering;

use super::Subsystem;
use super::queue::{CloseReason, TargetQueue};
use crate::proto::cmd::Status;

/// The NSID a Flush uses to mean every namespace.
pub const ALL_NAMESPACES: u32 = 0xffff_ffff;

/// One storage operation a queue needs done.
#[derive(Debug, PartialEq, Eq)]
pub struct StorageRequest {
    /// Identifies the request to [`TargetQueue::complete`] / [`TargetQueue::complete_read`].
    pub tag: u32,
    /// The namespace ([`ALL_NAMESPACES`] for a Flush of all).
    pub nsid: u32,
    /// What to do.
    pub op: StorageOp,
}

/// The operations, in bytes (the queue has converted blocks).
#[derive(Debug, PartialEq, Eq)]
pub enum StorageOp {
    /// Read `len` bytes at `offset`; complete with [`TargetQueue::complete_read`].
    Read {
        /// Byte offset.
        offset: u64,
        /// Length.
        len: u32,
    },
    /// Write `data` at `offset`.
    Write {
        /// Byte offset.
        offset: u64,
        /// The bytes.
        data: Vec<u8>,
    },
    /// Make completed writes durable.
    Flush,
    /// Zero `len` bytes at `offset`.
    WriteZeroes {
        /// Byte offset.
        offset: u64,
        /// Length.
        len: u64,
        /// The host allows deallocating instead.
        deallocate: bool,
    },
    /// Deallocate byte ranges `(offset, len)`.
    Deallocate {
        /// The ranges.
        ranges: Vec<(u64, u64)>,
    },
    /// Check that `len` bytes at `offset` read back without error.
    Verify {
        /// Byte offset.
        offset: u64,
        /// Length.
        len: u64,
    },
}

impl StorageRequest {
    /// Whether this is a read, completed with [`TargetQueue::complete_read`].
    pub fn is_read(&self) -> bool {
        matches!(self.op, StorageOp::Read { .. })
    }
}

impl Subsystem {
    /// Whether running `req` may block the thread: some namespace it touches says so.
    pub fn blocks(&self, req: &StorageRequest) -> bool {
        if req.nsid == ALL_NAMESPACES {
            self.namespaces.iter().any(|ns| ns.blocking())
        } else {
            self.namespace(req.nsid).is_none_or(|ns| ns.blocking())
        }
    }

    /// Runs `req` (anything but a read) here and now.
    pub fn perform(&self, req: &StorageRequest) -> io::Result<()> {
        if req.nsid == ALL_NAMESPACES && req.op == StorageOp::Flush {
            return self.namespaces.iter().try_for_each(|ns| ns.flush());
        }
        let ns = self.namespace(req.nsid).ok_or_else(|| io::Error::other("no such namespace"))?;
        match &req.op {
            StorageOp::Read { .. } => Err(io::Error::other("a read completes with complete_read")),
            StorageOp::Write { offset, data } => ns.write(*offset, data),
            StorageOp::Flush => ns.flush(),
            StorageOp::WriteZeroes { offset, len, deallocate: true } => ns.deallocate(*offset, *len),
            StorageOp::WriteZeroes { offset, len, deallocate: false } => ns.write_zeroes(*offset, *len),
            StorageOp::Deallocate { ranges } => ranges.iter().try_for_each(|&(o, l)| ns.deallocate(o, l)),
            StorageOp::Verify { offset, len } => {
                let mut scratch = vec![0u8; (*len).min(1 << 20) as usize];
                let mut done = 0;
                while done < *len {
                    let n = (*len - done).min(scratch.len() as u64) as usize;
                    ns.read(offset + done, &mut scratch[..n])?;
                    done += n as u64;
                }
                Ok(())
            }
        }
    }

    /// Reads part of a read request: `dst.len()` bytes starting `off` bytes into it.
    pub fn read_part(&self, req: &StorageRequest, off: usize, dst: &mut [u8]) -> io::Result<()> {
        let StorageOp::Read { offset, .. } = req.op else {
            return Err(io::Error::other("not a read"));
        };
        let ns = self.namespace(req.nsid).ok_or_else(|| io::Error::other("no such namespace"))?;
        ns.read(offset + off as u64, dst)
    }
}

/// What the queue does with a request's result.
#[derive(Debug)]
pub(super) enum Job {
    /// Send the data (C2HData) and complete.
    Read { cid: u16, len: u32 },
    /// Compare with the host's data and complete.
    Compare { cid: u16, data: Vec<u8> },
    /// Count a completed write and complete.
    Write { cid: u16, len: u32 },
    /// Complete (Flush, Write Zeroes, Deallocate, Verify); `failure` is the status when
    /// the operation fails.
    Plain { cid: u16, failure: Status },
}

/// Requests and their accounting, per queue.
#[derive(Debug, Default)]
pub(super) struct Storage {
    pub(super) jobs: std::collections::HashMap<u32, Job>,
    next_tag: u32,
    /// Requests the driver may take now.
    ready: VecDeque<StorageRequest>,
    /// Reads waiting for room in the data budget.
    deferred: VecDeque<StorageRequest>,
    /// Bytes of reads handed out and not completed.
    pub(super) read_bytes: u64,
    /// Bytes of host data held: write buffers being filled by R2T, and data handed to
    /// storage (writes) or kept for a comparison.
    pub(super) write_bytes: u64,
    /// Commands waiting for room in the budget before their R2Ts go out.
    pub(super) r2t_wait: VecDeque<u16>,
}

impl Storage {
    pub(super) fn clear(&mut self) {
        self.jobs.clear();
        self.ready.clear();
        self.deferred.clear();
        self.r2t_wait.clear();
        self.read_bytes = 0;
        self.write_bytes = 0;
    }
}

impl TargetQueue {
    /// The data a queue may hold: the configured budget, at least one largest transfer.
    pub(super) fn budget(&self) -> u64 {
        u64::from(self.subsys.config.queue_budget).max(self.subsys.config.max_transfer())
    }

    /// Queues a request for the driver; its result goes to `job`.
    pub(super) fn submit(&mut self, nsid: u32, op: StorageOp, job: Job) {
        let s = &mut self.storage;
        let tag = s.next_tag;
        s.next_tag = s.next_tag.wrapping_add(1);
        s.jobs.insert(tag, job);
        let req = StorageRequest { tag, nsid, op };
        if req.is_read() { s.deferred.push_back(req) } else { s.ready.push_back(req) }
    }

    /// The next storage request to run, if any may start now. Call after
    /// [`Self::handle_input`], after completions and after sending output (which makes
    /// room for reads).
    pub fn poll_storage(&mut self) -> Option<StorageRequest> {
        if self.close_reason().is_some() {
            return None;
        }
        if let Some(r) = self.storage.ready.pop_front() {
            return Some(r);
        }
        let StorageOp::Read { len, .. } = self.storage.deferred.front()?.op else { return None };
        let held = self.storage.read_bytes + self.out.pending().len() as u64;
        if held + u64::from(len) > self.budget() && held > 0 {
            return None;
        }
        self.storage.read_bytes += u64::from(len);
        self.storage.deferred.pop_front()
    }

    /// Whether requests are waiting (some perhaps for room in the budget).
    pub fn storage_pending(&self) -> bool {
        !self.storage.ready.is_empty() || !self.storage.deferred.is_empty()
    }

    /// Completes a request other than a read, at `now_ns`. Unknown tags (the queue
    /// closed meanwhile) are ignored.
    pub fn complete(&mut self, tag: u32, result: io::Result<()>, now_ns: u64) {
        self.now_ns = self.now_ns.max(now_ns);
        let Some(job) = self.storage.jobs.remove(&tag) else { return };
        match job {
            Job::Write { cid, len } => {
                self.storage.write_bytes -= u64::from(len);
                match result {
                    Ok(()) => {
                        let st = &self.subsys.stats.counts;
                        st.write_cmds.fetch_add(1, Ordering::Relaxed);
                        st.sectors_written.fetch_add(u64::from(len) / 512, Ordering::Relaxed);
                        self.stats.writes += 1;
                        self.stats.write_bytes += u64::from(len);
                        self.respond(cid, Status::SUCCESS, 0);
                    }
                    Err(e) => {
                        self.subsys.stats.storage_failed(cid, "write", &e);
                        self.respond(cid, Status::WRITE_FAULT, 0);
                    }
                }
                self.admit_inbound();
            }
            Job::Plain { cid, failure } => match result {
                Ok(()) => self.respond(cid, Status::SUCCESS, 0),
                Err(e) => {
                    self.subsys.stats.storage_failed(cid, "storage operation", &e);
                    self.respond(cid, failure, 0);
                }
            },
            // A read completed without data is a driver error; fail the command.
            Job::Read { cid, len } => {
                self.storage.read_bytes -= u64::from(len);
                self.respond(cid, Status::READ_ERROR, 0);
            }
            Job::Compare { cid, data } => {
                self.storage.read_bytes -= data.len() as u64;
                self.storage.write_bytes -= data.len() as u64;
                self.respond(cid, Status::READ_ERROR, 0);
                self.admit_inbound();
            }
        }
    }

    /// Completes a read at `now_ns`: `fill(off, dst)` fills `dst` with the bytes `off`
    /// bytes into the requested range (straight into the outgoing PDUs). An error fails
    /// the command.
    pub fn complete_read(&mut self, tag: u32, now_ns: u64, mut fill: impl FnMut(usize, &mut [u8]) -> io::Result<()>) {
        self.now_ns = self.now_ns.max(now_ns);
        let Some(job) = self.storage.jobs.remove(&tag) else { return };
        match job {
            Job::Read { cid, len } => {
                self.storage.read_bytes -= u64::from(len);
                if self.send_c2h(cid, len as usize, fill) {
                    let st = &self.subsys.stats.counts;
                    st.read_cmds.fetch_add(1, Ordering::Relaxed);
                    st.sectors_read.fetch_add(u64::from(len) / 512, Ordering::Relaxed);
                    self.stats.reads += 1;
                    self.stats.read_bytes += u64::from(len);
                }
            }
            Job::Compare { cid, data } => {
                let len = data.len();
                self.storage.read_bytes -= len as u64;
                self.storage.write_bytes -= len as u64;
                let mut stored = vec![0u8; len];
                let status = match fill(0, &mut stored) {
                    Ok(()) if stored == data => Status::SUCCESS,
                    Ok(()) => Status::COMPARE_FAILURE,
                    Err(e) => {
                        self.subsys.stats.storage_failed(cid, "read for compare", &e);
                        Status::READ_ERROR
                    }
                };
                self.respond(cid, status, 0);
                self.admit_inbound();
            }
            Job::Write { cid, .. } | Job::Plain { cid, .. } => {
                // Not a read: put it back and complete it as a failure.
                self.storage.jobs.insert(tag, job);
                self.complete(tag, Err(io::Error::other(format!("command {cid} is not a read"))), now_ns);
            }
        }
    }

    /// Runs every request that may start, here and at time `now_ns` (for tests, and
    /// namespaces that do not block), until none is left that can start.
    pub fn run_storage(&mut self, now_ns: u64) {
        while let Some(req) = self.poll_storage() {
            self.run_here(req, now_ns);
        }
    }

    /// Runs one request here, at `now_ns`, and completes it.
    pub fn run_here(&mut self, req: StorageRequest, now_ns: u64) {
        let subsys = self.subsys.clone();
        if req.is_read() {
            self.complete_read(req.tag, now_ns, |off, dst| subsys.read_part(&req, off, dst));
        } else {
            let r = subsys.perform(&req);
            self.complete(req.tag, r, now_ns);
        }
    }

    /// Starts the R2Ts of waiting writes while their buffers fit in the budget (at least
    /// one at a time).
    pub(super) fn admit_inbound(&mut self) {
        let budget = self.budget();
        while let Some(&cid) = self.storage.r2t_wait.front() {
            let Some(cmd) = self.inbound.get_mut(&cid) else {
                self.storage.r2t_wait.pop_front();
                continue;
            };
            let len = u64::from(cmd.total);
            let held = self.storage.write_bytes;
            if held > 0 && held + len > budget {
                return;
            }
            self.storage.r2t_wait.pop_front();
            cmd.buf = vec![0u8; cmd.total as usize];
            self.storage.write_bytes += len;
            self.issue_r2ts(cid);
        }
    }

    /// Takes host data into a storage request (a Write or Compare), counting it.
    pub(super) fn hold(&mut self, data: Cow<'_, [u8]>) -> Vec<u8> {
        let v = data.into_owned();
        self.storage.write_bytes += v.len() as u64;
        v
    }

    /// Drops every request (the queue closed).
    pub(super) fn drop_storage(&mut self, _why: &CloseReason) {
        self.storage.clear();
    }
}

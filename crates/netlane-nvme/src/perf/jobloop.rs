//! The job loop: one thread per job keeps `qd` commands in flight, picks each
//! command's queue the way blk-mq maps it, sends directly or hands off to the queue's
//! worker, and records latency into HDR histograms; verify mode lays a pattern down
//! first and checks every read against it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};

use netlane::metrics::hist::Hist;
use netlane::time::monotonic_ns;

use super::VerifyMode;
use super::busypoll::{Inbox, JobEpoll, Waiting, deliver};
use super::job::JobGroup;
use super::queue::{Queue, Req, SetKind, Shared, fail, flush, submit_locked};
use crate::proto::cmd::{Sqe, Status, nvm};
use crate::proto::host::Completion;
use netlane::lanes::busy::{BusyPoll, Knob};
use netlane::metrics::cpu::thread_cpu;

/// A small xorshift generator for offsets (no statistical demands beyond spreading).
pub(super) struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The verify pattern: every 8-byte word names its byte offset in the namespace.
pub(super) fn fill_pattern(buf: &mut [u8], offset: u64) {
    for (i, w) in buf.chunks_exact_mut(8).enumerate() {
        let v = (offset + i as u64 * 8).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x6e6c_616e_6500_0000;
        w.copy_from_slice(&v.to_le_bytes());
    }
}

pub(super) fn check_pattern(buf: &[u8], offset: u64) -> bool {
    buf.chunks_exact(8).enumerate().all(|(i, w)| {
        let v = (offset + i as u64 * 8).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x6e6c_616e_6500_0000;
        w == v.to_le_bytes()
    })
}

pub(super) struct Slot {
    pub(super) buf: Vec<u8>,
    pub(super) start_ns: u64,
    pub(super) offset: u64,
    pub(super) read: bool,
}

#[derive(Default)]
pub(super) struct JobResult {
    pub(super) read_lat: Hist,
    pub(super) write_lat: Hist,
    pub(super) reads: u64,
    pub(super) writes: u64,
    pub(super) bytes: u64,
    pub(super) errors: u64,
    pub(super) mismatches: u64,
    pub(super) failure: Option<String>,
    /// The busy-poll parameters of the job's epoll instance, as applied or refused.
    pub(super) busy_poll_knob: Option<Knob>,
    /// Times the job blocked (voluntary context switches) in the measured window.
    pub(super) sleeps: u64,
}

pub(super) struct JobSpec {
    pub(super) index: usize,
    pub(super) group: JobGroup,
    pub(super) cpu: Option<usize>,
    pub(super) nsid: u32,
    pub(super) block: u32,
    pub(super) region: (u64, u64),
    pub(super) verify: VerifyMode,
    pub(super) window: (u64, u64),
    pub(super) end_ns: u64,
    /// Kernel busy polling for a high-priority job's poll queues (else it spins).
    pub(super) busy_poll: Option<BusyPoll>,
}

pub(super) fn current_cpu() -> usize {
    nix::sched::sched_getcpu().unwrap_or(0)
}

/// Index of the queue of set `kind` that serves `cpu`.
pub(super) fn pick_queue(shared: &Shared, kind: SetKind, cpu: usize) -> usize {
    let set = &shared.sets[kind as usize];
    let pos = shared.queue_cpus.iter().position(|&c| c == cpu).unwrap_or(cpu);
    set[pos % set.len()]
}

/// Submits a job's batch: the last request bound for each queue carries the
/// last-in-batch hint, so that queue's worker sends the batch with `MSG_MORE` until then.
pub(super) fn submit_batch(shared: &Shared, mut batch: Vec<(usize, Req)>) {
    let mut seen = vec![false; shared.queues.len()];
    for (qi, req) in batch.iter_mut().rev() {
        req.last = !seen[*qi];
        seen[*qi] = true;
    }
    for (qi, req) in batch {
        submit(shared, &shared.queues[qi], req);
    }
}

pub(super) fn submit(shared: &Shared, q: &Queue, req: Req) {
    // The block layer's rule (commit_rqs): a sleeping worker is woken once the
    // submitter's batch for its queue is complete, not for each request of it.
    let completes_batch = req.last || !shared.batch || shared.wake_each;
    if q.kind == SetKind::Poll {
        let mut inner = q.lock();
        submit_locked(&mut inner, req);
        if let Err(e) = flush(&mut inner, &shared.send_calls) {
            fail(q, &mut inner, shared, e.to_string());
        }
        shared.direct_sends.fetch_add(1, Ordering::Relaxed);
        return;
    }
    if shared.direct_send
        && shared.caravan.is_none()
        && q.queued.load(Ordering::Acquire) == 0
        && current_cpu() == q.cpu
        && let Ok(mut inner) = q.inner.try_lock()
        && inner.hq.poll_output().is_empty()
        && inner.backlog.is_empty()
        && inner.failed.is_none()
    {
        submit_locked(&mut inner, req);
        if let Err(e) = flush(&mut inner, &shared.send_calls) {
            fail(q, &mut inner, shared, e.to_string());
        }
        let leftover = !inner.hq.poll_output().is_empty();
        drop(inner);
        shared.direct_sends.fetch_add(1, Ordering::Relaxed);
        if leftover {
            wake(shared, q);
        }
        return;
    }
    q.queued.fetch_add(1, Ordering::AcqRel);
    let unsent = match &q.tx {
        Some(tx) => tx.send(req).err().map(|e| e.0),
        None => Some(req),
    };
    if let Some(req) = unsent {
        // The queue's worker is gone: fail the command rather than lose it.
        q.queued.fetch_sub(1, Ordering::AcqRel);
        let cqe = crate::proto::cmd::Cqe { status: Status::TRANSIENT_TRANSPORT, ..Default::default() };
        deliver(shared, Completion { token: req.token, cqe, data: req.data });
        return;
    }
    if completes_batch && q.sleeping.load(Ordering::SeqCst) {
        wake(shared, q);
    }
}

/// Wakes `q`'s worker, counted.
fn wake(shared: &Shared, q: &Queue) {
    let _ = q.wake.write(1);
    shared.worker_wakes.fetch_add(1, Ordering::Relaxed);
}

/// Offsets of a job's commands: random blocks of its region, or one block after another.
struct Offsets {
    rng: Rng,
    random: bool,
    base: u64,
    bs: u64,
    nblocks: u64,
    seq: u64,
}

impl Offsets {
    fn next(&mut self) -> u64 {
        let i = if self.random { self.rng.next() % self.nblocks } else { (self.seq % self.nblocks, self.seq += 1).0 };
        self.base + i * self.bs
    }
}

pub(super) fn run_job(spec: JobSpec, shared: Arc<Shared>, done_rx: mpsc::Receiver<Completion>) -> JobResult {
    netlane::cpus::pin(spec.cpu);
    let g = &spec.group;
    let mut res = JobResult::default();
    let (base, len) = spec.region;
    let bs = u64::from(g.bs);
    let mut offsets = Offsets {
        rng: Rng(0x2545_f491_4f6c_dd1d ^ ((spec.index as u64 + 1) * 0x9e37_79b9)),
        random: g.random,
        base,
        bs,
        nblocks: (len / bs).max(1),
        seq: 0,
    };
    let mut slots: Vec<Slot> =
        (0..g.qd).map(|_| Slot { buf: vec![0u8; g.bs as usize], start_ns: 0, offset: 0, read: true }).collect();
    let waiting = match (g.hipri, spec.busy_poll) {
        (false, _) => Waiting::Channel,
        (true, None) => Waiting::Spin,
        (true, Some(bp)) => match JobEpoll::new(&shared, spec.index, &bp) {
            Ok((ep, knob)) => {
                res.busy_poll_knob = Some(knob);
                Waiting::Kernel(ep)
            }
            Err(e) => {
                res.failure = Some(format!("the job's busy-poll epoll instance: {e}"));
                return res;
            }
        },
    };
    let inbox = Inbox { rx: done_rx, waiting, job: spec.index };
    // Verify: lay the pattern over the region first (and make it durable), or, for a
    // verify-only run, read every block of the region once and check it, and stop.
    if spec.verify != VerifyMode::Off && !verify_first(&spec, &shared, &inbox, &mut slots, &mut res) {
        return res;
    }
    measured_run(&spec, &shared, &inbox, &mut slots, &mut offsets, &mut res);
    res
}

/// The verify step before the measured run: the pattern written over the region and
/// flushed, or (verify-only) every block read back and checked. Returns whether the
/// measured run follows.
fn verify_first(spec: &JobSpec, shared: &Shared, inbox: &Inbox, slots: &mut [Slot], res: &mut JobResult) -> bool {
    let (write, what) = match spec.verify {
        VerifyMode::ReadBack => (false, "verify read"),
        _ => (true, "verify prefill write"),
    };
    if let Err(e) = sweep(spec, shared, inbox, slots, write, res) {
        res.failure = Some(format!("{what}: {e}"));
        return false;
    }
    if !write {
        return false;
    }
    if let Err(e) = flush_namespace(spec, shared, inbox) {
        res.failure = Some(e);
        return false;
    }
    true
}

/// The measured run: keeps qd in flight until `end_ns`, or until the run fails.
fn measured_run(
    spec: &JobSpec,
    shared: &Shared,
    inbox: &Inbox,
    slots: &mut [Slot],
    offsets: &mut Offsets,
    res: &mut JobResult,
) {
    let mut in_flight = 0usize;
    let mut ready: Vec<usize> = (0..slots.len()).collect();
    let mut stalled_since = monotonic_ns();
    // When the target last completed a command well: a run where it answers every
    // command with an error for a second measures nothing and stops (a full disk, a
    // namespace gone read-only), where fio stops at the first error.
    let mut last_ok = monotonic_ns();
    // The job's voluntary context switches when the window opens and when it closes.
    let mut switches: (Option<u64>, Option<u64>) = (None, None);
    loop {
        let now = monotonic_ns();
        if switches.0.is_none() && now >= spec.window.0 {
            switches.0 = Some(thread_cpu().voluntary_switches);
        }
        if switches.1.is_none() && now >= spec.window.1 {
            switches.1 = Some(thread_cpu().voluntary_switches);
        }
        if now < spec.end_ns && !shared.stop.load(Ordering::Acquire) {
            in_flight += issue(spec, shared, slots, &mut ready, offsets);
        } else {
            ready.clear();
        }
        if in_flight == 0 {
            break;
        }
        let Some(c) = inbox.next(shared) else {
            if monotonic_ns().saturating_sub(stalled_since) > 10_000_000_000 {
                res.failure = Some(format!("{in_flight} commands got no completion for 10 s"));
                break;
            }
            continue;
        };
        stalled_since = monotonic_ns();
        let mut next = Some(c);
        while let Some(c) = next.take() {
            in_flight -= 1;
            let i = (c.token & 0xffff_ffff) as usize;
            account(spec, shared, &mut slots[i], c, res, &mut last_ok);
            ready.push(i);
            next = inbox.try_next();
        }
        if res.failure.is_some() {
            // Collect what is still in flight (a failed queue returns everything).
            let deadline = monotonic_ns() + 2_000_000_000;
            while in_flight > 0 && monotonic_ns() < deadline {
                if inbox.next(shared).is_some() {
                    in_flight -= 1;
                }
            }
            break;
        }
    }
    if let (Some(a), b) = switches {
        res.sleeps = b.unwrap_or_else(|| thread_cpu().voluntary_switches).saturating_sub(a);
    }
}

/// Sends a command for each ready slot, as one batch: its offset and direction drawn,
/// its queue picked by type and the current CPU. Returns how many were sent.
fn issue(spec: &JobSpec, shared: &Shared, slots: &mut [Slot], ready: &mut Vec<usize>, offsets: &mut Offsets) -> usize {
    let g = &spec.group;
    let bs = u64::from(g.bs);
    let lba_shift = spec.block.trailing_zeros();
    let cpu = current_cpu();
    let mut reqs = Vec::with_capacity(ready.len());
    for i in ready.drain(..) {
        let s = &mut slots[i];
        s.offset = offsets.next();
        s.read = g.read_pct == 100 || (g.read_pct > 0 && (offsets.rng.next() % 100) < u64::from(g.read_pct));
        let mut sqe = Sqe::default();
        sqe.set_opcode(if s.read { nvm::READ } else { nvm::WRITE });
        sqe.set_nsid(spec.nsid);
        sqe.set_lba_range(s.offset >> lba_shift, (bs >> lba_shift) as u32);
        if !s.read && spec.verify == VerifyMode::Write {
            fill_pattern(&mut s.buf, s.offset);
        }
        let kind = if g.hipri {
            SetKind::Poll
        } else if s.read && !shared.sets[SetKind::Read as usize].is_empty() {
            SetKind::Read
        } else {
            SetKind::Default
        };
        s.start_ns = monotonic_ns();
        let token = ((spec.index as u64) << 32) | i as u64;
        reqs.push((pick_queue(shared, kind, cpu), Req { sqe, data: std::mem::take(&mut s.buf), token, last: false }));
    }
    let sent = reqs.len();
    submit_batch(shared, reqs);
    sent
}

/// Takes one completion back into its slot: counts it (latency and bytes inside the
/// window, errors), checks a verified read, and notes when the run must stop.
fn account(spec: &JobSpec, shared: &Shared, s: &mut Slot, c: Completion, res: &mut JobResult, last_ok: &mut u64) {
    let g = &spec.group;
    let bs = u64::from(g.bs);
    let end = monotonic_ns();
    s.buf = c.data;
    if s.buf.len() != g.bs as usize {
        s.buf.resize(g.bs as usize, 0);
    }
    let in_window = s.start_ns >= spec.window.0 && end <= spec.window.1;
    if let Some(n) = shared.completed.get(spec.index) {
        n.0.fetch_add(1, Ordering::Relaxed);
    }
    if !c.cqe.status.is_success() {
        if in_window || c.cqe.status == Status::TRANSIENT_TRANSPORT {
            res.errors += 1;
        }
        if end.saturating_sub(*last_ok) > 1_000_000_000 && res.failure.is_none() {
            res.failure = Some(format!(
                "the target answered every command with an error for a second (the last: {})",
                c.cqe.status
            ));
            shared.stop.store(true, Ordering::Release);
        }
        if c.cqe.status == Status::TRANSIENT_TRANSPORT && shared.queues.iter().any(|q| q.failed.load(Ordering::Acquire))
        {
            res.failure = Some("a queue failed".into());
        }
    } else {
        *last_ok = end;
        if in_window {
            if s.read {
                res.reads += 1;
                res.read_lat.record(end - s.start_ns);
            } else {
                res.writes += 1;
                res.write_lat.record(end - s.start_ns);
            }
            res.bytes += bs;
        }
    }
    if c.cqe.status.is_success() && s.read && spec.verify == VerifyMode::Write && !check_pattern(&s.buf, s.offset) {
        res.mismatches += 1;
    }
}

/// Goes once over the job's region in order, `qd` commands in flight: writing the
/// pattern (`write`), or reading each block and checking it against the pattern
/// (counted as reads, and as mismatches when wrong).
fn sweep(
    spec: &JobSpec,
    shared: &Shared,
    inbox: &Inbox,
    slots: &mut [Slot],
    write: bool,
    res: &mut JobResult,
) -> Result<(), String> {
    let g = &spec.group;
    let bs = u64::from(g.bs);
    let lba_shift = spec.block.trailing_zeros();
    let (base, len) = spec.region;
    let end = base + (len / bs).max(1) * bs;
    let mut off = base;
    let mut in_flight = 0usize;
    let mut free: Vec<usize> = (0..slots.len()).collect();
    while off < end || in_flight > 0 {
        let mut batch = Vec::new();
        while off < end
            && let Some(i) = free.pop()
        {
            batch.push((i, off));
            off += bs;
        }
        // One CPU per batch, as a block-layer plug is flushed to one hardware queue.
        let qi = pick_queue(shared, if g.hipri { SetKind::Poll } else { SetKind::Default }, current_cpu());
        let mut reqs = Vec::with_capacity(batch.len());
        for (i, o) in batch {
            let s = &mut slots[i];
            s.offset = o;
            s.read = !write;
            s.start_ns = monotonic_ns();
            if write {
                fill_pattern(&mut s.buf, o);
            }
            let mut sqe = Sqe::default();
            sqe.set_opcode(if write { nvm::WRITE } else { nvm::READ });
            sqe.set_nsid(spec.nsid);
            sqe.set_lba_range(o >> lba_shift, (bs >> lba_shift) as u32);
            let token = ((spec.index as u64) << 32) | i as u64;
            reqs.push((qi, Req { sqe, data: std::mem::take(&mut s.buf), token, last: false }));
            in_flight += 1;
        }
        submit_batch(shared, reqs);
        let waited_from = monotonic_ns();
        let c = loop {
            if let Some(c) = inbox.next(shared) {
                break c;
            }
            if shared.queues.iter().any(|q| q.failed.load(Ordering::Acquire)) {
                return Err("a queue failed".into());
            }
            if monotonic_ns() - waited_from > 10_000_000_000 {
                return Err("no completion for 10 s".into());
            }
        };
        let i = (c.token & 0xffff_ffff) as usize;
        if !c.cqe.status.is_success() {
            return Err(format!("the command at byte {} failed: {}", slots[i].offset, c.cqe.status));
        }
        let s = &mut slots[i];
        s.buf = c.data;
        if s.buf.len() != g.bs as usize {
            s.buf.resize(g.bs as usize, 0);
        }
        if !write {
            res.reads += 1;
            res.bytes += bs;
            res.read_lat.record(monotonic_ns().saturating_sub(s.start_ns));
            if !check_pattern(&s.buf, s.offset) {
                res.mismatches += 1;
            }
        }
        if let Some(n) = shared.completed.get(spec.index) {
            n.0.fetch_add(1, Ordering::Relaxed);
        }
        free.push(i);
        in_flight -= 1;
    }
    Ok(())
}

/// Sends one Flush for the job's namespace and waits for it.
fn flush_namespace(spec: &JobSpec, shared: &Shared, inbox: &Inbox) -> Result<(), String> {
    let hipri = spec.group.hipri;
    let qi = pick_queue(shared, if hipri { SetKind::Poll } else { SetKind::Default }, current_cpu());
    let mut sqe = Sqe::default();
    sqe.set_opcode(nvm::FLUSH);
    sqe.set_nsid(spec.nsid);
    let token = (spec.index as u64) << 32;
    submit(shared, &shared.queues[qi], Req { sqe, data: Vec::new(), token, last: true });
    let waited_from = monotonic_ns();
    let c = loop {
        if let Some(c) = inbox.next(shared) {
            break c;
        }
        if monotonic_ns() - waited_from > 10_000_000_000 {
            return Err("no completion for the verify prefill's Flush in 10 s".into());
        }
        if shared.queues.iter().any(|q| q.failed.load(Ordering::Acquire)) {
            return Err("a queue failed during the verify prefill's Flush".into());
        }
    };
    if !c.cqe.status.is_success() {
        return Err(format!("verify prefill Flush failed: {}", c.cqe.status));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_names_its_offset() {
        let mut b = vec![0u8; 4096];
        fill_pattern(&mut b, 8192);
        assert!(check_pattern(&b, 8192));
        assert!(!check_pattern(&b, 4096), "data at the wrong offset is caught");
        b[100] ^= 1;
        assert!(!check_pattern(&b, 8192));
    }
}

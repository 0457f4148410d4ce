//! The queues: one TCP connection each, its state machine behind a lock, and the I/O
//! worker that sends what jobs hand it and reaps completions (the kernel host's
//! `io_work`). Poll queues have no worker: their jobs reap them.

use std::collections::VecDeque;
use std::io;
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use netlane::time::monotonic_ns;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use nix::sys::eventfd::EventFd;

use super::Caravan;
use super::busypoll::{JobWake, deliver};
use crate::proto::cmd::{Sqe, Status};
use crate::proto::host::{Completion, HostQueue};
use crate::wire::{Batch, RxBuf, send};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SetKind {
    Default,
    Read,
    Poll,
}

pub(super) struct Req {
    pub(super) sqe: Sqe,
    pub(super) data: Vec<u8>,
    pub(super) token: u64,
    pub(super) last: bool,
}

pub(super) struct Inner {
    pub(super) sock: TcpStream,
    pub(super) hq: HostQueue,
    pub(super) rx: RxBuf,
    pub(super) backlog: VecDeque<Req>,
    /// Requests submitted to `hq` but not yet sent, and when the first was (caravans).
    pub(super) unsent_reqs: usize,
    pub(super) first_unsent_ns: u64,
    pub(super) failed: Option<String>,
    /// The last round stopped at its time budget with input left to process.
    pub(super) more: bool,
    /// Since when a batch has been open (requests seen, its last not yet).
    pub(super) batch_open_ns: Option<u64>,
}

pub(super) struct Queue {
    pub(super) qid: u16,
    pub(super) cpu: usize,
    pub(super) kind: SetKind,
    pub(super) inner: Mutex<Inner>,
    pub(super) tx: Option<mpsc::Sender<Req>>,
    pub(super) queued: AtomicUsize,
    pub(super) sleeping: AtomicBool,
    pub(super) wake: EventFd,
    pub(super) failed: AtomicBool,
}

pub(super) struct Shared {
    pub(super) queues: Vec<Arc<Queue>>,
    pub(super) sets: [Vec<usize>; 3],
    pub(super) queue_cpus: Vec<usize>,
    pub(super) jobs: Vec<mpsc::Sender<Completion>>,
    /// Each job's wake-up, for a job sleeping in its busy-poll epoll.
    pub(super) job_wakes: Vec<JobWake>,
    pub(super) stop: AtomicBool,
    pub(super) direct_sends: AtomicU64,
    pub(super) worker_sends: AtomicU64,
    pub(super) send_calls: AtomicU64,
    /// Wake-ups of a sleeping queue worker written by submitters (eventfd writes).
    pub(super) worker_wakes: AtomicU64,
    pub(super) batch: bool,
    pub(super) wake_each: bool,
    pub(super) caravan: Option<Caravan>,
    pub(super) direct_send: bool,
    /// Commands each job completed (any time), for live status; one cache line each.
    pub(super) completed: Vec<JobCounter>,
}

/// A per-job counter on a cache line of its own (jobs on different CPUs never share one).
#[derive(Debug, Default)]
#[repr(align(64))]
pub(super) struct JobCounter(pub(super) AtomicU64);

impl Shared {
    /// Stops every thread of the run: the flag the jobs read, and each queue's wake-up
    /// so that a worker waiting in epoll sees it at once.
    pub(super) fn stop_all(&self) {
        self.stop.store(true, Ordering::Release);
        for q in &self.queues {
            let _ = q.wake.write(1);
        }
    }
}

impl Queue {
    pub(super) fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock is a bug; keep going with the data as is.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Sends what the queue has pending. With `Batch::Last` (the batch is complete) all of
/// it goes with `MSG_EOR`. With `Batch::More` (more of the batch is coming) it goes with
/// `MSG_MORE` except for its last byte, kept back so that the batch's final send always
/// carries data and so uncorks the socket.
pub(super) fn flush_as(inner: &mut Inner, sends: &AtomicU64, batch: Batch) -> io::Result<()> {
    let keep = usize::from(batch == Batch::More);
    while inner.hq.poll_output().len() > keep {
        let out = inner.hq.poll_output();
        let n = send(&inner.sock, &out[..out.len() - keep], batch)?;
        sends.fetch_add(1, Ordering::Relaxed);
        if n == 0 {
            break;
        }
        inner.hq.handle_written(n);
    }
    if batch == Batch::Last {
        inner.unsent_reqs = 0;
        inner.batch_open_ns = None;
    }
    Ok(())
}

/// Sends everything pending (the batch is complete).
pub(super) fn flush(inner: &mut Inner, sends: &AtomicU64) -> io::Result<()> {
    flush_as(inner, sends, Batch::Last)
}

/// Submits into the state machine, or keeps the request in the backlog when the queue
/// is full.
pub(super) fn submit_locked(inner: &mut Inner, req: Req) {
    if !inner.backlog.is_empty() {
        // Behind those already waiting, in order.
        inner.backlog.push_back(req);
        return;
    }
    if let Err(req) = submit_now(inner, req) {
        inner.backlog.push_back(req);
    }
}

/// Puts a request into the state machine, or hands it back when every slot is taken.
fn submit_now(inner: &mut Inner, req: Req) -> Result<(), Req> {
    if inner.hq.free_slots() == 0 {
        return Err(req);
    }
    let Req { sqe, data, token, last } = req;
    if let Err((_, data)) = inner.hq.submit(sqe, data, token) {
        return Err(Req { sqe, data, token, last });
    }
    if inner.unsent_reqs == 0 {
        inner.first_unsent_ns = monotonic_ns();
    }
    inner.unsent_reqs += 1;
    Ok(())
}

/// Moves waiting requests into the slots completions freed, oldest first.
fn drain_backlog(inner: &mut Inner) {
    while let Some(req) = inner.backlog.pop_front() {
        if let Err(req) = submit_now(inner, req) {
            inner.backlog.push_front(req);
            break;
        }
    }
}

/// Output bytes a round lets build up before sending them.
pub(super) const ROUND_OUTPUT: usize = 256 << 10;
/// Time one round of a worker or poller may work before it lets other threads run
/// (the kernel host's `io_work` uses 1 ms the same way).
pub(super) const ROUND_NS: u64 = 1_000_000;

/// Reads what the socket has, runs the state machine, sends what it produced and routes
/// completions, for at most [`ROUND_NS`]. Returns false when the queue failed; sets
/// `inner.more` when it stopped with work left.
pub(super) fn reap_locked(q: &Queue, inner: &mut Inner, shared: &Shared) -> bool {
    let start = monotonic_ns();
    inner.more = false;
    loop {
        let used = match inner.hq.handle_input_until(inner.rx.data(), ROUND_OUTPUT) {
            Ok(used) => used,
            Err(e) => {
                let _ = flush(inner, &shared.send_calls);
                fail(q, inner, shared, e.to_string());
                return false;
            }
        };
        inner.rx.consume(used);
        route(inner, shared);
        if inner.hq.poll_output().len() >= ROUND_OUTPUT {
            if let Err(e) = flush(inner, &shared.send_calls) {
                fail(q, inner, shared, e.to_string());
                return false;
            }
            if !inner.hq.poll_output().is_empty() {
                // The socket is full: the worker waits for EPOLLOUT.
                break;
            }
        }
        if monotonic_ns() - start > ROUND_NS {
            inner.more = true;
            break;
        }
        if used > 0 {
            continue;
        }
        match inner.rx.read_from(&inner.sock, 0) {
            Ok(0) => {
                fail(q, inner, shared, "the target closed the connection".into());
                return false;
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                fail(q, inner, shared, e.to_string());
                return false;
            }
        }
    }
    // Completions freed slots: move the backlog in.
    drain_backlog(inner);
    true
}

pub(super) fn route(inner: &mut Inner, shared: &Shared) {
    while let Some(c) = inner.hq.pop_completion() {
        deliver(shared, c);
    }
}

pub(super) fn fail(q: &Queue, inner: &mut Inner, shared: &Shared, reason: String) {
    if inner.failed.is_none() {
        if !shared.stop.load(Ordering::Acquire) {
            tracing::error!(qid = q.qid, "queue failed: {reason}");
        }
        inner.failed = Some(reason);
    }
    q.failed.store(true, Ordering::Release);
    for c in inner.hq.fail_all() {
        deliver(shared, c);
    }
    for r in inner.backlog.drain(..) {
        let cqe = crate::proto::cmd::Cqe { status: Status::TRANSIENT_TRANSPORT, ..Default::default() };
        deliver(shared, Completion { token: r.token, cqe, data: r.data });
    }
}

/// Longest a batch may stay open (sent with MSG_MORE) waiting for its last request.
pub(super) const BATCH_OPEN_NS: u64 = 200_000;
pub(super) const SOCK_TOKEN: u64 = 1;
pub(super) const WAKE_TOKEN: u64 = 2;

/// The I/O worker of a default or read queue.
pub(super) fn worker(q: Arc<Queue>, rx: mpsc::Receiver<Req>, shared: Arc<Shared>) {
    netlane::cpus::pin(Some(q.cpu));
    let Some(ep) = worker_epoll(&q, &shared) else { return };
    let mut events = [EpollEvent::empty(); 4];
    let mut want_out = false;
    while !shared.stop.load(Ordering::Acquire) {
        // Take the request list.
        let mut got: Vec<Req> = Vec::new();
        while let Ok(r) = rx.try_recv() {
            got.push(r);
        }
        let mut timeout_ms: u16 = 50;
        {
            let mut inner = q.lock();
            if inner.failed.is_some() {
                drop(inner);
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            let n = got.len();
            submit_taken(&q, &mut inner, &shared, got);
            let hold = caravan_holds(&inner, shared.caravan);
            if hold {
                timeout_ms = 0;
            }
            // A batch whose last request has not come yet goes out with MSG_MORE; one
            // left open longer than BATCH_OPEN_NS is sent as complete.
            let open = shared.batch
                && shared.caravan.is_none()
                && inner.batch_open_ns.is_some_and(|t| monotonic_ns() - t <= BATCH_OPEN_NS);
            if !hold && (n > 0 || !inner.hq.poll_output().is_empty()) {
                let batch = if open { Batch::More } else { Batch::Last };
                if let Err(e) = flush_as(&mut inner, &shared.send_calls, batch) {
                    fail(&q, &mut inner, &shared, e.to_string());
                }
            }
            if open {
                timeout_ms = 1;
            }
            let out_pending = inner.hq.poll_output().len() > usize::from(open) && !hold;
            if out_pending != want_out {
                let flags = if out_pending { EpollFlags::EPOLLIN | EpollFlags::EPOLLOUT } else { EpollFlags::EPOLLIN };
                let mut ev = EpollEvent::new(flags, SOCK_TOKEN);
                if ep.modify(inner.sock.as_fd(), &mut ev).is_ok() {
                    want_out = out_pending;
                }
            }
        }
        // A round that used up its time budget: let other threads run, then go on.
        let more = q.lock().more;
        if more {
            std::thread::yield_now();
            let mut inner = q.lock();
            reap_locked(&q, &mut inner, &shared);
            continue;
        }
        // Sleep unless a request arrived since the list was taken.
        q.sleeping.store(true, Ordering::SeqCst);
        if q.queued.load(Ordering::SeqCst) > 0 {
            q.sleeping.store(false, Ordering::SeqCst);
            continue;
        }
        let n = ep.wait(&mut events, nix::poll::PollTimeout::from(timeout_ms)).unwrap_or(0);
        q.sleeping.store(false, Ordering::SeqCst);
        for ev in &events[..n] {
            if ev.data() == WAKE_TOKEN {
                let _ = q.wake.read();
            } else {
                let mut inner = q.lock();
                if ev.events().contains(EpollFlags::EPOLLIN) {
                    reap_locked(&q, &mut inner, &shared);
                }
                if ev.events().contains(EpollFlags::EPOLLOUT)
                    && let Err(e) = flush(&mut inner, &shared.send_calls)
                {
                    fail(&q, &mut inner, &shared, e.to_string());
                }
            }
        }
    }
}

/// Sets up the worker's epoll on the queue's socket and wake eventfd; fails the queue
/// when that cannot be done.
fn worker_epoll(q: &Queue, shared: &Shared) -> Option<Epoll> {
    let ep = match Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC) {
        Ok(ep) => ep,
        Err(e) => {
            let mut inner = q.lock();
            fail(q, &mut inner, shared, format!("epoll: {e}"));
            return None;
        }
    };
    let inner = q.lock();
    let ok = ep.add(inner.sock.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, SOCK_TOKEN)).is_ok()
        && ep.add(q.wake.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, WAKE_TOKEN)).is_ok();
    drop(inner);
    if !ok {
        let mut inner = q.lock();
        fail(q, &mut inner, shared, "epoll_ctl failed".into());
        return None;
    }
    Some(ep)
}

/// Submits the requests the worker took from the list, keeping track of the open batch,
/// and sends at once when batching is off or a batch (not a caravan) is complete.
fn submit_taken(q: &Queue, inner: &mut Inner, shared: &Shared, got: Vec<Req>) {
    for r in got {
        q.queued.fetch_sub(1, Ordering::AcqRel);
        let last = r.last;
        submit_locked(inner, r);
        shared.worker_sends.fetch_add(1, Ordering::Relaxed);
        if last {
            inner.batch_open_ns = None;
        } else if inner.batch_open_ns.is_none() {
            inner.batch_open_ns = Some(monotonic_ns());
        }
        if (!shared.batch || (last && shared.caravan.is_none()))
            && let Err(e) = flush(inner, &shared.send_calls)
        {
            fail(q, inner, shared, e.to_string());
        }
    }
}

/// Whether an i10 caravan holds the unsent requests back: none of its limits (bytes,
/// requests, delay since the first) is reached yet.
fn caravan_holds(inner: &Inner, caravan: Option<Caravan>) -> bool {
    match caravan {
        Some(c) if inner.unsent_reqs > 0 => {
            let age_us = monotonic_ns().saturating_sub(inner.first_unsent_ns) / 1000;
            inner.hq.poll_output().len() < c.max_bytes && inner.unsent_reqs < c.max_reqs && age_us < c.delay_us
        }
        _ => false,
    }
}

//! Poll queues reaped with the kernel's busy polling (`nvme_tcp_poll`'s `sk_busy_loop`):
//! a job that finds no completion waits in an epoll instance over the poll queues'
//! sockets whose busy-poll parameters (`EPIOCSPARAMS`) make `epoll_wait` run the
//! sockets' NAPI instance itself for a while, so that the completion's packets are
//! taken in by the job rather than by the NAPI thread the device's interrupt wakes.
//! When that while passes with nothing, the job sleeps until a packet or a completion
//! another job reaped for it wakes it: the interrupt-driven fallback. Each such sleep is
//! a voluntary context switch of the job, counted over the measured window.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering, fence};
use std::sync::mpsc;

use netlane::lanes::busy::{BusyPoll, Knob, apply_epoll};
use netlane::time::monotonic_ns;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use nix::sys::eventfd::{EfdFlags, EventFd};

use super::queue::{SetKind, Shared, fail, flush, reap_locked};
use crate::proto::host::Completion;

/// How a sleeping job is told a completion was routed to it by another thread.
pub(super) struct JobWake {
    sleeping: AtomicBool,
    fd: EventFd,
}

impl JobWake {
    pub(super) fn new() -> std::io::Result<JobWake> {
        let fd = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC).map_err(std::io::Error::from)?;
        Ok(JobWake { sleeping: AtomicBool::new(false), fd })
    }

    /// After a completion went into the job's channel: wakes the job if it sleeps.
    pub(super) fn notify(&self) {
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::SeqCst) {
            let _ = self.fd.write(1);
        }
    }
}

/// Sends `c` to its job, waking the job when it sleeps in its busy-poll epoll.
pub(super) fn deliver(shared: &Shared, c: Completion) {
    let job = (c.token >> 32) as usize;
    if let Some(tx) = shared.jobs.get(job) {
        let _ = tx.send(c);
        if let Some(w) = shared.job_wakes.get(job) {
            w.notify();
        }
    }
}

const WAKE: u64 = u64::MAX;

/// A job's epoll instance over every poll queue's socket and its own wake-up.
pub(super) struct JobEpoll {
    ep: Epoll,
}

impl JobEpoll {
    /// Sets `bp` on a new epoll instance first (the kernel records the sockets' NAPI
    /// instance as they are added only while busy polling is on), then adds the poll
    /// queues' sockets and the job's wake-up. Returns the busy-poll knob as applied or
    /// refused: refused, the job still waits here, interrupt driven only.
    pub(super) fn new(shared: &Shared, job: usize, bp: &BusyPoll) -> std::io::Result<(JobEpoll, Knob)> {
        let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        let knob = apply_epoll(ep.0.as_fd(), bp);
        for &qi in &shared.sets[SetKind::Poll as usize] {
            let q = &shared.queues[qi];
            let inner = q.lock();
            ep.add(inner.sock.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, qi as u64))?;
        }
        if let Some(w) = shared.job_wakes.get(job) {
            ep.add(w.fd.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, WAKE))?;
        }
        Ok((JobEpoll { ep }, knob))
    }

    /// Stops watching poll queue `qi` once it has failed: its socket stays open and, closed
    /// by the peer or in error, ready for ever, which would keep every wait from sleeping.
    fn forget_if_failed(&self, shared: &Shared, qi: usize) {
        let Some(q) = shared.queues.get(qi) else { return };
        if q.failed.load(Ordering::Acquire)
            && let Ok(inner) = q.inner.try_lock()
            && let Err(e) = self.ep.delete(inner.sock.as_fd())
        {
            tracing::debug!(qid = q.qid, error = %e, "a failed poll queue's socket left the job's epoll already");
        }
    }
}

/// Reaps every poll queue not held by another job, once, sending what each has
/// pending; completions go to their jobs' channels. Returns whether one was left with
/// input read but not yet processed (its round's time ran out): nothing on the socket
/// would wake a sleeper for it.
fn reap_poll_queues(shared: &Shared) -> bool {
    let mut more = false;
    for &qi in &shared.sets[SetKind::Poll as usize] {
        let q = &shared.queues[qi];
        if let Ok(mut inner) = q.inner.try_lock()
            && inner.failed.is_none()
        {
            reap_locked(q, &mut inner, shared);
            more |= inner.more;
            if !inner.hq.poll_output().is_empty()
                && let Err(e) = flush(&mut inner, &shared.send_calls)
            {
                fail(q, &mut inner, shared, e.to_string());
            }
        }
    }
    more
}

/// Waits for one of job `job`'s completions (at most 100 ms): reaps the poll queues, and
/// when they had nothing, lets `epoll_wait` busy poll their NAPI instance and then sleep.
fn wait_busy_polling(
    shared: &Shared,
    rx: &mpsc::Receiver<Completion>,
    job: usize,
    ep: &JobEpoll,
) -> Option<Completion> {
    let deadline = monotonic_ns() + 100_000_000;
    let wake = shared.job_wakes.get(job);
    let mut events = [EpollEvent::empty(); 8];
    loop {
        if let Ok(c) = rx.try_recv() {
            return Some(c);
        }
        let more = reap_poll_queues(shared);
        if let Ok(c) = rx.try_recv() {
            return Some(c);
        }
        let now = monotonic_ns();
        if now >= deadline {
            return None;
        }
        if more {
            continue;
        }
        if let Some(w) = wake {
            w.sleeping.store(true, Ordering::SeqCst);
            fence(Ordering::SeqCst);
        }
        // Routed here between the reap and the flag: do not sleep on it.
        if let Ok(c) = rx.try_recv() {
            if let Some(w) = wake {
                w.sleeping.store(false, Ordering::SeqCst);
            }
            return Some(c);
        }
        let left_ms = (deadline - now).div_ceil(1_000_000).min(100) as u8;
        let n = ep.ep.wait(&mut events, nix::poll::PollTimeout::from(left_ms)).unwrap_or(0);
        for e in events[..n].iter().filter(|e| e.data() != WAKE) {
            ep.forget_if_failed(shared, e.data() as usize);
        }
        if let Some(w) = wake {
            w.sleeping.store(false, Ordering::SeqCst);
            if events[..n].iter().any(|e| e.data() == WAKE) {
                let _ = w.fd.read();
            }
        }
    }
}

/// How a job waits for its completions.
pub(super) enum Waiting {
    /// Blocking on its channel: a worker reaps its queues.
    Channel,
    /// Spinning over the poll queues in user space.
    Spin,
    /// Reaping the poll queues, then busy polling them in the kernel.
    Kernel(JobEpoll),
}

/// A job's completions: its channel, and how it waits on it.
pub(super) struct Inbox {
    pub(super) rx: mpsc::Receiver<Completion>,
    pub(super) waiting: Waiting,
    pub(super) job: usize,
}

impl Inbox {
    /// One completion if one is there already.
    pub(super) fn try_next(&self) -> Option<Completion> {
        self.rx.try_recv().ok()
    }

    /// Waits for one completion (at most about 100 ms).
    pub(super) fn next(&self, shared: &Shared) -> Option<Completion> {
        match &self.waiting {
            Waiting::Channel => self.rx.recv_timeout(std::time::Duration::from_millis(100)).ok(),
            Waiting::Spin => spin(shared, &self.rx),
            Waiting::Kernel(ep) => wait_busy_polling(shared, &self.rx, self.job, ep),
        }
    }
}

/// Waits for one completion by reaping the poll queues in a loop (at most 100 ms).
fn spin(shared: &Shared, rx: &mpsc::Receiver<Completion>) -> Option<Completion> {
    let deadline = monotonic_ns() + 100_000_000;
    loop {
        if let Ok(c) = rx.try_recv() {
            return Some(c);
        }
        reap_poll_queues(shared);
        if monotonic_ns() > deadline {
            return None;
        }
        std::hint::spin_loop();
    }
}

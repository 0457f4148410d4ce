//! `netlane nvme perf`: a closed-loop NVMe/TCP load generator in the spirit of fio.
//!
//! Jobs (threads) keep `qd` commands in flight each. Every command goes to a queue chosen
//! the way blk-mq maps it: the queue set by command type (poll set for high-priority
//! jobs, read set for reads when one exists, else the default set), and within the set
//! the queue of the submitting CPU. Each queue is its own TCP connection.
//!
//! How a command reaches the wire:
//! - through the queue's I/O worker thread (pinned to the queue's CPU): the job pushes it
//!   on the queue's request list and wakes the worker if it sleeps; the worker sends and
//!   also reaps completions, waking the job. Two context switches per I/O, as in the
//!   kernel host;
//! - by direct send: when the job runs on the queue's CPU and nothing is waiting to be
//!   sent on the queue, the job takes the queue and sends itself (one switch saved);
//! - on poll queues there is no worker: the job sends and then busy-polls the socket for
//!   its completions (no switch at all).
//!
//! Batching: a job that submits several commands at once marks the last; the worker sends
//! the whole batch in one `send` (`MSG_MORE` while more follow, `MSG_EOR` on the last).
//! With batching off the worker sends after every command. The i10 "caravan" mode holds
//! sends until 64 KiB of PDUs, 16 requests or 50 us have gathered.

use std::collections::VecDeque;
use std::io;
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use netlane_nvme::cmd::{Sqe, Status, nvm};
use netlane_nvme::host::{Completion, HostQueue};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use nix::sys::eventfd::{EfdFlags, EventFd};
use serde::Serialize;

use super::host::{ConnectOptions, Controller, HostError};
use super::wire::{Batch, RxBuf, send};
use crate::metrics::cpu::{CpuTime, process_cpu};
use crate::metrics::hist::{Hist, Summary};
use crate::time::monotonic_ns;

/// Which CPUs a job group's threads run on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum CpuBinding {
    /// Job i is pinned to `cpus[i % len]`.
    Pinned(Vec<usize>),
    /// Not pinned: the scheduler decides, and each command goes to the queue of the CPU
    /// it is submitted from.
    Unbound,
}

/// One group of identical jobs (fio's job section).
#[derive(Debug, Clone, Serialize)]
pub struct JobGroup {
    /// Name in reports.
    pub name: String,
    /// Random offsets (else sequential).
    pub random: bool,
    /// Percentage of reads (100 = read only, 0 = write only).
    pub read_pct: u8,
    /// Block size in bytes (a multiple of the namespace block size).
    pub bs: u32,
    /// Commands in flight per job.
    pub qd: u32,
    /// Number of jobs.
    pub jobs: u32,
    /// CPU binding.
    pub cpus: CpuBinding,
    /// High priority: use the poll queues.
    pub hipri: bool,
}

impl JobGroup {
    /// Parses `key=value,...`: name, rw (read|write|randread|randwrite|rw|randrw),
    /// rwmixread, bs, qd (iodepth), jobs (numjobs), cpus (list like 0,1 or `any`, with
    /// `+` separating CPUs: `cpus=0+1`), hipri.
    pub fn parse(spec: &str) -> Result<JobGroup, String> {
        let mut g = JobGroup {
            name: "job".into(),
            random: true,
            read_pct: 100,
            bs: 4096,
            qd: 1,
            jobs: 1,
            cpus: CpuBinding::Unbound,
            hipri: false,
        };
        let mut mix = None;
        let mut rw_mixed = false;
        for kv in spec.split(',').filter(|s| !s.is_empty()) {
            let (k, v) = kv.split_once('=').ok_or_else(|| format!("{kv:?}: expected key=value"))?;
            let num = |v: &str| v.parse::<u64>().map_err(|_| format!("{k}={v}: not a number"));
            match k {
                "name" => g.name = v.to_string(),
                "rw" => {
                    (g.random, g.read_pct, rw_mixed) = match v {
                        "read" => (false, 100, false),
                        "write" => (false, 0, false),
                        "randread" => (true, 100, false),
                        "randwrite" => (true, 0, false),
                        "rw" | "readwrite" => (false, 50, true),
                        "randrw" => (true, 50, true),
                        _ => return Err(format!("rw={v}: expected read, write, randread, randwrite, rw or randrw")),
                    }
                }
                "rwmixread" => {
                    let p = num(v)?;
                    if p > 100 {
                        return Err(format!("rwmixread={v}: must be 0..=100"));
                    }
                    mix = Some(p as u8);
                }
                "bs" => {
                    let b = crate::metrics::units::parse_size(v).map_err(|e| e.to_string())?;
                    if b == 0 || b > u64::from(u32::MAX) {
                        return Err(format!("bs={v}: must be 1 byte..4 GiB"));
                    }
                    g.bs = b as u32;
                }
                "qd" | "iodepth" => g.qd = num(v)?.clamp(0, 65535) as u32,
                "jobs" | "numjobs" => g.jobs = num(v)?.clamp(0, 4096) as u32,
                "cpus" => {
                    g.cpus = if v == "any" {
                        CpuBinding::Unbound
                    } else {
                        CpuBinding::Pinned(
                            v.split('+')
                                .map(|c| c.parse::<usize>().map_err(|_| format!("cpus={v}: not a CPU list like 0+1")))
                                .collect::<Result<_, _>>()?,
                        )
                    }
                }
                "hipri" => g.hipri = matches!(v, "1" | "true" | "yes"),
                _ => return Err(format!("unknown job key {k:?}")),
            }
        }
        if let Some(p) = mix {
            if !rw_mixed {
                return Err("rwmixread needs rw=rw or rw=randrw".into());
            }
            g.read_pct = p;
        }
        if g.qd == 0 || g.jobs == 0 {
            return Err("qd and jobs must be at least 1".into());
        }
        Ok(g)
    }

    fn rw_name(&self) -> String {
        let base = match self.read_pct {
            100 => "read",
            0 => "write",
            _ => "rw",
        };
        if self.random { format!("rand{base}") } else { base.to_string() }
    }
}

/// The i10 caravan: hold sends until one of these is reached.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Caravan {
    /// Bytes of PDUs.
    pub max_bytes: usize,
    /// Requests.
    pub max_reqs: usize,
    /// Delay since the first held request, microseconds.
    pub delay_us: u64,
}

impl Default for Caravan {
    fn default() -> Self {
        Caravan { max_bytes: 64 * 1024, max_reqs: 16, delay_us: 50 }
    }
}

/// Everything a perf run needs.
#[derive(Debug, Clone)]
pub struct PerfOptions {
    /// Target and identity.
    pub connect: ConnectOptions,
    /// Namespace to use.
    pub nsid: u32,
    /// Job groups.
    pub groups: Vec<JobGroup>,
    /// Measured time.
    pub duration: Duration,
    /// Time before measuring starts.
    pub ramp: Duration,
    /// Default (write) queues; 0 = one per queue CPU.
    pub queues: u16,
    /// Read queues (0 = reads use the default set).
    pub read_queues: u16,
    /// Poll queues (0 = none; `hipri` jobs need some).
    pub poll_queues: u16,
    /// CPUs queues map onto (and their workers run on).
    pub queue_cpus: Vec<usize>,
    /// Entries per I/O queue.
    pub queue_depth: u16,
    /// Direct send from the submitting thread.
    pub direct_send: bool,
    /// Send each batch at once (else one send per command).
    pub batch: bool,
    /// i10 caravans.
    pub caravan: Option<Caravan>,
    /// Write a pattern over each job's region, then check every read against it.
    pub verify: bool,
    /// Bytes of the namespace to use (default: all of it).
    pub size: Option<u64>,
    /// PID of a local target process whose CPU time to report per I/O.
    pub target_pid: Option<u32>,
}

/// Results of one group.
#[derive(Debug, Clone, Serialize)]
pub struct GroupReport {
    /// Group name.
    pub name: String,
    /// rw mode.
    pub rw: String,
    /// Block size.
    pub bs: u32,
    /// Per-job depth.
    pub qd: u32,
    /// Jobs.
    pub jobs: u32,
    /// Commands completed in the measured window.
    pub ops: u64,
    /// Reads in the window.
    pub reads: u64,
    /// Writes in the window.
    pub writes: u64,
    /// Commands per second.
    pub iops: f64,
    /// MB/s (10^6 bytes).
    pub mb_s: f64,
    /// Read latency, ns.
    pub read_lat_ns: Summary,
    /// Write latency, ns.
    pub write_lat_ns: Summary,
    /// Commands that completed with an error status.
    pub errors: u64,
    /// Reads whose data differed from the pattern (verify mode).
    pub mismatches: u64,
}

/// Results of a run.
#[derive(Debug, Clone, Serialize)]
pub struct PerfReport {
    /// Per group.
    pub groups: Vec<GroupReport>,
    /// Measured seconds.
    pub seconds: f64,
    /// All commands in the window.
    pub ops: u64,
    /// All commands per second.
    pub iops: f64,
    /// Host process CPU over the window.
    pub host_cpu: CpuTime,
    /// Host CPU microseconds per command.
    pub host_cpu_us_per_io: f64,
    /// Host context switches per command (voluntary + involuntary).
    pub host_switches_per_io: f64,
    /// Target CPU microseconds per command (when its PID was given).
    pub target_cpu_us_per_io: Option<f64>,
    /// Commands sent by the submitting thread itself.
    pub direct_sends: u64,
    /// Commands handed to a queue's I/O worker.
    pub worker_sends: u64,
    /// send() calls made.
    pub send_calls: u64,
    /// Commands per send() call.
    pub cmds_per_send: f64,
    /// Queues: (set, qid, cpu).
    pub queues: Vec<(String, u16, usize)>,
    /// Whether each queue ended healthy.
    pub queue_failures: u64,
    /// Verify mode was on.
    pub verified: bool,
}

/// Errors of a perf run.
#[derive(Debug, thiserror::Error)]
pub enum PerfError {
    /// Bad options.
    #[error("{0}")]
    Invalid(String),
    /// Connecting or bring-up failed.
    #[error(transparent)]
    Host(#[from] HostError),
    /// A queue failed during the run.
    #[error("queue {qid} failed: {reason}")]
    QueueFailed {
        /// Queue ID.
        qid: u16,
        /// Why.
        reason: String,
    },
    /// Local I/O error.
    #[error("{0}")]
    Io(#[from] io::Error),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SetKind {
    Default,
    Read,
    Poll,
}

struct Req {
    sqe: Sqe,
    data: Vec<u8>,
    token: u64,
    last: bool,
}

struct Inner {
    sock: TcpStream,
    hq: HostQueue,
    rx: RxBuf,
    backlog: VecDeque<Req>,
    /// Requests submitted to `hq` but not yet sent, and when the first was (caravans).
    unsent_reqs: usize,
    first_unsent_ns: u64,
    failed: Option<String>,
    /// The last round stopped at its time budget with input left to process.
    more: bool,
    /// Since when a batch has been open (requests seen, its last not yet).
    batch_open_ns: Option<u64>,
}

struct Queue {
    qid: u16,
    cpu: usize,
    kind: SetKind,
    inner: Mutex<Inner>,
    tx: Option<mpsc::Sender<Req>>,
    queued: AtomicUsize,
    sleeping: AtomicBool,
    wake: EventFd,
    failed: AtomicBool,
}

struct Shared {
    queues: Vec<Arc<Queue>>,
    sets: [Vec<usize>; 3],
    queue_cpus: Vec<usize>,
    jobs: Vec<mpsc::Sender<Completion>>,
    stop: AtomicBool,
    direct_sends: AtomicU64,
    worker_sends: AtomicU64,
    send_calls: AtomicU64,
    batch: bool,
    caravan: Option<Caravan>,
    direct_send: bool,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock is a bug; keep going with the data as is.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Sends what the queue has pending. With `Batch::Last` (the batch is complete) all of
/// it goes with `MSG_EOR`. With `Batch::More` (more of the batch is coming) it goes with
/// `MSG_MORE` except for its last byte, kept back so that the batch's final send always
/// carries data and so uncorks the socket.
fn flush_as(inner: &mut Inner, sends: &AtomicU64, batch: Batch) -> io::Result<()> {
    let keep = usize::from(batch == Batch::More);
    while inner.hq.pending_output().len() > keep {
        let out = inner.hq.pending_output();
        let n = send(&inner.sock, &out[..out.len() - keep], batch)?;
        sends.fetch_add(1, Ordering::Relaxed);
        if n == 0 {
            break;
        }
        inner.hq.advance_output(n);
    }
    if batch == Batch::Last {
        inner.unsent_reqs = 0;
        inner.batch_open_ns = None;
    }
    Ok(())
}

/// Sends everything pending (the batch is complete).
fn flush(inner: &mut Inner, sends: &AtomicU64) -> io::Result<()> {
    flush_as(inner, sends, Batch::Last)
}

/// Submits into the state machine, or keeps the request in the backlog when the queue
/// is full.
fn submit_locked(inner: &mut Inner, req: Req) {
    if !inner.backlog.is_empty() || inner.hq.free_slots() == 0 {
        inner.backlog.push_back(req);
        return;
    }
    let Req { sqe, data, token, .. } = req;
    if let Err((_, data)) = inner.hq.submit(sqe, data, token) {
        inner.backlog.push_back(Req { sqe, data, token, last: true });
        return;
    }
    if inner.unsent_reqs == 0 {
        inner.first_unsent_ns = monotonic_ns();
    }
    inner.unsent_reqs += 1;
}

/// Output bytes a round lets build up before sending them.
const ROUND_OUTPUT: usize = 256 << 10;
/// Time one round of a worker or poller may work before it lets other threads run
/// (the kernel host's `io_work` uses 1 ms the same way).
const ROUND_NS: u64 = 1_000_000;

/// Reads what the socket has, runs the state machine, sends what it produced and routes
/// completions, for at most [`ROUND_NS`]. Returns false when the queue failed; sets
/// `inner.more` when it stopped with work left.
fn reap_locked(q: &Queue, inner: &mut Inner, shared: &Shared) -> bool {
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
        if inner.hq.pending_output().len() >= ROUND_OUTPUT {
            if let Err(e) = flush(inner, &shared.send_calls) {
                fail(q, inner, shared, e.to_string());
                return false;
            }
            if !inner.hq.pending_output().is_empty() {
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
    while !inner.backlog.is_empty() && inner.hq.free_slots() > 0 {
        if let Some(r) = inner.backlog.pop_front() {
            submit_locked(inner, r);
        }
    }
    true
}

fn route(inner: &mut Inner, shared: &Shared) {
    while let Some(c) = inner.hq.pop_completion() {
        let job = (c.token >> 32) as usize;
        if let Some(tx) = shared.jobs.get(job) {
            let _ = tx.send(c);
        }
    }
}

fn fail(q: &Queue, inner: &mut Inner, shared: &Shared, reason: String) {
    if inner.failed.is_none() {
        if !shared.stop.load(Ordering::Acquire) {
            tracing::error!(qid = q.qid, "queue failed: {reason}");
        }
        inner.failed = Some(reason);
    }
    q.failed.store(true, Ordering::Release);
    for c in inner.hq.fail_all() {
        let job = (c.token >> 32) as usize;
        if let Some(tx) = shared.jobs.get(job) {
            let _ = tx.send(c);
        }
    }
    for r in inner.backlog.drain(..) {
        let job = (r.token >> 32) as usize;
        let cqe = netlane_nvme::cmd::Cqe { status: Status::TRANSIENT_TRANSPORT, ..Default::default() };
        if let Some(tx) = shared.jobs.get(job) {
            let _ = tx.send(Completion { token: r.token, cqe, data: r.data });
        }
    }
}

/// Longest a batch may stay open (sent with MSG_MORE) waiting for its last request.
const BATCH_OPEN_NS: u64 = 200_000;
const SOCK_TOKEN: u64 = 1;
const WAKE_TOKEN: u64 = 2;

/// The I/O worker of a default or read queue.
fn worker(q: Arc<Queue>, rx: mpsc::Receiver<Req>, shared: Arc<Shared>) {
    crate::bulk::pin(Some(q.cpu));
    let ep = match Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC) {
        Ok(ep) => ep,
        Err(e) => {
            let mut inner = q.lock();
            fail(&q, &mut inner, &shared, format!("epoll: {e}"));
            return;
        }
    };
    {
        let inner = q.lock();
        let ok = ep.add(inner.sock.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, SOCK_TOKEN)).is_ok()
            && ep.add(q.wake.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, WAKE_TOKEN)).is_ok();
        drop(inner);
        if !ok {
            let mut inner = q.lock();
            fail(&q, &mut inner, &shared, "epoll_ctl failed".into());
            return;
        }
    }
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
            for r in got {
                q.queued.fetch_sub(1, Ordering::AcqRel);
                let last = r.last;
                submit_locked(&mut inner, r);
                shared.worker_sends.fetch_add(1, Ordering::Relaxed);
                if last {
                    inner.batch_open_ns = None;
                } else if inner.batch_open_ns.is_none() {
                    inner.batch_open_ns = Some(monotonic_ns());
                }
                if (!shared.batch || (last && shared.caravan.is_none()))
                    && let Err(e) = flush(&mut inner, &shared.send_calls)
                {
                    fail(&q, &mut inner, &shared, e.to_string());
                }
            }
            let hold = match shared.caravan {
                Some(c) if inner.unsent_reqs > 0 => {
                    let age_us = monotonic_ns().saturating_sub(inner.first_unsent_ns) / 1000;
                    let hold = inner.hq.pending_output().len() < c.max_bytes
                        && inner.unsent_reqs < c.max_reqs
                        && age_us < c.delay_us;
                    if hold {
                        timeout_ms = 0;
                    }
                    hold
                }
                _ => false,
            };
            // A batch whose last request has not come yet goes out with MSG_MORE; one
            // left open longer than BATCH_OPEN_NS is sent as complete.
            let open = shared.batch
                && shared.caravan.is_none()
                && inner.batch_open_ns.is_some_and(|t| monotonic_ns() - t <= BATCH_OPEN_NS);
            if !hold && (n > 0 || !inner.hq.pending_output().is_empty()) {
                let batch = if open { Batch::More } else { Batch::Last };
                if let Err(e) = flush_as(&mut inner, &shared.send_calls, batch) {
                    fail(&q, &mut inner, &shared, e.to_string());
                }
            }
            if open {
                timeout_ms = 1;
            }
            let out_pending = inner.hq.pending_output().len() > usize::from(open) && !hold;
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

/// A small xorshift generator for offsets (no statistical demands beyond spreading).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The verify pattern: every 8-byte word names its byte offset in the namespace.
fn fill_pattern(buf: &mut [u8], offset: u64) {
    for (i, w) in buf.chunks_exact_mut(8).enumerate() {
        let v = (offset + i as u64 * 8).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x6e6c_616e_6500_0000;
        w.copy_from_slice(&v.to_le_bytes());
    }
}

fn check_pattern(buf: &[u8], offset: u64) -> bool {
    buf.chunks_exact(8).enumerate().all(|(i, w)| {
        let v = (offset + i as u64 * 8).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x6e6c_616e_6500_0000;
        w == v.to_le_bytes()
    })
}

struct Slot {
    buf: Vec<u8>,
    start_ns: u64,
    offset: u64,
    read: bool,
}

#[derive(Default)]
struct JobResult {
    read_lat: Hist,
    write_lat: Hist,
    reads: u64,
    writes: u64,
    bytes: u64,
    errors: u64,
    mismatches: u64,
    failure: Option<String>,
}

struct JobSpec {
    index: usize,
    group: JobGroup,
    cpu: Option<usize>,
    nsid: u32,
    block: u32,
    region: (u64, u64),
    verify: bool,
    window: (u64, u64),
    end_ns: u64,
}

fn current_cpu() -> usize {
    nix::sched::sched_getcpu().unwrap_or(0)
}

/// Index of the queue of set `kind` that serves `cpu`.
fn pick_queue(shared: &Shared, kind: SetKind, cpu: usize) -> usize {
    let set = &shared.sets[kind as usize];
    let pos = shared.queue_cpus.iter().position(|&c| c == cpu).unwrap_or(cpu);
    set[pos % set.len()]
}

/// Submits a job's batch: the last request bound for each queue carries the
/// last-in-batch hint, so that queue's worker sends the batch with `MSG_MORE` until then.
fn submit_batch(shared: &Shared, mut batch: Vec<(usize, Req)>) {
    let mut seen = vec![false; shared.queues.len()];
    for (qi, req) in batch.iter_mut().rev() {
        req.last = !seen[*qi];
        seen[*qi] = true;
    }
    for (qi, req) in batch {
        submit(shared, &shared.queues[qi], req);
    }
}

fn submit(shared: &Shared, q: &Queue, req: Req) {
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
        && inner.hq.pending_output().is_empty()
        && inner.backlog.is_empty()
        && inner.failed.is_none()
    {
        submit_locked(&mut inner, req);
        if let Err(e) = flush(&mut inner, &shared.send_calls) {
            fail(q, &mut inner, shared, e.to_string());
        }
        let leftover = !inner.hq.pending_output().is_empty();
        drop(inner);
        shared.direct_sends.fetch_add(1, Ordering::Relaxed);
        if leftover {
            let _ = q.wake.write(1);
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
        let cqe = netlane_nvme::cmd::Cqe { status: Status::TRANSIENT_TRANSPORT, ..Default::default() };
        if let Some(job) = shared.jobs.get((req.token >> 32) as usize) {
            let _ = job.send(Completion { token: req.token, cqe, data: req.data });
        }
        return;
    }
    if q.sleeping.load(Ordering::SeqCst) {
        let _ = q.wake.write(1);
    }
}

fn run_job(spec: JobSpec, shared: Arc<Shared>, done_rx: mpsc::Receiver<Completion>) -> JobResult {
    crate::bulk::pin(spec.cpu);
    let g = &spec.group;
    let mut res = JobResult::default();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d ^ ((spec.index as u64 + 1) * 0x9e37_79b9));
    let (base, len) = spec.region;
    let bs = u64::from(g.bs);
    let nblocks = (len / bs).max(1);
    let mut seq = 0u64;
    let mut slots: Vec<Slot> =
        (0..g.qd).map(|_| Slot { buf: vec![0u8; g.bs as usize], start_ns: 0, offset: 0, read: true }).collect();
    let lba_shift = spec.block.trailing_zeros();
    let mut next_offset = |rng: &mut Rng| -> u64 {
        let i = if g.random { rng.next() % nblocks } else { (seq % nblocks, seq += 1).0 };
        base + i * bs
    };
    // Verify: lay the pattern over the region first.
    if spec.verify {
        let mut off = base;
        let end = base + nblocks * bs;
        let mut inflight = 0usize;
        let mut free: Vec<usize> = (0..slots.len()).collect();
        while off < end || inflight > 0 {
            let mut batch = Vec::new();
            while off < end
                && let Some(i) = free.pop()
            {
                batch.push((i, off));
                off += bs;
            }
            // One CPU per batch, as a block-layer plug is flushed to one hardware queue.
            let qi = pick_queue(&shared, if g.hipri { SetKind::Poll } else { SetKind::Default }, current_cpu());
            let mut reqs = Vec::with_capacity(batch.len());
            for (i, o) in batch {
                let s = &mut slots[i];
                s.offset = o;
                s.read = false;
                fill_pattern(&mut s.buf, o);
                let mut sqe = Sqe::default();
                sqe.set_opcode(nvm::WRITE);
                sqe.set_nsid(spec.nsid);
                sqe.set_lba_range(o >> lba_shift, (bs >> lba_shift) as u32);
                let token = ((spec.index as u64) << 32) | i as u64;
                reqs.push((qi, Req { sqe, data: std::mem::take(&mut s.buf), token, last: false }));
                inflight += 1;
            }
            submit_batch(&shared, reqs);
            let waited_from = monotonic_ns();
            let got = loop {
                if let Some(c) = wait_one(&shared, &done_rx, g.hipri) {
                    break Some(c);
                }
                if monotonic_ns() - waited_from > 10_000_000_000
                    || shared.queues.iter().any(|q| q.failed.load(Ordering::Acquire))
                {
                    break None;
                }
            };
            match got {
                Some(c) => {
                    let i = (c.token & 0xffff_ffff) as usize;
                    if !c.cqe.status.is_success() {
                        res.failure = Some(format!("verify prefill write failed: {}", c.cqe.status));
                        return res;
                    }
                    slots[i].buf = c.data;
                    free.push(i);
                    inflight -= 1;
                }
                None => {
                    res.failure = Some("no completion for 10 s during the verify prefill".into());
                    return res;
                }
            }
        }
    }
    // The measured run: keep qd in flight until end_ns.
    let mut inflight = 0usize;
    let mut ready: Vec<usize> = (0..slots.len()).collect();
    let mut stalled_since = monotonic_ns();
    loop {
        let now = monotonic_ns();
        if now < spec.end_ns && !shared.stop.load(Ordering::Acquire) {
            let cpu = current_cpu();
            let mut reqs = Vec::with_capacity(ready.len());
            for i in ready.drain(..) {
                let s = &mut slots[i];
                s.offset = next_offset(&mut rng);
                s.read = g.read_pct == 100 || (g.read_pct > 0 && (rng.next() % 100) < u64::from(g.read_pct));
                let mut sqe = Sqe::default();
                sqe.set_opcode(if s.read { nvm::READ } else { nvm::WRITE });
                sqe.set_nsid(spec.nsid);
                sqe.set_lba_range(s.offset >> lba_shift, (bs >> lba_shift) as u32);
                if !s.read && spec.verify {
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
                reqs.push((
                    pick_queue(&shared, kind, cpu),
                    Req { sqe, data: std::mem::take(&mut s.buf), token, last: false },
                ));
                inflight += 1;
            }
            submit_batch(&shared, reqs);
        } else {
            ready.clear();
        }
        if inflight == 0 {
            break;
        }
        let Some(c) = wait_one(&shared, &done_rx, g.hipri) else {
            if monotonic_ns().saturating_sub(stalled_since) > 10_000_000_000 {
                res.failure = Some(format!("{inflight} commands got no completion for 10 s"));
                break;
            }
            continue;
        };
        stalled_since = monotonic_ns();
        let mut next = Some(c);
        while let Some(c) = next.take() {
            inflight -= 1;
            let i = (c.token & 0xffff_ffff) as usize;
            let end = monotonic_ns();
            let s = &mut slots[i];
            s.buf = c.data;
            if s.buf.len() != g.bs as usize {
                s.buf.resize(g.bs as usize, 0);
            }
            let in_window = s.start_ns >= spec.window.0 && end <= spec.window.1;
            if !c.cqe.status.is_success() {
                if in_window || c.cqe.status == Status::TRANSIENT_TRANSPORT {
                    res.errors += 1;
                }
                if c.cqe.status == Status::TRANSIENT_TRANSPORT
                    && shared.queues.iter().any(|q| q.failed.load(Ordering::Acquire))
                {
                    res.failure = Some("a queue failed".into());
                }
            } else if in_window {
                if s.read {
                    res.reads += 1;
                    res.read_lat.record(end - s.start_ns);
                } else {
                    res.writes += 1;
                    res.write_lat.record(end - s.start_ns);
                }
                res.bytes += bs;
            }
            if c.cqe.status.is_success() && s.read && spec.verify && !check_pattern(&s.buf, s.offset) {
                res.mismatches += 1;
            }
            ready.push(i);
            next = done_rx.try_recv().ok();
        }
        if res.failure.is_some() {
            // Collect what is still in flight (a failed queue returns everything).
            let deadline = monotonic_ns() + 2_000_000_000;
            while inflight > 0 && monotonic_ns() < deadline {
                if wait_one(&shared, &done_rx, g.hipri).is_some() {
                    inflight -= 1;
                }
            }
            break;
        }
    }
    res
}

/// Waits for one completion: blocking on the job's channel, or busy-polling its poll
/// queues.
fn wait_one(shared: &Shared, rx: &mpsc::Receiver<Completion>, poll: bool) -> Option<Completion> {
    if !poll {
        return rx.recv_timeout(Duration::from_millis(100)).ok();
    }
    let deadline = monotonic_ns() + 100_000_000;
    loop {
        if let Ok(c) = rx.try_recv() {
            return Some(c);
        }
        for &qi in &shared.sets[SetKind::Poll as usize] {
            let q = &shared.queues[qi];
            if let Ok(mut inner) = q.inner.try_lock()
                && inner.failed.is_none()
            {
                reap_locked(q, &mut inner, shared);
                if !inner.hq.pending_output().is_empty()
                    && let Err(e) = flush(&mut inner, &shared.send_calls)
                {
                    fail(q, &mut inner, shared, e.to_string());
                }
            }
        }
        if monotonic_ns() > deadline {
            return None;
        }
        std::hint::spin_loop();
    }
}

fn read_proc_cpu_ticks(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime) are at 11 and 12 after the command name.
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// Runs a perf workload against a target and reports.
pub fn run(opts: &PerfOptions) -> Result<PerfReport, PerfError> {
    if opts.groups.is_empty() {
        return Err(PerfError::Invalid("no job groups".into()));
    }
    if opts.queue_cpus.is_empty() {
        return Err(PerfError::Invalid("no queue CPUs".into()));
    }
    let ncpu = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    for g in &opts.groups {
        if g.hipri && opts.poll_queues == 0 {
            return Err(PerfError::Invalid(format!("group {}: hipri needs --poll-queues", g.name)));
        }
        if let CpuBinding::Pinned(c) = &g.cpus
            && let Some(bad) = c.iter().find(|&&c| c >= ncpu)
        {
            return Err(PerfError::Invalid(format!("group {}: CPU {bad} does not exist ({ncpu} CPUs)", g.name)));
        }
    }
    if let Some(bad) = opts.queue_cpus.iter().find(|&&c| c >= ncpu) {
        return Err(PerfError::Invalid(format!("queue CPU {bad} does not exist ({ncpu} CPUs)")));
    }
    let n_default = if opts.queues == 0 { opts.queue_cpus.len() as u16 } else { opts.queues };
    let total = u32::from(n_default) + u32::from(opts.read_queues) + u32::from(opts.poll_queues);
    if total > 1024 {
        return Err(PerfError::Invalid(format!("{total} queues is too many")));
    }
    let ctrl = Controller::connect(&opts.connect, total as u16)?;
    if u32::from(ctrl.io_queues) < total {
        return Err(PerfError::Invalid(format!("the target granted {} I/O queues, {total} needed", ctrl.io_queues)));
    }
    let ns = ctrl
        .namespaces
        .iter()
        .find(|n| n.nsid == opts.nsid)
        .ok_or_else(|| PerfError::Invalid(format!("namespace {} not found on the target", opts.nsid)))?;
    let block = ns.info.block_size;
    let ns_bytes = ns.info.blocks * u64::from(block);
    let max_xfer = ctrl.info.max_transfer().unwrap_or(u64::MAX);
    for g in &opts.groups {
        if g.bs % block != 0 {
            return Err(PerfError::Invalid(format!(
                "group {}: bs {} is not a multiple of the {block}-byte block",
                g.name, g.bs
            )));
        }
        if u64::from(g.bs) > max_xfer {
            return Err(PerfError::Invalid(format!(
                "group {}: bs {} exceeds the controller's maximum transfer (MDTS) of {max_xfer} bytes",
                g.name, g.bs
            )));
        }
        if g.bs / block > 65536 {
            return Err(PerfError::Invalid(format!("group {}: bs spans more than 65536 blocks", g.name)));
        }
    }
    let size = opts.size.unwrap_or(ns_bytes).min(ns_bytes);
    let njobs: u32 = opts.groups.iter().map(|g| g.jobs).sum();
    let depth = opts.queue_depth.max(1);

    // Queues.
    let mut queues = Vec::new();
    let mut sets: [Vec<usize>; 3] = Default::default();
    let mut receivers = Vec::new();
    let mut qid = 1u16;
    for (kind, count) in
        [(SetKind::Default, n_default), (SetKind::Read, opts.read_queues), (SetKind::Poll, opts.poll_queues)]
    {
        for i in 0..count {
            let conn = ctrl.connect_io_queue(qid, depth)?;
            let (sock, hq, rest) = conn.into_parts();
            if !rest.is_empty() {
                return Err(PerfError::Invalid("unexpected data after Connect".into()));
            }
            sock.set_nonblocking(true)?;
            sock.set_read_timeout(None)?;
            let cpu = opts.queue_cpus[usize::from(i) % opts.queue_cpus.len()];
            let (tx, rx) = mpsc::channel();
            let q = Arc::new(Queue {
                qid,
                cpu,
                kind,
                inner: Mutex::new(Inner {
                    sock,
                    hq,
                    rx: RxBuf::new(1 << 20),
                    backlog: VecDeque::new(),
                    unsent_reqs: 0,
                    first_unsent_ns: 0,
                    failed: None,
                    more: false,
                    batch_open_ns: None,
                }),
                tx: (kind != SetKind::Poll).then_some(tx),
                queued: AtomicUsize::new(0),
                sleeping: AtomicBool::new(false),
                wake: EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC).map_err(io::Error::from)?,
                failed: AtomicBool::new(false),
            });
            sets[kind as usize].push(queues.len());
            if kind != SetKind::Poll {
                receivers.push((queues.len(), rx));
            }
            queues.push(q);
            qid += 1;
        }
    }
    let mut job_tx = Vec::new();
    let mut job_rx = Vec::new();
    for _ in 0..njobs {
        let (tx, rx) = mpsc::channel();
        job_tx.push(tx);
        job_rx.push(rx);
    }
    let shared = Arc::new(Shared {
        queues,
        sets,
        queue_cpus: opts.queue_cpus.clone(),
        jobs: job_tx,
        stop: AtomicBool::new(false),
        direct_sends: AtomicU64::new(0),
        worker_sends: AtomicU64::new(0),
        send_calls: AtomicU64::new(0),
        batch: opts.batch,
        caravan: opts.caravan,
        direct_send: opts.direct_send,
    });
    let mut workers = Vec::new();
    for (qi, rx) in receivers {
        let q = shared.queues[qi].clone();
        let s = shared.clone();
        workers.push(std::thread::Builder::new().name(format!("nvme-q{}", q.qid)).spawn(move || worker(q, rx, s))?);
    }

    // Jobs: regions split evenly.
    let start = monotonic_ns() + 20_000_000;
    let window = (start + opts.ramp.as_nanos() as u64, start + (opts.ramp + opts.duration).as_nanos() as u64);
    let region_len = (size / u64::from(njobs)) / u64::from(block) * u64::from(block);
    let mut handles = Vec::new();
    let mut index = 0usize;
    let mut rx_iter = job_rx.into_iter();
    for g in &opts.groups {
        for j in 0..g.jobs {
            let cpu = match &g.cpus {
                CpuBinding::Pinned(c) if !c.is_empty() => Some(c[j as usize % c.len()]),
                _ => None,
            };
            let region_len = if opts.verify { region_len } else { size };
            let base = if opts.verify { index as u64 * region_len } else { 0 };
            if region_len < u64::from(g.bs) {
                shared.stop.store(true, Ordering::Release);
                return Err(PerfError::Invalid(format!(
                    "region of {region_len} bytes per job is smaller than bs {}",
                    g.bs
                )));
            }
            let spec = JobSpec {
                index,
                group: g.clone(),
                cpu,
                nsid: opts.nsid,
                block,
                region: (base, region_len),
                verify: opts.verify,
                window,
                end_ns: window.1,
            };
            let s = shared.clone();
            let rx = rx_iter.next().ok_or_else(|| PerfError::Invalid("job channel".into()))?;
            handles.push((
                g.name.clone(),
                std::thread::Builder::new().name(format!("job{index}")).spawn(move || run_job(spec, s, rx))?,
            ));
            index += 1;
        }
    }
    // Measure CPU over the window.
    let sleep_until = |t: u64| {
        let now = monotonic_ns();
        if t > now {
            std::thread::sleep(Duration::from_nanos(t - now));
        }
    };
    sleep_until(window.0);
    let cpu0 = process_cpu();
    let t0 = opts.target_pid.and_then(read_proc_cpu_ticks);
    let sends0 = shared.send_calls.load(Ordering::Relaxed);
    let cmds0 = shared.direct_sends.load(Ordering::Relaxed) + shared.worker_sends.load(Ordering::Relaxed);
    sleep_until(window.1);
    let cpu1 = process_cpu();
    let t1 = opts.target_pid.and_then(read_proc_cpu_ticks);
    let sends1 = shared.send_calls.load(Ordering::Relaxed);
    let cmds1 = shared.direct_sends.load(Ordering::Relaxed) + shared.worker_sends.load(Ordering::Relaxed);

    let mut results: Vec<(String, JobResult)> = Vec::new();
    for (name, h) in handles {
        let r = h.join().map_err(|_| PerfError::Invalid("a job thread panicked".into()))?;
        results.push((name, r));
    }
    shared.stop.store(true, Ordering::Release);
    for q in &shared.queues {
        let _ = q.wake.write(1);
    }
    for w in workers {
        let _ = w.join();
    }
    let queue_failures = shared.queues.iter().filter(|q| q.failed.load(Ordering::Acquire)).count() as u64;
    if let Some((_, r)) = results.iter().find(|(_, r)| r.failure.is_some()) {
        let failed = shared.queues.iter().find(|q| q.failed.load(Ordering::Acquire));
        let reason = failed.and_then(|q| q.lock().failed.clone()).or_else(|| r.failure.clone()).unwrap_or_default();
        return Err(PerfError::QueueFailed { qid: failed.map_or(0, |q| q.qid), reason });
    }
    let _ = ctrl.shutdown();

    let secs = opts.duration.as_secs_f64();
    let mut groups = Vec::new();
    let mut all_ops = 0;
    for g in &opts.groups {
        let mut agg = JobResult::default();
        for (_, r) in results.iter().filter(|(n, _)| *n == g.name) {
            agg.read_lat.merge(&r.read_lat);
            agg.write_lat.merge(&r.write_lat);
            agg.reads += r.reads;
            agg.writes += r.writes;
            agg.bytes += r.bytes;
            agg.errors += r.errors;
            agg.mismatches += r.mismatches;
        }
        let ops = agg.reads + agg.writes;
        all_ops += ops;
        groups.push(GroupReport {
            name: g.name.clone(),
            rw: g.rw_name(),
            bs: g.bs,
            qd: g.qd,
            jobs: g.jobs,
            ops,
            reads: agg.reads,
            writes: agg.writes,
            iops: ops as f64 / secs,
            mb_s: agg.bytes as f64 / secs / 1e6,
            read_lat_ns: agg.read_lat.summary(),
            write_lat_ns: agg.write_lat.summary(),
            errors: agg.errors,
            mismatches: agg.mismatches,
        });
    }
    let host_cpu = cpu1 - cpu0;
    let per_io = |x: f64| if all_ops == 0 { 0.0 } else { x / all_ops as f64 };
    let tick = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64;
    let target_cpu_us_per_io = match (t0, t1) {
        (Some(a), Some(b)) => Some(per_io((b.saturating_sub(a)) as f64 / tick * 1e6)),
        _ => None,
    };
    let sends = sends1 - sends0;
    let cmds = cmds1 - cmds0;
    let names = ["default", "read", "poll"];
    Ok(PerfReport {
        groups,
        seconds: secs,
        ops: all_ops,
        iops: all_ops as f64 / secs,
        host_cpu,
        host_cpu_us_per_io: per_io(host_cpu.total_s() * 1e6),
        host_switches_per_io: per_io((host_cpu.voluntary_switches + host_cpu.involuntary_switches) as f64),
        target_cpu_us_per_io,
        direct_sends: shared.direct_sends.load(Ordering::Relaxed),
        worker_sends: shared.worker_sends.load(Ordering::Relaxed),
        send_calls: shared.send_calls.load(Ordering::Relaxed),
        cmds_per_send: if sends == 0 { 0.0 } else { cmds as f64 / sends as f64 },
        queues: shared.queues.iter().map(|q| (names[q.kind as usize].to_string(), q.qid, q.cpu)).collect(),
        queue_failures,
        verified: opts.verify,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_specs_parse_like_fio() {
        let g = JobGroup::parse("name=readers,rw=randread,bs=4k,qd=1,jobs=16,cpus=0").unwrap();
        assert_eq!((g.bs, g.qd, g.jobs, g.read_pct, g.random), (4096, 1, 16, 100, true));
        assert_eq!(g.cpus, CpuBinding::Pinned(vec![0]));
        let g = JobGroup::parse("rw=randrw,rwmixread=70,bs=1M,qd=32,cpus=any").unwrap();
        assert_eq!((g.read_pct, g.bs, g.cpus), (70, 1 << 20, CpuBinding::Unbound));
        for bad in ["rw=sideways", "bs=0", "qd=0", "rwmixread=70", "x=1", "cpus=a", "rw=randrw,rwmixread=101", "bs"] {
            assert!(JobGroup::parse(bad).is_err(), "{bad}");
        }
    }

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

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
//!
//! This module holds the options and the run, step by step: options checked, queues
//! connected with their workers, jobs started, the window measured, threads joined.
//! `job.rs` has the job groups, `queue.rs` the queues and their workers, `jobloop.rs`
//! the job threads, `report.rs` what a run reports.

mod agents;
mod busypoll;
mod job;
mod jobloop;
mod queue;
mod report;
mod threads;

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::sys::eventfd::{EfdFlags, EventFd};
use serde::Serialize;

use crate::host::{ConnectOptions, Controller, HostError};
use crate::proto::host::Completion;
use crate::wire::RxBuf;
pub use agents::{AgentOutput, GroupLatencies, merge};
use busypoll::JobWake;
pub use job::{CpuBinding, JobGroup};
use jobloop::{JobResult, JobSpec, run_job};
use netlane::cpus::CpuList;
use netlane::lanes::busy::{BusyPoll, Knob};
use netlane::metrics::cpu::{CpuTime, process_cpu};
use netlane::time::monotonic_ns;
use netlane::topology::netdev::NapiSettings;
use queue::{Inner, JobCounter, Queue, SetKind, Shared, worker};
use report::summarize;
pub use report::{GroupReport, PerfReport, QueueInfo};
use threads::{KernelThreads, read_proc_cpu_ticks, read_threads, thread_name};

/// The i10 caravan: hold sends until one of these is reached.
#[derive(Debug, Clone, Copy, Serialize, schemars::JsonSchema)]
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

/// Whether and how `nvme perf` checks data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VerifyMode {
    /// No check.
    #[default]
    Off,
    /// Write a pattern over each job's region first, then check every read against it.
    Write,
    /// Read every block of each job's region once and check it against the pattern an
    /// earlier `Write` run left (fio's `verify_only`): nothing is written.
    ReadBack,
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
    pub queue_cpus: CpuList,
    /// Entries per I/O queue.
    pub queue_depth: u16,
    /// Direct send from the submitting thread.
    pub direct_send: bool,
    /// Send each batch at once (else one send per command).
    pub batch: bool,
    /// Wake a sleeping queue worker for every command handed to it, instead of once the
    /// submitter's batch for that queue is complete (the block layer's rule).
    pub wake_each: bool,
    /// i10 caravans.
    pub caravan: Option<Caravan>,
    /// Whether and how data is checked.
    pub verify: VerifyMode,
    /// Bytes of the namespace to use (default: all of it).
    pub size: Option<u64>,
    /// PID of a local target process whose CPU time to report per I/O.
    pub target_pid: Option<u32>,
    /// Threads on this machine (by thread id) whose CPU time counts as the target's too:
    /// the target side's NAPI threads, which do its receive work.
    pub target_threads: Vec<u32>,
    /// Poll queues reaped with the kernel's busy polling: a high-priority job that finds
    /// nothing waits in `epoll_wait`, which polls the queues' NAPI instance for
    /// `usecs` before it sleeps (interrupt driven). `None`: the job spins in user space.
    pub busy_poll: Option<BusyPoll>,
    /// Interrupt moderation for the run: per-NAPI settings written to every NAPI instance
    /// of the interface towards the target, put back when the run ends.
    pub napi: NapiSettings,
    /// The interface's own interrupt coalescing for the run (ethtool `-C` names:
    /// `rx-usecs`, `adaptive-rx`...), put back when the run ends. A device without it
    /// refuses: the run goes on and its knobs say so.
    pub coalesce: netlane::topology::ethtool::Values,
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
    /// The run could not go on (every command failing, completions that never came).
    #[error("the run stopped: {0}")]
    Stopped(String),
    /// Local I/O error.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Where a run is, for a live status line (`completed`: commands, ramp included).
pub use netlane::metrics::run_status::{RunStatus as Status, STATUS_EVERY};

/// Runs a perf workload against a target and reports.
pub fn run(opts: &PerfOptions) -> Result<PerfReport, PerfError> {
    run_observed(opts, &mut |_| {})
}

/// [`run`], telling `status` where the run is every [`STATUS_EVERY`].
pub fn run_observed(opts: &PerfOptions, status: &mut dyn FnMut(&Status)) -> Result<PerfReport, PerfError> {
    Ok(run_gated(opts, status, &mut || Ok(()))?.0)
}

/// [`run_observed`] as one agent of several hosts' run: once every queue is connected,
/// `gate` returns when the jobs are to start (an error ends the run before any command).
/// Also returns each group's latencies, for the agents' merge.
pub fn run_gated(
    opts: &PerfOptions,
    status: &mut dyn FnMut(&Status),
    gate: &mut dyn FnMut() -> Result<(), PerfError>,
) -> Result<(PerfReport, Vec<GroupLatencies>), PerfError> {
    let (n_default, total) = check_options(opts)?;
    let ctrl = Controller::connect(&opts.connect, total as u16)?;
    if u32::from(ctrl.io_queues) < total {
        return Err(PerfError::Invalid(format!("the target granted {} I/O queues, {total} needed", ctrl.io_queues)));
    }
    let (block, size) = check_namespace(opts, &ctrl)?;
    let njobs: u32 = opts.groups.iter().map(|g| g.jobs).sum();
    // Held until the run ends, then put back.
    let moderation = moderate_interrupts(opts)?;
    let Started { shared, job_rx, workers } = start_queues(opts, &ctrl, n_default, njobs)?;
    gate().inspect_err(|_| shared.stop_all())?;
    // A run that fails to start its jobs stops the workers it started.
    let jobs = start_jobs(opts, &shared, job_rx, block, size).inspect_err(|_| shared.stop_all())?;
    // Measure CPU over the window; tell the caller where the run is meanwhile.
    let measured = measure(opts, &shared, &jobs, moderation.knobs, status);
    let (results, queue_failures) = finish(&shared, jobs.handles, workers)?;
    let _ = ctrl.shutdown();
    drop(moderation.held);
    Ok(summarize(opts, &shared, &results, measured, queue_failures))
}

/// Writes the run's interrupt moderation (per-NAPI settings, the device's coalescing) to
/// the interface towards the target; nothing when none is asked for. An interface
/// without NAPI instances fails a run that asks for per-NAPI settings.
fn moderate_interrupts(opts: &PerfOptions) -> Result<netlane::lanes::queues::Applied, PerfError> {
    use netlane::lanes::queues::{apply_coalescing_towards, apply_napi_settings_towards};
    let dst = opts.connect.addr.ip();
    let why = |why| PerfError::Invalid(format!("interrupt moderation towards {}: {why}", opts.connect.addr));
    let mut all = netlane::lanes::queues::Applied::default();
    if !opts.napi.is_empty() {
        all.extend(apply_napi_settings_towards(dst, opts.napi).map_err(why)?.1);
    }
    if !opts.coalesce.is_empty() {
        all.extend(apply_coalescing_towards(dst, &opts.coalesce).map_err(why)?.1);
    }
    Ok(all)
}

/// Checks the options before connecting. Returns the number of default queues and of
/// all I/O queues.
fn check_options(opts: &PerfOptions) -> Result<(u16, u32), PerfError> {
    if opts.groups.is_empty() {
        return Err(PerfError::Invalid("no job groups".into()));
    }
    if opts.queue_cpus.is_empty() {
        return Err(PerfError::Invalid("no queue CPUs".into()));
    }
    for g in &opts.groups {
        if g.hipri && opts.poll_queues == 0 {
            return Err(PerfError::Invalid(format!("group {}: hipri needs `poll_queues`", g.name)));
        }
        if let CpuBinding::Pinned(c) = &g.cpus {
            c.check_online().map_err(|e| PerfError::Invalid(format!("group {}: {e}", g.name)))?;
        }
    }
    opts.queue_cpus.check_online().map_err(|e| PerfError::Invalid(format!("queue CPUs: {e}")))?;
    if opts.busy_poll.is_some() && (opts.poll_queues == 0 || !opts.groups.iter().any(|g| g.hipri)) {
        return Err(PerfError::Invalid(
            "busy polling is for poll queues: it needs poll queues and a high-priority group on them".into(),
        ));
    }
    let n_default = if opts.queues == 0 { opts.queue_cpus.len() as u16 } else { opts.queues };
    let total = u32::from(n_default) + u32::from(opts.read_queues) + u32::from(opts.poll_queues);
    if total > 1024 {
        return Err(PerfError::Invalid(format!("{total} queues is too many")));
    }
    Ok((n_default, total))
}

/// Checks the groups' block sizes against the namespace and the controller. Returns the
/// namespace's block size and the bytes of it the run uses.
fn check_namespace(opts: &PerfOptions, ctrl: &Controller) -> Result<(u32, u64), PerfError> {
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
    Ok((block, size))
}

/// The queues of a run, connected, with their workers started.
struct Started {
    /// What the threads share.
    shared: Arc<Shared>,
    /// Each job's completion channel.
    job_rx: Vec<mpsc::Receiver<Completion>>,
    /// The I/O workers of the default and read queues.
    workers: Vec<JoinHandle<()>>,
}

/// Connects the I/O queues, set by set, and starts the workers of those that have one.
fn start_queues(opts: &PerfOptions, ctrl: &Controller, n_default: u16, njobs: u32) -> Result<Started, PerfError> {
    let depth = opts.queue_depth.max(1);
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
            let cpu = opts.queue_cpus.nth_wrapping(usize::from(i)).unwrap_or(0);
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
        queue_cpus: opts.queue_cpus.as_slice().to_vec(),
        jobs: job_tx,
        // Only jobs that sleep in their busy-poll epoll need waking (none otherwise: no
        // fence on the completion path).
        job_wakes: if opts.busy_poll.is_some() {
            (0..njobs).map(|_| JobWake::new()).collect::<io::Result<_>>()?
        } else {
            Vec::new()
        },
        stop: AtomicBool::new(false),
        direct_sends: AtomicU64::new(0),
        worker_sends: AtomicU64::new(0),
        send_calls: AtomicU64::new(0),
        worker_wakes: AtomicU64::new(0),
        batch: opts.batch,
        wake_each: opts.wake_each,
        caravan: opts.caravan,
        direct_send: opts.direct_send,
        completed: (0..njobs).map(|_| JobCounter::default()).collect(),
    });
    let mut workers = Vec::new();
    for (qi, rx) in receivers {
        let q = shared.queues[qi].clone();
        let s = shared.clone();
        let spawned = std::thread::Builder::new().name(format!("nvme-q{}", q.qid)).spawn(move || worker(q, rx, s));
        // The workers started so far end with the run that could not start.
        workers.push(spawned.inspect_err(|_| shared.stop_all())?);
    }
    Ok(Started { shared, job_rx, workers })
}

/// The job threads of a run, and when they run.
struct Jobs {
    /// Each job's group name and thread.
    handles: Vec<(String, JoinHandle<JobResult>)>,
    /// When the jobs start, ns.
    start: u64,
    /// The measured window (after the ramp), ns.
    window: (u64, u64),
}

/// Starts the job threads, a little ahead, each on its region of the namespace.
fn start_jobs(
    opts: &PerfOptions,
    shared: &Arc<Shared>,
    job_rx: Vec<mpsc::Receiver<Completion>>,
    block: u32,
    size: u64,
) -> Result<Jobs, PerfError> {
    let njobs = job_rx.len() as u64;
    // Jobs: regions split evenly.
    let start = monotonic_ns() + 20_000_000;
    let window = (start + opts.ramp.as_nanos() as u64, start + (opts.ramp + opts.duration).as_nanos() as u64);
    let region_len = (size / njobs) / u64::from(block) * u64::from(block);
    let mut handles = Vec::new();
    let mut index = 0usize;
    let mut rx_iter = job_rx.into_iter();
    for g in &opts.groups {
        for j in 0..g.jobs {
            let cpu = match &g.cpus {
                CpuBinding::Pinned(c) => c.nth_wrapping(j as usize),
                _ => None,
            };
            let verifying = opts.verify != VerifyMode::Off;
            let region_len = if verifying { region_len } else { size };
            let base = if verifying { index as u64 * region_len } else { 0 };
            if region_len < u64::from(g.bs) {
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
                busy_poll: opts.busy_poll,
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
    Ok(Jobs { handles, start, window })
}

/// What was read around the measured window.
struct Measured {
    /// When the jobs started, ns.
    start: u64,
    /// The measured window, ns.
    window: (u64, u64),
    /// When the window ended (early when the run could not go on), ns.
    ended: u64,
    /// Host process CPU over the window.
    host_cpu: CpuTime,
    /// The target's CPU ticks at the window's start and end, when its PID was given.
    target_ticks: (Option<u64>, Option<u64>),
    /// The host's NAPI threads (towards the target) and their CPU over the window, s.
    host_napi: KernelThreads,
    /// The target's given threads and their CPU over the window, s.
    target_threads: KernelThreads,
    /// send() calls in the window.
    sends: u64,
    /// Worker wake-ups written in the window.
    wakes: u64,
    /// Commands sent in the window.
    cmds: u64,
    /// Packets taken in by busy polling in the window.
    busy_polled: Option<u64>,
    /// The interrupt moderation applied for the run.
    knobs: Vec<Knob>,
}

/// Waits out the ramp and the measured window, reading CPU time and send counters at
/// either end, and tells `status` where the run is meanwhile.
fn measure(
    opts: &PerfOptions,
    shared: &Shared,
    jobs: &Jobs,
    knobs: Vec<Knob>,
    status: &mut dyn FnMut(&Status),
) -> Measured {
    let total = opts.ramp + opts.duration;
    let sent = || shared.direct_sends.load(Ordering::Relaxed) + shared.worker_sends.load(Ordering::Relaxed);
    // The host's receive work for this traffic runs in the NAPI threads of the
    // interface towards the target, when NAPI is threaded there.
    let host_napi = match netlane::lanes::queues::napi_threads_towards(opts.connect.addr.ip()) {
        Ok(threads) => threads,
        Err(why) => {
            tracing::warn!("the host's NAPI threads could not be found: {why}");
            Vec::new()
        }
    };
    let target_threads: Vec<(u32, String)> = opts.target_threads.iter().map(|&t| (t, thread_name(t))).collect();
    sleep_until(jobs.window.0, shared, jobs, total, status);
    let (napi0, given0) = (read_threads(&host_napi), read_threads(&target_threads));
    let polled0 = netlane::lanes::busy::busy_poll_rx_packets();
    let cpu0 = process_cpu();
    let t0 = opts.target_pid.and_then(read_proc_cpu_ticks);
    let sends0 = shared.send_calls.load(Ordering::Relaxed);
    let wakes0 = shared.worker_wakes.load(Ordering::Relaxed);
    let cmds0 = sent();
    sleep_until(jobs.window.1, shared, jobs, total, status);
    let ended = monotonic_ns();
    let cpu1 = process_cpu();
    let t1 = opts.target_pid.and_then(read_proc_cpu_ticks);
    let (napi1, given1) = (read_threads(&host_napi), read_threads(&target_threads));
    let polled1 = netlane::lanes::busy::busy_poll_rx_packets();
    let sends1 = shared.send_calls.load(Ordering::Relaxed);
    let wakes1 = shared.worker_wakes.load(Ordering::Relaxed);
    let cmds1 = sent();
    Measured {
        start: jobs.start,
        window: jobs.window,
        ended,
        host_cpu: cpu1 - cpu0,
        target_ticks: (t0, t1),
        host_napi: KernelThreads::over(host_napi, napi0, napi1),
        target_threads: KernelThreads::over(target_threads, given0, given1),
        sends: sends1 - sends0,
        wakes: wakes1 - wakes0,
        cmds: cmds1 - cmds0,
        busy_polled: polled0.zip(polled1).map(|(a, b)| b.saturating_sub(a)),
        knobs,
    }
}

/// Sleeps until `t`, telling `status` where the run is every [`STATUS_EVERY`]. Returns
/// early when a queue failed (the run cannot go on) or every job is done.
fn sleep_until(t: u64, shared: &Shared, jobs: &Jobs, total: Duration, status: &mut dyn FnMut(&Status)) {
    loop {
        let now = monotonic_ns();
        if now >= t
            || shared.queues.iter().any(|q| q.failed.load(Ordering::Acquire))
            || jobs.handles.iter().all(|(_, h)| h.is_finished())
        {
            return;
        }
        std::thread::sleep(Duration::from_nanos((t - now).min(STATUS_EVERY.as_nanos() as u64)));
        let now = monotonic_ns();
        status(&Status {
            elapsed: Duration::from_nanos(now.saturating_sub(jobs.start)),
            total,
            measuring: now >= jobs.window.0,
            completed: shared.completed.iter().map(|c| c.0.load(Ordering::Relaxed)).sum(),
        });
    }
}

/// Joins the jobs, then stops and joins the workers. Returns the jobs' results with their
/// group names and how many queues failed, or what stopped the run.
fn finish(
    shared: &Shared,
    handles: Vec<(String, JoinHandle<JobResult>)>,
    workers: Vec<JoinHandle<()>>,
) -> Result<(Vec<(String, JobResult)>, u64), PerfError> {
    let mut results: Vec<(String, JobResult)> = Vec::new();
    for (name, h) in handles {
        let r = h.join().map_err(|_| PerfError::Invalid("a job thread panicked".into()))?;
        results.push((name, r));
    }
    shared.stop_all();
    for w in workers {
        let _ = w.join();
    }
    let queue_failures = shared.queues.iter().filter(|q| q.failed.load(Ordering::Acquire)).count() as u64;
    if let Some((_, r)) = results.iter().find(|(_, r)| r.failure.is_some()) {
        let stopped = r.failure.clone().unwrap_or_default();
        return Err(match shared.queues.iter().find(|q| q.failed.load(Ordering::Acquire)) {
            Some(q) => PerfError::QueueFailed { qid: q.qid, reason: q.lock().failed.clone().unwrap_or(stopped) },
            None => PerfError::Stopped(stopped),
        });
    }
    Ok((results, queue_failures))
}

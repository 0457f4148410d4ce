//! A run: the connections opened and spread over threads, each thread's event loop (one
//! epoll instance, one timerfd armed for the earliest send due), and the threads'
//! statistics merged into the report.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{ErrorKind, Read as _, Write as _};
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::resource::{UsageWho, getrusage};
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};

use super::{LoadConfig, LoadError, LoadReport, Run, connect, io_err};
use crate::load::conn::{ConnConfig, Connection};
use crate::load::rng::Rng;
use crate::load::schedule::Pacing;
use crate::load::stats::Stats;
use crate::load::workload::Workload;
use netlane::metrics::run_status::{RunStatus, Window, watch};
use netlane::time::monotonic_ns;

struct Peer {
    stream: Option<TcpStream>,
    conn: Option<Connection>,
    /// Bytes written to the socket later (it was full).
    pending: Vec<u8>,
    /// The due time this connection is queued under.
    queued: Option<u64>,
}

const TIMER: u64 = u64::MAX;

struct ThreadResult {
    stats: Stats,
    failures: u64,
    cpu_s: f64,
    wall_s: f64,
}

fn thread_cpu_s() -> f64 {
    getrusage(UsageWho::RUSAGE_THREAD).map_or(0.0, |r| {
        let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
        t(r.user_time()) + t(r.system_time())
    })
}

/// Runs the load for `cfg.duration` (or until `stop`), then waits `cfg.drain` for the
/// last replies.
pub fn run(cfg: &LoadConfig, stop: &AtomicBool) -> Result<Run, LoadError> {
    run_gated(cfg, stop, || Ok(()))
}

/// [`run`], telling `status` where it is as it goes (completed: requests answered).
pub fn run_observed(cfg: &LoadConfig, stop: &AtomicBool, status: &mut dyn FnMut(&RunStatus)) -> Result<Run, LoadError> {
    run_inner(cfg, stop, || Ok(()), Some(status))
}

/// [`run`], its schedule started only once every connection is open and `gate` has
/// returned (an agent waits there for its coordinator's start).
pub fn run_gated(
    cfg: &LoadConfig,
    stop: &AtomicBool,
    gate: impl FnOnce() -> Result<(), LoadError>,
) -> Result<Run, LoadError> {
    run_inner(cfg, stop, gate, None)
}

fn run_inner(
    cfg: &LoadConfig,
    stop: &AtomicBool,
    gate: impl FnOnce() -> Result<(), LoadError>,
    status: Option<&mut dyn FnMut(&RunStatus)>,
) -> Result<Run, LoadError> {
    cfg.validate()?;
    let workload = Workload::new(cfg.workload).map_err(|e| LoadError::Config(e.to_string()))?;
    let pacing = match cfg.pacing {
        Pacing::Open(a) => {
            Pacing::Open(a.per_connection(cfg.connections).map_err(|e| LoadError::Config(e.to_string()))?)
        }
        p => p,
    };
    // Connect everything first; the window starts once all threads are ready.
    let mut streams: Vec<Vec<(u32, TcpStream)>> = (0..cfg.threads).map(|_| Vec::new()).collect();
    for i in 0..cfg.connections {
        let s = connect(cfg.server)?;
        s.set_nonblocking(true).map_err(io_err("non-blocking"))?;
        streams[i as usize % cfg.threads].push((i, s));
    }
    gate()?;
    let barrier = Arc::new(Barrier::new(cfg.threads));
    let start_ns = monotonic_ns() + 50_000_000;
    let measure_from_ns = start_ns + cfg.ramp.as_nanos() as u64;
    let end_ns = measure_from_ns + cfg.duration.as_nanos() as u64;
    let completed = AtomicU64::new(0);
    let completed = &completed;
    let results: Vec<Result<ThreadResult, LoadError>> = std::thread::scope(|sc| {
        let handles: Vec<_> = streams
            .into_iter()
            .enumerate()
            .map(|(t, mine)| {
                let (workload, barrier) = (workload.clone(), barrier.clone());
                let cpu = cfg.cpus.as_ref().and_then(|c| (!c.is_empty()).then(|| c[t % c.len()]));
                let cc = ConnConfig {
                    pacing,
                    start_ns,
                    end_ns,
                    max_in_flight: cfg.max_in_flight,
                    late_after_ns: cfg.late_after.as_nanos() as u64,
                    measure_from_ns,
                    max_value_len: cfg.workload.item_max,
                };
                let (seed, drain) = (cfg.seed, cfg.drain);
                sc.spawn(move || {
                    netlane::cpus::pin(cpu);
                    barrier.wait();
                    drive(mine, &cc, &workload, seed, end_ns + drain.as_nanos() as u64, stop, completed)
                })
            })
            .collect();
        if let Some(status) = status {
            let window = Window { start_ns, measure_from_ns, end_ns };
            watch(window, completed, || !handles.iter().all(|h| h.is_finished()), status);
        }
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(LoadError::Config("a load thread panicked".into()))))
            .collect()
    });
    let mut stats = Stats::new();
    let (mut failures, mut cpu, mut wall) = (0, 0.0, 0.0);
    for r in results {
        let r = r?;
        stats.merge(&r.stats);
        failures += r.failures;
        cpu += r.cpu_s;
        wall += r.wall_s;
    }
    let report = LoadReport::summarize(cfg, &stats, failures, cpu, wall);
    Ok(Run { report, stats, threads_wall_s: wall })
}

/// Each connection as a peer with its protocol state, registered with `epoll` under its
/// index.
fn peers(
    mine: Vec<(u32, TcpStream)>,
    epoll: &Epoll,
    cc: &ConnConfig,
    workload: &Workload,
    seed: u64,
) -> Result<Vec<Peer>, LoadError> {
    let mut peers = Vec::with_capacity(mine.len());
    for (i, (id, s)) in mine.into_iter().enumerate() {
        epoll
            .add(s.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, i as u64))
            .map_err(|e| io_err("epoll add")(e.into()))?;
        let conn = Connection::new(cc, workload.clone(), Rng::stream(seed, u64::from(id)))
            .map_err(|e| LoadError::Config(e.to_string()))?;
        peers.push(Peer { stream: Some(s), conn: Some(conn), pending: Vec::new(), queued: None });
    }
    Ok(peers)
}

/// One thread's event loop.
fn drive(
    mine: Vec<(u32, TcpStream)>,
    cc: &ConnConfig,
    workload: &Workload,
    seed: u64,
    until_ns: u64,
    stop: &AtomicBool,
    completed: &AtomicU64,
) -> Result<ThreadResult, LoadError> {
    let (cpu0, wall0) = (thread_cpu_s(), monotonic_ns());
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(|e| io_err("epoll")(e.into()))?;
    let timer = TimerFd::new(ClockId::CLOCK_MONOTONIC, TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC)
        .map_err(|e| io_err("timerfd")(e.into()))?;
    epoll.add(timer.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, TIMER)).map_err(|e| io_err("epoll add")(e.into()))?;
    let mut stats = Stats::new();
    let mut peers = peers(mine, &epoll, cc, workload, seed)?;
    let mut heap: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    // A connection is queued under its next due time while it can send: never after its
    // socket failed (what it would have sent counts as not sent at the end), or the loop
    // below would pop and push it again for ever.
    let requeue = |p: &mut Peer, i: usize, heap: &mut BinaryHeap<Reverse<(u64, usize)>>| {
        let due = p.stream.as_ref().and(p.conn.as_ref()).and_then(Connection::next_due);
        if due != p.queued {
            p.queued = due;
            if let Some(d) = due {
                heap.push(Reverse((d, i)));
            }
        }
    };
    for (i, p) in peers.iter_mut().enumerate() {
        requeue(p, i, &mut heap);
    }
    let mut failures = 0u64;
    let mut out = Vec::with_capacity(4096);
    let mut buf = vec![0u8; 256 << 10];
    let mut events = vec![EpollEvent::empty(); 256];
    let mut armed = None;
    let mut told = 0;
    loop {
        let now = monotonic_ns();
        if now >= until_ns || stop.load(Ordering::Relaxed) {
            break;
        }
        let answered = stats.counts().completed;
        if answered != told {
            completed.fetch_add(answered - told, Ordering::Relaxed);
            told = answered;
        }
        // Everything due goes out now.
        while let Some(&Reverse((due, i))) = heap.peek() {
            if due > now {
                break;
            }
            heap.pop();
            let p = &mut peers[i];
            if p.queued != Some(due) {
                continue;
            }
            p.queued = None;
            if let (Some(conn), Some(_)) = (p.conn.as_mut(), p.stream.as_ref()) {
                out.clear();
                conn.poll_transmit(now, &mut out, &mut stats);
                p.pending.extend_from_slice(&out);
                if !flush(p) {
                    fail(p, now, &mut stats, &mut failures);
                }
            }
            requeue(p, i, &mut heap);
        }
        let next = heap.peek().map_or(until_ns, |r| r.0.0).min(until_ns);
        // Re-armed only when it must fire earlier, or has fired: a timer set for a
        // deadline already passed (the sends were made) wakes the thread once for
        // nothing, cheaper than a timerfd_settime per send.
        if armed.is_none_or(|a| next < a) {
            let ts = TimeSpec::new((next / 1_000_000_000) as _, (next % 1_000_000_000) as _);
            timer
                .set(Expiration::OneShot(ts), TimerSetTimeFlags::TFD_TIMER_ABSTIME)
                .map_err(|e| io_err("timerfd set")(e.into()))?;
            armed = Some(next);
        }
        let n = match epoll.wait(&mut events, EpollTimeout::from(100u16)) {
            Ok(n) => n,
            Err(nix::Error::EINTR) => 0,
            Err(e) => return Err(io_err("epoll_wait")(e.into())),
        };
        let now = monotonic_ns();
        for ev in &events[..n] {
            let i = ev.data();
            if i == TIMER {
                let _ = timer.wait();
                armed = None;
                continue;
            }
            let i = i as usize;
            let p = &mut peers[i];
            if !p.pending.is_empty() && !flush(p) {
                fail(p, now, &mut stats, &mut failures);
                continue;
            }
            let Some(s) = p.stream.as_mut() else { continue };
            let ok = match s.read(&mut buf) {
                Ok(0) => false,
                Ok(m) => p.conn.as_mut().is_some_and(|c| c.handle_input(now, &buf[..m], &mut stats).is_ok()),
                Err(e) => e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted,
            };
            if !ok {
                fail(p, now, &mut stats, &mut failures);
            }
            requeue(p, i, &mut heap);
        }
    }
    for p in peers {
        if let Some(c) = p.conn {
            c.finish(&mut stats);
        }
    }
    Ok(ThreadResult { stats, failures, cpu_s: thread_cpu_s() - cpu0, wall_s: (monotonic_ns() - wall0) as f64 / 1e9 })
}

/// Writes what is pending; false when the connection broke.
fn flush(p: &mut Peer) -> bool {
    let Some(s) = p.stream.as_mut() else { return false };
    while !p.pending.is_empty() {
        match s.write(&p.pending) {
            Ok(n) => {
                p.pending.drain(..n);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    true
}

/// A connection broke: its requests in flight are lost; it sends nothing more (what it
/// would have sent counts as not sent at the end).
fn fail(p: &mut Peer, now: u64, stats: &mut Stats, failures: &mut u64) {
    if p.stream.take().is_some() {
        *failures += 1;
        if let Some(c) = p.conn.as_mut() {
            c.handle_disconnect(now, stats);
        }
    }
    p.pending.clear();
    p.queued = None;
}

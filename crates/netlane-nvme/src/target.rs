//! The NVMe/TCP target server.
//!
//! An acceptor thread hands each new connection to one reactor, round robin. Each
//! reactor is a thread pinned to its CPU with its own epoll set; it owns its connections
//! outright (the [`TargetQueue`] state machines, buffers and sockets), so the I/O path
//! takes no locks. A reactor round reads every ready socket and runs the state machines;
//! a connection whose output passes 256 KiB mid-round sends it with `MSG_MORE` (the
//! rest of its batch follows), and at the end of the round each connection's remaining
//! output goes out with `MSG_EOR`, which also uncorks what `MSG_MORE` held. With busy polling the reactor spins on `epoll_wait`
//! with a zero timeout (and sets `SO_BUSY_POLL` on its sockets) instead of sleeping.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::proto::target::{CloseReason, Subsystem, TargetQueue};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use nix::sys::eventfd::{EfdFlags, EventFd};
use serde::Serialize;

use crate::wire::{Batch, RxBuf, send};
use netlane::metrics::cpu::{CpuTime, thread_cpu};
use netlane::time::monotonic_ns;

/// The subsystem NQN `netlane nvme target` serves unless told otherwise.
pub const DEFAULT_NQN: &str = "nqn.2026-11.io.netlane:target";

/// How the target runs.
#[derive(Debug, Clone)]
pub struct TargetOptions {
    /// Address to listen on (default port 4420).
    pub listen: SocketAddr,
    /// One reactor per CPU in this list.
    pub cpus: Vec<usize>,
    /// Spin on the sockets instead of sleeping; with `Some(us)` also set `SO_BUSY_POLL`.
    pub busy_poll: Option<u32>,
    /// Spin (zero-timeout epoll) even without `SO_BUSY_POLL`.
    pub spin: bool,
}

/// Counters of a running or stopped target.
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
pub struct TargetStats {
    /// Connections accepted.
    pub connections: u64,
    /// Connections closed, by reason.
    pub closed: BTreeMap<String, u64>,
    /// Commands received.
    pub commands: u64,
    /// Reactor rounds.
    pub rounds: u64,
    /// send() calls.
    pub sends: u64,
    /// CPU time of the reactor threads.
    pub reactor_cpu: CpuTime,
    /// The subsystem's counters (what the SMART log reports).
    pub subsystem: SubsystemCounters,
}

/// A snapshot of the subsystem's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct SubsystemCounters {
    /// Read commands completed.
    pub read_cmds: u64,
    /// Write commands completed.
    pub write_cmds: u64,
    /// 512-byte units read.
    pub sectors_read: u64,
    /// 512-byte units written.
    pub sectors_written: u64,
    /// Connections terminated for a protocol violation.
    pub terminations: u64,
    /// Data digest errors seen.
    pub data_digest_errors: u64,
    /// Controllers removed because their keep-alive timer expired.
    pub keepalive_expiries: u64,
}

impl SubsystemCounters {
    fn of(s: &Subsystem) -> SubsystemCounters {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let st = &s.stats;
        SubsystemCounters {
            read_cmds: g(&st.read_cmds),
            write_cmds: g(&st.write_cmds),
            sectors_read: g(&st.sectors_read),
            sectors_written: g(&st.sectors_written),
            terminations: g(&st.terminations),
            data_digest_errors: g(&st.data_digest_errors),
            keepalive_expiries: g(&st.keepalive_expiries),
        }
    }
}

#[derive(Debug, Default)]
struct Shared {
    stop: AtomicBool,
    connections: AtomicU64,
    stats: Mutex<TargetStats>,
}

/// A running target; [`TargetServer::stop`] (or drop) ends it.
#[derive(Debug)]
pub struct TargetServer {
    addr: SocketAddr,
    subsys: Arc<Subsystem>,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    wakers: Vec<Arc<EventFd>>,
}

struct Reactor {
    cpu: usize,
    rx: mpsc::Receiver<TcpStream>,
    wake: Arc<EventFd>,
    subsys: Arc<Subsystem>,
    shared: Arc<Shared>,
    busy_poll: Option<u32>,
    spin: bool,
}

struct Conn {
    sock: TcpStream,
    rx: RxBuf,
    q: TargetQueue,
    interest: EpollFlags,
}

/// Output backlog above which a connection stops being read until it drains.
const BACKLOG_LIMIT: usize = 8 << 20;
/// Output size at which a round sends early (with `MSG_MORE`) rather than buffer more.
const FLUSH_AT: usize = 256 << 10;
const WAKE_TOKEN: u64 = u64::MAX;
/// Bytes read from one connection per reactor round before moving on to the next.
const READ_BUDGET: usize = 256 << 10;

impl TargetServer {
    /// Binds, starts the reactors and the acceptor.
    pub fn start(subsys: Arc<Subsystem>, opts: &TargetOptions) -> io::Result<TargetServer> {
        if opts.cpus.is_empty() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "the target needs at least one reactor CPU"));
        }
        let listener = TcpListener::bind(opts.listen)
            .map_err(|e| io::Error::new(e.kind(), format!("listen on {}: {e}", opts.listen)))?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let shared = Arc::new(Shared::default());
        let mut threads = Vec::new();
        let mut senders = Vec::new();
        let mut wakers = Vec::new();
        for &cpu in &opts.cpus {
            let (tx, rx) = mpsc::channel();
            let wake = Arc::new(EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?);
            let r = Reactor {
                cpu,
                rx,
                wake: wake.clone(),
                subsys: subsys.clone(),
                shared: shared.clone(),
                busy_poll: opts.busy_poll,
                spin: opts.spin || opts.busy_poll.is_some(),
            };
            threads.push(std::thread::Builder::new().name(format!("nvmet-r{cpu}")).spawn(move || {
                if let Err(e) = r.run() {
                    tracing::error!("reactor on CPU {cpu} failed: {e}");
                }
            })?);
            senders.push((tx, wake.clone()));
            wakers.push(wake);
        }
        let acc_shared = shared.clone();
        threads.push(std::thread::Builder::new().name("nvmet-accept".into()).spawn(move || {
            accept_loop(listener, senders, acc_shared);
        })?);
        Ok(TargetServer { addr, subsys, shared, threads, wakers })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The subsystem served.
    pub fn subsystem(&self) -> &Arc<Subsystem> {
        &self.subsys
    }

    /// Whether a reactor or the acceptor has exited (on error).
    pub fn is_finished(&self) -> bool {
        self.threads.iter().any(|t| t.is_finished())
    }

    /// Counters so far (reactor CPU is filled in when reactors exit).
    pub fn stats(&self) -> TargetStats {
        let mut s = self.shared.stats.lock().map(|s| s.clone()).unwrap_or_default();
        s.connections = self.shared.connections.load(Ordering::Relaxed);
        s.subsystem = SubsystemCounters::of(&self.subsys);
        s
    }

    /// Serves until `stop` is set (a signal handler sets it), `time` has passed, or a
    /// thread of the target failed; then stops every thread and returns the final
    /// counters. A failed thread is an error.
    pub fn serve(self, stop: &AtomicBool, time: Option<Duration>) -> io::Result<TargetStats> {
        let start = std::time::Instant::now();
        loop {
            std::thread::sleep(Duration::from_millis(50));
            if self.is_finished() {
                return Err(io::Error::other("a target thread stopped unexpectedly (see the log above)"));
            }
            if stop.load(Ordering::Relaxed) || time.is_some_and(|t| start.elapsed() >= t) {
                return Ok(self.stop());
            }
        }
    }

    /// Stops every thread, closes every connection, and returns the counters.
    pub fn stop(mut self) -> TargetStats {
        self.shutdown();
        self.stats()
    }

    fn shutdown(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for w in &self.wakers {
            let _ = w.write(1);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for TargetServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn accept_loop(listener: TcpListener, reactors: Vec<(mpsc::Sender<TcpStream>, Arc<EventFd>)>, shared: Arc<Shared>) {
    let mut next = 0;
    while !shared.stop.load(Ordering::Acquire) {
        let mut fds = [nix::poll::PollFd::new(listener.as_fd(), nix::poll::PollFlags::POLLIN)];
        if nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(50u8)).unwrap_or(0) == 0 {
            continue;
        }
        match listener.accept() {
            Ok((sock, peer)) => {
                tracing::debug!(%peer, reactor = next, "connection");
                shared.connections.fetch_add(1, Ordering::Relaxed);
                let (tx, wake) = &reactors[next % reactors.len()];
                next += 1;
                if tx.send(sock).is_ok() {
                    let _ = wake.write(1);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => {
                tracing::warn!("accept: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

fn reason_name(r: Option<&CloseReason>) -> String {
    match r {
        None => "peer closed".into(),
        Some(CloseReason::Violation(v)) => format!("violation: {}", v.fes),
        Some(CloseReason::PeerTerminated { .. }) => "host termination request".into(),
        Some(CloseReason::InvalidTermReq) => "invalid termination request".into(),
        Some(CloseReason::Disconnected) => "disconnect".into(),
        Some(CloseReason::KeepAliveExpired) => "keep-alive expired".into(),
        Some(CloseReason::ControllerGone) => "controller gone".into(),
    }
}

impl Reactor {
    fn run(self) -> io::Result<()> {
        netlane::cpus::pin(Some(self.cpu));
        let cpu0 = thread_cpu();
        let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        ep.add(self.wake.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, WAKE_TOKEN))?;
        let mut conns: HashMap<u64, Conn> = HashMap::new();
        let mut next_token = 0u64;
        let mut events = vec![EpollEvent::empty(); 256];
        let mut touched: Vec<u64> = Vec::new();
        let mut last_timer = monotonic_ns();
        let (mut rounds, mut sends, mut commands) = (0u64, 0u64, 0u64);
        let mut closed: HashMap<String, u64> = HashMap::new();
        while !self.shared.stop.load(Ordering::Acquire) {
            let timeout = if self.spin { 0u16 } else { 50 };
            let n = match ep.wait(&mut events, nix::poll::PollTimeout::from(timeout)) {
                Ok(n) => n,
                Err(nix::errno::Errno::EINTR) => 0,
                Err(e) => return Err(e.into()),
            };
            rounds += 1;
            let now = monotonic_ns();
            touched.clear();
            for ev in &events[..n] {
                let token = ev.data();
                if token == WAKE_TOKEN {
                    let _ = self.wake.read();
                    while let Ok(sock) = self.rx.try_recv() {
                        match self.register(&ep, sock, next_token, now) {
                            Ok(c) => {
                                conns.insert(next_token, c);
                                touched.push(next_token);
                            }
                            Err(e) => tracing::warn!("cannot serve a connection: {e}"),
                        }
                        next_token += 1;
                    }
                    continue;
                }
                let Some(c) = conns.get_mut(&token) else { continue };
                touched.push(token);
                if ev.events().intersects(EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLHUP)
                    && c.pump_input(now, &mut sends).is_err()
                {
                    c.q.advance_output(usize::MAX);
                    c.interest = EpollFlags::empty();
                }
            }
            // Timers: keep-alive expiry, controllers that went away on other reactors.
            if now.saturating_sub(last_timer) > 20_000_000 {
                last_timer = now;
                for (&t, c) in conns.iter_mut() {
                    if c.q.poll(now) {
                        touched.push(t);
                    }
                }
            }
            // Send what the round produced; each connection's last send of the round
            // goes without MSG_MORE, so nothing stays corked.
            touched.sort_unstable();
            touched.dedup();
            for t in &touched {
                let Some(c) = conns.get_mut(t) else { continue };
                let ok = c.flush(Batch::Last, &mut sends).is_ok();
                let done =
                    !ok || c.interest.is_empty() || (c.q.close_reason().is_some() && c.q.pending_output().is_empty());
                if done {
                    if let Some(c) = conns.remove(t) {
                        let _ = ep.delete(c.sock.as_fd());
                        *closed.entry(reason_name(c.q.close_reason())).or_default() += 1;
                        commands += c.q.stats.commands;
                        let _ = c.sock.shutdown(std::net::Shutdown::Both);
                    }
                    continue;
                }
                let want = c.wanted_interest();
                if want != c.interest {
                    let mut ev = EpollEvent::new(want, *t);
                    if ep.modify(c.sock.as_fd(), &mut ev).is_ok() {
                        c.interest = want;
                    }
                }
            }
        }
        for (_, c) in conns.drain() {
            commands += c.q.stats.commands;
            *closed.entry("target stopped".into()).or_default() += 1;
        }
        if let Ok(mut s) = self.shared.stats.lock() {
            s.rounds += rounds;
            s.sends += sends;
            s.commands += commands;
            for (k, v) in closed {
                *s.closed.entry(k).or_default() += v;
            }
            let used = thread_cpu() - cpu0;
            s.reactor_cpu.user_s += used.user_s;
            s.reactor_cpu.system_s += used.system_s;
            s.reactor_cpu.voluntary_switches += used.voluntary_switches;
            s.reactor_cpu.involuntary_switches += used.involuntary_switches;
        }
        Ok(())
    }

    fn register(&self, ep: &Epoll, sock: TcpStream, token: u64, now: u64) -> io::Result<Conn> {
        sock.set_nonblocking(true)?;
        sock.set_nodelay(true)?;
        if let Some(us) = self.busy_poll
            && let Err(e) = netlane::sockopt::set_busy_poll(sock.as_fd(), us)
        {
            // Values above net.core.busy_read need CAP_NET_ADMIN; the reactor still
            // spins, only the in-kernel NAPI polling is lost.
            tracing::warn!("SO_BUSY_POLL {us} us refused ({e}); spinning without it");
        }
        let interest = EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP;
        ep.add(sock.as_fd(), EpollEvent::new(interest, token))?;
        Ok(Conn { sock, rx: RxBuf::new(256 << 10), q: TargetQueue::new(self.subsys.clone(), now), interest })
    }
}

impl Conn {
    /// Reads until the socket is drained (or the output backlog is large), running the
    /// state machine on every read. Err means the connection is finished (EOF or error).
    fn pump_input(&mut self, now: u64, sends: &mut u64) -> Result<(), ()> {
        // A fair share per round: a connection streaming megabytes of writes must not
        // starve the others of this reactor (head-of-line blocking across queues).
        let mut budget = READ_BUDGET;
        loop {
            if budget == 0 {
                return Ok(());
            }
            if self.q.close_reason().is_some() {
                return Ok(());
            }
            if self.q.pending_output().len() >= BACKLOG_LIMIT {
                return Ok(());
            }
            let need = self.q.needed(self.rx.data()).unwrap_or(0);
            match self.rx.read_from(&self.sock, need) {
                Ok(0) => return Err(()),
                Ok(n) => {
                    budget = budget.saturating_sub(n);
                    let used = self.q.handle_input(self.rx.data(), now);
                    self.rx.consume(used);
                    if self.q.pending_output().len() >= FLUSH_AT {
                        self.flush(Batch::More, sends).map_err(|_| ())?;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Err(()),
            }
        }
    }

    fn flush(&mut self, batch: Batch, sends: &mut u64) -> io::Result<()> {
        // MSG_MORE corks the socket until a send without it (or 200 ms). A mid-round
        // send keeps its last byte back, so the round's final send always has data to
        // carry and uncorks everything before it.
        let keep = usize::from(batch == Batch::More);
        while self.q.pending_output().len() > keep {
            let out = self.q.pending_output();
            let n = send(&self.sock, &out[..out.len() - keep], batch)?;
            *sends += 1;
            if n == 0 {
                break;
            }
            self.q.advance_output(n);
        }
        Ok(())
    }

    fn wanted_interest(&self) -> EpollFlags {
        let backlog = self.q.pending_output().len();
        let mut f = EpollFlags::EPOLLRDHUP;
        if backlog < BACKLOG_LIMIT && self.q.close_reason().is_none() {
            f |= EpollFlags::EPOLLIN;
        }
        if backlog > 0 {
            f |= EpollFlags::EPOLLOUT;
        }
        f
    }
}

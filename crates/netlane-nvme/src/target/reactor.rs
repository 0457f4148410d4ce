//! The reactors: one thread per CPU, an epoll loop over its connections, each a
//! [`TargetQueue`] fed from the socket and drained to it; storage that may block goes to
//! the pool and comes back through the reactor's wake-up eventfd.

use super::*;

/// A storage request for the pool, and where its result goes.
pub(super) struct PoolJob {
    pub(super) token: u64,
    pub(super) req: StorageRequest,
    pub(super) reply: mpsc::Sender<Done>,
    pub(super) wake: Arc<EventFd>,
}

/// A storage request's result, back at its reactor.
pub(super) struct Done {
    pub(super) token: u64,
    pub(super) tag: u32,
    pub(super) read: bool,
    pub(super) result: io::Result<Option<Vec<u8>>>,
}

/// A new connection for a reactor.
pub(super) struct NewConn {
    pub(super) sock: TcpStream,
    pub(super) peer: SocketAddr,
    pub(super) id: u64,
    /// Its place under the connection limit.
    pub(super) admitted: Admitted,
    /// Its place among its source's connections in setup.
    pub(super) setup: InSetup,
}

pub(super) struct Reactor {
    pub(super) cpu: usize,
    pub(super) rx: mpsc::Receiver<NewConn>,
    pub(super) done_rx: mpsc::Receiver<Done>,
    pub(super) done_tx: mpsc::Sender<Done>,
    pub(super) pool: mpsc::Sender<PoolJob>,
    pub(super) wake: Arc<EventFd>,
    pub(super) subsys: Arc<Subsystem>,
    pub(super) shared: Arc<Shared>,
    pub(super) busy_poll: Option<u32>,
    pub(super) spin: bool,
}

struct Conn {
    sock: TcpStream,
    peer: SocketAddr,
    rx: RxBuf,
    q: TargetQueue,
    interest: EpollFlags,
    /// Storage requests out on the pool.
    offloaded: u32,
    /// Counted among its source's connections in setup until it has a controller.
    setup: Option<InSetup>,
    /// Its place under the connection limit, freed with the connection.
    _admitted: Admitted,
}

/// Output backlog above which a connection stops being read until it drains.
const BACKLOG_LIMIT: usize = 8 << 20;
/// Output size at which a round sends early (with `MSG_MORE`) rather than buffer more.
const FLUSH_AT: usize = 256 << 10;
const WAKE_TOKEN: u64 = u64::MAX;
/// The stop signal's token in a reactor's epoll set.
const STOP_TOKEN: u64 = u64::MAX - 1;
/// Bytes read from one connection per reactor round before moving on to the next.
const READ_BUDGET: usize = 256 << 10;
/// How often reactors publish their queues' counters for the metrics.
const PUBLISH_EVERY_NS: u64 = 500_000_000;
pub(super) fn storage_worker(rx: &Mutex<mpsc::Receiver<PoolJob>>, subsys: &Subsystem) {
    loop {
        let job = match rx.lock() {
            Ok(g) => match g.recv() {
                Ok(j) => j,
                Err(_) => return,
            },
            Err(_) => return,
        };
        let read = job.req.is_read();
        let result = match job.req.op {
            StorageOp::Read { len, .. } => {
                let mut buf = vec![0u8; len as usize];
                subsys.read_part(&job.req, 0, &mut buf).map(|()| Some(buf))
            }
            _ => subsys.perform(&job.req).map(|()| None),
        };
        if job.reply.send(Done { token: job.token, tag: job.req.tag, read, result }).is_ok() {
            let _ = job.wake.write(1);
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
        Some(CloseReason::SetupTimeout) => "setup timeout".into(),
    }
}

/// What a reactor counts, folded into the shared stats when it exits.
#[derive(Default)]
struct Tally {
    rounds: u64,
    sends: u64,
    inline: u64,
    offloaded: u64,
    closed: HashMap<String, u64>,
}

impl Reactor {
    pub(super) fn run(self) -> io::Result<()> {
        netlane::cpus::pin(Some(self.cpu));
        let cpu0 = thread_cpu();
        let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        ep.add(self.wake.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, WAKE_TOKEN))?;
        ep.add(self.shared.stop.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, STOP_TOKEN))?;
        let mut conns: HashMap<u64, Conn> = HashMap::new();
        let mut events = vec![EpollEvent::empty(); 256];
        let mut touched: Vec<u64> = Vec::new();
        let mut last_timer = monotonic_ns();
        let mut last_publish = last_timer;
        let mut t = Tally::default();
        let mut violation_log = RateLimit::new(LOG_EVERY);
        while !self.shared.stop.is_stopped() {
            let timeout = if self.spin { 0u16 } else { 50 };
            let n = match ep.wait(&mut events, nix::poll::PollTimeout::from(timeout)) {
                Ok(n) => n,
                Err(nix::errno::Errno::EINTR) => 0,
                Err(e) => return Err(e.into()),
            };
            t.rounds += 1;
            let now = monotonic_ns();
            touched.clear();
            for ev in &events[..n] {
                let token = ev.data();
                if token == WAKE_TOKEN {
                    let _ = self.wake.read();
                    while let Ok(nc) = self.rx.try_recv() {
                        let id = nc.id;
                        match self.register(&ep, nc, now) {
                            Ok(c) => {
                                conns.insert(id, c);
                                touched.push(id);
                            }
                            Err(e) => tracing::warn!("cannot serve a connection: {e}"),
                        }
                    }
                    while let Ok(d) = self.done_rx.try_recv() {
                        let token = d.token;
                        if let Some(c) = conns.get_mut(&token) {
                            c.offloaded -= 1;
                            c.finish(d, monotonic_ns());
                            touched.push(token);
                        }
                    }
                    continue;
                }
                let Some(c) = conns.get_mut(&token) else { continue };
                touched.push(token);
                if ev.events().intersects(EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLHUP)
                    && c.pump_input(now, &self, token, &mut t).is_err()
                {
                    c.q.handle_written(usize::MAX);
                    c.interest = EpollFlags::empty();
                }
            }
            // Timers: setup deadlines, keep-alive expiry, controllers that went away on
            // other reactors.
            if now.saturating_sub(last_timer) > 20_000_000 {
                last_timer = now;
                for (&id, c) in conns.iter_mut() {
                    if c.q.poll(now) {
                        touched.push(id);
                    }
                }
            }
            // Run what can run, send what the round produced; each connection's last
            // send of the round goes without MSG_MORE, so nothing stays corked.
            touched.sort_unstable();
            touched.dedup();
            for &id in &touched {
                let Some(c) = conns.get_mut(&id) else { continue };
                let ok = c.service(&self, id, &mut t).is_ok();
                if c.setup.is_some() && c.q.cntlid().is_some() {
                    c.setup = None;
                }
                let done =
                    !ok || c.interest.is_empty() || (c.q.close_reason().is_some() && c.q.poll_output().is_empty());
                if done {
                    if let Some(c) = conns.remove(&id) {
                        let _ = ep.delete(c.sock.as_fd());
                        self.closed(id, c, &mut t, &mut violation_log);
                    }
                    continue;
                }
                let want = c.wanted_interest();
                if want != c.interest {
                    let mut ev = EpollEvent::new(want, id);
                    if ep.modify(c.sock.as_fd(), &mut ev).is_ok() {
                        c.interest = want;
                    }
                }
            }
            if now.saturating_sub(last_publish) > PUBLISH_EVERY_NS {
                last_publish = now;
                self.publish(&conns);
            }
        }
        for (id, c) in conns.drain() {
            self.fold(id, &c);
            *t.closed.entry("target stopped".into()).or_default() += 1;
        }
        if let Ok(mut s) = self.shared.stats.lock() {
            s.rounds += t.rounds;
            s.sends += t.sends;
            s.storage_inline += t.inline;
            s.storage_offloaded += t.offloaded;
            for (k, v) in t.closed {
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

    /// A connection ends: counted, logged (violations rate-limited, at warn), its
    /// counters folded into the closed-queue sum.
    fn closed(&self, id: u64, c: Conn, t: &mut Tally, violation_log: &mut RateLimit) {
        let reason = reason_name(c.q.close_reason());
        *t.closed.entry(reason.clone()).or_default() += 1;
        let (peer, cntlid, qid, commands) = (c.peer, c.q.cntlid(), c.q.qid(), c.q.stats.commands);
        match c.q.close_reason() {
            Some(CloseReason::Violation(v)) => {
                if let Some(n) = violation_log.allow(Instant::now()) {
                    tracing::warn!(%peer, conn = id, ?cntlid, also_terminated = n, "protocol violation: {}", v.reason);
                }
            }
            Some(CloseReason::SetupTimeout) => {
                if let Some(n) = violation_log.allow(Instant::now()) {
                    tracing::warn!(%peer, conn = id, also_closed = n, "closed: no ICReq and Connect within the setup timeout");
                }
            }
            _ => tracing::info!(%peer, conn = id, ?cntlid, ?qid, commands, %reason, "connection closed"),
        }
        self.fold(id, &c);
        let _ = c.sock.shutdown(std::net::Shutdown::Both);
    }

    /// Moves a closed queue's counters from the live set to the closed sum.
    fn fold(&self, id: u64, c: &Conn) {
        if let Ok(mut q) = self.shared.queues.lock() {
            q.live.remove(&id);
            merge_queue_stats(&mut q.closed, &c.q.stats);
        }
    }

    /// Publishes this reactor's live queues' counters.
    fn publish(&self, conns: &HashMap<u64, Conn>) {
        if let Ok(mut q) = self.shared.queues.lock() {
            for (&id, c) in conns {
                q.live.insert(
                    id,
                    QueueMetrics { peer: c.peer, cntlid: c.q.cntlid(), qid: c.q.qid(), stats: c.q.stats.clone() },
                );
            }
        }
    }

    fn register(&self, ep: &Epoll, nc: NewConn, now: u64) -> io::Result<Conn> {
        let NewConn { sock, peer, id, admitted, setup } = nc;
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
        ep.add(sock.as_fd(), EpollEvent::new(interest, id))?;
        let mut q = TargetQueue::new(self.subsys.clone(), now);
        if let Ok(local) = sock.local_addr() {
            q.set_local_addr(local);
        }
        Ok(Conn {
            sock,
            peer,
            rx: RxBuf::new(16 << 10),
            q,
            interest,
            offloaded: 0,
            setup: Some(setup),
            _admitted: admitted,
        })
    }
}

impl Conn {
    /// Reads until the socket is drained (or the output backlog is large), running the
    /// state machine and its storage requests on every read. Err means the connection
    /// is finished (EOF or error).
    fn pump_input(&mut self, now: u64, r: &Reactor, id: u64, t: &mut Tally) -> Result<(), ()> {
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
            if self.q.poll_output().len() >= BACKLOG_LIMIT {
                return Ok(());
            }
            let need = self.q.needed(self.rx.data()).unwrap_or(0);
            match self.rx.read_from(&self.sock, need) {
                Ok(0) => return Err(()),
                Ok(n) => {
                    budget = budget.saturating_sub(n);
                    let used = self.q.handle_input(self.rx.data(), now);
                    self.rx.consume(used);
                    self.dispatch(r, id, t);
                    if self.q.poll_output().len() >= FLUSH_AT {
                        self.flush(Batch::More, &mut t.sends).map_err(|_| ())?;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Err(()),
            }
        }
    }

    /// Starts the storage requests that may start: on the reactor for namespaces that
    /// do not block, on the pool otherwise.
    fn dispatch(&mut self, r: &Reactor, id: u64, t: &mut Tally) {
        let mut now = None;
        while let Some(req) = self.q.poll_storage() {
            if r.subsys.blocks(&req) {
                t.offloaded += 1;
                let job = PoolJob { token: id, req, reply: r.done_tx.clone(), wake: r.wake.clone() };
                match r.pool.send(job) {
                    Ok(()) => self.offloaded += 1,
                    // The pool is gone (stopping): run it here.
                    Err(mpsc::SendError(job)) => self.q.run_here(job.req, monotonic_ns()),
                }
            } else {
                t.inline += 1;
                let at = *now.get_or_insert_with(monotonic_ns);
                self.q.run_here(req, at);
            }
        }
    }

    /// Applies a storage result from the pool.
    fn finish(&mut self, d: Done, now: u64) {
        match d.result {
            Ok(Some(buf)) => self.q.complete_read(d.tag, now, |off, dst| {
                dst.copy_from_slice(&buf[off..off + dst.len()]);
                Ok(())
            }),
            Ok(None) => self.q.complete(d.tag, Ok(()), now),
            Err(e) if d.read => self.q.complete_read(d.tag, now, |_, _| Err(io::Error::new(e.kind(), e.to_string()))),
            Err(e) => self.q.complete(d.tag, Err(e), now),
        }
    }

    /// Sends the output, starting more storage work as sending makes room, until the
    /// socket is full or nothing is left.
    fn service(&mut self, r: &Reactor, id: u64, t: &mut Tally) -> io::Result<()> {
        loop {
            self.dispatch(r, id, t);
            let before = self.q.poll_output().len();
            self.flush(Batch::Last, &mut t.sends)?;
            let after = self.q.poll_output().len();
            // Stop when the socket took nothing, or when nothing waits for the room.
            if after == before || after > 0 || !self.q.storage_pending() {
                return Ok(());
            }
        }
    }

    fn flush(&mut self, batch: Batch, sends: &mut u64) -> io::Result<()> {
        // MSG_MORE corks the socket until a send without it (or 200 ms). A mid-round
        // send keeps its last byte back, so the round's final send always has data to
        // carry and uncorks everything before it.
        let keep = usize::from(batch == Batch::More);
        while self.q.poll_output().len() > keep {
            let out = self.q.poll_output();
            let n = send(&self.sock, &out[..out.len() - keep], batch)?;
            *sends += 1;
            if n == 0 {
                break;
            }
            self.q.handle_written(n);
        }
        Ok(())
    }

    fn wanted_interest(&self) -> EpollFlags {
        let backlog = self.q.poll_output().len();
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

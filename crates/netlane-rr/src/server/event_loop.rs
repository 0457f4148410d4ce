//! One server thread on one socket: the receive path, the transmit paths and epoll set
//! up; the loop that sleeps in `epoll_wait`, drains what the path has and answers it;
//! and the counters when it stops.

use std::os::fd::BorrowedFd;

use super::*;

/// Epoll tokens: a descriptor frames arrive on, the service socket beside AF_XDP, and
/// the route and neighbour notifications of a frame transmit path.
const FRAMES: u64 = 0;
const STACK: u64 = 1;
const ROUTES: u64 = 2;
const PACE: u64 = 3;
const STOP: u64 = 4;

/// Receive calls per wake-up and path, at most: a call takes a batch (a block of a
/// TPACKET_V3 ring), so a wake-up answers thousands of requests before the loop looks
/// at its stop and its other descriptors again.
const DRAIN_CALLS: u32 = 64;

/// Receive calls of the last drain after a stop: a thousand batches or blocks already
/// received are answered, and requests that keep coming cannot keep it from ending.
const FINAL_DRAIN_CALLS: u32 = 1024;

/// How often a server thread adds what it counted to the live counters.
pub(super) const LIVE_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// The sockets busy polling concerns, named: each AF_XDP socket by its queue, a ring,
/// the service socket (also beside AF_XDP, which hands it what it does not take).
fn polled<'a>(cfg: &ServerConfig, path: &'a RxPath, sock: &'a UdpSocket) -> Vec<(String, BorrowedFd<'a>)> {
    let mut v: Vec<(String, BorrowedFd<'a>)> = path
        .fds(sock)
        .into_iter()
        .enumerate()
        .map(|(i, fd)| match cfg.path {
            PathKind::AfXdp => (format!("queue {i}"), fd),
            PathKind::Recvfrom | PathKind::Recvmmsg => ("service socket".to_string(), fd),
            _ => (format!("ring {i}"), fd),
        })
        .collect();
    if path.reads_stack_too() {
        v.push(("service socket".to_string(), sock.as_fd()));
    }
    v
}

/// Serves on `sock` on the calling thread (pinned to `cfg.cpu`).
pub(super) fn serve_on(
    cfg: &ServerConfig,
    sock: UdpSocket,
    keys: &std::collections::hash_map::RandomState,
    stop: &Stop,
    live: &SharedRrCounters,
    on_ready: impl FnOnce(SocketAddr),
) -> Result<ServerStats, ServerError> {
    netlane::cpus::pin(cfg.cpu);
    let local = sock.local_addr().map_err(io_err("local address"))?;
    let mut server = Serving::set_up(cfg, &sock, local, stop)?;
    on_ready(local);

    let started = Instant::now();
    let cpu0 = thread_cpu();
    let mut guard = Guard::new(cfg.guard, keys.clone());
    let told = server.run(stop, started, &mut guard, live)?;
    let stats = server.finish(started, cpu0);
    // What only the end counts (ring drops and freezes, paced responses never sent).
    live.add(&stats.counters.minus(&told));
    Ok(stats)
}

/// A server thread's parts, set up. The fields drop in the order they are declared,
/// the order the transmit paths and the receive path always went in: a frame transmit
/// path before the receive path whose AF_XDP socket lent it its ring.
struct Serving<'a> {
    cfg: &'a ServerConfig,
    /// Busy polling as applied, and the namespace's busy-poll count when it began.
    busy: Option<(BusyPollReport, Option<u64>)>,
    sock: &'a UdpSocket,
    st: ServerStats,
    out: Vec<u8>,
    tx: Tx<'a>,
    paced: Option<Paced>,
    ep: Epoll,
    raw: Option<RawTx>,
    path: RxPath,
}

impl<'a> Serving<'a> {
    /// Sets up the receive path, the transmit paths, pacing and epoll.
    fn set_up(
        cfg: &'a ServerConfig,
        sock: &'a UdpSocket,
        local: SocketAddr,
        stop: &Stop,
    ) -> Result<Serving<'a>, ServerError> {
        let (ifindex, iface) = if cfg.path.is_frames() { interface(cfg)? } else { (0, None) };
        let name = iface.clone().unwrap_or_default();
        let mut path = RxPath::new(cfg.path, sock, cfg.batch, &cfg.ring, &cfg.xdp_options(), (ifindex, &name))
            .map_err(io_err(format!("set up the {} path", cfg.path)))?;
        let raw = raw_tx(cfg, local, &mut path)?;
        let _ = path.take_ring_stats();
        let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(|e| io_err("epoll")(e.into()))?;
        watch(&ep, stop.as_fd(), STOP)?;
        for fd in path.fds(sock) {
            watch(&ep, fd, FRAMES)?;
        }
        if path.reads_stack_too() {
            watch(&ep, sock.as_fd(), STACK)?;
        }
        if let Some(r) = &raw {
            watch(&ep, r.events_fd(), ROUTES)?;
        }
        let busy = cfg.busy_poll.map(|bp| {
            let mut knobs = vec![netlane::lanes::busy::apply_epoll(ep.0.as_fd(), &bp)];
            for (what, fd) in polled(cfg, &path, sock) {
                knobs.extend(netlane::lanes::busy::apply_socket_knobs(fd, &bp, &what));
            }
            let report = BusyPollReport { policy: bp.to_string(), knobs, ..BusyPollReport::default() };

            (report, netlane::lanes::busy::busy_poll_rx_packets())
        });
        let paced = cfg.pace.map(Paced::new).transpose().map_err(io_err("set up pacing"))?;
        if let Some(p) = &paced {
            watch(&ep, p.timer_fd(), PACE)?;
        }
        let st = ServerStats {
            path: cfg.path.to_string(),
            listen: local.to_string(),
            iface,
            tx: cfg.tx.to_string(),
            ..ServerStats::default()
        };
        let out = vec![0u8; cfg.responder.max_reply_bytes()];
        Ok(Serving { cfg, busy, sock, st, out, tx: Tx::new(sock), paced, ep, raw, path })
    }

    /// The loop: sleeps in `epoll_wait` and answers what each wake-up finds, until
    /// `stop` is given or the configured duration has passed since `started`.
    fn run(
        &mut self,
        stop: &Stop,
        started: Instant,
        guard: &mut Guard,
        live: &SharedRrCounters,
    ) -> Result<RrCounters, ServerError> {
        // One slot per token.
        let mut events = [EpollEvent::empty(); 5];
        let mut told = (RrCounters::default(), Instant::now());
        while !stop.is_stopped() && self.cfg.duration.is_none_or(|d| started.elapsed() < d) {
            self.st.counters.polls += 1;
            if told.1.elapsed() >= LIVE_EVERY {
                let now = self.live_view();
                live.add(&now.minus(&told.0));
                told = (now, Instant::now());
            }
            // Frames a full device queue or send buffer left behind are kicked again soon,
            // whether or not a request comes.
            let wait_ms: u16 = if self.raw.as_ref().is_some_and(RawTx::pending) { 1 } else { 100 };
            let n = match self.ep.wait(&mut events, EpollTimeout::from(wait_ms)) {
                Ok(n) => n,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(io_err("epoll_wait")(e.into())),
            };
            if n == 0 {
                flush(&mut self.raw, &mut self.st);
                self.path.tick();
                continue;
            }
            if events[..n].iter().any(|e| e.data() == STOP) {
                continue;
            }
            let only_timer = events[..n].iter().all(|e| e.data() == PACE);
            if !only_timer {
                self.st.counters.wakeups += 1;
            }
            let frames_ready = events[..n].iter().any(|e| e.data() == FRAMES);
            let stack_ready = events[..n].iter().any(|e| e.data() == STACK);
            if let Some(r) = self.raw.as_mut().filter(|_| events[..n].iter().any(|e| e.data() == ROUTES)) {
                r.process_events();
            }
            if frames_ready {
                self.drain_path(guard, DRAIN_CALLS);
            }
            if stack_ready {
                self.drain_stack(guard);
            }
            // Paced responses: what the schedule allows now; the timer wakes us for the rest.
            if let Some(p) = &mut self.paced
                && let Err(e) = p.release(self.sock)
            {
                tracing::debug!(error = %e, "paced send failed");
                self.st.counters.send_errors += 1;
            }
        }
        // Requests a ring or the AF_XDP socket already holds when the stop comes are
        // answered and counted, not left behind: a client's late retry would otherwise
        // be redirected to the socket but never read.
        if self.cfg.path.is_frames() {
            self.drain_path(guard, FINAL_DRAIN_CALLS);
        }
        let now = self.live_view();
        live.add(&now.minus(&told.0));
        Ok(now)
    }

    /// Answers what the receive path has, in at most `calls` receive calls.
    fn drain_path(&mut self, guard: &mut Guard, calls: u32) {
        // Drain: the path returns what it has; stop when it says it is empty, or when
        // the budget is spent (requests arriving as fast as they are answered would keep
        // the path from ever being empty; readiness is level-triggered, so what is left
        // wakes the next turn at once).
        let mut more = true;
        for _ in 0..calls {
            if !more {
                break;
            }
            let mut got = 0;
            let r = self.path.recv(self.sock, &mut |data, from| {
                got += 1;
                answer(
                    self.cfg,
                    (&mut self.tx, &mut self.raw, &mut self.paced),
                    guard,
                    &mut self.out,
                    &mut self.st,
                    data,
                    from,
                );
            });
            flush(&mut self.raw, &mut self.st);
            if !self.cfg.path.is_frames() {
                self.st.counters.recv_syscalls += 1;
            }
            more = match r {
                Ok(_) if got > 0 => {
                    self.st.counters.frames += got;
                    true
                }
                Ok(_) => false,
                Err(e) => recv_error(e, &mut self.st),
            };
        }
    }

    /// AF_XDP: answers the requests the program passed to the stack, read only when the
    /// socket has some (no extra system call per wake-up otherwise).
    fn drain_stack(&mut self, guard: &mut Guard) {
        let mut more = true;
        for _ in 0..DRAIN_CALLS {
            if !more {
                break;
            }
            self.st.counters.recv_syscalls += 1;
            let r = self.path.recv_stack(self.sock, &mut |data, from| {
                answer(
                    self.cfg,
                    (&mut self.tx, &mut self.raw, &mut self.paced),
                    guard,
                    &mut self.out,
                    &mut self.st,
                    data,
                    from,
                )
            });
            flush(&mut self.raw, &mut self.st);
            more = match r {
                Ok(got) => {
                    self.st.counters.frames += got as u64;
                    true
                }
                Err(e) => recv_error(e, &mut self.st),
            };
        }
    }

    /// The counters as they stand while the loop runs: its own, and what the transmit
    /// paths, the pacer and the receive path have counted so far (not the ring's drops
    /// and freezes: reading those from the kernel resets them, so they come at the end).
    fn live_view(&self) -> RrCounters {
        let mut c = self.st.counters;
        c.send_syscalls = self.tx.syscalls;
        c.gso_sends = self.tx.gso_sends;
        put_skips(&mut c, self.path.skips());
        if let Some(p) = &self.paced {
            let report = p.report();
            c.datagrams_sent += report.sent;
            c.bytes_sent += p.bytes_sent();
            c.send_syscalls += report.sendmmsg_calls;
            c.send_errors += report.send_errors;
        }
        if let Some(r) = &self.raw {
            c.send_syscalls += r.report().kicks;
        }
        c
    }

    /// The counters once the loop has ended: paced responses still queued go out first,
    /// then the time, the CPU and what each path counted.
    fn finish(mut self, started: Instant, cpu0: CpuTime) -> ServerStats {
        if let Some(p) = &mut self.paced {
            let unsent = p.finish(self.sock);
            self.st.counters.send_dropped += unsent as u64;
        }
        let mut st = self.st;
        let seconds = started.elapsed().as_secs_f64();
        st.seconds = seconds;
        st.cpu_s = thread_cpu().total_s() - cpu0.total_s();
        st.busy = if seconds > 0.0 { (st.cpu_s / seconds).min(1.0) } else { 0.0 };
        st.counters.send_syscalls = self.tx.syscalls;
        st.counters.gso_sends = self.tx.gso_sends;
        rx_counters(&self.path, &mut st);
        if let Some(p) = &self.paced {
            let report = p.report();
            st.counters.datagrams_sent += report.sent;
            st.counters.bytes_sent += p.bytes_sent();
            st.counters.send_syscalls += report.sendmmsg_calls;
            st.counters.send_errors += report.send_errors;
            st.paced = Some(report);
        }
        if let Some(r) = &self.raw {
            let report = r.report();
            st.counters.send_syscalls += report.kicks;
            st.raw_tx = Some(report);
        }
        if let Some((mut report, before)) = self.busy.take() {
            report.rx_packets =
                before.zip(netlane::lanes::busy::busy_poll_rx_packets()).map(|(b, a)| a.saturating_sub(b));
            report.napi_ids = polled(self.cfg, &self.path, self.sock)
                .into_iter()
                .map(|(what, fd)| (what, netlane::sockopt::incoming_napi_id(fd).ok()))
                .collect();
            st.busy_poll = Some(report);
        }
        st.derive_ratios();
        st
    }
}

/// The frame transmit path `cfg.tx` asks for (None: responses through the socket).
fn raw_tx(cfg: &ServerConfig, local: SocketAddr, path: &mut RxPath) -> Result<Option<RawTx>, ServerError> {
    Ok(match cfg.tx {
        TxKind::Socket => None,
        TxKind::Packet => {
            Some(RawTx::packet(local, cfg.tx_checksum_offload).map_err(io_err("set up the packet transmit path"))?)
        }
        TxKind::AfXdp => {
            let RxPath::Xdp(x) = path else { unreachable!("validated: tx af-xdp needs path af-xdp") };
            let ifindex = x.ifindex();
            let tx = x.take_tx().ok_or_else(|| io_err("AF_XDP transmit ring")(io::Error::other("none was set up")))?;
            Some(RawTx::xdp(local, tx, ifindex).map_err(io_err("set up the AF_XDP transmit path"))?)
        }
    })
}

/// Wakes the loop with `token` when `fd` is readable.
fn watch(ep: &Epoll, fd: impl AsFd, token: u64) -> Result<(), ServerError> {
    ep.add(fd, EpollEvent::new(EpollFlags::EPOLLIN, token)).map_err(|e| io_err("epoll add")(e.into()))
}

/// What a ring or AF_XDP path skipped, and what its reassembler did, into `c`.
fn put_skips(c: &mut RrCounters, s: RingSkips) {
    c.ring_fragments = s.fragments;
    c.ring_skipped = s.other;
    c.ring_bad_checksums = s.bad_checksums;
    c.ring_reassembled = s.reasm.reassembled;
    c.ring_reasm_given_up = s.reasm.timed_out + s.reasm.too_far;
    c.ring_reasm_over_memory = s.reasm.over_memory;
    c.ring_reasm_refused = s.reasm.overlaps + s.reasm.malformed + s.reasm.duplicates;
}

/// What the receive path counted: skipped frames, ring drops and freezes, the adaptive
/// rings' switches, the AF_XDP sockets and program.
fn rx_counters(path: &RxPath, st: &mut ServerStats) {
    let ring = path.take_ring_stats();
    put_skips(&mut st.counters, path.skips());
    st.counters.ring_drops = ring.drops;
    st.counters.ring_freezes = ring.freezes;
    if let RxPath::Adaptive(a) = path {
        st.adaptive_switches = Some(a.switches());
        st.adaptive_block = Some(a.active_block());
        st.adaptive_ring_frames = Some(a.ring_frames());
    }
    if let RxPath::Xdp(x) = path {
        let xs = x.stats();
        let (redirected, passed) = x.counts();
        st.counters.ring_drops = xs.rx_dropped + xs.rx_ring_full;
        st.xdp = Some(XdpReport {
            mode: x.xdp_mode().into(),
            native_refused: x.native_refused.clone(),
            zero_copy: x.zero_copy(),
            zero_copy_refused: x.zero_copy_refused.clone(),
            queues: x.queues(),
            frames_per_queue: x.frames_per_queue().to_vec(),
            redirected,
            passed,
            via_stack: x.via_stack,
            fill_ring_empty: xs.rx_fill_ring_empty,
            invalid_descs: xs.rx_invalid_descs,
        });
    }
}

//! The acceptor: takes connections on every listener, refuses those over the limits
//! (all connections, connections in setup per source), deals the rest to the reactors
//! (in turn, or with lanes to the reactor owning their receive queue), and backs off
//! when accepting fails.

use netlane::lanes::LaneMap;

use super::*;

/// The reactors as lanes: which owns which of the lane device's NAPI instances.
pub(super) struct Lanes {
    map: LaneMap,
    report: TargetLanes,
}

impl Lanes {
    /// The lane device's receive queues dealt to the reactors (one per CPU of `cpus`).
    pub(super) fn new(dev: &str, cpus: &[usize]) -> io::Result<Lanes> {
        let q = netlane::lanes::queues::lane_device(dev)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, netlane::error::chain(&e).to_string()))?;
        let mut map = LaneMap::new(cpus.len()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        map.learn(&q.napi_ids());
        let mut report = TargetLanes { device: dev.to_string(), ..TargetLanes::default() };
        report.reactors = cpus.iter().map(|&cpu| ReactorLane { cpu, ..ReactorLane::default() }).collect();
        let mut lanes = Lanes { map, report };
        lanes.refresh();
        Ok(lanes)
    }

    /// The reactor for a connection that arrived through `napi_id`; `None` for no NAPI
    /// instance (the caller deals it in turn).
    fn place(&mut self, napi_id: u32) -> Option<usize> {
        let p = self.map.place(napi_id);
        match p.why {
            netlane::lanes::Why::Owner => self.report.by_owner += 1,
            netlane::lanes::Why::NewId => self.report.new_ids += 1,
            netlane::lanes::Why::NoNapi => {
                self.report.no_napi += 1;
                return None;
            }
        }
        Some(p.lane)
    }

    fn refresh(&mut self) {
        for (lane, share) in self.map.lanes() {
            if let Some(r) = self.report.reactors.get_mut(lane) {
                r.napi_ids = share.napi_ids.iter().copied().collect();
            }
        }
    }
}

pub(super) fn accept_loop(
    listeners: Vec<TcpListener>,
    reactors: Vec<(mpsc::Sender<NewConn>, Arc<EventFd>)>,
    shared: Arc<Shared>,
    subsys: &Subsystem,
    (max, per_source): (u64, usize),
    mut lanes: Option<Lanes>,
) {
    if let Some(l) = &lanes {
        publish(&shared, l);
    }
    let (mut next, mut conn_id) = (0usize, 0u64);
    let mut backoff = AcceptBackoff::new();
    let mut refused_log = RateLimit::new(LOG_EVERY);
    let (mut storage_reported, mut storage_at) = (0u64, Instant::now());
    while !shared.stop.is_stopped() {
        // Storage failures (a full disk fails every write on every queue) are summarised
        // here once per interval, not logged one line per command.
        if storage_at.elapsed() >= LOG_EVERY {
            storage_at = Instant::now();
            let failed = subsys.stats.counts.storage_failures.load(Ordering::Relaxed);
            if failed > storage_reported {
                let last = subsys.stats.last_storage_failure.lock().map(|l| l.clone()).unwrap_or_default();
                tracing::warn!(
                    failed = failed - storage_reported,
                    total = failed,
                    "storage operations failed; the last: {last}"
                );
                storage_reported = failed;
            }
        }
        if !backoff.poll_wait().is_zero() && shared.stop.wait(backoff.poll_wait()) {
            break;
        }
        // The stop signal last, beside the listeners: a stop wakes this wait at once.
        let mut fds: Vec<_> = listeners
            .iter()
            .map(|l| l.as_fd())
            .chain([shared.stop.as_fd()])
            .map(|fd| nix::poll::PollFd::new(fd, nix::poll::PollFlags::POLLIN))
            .collect();
        if nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(50u8)).unwrap_or(0) == 0 {
            continue;
        }
        let ready: Vec<bool> = fds[..listeners.len()].iter().map(|f| f.any().unwrap_or(false)).collect();
        for (l, _) in listeners.iter().zip(ready).filter(|(_, r)| *r) {
            match l.accept() {
                Ok((sock, peer)) => {
                    backoff.handle_accepted();
                    let id = conn_id;
                    conn_id += 1;
                    let Some(admitted) = shared.limit.admit() else {
                        if let Some(n) = refused_log.allow(Instant::now()) {
                            tracing::warn!(%peer, limit = max, also_refused = n, "connection limit reached: closing a new connection");
                        }
                        drop(sock);
                        continue;
                    };
                    let Some(setup) = shared.enter_setup(peer.ip(), per_source) else {
                        shared.refused_in_setup.fetch_add(1, Ordering::Relaxed);
                        if let Some(n) = refused_log.allow(Instant::now()) {
                            tracing::warn!(%peer, limit = per_source, also_refused = n, "too many connections in setup from this source: closing a new one");
                        }
                        drop(sock);
                        continue;
                    };
                    tracing::info!(%peer, local = ?sock.local_addr().ok(), conn = id, "connection opened");
                    let napi_id = netlane::sockopt::incoming_napi_id(sock.as_fd()).unwrap_or(0);
                    let owner = lanes.as_mut().and_then(|l| l.place(napi_id));
                    let at = owner.unwrap_or_else(|| {
                        next += 1;
                        (next - 1) % reactors.len()
                    });
                    if let Some(l) = lanes.as_mut() {
                        l.refresh();
                        l.report.reactors[at].connections += 1;
                        publish(&shared, l);
                    }
                    let (tx, wake) = &reactors[at];
                    // A reactor that is gone drops the connection with its places.
                    if tx.send(NewConn { sock, peer, id, admitted, setup }).is_ok() {
                        let _ = wake.write(1);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // Out of descriptors or memory: wait for connections to close rather
                    // than spin on a listener that stays readable.
                    shared.limit.handle_accept_error();
                    backoff.handle_error(&e, Instant::now());
                }
            }
        }
    }
}

/// The lanes' placements into the target's counters.
fn publish(shared: &Shared, lanes: &Lanes) {
    if let Ok(mut st) = shared.stats.lock() {
        st.lanes = Some(lanes.report.clone());
    }
}

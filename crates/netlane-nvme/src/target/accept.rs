//! The acceptor: takes connections on every listener, refuses those over the limits
//! (all connections, connections in setup per source), deals the rest to the reactors
//! in turn, and backs off when accepting fails.

use super::*;

pub(super) fn accept_loop(
    listeners: Vec<TcpListener>,
    reactors: Vec<(mpsc::Sender<NewConn>, Arc<EventFd>)>,
    shared: Arc<Shared>,
    subsys: &Subsystem,
    (max, per_source): (u64, usize),
) {
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
                    let (tx, wake) = &reactors[next % reactors.len()];
                    next += 1;
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

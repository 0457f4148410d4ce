//! The server on a thread of its own: started, then stopped (or supervised) for its
//! final counters, as every netlane server is.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use netlane::serve::{Ended, Running, Stop};

use super::{RrCounters, ServerConfig, ServerError, ServerStats, SharedRrCounters, io_err, serve_counted};

/// A running server (every lane of it). Stop it with [`Running::stop`], or watch it
/// with [`netlane::serve::supervise`].
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    stop: Stop,
    served: Arc<AtomicBool>,
    live: Arc<SharedRrCounters>,
    thread: JoinHandle<Result<ServerStats, ServerError>>,
}

impl Server {
    /// Starts serving `cfg`: returns once its path is ready to receive, or with what
    /// kept it from starting.
    pub fn start(cfg: ServerConfig) -> Result<Server, ServerError> {
        let stop = Stop::new().map_err(io_err("create the stop signal"))?;
        // Set only when `serve` returned its counters: a panic leaves it unset too.
        let served = Arc::new(AtomicBool::new(false));
        let (ready, addr) = std::sync::mpsc::channel();
        let (s, done) = (stop.clone(), served.clone());
        let live = Arc::new(SharedRrCounters::default());
        let counting = live.clone();
        let thread = std::thread::Builder::new()
            .name("rr-server".into())
            .spawn(move || {
                let r = serve_counted(&cfg, &s, &counting, |a| {
                    let _ = ready.send(a);
                });
                done.store(r.is_ok(), Ordering::Release);
                r
            })
            .map_err(io_err("start the server thread"))?;
        match addr.recv() {
            Ok(addr) => Ok(Server { addr, stop, served, live, thread }),
            // The thread ended before it was ready: its error says why.
            Err(_) => Err(join(thread).err().unwrap_or(ServerError::Thread("ended before it was ready"))),
        }
    }

    /// The address it serves.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// What every lane has counted so far (up to about 0.2 s behind: each lane adds its
    /// counts every tenth of a second, and an idle one waits up to as long for a packet
    /// first; ring drops and freezes come when it stops).
    pub fn counters(&self) -> RrCounters {
        self.live.load()
    }

    /// The metrics endpoint's answer: every counter as `netlane_rr_<name>_total`.
    pub fn metrics_handler(&self) -> Arc<netlane::metrics::prom::Handler> {
        let live = self.live.clone();
        Arc::new(move |path: &str| {
            (path == "/metrics").then(|| {
                let mut e = netlane::metrics::prom::Exposition::new();
                e.counters("netlane_rr", &live.load());
                (netlane::metrics::prom::TEXT_FORMAT, e.finish())
            })
        })
    }
}

fn join(thread: JoinHandle<Result<ServerStats, ServerError>>) -> Result<ServerStats, ServerError> {
    thread.join().unwrap_or(Err(ServerError::Thread("panicked")))
}

impl Running for Server {
    type Final = Result<ServerStats, ServerError>;

    /// Ended by itself: it failed or panicked (the error comes with [`Running::stop`]),
    /// or its configuration's duration passed.
    fn poll_ended(&self) -> Option<Ended> {
        if !self.thread.is_finished() {
            return None;
        }
        Some(if self.served.load(Ordering::Acquire) {
            Ended::Asked("it served its configured duration".into())
        } else {
            Ended::Failed("the server stopped with an error".into())
        })
    }

    fn stop(self) -> Result<ServerStats, ServerError> {
        self.stop.stop();
        join(self.thread)
    }
}

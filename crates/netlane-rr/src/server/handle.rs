//! The server on a thread of its own: started, then stopped (or supervised) for its
//! final counters, as every netlane server is.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use netlane::serve::{Ended, Running, Stop};

use super::{ServerConfig, ServerError, ServerStats, io_err, serve};

/// A running server (every lane of it). Stop it with [`Running::stop`], or watch it
/// with [`netlane::serve::supervise`].
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    stop: Stop,
    served: Arc<AtomicBool>,
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
        let thread = std::thread::Builder::new()
            .name("rr-server".into())
            .spawn(move || {
                let r = serve(&cfg, &s, |a| {
                    let _ = ready.send(a);
                });
                done.store(r.is_ok(), Ordering::Release);
                r
            })
            .map_err(io_err("start the server thread"))?;
        match addr.recv() {
            Ok(addr) => Ok(Server { addr, stop, served, thread }),
            // The thread ended before it was ready: its error says why.
            Err(_) => Err(join(thread).err().unwrap_or(ServerError::Thread("ended before it was ready"))),
        }
    }

    /// The address it serves.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
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

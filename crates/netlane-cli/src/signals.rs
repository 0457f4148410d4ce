//! SIGINT, SIGTERM and SIGHUP.
//!
//! - Servers (`nvme target`, `lb run`, `lb decap`) stop gracefully on the first signal:
//!   [`STOP`] is set, the server prints its final counters and exits 0. A second signal
//!   ends the process at once (128 + signal).
//! - Everything else (benchmarks, the lab) removes the network namespaces this process
//!   made and exits with 128 + signal: destructors do not run when a signal ends a
//!   process, and namespaces would otherwise outlive it.

use std::sync::LazyLock;

use netlane::serve::Stop;

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

/// Given when a server should stop: its loops wait on it and wake at once.
pub static STOP: LazyLock<Stop> = LazyLock::new(|| {
    Stop::new().unwrap_or_else(|e| {
        eprintln!("error: create the stop signal (an eventfd): {e}");
        std::process::exit(1)
    })
});

/// How the process reacts to a termination signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Stop gracefully, then exit 0; a second signal ends it at once.
    Server,
    /// Clean up namespaces and exit with 128 + signal.
    Job,
}

fn name(sig: i32) -> &'static str {
    match sig {
        SIGINT => "SIGINT",
        SIGTERM => "SIGTERM",
        SIGHUP => "SIGHUP",
        _ => "a signal",
    }
}

fn die(sig: i32) -> ! {
    let n = netlane::topology::registry::cleanup_all();
    eprintln!("\ninterrupted by {}; removed {n} network namespaces", name(sig));
    std::process::exit(128 + sig);
}

/// Installs the handler thread.
pub fn install(mode: Mode) {
    if mode == Mode::Server {
        // Made now, so that a machine out of descriptors says so before serving.
        LazyLock::force(&STOP);
    }
    let mut signals = match Signals::new([SIGINT, SIGTERM, SIGHUP]) {
        Ok(s) => s,
        Err(e) => {
            eprintln!(
                "warning: no signal handler ({e}); an interrupted run may leave namespaces behind (netlane clean \
                 removes them)"
            );
            return;
        }
    };
    let spawned = std::thread::Builder::new().name("signals".into()).spawn(move || {
        for sig in signals.forever() {
            match mode {
                Mode::Server if !STOP.is_stopped() => {
                    STOP.stop();
                    eprintln!("\n{}: stopping (again to stop at once)", name(sig));
                }
                _ => die(sig),
            }
        }
    });
    if let Err(e) = spawned {
        eprintln!("warning: no signal handler thread ({e})");
    }
}

/// An agent's start: SIGUSR1 from the coordinator that started it.
pub struct StartGate {
    go: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// How long an agent waits for its start.
pub const START_WITHIN: std::time::Duration = std::time::Duration::from_secs(60);

impl StartGate {
    /// Catches SIGUSR1 from now on: registered before an agent says it is ready, the
    /// word cannot come too early.
    pub fn register() -> anyhow::Result<StartGate> {
        use anyhow::Context as _;
        let go = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        signal_hook::flag::register(signal_hook::consts::SIGUSR1, go.clone()).context("catch SIGUSR1")?;
        Ok(StartGate { go })
    }

    /// Says `ready` on standard error and waits for the start (at most
    /// [`START_WITHIN`]).
    pub fn wait(&self, ready: &str) -> Result<(), String> {
        eprintln!("{ready}");
        let deadline = std::time::Instant::now() + START_WITHIN;
        while !self.go.load(std::sync::atomic::Ordering::Relaxed) {
            if std::time::Instant::now() >= deadline {
                return Err(format!("no start (SIGUSR1) within {START_WITHIN:?}"));
            }
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
        Ok(())
    }
}

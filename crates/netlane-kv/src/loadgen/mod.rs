//! The load generator's driver: threads, TCP connections, a timer, over the sans-IO
//! [`load`](crate::load) core. Works against any memcached-protocol server.
//!
//! Each thread owns a share of the connections, one epoll instance and one timerfd
//! armed (absolute `CLOCK_MONOTONIC`, nanoseconds) for the earliest send due among its
//! connections; due requests are written as soon as the thread wakes, replies are read
//! when epoll says so. Send times come from the precomputed schedule and latency is
//! measured from them, so the generator's own delays count against the server, never
//! for it: a late send is counted (`sent_late`), and the thread CPU time is reported so
//! a run can show the generator was not the bottleneck.
//!
//! - `mod.rs`: what a run is asked for ([`LoadConfig`]) and its checks;
//! - `report.rs`: what a run measured ([`LoadReport`], [`Run`]);
//! - `warmup.rs`: every key stored once before the runs ([`warm_up`]);
//! - `drive.rs`: a run ([`run`]): the connections spread over threads, each thread's
//!   event loop;
//! - `rate_search.rs`: the highest rate that holds an SLA ([`search`], and
//!   [`search_with`] over any way of making a run);
//! - `agents.rs`: one run made by several generator processes (agents, on hosts of
//!   their own): its [`split`], what each sends back ([`AgentOutput`]), their [`merge`].

mod agents;
mod drive;
mod rate_search;
mod report;
mod warmup;

use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::load::schedule::{Arrivals, Pacing};
use crate::load::workload::{Workload, WorkloadSpec};

pub use agents::{AgentOutput, merge, split};
pub use drive::{run, run_gated, run_observed};
pub use rate_search::{CurvePoint, RunPoint, SearchReport, check_search, search, search_with};
pub use report::{CountsView, LoadReport, RequestLatency, Run};
pub use warmup::warm_up;

/// What a run does.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// The server.
    pub server: SocketAddr,
    /// TCP connections.
    pub connections: u32,
    /// Threads the connections are spread over.
    pub threads: usize,
    /// CPUs the threads are pinned to (thread i on the i-th, wrapping).
    pub cpus: Option<Vec<usize>>,
    /// Open loop at a total rate, or closed loop at a depth per connection.
    pub pacing: Pacing,
    /// What is asked.
    pub workload: WorkloadSpec,
    /// How long requests are measured.
    pub duration: Duration,
    /// Before that, how long requests are sent but not measured (connections and
    /// caches settle; the first requests on a connection are slower).
    pub ramp: Duration,
    /// Most requests in flight per connection.
    pub max_in_flight: u32,
    /// A send this much after its scheduled time counts as late.
    pub late_after: Duration,
    /// After the window, how long replies are still awaited (then: unanswered).
    pub drain: Duration,
    /// The seed of every random draw.
    pub seed: u64,
}

impl Default for LoadConfig {
    fn default() -> Self {
        LoadConfig {
            server: SocketAddr::from(([127, 0, 0, 1], 11211)),
            connections: 64,
            threads: 1,
            cpus: None,
            pacing: Pacing::Open(Arrivals { process: crate::load::schedule::Process::Poisson, rate_per_s: 10_000.0 }),
            workload: WorkloadSpec::default(),
            duration: Duration::from_secs(5),
            ramp: Duration::from_millis(200),
            max_in_flight: 64,
            late_after: Duration::from_micros(100),
            drain: Duration::from_secs(1),
            seed: 1,
        }
    }
}

/// Why a run could not be made.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A bad value.
    #[error("{0}")]
    Config(String),
    /// A connection or system call failed.
    #[error(transparent)]
    Io(#[from] netlane::error::IoError),
    /// The warm-up did not store every key.
    #[error("warm-up: {0}")]
    Warmup(String),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LoadError {
    let what = what.into();
    move |source| LoadError::Io(netlane::error::IoError::new(what, source))
}

impl LoadConfig {
    /// Checks the values before anything connects.
    pub fn validate(&self) -> Result<(), LoadError> {
        let bad = |m: String| Err(LoadError::Config(m));
        if !(1..=65_536).contains(&self.connections) {
            return bad(format!("`connections` {}: must be 1..=65536", self.connections));
        }
        if !(1..=256).contains(&self.threads) || self.threads > self.connections as usize {
            return bad(format!("`threads` {}: must be 1..=256 and at most the connections", self.threads));
        }
        if self.duration < Duration::from_millis(10) || self.duration > Duration::from_secs(24 * 3600) {
            return bad("`duration` must be 10ms..=24h".into());
        }
        if self.ramp > Duration::from_secs(60) {
            return bad("`ramp` must be at most 60s".into());
        }
        if self.drain > Duration::from_secs(60) {
            return bad("`drain` must be at most 60s".into());
        }
        if !(1..=4096).contains(&self.max_in_flight) {
            return bad(format!("`max_in_flight` {}: must be 1..=4096", self.max_in_flight));
        }
        match self.pacing {
            Pacing::Open(a) => {
                a.per_connection(self.connections).map_err(|e| LoadError::Config(e.to_string()))?;
            }
            Pacing::Closed { depth } if depth == 0 || depth > self.max_in_flight => {
                return bad(format!("`closed` {depth}: must be 1..=`max_in_flight` ({})", self.max_in_flight));
            }
            Pacing::Closed { .. } => {}
        }
        Workload::new(self.workload).map_err(|e| LoadError::Config(e.to_string()))?;
        if let Some(c) = &self.cpus {
            netlane::cpus::CpuList::new(c.clone()).check_online().map_err(|e| LoadError::Config(e.to_string()))?;
        }
        Ok(())
    }
}

fn connect(addr: SocketAddr) -> Result<TcpStream, LoadError> {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(io_err(format!("connect to {addr}")))?;
    s.set_nodelay(true).map_err(io_err("TCP_NODELAY"))?;
    Ok(s)
}

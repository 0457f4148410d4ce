//! `netlane kv serve`: arguments in (memcached's short options where they exist),
//! the server started, final counters out.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use netlane::metrics::prom::{MetricsServer, check_metrics_addr};
use netlane::metrics::units::parse_size;
use netlane_kv::proto::Limits;
use netlane_kv::server::{Server, ServerConfig};
use netlane_kv::store::StoreConfig;
use netlane_lab::scenarios::options::parse_positive_duration;

use crate::out;
use crate::signals::STOP;

/// The memcached-protocol cache.
#[derive(Debug, Subcommand)]
pub enum KvCmd {
    /// Serve the memcached text and meta protocols (TCP, and UDP with -U) until
    /// SIGINT/SIGTERM (or --time); then print the final counters and exit 0.
    Serve(Box<ServeArgs>),
}

/// Runs a `kv` command.
pub fn run(cmd: KvCmd) -> Result<u8> {
    match cmd {
        KvCmd::Serve(a) => a.run(),
    }
}

/// A size; a bare number is MiB (memcached's `-m 64`).
fn megabytes(s: &str) -> Result<u64, String> {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        let m: u64 = s.parse().map_err(|_| format!("{s}: not a number"))?;
        return m.checked_mul(1 << 20).ok_or_else(|| format!("{s} MiB is too large"));
    }
    parse_size(s).map_err(|e| e.to_string())
}

fn size(s: &str) -> Result<usize, String> {
    let v = parse_size(s).map_err(|e| e.to_string())?;
    usize::try_from(v).map_err(|_| format!("{s} is too large"))
}

/// `ADDR:PORT` or a bare address (the port then comes from -p).
fn listen_addr(s: &str) -> Result<(IpAddr, Option<u16>), String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok((a.ip(), Some(a.port())));
    }
    let bare = s.trim_start_matches('[').trim_end_matches(']');
    bare.parse::<IpAddr>()
        .map(|ip| (ip, None))
        .map_err(|_| format!("{s}: expected ADDR:PORT, [V6ADDR]:PORT or an address"))
}

/// `netlane kv serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to serve, with or without a port (memcached's -l).
    #[arg(short = 'l', long, default_value = "127.0.0.1", value_parser = listen_addr)]
    pub listen: (IpAddr, Option<u16>),
    /// TCP port when --listen has none (0 picks one).
    #[arg(short = 'p', long, default_value_t = 11211)]
    pub port: u16,
    /// Also serve UDP on this port (0: off, as memcached's -U 0).
    #[arg(short = 'U', long, default_value_t = 0)]
    pub udp_port: u16,
    /// Memory for items (keys, values, per-item overhead); a bare number is MiB.
    #[arg(short = 'm', long, default_value = "64", value_parser = megabytes)]
    pub memory: u64,
    /// Largest value (memcached's -I).
    #[arg(short = 'I', long, default_value = "1m", value_parser = size)]
    pub item_max: usize,
    /// Worker threads (memcached's -t).
    #[arg(short = 't', long, default_value_t = 4)]
    pub threads: usize,
    /// Most simultaneous connections; more are answered
    /// "ERROR Too many open connections" and closed (memcached's -c).
    #[arg(short = 'c', long, default_value_t = 1024)]
    pub max_conns: usize,
    /// Close connections idle this long [default: never].
    #[arg(long, value_parser = parse_positive_duration)]
    pub idle_timeout: Option<Duration>,
    /// Commands one connection runs before the others get a turn (memcached's -R).
    #[arg(short = 'R', long, default_value_t = 64)]
    pub reqs_per_event: usize,
    /// Longest command line other than get (longer: CLIENT_ERROR and the connection
    /// closes).
    #[arg(long, default_value = "2048", value_parser = size)]
    pub max_line: usize,
    /// Longest get line (many keys).
    #[arg(long, default_value = "64k", value_parser = size)]
    pub max_get_line: usize,
    /// Stop reading a connection's commands while this much of its output is unsent.
    #[arg(long, default_value = "256k", value_parser = size)]
    pub output_pause: usize,
    /// Store shards (each with its own lock; rounded down to a power of two).
    #[arg(long, default_value_t = 64)]
    pub shards: usize,
    /// CPUs the workers are pinned to, in order (a CPU list) [default: not pinned].
    #[arg(long, value_parser = netlane::cpus::parse_online)]
    pub cpus: Option<netlane::cpus::CpuList>,
    /// Serve Prometheus metrics on this loopback address (GET /metrics).
    #[arg(long, value_parser = |s: &str| s.parse::<SocketAddr>().map_err(|e| e.to_string()).and_then(|a| check_metrics_addr(a).map(|()| a)))]
    pub metrics_addr: Option<SocketAddr>,
    /// Stop after this long [default: run until SIGINT/SIGTERM].
    #[arg(long, value_parser = parse_positive_duration)]
    pub time: Option<Duration>,
}

impl ServeArgs {
    fn config(&self) -> ServerConfig {
        let (ip, port) = self.listen;
        ServerConfig {
            listen: SocketAddr::new(ip, port.unwrap_or(self.port)),
            udp_port: (self.udp_port != 0).then_some(self.udp_port),
            threads: self.threads,
            store: StoreConfig { memory: self.memory, item_max: self.item_max, shards: self.shards },
            limits: Limits {
                max_line: self.max_line,
                max_get_line: self.max_get_line,
                output_pause: self.output_pause,
                commands_per_turn: self.reqs_per_event,
                ..Limits::default()
            },
            max_conns: self.max_conns,
            idle_timeout: self.idle_timeout,
            cpus: self.cpus.as_ref().map(|c| c.as_slice().to_vec()),
            backlog: 1024,
        }
    }

    fn run(&self) -> Result<u8> {
        let cfg = self.config();
        cfg.validate()?;
        let server = Server::start(cfg.clone()).context("starting the cache server")?;
        let metrics = self
            .metrics_addr
            .map(|a| MetricsServer::start(a, "kv-metrics", server.metrics_handler()))
            .transpose()
            .context("starting the metrics endpoint")?;
        let mut line = format!(
            "listening on {} (tcp) threads={} memory={} item_max={} max_conns={} shards={}",
            server.local_addr(),
            cfg.threads,
            cfg.store.memory,
            cfg.store.item_max,
            cfg.max_conns,
            server.settings().shards
        );
        if let Some(u) = server.udp_addr() {
            line.push_str(&format!(" udp={u}"));
        }
        if let Some(m) = &metrics {
            line.push_str(&format!(" metrics=http://{}/metrics", m.local_addr()));
        }
        out::println(&line);
        let started = Instant::now();
        while !STOP.load(Ordering::Relaxed) && self.time.is_none_or(|t| started.elapsed() < t) {
            if server.failed() {
                anyhow::bail!("a server thread stopped unexpectedly (see the log above)");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        drop(metrics);
        let s = server.stop();
        let p = &s.protocol.0;
        let g = |k: &str| p.get(k).copied().unwrap_or(0);
        out::println(&format!(
            "stopped after {:.1} s: connections={} rejected={} idle_kicks={} cmd_get={} get_hits={} get_misses={} \
             cmd_set={} evictions={} curr_items={} bytes={} client_errors={} bytes_read={} bytes_written={} udp_requests={}",
            s.uptime_s,
            s.total_connections,
            s.rejected_connections,
            s.idle_kicks,
            g("cmd_get"),
            g("get_hits"),
            g("get_misses"),
            g("cmd_set"),
            s.store.evictions,
            s.store.curr_items,
            s.store.bytes,
            g("client_errors"),
            g("bytes_read"),
            g("bytes_written"),
            s.udp_requests,
        ));
        Ok(0)
    }
}

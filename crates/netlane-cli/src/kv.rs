//! `netlane kv serve`: arguments in (memcached's short options where they exist),
//! the server started, final counters out.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use netlane::lanes::BusyPoll;
use netlane::metrics::prom::{MetricsServer, check_metrics_addr};
use netlane::metrics::units::parse_size;
use netlane::topology::netdev::NapiSettings;
use netlane_kv::load::schedule::{Arrivals, Pacing, Process};
use netlane_kv::load::search::{GENERATOR_LAG_MAX, SearchConfig};
use netlane_kv::load::stats::Sla;
use netlane_kv::loadgen::{self, LoadConfig, LoadReport};
use netlane_kv::proto::parse::Allowed;
use netlane_kv::proto::{Limits, Settings as ProtoSettings};
use netlane_kv::server::{Server, ServerConfig, Steer, UnixListen};
use netlane_kv::store::{ClassConfig, StoreConfig};
use netlane_lab::report::documents::{KvLoad, KvServe};
use netlane_lab::report::{self};
use netlane_lab::scenarios::kv::WorkloadArgs;
use netlane_lab::scenarios::options::{OptionList, parse_duration, parse_positive_duration};

use crate::out::{self, OutputArgs};
use crate::signals::STOP;

/// The memcached-protocol cache.
#[derive(Debug, Subcommand)]
pub enum KvCmd {
    /// Serve the memcached text and meta protocols (TCP, and UDP with -U) until
    /// SIGINT/SIGTERM (or --time); then print the final counters and exit 0.
    Serve(Box<ServeArgs>),
    /// Load any memcached-protocol server: open loop (Poisson, constant or ETC arrivals
    /// from a precomputed schedule, latency from the scheduled send time) or closed
    /// loop; with --search, the highest rate that holds an SLA.
    Load(Box<LoadArgs>),
}

/// Runs a `kv` command.
pub fn run(cmd: KvCmd) -> Result<u8> {
    match cmd {
        KvCmd::Serve(a) => a.run(),
        KvCmd::Load(a) => a.run(),
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

/// `--lanes`: `auto` or a count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LanesCount {
    /// One lane per receive queue of the lane device.
    Auto,
    /// This many.
    Count(usize),
}

fn lanes_count(s: &str) -> Result<LanesCount, String> {
    if s == "auto" {
        return Ok(LanesCount::Auto);
    }
    match s.parse::<usize>() {
        Ok(n) if (1..=netlane_kv::server::MAX_LANES).contains(&n) => Ok(LanesCount::Count(n)),
        _ => Err(format!("--lanes {s}: auto, or a count 1..={}", netlane_kv::server::MAX_LANES)),
    }
}

/// The interface that holds address `ip` (in this namespace).
fn device_holding(ip: IpAddr) -> Result<String> {
    for ifa in nix::ifaddrs::getifaddrs().context("list interfaces")? {
        let has = ifa.address.as_ref().is_some_and(|a| {
            a.as_sockaddr_in().is_some_and(|v| IpAddr::V4(v.ip()) == ip)
                || a.as_sockaddr_in6().is_some_and(|v| IpAddr::V6(v.ip()) == ip)
        });
        if has {
            return Ok(ifa.interface_name);
        }
    }
    bail!("no interface holds {ip}")
}

/// `netlane kv serve`. The short options are memcached's, with memcached's meaning,
/// so a memcached command line runs as it is (what netlane does not do is refused by
/// name; memcached's tuning of its own slabs and LRU is accepted and has no effect).
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to serve, with or without a port (memcached's -l; memcached's default is
    /// every address).
    #[arg(short = 'l', long, default_value = "127.0.0.1", value_parser = listen_addr)]
    pub listen: (IpAddr, Option<u16>),
    /// TCP port when --listen has none: 0 turns TCP off, -1 picks a free port
    /// [default: 11211].
    #[arg(short = 'p', long, allow_negative_numbers = true, value_parser = port_arg)]
    pub port: Option<i32>,
    /// UDP port: 0 off, -1 picks a free port; given alone, TCP serves the same port.
    #[arg(short = 'U', long, allow_negative_numbers = true, value_parser = port_arg)]
    pub udp_port: Option<i32>,
    /// Serve this Unix socket, instead of TCP and UDP.
    #[arg(short = 's', long = "unix-socket", value_name = "FILE")]
    pub unix_socket: Option<std::path::PathBuf>,
    /// The Unix socket's access mask, in octal.
    #[arg(short = 'a', long = "unix-mask", default_value = "700", value_parser = octal_mask)]
    pub unix_mask: u32,
    /// Allow the `shutdown` command.
    #[arg(short = 'A', long)]
    pub enable_shutdown: bool,
    /// When started as root, run as this user once the sockets are open.
    #[arg(short = 'u', long)]
    pub user: Option<String>,
    /// Memory for items (keys, values, per-item overhead); a bare number is MiB.
    #[arg(short = 'm', long = "memory-limit", visible_alias = "memory", default_value = "64", value_parser = megabytes)]
    pub memory: u64,
    /// Refuse new items when memory is full instead of evicting
    /// ("SERVER_ERROR out of memory storing object").
    #[arg(short = 'M', long)]
    pub disable_evictions: bool,
    /// Largest value (memcached's -I).
    #[arg(short = 'I', long = "max-item-size", visible_alias = "item-max", default_value = "1m", value_parser = size)]
    pub item_max: usize,
    /// Worker threads (memcached's -t).
    #[arg(short = 't', long, default_value_t = 4)]
    pub threads: usize,
    /// Verbosity: the level `stats settings` reports (repeat for more).
    #[arg(short = 'v', long, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Keep no CAS values: gets returns 0 and cas never stores.
    #[arg(short = 'C', long)]
    pub disable_cas: bool,
    /// Refuse `flush_all`.
    #[arg(short = 'F', long = "disable-flush-all")]
    pub disable_flush_all: bool,
    /// Refuse `stats cachedump`.
    #[arg(short = 'X', long)]
    pub disable_dumping: bool,
    /// Accepted for memcached's command lines: there are no watch commands to turn off.
    #[arg(short = 'W', long)]
    pub disable_watch: bool,
    /// The protocols a connection may speak: auto (told apart by the first byte),
    /// ascii or binary.
    #[arg(short = 'B', long, default_value = "auto", value_parser = protocol_arg)]
    pub protocol: netlane_kv::proto::Protocol,
    /// The listen backlog.
    #[arg(short = 'b', long = "listen-backlog", default_value_t = 1024)]
    pub backlog: i32,
    /// Size classes' growth factor, for the per-class stats (memcached's -f).
    #[arg(short = 'f', long = "slab-growth-factor", default_value_t = 1.25)]
    pub growth_factor: f64,
    /// The smallest size class's space for key, value and flags (memcached's -n).
    #[arg(short = 'n', long = "slab-min-size", default_value_t = 48)]
    pub slab_min_size: u64,
    /// memcached's extended options, comma separated: idle_timeout=SECS,
    /// slab_chunk_max=KB, read_buf_mem_limit=MB (memory for values being received and
    /// replies being sent, over all connections; 0: no limit) [default: as -m]; and
    /// memcached's own slab and LRU tuning, accepted with no effect.
    #[arg(short = 'o', long, value_delimiter = ',')]
    pub extended: Vec<String>,
    /// Accept memcached-debug's `debugtime <seconds>` command, which moves the server's
    /// clock forward (for test suites, such as memcached's own).
    #[arg(long)]
    pub debug_time: bool,
    /// Lanes instead of plain workers: `auto` (one per receive queue of --lane-device)
    /// or a count. A lane is a worker that owns receive queues (NAPI instances).
    #[arg(long, value_parser = lanes_count, conflicts_with = "threads")]
    pub lanes: Option<LanesCount>,
    /// How a connection finds its lane: round-robin (no alignment), acceptor (the
    /// acceptor hands it to the owner of its SO_INCOMING_NAPI_ID, like memcached -N) or
    /// reuseport (one listener per lane, a BPF selector picks by NAPI id; needs root, and
    /// sets net.ipv4.tcp_migrate_req=1 in the server's namespace).
    #[arg(long, default_value = "round-robin")]
    pub steer: Steer,
    /// Busy polling per lane: USECS[,BUDGET[,prefer]] (per-epoll EPIOCSPARAMS, and
    /// SO_PREFER_BUSY_POLL with prefer); every knob is reported applied or refused.
    #[arg(long)]
    pub busy_poll: Option<BusyPoll>,
    /// The interface whose receive queues the lanes own [default with --lanes auto:
    /// the one holding the listen address].
    #[arg(long)]
    pub lane_device: Option<String>,
    /// Per-NAPI: empty polls before interrupts are re-enabled (napi-set, else sysfs).
    #[arg(long)]
    pub napi_defer_hard_irqs: Option<u32>,
    /// Per-NAPI: GRO flush / watchdog timeout (napi-set, else sysfs).
    #[arg(long, value_parser = parse_duration)]
    pub gro_flush_timeout: Option<Duration>,
    /// Per-NAPI: IRQ suspension timeout while the lane keeps finding events (napi-set,
    /// Linux 6.13+).
    #[arg(long, value_parser = parse_duration)]
    pub irq_suspend_timeout: Option<Duration>,
    /// Most lanes over the server's life (room for lanes added live) [default: the
    /// lanes at start].
    #[arg(long)]
    pub max_lanes: Option<usize>,
    /// Transmit alignment on the lane device: transmit queue i sends for sockets whose
    /// packets arrive on receive queue i (xps_rxqs).
    #[arg(long)]
    pub xps_rxqs: bool,
    /// Most simultaneous connections; more are answered
    /// "ERROR Too many open connections" and closed (memcached's -c).
    #[arg(short = 'c', long = "conn-limit", visible_alias = "max-conns", default_value_t = 1024)]
    pub max_conns: usize,
    /// Close connections idle this long [default: never] (memcached's -o idle_timeout).
    #[arg(long, value_parser = parse_positive_duration)]
    pub idle_timeout: Option<Duration>,
    /// Commands one connection runs before the others get a turn (memcached's -R).
    #[arg(short = 'R', long = "max-reqs-per-event", visible_alias = "reqs-per-event", default_value_t = 64)]
    pub reqs_per_event: usize,
    /// Longest command line other than get (longer: CLIENT_ERROR and the connection
    /// closes; get lines may be any length).
    #[arg(long, default_value = "2048", value_parser = size)]
    pub max_line: usize,
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
    /// Print the final counters as JSON to FILE, or to stdout with `-` (the first line,
    /// `listening on ...`, then goes to stderr).
    #[arg(long, value_name = "FILE|-", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<std::path::PathBuf>,
    /// memcached options netlane does not have, refused by name.
    #[command(flatten)]
    pub unsupported: Unsupported,
}

/// memcached's options that netlane refuses, each with the reason.
#[derive(Debug, Args)]
pub struct Unsupported {
    #[arg(short = 'd', hide = true)]
    daemon: bool,
    #[arg(short = 'P', hide = true)]
    pidfile: Option<String>,
    #[arg(short = 'r', hide = true)]
    coredumps: bool,
    #[arg(short = 'k', hide = true)]
    lock_memory: bool,
    #[arg(short = 'L', hide = true)]
    large_pages: bool,
    #[arg(short = 'D', hide = true)]
    delimiter: Option<String>,
    #[arg(short = 'S', hide = true)]
    auth: bool,
    #[arg(short = 'Y', hide = true)]
    auth_file: Option<String>,
    #[arg(short = 'e', hide = true)]
    memory_file: Option<String>,
    #[arg(short = 'Z', hide = true)]
    tls: bool,
    #[arg(short = 'N', hide = true)]
    napi_ids: Option<String>,
}

impl Unsupported {
    /// The first option given that netlane does not have, with why.
    fn check(&self) -> Result<()> {
        let why = [
            (self.daemon, "-d: netlane does not daemonize; run it under a service manager"),
            (self.pidfile.is_some(), "-P: there is no daemon mode to write a PID file for"),
            (self.coredumps, "-r: set the core file limit with ulimit -c"),
            (self.lock_memory, "-k: locking memory is not supported"),
            (self.large_pages, "-L: large pages are not supported"),
            (self.delimiter.is_some(), "-D: per-prefix stats are not supported"),
            (self.auth, "-S: authentication is not supported"),
            (self.auth_file.is_some(), "-Y: authentication is not supported"),
            (self.memory_file.is_some(), "-e: a restartable memory file is not supported"),
            (self.tls, "-Z: TLS is not supported"),
            (self.napi_ids.is_some(), "-N: use --lanes and --steer acceptor (NAPI-id placement)"),
        ];
        match why.iter().find(|(given, _)| *given) {
            Some((_, why)) => bail!("{why}"),
            None => Ok(()),
        }
    }
}

/// memcached's `-p`/`-U`: -1 (a free port) up to 65535.
fn port_arg(s: &str) -> Result<i32, String> {
    match s.parse::<i32>() {
        Ok(p) if (-1..=65535).contains(&p) => Ok(p),
        _ => Err(format!("{s}: a port 0..=65535, or -1 for a free one")),
    }
}

fn octal_mask(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s, 8).ok().filter(|m| *m <= 0o777).ok_or_else(|| format!("{s}: an octal mode, 0..=777"))
}

fn protocol_arg(s: &str) -> Result<netlane_kv::proto::Protocol, String> {
    use netlane_kv::proto::Protocol;
    match s {
        "auto" => Ok(Protocol::Auto),
        "ascii" => Ok(Protocol::Ascii),
        "binary" => Ok(Protocol::Binary),
        _ => Err(format!("{s}: ascii, binary or auto")),
    }
}

/// What memcached's `-o` options ask of netlane.
#[derive(Debug, Default, Clone, PartialEq)]
struct Extended {
    idle_timeout: Option<Duration>,
    slab_chunk_max: Option<u64>,
    /// Bytes; `Some(u64::MAX)` for memcached's 0 (no limit).
    read_buf_mem_limit: Option<u64>,
    /// memcached tuning with no counterpart here.
    no_effect: Vec<String>,
}

/// memcached's extended options that tune its own slab allocator, LRU, hashing and
/// privileges: none has a counterpart in netlane's store, so they are accepted (a
/// memcached command line runs as it is) and reported as having no effect.
const NO_EFFECT: &[&str] = &[
    "maxconns_fast",
    "hashpower",
    "tail_repair_time",
    "hash_algorithm",
    "lru_crawler",
    "lru_crawler_sleep",
    "lru_crawler_tocrawl",
    "lru_maintainer",
    "hot_lru_pct",
    "warm_lru_pct",
    "hot_max_factor",
    "warm_max_factor",
    "temporary_ttl",
    "watcher_logbuf_size",
    "worker_logbuf_size",
    "track_sizes",
    "hashexpand",
    "modern",
    "slab_reassign",
    "slab_automove",
    "slab_automove_ratio",
    "slab_automove_window",
    "slab_automove_freeratio",
    "inline_ascii_response",
    "lru_segmented",
    "expirezero_does_not_evict",
    "relaxed_privileges",
    "drop_privileges",
    "sock_cookie_id",
];

fn extended(list: &[String]) -> Result<Extended> {
    let mut e = Extended::default();
    for opt in list.iter().filter(|o| !o.is_empty()) {
        let (name, value) = opt.split_once('=').map_or((opt.as_str(), None), |(n, v)| (n, Some(v)));
        let number = || -> Result<u64> {
            value.and_then(|v| v.parse::<u64>().ok()).with_context(|| format!("-o {opt}: {name} takes a number"))
        };
        match name {
            "idle_timeout" => {
                let secs = number()?;
                e.idle_timeout = (secs > 0).then(|| Duration::from_secs(secs));
            }
            "slab_chunk_max" => e.slab_chunk_max = Some(number()? << 10),
            "read_buf_mem_limit" => {
                let mb = number()?;
                e.read_buf_mem_limit = Some(if mb == 0 { u64::MAX } else { mb.saturating_mul(1 << 20) });
            }
            n if n.starts_with("ext_") || n.starts_with("ssl_") || n.starts_with("proxy") => {
                bail!("-o {opt}: not supported (netlane has no external storage, TLS or proxy)")
            }
            n if NO_EFFECT.contains(&n.strip_prefix("no_").unwrap_or(n)) => e.no_effect.push(opt.clone()),
            _ => bail!("-o {opt}: illegal suboption"),
        }
    }
    Ok(e)
}

impl ServeArgs {
    /// The ports as memcached resolves -p and -U: TCP (None: off) and UDP (None: off),
    /// 0 standing for a free port.
    fn ports(&self) -> (Option<u16>, Option<u16>) {
        let given_tcp = self.listen.1.map(i32::from).or(self.port);
        let udp = self.udp_port.unwrap_or(0);
        // -U alone sets the TCP port too (memcached).
        let tcp = match given_tcp {
            Some(p) => p,
            None if udp != 0 => udp,
            None => 11211,
        };
        let port = |p: i32| match p {
            0 => None,
            -1 => Some(0),
            p => Some(p as u16),
        };
        if self.unix_socket.is_some() {
            return (None, None);
        }
        (port(tcp), port(udp))
    }

    fn config(&self) -> Result<ServerConfig> {
        let (ip, _) = self.listen;
        let ext = extended(&self.extended)?;
        let (tcp, udp) = self.ports();
        let classes = ClassConfig {
            factor: self.growth_factor,
            min_size: self.slab_min_size,
            chunk_max: ext.slab_chunk_max.unwrap_or(ClassConfig::for_item_max(self.item_max).chunk_max),
        };
        Ok(ServerConfig {
            listen: SocketAddr::new(ip, tcp.unwrap_or(0)),
            tcp: tcp.is_some(),
            udp_port: udp,
            unix: self.unix_socket.as_ref().map(|p| UnixListen { path: p.clone(), mask: self.unix_mask }),
            threads: self.threads,
            store: StoreConfig {
                memory: self.memory,
                item_max: self.item_max,
                shards: self.shards,
                cas: !self.disable_cas,
                evictions: !self.disable_evictions,
                classes: Some(classes),
            },
            limits: Limits {
                max_line: self.max_line,
                output_pause: self.output_pause,
                commands_per_turn: self.reqs_per_event,
                ..Limits::default()
            },
            max_conns: self.max_conns,
            idle_timeout: self.idle_timeout.or(ext.idle_timeout),
            cpus: self.cpus.as_ref().map(|c| c.as_slice().to_vec()),
            backlog: self.backlog,
            steer: self.steer,
            busy_poll: self.busy_poll,
            lane_device: None,
            napi: NapiSettings {
                defer_hard_irqs: self.napi_defer_hard_irqs,
                gro_flush_timeout_ns: self.gro_flush_timeout.map(|d| d.as_nanos() as u64),
                irq_suspend_timeout_ns: self.irq_suspend_timeout.map(|d| d.as_nanos() as u64),
            },
            max_lanes: self.max_lanes,
            xps_rxqs: self.xps_rxqs,
            proto: ProtoSettings {
                allowed: Allowed { shutdown: self.enable_shutdown, debug_time: self.debug_time },
                flush: !self.disable_flush_all,
                dump: !self.disable_dumping,
                protocol: self.protocol,
            },
            conn_memory: ext.read_buf_mem_limit,
        })
    }

    /// The config with the lanes resolved: `--lanes auto` counts the device's receive
    /// queues (the device holding the listen address unless --lane-device names one).
    fn resolved(&self) -> Result<ServerConfig> {
        let mut cfg = self.config()?;
        let device = match (&self.lane_device, self.lanes) {
            (Some(d), _) => Some(d.clone()),
            (None, Some(LanesCount::Auto)) => Some(device_holding(cfg.listen.ip()).with_context(|| {
                format!(
                    "--lanes auto: which device's queues? {} is on none (name one with --lane-device)",
                    cfg.listen.ip()
                )
            })?),
            (None, _) => None,
        };
        if let Some(dev) = &device {
            let ifindex =
                nix::net::if_::if_nametoindex(dev.as_str()).with_context(|| format!("--lane-device {dev}"))?;
            let q =
                netlane::lanes::queues::discover(ifindex).with_context(|| format!("reading {dev}'s receive queues"))?;
            if self.lanes == Some(LanesCount::Auto) {
                if q.rx.is_empty() {
                    bail!("--lanes auto: {dev} has no receive queue with a NAPI instance (is it up, with NAPI on?)");
                }
                cfg.threads = q.napi_ids().len();
            }
        }
        if let Some(LanesCount::Count(n)) = self.lanes {
            cfg.threads = n;
        }
        cfg.lane_device = device;
        Ok(cfg)
    }

    fn run(&self) -> Result<u8> {
        self.unsupported.check()?;
        let out = OutputArgs { json: self.json.clone(), csv: None };
        out.validate()?;
        let to_stdout = out.json_to_stdout();
        let ext = extended(&self.extended)?;
        for o in &ext.no_effect {
            eprintln!("note: -o {o} has no effect here (memcached's own slab, LRU or privilege tuning)");
        }
        let cfg = self.resolved()?;
        cfg.validate()?;
        if !cfg.tcp && cfg.udp_port.is_none() && cfg.unix.is_none() {
            eprintln!("warning: serving nothing: TCP (-p 0), UDP and the Unix socket are all off");
        }
        let server = Server::start(cfg.clone()).context("starting the cache server")?;
        if let Some(user) = &self.user {
            drop_privileges(user)?;
        }
        if let Some(file) = std::env::var_os("MEMCACHED_PORT_FILENAME") {
            write_port_file(std::path::Path::new(&file), server.tcp_addr(), server.udp_addr())?;
        }
        let metrics = self
            .metrics_addr
            .map(|a| MetricsServer::start(a, "kv-metrics", server.metrics_handler()))
            .transpose()
            .context("starting the metrics endpoint")?;
        let serving = match (server.tcp_addr(), &cfg.unix) {
            (_, Some(u)) => format!("{} (unix)", u.path.display()),
            (Some(a), None) => format!("{a} (tcp)"),
            (None, None) => "no TCP".to_string(),
        };
        let mut line = format!(
            "listening on {serving} threads={} memory={} item_max={} max_conns={} shards={}",
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
        let lanes = server.lanes();
        line.push_str(&format!(" steer={}", lanes.steer));
        if let Some(bp) = cfg.busy_poll {
            line.push_str(&format!(" busy_poll={bp}"));
        }
        for l in &lanes.lanes {
            line.push_str(&format!(
                "\nlane {}: cpu={} napi_ids={:?}",
                l.lane,
                l.cpu.map_or("-".to_string(), |c| c.to_string()),
                l.napi_ids
            ));
        }
        for k in &lanes.knobs {
            line.push_str(&format!(
                "\nknob {}{} = {}: {} ({})",
                k.lane.map_or(String::new(), |l| format!("lane {l} ")),
                k.name,
                k.wanted,
                if k.applied { "applied" } else { "refused" },
                k.detail
            ));
        }
        if to_stdout {
            eprintln!("{line}");
        } else {
            out::println(&line);
        }
        let started = Instant::now();
        while !STOP.load(Ordering::Relaxed) && self.time.is_none_or(|t| started.elapsed() < t) {
            if server.shutdown_requested().is_some() {
                eprintln!("shutdown: asked for by a client");
                break;
            }
            if server.failed() {
                anyhow::bail!("a server thread stopped unexpectedly (see the log above)");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        drop(metrics);
        let s = server.stop();
        let p = &s.protocol.0;
        let g = |k: &str| p.get(k).copied().unwrap_or(0);
        if !to_stdout {
            out::println(&format!(
                "stopped after {:.1} s: connections={} rejected={} idle_kicks={} accept_errors={} cmd_get={} get_hits={} get_misses={} \
                 cmd_set={} evictions={} curr_items={} bytes={} client_errors={} bytes_read={} bytes_written={} udp_requests={}",
                s.uptime_s,
                s.total_connections,
                s.rejected_connections,
                s.idle_kicks,
                s.accept_errors,
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
            for l in &s.lanes.lanes {
                out::println(&format!(
                    "lane {}: connections={} by_owner={} new_id={} no_napi={} round_robin={} handed_over={} moved_in={} moved_out={} busy_poll_refused={}",
                    l.lane,
                    l.connections,
                    l.by_owner,
                    l.new_id,
                    l.no_napi,
                    l.round_robin,
                    l.handed_over,
                    l.moved_in,
                    l.moved_out,
                    l.busy_poll_refused
                ));
            }
            if s.lanes.steer == Steer::Reuseport {
                out::println(&format!(
                    "reuseport selector: by_napi={} by_hash={}",
                    s.lanes.steered_by_napi, s.lanes.steered_by_hash
                ));
            }
        }
        out.write_json(&report::document("kv-serve", KvServe { stats: s }))?;
        Ok(0)
    }
}

/// memcached's `-u`: when running as root, become `user` (its group, and only that
/// group) once the sockets are open. As anyone else, nothing changes.
fn drop_privileges(user: &str) -> Result<()> {
    use nix::unistd::{Uid, User, setgid, setgroups, setuid};
    if !Uid::effective().is_root() {
        return Ok(());
    }
    let u = User::from_name(user).with_context(|| format!("-u {user}: reading the user database"))?;
    let u = u.with_context(|| format!("-u {user}: no such user"))?;
    if u.uid.is_root() {
        return Ok(());
    }
    setgroups(&[u.gid]).with_context(|| format!("-u {user}: setgroups"))?;
    setgid(u.gid).with_context(|| format!("-u {user}: setgid"))?;
    setuid(u.uid).with_context(|| format!("-u {user}: setuid"))?;
    Ok(())
}

/// memcached's `MEMCACHED_PORT_FILENAME`: the ports served, as `TCP INET: <port>` lines,
/// written to `<file>.lck` and then renamed to `file` (so a reader never sees half).
fn write_port_file(file: &std::path::Path, tcp: Option<SocketAddr>, udp: Option<SocketAddr>) -> Result<()> {
    let mut text = String::new();
    for (kind, addr) in [("TCP", tcp), ("UDP", udp)] {
        if let Some(a) = addr {
            text.push_str(&format!("{kind} {}: {}\n", if a.is_ipv4() { "INET" } else { "INET6" }, a.port()));
        }
    }
    let mut lck = file.as_os_str().to_owned();
    lck.push(".lck");
    std::fs::write(&lck, text).with_context(|| format!("writing {}", std::path::Path::new(&lck).display()))?;
    std::fs::rename(&lck, file).with_context(|| format!("renaming to {}", file.display()))
}

/// `netlane kv load`.
#[derive(Debug, Args)]
pub struct LoadArgs {
    /// The server (any memcached-protocol server).
    #[arg(long, default_value = "127.0.0.1:11211")]
    pub server: SocketAddr,
    /// TCP connections.
    #[arg(short = 'c', long, default_value_t = 64)]
    pub connections: u32,
    /// Threads the connections are spread over.
    #[arg(short = 't', long, default_value_t = 1)]
    pub threads: usize,
    /// CPUs the threads are pinned to (a CPU list) [default: not pinned].
    #[arg(long, value_parser = netlane::cpus::parse_online)]
    pub cpus: Option<netlane::cpus::CpuList>,
    /// Open loop: total requests per second over all connections.
    #[arg(long, conflicts_with = "closed", default_value_t = 10_000.0)]
    pub rate: f64,
    /// Arrival process of the open loop: poisson, constant or etc (Facebook's ETC gaps).
    #[arg(long, default_value = "poisson")]
    pub arrival: Process,
    /// Closed loop instead (memtier-style): this many requests in flight per connection,
    /// the next sent when one is answered; latency from the actual send.
    #[arg(long, value_name = "DEPTH")]
    pub closed: Option<u32>,
    /// The workload.
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// The server's item size limit (values are clamped to it).
    #[arg(long, default_value = "1m", value_parser = size)]
    pub item_max: usize,
    /// How long requests are scheduled (per run with --search).
    #[arg(long, default_value = "5s", value_parser = parse_positive_duration)]
    pub duration: Duration,
    /// Before the measured --duration, how long requests are sent but not measured
    /// (connections and caches settle).
    #[arg(long, default_value = "200ms", value_parser = parse_duration)]
    pub ramp: Duration,
    /// After the window, how long the last replies are awaited (then they count as
    /// unanswered).
    #[arg(long, default_value = "1s", value_parser = parse_positive_duration)]
    pub drain: Duration,
    /// Most requests in flight per connection.
    #[arg(long, default_value_t = 64)]
    pub max_in_flight: u32,
    /// A send later than this after its scheduled time is counted as late.
    #[arg(long, default_value = "100us", value_parser = parse_positive_duration)]
    pub late_after: Duration,
    /// Seed of every random draw.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Do not store every key before the run.
    #[arg(long)]
    pub no_warmup: bool,
    /// A tail-latency objective, like p99.9=1ms: the run says whether it held.
    #[arg(long)]
    pub sla: Option<Sla>,
    /// Find the highest offered rate that holds --sla (bisection over runs of
    /// --duration, the best re-run to confirm it).
    #[arg(long, requires = "sla")]
    pub search: bool,
    /// Search: the lowest rate tried.
    #[arg(long, default_value_t = 1000.0)]
    pub search_lo: f64,
    /// Search: the highest rate tried.
    #[arg(long, default_value_t = 1_000_000.0)]
    pub search_hi: f64,
    /// Search: stop when the bracket is narrower than this ratio.
    #[arg(long, default_value_t = 1.05)]
    pub resolution: f64,
    /// Search: most bisection runs.
    #[arg(long, default_value_t = 12)]
    pub max_bisections: u32,
    /// Exit 3 when the SLA was missed (a search: when no rate held it).
    #[arg(long, requires = "sla")]
    pub strict: bool,
    /// Write the results as JSON to FILE, or to stdout with `-` (the default when no FILE
    /// is given; nothing else is written to stdout then).
    #[arg(long, value_name = "FILE|-", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<std::path::PathBuf>,
}

impl LoadArgs {
    fn config(&self) -> Result<LoadConfig> {
        let item_max = u32::try_from(self.item_max).context("--item-max is too large")?;
        Ok(LoadConfig {
            server: self.server,
            connections: self.connections,
            threads: self.threads,
            cpus: self.cpus.as_ref().map(|c| c.as_slice().to_vec()),
            pacing: match self.closed {
                Some(depth) => Pacing::Closed { depth },
                None => Pacing::Open(Arrivals { process: self.arrival, rate_per_s: self.rate }),
            },
            workload: self.workload.spec(item_max),
            duration: self.duration,
            ramp: self.ramp,
            max_in_flight: self.max_in_flight,
            late_after: self.late_after,
            drain: self.drain,
            seed: self.seed,
        })
    }

    fn options(&self) -> OptionList {
        let list = OptionList::new()
            .text("server", self.server.to_string())
            .int("connections", u64::from(self.connections))
            .int("threads", self.threads as u64)
            .text("rate", self.rate.to_string())
            .text("arrival", self.arrival.to_string())
            .text("closed", self.closed.map_or("off".into(), |d| d.to_string()));
        self.workload
            .echo(list)
            .int("item-max", self.item_max as u64)
            .duration("duration", self.duration)
            .duration("ramp", self.ramp)
            .duration("drain", self.drain)
            .int("max-in-flight", u64::from(self.max_in_flight))
            .duration("late-after", self.late_after)
            .int("seed", self.seed)
            .flag("no-warmup", self.no_warmup)
            .text("sla", self.sla.map_or("none".into(), |s| s.to_string()))
            .flag("search", self.search)
    }

    fn run(&self) -> Result<u8> {
        let out = OutputArgs { json: self.json.clone(), csv: None };
        out.validate()?;
        let quiet = out.json_to_stdout();
        let opts = self.options();
        let mut doc = KvLoad {
            options: opts.object(),
            echo: opts.echo(),
            report: None,
            sla: self.sla.map(|s| s.to_string()),
            sla_met: None,
            sla_latency_us: None,
            search: None,
        };
        let cfg = self.config()?;
        cfg.validate()?;
        let range = SearchConfig {
            lo_per_s: self.search_lo,
            hi_per_s: self.search_hi,
            resolution: self.resolution,
            max_bisections: self.max_bisections,
        };
        // Every option is checked before anything is written to the server.
        if self.search {
            loadgen::check_search(&cfg, range).context("--search")?;
        }
        if !self.no_warmup {
            let t = Instant::now();
            let n = loadgen::warm_up(&cfg)?;
            eprintln!("warm-up: stored {n} keys in {:.1} s", t.elapsed().as_secs_f64());
        }
        if self.search {
            let sla = self.sla.context("--search needs --sla")?;
            let r = loadgen::search(&cfg, sla, range, &STOP, |p| {
                let m = &p.measured;
                eprintln!(
                    "  rate {:>10.0}/s run {}: offered {:>10.0}/s achieved {:>10.0}/s {} {} {}",
                    p.rate_per_s,
                    p.vote,
                    m.offered_per_s,
                    m.achieved_per_s,
                    sla,
                    m.sla_latency_ns.map_or("beyond every answer".to_string(), |n| format!("{:.0} us", n as f64 / 1e3)),
                    if p.met {
                        "held"
                    } else if m.lag_share > GENERATOR_LAG_MAX {
                        "missed (the generator lagged: it measured itself)"
                    } else {
                        "missed"
                    }
                );
            })?;
            let line = match r.best_per_s {
                Some(b) => format!(
                    "highest rate within {}: {b:.0} requests/s{} ({} runs)",
                    r.sla,
                    if r.capped {
                        " (the upper bound: the server may hold more)"
                    } else if r.generator_limited {
                        " (the generator's limit: above it, it could not keep its schedule)"
                    } else {
                        ""
                    },
                    r.runs
                ),
                None => format!("no rate from {} requests/s held {}", self.search_lo, r.sla),
            };
            if !quiet {
                out::println(&line);
            }
            let held = r.best_per_s.is_some();
            doc.search = Some(r);
            out.write_json(&report::document("kv-load", doc))?;
            return Ok(if self.strict && !held { 3 } else { 0 });
        }
        let r = loadgen::run(&cfg, &STOP)?;
        if !quiet {
            print_report(&r.report);
        }
        let mut missed = false;
        if let Some(sla) = self.sla {
            let m = r.stats.measure(&sla, cfg.duration.as_nanos() as u64);
            missed = !m.sla_met;
            doc.sla_met = Some(m.sla_met);
            doc.sla_latency_us = m.sla_latency_ns.map(|n| n as f64 / 1e3);
            if !quiet {
                out::println(&format!(
                    "SLA {sla}: {} ({})",
                    if m.sla_met { "met" } else { "missed" },
                    m.sla_latency_ns.map_or("the percentile falls among failed requests".into(), |n| format!(
                        "{:.1} us",
                        n as f64 / 1e3
                    ))
                ));
            }
        }
        let failure = r.report.failure();
        doc.report = Some(r.report);
        // The report is written whatever happened: it says what was measured.
        out.write_json(&report::document("kv-load", doc))?;
        if let Some(why) = failure {
            bail!("the measurement failed: {why} (is a memcached-protocol server listening on {}?)", self.server);
        }
        Ok(if self.strict && missed { 3 } else { 0 })
    }
}

fn print_report(r: &LoadReport) {
    let c = &r.counts;
    out::println(&format!(
        "{} loop: offered {:.0}/s achieved {:.0}/s over {:.1} s{}",
        r.mode,
        r.offered_per_s,
        r.achieved_per_s,
        r.seconds,
        r.target_per_s.map_or(String::new(), |t| format!(" (asked {t:.0}/s)"))
    ));
    out::println(&format!(
        "completed={} hits={} misses={} stored={} errors={} lost={} unanswered={} not_sent={} late={:.2}% lagged={:.2}% connection_failures={}",
        c.completed,
        c.hits,
        c.misses,
        c.stored,
        c.errors,
        c.lost,
        c.unanswered,
        c.not_sent,
        r.late_share * 100.0,
        r.lag_share * 100.0,
        r.connection_failures
    ));
    let lat: Vec<String> = r
        .latency_us
        .iter()
        .map(|(p, v)| format!("{p}={}", v.map_or("failed".to_string(), |u| format!("{u:.1}"))))
        .collect();
    out::println(&format!("latency us: {}", lat.join(" ")));
    out::println(&format!(
        "client CPU: {:.2} s, {:.0}% of its threads' time{}",
        r.client_cpu_s,
        r.client_cpu_busy * 100.0,
        if r.lag_share > GENERATOR_LAG_MAX {
            " (it delayed its own sends: the generator was the bottleneck)"
        } else if r.client_cpu_busy > 0.9 {
            " (the generator may be the bottleneck)"
        } else {
            ""
        }
    ));
}

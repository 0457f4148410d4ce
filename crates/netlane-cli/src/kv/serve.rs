//! `netlane kv serve`: arguments in (memcached's options, with memcached's meaning),
//! the server started, final counters out.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::documents::KvServe;
use anyhow::{Context, Result, bail};
use clap::Args;
use netlane::lanes::BusyPoll;
use netlane::metrics::prom::{MetricsServer, check_metrics_addr};
use netlane::serve::{Ended, Outcome};
use netlane_kv::proto::parse::Allowed;
use netlane_kv::proto::{Limits, Settings as ProtoSettings};
use netlane_kv::server::{Server, ServerConfig, Steer, UnixListen};
use netlane_kv::store::{ClassConfig, StoreConfig};
use netlane_report::options::{parse_positive_duration, parse_size_usize};

use super::megabytes;
use super::memcached_options::{
    Unsupported, drop_privileges, extended, octal_mask, port_arg, protocol_arg, write_port_file,
};
use crate::out::{self, OutputArgs};
use crate::signals::STOP;

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
    /// Off unless asked for, as in memcached: a UDP request's source address can be
    /// forged, and a 33-byte get can send back up to 1 MiB (a larger reply is an
    /// error) to whoever the forger names. Serve UDP only where sources cannot be forged.
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
    #[arg(short = 'I', long = "max-item-size", visible_alias = "item-max", default_value = "1m", value_parser = parse_size_usize)]
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
    #[command(flatten)]
    pub napi: crate::napi_args::NapiArgs,
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
    #[arg(long, default_value = "2048", value_parser = parse_size_usize)]
    pub max_line: usize,
    /// Stop reading a connection's commands while this much of its output is unsent.
    #[arg(long, default_value = "256k", value_parser = parse_size_usize)]
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
    /// Print a line of rates (gets with their hit share, sets, connections) this often
    /// while serving, on stderr.
    #[arg(long, value_parser = parse_positive_duration)]
    pub stats_interval: Option<Duration>,
    /// Print the final counters as JSON to FILE, or to stdout with `-` (the first line,
    /// `listening on ...`, then goes to stderr).
    #[arg(long, value_name = "FILE|-", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<std::path::PathBuf>,
    /// memcached options netlane does not have, refused by name.
    #[command(flatten)]
    pub unsupported: Unsupported,
    #[command(flatten)]
    pub config: crate::config_file::ConfigFile,
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
        // Two spellings of one setting (a config file may hold one, the command line the
        // other): neither silently wins.
        if let (Some(a), Some(b)) = (self.idle_timeout, ext.idle_timeout)
            && a != b
        {
            bail!("--idle-timeout {a:?} and -o idle_timeout={} disagree: give one", b.as_secs());
        }
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
            napi: self.napi.settings(),
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
            let auto = self.lanes == Some(LanesCount::Auto);
            let q = netlane::lanes::queues::lane_device(dev).context(if auto {
                "--lanes auto"
            } else {
                "--lane-device"
            })?;
            if auto {
                cfg.threads = q.napi_ids().len();
            }
        }
        if let Some(LanesCount::Count(n)) = self.lanes {
            cfg.threads = n;
        }
        cfg.lane_device = device;
        Ok(cfg)
    }

    pub(super) fn run(&self) -> Result<u8> {
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
        let mut last = (None, Duration::ZERO);
        let (outcome, s) =
            netlane::serve::supervise_ticking(server, &STOP, self.time, self.stats_interval, |server, elapsed| {
                let now = server.stats();
                eprintln!("{}", rates_line(&now, last.0.as_ref(), elapsed, elapsed.saturating_sub(last.1)));
                last = (Some(now), elapsed);
            });
        drop(metrics);
        match outcome {
            Outcome::Ended(Ended::Failed(why)) => bail!("{why}"),
            Outcome::Ended(Ended::Asked(why)) => eprintln!("{why}"),
            Outcome::Stopped | Outcome::TimeUp => {}
        }
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
        out.write_json(&netlane_report::document("kv-serve", KvServe { stats: s }))?;
        Ok(0)
    }
}

/// `[   5.0s] 80k gets/s (95.0% hits) 4k sets/s, 200 connections open, 0 new/s` over the
/// interval since `before` (the start when none).
fn rates_line(
    now: &netlane_kv::server::ServerStats,
    before: Option<&netlane_kv::server::ServerStats>,
    elapsed: Duration,
    interval: Duration,
) -> String {
    let s = interval.as_secs_f64().max(1e-9);
    let count = |st: &netlane_kv::server::ServerStats, k: &str| st.protocol.0.get(k).copied().unwrap_or(0);
    let d = |k: &str| count(now, k).saturating_sub(before.map_or(0, |b| count(b, k)));
    let (gets, hits) = (d("cmd_get"), d("get_hits"));
    let new = now.total_connections.saturating_sub(before.map_or(0, |b| b.total_connections));
    format!(
        "[{:>7.1}s] {} gets/s ({}) {} sets/s, {} connections open, {} new/s",
        elapsed.as_secs_f64(),
        netlane_report::format::si(gets as f64 / s),
        if gets == 0 {
            "no hits to count".to_string()
        } else {
            format!("{:.1}% hits", 100.0 * hits as f64 / gets as f64)
        },
        netlane_report::format::si(d("cmd_set") as f64 / s),
        now.curr_connections,
        netlane_report::format::si(new as f64 / s),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::parse_command;

    /// The lab runs `netlane kv serve` with the arguments it writes for a configuration:
    /// they must give back that configuration, option by option (the lane device is
    /// looked up when the server resolves its lanes, so it is compared as given).
    #[test]
    fn the_lab_s_server_arguments_give_back_its_configuration() {
        let base = ServerConfig {
            listen: "10.0.0.1:11311".parse().unwrap(),
            threads: 2,
            cpus: Some(vec![0, 1]),
            store: StoreConfig::new(1 << 30, 1 << 20, 64),
            max_conns: 264,
            ..ServerConfig::default()
        };
        let configs = [
            ServerConfig::default(),
            base.clone(),
            ServerConfig {
                listen: "127.0.0.1:0".parse().unwrap(),
                udp_port: Some(11400),
                store: StoreConfig { memory: 3 << 20, item_max: 512 << 10, cas: false, evictions: false, ..base.store },
                backlog: 17,
                idle_timeout: Some(Duration::from_secs(9)),
                ..base.clone()
            },
            ServerConfig {
                steer: Steer::Acceptor,
                lane_device: Some("veth-rx".into()),
                xps_rxqs: true,
                busy_poll: Some("50,8,prefer".parse().unwrap()),
                napi: netlane::topology::netdev::NapiSettings {
                    defer_hard_irqs: Some(100),
                    gro_flush_timeout_ns: Some(20_000),
                    irq_suspend_timeout_ns: Some(2_000_000),
                },
                max_lanes: Some(4),
                ..base.clone()
            },
            ServerConfig { steer: Steer::Reuseport, lane_device: Some("eth0".into()), ..base },
        ];
        for cfg in configs {
            let args = netlane_lab::scenarios::kv::kv_serve_args(&cfg);
            assert_eq!(args[..2], ["kv", "serve"]);
            let parsed = parse_command::<ServeArgs>(&args);
            assert_eq!(parsed.lane_device, cfg.lane_device, "{args:?}");
            let mut want = cfg.clone();
            // Unset, the classes are memcached's defaults for the item size.
            want.store.classes = want.store.classes.or(Some(ClassConfig::for_item_max(want.store.item_max)));
            want.lane_device = None;
            assert_eq!(format!("{:?}", parsed.config().unwrap()), format!("{want:?}"), "{args:?}");
        }
    }
}

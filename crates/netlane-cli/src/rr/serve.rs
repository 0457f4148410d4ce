//! `netlane rr serve`.

use netlane_report::options::parse_endpoint;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use netlane::metrics::prom::{MetricsServer, check_metrics_addr};
use netlane_report::options::{parse_cpu, parse_positive_duration, parse_size_usize};
use netlane_rr::proto::guard::GuardConfig;
use netlane_rr::proto::server::ResponderConfig;
use netlane_rr::server::{PaceOptions, PathKind, RingOptions, RrCounters, ServerConfig, Transport, TxKind, XdpOptions};

use super::parse_size_u32;
use crate::documents::RrServe;
use crate::out::{self, OutputArgs};
use crate::signals::STOP;

/// Who sums the UDP checksums of frames the packet transmit path writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TxChecksum {
    /// netlane, for every datagram.
    Software,
    /// The device, for a datagram that goes as one frame.
    Offload,
}

/// `netlane rr serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address and port to serve (IPv4 or IPv6; port 0 picks one), or an address or
    /// host alone (port 7070).
    #[arg(long, default_value = "127.0.0.1:7070", value_parser = |s: &str| parse_endpoint(s, Some(7070)))]
    pub listen: SocketAddr,
    /// Receive path: recvfrom, recvmmsg, tpacket-v2, tpacket-v3, af-xdp.
    #[arg(long, default_value = "recvmmsg")]
    pub path: PathKind,
    /// udp (datagrams on --path) or tcp (the comparator: the same requests and answers as
    /// messages over a TCP connection per client, on --listen's port over TCP).
    #[arg(long, default_value = "udp")]
    pub transport: Transport,
    /// TCP: the most connections served at once; more are closed as they come.
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// Datagrams per recvmmsg call.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Transmit path: socket (the service's UDP socket), packet (whole frames through a
    /// PF_PACKET transmit ring) or af-xdp (through the AF_XDP socket; --path af-xdp).
    /// Frames get their headers, checksums and IP fragments from netlane, their
    /// addresses from the kernel's routes and neighbours; a peer the kernel has not
    /// resolved yet is answered through the socket. Needs a specific --listen address.
    #[arg(long, default_value = "socket")]
    pub tx: TxKind,
    /// With --tx packet: software sums every UDP checksum in netlane; offload leaves a
    /// one-frame response's checksum to the device (PACKET_VNET_HDR; the kernel sums it
    /// for a device without the offload). A fragmented response is always summed in
    /// netlane [default: offload].
    #[arg(long, value_enum)]
    pub tx_checksum: Option<TxChecksum>,
    /// Pace responses: at most this many per second leave, a few per release, each
    /// release one sendmmsg, so a batch of answers does not wake every client at once
    /// (socket transmit, one datagram per response) [default: send at once].
    #[arg(long, value_name = "RESPONSES/S")]
    pub pace: Option<u64>,
    /// Time between paced releases.
    #[arg(long, default_value = "100us", value_parser = parse_positive_duration)]
    pub pace_quantum: Duration,
    /// Most responses waiting for their release; past it a response is dropped and
    /// counted (the client asks again).
    #[arg(long, default_value_t = 4096)]
    pub pace_queue: usize,
    /// Split responses into datagrams of this size (header included) sent with GSO;
    /// clients read them with GRO. Without it a response is one datagram (IP fragments
    /// it above the MTU).
    #[arg(long, value_parser = parse_size_usize)]
    pub segment: Option<usize>,
    /// Largest response a request may ask for (payload bytes); a request for more is
    /// answered with a refusal naming this limit. At most 65467 unsegmented, 255
    /// segments with --segment.
    #[arg(long, default_value = "16K", value_parser = parse_size_usize)]
    pub max_response: usize,
    /// A source that has not shown it receives what is sent to it (it has not echoed
    /// the server's cookie) gets at most this many times its request's bytes; past it,
    /// a Retry with the cookie (the clients send the request again with it).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub unverified_ratio: u32,
    /// Bytes a second each source that has not shown it receives may be sent; past it,
    /// Retries.
    #[arg(long, default_value = "64K", value_parser = parse_size_usize)]
    pub unverified_budget: usize,
    /// Echo every datagram back unchanged (a standard UDP echo server).
    #[arg(long)]
    pub echo: bool,
    /// CPU the server thread is pinned to.
    #[arg(long, value_parser = parse_cpu)]
    pub cpu: Option<usize>,
    /// Lanes: a thread per receive queue of this device, each pinned to its queue's CPU
    /// with its own socket in an SO_REUSEPORT group; a BPF selector gives each datagram
    /// to the lane owning the NAPI id it arrived through (needs root; socket paths only)
    #[arg(long, value_name = "DEV")]
    pub lane_device: Option<String>,
    /// Busy polling: USECS[,BUDGET[,prefer]]. The loop's epoll polls the NAPI instances
    /// of what it reads before sleeping (EPIOCSPARAMS, Linux 6.9), and each socket the
    /// path reads (every AF_XDP socket, a ring, the service socket) gets SO_BUSY_POLL,
    /// a budget other than 8 and, with prefer, SO_PREFER_BUSY_POLL (those two need
    /// CAP_NET_ADMIN); every knob is reported applied or refused, with how many packets
    /// busy polling took and each socket's NAPI id.
    #[arg(long)]
    pub busy_poll: Option<netlane::lanes::BusyPoll>,
    // Per-NAPI settings, on every NAPI instance of the device read (the lane device,
    // --iface or the one with the listen address).
    #[command(flatten)]
    pub napi: crate::napi_args::NapiArgs,
    /// Ring paths: interface to read [default: the one with the listen address; every
    /// interface for 0.0.0.0 or ::].
    #[arg(long)]
    pub iface: Option<String>,
    /// Ring paths: bytes per frame slot.
    #[arg(long, default_value = "2048", value_parser = parse_size_u32)]
    pub frame_size: u32,
    /// TPACKET_V2: frames in the ring.
    #[arg(long, default_value_t = 4096)]
    pub frames: u32,
    /// TPACKET_V3: frames per block (a block is this many frame slots; the reader wakes
    /// once per block).
    #[arg(long, default_value_t = 32)]
    pub frames_per_block: u32,
    /// TPACKET_V3: blocks in the ring.
    #[arg(long, default_value_t = 64)]
    pub blocks: u32,
    /// TPACKET_V3: a partly filled block is handed over after this many milliseconds.
    #[arg(long, default_value_t = 8)]
    pub retire_ms: u32,
    /// TPACKET_V3: rings of 4 to 128 KiB blocks, the traffic moved at run time to the
    /// largest block that keeps the request rate (at most half the burst; instead of
    /// --frames-per-block).
    #[arg(long)]
    pub adaptive: bool,
    /// AF_XDP: UMEM frames per receive queue (each queue has its own socket and UMEM;
    /// all of them must fit RLIMIT_MEMLOCK).
    #[arg(long, default_value_t = 512)]
    pub xdp_frames: u32,
    /// AF_XDP: bytes per UMEM frame (2048 or 4096).
    #[arg(long, default_value_t = 2048)]
    pub xdp_frame_size: u32,
    /// AF_XDP: RX and fill ring entries (a power of two).
    #[arg(long, default_value_t = 512)]
    pub xdp_ring: u32,
    /// AF_XDP: bind in copy mode without trying zero-copy first.
    #[arg(long)]
    pub xdp_copy: bool,
    /// Stop after this long [default: run until SIGINT/SIGTERM].
    #[arg(short = 't', long, value_parser = parse_positive_duration)]
    pub time: Option<Duration>,
    /// Print a line of rates (responses, frames, refusals, errors per second) this often
    /// while serving, on stderr.
    #[arg(long, value_parser = parse_positive_duration)]
    pub stats_interval: Option<Duration>,
    /// Serve /metrics (Prometheus: every counter as netlane_rr_<name>_total) over HTTP on
    /// this loopback address.
    #[arg(long, value_parser = |s: &str| s.parse::<SocketAddr>().map_err(|e| e.to_string()).and_then(|a| check_metrics_addr(a).map(|()| a)))]
    pub metrics_addr: Option<SocketAddr>,
    /// Print the final counters as JSON to FILE, or to stdout with `-` (the first line,
    /// `listening on ...`, then goes to stderr).
    #[arg(long, value_name = "FILE|-", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub config: crate::config_file::ConfigFile,
}

/// `[   5.0s] 20.1k responses/s 20.1k frames/s, refused 0/s, send errors 0/s` over the
/// last interval.
fn rates_line(d: &RrCounters, elapsed: Duration, interval: Duration) -> String {
    let per_s = |n: u64| netlane_report::format::si(n as f64 / interval.as_secs_f64().max(1e-9));
    format!(
        "[{:>7.1}s] {} responses/s {} frames/s, refused {}/s, retries sent {}/s, send errors {}/s, receive errors {}/s",
        elapsed.as_secs_f64(),
        per_s(d.responses),
        per_s(d.frames),
        per_s(d.refused_malformed + d.refused_not_request + d.refused_too_large),
        per_s(d.retries_sent),
        per_s(d.send_errors + d.send_dropped),
        per_s(d.recv_errors),
    )
}

impl ServeArgs {
    /// The server configuration these arguments give.
    fn config(&self) -> Result<ServerConfig> {
        if self.tx_checksum.is_some() && self.tx != TxKind::Packet {
            anyhow::bail!("--tx-checksum applies to --tx packet only (this is --tx {})", self.tx);
        }
        Ok(ServerConfig {
            listen: self.listen,
            path: self.path,
            batch: self.batch,
            responder: ResponderConfig {
                max_response: u32::try_from(self.max_response)
                    .with_context(|| format!("--max-response {}", self.max_response))?,
                segment: self.segment,
                echo: self.echo,
            },
            cpu: self.cpu,
            duration: self.time,
            iface: self.iface.clone(),
            ring: RingOptions {
                frame_size: self.frame_size,
                frames: self.frames,
                frames_per_block: self.frames_per_block,
                blocks: self.blocks,
                retire_ms: self.retire_ms,
                adaptive: self.adaptive,
            },
            xdp: XdpOptions {
                frame_size: self.xdp_frame_size,
                frames: self.xdp_frames,
                ring_size: self.xdp_ring,
                zero_copy: !self.xdp_copy,
                transmit: false,
            },
            tx: self.tx,
            tx_checksum_offload: self.tx_checksum != Some(TxChecksum::Software),
            pace: self.pace.map(|rate| PaceOptions { rate, quantum: self.pace_quantum, queue: self.pace_queue }),
            lane_device: self.lane_device.clone(),
            busy_poll: self.busy_poll,
            napi: self.napi.settings(),
            guard: GuardConfig {
                ratio: self.unverified_ratio,
                budget: self.unverified_budget as u64,
                ..GuardConfig::default()
            },
            transport: self.transport,
            max_connections: self.max_connections,
            ..ServerConfig::default()
        })
    }

    pub(super) fn run(&self) -> Result<u8> {
        let out = OutputArgs { json: self.json.clone(), csv: None };
        out.validate()?;
        let mut cfg = self.config()?;
        cfg.validate()?;
        let to_stdout = out.json_to_stdout();
        // The supervisor owns the time: a server that ends by itself has failed.
        let time = cfg.duration.take();
        let server = netlane_rr::server::Server::start(cfg)?;
        let metrics = self
            .metrics_addr
            .map(|a| MetricsServer::start(a, "rr-metrics", server.metrics_handler()))
            .transpose()
            .context("starting the metrics endpoint")?;
        let (path, tx) = match self.transport {
            Transport::Tcp => ("tcp".to_string(), "tcp".to_string()),
            Transport::Udp => (self.path.to_string(), self.tx.to_string()),
        };
        let l = format!(
            "listening on {} path={path} tx={tx}{}{}",
            server.local_addr(),
            if self.echo { " echo" } else { "" },
            metrics.as_ref().map_or(String::new(), |m| format!(" metrics=http://{}/metrics", m.local_addr()))
        );
        if to_stdout {
            eprintln!("{l}");
        } else {
            out::println(&l);
        }
        let mut last = (RrCounters::default(), Duration::ZERO);
        let (_, stats) =
            netlane::serve::supervise_ticking(server, &STOP, time, self.stats_interval, |server, elapsed| {
                let now = server.counters();
                eprintln!("{}", rates_line(&now.minus(&last.0), elapsed, elapsed.saturating_sub(last.1)));
                last = (now, elapsed);
            });
        drop(metrics);
        let stats = stats?;
        if !to_stdout {
            out::println(&format!(
                "stopped after {:.1} s: frames={} responses={} datagrams_sent={} gso_sends={} refused={} retries_sent={} verified_requests={} \
                 send_dropped={} send_errors={} recv_errors={} wakeups={} frames_per_wakeup={:.2} syscalls_per_response={:.2} \
                 busy={:.1}% ring_drops={} ring_freezes={} ring_fragments={} ring_bad_checksums={} ring_skipped={}",
                stats.seconds,
                stats.counters.frames,
                stats.counters.responses,
                stats.counters.datagrams_sent,
                stats.counters.gso_sends,
                stats.counters.refused_malformed
                    + stats.counters.refused_not_request
                    + stats.counters.refused_too_large,
                stats.counters.retries_sent,
                stats.counters.verified_requests,
                stats.counters.send_dropped,
                stats.counters.send_errors,
                stats.counters.recv_errors,
                stats.counters.wakeups,
                stats.frames_per_wakeup,
                stats.syscalls_per_response,
                stats.busy * 100.0,
                stats.counters.ring_drops,
                stats.counters.ring_freezes,
                stats.counters.ring_fragments,
                stats.counters.ring_bad_checksums,
                stats.counters.ring_skipped,
            ));
            if let (Some(sw), Some(b)) = (stats.adaptive_switches, stats.adaptive_block) {
                out::println(&format!("adaptive: {sw} ring switches, {b}-byte blocks at the end"));
            }
            for k in &stats.napi {
                out::println(&format!("napi: {k}"));
            }
            if let Some(b) = &stats.busy_poll {
                for k in &b.knobs {
                    out::println(&format!("busy poll: {k}"));
                }
                out::println(&format!(
                    "busy poll {}: {} packets taken by busy polling in this namespace; NAPI ids: {}{}",
                    b.policy,
                    b.rx_packets.map_or("unknown".into(), |n| n.to_string()),
                    b.napi_ids
                        .iter()
                        .map(|(what, id)| format!("{what} {}", id.map_or("unread".into(), |i| i.to_string())))
                        .collect::<Vec<_>>()
                        .join(", "),
                    if b.napi_ids.iter().any(|(_, id)| *id == Some(0)) {
                        " (0: the kernel gave that socket no NAPI instance, so there was none to poll)"
                    } else {
                        ""
                    }
                ));
            }
            if let Some(x) = &stats.xdp {
                out::println(&format!(
                    "af-xdp: {} XDP, {} copy, {} queues: redirected={} passed={} via_stack={} fill_ring_empty={}",
                    x.mode,
                    if x.zero_copy { "zero" } else { "kernel" },
                    x.queues,
                    x.redirected,
                    x.passed,
                    x.via_stack,
                    x.fill_ring_empty
                ));
                for (what, why) in [("native XDP", &x.native_refused), ("zero-copy", &x.zero_copy_refused)] {
                    if let Some(why) = why {
                        out::println(&format!("af-xdp: {what} was tried first and refused: {why}"));
                    }
                }
            }
            if let Some(p) = &stats.paced {
                out::println(&format!(
                    "paced at {}/s every {:.0} us: sent={} releases={} sendmmsg_calls={} queue_max={} \
                     queue_full_drops={} wait mean {:.1} us max {:.1} us",
                    p.rate,
                    p.quantum_us,
                    p.sent,
                    p.releases,
                    p.sendmmsg_calls,
                    p.queue_max,
                    p.queue_full_drops,
                    p.mean_wait_us,
                    p.max_wait_us
                ));
            }
            if let Some(r) = &stats.raw_tx {
                out::println(&format!(
                    "tx {}: datagrams={} fragmented={} frames={} kicks={} via_socket: loopback={} unresolved={} \
                     no_route={} other_interface={}; ring_full_drops={} via_socket_error={} route lookups: cached={} \
                     asked={} notifications={} invalidated={} flushes={}",
                    stats.tx,
                    r.datagrams,
                    r.fragmented,
                    r.frames,
                    r.kicks,
                    r.via_socket_loopback,
                    r.via_socket_unresolved,
                    r.via_socket_no_route,
                    r.via_socket_other_interface,
                    r.ring_full_drops,
                    r.via_socket_error,
                    r.nexthops.hits,
                    r.nexthops.misses,
                    r.nexthops.events,
                    r.nexthops.invalidated,
                    r.nexthops.flushes,
                ));
            }
        }
        out.write_json(&netlane_report::document("rr-serve", RrServe { stats }))?;
        Ok(0)
    }
}

#[cfg(test)]
mod tests {
    use netlane_rr::proto::server::ResponderConfig;

    use super::*;
    use crate::testing::parse_command;

    /// The lab runs `netlane rr serve` with the arguments it writes for a configuration:
    /// they must give back that configuration, option by option.
    #[test]
    fn the_lab_s_server_arguments_give_back_its_configuration() {
        let base = ServerConfig { listen: "10.0.0.1:7070".parse().unwrap(), cpu: Some(1), ..ServerConfig::default() };
        let configs = [
            ServerConfig::default(),
            base.clone(),
            ServerConfig {
                path: PathKind::TpacketV3,
                ring: RingOptions {
                    frame_size: 4096,
                    frames_per_block: 3,
                    blocks: 64,
                    retire_ms: 2,
                    ..RingOptions::default()
                },
                pace: Some(PaceOptions { rate: 123_456, quantum: Duration::from_micros(150), queue: 99 }),
                duration: Some(Duration::from_millis(2500)),
                ..base.clone()
            },
            ServerConfig {
                path: PathKind::TpacketV3,
                ring: RingOptions { adaptive: true, ..RingOptions::default() },
                responder: ResponderConfig { segment: Some(1472), max_response: 60_000, echo: true },
                guard: GuardConfig { ratio: 5, budget: 1 << 20, ..GuardConfig::default() },
                iface: Some("veth-rx".into()),
                ..base.clone()
            },
            ServerConfig {
                path: PathKind::AfXdp,
                tx: TxKind::AfXdp,
                xdp: XdpOptions { frames: 1024, frame_size: 4096, ring_size: 256, zero_copy: false, transmit: false },
                batch: 32,
                ..base.clone()
            },
            ServerConfig { lane_device: Some("eth0".into()), cpu: None, ..base.clone() },
            ServerConfig { transport: Transport::Tcp, max_connections: 77, ..base.clone() },
            ServerConfig {
                busy_poll: Some("20,16,prefer".parse().unwrap()),
                napi: netlane::topology::netdev::NapiSettings {
                    defer_hard_irqs: Some(2),
                    gro_flush_timeout_ns: Some(200_000),
                    irq_suspend_timeout_ns: Some(20_000_000),
                },
                ..base
            },
        ];
        for cfg in configs {
            let args = netlane_lab::scenarios::rr::serve_args(&cfg);
            assert_eq!(args[..2], ["rr", "serve"]);
            let parsed = parse_command::<ServeArgs>(&args);
            assert_eq!(format!("{:?}", parsed.config().unwrap()), format!("{cfg:?}"), "{args:?}");
        }
    }
}

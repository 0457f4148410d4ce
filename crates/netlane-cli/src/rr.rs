//! `netlane rr serve` and `netlane rr clients`: arguments in, library calls, output.

use std::net::SocketAddr;
use std::time::Duration;

use crate::documents::{RrClients, RrServe};
use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use netlane::cpus::CpuList;
use netlane_report::options::{parse_cpu, parse_duration, parse_positive_duration, parse_size_usize};
use netlane_rr::clients::{ClientsConfig, Load};
use netlane_rr::proto::client::ClientConfig;
use netlane_rr::proto::guard::GuardConfig;
use netlane_rr::proto::server::ResponderConfig;
use netlane_rr::proto::wire::HEADER_LEN;
use netlane_rr::server::{PaceOptions, PathKind, RingOptions, ServerConfig, TxKind, XdpOptions};

use crate::out::{self, OutputArgs};
use crate::signals::{STOP, StartGate};

/// Datagram request/response service.
#[derive(Debug, Subcommand)]
pub enum RrCmd {
    /// Serve requests on one receive path until SIGINT/SIGTERM (or --time); then print
    /// the final counters and exit 0.
    Serve(Box<ServeArgs>),
    /// Run a client population against a server (ours, or any UDP echo server with
    /// --echo) and print throughput, latency and what went wrong.
    Clients(Box<ClientsArgs>),
}

/// Runs an `rr` command.
pub fn run(cmd: RrCmd) -> Result<u8> {
    match cmd {
        RrCmd::Serve(a) => a.run(),
        RrCmd::Clients(a) => a.run(),
    }
}

fn parse_size_u32(s: &str) -> Result<u32, String> {
    u32::try_from(parse_size_usize(s)?).map_err(|_| format!("{s} is too large"))
}

/// `netlane rr serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address and port to serve (IPv4 or IPv6; port 0 picks one).
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: SocketAddr,
    /// Receive path: recvfrom, recvmmsg, tpacket-v2, tpacket-v3, af-xdp.
    #[arg(long, default_value = "recvmmsg")]
    pub path: PathKind,
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
    /// Print the final counters as JSON to FILE, or to stdout with `-` (the first line,
    /// `listening on ...`, then goes to stderr).
    #[arg(long, value_name = "FILE|-", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<std::path::PathBuf>,
}

impl ServeArgs {
    /// The server configuration these arguments give.
    fn config(&self) -> Result<ServerConfig> {
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
            pace: self.pace.map(|rate| PaceOptions { rate, quantum: self.pace_quantum, queue: self.pace_queue }),
            lane_device: self.lane_device.clone(),
            guard: GuardConfig {
                ratio: self.unverified_ratio,
                budget: self.unverified_budget as u64,
                ..GuardConfig::default()
            },
            ..ServerConfig::default()
        })
    }

    fn run(&self) -> Result<u8> {
        let out = OutputArgs { json: self.json.clone(), csv: None };
        out.validate()?;
        let mut cfg = self.config()?;
        cfg.validate()?;
        let to_stdout = out.json_to_stdout();
        // The supervisor owns the time: a server that ends by itself has failed.
        let time = cfg.duration.take();
        let server = netlane_rr::server::Server::start(cfg)?;
        let l = format!(
            "listening on {} path={} tx={}{}",
            server.local_addr(),
            self.path,
            self.tx,
            if self.echo { " echo" } else { "" }
        );
        if to_stdout {
            eprintln!("{l}");
        } else {
            out::println(&l);
        }
        let (_, stats) = netlane::serve::supervise(server, &STOP, time);
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

/// `netlane rr clients`.
#[derive(Debug, Args)]
pub struct ClientsArgs {
    /// Server address (IPv4 or IPv6).
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub server: SocketAddr,
    /// Clients, each with its own socket.
    #[arg(long, default_value_t = 64)]
    pub clients: usize,
    /// Threads the clients are spread over.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// CPUs the threads are pinned to, as a CPU list (thread i on the i-th) [default: unbound].
    #[arg(long, value_parser = netlane::cpus::parse_online)]
    pub cpus: Option<CpuList>,
    /// Request size in bytes (header included; at least 40).
    #[arg(long, default_value = "512", value_parser = parse_size_usize)]
    pub request: usize,
    /// Response size in bytes (header included; at least 40).
    #[arg(long, default_value = "8K", value_parser = parse_size_usize)]
    pub response: usize,
    /// The server echoes (a standard UDP echo server): the response is the request.
    #[arg(long)]
    pub echo: bool,
    /// Closed loop: think time between a response and the next request.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub think: Duration,
    /// Open loop: Poisson arrivals at this many requests per second in all (instead of
    /// the closed loop).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Open loop: most requests in flight per client.
    #[arg(long, default_value_t = 64)]
    pub in_flight: usize,
    /// Send a request again when its response has not come within this.
    #[arg(long, default_value = "200ms", value_parser = parse_positive_duration)]
    pub timeout: Duration,
    /// Retransmissions before a request is given up (counted as lost).
    #[arg(long, default_value_t = 3)]
    pub retries: u32,
    /// Read responses with UDP_GRO (for a server sending segments with --segment).
    #[arg(long)]
    pub gro: bool,
    /// Measured time.
    #[arg(short = 't', long, default_value = "5s", value_parser = parse_positive_duration)]
    pub time: Duration,
    /// Time before measuring starts.
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    pub ramp: Duration,
    /// Mixed into the open loop's arrival times (runs with different seeds send at
    /// different moments).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Run as one agent of a population that the lab coordinates (it starts this): make
    /// every socket, say `ready` on standard error, start on SIGUSR1 (within a minute),
    /// and write the run's whole latency histogram with its report.
    #[arg(long)]
    pub agent: bool,
    /// Write the results as JSON to FILE, or to stdout with `-` (the default when no FILE
    /// is given; nothing else is written to stdout then).
    #[arg(long, value_name = "FILE|-", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<std::path::PathBuf>,
}

impl ClientsArgs {
    /// The population these arguments give.
    fn config(&self) -> Result<ClientsConfig> {
        if self.response < HEADER_LEN && !self.echo {
            bail!("--response {}: at least {HEADER_LEN} bytes (the header)", self.response);
        }
        let response_len = u32::try_from(self.response.saturating_sub(HEADER_LEN))
            .with_context(|| format!("--response {}", self.response))?;
        let (load, max_outstanding) = match self.rate {
            Some(rate) => (Load::Open { rate }, self.in_flight),
            None => (Load::Closed { think: self.think }, 1),
        };
        Ok(ClientsConfig {
            server: self.server,
            clients: self.clients,
            threads: self.threads,
            cpus: self.cpus.clone(),
            client: ClientConfig {
                request_len: self.request,
                response_len,
                echo: self.echo,
                timeout_ns: self.timeout.as_nanos() as u64,
                max_retries: self.retries,
                max_outstanding,
            },
            load,
            ramp: self.ramp,
            duration: self.time,
            gro: self.gro,
            seed: self.seed,
        })
    }

    fn run(&self) -> Result<u8> {
        let out = OutputArgs { json: self.json.clone(), csv: None };
        out.validate()?;
        let cfg = self.config()?;
        cfg.validate()?;
        if self.agent {
            // The coordinator judges the run, so one that measured nothing is written and
            // exits 0 like any other.
            let gate = StartGate::register()?;
            let ready = format!("ready: {} clients to {}", cfg.clients, cfg.server);
            let (report, hist) = netlane_rr::clients::run_gated(&cfg, STOP.flag(), || {
                gate.wait(&ready).map_err(netlane_rr::clients::ClientsError::Invalid)
            })?;
            let agent = Some(netlane_rr::clients::AgentOutput::of(&hist));
            out.write_json(&netlane_report::document("rr-clients", RrClients { report, agent }))?;
            return Ok(0);
        }
        let rep = netlane_rr::clients::run(&cfg, STOP.flag())?;
        if !out.json_to_stdout() {
            let l = &rep.latency_ns;
            out::println(&format!(
                "{} clients ({} loop) -> {}: {:.0} responses/s over {:.1} s, latency p50 {:.1} us p99 {:.1} us \
                 p99.99 {:.1} us max {:.1} us",
                rep.clients,
                rep.load,
                rep.server,
                rep.responses_per_s,
                rep.seconds,
                l.p50 as f64 / 1e3,
                l.p99 as f64 / 1e3,
                l.p9999 as f64 / 1e3,
                l.max as f64 / 1e3,
            ));
            out::println(&format!(
                "requests={} responses={} retransmits={} lost={} late={} duplicates={} corrupt={} mismatched={} \
                 arrivals_dropped={} send_errors={} recv_errors={} in_flight_at_end={} cpu_s={:.3} wakeups={} \
                 woken_per_wakeup={:.2} max_woken={} woken_in_herds={} (wake-ups of {}+ sockets)",
                rep.requests,
                rep.responses,
                rep.retransmits,
                rep.lost,
                rep.late,
                rep.duplicates,
                rep.corrupt,
                rep.mismatched,
                rep.arrivals_dropped,
                rep.send_errors,
                rep.recv_errors,
                rep.in_flight_at_end,
                rep.cpu_s,
                rep.wakeups,
                if rep.wakeups > 0 { rep.woken_sockets as f64 / rep.wakeups as f64 } else { 0.0 },
                rep.max_woken_sockets,
                rep.herd_woken_sockets,
                netlane_rr::clients::HERD,
            ));
        }
        let nothing = rep.responses == 0;
        let doc = netlane_report::document("rr-clients", RrClients { report: rep, agent: None });
        out.write_json(&doc)?;
        if nothing {
            let r = &doc.body.report;
            bail!(
                "no response from {} in {:.1} s ({} requests, {} retransmits, {} receive errors such as ICMP port \
                 unreachable)",
                r.server,
                r.seconds,
                r.requests,
                r.retransmits,
                r.recv_errors
            );
        }
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
            ServerConfig { lane_device: Some("eth0".into()), cpu: None, ..base },
        ];
        for cfg in configs {
            let args = netlane_lab::scenarios::rr::serve_args(&cfg);
            assert_eq!(args[..2], ["rr", "serve"]);
            let parsed = parse_command::<ServeArgs>(&args);
            assert_eq!(format!("{:?}", parsed.config().unwrap()), format!("{cfg:?}"), "{args:?}");
        }
    }

    /// The same for the lab's client populations: closed and open loop.
    #[test]
    fn the_lab_s_client_arguments_give_back_its_population() {
        let closed = ClientsConfig {
            server: "10.0.0.1:7070".parse().unwrap(),
            clients: 64,
            threads: 1,
            cpus: Some(CpuList::one(0)),
            client: ClientConfig {
                request_len: 512,
                response_len: 8192 - HEADER_LEN as u32,
                echo: false,
                timeout_ns: 500_000_000,
                max_retries: 5,
                max_outstanding: 1,
            },
            load: Load::Closed { think: Duration::from_micros(250) },
            ramp: Duration::from_millis(300),
            duration: Duration::from_millis(2500),
            gro: false,
            seed: 0,
        };
        let open = ClientsConfig {
            load: Load::Open { rate: 25_000.5 },
            client: ClientConfig { max_outstanding: 8, echo: true, ..closed.client },
            threads: 2,
            cpus: None,
            gro: true,
            seed: 3,
            ..closed.clone()
        };
        for cfg in [closed, open] {
            let args = netlane_lab::scenarios::rr::clients_args(&cfg);
            assert_eq!(args[..2], ["rr", "clients"]);
            let parsed = parse_command::<ClientsArgs>(&args);
            assert_eq!(format!("{:?}", parsed.config().unwrap()), format!("{cfg:?}"), "{args:?}");
        }
    }
}

//! The rr scenario's plan: its modes (each part's server and clients), their labels,
//! the TPACKET_V3 block geometry, and the CPU each end of the veth pair runs on.

use std::net::SocketAddr;
use std::time::Duration;

use netlane::cpus::CpuList;
use netlane::topology::netdev::NapiSettings;
use netlane::topology::{LinkConfig, RxTuning};
use netlane_rr::clients::{ClientsConfig, Load};
use netlane_rr::proto::client::ClientConfig;
use netlane_rr::proto::wire::HEADER_LEN;
use netlane_rr::server::{PaceOptions, PathKind as RxPathKind, RingOptions, ServerConfig, TxKind};

use super::*;

/// Client counts of the block sweep (the default of `--block-clients`).
pub const BLOCK_CLIENTS: [usize; 4] = [16, 32, 64, 128];
/// Client counts of the wall.
pub const WALL_CLIENTS: [usize; 8] = [1, 2, 4, 8, 16, 32, 64, 128];

/// The pace part's modes.
pub(super) const PACE: [&str; 2] = ["unpaced", "paced"];

/// Response sizes of the tx part.
pub(super) const TX_SIZES: [usize; 2] = [1024, 8192];

pub(super) fn tx_label(tx: TxKind, size: usize) -> String {
    format!("{tx}, {} KiB", size / 1024)
}

/// The tx part's packet-ring run that sums every checksum in user space (the others
/// leave a one-frame response's to the device), at the size that goes as one frame.
pub(super) fn tx_software_checksum_label() -> String {
    format!("{}, checksums summed here", tx_label(TxKind::Packet, TX_SIZES[0]))
}

/// How a think time reads in labels: "no think", "think 3ms".
pub(super) fn think_name(think: Duration) -> String {
    if think.is_zero() {
        "no think".into()
    } else {
        format!("think {}", netlane::metrics::units::format_duration(think))
    }
}

/// The paths the talk compared throughput on, with clients on several CPUs.
pub(super) const WIDE_PATHS: [RxPathKind; 2] = [RxPathKind::Recvfrom, RxPathKind::TpacketV2];

/// A receive path with the clients on `cpus` CPUs.
pub(super) fn wide_label(p: RxPathKind, cpus: usize) -> String {
    format!("{p}, clients on {cpus} CPUs")
}

/// A receive path on every receive queue.
pub(super) fn queues_label(p: RxPathKind) -> String {
    format!("{p}, every queue")
}

/// A fixed TPACKET_V3 ring of `bytes` blocks at `clients` pausing `think`.
pub(super) fn block_label(bytes: usize, clients: usize, think: Duration) -> String {
    format!("{} KiB, {clients} clients, {}", bytes / 1024, think_name(think))
}

pub(super) fn adaptive_label(clients: usize, think: Duration) -> String {
    format!("adaptive, {clients} clients, {}", think_name(think))
}

/// The requests of `request` bytes a block of `bytes` holds (after its 48-byte header).
pub(super) fn block_holds(bytes: usize, request: usize) -> usize {
    bytes.saturating_sub(48) / v3_request_footprint(request, false)
}

/// The busy part's receive paths.
pub(super) const BUSY_PATHS: [RxPathKind; 2] = [RxPathKind::Recvmmsg, RxPathKind::AfXdp];

/// The busy part's lanes mode.
pub(super) const BUSY_LANES: &str = "recvmmsg lanes busy polling";

/// How the busy part's server of a path waits for requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wait {
    /// Asleep in epoll until the NAPI thread hands it datagrams.
    Sleep,
    /// Busy polling before it sleeps.
    Poll,
    /// Busy polling with `prefer`, the device's interrupts deferred (per NAPI): the
    /// server runs its queue's instance alone while it keeps finding requests.
    Deferred,
}

impl Wait {
    pub(super) const ALL: [Wait; 3] = [Wait::Sleep, Wait::Poll, Wait::Deferred];
}

/// The per-NAPI settings of the deferred mode: two empty polls before the device's
/// interrupt comes back, and a 20 us watchdog (the timeout the hard-IRQ deferral's
/// commit used) that polls the instance meanwhile when nobody else does.
pub(super) const DEFERRED: NapiSettings =
    NapiSettings { defer_hard_irqs: Some(2), gro_flush_timeout_ns: Some(20_000), irq_suspend_timeout_ns: None };

pub(super) fn busy_label(p: RxPathKind, wait: Wait) -> String {
    match wait {
        Wait::Sleep => p.name().to_string(),
        Wait::Poll => format!("{p} busy polling"),
        Wait::Deferred => format!("{p} busy polling, deferred"),
    }
}

pub(super) fn wall_label(p: RxPathKind, clients: usize) -> String {
    format!("{p} x{clients}")
}

/// Bytes one request takes in a TPACKET_V3 block: the frame header (tpacket3_hdr and
/// sockaddr_ll, 16-aligned), the MAC offset that puts the IP header 16-aligned, the
/// frame, rounded to 8 (af_packet.c: tpacket_rcv, TOTAL_PKT_LEN_INCL_ALIGN).
pub fn v3_request_footprint(request: usize, ipv6: bool) -> usize {
    let hdr = (48 + 20usize).div_ceil(16) * 16;
    let mac_off = hdr + 16 - 14;
    let frame = 14 + if ipv6 { 40 } else { 20 } + 8 + request;
    (mac_off + frame).div_ceil(8) * 8
}

/// The V3 block that holds `n` requests (plus the 48-byte block header), in pages, and
/// how many it then really holds.
pub fn v3_block_for(n: u32, request: usize, ipv6: bool) -> (u32, u32) {
    let page = netlane_sys::packet::page_size();
    let fp = v3_request_footprint(request, ipv6);
    let bytes = (48 + n as usize * fp).div_ceil(page) * page;
    (bytes as u32, ((bytes - 48) / fp) as u32)
}

/// One mode: a part's server and client population, on a veth pair of `mtu`.
#[derive(Debug, Clone)]
pub(super) struct Mode {
    pub(super) part: Part,
    pub(super) label: String,
    pub(super) mtu: u32,
    pub(super) server: ServerConfig,
    pub(super) clients: ClientsConfig,
}

/// Receive queues of the veth pair a lanes mode runs on (one lane each).
pub(super) const LANE_QUEUES: u32 = 2;

/// The veth pair a mode runs on: its MTU and receive queues.
pub(super) type Net = (u32, u32);

impl Mode {
    /// The veth pair it runs on: lanes need a queue each, and the queues part several;
    /// every other mode one.
    pub(super) fn net(&self) -> Net {
        let several = self.server.lane_device.is_some() || self.part == Part::Queues;
        (self.mtu, if several { LANE_QUEUES } else { 1 })
    }

    /// What its runs and flags are called: the part and the mode's label.
    pub(super) fn what(&self) -> String {
        format!("{} {}", self.part.name(), self.label)
    }
}

impl RrBenchArgs {
    /// Every part's modes, in the order of `--parts`, the server listening on `addr`.
    pub(super) fn modes(&self, addr: SocketAddr) -> Vec<Mode> {
        self.parts.iter().flat_map(|&part| self.part_modes(part, addr)).collect()
    }

    /// One part's modes.
    fn part_modes(&self, part: Part, addr: SocketAddr) -> Vec<Mode> {
        let mut modes = Vec::new();
        let mut m = |label: String, mtu, server, clients| modes.push(Mode { part, label, mtu, server, clients });
        let clients = |n: usize, response: usize, time: Duration| self.population(addr, n, response, time, self.think);
        let server = |path: RxPathKind, block: u32| self.server(addr, path, block);
        match part {
            Part::Paths => {
                for p in &self.paths {
                    m(
                        p.name().into(),
                        self.mtu,
                        server(*p, self.block),
                        clients(self.clients, self.response, self.time),
                    );
                }
                for (label, server, clients) in self.wide_modes(addr) {
                    m(label, self.mtu, server, clients);
                }
            }
            Part::Blocks => {
                for &think in &self.block_thinks {
                    for &c in &self.block_clients {
                        let thinking = self.population(addr, c, self.response, self.time, think);
                        for &b in &self.block_sizes {
                            let fixed = self.server_sized(addr, RxPathKind::TpacketV3, b);
                            m(block_label(b, c, think), self.mtu, fixed, thinking.clone());
                        }
                        let mut adaptive = server(RxPathKind::TpacketV3, self.block);
                        adaptive.ring.adaptive = true;
                        m(adaptive_label(c, think), self.mtu, adaptive, thinking);
                    }
                }
            }
            Part::Wall => {
                let t = self.time.min(Duration::from_secs(1));
                for p in &self.paths {
                    for c in WALL_CLIENTS {
                        m(wall_label(*p, c), self.mtu, server(*p, self.block), clients(c, self.response, t));
                    }
                }
            }
            Part::Large => modes.extend(self.large_modes(addr)),
            Part::Tcp => modes.extend(self.tcp_modes(addr)),
            Part::Pace => {
                let open = ClientsConfig {
                    load: Load::Open { rate: self.pace_load as f64 },
                    client: ClientConfig { max_outstanding: 8, ..self.client(self.response) },
                    ..clients(self.clients, self.response, self.time)
                };
                let unpaced = server(RxPathKind::TpacketV3, self.block);
                let paced = ServerConfig { pace: Some(self.pace_options()), ..unpaced.clone() };
                m(PACE[0].into(), self.mtu, unpaced, open.clone());
                m(PACE[1].into(), self.mtu, paced, open);
            }
            Part::Busy => {
                let c = ClientsConfig {
                    load: Load::Open { rate: self.busy_load as f64 },
                    client: ClientConfig { max_outstanding: 8, ..self.client(self.response) },
                    ..clients(self.clients, self.response, self.time)
                };
                for p in BUSY_PATHS {
                    for wait in Wait::ALL {
                        let base = server(p, self.block);
                        let cfg = match wait {
                            Wait::Sleep => base,
                            Wait::Poll => ServerConfig { busy_poll: Some(self.busy_poll), ..base },
                            Wait::Deferred => ServerConfig {
                                busy_poll: Some(netlane::lanes::BusyPoll { prefer: true, ..self.busy_poll }),
                                napi: DEFERRED,
                                ..base
                            },
                        };
                        m(busy_label(p, wait), self.mtu, cfg, c.clone());
                    }
                }
                // The datagram service's lanes: a socket per receive queue, each read by
                // a thread that busy polls its own queue.
                let lanes = ServerConfig {
                    lane_device: Some(netlane::topology::TwoHosts::RX_IF.to_string()),
                    cpu: None,
                    busy_poll: Some(self.busy_poll),
                    ..server(RxPathKind::Recvmmsg, self.block)
                };
                m(BUSY_LANES.to_string(), self.mtu, lanes, c);
            }
            Part::Queues => {
                for p in &self.paths {
                    m(
                        queues_label(*p),
                        self.mtu,
                        server(*p, self.block),
                        clients(self.clients, self.response, self.time),
                    );
                }
            }
            Part::Tx => {
                for size in TX_SIZES {
                    for tx in TxKind::ALL {
                        let server = ServerConfig { tx, ..server(RxPathKind::AfXdp, self.block) };
                        m(tx_label(tx, size), self.mtu, server, clients(self.clients, size, self.time));
                    }
                }
                let software = ServerConfig {
                    tx: TxKind::Packet,
                    tx_checksum_offload: false,
                    ..server(RxPathKind::AfXdp, self.block)
                };
                m(tx_software_checksum_label(), self.mtu, software, clients(self.clients, TX_SIZES[0], self.time));
            }
        }
        modes
    }

    /// One client: `--request` bytes out, `response` bytes back (header included).
    fn client(&self, response: usize) -> ClientConfig {
        ClientConfig {
            request_len: self.request,
            response_len: (response.max(HEADER_LEN) - HEADER_LEN) as u32,
            echo: false,
            timeout_ns: 500_000_000,
            max_retries: 5,
            max_outstanding: 1,
        }
    }

    /// `n` closed-loop clients on the client CPU (on a testbed: its client hosts'),
    /// pausing `think` between requests.
    pub(super) fn population(
        &self,
        addr: SocketAddr,
        n: usize,
        response: usize,
        time: Duration,
        think: Duration,
    ) -> ClientsConfig {
        ClientsConfig {
            server: addr,
            clients: n,
            threads: 1,
            // On a testbed the client hosts' own CPUs place the clients (or nothing does).
            cpus: self.on.testbed.is_none().then(|| CpuList::one(self.client_cpu)),
            client: self.client(response),
            load: Load::Closed { think },
            ramp: self.ramp,
            duration: time,
            gro: false,
            seed: 0,
            transport: netlane_rr::clients::Transport::Udp,
        }
    }

    /// The CPUs a client thread each can have beside the server: those given, or every
    /// CPU but the server's on this machine (none on a testbed, whose client hosts place
    /// their own).
    pub(super) fn wide_client_cpus(&self) -> CpuList {
        if self.on.testbed.is_some() {
            return CpuList::new(Vec::new());
        }
        let all = match &self.client_cpus {
            Some(c) => c.as_slice().to_vec(),
            None => (0..netlane::cpus::online_count()).filter(|c| *c != self.server_cpu).collect(),
        };
        // A thread needs a client of its own.
        CpuList::new(all.into_iter().take(self.clients).collect())
    }

    /// The paths part's throughput comparison: the talk's needs clients that one CPU
    /// does not limit, a thread on each CPU but the server's, where there are two.
    fn wide_modes(&self, addr: SocketAddr) -> Vec<(String, ServerConfig, ClientsConfig)> {
        let wide = self.wide_client_cpus();
        if wide.len() < 2 {
            return Vec::new();
        }
        WIDE_PATHS
            .iter()
            .filter(|p| self.paths.contains(p))
            .map(|p| {
                let c = ClientsConfig {
                    threads: wide.len(),
                    cpus: Some(wide.clone()),
                    ..self.population(addr, self.clients, self.response, self.time, self.think)
                };
                (wide_label(*p, wide.len()), self.server(addr, *p, self.block), c)
            })
            .collect()
    }

    /// The server on the server CPU, reading `path` (rings with blocks of `block` requests).
    pub(super) fn server(&self, addr: SocketAddr, path: RxPathKind, block: u32) -> ServerConfig {
        let (bytes, _) = v3_block_for(block, self.request, false);
        self.server_sized(addr, path, bytes as usize)
    }

    /// The same with rings of `bytes` blocks (whole 2 KiB frames).
    fn server_sized(&self, addr: SocketAddr, path: RxPathKind, bytes: usize) -> ServerConfig {
        let ring = RingOptions {
            frame_size: 2048,
            frames_per_block: (bytes / 2048) as u32,
            blocks: 64,
            retire_ms: self.retire_ms,
            ..RingOptions::default()
        };
        ServerConfig { listen: addr, path, cpu: Some(self.server_cpu), ring, ..ServerConfig::default() }
    }

    /// The pace part's schedule: `--pace-headroom` times the offered load, released
    /// every 100 us.
    pub(super) fn pace_options(&self) -> PaceOptions {
        PaceOptions {
            rate: (self.pace_load as f64 * self.pace_headroom).round() as u64,
            quantum: Duration::from_micros(100),
            ..PaceOptions::default()
        }
    }

    /// Every mode's part and label (no addresses needed).
    pub(super) fn labels(&self) -> Vec<(Part, String)> {
        self.modes("127.0.0.1:1".parse().expect("a literal address")).into_iter().map(|m| (m.part, m.label)).collect()
    }

    /// The veth pair `net`: its queues' NAPI threaded on the server CPU (lanes pin
    /// themselves to their queues' CPUs: all on the server CPU too).
    pub(super) fn link(&self, (mtu, queues): Net) -> LinkConfig {
        LinkConfig { mtu, queues, rx: RxTuning::threaded_napi_on(self.server_cpu) }
    }

    /// The clients' end: threaded NAPI on the client CPU with GRO (UDP_GRO sockets still
    /// coalesce segments), but without rx-udp-gro-forwarding: with it, veth loses
    /// IP-fragmented 8 KiB responses (about 100 per 2.5 s at 64 clients, measured; none
    /// without).
    pub(super) fn clients_end(&self) -> RxTuning {
        RxTuning { udp_gro_forwarding: false, ..RxTuning::threaded_napi_on(self.client_cpu) }
    }
}

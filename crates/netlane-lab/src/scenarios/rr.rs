//! `rr`: the datagram request/response talk's experiments. One server thread on its own
//! CPU in one namespace, a closed-loop client population on the other CPU in another,
//! joined by a veth pair.
//!
//! - paths: throughput, latency and the server's CPU at 64 clients on each receive path
//!   (`recvfrom`, `recvmmsg`, TPACKET_V2, TPACKET_V3, AF_XDP);
//! - blocks: TPACKET_V3 requests per block (8..128) at 16 to 128 clients that pause
//!   between requests (`--block-think`): throughput and the server CPU's idle time (the
//!   talk: about half the burst per block keeps a third of the CPU idle for a tenth less
//!   throughput), and the adaptive block size against the best fixed block;
//! - wall: clients 1, 2, 4 ... 128 on each path, throughput against latency;
//! - large: 8 KiB responses IP-fragmented at MTU 1500, whole at MTU 9000, and as GSO
//!   segments read with GRO (the talk: jumbo frames moved the wall from ~24 K to ~34 K
//!   responses/s and cut latency from ~2700 to ~1800 us);
//! - tx: what writing whole frames costs (headers, checksums and IP fragments built by
//!   netlane, sent through a PF_PACKET transmit ring or the AF_XDP socket's TX ring)
//!   against the UDP socket, with the receive path held at AF_XDP;
//! - pace: TPACKET_V3 hands the server a block of requests and it answers them in one
//!   burst; open-loop clients count how many of them one response wake-up finds ready
//!   (a herd), unpaced against responses paced by `netlane::pace` (the talk's Q&A).
//!
//! Every mode runs once per round (rotating order); checks pair two modes per round.
//! Throughput and latency are measured by the clients, at the receiving side.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, ValueEnum};
use netlane::cpus::CpuList;
use netlane::metrics::cpu::{SystemCpu, SystemCpuDelta};
use netlane::topology::{LinkConfig, RxTuning, TwoHosts};
use netlane_rr::clients::{ClientsConfig, ClientsReport, Load};
use netlane_rr::proto::client::ClientConfig;
use netlane_rr::proto::server::ResponderConfig;
use netlane_rr::proto::wire::HEADER_LEN;
use netlane_rr::server::{PaceOptions, PathKind as RxPathKind, RingOptions, ServerConfig, ServerStats, TxKind};
use serde::Serialize;

use super::{Scenario, from_words};
use crate::progress::Progress;
use crate::stats::{Spread, median, repeat_flags, round_order, sig};
use crate::verdict::{Measure, Spec, join_headline, measured_median, paired, positive};
use netlane_report::options::{OptionList, parse_duration, parse_positive_duration};
use netlane_report::{
    Axis, Chart, ChartKind, Column, Point, Row, RunRecord, Scale, ScenarioReport, Series, Table, Unit, Value, format,
};

/// A part of the scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum)]
pub enum Part {
    /// Every receive path at 64 clients.
    Paths,
    /// TPACKET_V3 requests per block at 64 and 128 clients.
    Blocks,
    /// Clients 1..128 on every path: throughput against latency.
    Wall,
    /// 8 KiB responses: IP fragments at MTU 1500, MTU 9000, GSO segments.
    Large,
    /// Transmit paths (UDP socket, packet ring, AF_XDP) with 1 and 8 KiB responses.
    Tx,
    /// Responses released in blocks, unpaced and paced: the clients woken together.
    Pace,
}

impl Part {
    fn name(self) -> String {
        crate::scenarios::value_name(&self)
    }
}

/// Requests per TPACKET_V3 block in the sweep.
pub const BLOCK_SWEEP: [u32; 5] = [8, 16, 32, 64, 128];
/// Client counts of the block sweep (the default of `--block-clients`).
pub const BLOCK_CLIENTS: [usize; 4] = [16, 32, 64, 128];
/// The adaptive mode's targets: this share of the best fixed block's rate, with the
/// server CPU this many percent idle.
const ADAPTIVE_RATE: f64 = 0.9;
const ADAPTIVE_IDLE: f64 = 30.0;
/// Client counts of the wall.
pub const WALL_CLIENTS: [usize; 8] = [1, 2, 4, 8, 16, 32, 64, 128];

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

/// `netlane bench rr`.
#[derive(Debug, Clone, Args)]
pub struct RrBenchArgs {
    /// Parts to run (comma separated).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "paths,blocks,wall,large,tx,pace")]
    pub parts: Vec<Part>,
    /// Receive paths for the paths and wall parts.
    #[arg(long, value_delimiter = ',', default_value = "recvfrom,recvmmsg,tpacket-v2,tpacket-v3,af-xdp")]
    pub paths: Vec<RxPathKind>,
    /// Clients in the paths part (each with its own socket).
    #[arg(long, default_value_t = 64)]
    pub clients: usize,
    /// Request size in bytes (header included).
    #[arg(long, default_value_t = 512)]
    pub request: usize,
    /// Response size in bytes in the paths, blocks and wall parts (the large part uses 8 KiB).
    #[arg(long, default_value_t = 1024)]
    pub response: usize,
    /// Client think time between a response and the next request (all parts but blocks).
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub think: Duration,
    /// Client think time in the blocks part: the talk's trade-off between idle CPU and
    /// throughput needs a server that can be idle, so the clients pause between requests
    /// (docs/results.md has how the default was chosen).
    #[arg(long, default_value = "3ms", value_parser = parse_duration)]
    pub block_think: Duration,
    /// Client counts of the blocks part (the adaptive targets hold across them).
    #[arg(long, value_delimiter = ',', default_value = "16,32,64,128")]
    pub block_clients: Vec<usize>,
    /// TPACKET_V3 requests per block in the paths and wall parts.
    #[arg(long, default_value_t = 16)]
    pub block: u32,
    /// TPACKET_V3 block retire timeout, milliseconds.
    #[arg(long, default_value_t = 8)]
    pub retire_ms: u32,
    /// Open-loop request rate of the pace part (Poisson arrivals over the clients).
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(100..=1_000_000))]
    pub pace_load: u64,
    /// Paced rate of the pace part, as a multiple of --pace-load (above 1: the schedule
    /// spreads bursts without throttling the load).
    #[arg(long, default_value_t = 1.25)]
    pub pace_headroom: f64,
    /// Measured time per run.
    #[arg(short = 't', long, default_value = "2s", value_parser = parse_positive_duration)]
    pub time: Duration,
    /// Warm-up before each measurement.
    #[arg(long, default_value = "300ms", value_parser = parse_duration)]
    pub ramp: Duration,
    /// Rounds: every mode once per round, in a rotating order.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub repeat: u32,
    /// CPU of the server thread and its end's NAPI.
    #[arg(long, default_value_t = 1)]
    pub server_cpu: usize,
    /// CPU of the clients and their end's NAPI.
    #[arg(long, default_value_t = 0)]
    pub client_cpu: usize,
    /// MTU of the veth pair for every part but large (which uses 1500 and 9000).
    #[arg(long, default_value_t = 1500, value_parser = clap::value_parser!(u32).range(1280..=65535))]
    pub mtu: u32,
}

/// One run's result: what the clients measured, the server's counters, and the server
/// CPU's time (the server thread, its NAPI and softirqs, all pinned there).
#[derive(Debug, Clone, Serialize)]
pub struct RrRun {
    /// The clients' measurements.
    pub clients: ClientsReport,
    /// The server's counters.
    pub server: ServerStats,
    /// The server CPU over the clients' run (warm-up included).
    pub server_cpu: SystemCpuDelta,
}

#[derive(Debug, Clone)]
struct Mode {
    part: Part,
    label: String,
    mtu: u32,
    server: ServerConfig,
    clients: ClientsConfig,
}

impl RrBenchArgs {
    /// The defaults, as `netlane bench rr` has them.
    pub fn defaults() -> RrBenchArgs {
        from_words(&[]).expect("the defaults parse")
    }

    fn modes(&self, addr: SocketAddr) -> Vec<Mode> {
        let mut modes = Vec::new();
        let client = |response: usize| ClientConfig {
            request_len: self.request,
            response_len: (response.max(HEADER_LEN) - HEADER_LEN) as u32,
            echo: false,
            timeout_ns: 500_000_000,
            max_retries: 5,
            max_outstanding: 1,
        };
        let clients_thinking = |n: usize, response: usize, time: Duration, think: Duration| ClientsConfig {
            server: addr,
            clients: n,
            threads: 1,
            cpus: Some(CpuList::one(self.client_cpu)),
            client: client(response),
            load: Load::Closed { think },
            ramp: self.ramp,
            duration: time,
            gro: false,
        };
        let clients = |n: usize, response: usize, time: Duration| clients_thinking(n, response, time, self.think);
        let ring = |block: u32| {
            let (bytes, _) = v3_block_for(block, self.request, false);
            RingOptions {
                frame_size: 2048,
                frames_per_block: bytes / 2048,
                blocks: 64,
                retire_ms: self.retire_ms,
                ..RingOptions::default()
            }
        };
        let server = |path: RxPathKind, block: u32| ServerConfig {
            listen: addr,
            path,
            cpu: Some(self.server_cpu),
            ring: ring(block),
            ..ServerConfig::default()
        };
        let m = |part, label: String, mtu, server, clients| Mode { part, label, mtu, server, clients };
        for part in &self.parts {
            match part {
                Part::Paths => {
                    for p in &self.paths {
                        modes.push(m(
                            *part,
                            p.name().into(),
                            self.mtu,
                            server(*p, self.block),
                            clients(self.clients, self.response, self.time),
                        ));
                    }
                }
                Part::Blocks => {
                    for &c in &self.block_clients {
                        for b in BLOCK_SWEEP {
                            modes.push(m(
                                *part,
                                block_label(b, c),
                                self.mtu,
                                server(RxPathKind::TpacketV3, b),
                                clients_thinking(c, self.response, self.time, self.block_think),
                            ));
                        }
                        let mut adaptive = server(RxPathKind::TpacketV3, self.block);
                        adaptive.ring.adaptive = true;
                        modes.push(m(
                            *part,
                            adaptive_label(c),
                            self.mtu,
                            adaptive,
                            clients_thinking(c, self.response, self.time, self.block_think),
                        ));
                    }
                }
                Part::Wall => {
                    let t = self.time.min(Duration::from_secs(1));
                    for p in &self.paths {
                        for c in WALL_CLIENTS {
                            modes.push(m(
                                *part,
                                wall_label(*p, c),
                                self.mtu,
                                server(*p, self.block),
                                clients(c, self.response, t),
                            ));
                        }
                    }
                }
                Part::Large => {
                    let rm = server(RxPathKind::Recvmmsg, self.block);
                    let gso = ServerConfig {
                        responder: ResponderConfig { segment: Some(1472), ..ResponderConfig::default() },
                        ..rm.clone()
                    };
                    let c = clients(self.clients, 8192, self.time);
                    modes.push(m(*part, LARGE[0].into(), 1500, rm.clone(), c.clone()));
                    modes.push(m(*part, LARGE[1].into(), 9000, rm, c.clone()));
                    modes.push(m(*part, LARGE[2].into(), 1500, gso, ClientsConfig { gro: true, ..c }));
                }
                Part::Pace => {
                    let open = ClientsConfig {
                        load: Load::Open { rate: self.pace_load as f64 },
                        client: ClientConfig { max_outstanding: 8, ..client(self.response) },
                        ..clients(self.clients, self.response, self.time)
                    };
                    let unpaced = server(RxPathKind::TpacketV3, self.block);
                    let paced = ServerConfig { pace: Some(self.pace_options()), ..unpaced.clone() };
                    modes.push(m(*part, PACE[0].into(), self.mtu, unpaced, open.clone()));
                    modes.push(m(*part, PACE[1].into(), self.mtu, paced, open));
                }
                Part::Tx => {
                    for size in TX_SIZES {
                        for tx in TxKind::ALL {
                            let server = ServerConfig { tx, ..server(RxPathKind::AfXdp, self.block) };
                            modes.push(m(
                                *part,
                                tx_label(tx, size),
                                self.mtu,
                                server,
                                clients(self.clients, size, self.time),
                            ));
                        }
                    }
                }
            }
        }
        modes
    }

    fn pace_options(&self) -> PaceOptions {
        PaceOptions {
            rate: (self.pace_load as f64 * self.pace_headroom).round() as u64,
            quantum: Duration::from_micros(100),
            ..PaceOptions::default()
        }
    }

    fn labels(&self) -> Vec<(Part, String)> {
        self.modes("127.0.0.1:1".parse().expect("a literal address")).into_iter().map(|m| (m.part, m.label)).collect()
    }
}

const PACE: [&str; 2] = ["unpaced", "paced"];

const LARGE: [&str; 3] = ["8K fragmented, MTU 1500", "8K whole, MTU 9000", "8K GSO segments, MTU 1500"];

/// Response sizes of the tx part.
const TX_SIZES: [usize; 2] = [1024, 8192];

fn tx_label(tx: TxKind, size: usize) -> String {
    format!("{tx}, {} KiB", size / 1024)
}

fn block_label(block: u32, clients: usize) -> String {
    format!("{block} per block, {clients} clients")
}

fn adaptive_label(clients: usize) -> String {
    format!("adaptive, {clients} clients")
}

fn wall_label(p: RxPathKind, clients: usize) -> String {
    format!("{p} x{clients}")
}

impl Scenario for RrBenchArgs {
    fn name(&self) -> &'static str {
        "rr"
    }

    fn options(&self) -> OptionList {
        let parts: Vec<String> = self.parts.iter().map(|p| p.name()).collect();
        let paths: Vec<&str> = self.paths.iter().map(|p| p.name()).collect();
        OptionList::new()
            .words("parts", &parts)
            .words("paths", &paths)
            .int("clients", self.clients as u64)
            .int("request", self.request as u64)
            .int("response", self.response as u64)
            .duration("think", self.think)
            .duration("block-think", self.block_think)
            .words("block-clients", &self.block_clients.iter().map(|c| c.to_string()).collect::<Vec<_>>())
            .int("block", u64::from(self.block))
            .int("retire-ms", u64::from(self.retire_ms))
            .int("pace-load", self.pace_load)
            .text("pace-headroom", self.pace_headroom.to_string())
            .duration("time", self.time)
            .duration("ramp", self.ramp)
            .int("repeat", u64::from(self.repeat))
            .int("server-cpu", self.server_cpu as u64)
            .int("client-cpu", self.client_cpu as u64)
            .int("mtu", u64::from(self.mtu))
    }

    fn validate(&self) -> Result<()> {
        let n = netlane::cpus::online_count();
        for (what, c) in [("--server-cpu", self.server_cpu), ("--client-cpu", self.client_cpu)] {
            if c >= n {
                bail!("{what} {c}: this machine has CPUs 0-{}", n - 1);
            }
        }
        if self.parts.is_empty() {
            bail!("--parts: no parts to run");
        }
        if self.paths.is_empty() && self.parts.iter().any(|p| matches!(p, Part::Paths | Part::Wall)) {
            bail!("--paths: no receive paths");
        }
        if !(HEADER_LEN..=1472).contains(&self.request) {
            bail!("--request {}: {HEADER_LEN}..=1472 bytes (one unfragmented datagram at MTU 1500)", self.request);
        }
        if !(HEADER_LEN..=65_507).contains(&self.response) {
            bail!("--response {}: {HEADER_LEN}..=65507 bytes", self.response);
        }
        if !(1..=4096).contains(&self.clients) {
            bail!("--clients {}: 1..=4096", self.clients);
        }
        if !(self.pace_headroom.is_finite() && (1.0..=10.0).contains(&self.pace_headroom)) {
            bail!("--pace-headroom {}: 1 to 10 (the paced rate over the offered load)", self.pace_headroom);
        }
        if self.parts.contains(&Part::Blocks) && self.block_clients.is_empty() {
            bail!("--block-clients: no client counts for the blocks part");
        }
        if let Some(c) = self.block_clients.iter().find(|c| !(1..=4096).contains(*c)) {
            bail!("--block-clients {c}: 1..=4096");
        }
        if let Some(c) =
            self.block_clients.iter().enumerate().find_map(|(i, c)| self.block_clients[..i].contains(c).then_some(c))
        {
            bail!("--block-clients: {c} appears twice");
        }
        if !(1..=4096).contains(&self.block) {
            bail!("--block {}: 1..=4096 requests per block", self.block);
        }
        if !netlane::topology::have_privileges() {
            bail!("the rr scenario builds two network namespaces and packet rings: run it as root");
        }
        // Every server configuration must be buildable before the first run.
        for m in self.modes("10.0.0.1:7070".parse().expect("a literal address")) {
            m.server.validate().with_context(|| format!("mode {}", m.label))?;
            m.clients.validate().with_context(|| format!("mode {}", m.label))?;
        }
        Ok(())
    }

    fn runs(&self) -> usize {
        self.labels().len() * self.repeat as usize
    }

    fn run(&self, progress: &dyn Progress) -> Result<ScenarioReport> {
        self.validate()?;
        let link = |mtu| LinkConfig { mtu, queues: 1, rx: RxTuning::threaded_napi_on(self.server_cpu) };
        let mut nets: Vec<(u32, TwoHosts)> = Vec::new();
        let mut mtus: Vec<u32> = Vec::new();
        let addr0: SocketAddr = SocketAddr::new(TwoHosts::RX_V4.into(), 7070);
        for m in self.modes(addr0) {
            if !mtus.contains(&m.mtu) {
                mtus.push(m.mtu);
            }
        }
        for mtu in mtus {
            let h = TwoHosts::create("rr", link(mtu))?;
            // The clients' end: threaded NAPI with GRO (UDP_GRO sockets still coalesce
            // segments), but without rx-udp-gro-forwarding: with it, veth loses IP-fragmented
            // 8 KiB responses (about 100 per 2.5 s at 64 clients, measured; none without).
            let clients_end = RxTuning { udp_gro_forwarding: false, ..RxTuning::threaded_napi_on(self.client_cpu) };
            clients_end.apply(&h.tx, &h.tx_if, h.tx_index)?;
            nets.push((mtu, h));
        }
        let modes = self.modes(addr0);
        let mut all: Vec<Vec<RrRun>> = vec![Vec::new(); modes.len()];
        let mut records = Vec::new();
        let mut index = 0;
        for round in 0..self.repeat as usize {
            for i in round_order(modes.len(), round) {
                let m = &modes[i];
                index += 1;
                let mut label = format!("{} {}", m.part.name(), m.label);
                if self.repeat > 1 {
                    label.push_str(&format!(" #{}", round + 1));
                }
                progress.start(&label);
                let h = &nets.iter().find(|(mtu, _)| *mtu == m.mtu).context("a network for the mode's MTU")?.1;
                let r = exchange(h, m, self.server_cpu).with_context(|| format!("run {label}"))?;
                let c = &r.clients;
                if c.corrupt + c.mismatched > 0 {
                    bail!("{label}: {} corrupted and {} mismatched responses", c.corrupt, c.mismatched);
                }
                progress.finish(
                    &label,
                    &format!(
                        "{:.0} responses/s, p50 {}, p99 {}, server CPU idle {}",
                        c.responses_per_s,
                        format::seconds(c.latency_ns.p50 as f64 / 1e9),
                        format::seconds(c.latency_ns.p99 as f64 / 1e9),
                        idle(&r).map_or("-".into(), |v| format!("{v:.0}%"))
                    ),
                );
                records.push(record(index, round as u32 + 1, &format!("{} {}", m.part.name(), m.label), &r));
                all[i].push(r);
            }
        }
        drop(nets);
        Ok(self.report(&modes, &all, records))
    }
}

/// One run: the server in the "rx" namespace, the clients in the "tx" one.
fn exchange(h: &TwoHosts, m: &Mode, server_cpu: usize) -> Result<RrRun> {
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    let s = stop.clone();
    let cfg = m.server.clone();
    let server = h.rx.spawn("rr-server", move || {
        netlane_rr::server::serve(&cfg, &s, |a| {
            let _ = tx.send(a);
        })
    })?;
    let addr = match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(a) => a,
        Err(_) => {
            stop.store(true, Ordering::Relaxed);
            return Err(match server.join() {
                Ok(Err(e)) => anyhow!(e).context("the server did not start"),
                _ => anyhow!("the server did not start within 10 s"),
            });
        }
    };
    let pop = ClientsConfig { server: addr, ..m.clients.clone() };
    let cpu0 = SystemCpu::read_cpu(server_cpu).context("read /proc/stat")?;
    let clients = h.tx.run(move || netlane_rr::clients::run(&pop, &AtomicBool::new(false)));
    let cpu1 = SystemCpu::read_cpu(server_cpu).context("read /proc/stat")?;
    stop.store(true, Ordering::Relaxed);
    let server = server.join().map_err(|_| anyhow!("the server thread panicked"))?.context("the server failed")?;
    let clients = clients?.context("the clients failed")?;
    Ok(RrRun { clients, server, server_cpu: cpu0.delta(&cpu1) })
}

fn record(index: u32, round: u32, label: &str, r: &RrRun) -> RunRecord {
    let c = &r.clients;
    let l = &c.latency_ns;
    let us = |v: u64| (l.count > 0).then(|| v as f64 / 1e3);
    let mut rec = RunRecord::new(
        index,
        round,
        label,
        vec![
            ("responses_per_s", Some(c.responses_per_s)),
            ("p50_us", us(l.p50)),
            ("p99_us", us(l.p99)),
            ("p9999_us", us(l.p9999)),
            ("server_thread_busy_pct", Some(r.server.busy * 100.0)),
            ("server_cpu_idle_pct", idle(r).ok()),
            ("server_cpu_us_per_response", cost(r).ok()),
            ("wakeups_per_s", (r.server.seconds > 0.0).then(|| r.server.wakeups as f64 / r.server.seconds)),
            ("frames_per_wakeup", Some(r.server.frames_per_wakeup)),
            ("retransmits", Some(c.retransmits as f64)),
            ("lost", Some(c.lost as f64)),
        ],
    );
    rec.detail = serde_json::to_value(r).unwrap_or_default();
    rec
}

fn throughput(r: &RrRun) -> Measure {
    positive(r.clients.responses_per_s, "responses per second")
}

fn p50(r: &RrRun) -> Measure {
    if r.clients.latency_ns.count == 0 {
        return Err("no response completed: empty latency histogram".into());
    }
    positive(r.clients.latency_ns.p50 as f64, "p50 latency")
}

/// The lower of two samples; a failed sample wins (a population that measured nothing
/// must not hide behind one that did).
fn worst(a: Measure, b: Measure) -> Measure {
    match (a, b) {
        (Ok(x), Ok(y)) => Ok(x.min(y)),
        (Err(e), _) | (_, Err(e)) => Err(e),
    }
}

/// The server CPU's idle share over the run, %; degenerate when it answered nothing.
fn idle(r: &RrRun) -> Measure {
    let c = &r.server_cpu;
    if r.server.responses == 0 || c.total_s <= 0.0 {
        return Err("the server answered nothing, or no CPU time was counted".into());
    }
    Ok((1.0 - c.busy_s / c.total_s).clamp(0.0, 1.0) * 100.0)
}

/// Server CPU microseconds per response (thread, NAPI and softirq on the server CPU).
fn cost(r: &RrRun) -> Measure {
    let c = &r.server_cpu;
    if c.total_s <= 0.0 {
        return Err("no CPU time was counted".into());
    }
    let per_s = positive(r.clients.responses_per_s, "responses per second")?;
    positive(c.busy_s / c.total_s * 1e6 / per_s, "server CPU per response")
}

/// The share of responses a frame transmit path wrote as frames (the rest went through
/// the socket), %.
fn frames_share(r: &RrRun) -> Measure {
    let raw = r.server.raw_tx.as_ref().ok_or_else(|| "the socket sent every response".to_string())?;
    if r.server.responses == 0 {
        return Err("the server answered nothing".into());
    }
    Ok(raw.datagrams as f64 / r.server.responses as f64 * 100.0)
}

/// Server CPU per response of a transmit-path run, invalid when a frame path sent a
/// response any other way (a fallback to the socket must not pass as the frame path's
/// cost).
fn frames_cost(r: &RrRun) -> Measure {
    if r.server.raw_tx.is_some() {
        let share = frames_share(r)?;
        if share < 100.0 {
            return Err(format!("only {share:.1}% of the responses went out as frames"));
        }
    }
    cost(r)
}

/// Client sockets found ready in wake-ups of at least [`netlane_rr::clients::HERD`]
/// sockets, per 100 responses (a ready socket may hold more than one response); invalid
/// unless the run answered 90% of the offered `load` (a run that throttled or dropped
/// would look calm).
fn herd_share(r: &RrRun, load: u64) -> Measure {
    let c = &r.clients;
    let rate = positive(c.responses_per_s, "responses per second")?;
    if rate < 0.9 * load as f64 {
        return Err(format!("answered {rate:.0} of {load} requests/s offered"));
    }
    Ok(c.herd_woken_sockets as f64 / c.responses as f64 * 100.0)
}

fn values(rs: &[RrRun], f: impl Fn(&RrRun) -> Measure) -> Vec<f64> {
    rs.iter().filter_map(|r| f(r).ok()).collect()
}

fn med(rs: &[RrRun], f: impl Fn(&RrRun) -> Measure) -> Value {
    let v = values(rs, f);
    if v.is_empty() { Value::Missing } else { Value::num(median(v)) }
}

fn us(f: fn(&netlane::metrics::Summary) -> u64) -> impl Fn(&RrRun) -> Measure {
    move |r: &RrRun| {
        if r.clients.latency_ns.count == 0 {
            Err("no response completed".into())
        } else {
            Ok(f(&r.clients.latency_ns) as f64 / 1e3)
        }
    }
}

impl RrBenchArgs {
    fn report(&self, modes: &[Mode], all: &[Vec<RrRun>], runs: Vec<RunRecord>) -> ScenarioReport {
        let find = |part: Part, label: &str| {
            modes.iter().position(|m| m.part == part && m.label == label).map(|i| &all[i][..])
        };
        let mut flags = Vec::new();
        for (m, rs) in modes.iter().zip(all) {
            flags.extend(repeat_flags(
                &format!("{} {}", m.part.name(), m.label),
                "responses/s",
                &values(rs, throughput),
            ));
        }
        let (mut tables, mut charts, mut checks, mut notes) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let compare = |spec: Spec, part: Part, a: &str, b: &str, f: fn(&RrRun) -> Measure, what: &str| match (
            find(part, a),
            find(part, b),
        ) {
            (Some(x), Some(y)) => spec.evaluate(paired(x, y, f), &format!("{what}, per round")),
            _ => spec.skipped(format!("the {} part did not run {a} and {b}", part.name())),
        };
        let row = |label: &str, rs: &[RrRun]| {
            Row::new(vec![
                Value::text(label),
                med(rs, throughput),
                med(rs, us(|s| s.p50)),
                med(rs, us(|s| s.p99)),
                med(rs, us(|s| s.p9999)),
                med(rs, idle),
                med(rs, cost),
                med(rs, |r| positive(r.server.wakeups as f64 / r.server.seconds.max(1e-9), "wake-ups")),
                med(rs, |r| positive(r.server.frames_per_wakeup, "frames per wake-up")),
                med(rs, |r| Ok(r.server.syscalls_per_response)),
                med(rs, |r| Ok((r.clients.retransmits + r.clients.lost) as f64)),
            ])
        };
        let columns = |first: &str| {
            vec![
                Column::new("mode", first, 0),
                Column::new("responses_per_s", "responses/s", 0),
                Column::new("p50_us", "p50 us", 1),
                Column::new("p99_us", "p99 us", 1),
                Column::new("p9999_us", "p99.99 us", 1),
                Column::new("server_cpu_idle_pct", "server CPU idle %", 0),
                Column::new("server_cpu_us_per_response", "server CPU us/response", 2),
                Column::new("wakeups_per_s", "wake-ups/s", 0),
                Column::new("frames_per_wakeup", "frames/wake-up", 1),
                Column::new("syscalls_per_response", "syscalls/response", 2),
                Column::new("retransmits_and_lost", "retransmits+lost", 0),
            ]
        };

        if self.parts.contains(&Part::Paths) {
            let mut t = Table::new(
                "rr-paths",
                format!(
                    "Receive paths, {} closed-loop clients, {} B requests, {} B responses, medians of {} rounds",
                    self.clients, self.request, self.response, self.repeat
                ),
                columns("path"),
            );
            let mut points = Vec::new();
            for (x, p) in self.paths.iter().enumerate() {
                let Some(rs) = find(Part::Paths, p.name()) else { continue };
                t.push(row(p.name(), rs));
                points.extend(Point::of(x as f64, &values(rs, throughput)));
            }
            tables.push(t);
            charts.push(Chart {
                name: "rr-paths".into(),
                title: format!("Responses per second by receive path, {} clients", self.clients),
                kind: ChartKind::Bars,
                x: Axis::categories("receive path", self.paths.iter().map(|p| p.name().to_string()).collect()),
                y: Axis::numeric("responses/s", Unit::Count("responses/s".into()), Scale::Linear),
                series: vec![Series { name: "responses/s".into(), points }],
            });
            // With one client core against one server core the clients, not the server,
            // set the rate here; what a receive path saves shows as server CPU per
            // response.
            for (p, talk) in [
                (RxPathKind::TpacketV2, " (talk: about 2x the rate on Linux 4.9, less on later kernels)"),
                (RxPathKind::AfXdp, ""),
            ] {
                let id = format!("rr.{}-cost", p.name());
                let spec = Spec::at_most(
                    &id,
                    format!("{p} costs the server no more CPU per response than recvfrom{talk}"),
                    1.0,
                    "x",
                );
                checks.push(compare(
                    spec,
                    Part::Paths,
                    p.name(),
                    "recvfrom",
                    cost,
                    &format!("{p} / recvfrom server CPU per response"),
                ));
            }
            let best_idle = self
                .paths
                .iter()
                .filter_map(|p| find(Part::Paths, p.name()).map(|rs| (p, values(rs, idle))))
                .filter(|(_, v)| !v.is_empty())
                .map(|(p, v)| (p, median(v)))
                .fold(
                    None,
                    |m: Option<(&RxPathKind, f64)>, (p, v)| {
                        if m.is_some_and(|(_, b)| b >= v) { m } else { Some((p, v)) }
                    },
                );
            if let Some((p, v)) = best_idle
                && v > 20.0
            {
                notes.push(format!(
                    "The server CPU was idle {v:.0}% of the time even on {p}: one client CPU cannot drive one server \
                     CPU to saturation here, so responses/s measure the clients as much as the server; the paths are \
                     compared by server CPU per response."
                ));
            }
        }

        if self.parts.contains(&Part::Blocks) {
            let mut t = Table::new(
                "rr-blocks",
                format!(
                    "TPACKET_V3 requests per block ({} ms retire timeout, clients pausing {} between requests), medians of {} rounds",
                    self.retire_ms,
                    format::seconds(self.block_think.as_secs_f64()),
                    self.repeat
                ),
                {
                    let mut c = columns("requests per block, clients");
                    c.insert(1, Column::new("block_bytes", "block bytes", 0));
                    c.insert(2, Column::new("block_holds", "holds", 0));
                    c
                },
            );
            let mut tp_series = Vec::new();
            let mut idle_series = Vec::new();
            for &c in &self.block_clients {
                let (mut tp, mut id) = (Vec::new(), Vec::new());
                for (x, b) in BLOCK_SWEEP.iter().enumerate() {
                    let label = block_label(*b, c);
                    let Some(rs) = find(Part::Blocks, &label) else { continue };
                    let (bytes, holds) = v3_block_for(*b, self.request, false);
                    let mut r = row(&label, rs);
                    r.cells.insert(1, Value::num(f64::from(bytes)));
                    r.cells.insert(2, Value::num(f64::from(holds)));
                    t.push(r);
                    tp.extend(Point::of(x as f64, &values(rs, throughput)));
                    id.extend(Point::of(x as f64, &values(rs, idle)));
                }
                tp_series.push(Series { name: format!("{c} clients"), points: tp });
                idle_series.push(Series { name: format!("{c} clients"), points: id });
            }
            tables.push(t);
            let cats: Vec<String> = BLOCK_SWEEP.iter().map(|b| b.to_string()).collect();
            charts.push(Chart {
                name: "rr-blocks-throughput".into(),
                title: "TPACKET_V3: responses per second by requests per block".into(),
                kind: ChartKind::Lines,
                x: Axis::categories("requests per block", cats.clone()),
                y: Axis::numeric("responses/s", Unit::Count("responses/s".into()), Scale::Linear),
                series: tp_series,
            });
            charts.push(Chart {
                name: "rr-blocks-idle".into(),
                title: "TPACKET_V3: the server CPU's idle time by requests per block".into(),
                kind: ChartKind::Lines,
                x: Axis::categories("requests per block", cats),
                y: Axis::numeric("server idle", Unit::Percent, Scale::Linear),
                series: idle_series,
            });
            // The talk's trade-off at 64 clients: a block of half the burst (32) against
            // the best block, per round.
            let half = block_label(32, 64);
            let best_of_round = |round: usize| -> Measure {
                BLOCK_SWEEP
                    .iter()
                    .filter_map(|b| find(Part::Blocks, &block_label(*b, 64)))
                    .filter_map(|rs| rs.get(round))
                    .filter_map(|r| throughput(r).ok())
                    .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
                    .ok_or_else(|| "no block size answered".to_string())
            };
            let spec = Spec::at_least(
                "rr.block-half-burst-throughput",
                "TPACKET_V3, 64 clients: 32 requests per block keeps most of the best block's throughput (talk: about 90%)",
                0.85,
                "x",
            );
            checks.push(match find(Part::Blocks, &half) {
                Some(rs) => spec.evaluate(
                    rs.iter()
                        .enumerate()
                        .map(|(i, r)| crate::verdict::ratio(throughput(r), best_of_round(i)))
                        .collect(),
                    "32 per block / the best block's responses/s, per round",
                ),
                None => spec.skipped("the blocks part did not run"),
            });
            let spec = Spec::at_least(
                "rr.block-half-burst-idle",
                "TPACKET_V3, 64 clients: with 32 requests per block the server CPU is idle part of the time (talk: ~35%)",
                25.0,
                "%",
            );
            checks.push(match find(Part::Blocks, &half) {
                Some(rs) => spec.evaluate(rs.iter().map(idle).collect(), "the server CPU's idle share, per round"),
                None => spec.skipped("the blocks part did not run"),
            });
            // The same trade-off at every client count: how the burst a block should hold
            // moves with the population when clients pause.
            let shape: Vec<String> = self
                .block_clients
                .iter()
                .filter_map(|&c| {
                    let rs = find(Part::Blocks, &block_label(32, c))?;
                    let ratios: Vec<f64> = rs
                        .iter()
                        .enumerate()
                        .filter_map(|(i, r)| {
                            let best = BLOCK_SWEEP
                                .iter()
                                .filter_map(|b| find(Part::Blocks, &block_label(*b, c)).and_then(|x| x.get(i)))
                                .filter_map(|x| throughput(x).ok())
                                .fold(0.0, f64::max);
                            throughput(r).ok().filter(|_| best > 0.0).map(|v| v / best)
                        })
                        .collect();
                    let idles = values(rs, idle);
                    (!ratios.is_empty() && !idles.is_empty())
                        .then(|| format!("{c} clients {:.2}x at {:.0}% idle", median(ratios), median(idles)))
                })
                .collect();
            if !shape.is_empty() {
                notes.push(format!(
                    "32 requests per block against the best block (medians over rounds): {}. With clients pausing \
                     between requests the burst is smaller than the population, so the talk's 64-client trade-off \
                     shows at a larger population.",
                    shape.join("; ")
                ));
            }
            // Why a bigger block buys idle time or not: what it saves per request. At the
            // largest population (the busiest server), smallest against half-burst block.
            if let Some(&c) = self.block_clients.iter().max() {
                let cost_of = |b: u32| find(Part::Blocks, &block_label(b, c)).map(|rs| values(rs, cost));
                if let (Some(small), Some(half)) = (cost_of(8), cost_of(32))
                    && !small.is_empty()
                    && !half.is_empty()
                {
                    let (small, half) = (median(small), median(half));
                    notes.push(format!(
                        "Server CPU per response at {c} clients: {small:.1} us with 8 requests per block, {half:.1} us \
                         with 32 ({:.2}x). Idle time bought with a bigger block comes from fewer wake-ups per \
                         request only as far as this ratio is below 1; the rest is requests not yet answered \
                         (clients waiting for the block to fill), which costs throughput.",
                        half / small
                    ));
                }
            }
        }

        if self.parts.contains(&Part::Blocks) {
            let mut t = Table::new(
                "rr-adaptive",
                format!(
                    "TPACKET_V3 with the block size adapted at run time, against the best fixed block, medians of {} rounds",
                    self.repeat
                ),
                vec![
                    Column::new("clients", "clients", 0),
                    Column::new("adaptive_responses_per_s", "adaptive responses/s", 0),
                    Column::new("best_fixed_responses_per_s", "best fixed responses/s", 0),
                    Column::new("best_fixed_block", "best fixed block", 0),
                    Column::new("ratio", "adaptive / best", 2),
                    Column::new("adaptive_idle_pct", "adaptive server CPU idle %", 0),
                    Column::new("switches", "ring switches", 0),
                    Column::new("final_block_bytes", "final block bytes", 0),
                    Column::new("fixed_idle_bound", "best fixed with 30% idle / best", 2),
                ],
            );
            let mut infeasible = Vec::new();
            let (mut tp_samples, mut idle_samples) = (Vec::new(), Vec::new());
            for &c in &self.block_clients {
                let Some(ad) = find(Part::Blocks, &adaptive_label(c)) else { continue };
                // Per round: the best fixed block's throughput at these clients.
                let best = |round: usize| -> Option<(f64, u32)> {
                    BLOCK_SWEEP
                        .iter()
                        .filter_map(|b| find(Part::Blocks, &block_label(*b, c)).map(|rs| (b, rs)))
                        .filter_map(|(b, rs)| rs.get(round).and_then(|r| throughput(r).ok()).map(|v| (v, *b)))
                        .fold(None, |m: Option<(f64, u32)>, x| if m.is_some_and(|m| m.0 >= x.0) { m } else { Some(x) })
                };
                let ratios: Vec<Measure> = ad
                    .iter()
                    .enumerate()
                    .map(|(i, r)| {
                        crate::verdict::ratio(
                            throughput(r),
                            best(i).map(|b| b.0).ok_or_else(|| "no fixed block".into()),
                        )
                    })
                    .collect();
                // What any fixed block achieves with the idle target met: the best
                // throughput among blocks leaving 30% idle, over the best, per round.
                let bound: Vec<f64> = (0..ad.len())
                    .filter_map(|i| {
                        let idle_best = BLOCK_SWEEP
                            .iter()
                            .filter_map(|b| find(Part::Blocks, &block_label(*b, c)).and_then(|rs| rs.get(i)))
                            .filter(|r| idle(r).is_ok_and(|v| v >= ADAPTIVE_IDLE))
                            .filter_map(|r| throughput(r).ok())
                            .fold(0.0, f64::max);
                        best(i).map(|b| idle_best / b.0)
                    })
                    .collect();
                let bound = (!bound.is_empty()).then(|| median(bound));
                if let Some(b) = bound.filter(|b| *b < ADAPTIVE_RATE) {
                    infeasible.push(format!("{c} clients ({b:.2})"));
                }
                let ok: Vec<f64> = ratios.iter().filter_map(|r| r.as_ref().ok().copied()).collect();
                let bests: Vec<f64> = (0..ad.len()).filter_map(|i| best(i).map(|b| b.0)).collect();
                let best_block = best(0).map(|b| b.1);
                t.push(Row::new(vec![
                    Value::num(c as f64),
                    med(ad, throughput),
                    if bests.is_empty() { Value::Missing } else { Value::num(median(bests)) },
                    Value::opt(best_block.map(f64::from)),
                    if ok.is_empty() { Value::Missing } else { Value::num(median(ok)) },
                    med(ad, idle),
                    med(ad, |r| r.server.adaptive_switches.map(|v| v as f64).ok_or_else(|| "not adaptive".into())),
                    med(ad, |r| r.server.adaptive_block.map(f64::from).ok_or_else(|| "not adaptive".into())),
                    Value::opt(bound),
                ]));
                // Per round, the worst population so far: the targets hold across
                // the populations, not on their median.
                for (i, (r, id)) in ratios.into_iter().zip(ad.iter().map(idle)).enumerate() {
                    if tp_samples.len() <= i {
                        tp_samples.push(r);
                        idle_samples.push(id);
                    } else {
                        tp_samples[i] = worst(std::mem::replace(&mut tp_samples[i], Ok(0.0)), r);
                        idle_samples[i] = worst(std::mem::replace(&mut idle_samples[i], Ok(0.0)), id);
                    }
                }
            }
            tables.push(t);
            if !infeasible.is_empty() {
                notes.push(format!(
                    "No fixed block met both adaptive targets at {}: the best fixed block leaving the server CPU 30% idle \
                     kept only that share of the best fixed block's rate (medians over rounds), so no geometry chosen \
                     at run time could either on this machine with these clients.",
                    infeasible.join(", ")
                ));
            }
            let spec = Spec::at_least(
                "rr.adaptive-throughput",
                "TPACKET_V3 adaptive blocks: at least 90% of the best fixed block's throughput at every client count, untuned",
                ADAPTIVE_RATE,
                "x",
            );
            checks.push(if tp_samples.is_empty() {
                spec.skipped("the blocks part did not run")
            } else {
                spec.evaluate(
                    tp_samples,
                    "adaptive / best fixed block responses/s at the worst client count, per round",
                )
            });
            let spec = Spec::at_least(
                "rr.adaptive-idle",
                "TPACKET_V3 adaptive blocks: the server CPU stays at least 30% idle at every client count",
                ADAPTIVE_IDLE,
                "%",
            );
            checks.push(if idle_samples.is_empty() {
                spec.skipped("the blocks part did not run")
            } else {
                spec.evaluate(idle_samples, "the server CPU's idle share at the worst client count, per round")
            });
        }

        if self.parts.contains(&Part::Wall) {
            let mut t = Table::new(
                "rr-wall",
                format!("The wall: clients 1..128 per path, medians of {} rounds", self.repeat),
                columns("path x clients"),
            );
            let mut series = Vec::new();
            for p in &self.paths {
                let mut points = Vec::new();
                for c in WALL_CLIENTS {
                    let label = wall_label(*p, c);
                    let Some(rs) = find(Part::Wall, &label) else { continue };
                    t.push(row(&label, rs));
                    let (tp, lat) = (values(rs, throughput), values(rs, p50));
                    if let (false, false) = (tp.is_empty(), lat.is_empty()) {
                        points.push(Point { x: median(tp), y: median(lat) / 1e9, low: None, high: None });
                    }
                }
                series.push(Series { name: p.name().into(), points });
            }
            tables.push(t);
            charts.push(Chart {
                name: "rr-wall".into(),
                title: "The wall: p50 latency against responses per second as clients double (1..128)".into(),
                kind: ChartKind::Lines,
                x: Axis::numeric("responses/s", Unit::Count("responses/s".into()), Scale::Linear),
                y: Axis::numeric("p50 latency", Unit::Seconds, Scale::Log),
                series,
            });
        }

        if self.parts.contains(&Part::Large) {
            let mut t = Table::new(
                "rr-large",
                format!("8 KiB responses, {} clients, recvmmsg, medians of {} rounds", self.clients, self.repeat),
                columns("responses"),
            );
            let mut points = Vec::new();
            for (x, label) in LARGE.iter().enumerate() {
                let Some(rs) = find(Part::Large, label) else { continue };
                t.push(row(label, rs));
                points.extend(Point::of(x as f64, &values(rs, throughput)));
            }
            tables.push(t);
            charts.push(Chart {
                name: "rr-large".into(),
                title: "8 KiB responses: responses per second".into(),
                kind: ChartKind::Bars,
                x: Axis::categories("responses", LARGE.iter().map(|s| s.to_string()).collect()),
                y: Axis::numeric("responses/s", Unit::Count("responses/s".into()), Scale::Linear),
                series: vec![Series { name: "responses/s".into(), points }],
            });
            let spec = Spec::at_least(
                "rr.jumbo-throughput",
                "8 KiB responses: MTU 9000 raises throughput over IP fragments at 1500 (talk: ~24 K -> ~34 K, 1.4x)",
                1.2,
                "x",
            );
            checks.push(compare(spec, Part::Large, LARGE[1], LARGE[0], throughput, "MTU 9000 / MTU 1500 responses/s"));
            let spec = Spec::at_most(
                "rr.jumbo-latency",
                "8 KiB responses: MTU 9000 lowers p50 latency (talk: ~2700 -> ~1800 us, 0.67x)",
                0.85,
                "x",
            );
            checks.push(compare(spec, Part::Large, LARGE[1], LARGE[0], p50, "MTU 9000 / MTU 1500 p50"));
            let spec = Spec::at_least(
                "rr.gso-segments-throughput",
                "8 KiB responses: GSO segments read with GRO beat IP fragments at MTU 1500",
                1.0,
                "x",
            );
            checks.push(compare(
                spec,
                Part::Large,
                LARGE[2],
                LARGE[0],
                throughput,
                "GSO segments / fragments responses/s",
            ));
            if let Some(rs) = find(Part::Large, LARGE[0]) {
                let r: Vec<f64> = rs.iter().map(|r| r.clients.retransmits as f64).collect();
                if let Some(s) = Spread::of(&r).filter(|s| s.max > 0.0) {
                    notes.push(format!(
                        "Fragmented responses needed {} retransmissions per run (median; {}..{}): a lost fragment \
                         loses the whole response.",
                        sig(s.median),
                        sig(s.min),
                        sig(s.max)
                    ));
                }
            }
        }

        if self.parts.contains(&Part::Tx) {
            let mut cols = columns("transmit path, response");
            cols.push(Column::new("frames_pct", "responses as frames %", 0));
            let mut t = Table::new(
                "rr-tx",
                format!(
                    "Transmit paths (receive path AF_XDP), {} clients, MTU {}, medians of {} rounds",
                    self.clients, self.mtu, self.repeat
                ),
                cols,
            );
            let mut series = Vec::new();
            for size in TX_SIZES {
                let mut points = Vec::new();
                for (x, tx) in TxKind::ALL.iter().enumerate() {
                    let Some(rs) = find(Part::Tx, &tx_label(*tx, size)) else { continue };
                    let mut r = row(&tx_label(*tx, size), rs);
                    r.cells.push(med(rs, frames_share));
                    t.push(r);
                    points.extend(Point::of(x as f64, &values(rs, |r| cost(r).map(|us| us / 1e6))));
                }
                series.push(Series { name: format!("{} KiB responses", size / 1024), points });
            }
            tables.push(t);
            charts.push(Chart {
                name: "rr-tx".into(),
                title: "Server CPU per response by transmit path".into(),
                kind: ChartKind::Bars,
                x: Axis::categories("transmit path", TxKind::ALL.iter().map(|k| k.name().to_string()).collect()),
                y: Axis::numeric("server CPU per response", Unit::Seconds, Scale::Linear),
                series,
            });
            for tx in [TxKind::Packet, TxKind::AfXdp] {
                for size in TX_SIZES {
                    let spec = Spec::at_most(
                        &format!("rr.tx-{}-{}k-cost", tx.name(), size / 1024),
                        format!(
                            "{} KiB responses written as frames through {} cost the server no more CPU per response \
                             than the UDP socket",
                            size / 1024,
                            if tx == TxKind::Packet { "a PF_PACKET ring" } else { "the AF_XDP socket" }
                        ),
                        1.0,
                        "x",
                    );
                    checks.push(compare(
                        spec,
                        Part::Tx,
                        &tx_label(tx, size),
                        &tx_label(TxKind::Socket, size),
                        frames_cost,
                        &format!("{tx} / socket server CPU per response"),
                    ));
                }
            }
        }

        if self.parts.contains(&Part::Pace) {
            let mut cols = columns("responses");
            cols.push(Column::new("woken_per_wakeup", "clients woken per wake-up", 2));
            cols.push(Column::new("herd_pct", &format!("woken {}+ at once %", netlane_rr::clients::HERD), 2));
            cols.push(Column::new("max_woken", "most woken at once", 0));
            let mut t = Table::new(
                "rr-pace",
                format!(
                    "Responses released per TPACKET_V3 block ({} requests per block) or paced at {} responses/s \
                     (100 us releases), {} clients, open loop at {} requests/s, medians of {} rounds",
                    self.block,
                    self.pace_options().rate,
                    self.clients,
                    self.pace_load,
                    self.repeat
                ),
                cols,
            );
            for label in PACE {
                let Some(rs) = find(Part::Pace, label) else { continue };
                let mut r = row(label, rs);
                r.cells.push(med(rs, |r| {
                    let c = &r.clients;
                    positive(c.woken_sockets as f64, "woken clients").map(|w| w / c.wakeups as f64)
                }));
                r.cells.push(med(rs, |r| herd_share(r, self.pace_load)));
                r.cells.push(med(rs, |r| Ok(r.clients.max_woken_sockets as f64)));
                t.push(r);
            }
            tables.push(t);
            let spec = Spec::at_most(
                "rr.pace-herd",
                format!(
                    "Paced responses wake clients in herds ({}+ at once) at most a quarter as often as responses \
                     released a block at a time (the talk's Q&A)",
                    netlane_rr::clients::HERD
                ),
                0.25,
                "x",
            );
            let load = self.pace_load;
            checks.push(match (find(Part::Pace, PACE[1]), find(Part::Pace, PACE[0])) {
                (Some(p), Some(u)) => spec.evaluate(
                    p.iter()
                        .zip(u)
                        .map(|(p, u)| crate::verdict::ratio(herd_share(p, load), herd_share(u, load)))
                        .collect(),
                    "paced / unpaced share of responses woken in herds, per round",
                ),
                _ => spec.skipped("the pace part did not run"),
            });
            let paired_ratios = |f: fn(&RrRun) -> Measure| -> Vec<f64> {
                match (find(Part::Pace, PACE[1]), find(Part::Pace, PACE[0])) {
                    (Some(p), Some(u)) => {
                        p.iter().zip(u).filter_map(|(p, u)| crate::verdict::ratio(f(p), f(u)).ok()).collect()
                    }
                    _ => Vec::new(),
                }
            };
            let (lat, cpu) = (paired_ratios(p50), paired_ratios(cost));
            if !lat.is_empty() && !cpu.is_empty() {
                notes.push(format!(
                    "Pacing's price: the paced p50 latency was {:.2}x the unpaced one and the server CPU per response \
                     {:.2}x (medians of the rounds' ratios): responses wait for their release instead of leaving with \
                     their block, and every release is a timer wake-up.",
                    median(lat),
                    median(cpu)
                ));
            }
        }

        let headline = {
            let get = |id: &str| measured_median(&checks, id);
            let parts = [
                get("rr.tpacket-v2-cost")
                    .map(|v| format!("TPACKET_V2 cost the server {v}x recvfrom's CPU per response")),
                get("rr.af-xdp-cost").map(|v| format!("AF_XDP {v}x")),
                get("rr.jumbo-throughput").map(|v| format!("jumbo frames gave {v}x the fragmented 8 KiB rate")),
                get("rr.tx-packet-8k-cost")
                    .map(|v| format!("8 KiB responses as frames via a packet ring cost {v}x the socket's CPU")),
            ];
            join_headline(parts.into_iter().flatten().collect())
                .unwrap_or_else(|| format!("{} modes, {} rounds.", modes.len(), self.repeat))
        };
        let options = self.options();
        ScenarioReport {
            name: "rr".into(),
            title: "Datagram request/response: receive paths, TPACKET_V3 blocks, the wall, large responses, transmit paths, pacing"
                .into(),
            description: format!(
                "A stateless UDP request/response server (one thread, pinned to CPU {}, with its end's threaded \
                 NAPI) in one network namespace and closed-loop clients (each its own socket, all on CPU {}) in \
                 another, joined by a veth pair (MTU {} but in the large part; the clients' end has threaded NAPI and GRO but \
                 not rx-udp-gro-forwarding, with which veth loses IP-fragmented responses). Throughput and latency are the \
                 clients' (the receiving side); the server CPU's idle share and CPU per response count everything on \
                 that CPU (the server thread, its NAPI, softirqs) over the clients' run. AF_XDP runs in native \
                 XDP, copy mode (veth has no zero-copy).",
                self.server_cpu, self.client_cpu, self.mtu
            ),
            headline,
            options: options.object(),
            echo: options.echo(),
            tables,
            charts,
            checks,
            flags,
            notes,
            runs,
            cpu_plan: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlane_report::Outcome;

    fn run(responses_per_s: f64, p50_ns: u64, busy_s: f64) -> RrRun {
        let responses = (responses_per_s * 2.0) as u64;
        RrRun {
            clients: ClientsReport {
                responses,
                responses_per_s,
                seconds: 2.0,
                latency_ns: netlane::metrics::Summary {
                    count: responses,
                    p50: p50_ns,
                    p99: p50_ns * 2,
                    p9999: p50_ns * 4,
                    ..Default::default()
                },
                ..ClientsReport::default()
            },
            server: ServerStats { responses, seconds: 2.0, ..ServerStats::default() },
            server_cpu: SystemCpuDelta { busy_s, total_s: 2.0, cpus: 1, ..SystemCpuDelta::default() },
        }
    }

    fn herd(mut r: RrRun, woken_in_herds: u64) -> RrRun {
        r.clients.wakeups = r.clients.responses / 2;
        r.clients.woken_sockets = r.clients.responses;
        r.clients.herd_woken_sockets = woken_in_herds;
        r
    }

    fn report_with(bad: &str, degenerate: RrRun) -> ScenarioReport {
        report_rounds(bad, degenerate, false)
    }

    /// `bad` (a mode's label) measured `degenerate` in the second round, or in both.
    fn report_rounds(bad: &str, degenerate: RrRun, both: bool) -> ScenarioReport {
        let a = RrBenchArgs::defaults();
        let modes = a.modes("10.0.0.1:7070".parse().unwrap());
        let all: Vec<Vec<RrRun>> = modes
            .iter()
            .map(|m| {
                let good = match m.label.as_str() {
                    "recvfrom" => run(40_000.0, 1_500_000, 1.9),
                    l if l.starts_with("32 per block, 64") => run(60_000.0, 1_000_000, 1.3),
                    l if l.starts_with("adaptive") => run(58_000.0, 1_000_000, 1.2),
                    l if l.starts_with("64 per block, 64") => run(8_000.0, 8_000_000, 0.1),
                    l if l.starts_with("8K whole") => run(34_000.0, 1_800_000, 1.8),
                    l if l.starts_with("8K") => run(24_000.0, 2_700_000, 1.9),
                    "unpaced" => herd(run(20_000.0, 1_000_000, 0.5), 8_000),
                    "paced" => herd(run(20_000.0, 1_800_000, 0.5), 100),
                    _ => run(60_000.0, 1_000_000, 1.5),
                };
                let second = if m.label == bad { degenerate.clone() } else { good.clone() };
                let first = if both && m.label == bad { degenerate.clone() } else { good };
                vec![first, second]
            })
            .collect();
        a.report(&modes, &all, Vec::new())
    }

    fn outcome(r: &ScenarioReport, id: &str) -> Outcome {
        r.checks.iter().find(|c| c.id == id).unwrap_or_else(|| panic!("no {id}")).outcome
    }

    #[test]
    fn good_rounds_meet_the_talks_shape() {
        let r = report_with("none", run(0.0, 0, 0.0));
        for c in &r.checks {
            assert_eq!(c.outcome, Outcome::Met, "{}: {:?} {}", c.id, c.measured, c.reason);
        }
        assert!(r.headline.contains("TPACKET_V2 cost the server"), "{}", r.headline);
    }

    #[test]
    fn the_report_says_where_no_fixed_block_could_meet_both_adaptive_targets() {
        // Every fixed block runs 25% idle but 32 per block at 64 clients (35%, the best rate).
        let r = report_with("none", run(0.0, 0, 0.0));
        let note = r.notes.iter().find(|n| n.contains("No fixed block met both")).expect("a note");
        assert!(note.contains("128 clients (0.00)") && !note.contains("64 clients"), "{note}");
        let shape = r.notes.iter().find(|n| n.contains("32 requests per block against")).expect("a note");
        assert!(shape.contains("64 clients 1.00x at 35% idle"), "{shape}");
        let price = r.notes.iter().find(|n| n.contains("Pacing's price")).expect("a note");
        assert!(price.contains("1.80x"), "{price}");
    }

    #[test]
    fn a_run_that_answered_nothing_is_invalid_never_met() {
        // recvfrom answered nothing in round 2: the cost ratio against it is invalid.
        let r = report_with("recvfrom", run(0.0, 0, 0.0));
        assert_eq!(outcome(&r, "rr.tpacket-v2-cost"), Outcome::Invalid);
        // The half-burst block answered nothing: its idle share is not "100% idle".
        let r = report_with("32 per block, 64 clients", run(0.0, 0, 0.0));
        assert_eq!(outcome(&r, "rr.block-half-burst-idle"), Outcome::Invalid);
        assert_eq!(outcome(&r, "rr.block-half-burst-throughput"), Outcome::Invalid);
        // An adaptive run that answered nothing is neither fast nor idle.
        let r = report_with("adaptive, 64 clients", run(0.0, 0, 0.0));
        assert_eq!(outcome(&r, "rr.adaptive-throughput"), Outcome::Invalid);
        assert_eq!(outcome(&r, "rr.adaptive-idle"), Outcome::Invalid);
        // A paced run that answered a fraction of the load is not a calm one; no herd to
        // spread without pacing is no evidence either.
        let r = report_with("paced", run(5_000.0, 1_000_000, 0.5));
        assert_eq!(outcome(&r, "rr.pace-herd"), Outcome::Invalid);
        let r = report_with("unpaced", run(20_000.0, 1_000_000, 0.5));
        assert_eq!(outcome(&r, "rr.pace-herd"), Outcome::Invalid);
        // No CPU time counted at all.
        let mut z = run(30_000.0, 1_000_000, 0.0);
        z.server_cpu.total_s = 0.0;
        let r = report_with("8K whole, MTU 9000", z);
        assert_eq!(outcome(&r, "rr.jumbo-throughput"), Outcome::Met);
        let r = report_with("recvfrom", {
            let mut z = run(30_000.0, 1_000_000, 0.0);
            z.server_cpu.total_s = 0.0;
            z
        });
        assert_eq!(outcome(&r, "rr.af-xdp-cost"), Outcome::Invalid);
        // A frame transmit run that sent half its responses through the socket does not
        // measure the frame path, however cheap it looks.
        let mut half = run(60_000.0, 1_000_000, 0.5);
        half.server.raw_tx =
            Some(netlane_rr::server::RawTxReport { datagrams: half.server.responses / 2, ..Default::default() });
        let r = report_with("packet, 8 KiB", half);
        assert_eq!(outcome(&r, "rr.tx-packet-8k-cost"), Outcome::Invalid);
    }

    #[test]
    fn the_adaptive_targets_hold_at_every_client_count_not_on_their_median() {
        // Three populations fine, 128 clients nearly saturated (10% idle) in both rounds:
        // a median over populations would read 40% idle; the worst reads 10%.
        let r = report_rounds("adaptive, 128 clients", run(58_000.0, 1_000_000, 1.8), true);
        assert_eq!(outcome(&r, "rr.adaptive-idle"), Outcome::Missed);
        assert_eq!(outcome(&r, "rr.adaptive-throughput"), Outcome::Met);
        let m = r.checks.iter().find(|c| c.id == "rr.adaptive-idle").and_then(|c| c.measured.clone()).unwrap();
        assert!((m.median - 10.0).abs() < 1e-6, "{m:?}");
        // Slow at one population: the throughput target is missed.
        let r = report_rounds("adaptive, 16 clients", run(30_000.0, 1_000_000, 1.2), true);
        assert_eq!(outcome(&r, "rr.adaptive-throughput"), Outcome::Missed);
    }

    #[test]
    fn a_block_holds_about_what_it_is_sized_for() {
        // 512-byte requests take 640 bytes each in a V3 block.
        assert_eq!(v3_request_footprint(512, false), 640);
        let (bytes, holds) = v3_block_for(32, 512, false);
        assert_eq!((bytes, holds), (24576, 38));
        for n in BLOCK_SWEEP {
            let (bytes, holds) = v3_block_for(n, 512, false);
            assert!(holds >= n && (bytes as usize).is_multiple_of(netlane_sys::packet::page_size()));
        }
    }
}

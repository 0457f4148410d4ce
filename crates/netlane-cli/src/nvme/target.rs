//! `netlane nvme target`.

use netlane_report::options::parse_endpoint;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::documents::NvmeTarget;
use anyhow::{Context, Result};
use clap::Args;
use netlane::cpus::CpuList;
use netlane::metrics::CounterSet;
use netlane_nvme::proto::target::{Subsystem, TargetConfig};
use netlane_nvme::target::{DEFAULT_NQN, TargetOptions, TargetServer};
use netlane_report::options::parse_positive_duration;

use super::parse_size_u32;
use crate::out::{self, OutputArgs};
use crate::signals::STOP;

/// `netlane nvme target`.
#[derive(Debug, Args)]
pub struct TargetArgs {
    /// Address to listen on (HOST:PORT, or a host alone: port 4420). Repeat for more
    /// ports (a host connecting to two has two paths: multipath).
    #[arg(long, default_value = "127.0.0.1:4420", value_parser = |s: &str| parse_endpoint(s, Some(4420)))]
    pub listen: Vec<SocketAddr>,
    /// An address the discovery log tells hosts to connect to, when it is not what the
    /// target listens on (NAT, a VM's forwarded port). Repeat for more ports.
    #[arg(long, value_parser = |s: &str| parse_endpoint(s, Some(4420)))]
    pub advertise: Vec<SocketAddr>,
    /// Subsystem NQN.
    #[arg(long, default_value = DEFAULT_NQN)]
    pub nqn: String,
    /// A namespace: mem:SIZE[:BS] or file:PATH[:SIZE[:BS]]. Repeat for more (NSIDs 1, 2, ...).
    #[arg(long = "ns", default_value = "mem:256M")]
    pub namespaces: Vec<String>,
    /// Reactor CPUs, one reactor each, as a CPU list (0-3,5) [default: every CPU].
    #[arg(long, value_parser = netlane::cpus::parse_online)]
    pub cpus: Option<CpuList>,
    /// Busy-poll the sockets (SO_BUSY_POLL microseconds) and spin instead of sleeping.
    #[arg(long)]
    pub busy_poll: Option<u32>,
    /// Spin on epoll with a zero timeout (without SO_BUSY_POLL).
    #[arg(long)]
    pub spin: bool,
    /// Never complete reads with the C2HData SUCCESS flag (always send a response capsule).
    #[arg(long)]
    pub no_c2h_success: bool,
    /// MAXH2CDATA offered to hosts, bytes.
    #[arg(long, default_value = "128K", value_parser = parse_size_u32)]
    pub maxh2cdata: u32,
    /// In-capsule data accepted on I/O queues, bytes.
    #[arg(long, default_value = "8K", value_parser = parse_size_u32)]
    pub in_capsule: u32,
    /// Largest C2HData PDU; longer reads are split.
    #[arg(long, default_value = "128K", value_parser = parse_size_u32)]
    pub c2h_max: u32,
    /// Largest R2T; longer writes take several.
    #[arg(long, default_value = "4M", value_parser = parse_size_u32)]
    pub r2t_max: u32,
    /// MDTS: largest transfer is 4 KiB << MDTS.
    #[arg(long, default_value_t = 9)]
    pub mdts: u8,
    /// Data one queue may hold for its commands (reads not yet sent, write buffers);
    /// at least one largest transfer.
    #[arg(long, default_value = "4M", value_parser = parse_size_u32)]
    pub queue_budget: u32,
    /// Most connections at once; more are closed as soon as accepted.
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// Most connections from one source address that have not yet finished ICReq and
    /// Connect; more from it are closed as soon as accepted.
    #[arg(long, default_value_t = netlane_nvme::target::DEFAULT_SETUP_PER_SOURCE)]
    pub max_setup_per_source: usize,
    /// Threads for storage operations that may block (file namespaces).
    #[arg(long, default_value_t = 4)]
    pub storage_threads: usize,
    /// A connection must finish ICReq and Connect within this.
    #[arg(long, default_value = "10s", value_parser = parse_positive_duration)]
    pub setup_timeout: Duration,
    /// Serve Prometheus metrics at http://ADDR/metrics (a loopback address): per-queue
    /// commands, bytes, errors by status, latency histogram; connections.
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Lanes: each connection goes to the reactor owning the receive queue it arrives on
    /// (by NAPI id; this device's queues dealt to the reactors in order); connections
    /// through no NAPI instance are dealt in turn [default: every connection in turn].
    #[arg(long)]
    pub lane_device: Option<String>,
    /// Stop after this long [default: run until SIGINT/SIGTERM].
    #[arg(short = 't', long, value_parser = parse_positive_duration)]
    pub time: Option<Duration>,
    /// Print a line of rates (commands, reads and writes, MB/s, errors per second) this
    /// often while serving, on stderr.
    #[arg(long, value_parser = parse_positive_duration)]
    pub stats_interval: Option<Duration>,
    /// Print the final counters as JSON to FILE, or to stdout with `-` (the first line,
    /// `listening on ...`, then goes to stderr).
    #[arg(long, value_name = "FILE|-", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub config: crate::config_file::ConfigFile,
}

impl TargetArgs {
    pub(super) fn run(&self) -> Result<u8> {
        let out = OutputArgs { json: self.json.clone(), csv: None };
        out.validate()?;
        let mut namespaces = Vec::new();
        for spec in &self.namespaces {
            namespaces.push(netlane_nvme::store::open_namespace(spec).map_err(anyhow::Error::msg)?);
        }
        let config = TargetConfig {
            nqn: self.nqn.clone(),
            mdts: self.mdts,
            maxh2cdata: self.maxh2cdata,
            in_capsule: self.in_capsule,
            c2h_max: self.c2h_max,
            r2t_max: self.r2t_max,
            c2h_success: !self.no_c2h_success,
            queue_budget: self.queue_budget,
            setup_timeout_ms: u32::try_from(self.setup_timeout.as_millis()).unwrap_or(u32::MAX),
            ports: self.advertise.clone(),
            ..TargetConfig::default()
        };
        let subsys = Subsystem::new(config, namespaces).map_err(anyhow::Error::msg)?;
        let cpus = self.cpus.clone().unwrap_or_else(CpuList::online);
        let opts = TargetOptions {
            listen: self.listen.clone(),
            cpus: cpus.as_slice().to_vec(),
            busy_poll: self.busy_poll,
            spin: self.spin,
            max_connections: self.max_connections,
            max_setup_per_source: self.max_setup_per_source,
            storage_threads: self.storage_threads,
            metrics_addr: self.metrics_addr,
            lane_device: self.lane_device.clone(),
        };
        let server = TargetServer::start(subsys, &opts).context("start the target")?;
        let addrs: Vec<String> = server.local_addrs().iter().map(|a| a.to_string()).collect();
        let addr = addrs.join(",");
        let line = format!(
            "listening on {addr} nqn={} reactors={cpus} namespaces={}{}",
            self.nqn,
            self.namespaces.join(","),
            server.metrics_addr().map_or(String::new(), |a| format!(" metrics=http://{a}/metrics"))
        );
        if out.json_to_stdout() {
            eprintln!("{line}");
        } else {
            out::println(&line);
        }
        let start = Instant::now();
        let mut last = (Rates::default(), Duration::ZERO);
        let stats = server
            .serve_ticking(&STOP, self.time, self.stats_interval, |server, elapsed| {
                let now = Rates::of(&server.stats());
                eprintln!("{}", now.line(&last.0, elapsed, elapsed.saturating_sub(last.1)));
                last = (now, elapsed);
            })
            .context("the target failed")?;
        let doc = netlane_report::document(
            "nvme-target",
            NvmeTarget {
                listen: addr.clone(),
                nqn: self.nqn.clone(),
                namespaces: self.namespaces.clone(),
                seconds: start.elapsed().as_secs_f64(),
                stats,
            },
        );
        if !out.json_to_stdout() {
            let s = &doc.body.stats;
            let mut line = format!(
                "stopped after {:.1} s: connections={} refused={} refused_in_setup={} commands={} errors={} rounds={} \
                 sends={} reactor_cpu_s={:.3}",
                doc.body.seconds,
                s.connections,
                s.refused,
                s.refused_in_setup,
                s.commands,
                s.errors.values().sum::<u64>(),
                s.rounds,
                s.sends,
                s.reactor_cpu.total_s(),
            );
            s.subsystem.each(&mut |name, _, v| line.push_str(&format!(" {name}={v}")));
            if let Some(l) = &s.lanes {
                let each: Vec<String> =
                    l.reactors.iter().map(|r| format!("cpu{}:napi{:?}:{}", r.cpu, r.napi_ids, r.connections)).collect();
                line.push_str(&format!(
                    " lanes={} by_owner={} new_ids={} no_napi={} reactors={}",
                    l.device,
                    l.by_owner,
                    l.new_ids,
                    l.no_napi,
                    each.join(",")
                ));
            }
            out::println(&line);
        }
        out.write_json(&doc)?;
        Ok(0)
    }
}

/// What a periodic line is made of: counts since the start.
#[derive(Debug, Default, Clone, Copy)]
struct Rates {
    commands: u64,
    reads: u64,
    writes: u64,
    bytes: u64,
    errors: u64,
}

impl Rates {
    fn of(s: &netlane_nvme::target::TargetStats) -> Rates {
        let c = &s.subsystem;
        Rates {
            commands: s.commands,
            reads: c.read_cmds,
            writes: c.write_cmds,
            bytes: (c.sectors_read + c.sectors_written) * 512,
            errors: s.errors.values().sum(),
        }
    }

    /// `[   5.0s] 120k commands/s (reads 100k/s, writes 20k/s) 491 MB/s, errors 0/s`
    /// over the interval since `before`.
    fn line(&self, before: &Rates, elapsed: Duration, interval: Duration) -> String {
        let s = interval.as_secs_f64().max(1e-9);
        let per_s = |now: u64, then: u64| netlane_report::format::si(now.saturating_sub(then) as f64 / s);
        format!(
            "[{:>7.1}s] {} commands/s (reads {}/s, writes {}/s) {:.1} MB/s, errors {}/s",
            elapsed.as_secs_f64(),
            per_s(self.commands, before.commands),
            per_s(self.reads, before.reads),
            per_s(self.writes, before.writes),
            self.bytes.saturating_sub(before.bytes) as f64 / s / 1e6,
            per_s(self.errors, before.errors),
        )
    }
}

//! `netlane nvme target` and `netlane nvme perf`.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use netlane_nvme::host::ConnectOptions;
use netlane_nvme::perf::{Caravan, CpuBinding, JobGroup, PerfOptions, PerfReport};
use netlane_nvme::proto::target::{Subsystem, TargetConfig};
use netlane_nvme::target::{TargetOptions, TargetServer};

use netlane_lab::report::ScenarioReport;
use netlane_lab::scenarios::parse_positive_duration;

use netlane_lab::scenarios::nvme::perf_table;
use netlane_nvme::target::DEFAULT_NQN;

/// NVMe/TCP target and host.
#[derive(Debug, Subcommand)]
pub enum NvmeCmd {
    /// Serve namespaces over NVMe/TCP until interrupted (or for --time).
    Target(Box<TargetArgs>),
    /// Connect to a target and run a fio-like workload.
    Perf(Box<PerfArgs>),
}

/// `netlane nvme target`.
#[derive(Debug, Args)]
pub struct TargetArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:4420")]
    pub listen: SocketAddr,
    /// Subsystem NQN.
    #[arg(long, default_value = DEFAULT_NQN)]
    pub nqn: String,
    /// A namespace: mem:SIZE[:BS] or file:PATH[:SIZE[:BS]]. Repeat for more (NSIDs 1, 2, ...).
    #[arg(long = "ns", default_value = "mem:256M")]
    pub namespaces: Vec<String>,
    /// Reactor CPUs, one reactor each (e.g. 0-1 or 1). Default: every CPU.
    #[arg(long, value_parser = netlane::cpus::parse_online)]
    pub cpus: Option<netlane::cpus::CpuList>,
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
    /// Stop after this long (default: run until interrupted).
    #[arg(long, value_parser = parse_positive_duration)]
    pub time: Option<Duration>,
    /// Print the counters as JSON when stopping.
    #[arg(long)]
    pub json: bool,
}

fn parse_size_u32(s: &str) -> Result<u32, String> {
    let v = netlane::metrics::units::parse_size(s).map_err(|e| e.to_string())?;
    u32::try_from(v).map_err(|_| format!("{s} is too large"))
}

impl TargetArgs {
    /// Starts the target, prints `listening on ADDR`, and serves.
    pub fn run(&self) -> Result<()> {
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
            ..TargetConfig::default()
        };
        let subsys = Subsystem::new(config, namespaces).map_err(anyhow::Error::msg)?;
        let cpus: Vec<usize> = self.cpus.clone().unwrap_or_else(netlane::cpus::CpuList::online).as_slice().to_vec();
        let opts =
            TargetOptions { listen: self.listen, cpus: cpus.clone(), busy_poll: self.busy_poll, spin: self.spin };
        let server = TargetServer::start(subsys.clone(), &opts).context("start the target")?;
        println!(
            "listening on {} nqn={} reactors={:?} namespaces={}",
            server.local_addr(),
            self.nqn,
            cpus,
            self.namespaces.join(",")
        );
        std::io::stdout().flush().ok();
        let start = std::time::Instant::now();
        loop {
            std::thread::sleep(Duration::from_millis(100));
            if server.is_finished() {
                bail!("a target thread stopped unexpectedly");
            }
            if self.time.is_some_and(|t| start.elapsed() >= t) {
                break;
            }
        }
        let stats = server.stop();
        if self.json {
            println!("{}", serde_json::to_string_pretty(&stats)?);
        } else {
            println!(
                "connections={} commands={} rounds={} sends={} reactor_cpu_s={:.3} keepalive_expiries={} terminations={}",
                stats.connections,
                stats.commands,
                stats.rounds,
                stats.sends,
                stats.reactor_cpu.total_s(),
                subsys.stats.keepalive_expiries.load(std::sync::atomic::Ordering::Relaxed),
                subsys.stats.terminations.load(std::sync::atomic::Ordering::Relaxed),
            );
        }
        Ok(())
    }
}

/// `netlane nvme perf`.
#[derive(Debug, Args, Clone)]
pub struct PerfArgs {
    /// Target address.
    #[arg(long, default_value = "127.0.0.1:4420")]
    pub target: SocketAddr,
    /// Subsystem NQN.
    #[arg(long, default_value = DEFAULT_NQN)]
    pub nqn: String,
    /// Namespace ID.
    #[arg(long, default_value_t = 1)]
    pub nsid: u32,
    /// I/O pattern: read, write, randread, randwrite, rw, randrw.
    #[arg(long, default_value = "randread")]
    pub rw: String,
    /// Percentage of reads for rw/randrw.
    #[arg(long)]
    pub rwmixread: Option<u8>,
    /// Block size.
    #[arg(long, default_value = "4K")]
    pub bs: String,
    /// Commands in flight per job.
    #[arg(long, default_value_t = 1)]
    pub qd: u32,
    /// Number of jobs (threads).
    #[arg(long, default_value_t = 1)]
    pub jobs: u32,
    /// CPUs the jobs are pinned to (e.g. 0 or 0-1), or `any` for unbound.
    #[arg(long, default_value = "any")]
    pub cpus: String,
    /// High-priority jobs: submit on poll queues and busy-poll for completions.
    #[arg(long)]
    pub hipri: bool,
    /// A job group as key=value pairs (name, rw, rwmixread, bs, qd, jobs, cpus with `+`
    /// between CPUs or `any`, hipri). Repeat for several groups; replaces --rw/--bs/--qd/--jobs/--cpus.
    #[arg(long = "group")]
    pub groups: Vec<String>,
    /// Measured time.
    #[arg(long, default_value = "5s", value_parser = parse_positive_duration)]
    pub time: Duration,
    /// Time before measuring starts.
    #[arg(long, default_value = "500ms", value_parser = netlane::metrics::units::parse_duration)]
    pub ramp: Duration,
    /// Default (write) queues; 0 = one per queue CPU.
    #[arg(long, default_value_t = 0)]
    pub queues: u16,
    /// Separate read queues (0 = reads share the default queues).
    #[arg(long, default_value_t = 0)]
    pub read_queues: u16,
    /// Poll queues (for --hipri jobs).
    #[arg(long, default_value_t = 0)]
    pub poll_queues: u16,
    /// CPUs the queues map onto, where their I/O workers run. Default: every CPU.
    #[arg(long, value_parser = netlane::cpus::parse_online)]
    pub queue_cpus: Option<netlane::cpus::CpuList>,
    /// Entries per I/O queue.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u16).range(1..))]
    pub queue_depth: u16,
    /// Send from the submitting thread when it runs on the queue's CPU and the queue is idle.
    #[arg(long)]
    pub direct_send: bool,
    /// One send per command instead of one per batch.
    #[arg(long)]
    pub no_batch: bool,
    /// i10 caravans: hold sends until 64 KiB, 16 requests or 50 us.
    #[arg(long)]
    pub caravan: bool,
    /// Write a pattern over each job's region first, then check every read against it.
    #[arg(long)]
    pub verify: bool,
    /// Bytes of the namespace to use.
    #[arg(long)]
    pub size: Option<String>,
    /// Header digests.
    #[arg(long)]
    pub hdgst: bool,
    /// Data digests.
    #[arg(long)]
    pub ddgst: bool,
    /// Keep-alive timeout, ms (0 = none).
    #[arg(long, default_value_t = 5000)]
    pub kato_ms: u32,
    /// Keep SQ flow control on (the target then never uses C2HData SUCCESS).
    #[arg(long)]
    pub sqflow: bool,
    /// PID of a local target process, to report its CPU per I/O.
    #[arg(long)]
    pub target_pid: Option<u32>,
    /// Write the report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

impl PerfArgs {
    /// The perf options these arguments describe.
    pub fn options(&self) -> Result<PerfOptions> {
        let groups = if self.groups.is_empty() {
            let mut spec = format!("name=job,rw={},bs={},qd={},jobs={}", self.rw, self.bs, self.qd, self.jobs);
            if let Some(m) = self.rwmixread {
                spec.push_str(&format!(",rwmixread={m}"));
            }
            spec.push_str(&format!(",cpus={}", self.cpus));
            if self.hipri {
                spec.push_str(",hipri=1");
            }
            vec![JobGroup::parse(&spec).map_err(anyhow::Error::msg)?]
        } else {
            let mut v = Vec::new();
            for (i, g) in self.groups.iter().enumerate() {
                let mut g = JobGroup::parse(g).map_err(|e| anyhow::anyhow!("--group {g:?}: {e}"))?;
                if g.name == "job" {
                    g.name = format!("group{i}");
                }
                if v.iter().any(|o: &JobGroup| o.name == g.name) {
                    bail!("two groups are named {:?}", g.name);
                }
                v.push(g);
            }
            v
        };
        for g in &groups {
            if let CpuBinding::Pinned(c) = &g.cpus {
                c.check_online().with_context(|| format!("group {}", g.name))?;
            }
        }
        let size = match &self.size {
            Some(s) => Some(netlane::metrics::units::parse_size(s).map_err(|e| anyhow::anyhow!("--size: {e}"))?),
            None => None,
        };
        let mut connect = ConnectOptions::new(self.target, &self.nqn);
        connect.hdgst = self.hdgst;
        connect.ddgst = self.ddgst;
        connect.kato_ms = self.kato_ms;
        connect.disable_sqflow = !self.sqflow;
        Ok(PerfOptions {
            connect,
            nsid: self.nsid,
            groups,
            duration: self.time,
            ramp: self.ramp,
            queues: self.queues,
            read_queues: self.read_queues,
            poll_queues: self.poll_queues,
            queue_cpus: self.queue_cpus.clone().unwrap_or_else(netlane::cpus::CpuList::online),
            queue_depth: self.queue_depth,
            direct_send: self.direct_send,
            batch: !self.no_batch,
            caravan: self.caravan.then(Caravan::default),
            verify: self.verify,
            size,
            target_pid: self.target_pid,
        })
    }

    /// `key=value` echo of the resolved options.
    pub fn echo(&self, o: &PerfOptions) -> Vec<(String, String)> {
        let mut v = vec![
            ("target".to_string(), self.target.to_string()),
            ("nqn".into(), self.nqn.clone()),
            ("nsid".into(), self.nsid.to_string()),
            ("time".into(), format!("{:?}", self.time)),
            ("ramp".into(), format!("{:?}", self.ramp)),
            ("queues".into(), if self.queues == 0 { o.queue_cpus.len() as u16 } else { self.queues }.to_string()),
            ("read_queues".into(), self.read_queues.to_string()),
            ("poll_queues".into(), self.poll_queues.to_string()),
            ("queue_cpus".into(), format!("{:?}", o.queue_cpus)),
            ("queue_depth".into(), self.queue_depth.to_string()),
            ("direct_send".into(), self.direct_send.to_string()),
            ("batch".into(), (!self.no_batch).to_string()),
            ("caravan".into(), self.caravan.to_string()),
            ("verify".into(), self.verify.to_string()),
            ("hdgst".into(), self.hdgst.to_string()),
            ("ddgst".into(), self.ddgst.to_string()),
            ("kato_ms".into(), self.kato_ms.to_string()),
            ("sqflow".into(), self.sqflow.to_string()),
        ];
        for g in &o.groups {
            v.push((
                format!("group.{}", g.name),
                format!(
                    "rw={}{} bs={} qd={} jobs={} cpus={} hipri={}",
                    if g.random { "rand" } else { "" },
                    match g.read_pct {
                        100 => "read".to_string(),
                        0 => "write".to_string(),
                        p => format!("rw(read {p}%)"),
                    },
                    g.bs,
                    g.qd,
                    g.jobs,
                    match &g.cpus {
                        CpuBinding::Unbound => "any".to_string(),
                        CpuBinding::Pinned(c) => format!("{c:?}"),
                    },
                    g.hipri
                ),
            ));
        }
        v
    }
}

impl PerfArgs {
    /// Runs and returns the report.
    pub fn run(&self) -> Result<(ScenarioReport, PerfReport)> {
        let opts = self.options()?;
        let r = netlane_nvme::perf::run(&opts).context("nvme perf")?;
        let mut rep = ScenarioReport {
            name: "nvme-perf".into(),
            title: "NVMe/TCP perf".into(),
            description: String::new(),
            options: self.echo(&opts),
            tables: vec![perf_table("groups", "Per group (latency of the group's main direction)", &r)],
            charts: Vec::new(),
            checks: Vec::new(),
            notes: vec![format!(
                "total {:.0} IOPS; host CPU {:.2} us/IO, {:.2} context switches/IO{}; {} direct sends, {} via I/O workers, {:.2} commands per send(); queues {:?}",
                r.iops,
                r.host_cpu_us_per_io,
                r.host_switches_per_io,
                r.target_cpu_us_per_io.map(|t| format!("; target CPU {t:.2} us/IO")).unwrap_or_default(),
                r.direct_sends,
                r.worker_sends,
                r.cmds_per_send,
                r.queues,
            )],
            raw: serde_json::to_value(&r)?,
        };
        if r.verified {
            let mism: u64 = r.groups.iter().map(|g| g.mismatches).sum();
            rep.notes.push(format!("verify: {mism} mismatched reads"));
        }
        Ok((rep, r))
    }
}

/// Runs `netlane nvme ...`.
pub fn run(cmd: &NvmeCmd) -> Result<()> {
    match cmd {
        NvmeCmd::Target(a) => a.run(),
        NvmeCmd::Perf(a) => {
            let (rep, r) = a.run()?;
            rep.print();
            if let Some(p) = &a.json {
                std::fs::write(p, serde_json::to_string_pretty(&rep)?)
                    .with_context(|| format!("write {}", p.display()))?;
            }
            let errors: u64 = r.groups.iter().map(|g| g.errors + g.mismatches).sum();
            if errors > 0 {
                bail!("{errors} commands failed or read back wrong data");
            }
            Ok(())
        }
    }
}

//! `netlane nvme target` and `netlane nvme perf`: arguments in, library calls, output.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::documents::{NvmePerf, NvmeTarget};
use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use netlane::cpus::CpuList;
use netlane::metrics::CounterSet;
use netlane_lab::scenarios::nvme::perf_table;
use netlane_nvme::host::ConnectOptions;
use netlane_nvme::perf::{Caravan, JobGroup, PerfOptions, PerfReport, Status, VerifyMode};
use netlane_nvme::proto::target::{Subsystem, TargetConfig};
use netlane_nvme::target::{DEFAULT_NQN, TargetOptions, TargetServer};
use netlane_report::options::{OptionList, parse_duration, parse_positive_duration};
use netlane_report::terminal;

use crate::out::{self, OutputArgs};
use crate::signals::STOP;

/// NVMe/TCP target and host.
#[derive(Debug, Subcommand)]
pub enum NvmeCmd {
    /// Serve namespaces over NVMe/TCP until SIGINT/SIGTERM (or --time); then print the
    /// final counters and exit 0.
    Target(Box<TargetArgs>),
    /// Connect to a target and run a fio-like workload (fio's option names work too).
    Perf(Box<PerfArgs>),
}

fn parse_size_u32(s: &str) -> Result<u32, String> {
    let v = netlane::metrics::units::parse_size(s).map_err(|e| e.to_string())?;
    u32::try_from(v).map_err(|_| format!("{s} is too large"))
}

/// `netlane nvme target`.
#[derive(Debug, Args)]
pub struct TargetArgs {
    /// Address to listen on. Repeat for more ports (a host connecting to two has two
    /// paths: multipath).
    #[arg(long, default_value = "127.0.0.1:4420")]
    pub listen: Vec<SocketAddr>,
    /// An address the discovery log tells hosts to connect to, when it is not what the
    /// target listens on (NAT, a VM's forwarded port). Repeat for more ports.
    #[arg(long)]
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
    /// Stop after this long [default: run until SIGINT/SIGTERM].
    #[arg(short = 't', long, value_parser = parse_positive_duration)]
    pub time: Option<Duration>,
    /// Print the final counters as JSON to FILE, or to stdout with `-` (the first line,
    /// `listening on ...`, then goes to stderr).
    #[arg(long, value_name = "FILE|-", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<std::path::PathBuf>,
}

impl TargetArgs {
    fn run(&self) -> Result<u8> {
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
        };
        let server = TargetServer::start(subsys, &opts).context("start the target")?;
        let addrs: Vec<String> = server.local_addrs().iter().map(|a| a.to_string()).collect();
        let addr = addrs.join(",");
        let line =
            format!("listening on {addr} nqn={} reactors={cpus} namespaces={}", self.nqn, self.namespaces.join(","));
        let metrics = server.metrics_addr().map(|a| format!("metrics at http://{a}/metrics"));
        for l in std::iter::once(line).chain(metrics) {
            if out.json_to_stdout() {
                eprintln!("{l}");
            } else {
                out::println(&l);
            }
        }
        let start = Instant::now();
        let stats = server.serve(&STOP, self.time).context("the target failed")?;
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
            out::println(&line);
        }
        out.write_json(&doc)?;
        Ok(0)
    }
}

/// Jobs' CPUs: a CPU list, or `any` for unbound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobCpus {
    /// Not pinned.
    Any,
    /// Pinned to these.
    List(CpuList),
}

fn parse_job_cpus(s: &str) -> Result<JobCpus, String> {
    if s == "any" { Ok(JobCpus::Any) } else { netlane::cpus::parse_online(s).map(JobCpus::List) }
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
    #[arg(long, alias = "iodepth", default_value_t = 1)]
    pub qd: u32,
    /// Number of jobs (threads).
    #[arg(long, alias = "numjobs", default_value_t = 1)]
    pub jobs: u32,
    /// CPUs the jobs are pinned to, as a CPU list (0-3,5), or `any` for unbound.
    #[arg(long, alias = "cpus_allowed", default_value = "any", value_parser = parse_job_cpus)]
    pub cpus: JobCpus,
    /// High-priority jobs: submit on poll queues and busy-poll for completions.
    #[arg(long)]
    pub hipri: bool,
    /// A job group as key=value pairs (name, rw, rwmixread, bs, qd, jobs, cpus as a CPU
    /// list or `any`, hipri). Repeat for several groups; replaces --rw/--bs/--qd/--jobs/--cpus.
    #[arg(long = "group")]
    pub groups: Vec<String>,
    /// Measured time.
    #[arg(short = 't', long, alias = "runtime", default_value = "5s", value_parser = parse_positive_duration)]
    pub time: Duration,
    /// Time before measuring starts.
    #[arg(long, alias = "ramp_time", default_value = "500ms", value_parser = parse_duration)]
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
    /// CPUs the queues map onto, where their I/O workers run, as a CPU list [default: every CPU].
    #[arg(long, value_parser = netlane::cpus::parse_online)]
    pub queue_cpus: Option<CpuList>,
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
    /// Write nothing: read every block of each job's region once and check it against
    /// the pattern an earlier --verify run left (with the same --jobs and --size), e.g.
    /// across a target restart. The run ends when every block was read.
    #[arg(long, alias = "verify_only", conflicts_with = "verify")]
    pub verify_only: bool,
    /// Bytes of the namespace to use [default: all of it].
    #[arg(long, value_parser = netlane_report::options::parse_size)]
    pub size: Option<u64>,
    /// Header digests.
    #[arg(long)]
    pub hdgst: bool,
    /// Data digests.
    #[arg(long)]
    pub ddgst: bool,
    /// Keep-alive timeout (0 = none).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub kato: Duration,
    /// Keep SQ flow control on (the target then never uses C2HData SUCCESS).
    #[arg(long)]
    pub sqflow: bool,
    /// PID of a local target process, to report its CPU per I/O.
    #[arg(long)]
    pub target_pid: Option<u32>,
    #[command(flatten)]
    pub out: OutputArgs,
}

impl PerfArgs {
    /// The job groups: `--group`s, or one from --rw/--bs/--qd/--jobs/--cpus.
    fn groups(&self) -> Result<Vec<JobGroup>> {
        if self.groups.is_empty() {
            let mut spec = format!("name=job,rw={},bs={},qd={},jobs={}", self.rw, self.bs, self.qd, self.jobs);
            if let Some(m) = self.rwmixread {
                spec.push_str(&format!(",rwmixread={m}"));
            }
            match &self.cpus {
                JobCpus::Any => spec.push_str(",cpus=any"),
                JobCpus::List(c) => spec.push_str(&format!(",cpus={c}")),
            }
            if self.hipri {
                spec.push_str(",hipri=1");
            }
            return Ok(vec![JobGroup::parse(&spec).map_err(anyhow::Error::msg)?]);
        }
        let mut v: Vec<JobGroup> = Vec::new();
        for (i, g) in self.groups.iter().enumerate() {
            let mut g = JobGroup::parse(g).map_err(|e| anyhow::anyhow!("--group {g:?}: {e}"))?;
            if g.name == "job" {
                g.name = format!("group{i}");
            }
            if v.iter().any(|o| o.name == g.name) {
                bail!("two groups are named {:?}", g.name);
            }
            v.push(g);
        }
        Ok(v)
    }

    /// The perf options these arguments describe.
    pub fn options(&self) -> Result<PerfOptions> {
        let groups = self.groups()?;
        for g in &groups {
            if let netlane_nvme::perf::CpuBinding::Pinned(c) = &g.cpus {
                c.check_online().with_context(|| format!("group {}", g.name))?;
            }
        }
        let kato_ms = u32::try_from(self.kato.as_millis()).context("--kato is too long")?;
        let mut connect = ConnectOptions::new(self.target, &self.nqn);
        connect.hdgst = self.hdgst;
        connect.ddgst = self.ddgst;
        connect.kato_ms = kato_ms;
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
            queue_cpus: self.queue_cpus.clone().unwrap_or_else(CpuList::online),
            queue_depth: self.queue_depth,
            direct_send: self.direct_send,
            batch: !self.no_batch,
            caravan: self.caravan.then(Caravan::default),
            verify: match (self.verify, self.verify_only) {
                (_, true) => VerifyMode::ReadBack,
                (true, false) => VerifyMode::Write,
                (false, false) => VerifyMode::Off,
            },
            size: self.size,
            target_pid: self.target_pid,
        })
    }

    /// The resolved options, echoed (`--key=value` reads each back).
    fn echo(&self, o: &PerfOptions) -> OptionList {
        let mut l = OptionList::new()
            .text("target", self.target.to_string())
            .text("nqn", &self.nqn)
            .int("nsid", u64::from(self.nsid))
            .duration("time", self.time)
            .duration("ramp", self.ramp)
            .int("queues", u64::from(if self.queues == 0 { o.queue_cpus.len() as u16 } else { self.queues }))
            .int("read-queues", u64::from(self.read_queues))
            .int("poll-queues", u64::from(self.poll_queues))
            .cpus("queue-cpus", &o.queue_cpus)
            .int("queue-depth", u64::from(self.queue_depth))
            .flag("direct-send", self.direct_send)
            .flag("no-batch", self.no_batch)
            .flag("caravan", self.caravan)
            .flag("verify", self.verify)
            .flag("verify-only", self.verify_only)
            .flag("hdgst", self.hdgst)
            .flag("ddgst", self.ddgst)
            .duration("kato", self.kato)
            .flag("sqflow", self.sqflow);
        if let Some(s) = self.size {
            l = l.size("size", s);
        }
        for g in &o.groups {
            l = l.text("group", g.to_string());
        }
        l
    }

    fn run(&self) -> Result<u8> {
        self.out.validate()?;
        let opts = self.options()?;
        let echo = self.echo(&opts);
        let quiet = self.out.json_to_stdout();
        if !quiet {
            for e in echo.echo() {
                out::println(&e);
            }
        }
        let mut status = LiveStatus::new();
        let r = netlane_nvme::perf::run_observed(&opts, &mut |s| status.show(s)).context("nvme perf")?;
        status.done();
        let table = perf_table("nvme-perf", "Per group (latency of the group's main direction)", &r);
        let doc =
            netlane_report::document("nvme-perf", NvmePerf { options: echo.object(), echo: echo.echo(), report: r });
        if !quiet {
            out::print(&terminal::table(&table));
            out::println(&summary(&doc.body.report, self.verify_only));
        }
        self.out.write_json(&doc)?;
        self.out.write_tables(&doc.provenance.run_id, &[table])?;
        let r = &doc.body.report;
        let errors: u64 = r.groups.iter().map(|g| g.errors + g.mismatches).sum();
        if errors > 0 {
            bail!("{errors} commands failed or read back wrong data");
        }
        Ok(0)
    }
}

fn summary(r: &PerfReport, verify_only: bool) -> String {
    let f = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2}"));
    let mut s = format!(
        "total {:.0} IOPS; host CPU {} us/IO, {} context switches/IO; target CPU {} us/IO; {} direct sends, {} via I/O \
         workers, {} commands per send; queues {}",
        r.iops,
        f(r.host_cpu_us_per_io),
        f(r.host_switches_per_io),
        f(r.target_cpu_us_per_io),
        r.direct_sends,
        r.worker_sends,
        f(r.cmds_per_send),
        r.queues.iter().map(|q| format!("{}:{}@cpu{}", q.set, q.qid, q.cpu)).collect::<Vec<_>>().join(","),
    );
    if r.verified {
        let mism: u64 = r.groups.iter().map(|g| g.mismatches).sum();
        s.push_str(&format!("\nverify: {mism} mismatched reads"));
        if verify_only {
            let reads: u64 = r.groups.iter().map(|g| g.reads).sum();
            s.push_str(&format!(" of {reads}, every block of the jobs' regions"));
        }
    }
    s
}

/// fio's status line on stderr: `[ 45%] 12.3k IOPS, eta 3s`, rewritten in place on a
/// terminal, a line a second otherwise.
struct LiveStatus {
    tty: bool,
    last: Option<(Duration, u64)>,
    last_line: Instant,
}

impl LiveStatus {
    fn new() -> LiveStatus {
        LiveStatus { tty: std::io::stderr().is_terminal(), last: None, last_line: Instant::now() }
    }

    fn show(&mut self, s: &Status) {
        if STOP.is_stopped() {
            return;
        }
        let iops = match self.last {
            Some((t, n)) if s.elapsed > t => (s.completed - n) as f64 / (s.elapsed - t).as_secs_f64(),
            _ => 0.0,
        };
        self.last = Some((s.elapsed, s.completed));
        let pct = 100.0 * s.elapsed.as_secs_f64() / s.total.as_secs_f64().max(1e-9);
        let eta = s.total.saturating_sub(s.elapsed).as_secs();
        let line = format!(
            "[{:>3.0}%] {} {} IOPS, eta {eta}s",
            pct.min(100.0),
            if s.measuring { "measuring" } else { "ramping  " },
            netlane_report::format::si(iops)
        );
        if self.tty {
            eprint!("\r{line}   ");
        } else if self.last_line.elapsed() >= Duration::from_secs(1) {
            eprintln!("{line}");
            self.last_line = Instant::now();
        }
    }

    fn done(&self) {
        if self.tty && self.last.is_some() {
            eprint!("\r{:60}\r", "");
        }
    }
}

/// Runs `netlane nvme ...`.
pub fn run(cmd: NvmeCmd) -> Result<u8> {
    match cmd {
        NvmeCmd::Target(a) => a.run(),
        NvmeCmd::Perf(a) => a.run(),
    }
}

#[cfg(test)]
mod tests {
    use netlane_nvme::perf::CpuBinding;

    use super::*;
    use crate::testing::parse_command;

    /// The lab runs `netlane nvme perf` with the arguments it writes for its options:
    /// they must give back those options.
    #[test]
    fn the_lab_s_perf_arguments_give_back_its_options() {
        let g = |s: &str| JobGroup::parse(s).unwrap();
        let mut connect = ConnectOptions::new("10.0.0.1:4420".parse().unwrap(), DEFAULT_NQN);
        connect.kato_ms = 10_000;
        let base = PerfOptions {
            connect,
            nsid: 1,
            groups: vec![g("name=qd1,rw=randread,bs=4k,qd=1,jobs=1,cpus=0")],
            duration: Duration::from_millis(1500),
            ramp: Duration::from_millis(300),
            queues: 1,
            read_queues: 0,
            poll_queues: 0,
            queue_cpus: CpuList::one(0),
            queue_depth: 128,
            direct_send: false,
            batch: true,
            caravan: None,
            verify: VerifyMode::Off,
            size: None,
            target_pid: Some(4242),
        };
        let mut digests = base.connect.clone();
        (digests.hdgst, digests.ddgst, digests.disable_sqflow, digests.kato_ms) = (true, true, false, 0);
        let writer = JobGroup { cpus: CpuBinding::Unbound, ..g("name=writer,rw=write,bs=1M,qd=32,jobs=1") };
        let all = [
            base.clone(),
            PerfOptions { direct_send: true, batch: false, caravan: Some(Caravan::default()), ..base.clone() },
            PerfOptions {
                groups: vec![g("name=readers,rw=randread,bs=4k,qd=1,jobs=16,cpus=1,hipri=1"), writer],
                read_queues: 1,
                poll_queues: 1,
                queue_cpus: CpuList::new(vec![0, 1]),
                verify: VerifyMode::Write,
                size: Some(64 << 20),
                target_pid: None,
                connect: digests,
                ..base.clone()
            },
            PerfOptions { verify: VerifyMode::ReadBack, ..base },
        ];
        for o in all {
            let args = netlane_lab::scenarios::nvme::perf_args(&o);
            assert_eq!(args[..2], ["nvme", "perf"]);
            let mut back = parse_command::<PerfArgs>(&args).options().unwrap();
            // Without /etc/nvme/hostnqn each connection names a new host: not an option.
            (back.connect.hostnqn, back.connect.hostid) = (o.connect.hostnqn.clone(), o.connect.hostid);
            assert_eq!(format!("{back:?}"), format!("{o:?}"), "{args:?}");
        }
    }
}

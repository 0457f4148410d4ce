//! `netlane nvme perf`: alone, as one agent, or coordinating agents on other hosts.

use netlane_report::options::parse_endpoint;
use std::net::SocketAddr;
use std::time::Duration;

use crate::documents::NvmePerf;
use anyhow::{Context, Result, bail};
use clap::Args;
use netlane::cpus::CpuList;
use netlane::lanes::busy::BusyPoll;
use netlane::metrics::Summary;
use netlane::metrics::sla::Sla;
use netlane_lab::scenarios::nvme::{NvmeAgent, perf_table};
use netlane_nvme::host::ConnectOptions;
use netlane_nvme::perf::{AgentOutput, Caravan, JobGroup, PerfOptions, PerfReport, VerifyMode};
use netlane_nvme::target::DEFAULT_NQN;
use netlane_report::options::{OptionList, parse_duration, parse_positive_duration};
use netlane_report::terminal;

use crate::agents::AgentHostsArgs;
use crate::out::{self, OutputArgs};
use crate::signals::StartGate;

/// Jobs' CPUs: a CPU list, or `any` for unbound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobCpus {
    /// Not pinned.
    Any,
    /// Pinned to these.
    List(CpuList),
}

fn parse_job_cpus(s: &str) -> Result<JobCpus, String> {
    // Checked where the jobs run (nvme perf's own check; each agent's on its machine).
    if s == "any" { Ok(JobCpus::Any) } else { netlane::cpus::parse_list(s).map(JobCpus::List) }
}

/// `netlane nvme perf`.
#[derive(Debug, Args, Clone)]
pub struct PerfArgs {
    /// Target address: HOST:PORT, or a host alone (port 4420).
    #[arg(long, default_value = "127.0.0.1:4420", value_parser = |s: &str| parse_endpoint(s, Some(4420)))]
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
    /// Reap poll queues with the kernel's busy polling, USECS[,BUDGET[,prefer]]: a job
    /// that finds no completion waits in epoll_wait, which polls the queues' NAPI
    /// instance for USECS before it sleeps until an interrupt wakes it [default: jobs
    /// spin in user space and never sleep].
    #[arg(long, requires = "poll_queues")]
    pub busy_poll: Option<BusyPoll>,
    // Interrupt moderation on the interface towards the target.
    #[command(flatten)]
    pub napi: crate::napi_args::NapiArgs,
    /// The device's own interrupt coalescing on the interface towards the target, NAME=VALUE
    /// as ethtool -C names it (rx-usecs=100, adaptive-rx=off; repeatable): read back and
    /// put back at exit. A device without coalescing (veth) refuses it: the run goes on and
    /// says so.
    #[arg(long, value_parser = parse_coalesce)]
    pub coalesce: Vec<(String, u32)>,
    /// CPUs the queues map onto, where their I/O workers run, as a CPU list [default: every
    /// CPU; with --agents, every CPU of each agent's host].
    #[arg(long, value_parser = netlane::cpus::parse_list)]
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
    /// Wake a sleeping queue worker for every command, instead of once the batch for its
    /// queue is complete (the block layer's rule).
    #[arg(long)]
    pub wake_each: bool,
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
    /// Thread ids on this machine whose CPU time counts with the target's (its NAPI
    /// threads: its receive work), comma separated; needs --target-pid.
    #[arg(long, value_delimiter = ',', requires = "target_pid")]
    pub target_threads: Vec<u32>,
    #[command(flatten)]
    pub hosts: AgentHostsArgs,
    /// Run as one agent of a run that `--agents` coordinates (it starts this; every agent
    /// runs the whole workload, as fio --client does, so N hosts make N times the load):
    /// connect every queue, say `ready` on standard error, start the jobs on SIGUSR1
    /// (within a minute), and write each group's whole latency histograms with the report.
    #[arg(long)]
    pub agent: bool,
    /// A tail-latency objective for every group's main direction (reads, or writes where
    /// a group writes more), like p99.9=1ms, at p50, p90, p99, p99.9, p99.99 or p100: the
    /// run says whether each held.
    #[arg(long, conflicts_with = "agent", value_parser = parse_sla)]
    pub sla: Option<Sla>,
    /// Exit with status 3 when a group missed --sla.
    #[arg(long, requires = "sla")]
    pub strict: bool,
    #[command(flatten)]
    pub out: OutputArgs,
}

/// A percentile as a fraction, and the summary's field that holds it.
type Kept = (f64, fn(&Summary) -> u64);

/// The percentiles a run's report keeps.
const KEPT: [Kept; 6] = [
    (0.5, |s| s.p50),
    (0.9, |s| s.p90),
    (0.99, |s| s.p99),
    (0.999, |s| s.p999),
    (0.9999, |s| s.p9999),
    (1.0, |s| s.max),
];

/// `NAME=VALUE` of the device's interrupt coalescing (`rx-usecs=100`, `adaptive-rx=off`).
fn parse_coalesce(s: &str) -> Result<(String, u32), String> {
    if !s.contains('=') {
        return Err(format!("{s:?}: expected NAME=VALUE (rx-usecs=100, adaptive-rx=off)"));
    }
    let (_, name, value) = netlane::topology::ethtool::Group::parse_setting(&format!("coalesce.{s}"))?;
    Ok((name, value))
}

/// An SLA at a percentile the report keeps.
fn parse_sla(s: &str) -> Result<Sla, String> {
    let sla: Sla = s.parse().map_err(|e: netlane::metrics::sla::SlaError| e.to_string())?;
    if KEPT.iter().any(|(q, _)| (q - sla.quantile()).abs() < 1e-9) {
        Ok(sla)
    } else {
        Err(format!("{s}: at p50, p90, p99, p99.9, p99.99 or p100 (the percentiles a run keeps)"))
    }
}

/// Each group's latency at `sla`'s percentile in its main direction (None: nothing
/// completed), and whether every group held it.
fn judge(sla: &Sla, r: &PerfReport) -> (Vec<(String, Option<u64>)>, bool) {
    let field = KEPT.iter().find(|(q, _)| (q - sla.quantile()).abs() < 1e-9).map(|(_, f)| *f);
    let at: Vec<(String, Option<u64>)> = r
        .groups
        .iter()
        .map(|g| {
            let lat = if g.reads >= g.writes { &g.read_lat_ns } else { &g.write_lat_ns };
            (g.name.clone(), field.filter(|_| lat.count > 0).map(|f| f(lat)))
        })
        .collect();
    let met = at.iter().all(|(_, v)| sla.is_met_at(*v));
    (at, met)
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
            let named = g.split(',').any(|kv| kv.trim().starts_with("name="));
            let mut g = JobGroup::parse(g).map_err(|e| anyhow::anyhow!("--group {g:?}: {e}"))?;
            // Unnamed groups are numbered; a name given (`job` too, as an agent's
            // coordinator writes it) stays.
            if !named {
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
        // With --agents, the CPUs are the agents' (each checks its own).
        if !self.hosts.any() {
            for g in &groups {
                if let netlane_nvme::perf::CpuBinding::Pinned(c) = &g.cpus {
                    c.check_online().with_context(|| format!("group {}", g.name))?;
                }
            }
            if let Some(c) = &self.queue_cpus {
                c.check_online().context("--queue-cpus")?;
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
            wake_each: self.wake_each,
            caravan: self.caravan.then(Caravan::default),
            verify: match (self.verify, self.verify_only) {
                (_, true) => VerifyMode::ReadBack,
                (true, false) => VerifyMode::Write,
                (false, false) => VerifyMode::Off,
            },
            size: self.size,
            target_pid: self.target_pid,
            target_threads: self.target_threads.clone(),
            busy_poll: self.busy_poll,
            napi: self.napi.settings(),
            coalesce: {
                let mut seen = std::collections::BTreeMap::new();
                for (name, value) in &self.coalesce {
                    if seen.insert(name.clone(), *value).is_some() {
                        anyhow::bail!("--coalesce {name}: given twice");
                    }
                }
                seen
            },
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
            .flag("wake-each", self.wake_each)
            .flag("caravan", self.caravan)
            .flag("verify", self.verify)
            .flag("verify-only", self.verify_only)
            .flag("hdgst", self.hdgst)
            .flag("ddgst", self.ddgst)
            .duration("kato", self.kato)
            .flag("sqflow", self.sqflow);
        if let Some(bp) = self.busy_poll {
            l = l.text("busy-poll", bp.to_string());
        }
        l = l.extend(self.napi.echo());
        for (name, value) in &o.coalesce {
            l = l.text("coalesce", format!("{name}={value}"));
        }
        if let Some(s) = self.size {
            l = l.size("size", s);
        }
        for g in &o.groups {
            l = l.text("group", g.to_string());
        }
        l
    }

    pub(super) fn run(&self) -> Result<u8> {
        self.out.validate()?;
        let opts = self.options()?;
        if self.hosts.any() {
            // Agents on other hosts cannot see a local target, and each would write its
            // own pattern over the same blocks.
            for (on, flag) in [
                (self.target_pid.is_some(), "--target-pid"),
                (self.verify, "--verify"),
                (self.verify_only, "--verify-only"),
            ] {
                if on {
                    bail!("--agents cannot be combined with {flag}");
                }
            }
        }
        let echo = self.echo(&opts);
        let quiet = self.out.json_to_stdout();
        if !quiet {
            for e in echo.echo() {
                out::println(&e);
            }
        }
        if self.agent {
            // The coordinator judges the run, so one that failed commands is written and
            // exits 0 like any other.
            let gate = StartGate::register()?;
            let ready = format!("ready: queues connected to {}", opts.connect.addr);
            let (r, latencies) = netlane_nvme::perf::run_gated(&opts, &mut |_| {}, &mut || {
                gate.wait(&ready).map_err(netlane_nvme::perf::PerfError::Invalid)
            })
            .context("nvme perf")?;
            let agent = Some(AgentOutput::of(&latencies));
            let doc = NvmePerf {
                options: echo.object(),
                echo: echo.echo(),
                report: r,
                agent,
                agents: None,
                sla: None,
                sla_met: None,
            };
            self.out.write_json(&netlane_report::document("nvme-perf", doc))?;
            return Ok(0);
        }
        let (r, agents) = if self.hosts.any() {
            let hosts = self.hosts.connect()?;
            let (r, parts) = netlane_lab::scenarios::nvme::run_perf(&hosts.agents(), &opts, self.queue_cpus.is_none())?;
            if !quiet {
                for a in &parts {
                    out::println(&agent_line(a));
                }
            }
            (r, Some(parts))
        } else {
            let mut status = out::LiveStatus::new("IOPS");
            let r = netlane_nvme::perf::run_observed(&opts, &mut |s| status.show(s)).context("nvme perf")?;
            status.done();
            (r, None)
        };
        let table = perf_table("nvme-perf", "Per group (latency of the group's main direction)", &r);
        let judged = self.sla.map(|sla| (sla, judge(&sla, &r)));
        let doc = NvmePerf {
            options: echo.object(),
            echo: echo.echo(),
            report: r,
            agent: None,
            agents,
            sla: judged.as_ref().map(|(sla, _)| sla.to_string()),
            sla_met: judged.as_ref().map(|(_, (_, met))| *met),
        };
        let doc = netlane_report::document("nvme-perf", doc);
        if !quiet {
            out::print(&terminal::table(&table));
            out::println(&summary(&doc.body.report, self.verify_only));
            if let Some((sla, (at, _))) = &judged {
                for (group, v) in at {
                    out::println(&format!("{group}: {}", out::sla_line(sla, *v, sla.is_met_at(*v))));
                }
            }
        }
        self.out.write_json(&doc)?;
        self.out.write_tables(&doc.provenance.run_id, &[table])?;
        let r = &doc.body.report;
        let errors: u64 = r.groups.iter().map(|g| g.errors + g.mismatches).sum();
        if errors > 0 {
            bail!("{errors} commands failed or read back wrong data");
        }
        Ok(if self.strict && doc.body.sla_met == Some(false) { out::EXIT_STRICT } else { 0 })
    }
}

fn agent_line(a: &NvmeAgent) -> String {
    format!(
        "agent {}: {:.0} IOPS, p50 {:.1} us p99.99 {:.1} us, host CPU {} us/IO{}",
        a.host,
        a.iops,
        a.latency_ns.p50 as f64 / 1e3,
        a.latency_ns.p9999 as f64 / 1e3,
        a.host_cpu_us_per_io.map_or("-".into(), |v| format!("{v:.2}")),
        if a.errors > 0 { format!(", {} commands failed", a.errors) } else { String::new() }
    )
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
    // Where completions were taken in, when the run polled or moderated interrupts, and
    // each setting as the kernel took it.
    if !r.knobs.is_empty() || r.busy_polled_packets_per_io.is_some_and(|p| p > 0.0) {
        s.push_str(&format!(
            "\nper I/O: {} packets busy polled, {} NAPI thread runs, {} job sleeps",
            f(r.busy_polled_packets_per_io),
            f(r.host_napi_runs_per_io),
            f(r.job_sleeps_per_io)
        ));
    }
    for k in &r.knobs {
        s.push_str(&format!("\n{k}"));
    }
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
            wake_each: false,
            caravan: None,
            verify: VerifyMode::Off,
            size: None,
            target_pid: Some(4242),
            target_threads: vec![17, 18],
            busy_poll: None,
            napi: Default::default(),
            coalesce: Default::default(),
        };
        let mut digests = base.connect.clone();
        (digests.hdgst, digests.ddgst, digests.disable_sqflow, digests.kato_ms) = (true, true, false, 0);
        let writer = JobGroup { cpus: CpuBinding::Unbound, ..g("name=writer,rw=write,bs=1M,qd=32,jobs=1") };
        let all = [
            base.clone(),
            PerfOptions {
                direct_send: true,
                batch: false,
                wake_each: true,
                caravan: Some(Caravan::default()),
                ..base.clone()
            },
            PerfOptions {
                groups: vec![g("name=readers,rw=randread,bs=4k,qd=1,jobs=16,cpus=1,hipri=1"), writer],
                read_queues: 1,
                poll_queues: 1,
                busy_poll: Some("1000,16,prefer".parse().unwrap()),
                napi: netlane::topology::netdev::NapiSettings {
                    defer_hard_irqs: Some(2),
                    gro_flush_timeout_ns: Some(20_000),
                    irq_suspend_timeout_ns: Some(10_000_000),
                },
                coalesce: [("adaptive-rx".to_string(), 0), ("rx-usecs".to_string(), 100)].into(),
                queue_cpus: CpuList::new(vec![0, 1]),
                verify: VerifyMode::Write,
                size: Some(64 << 20),
                target_pid: None,
                target_threads: Vec::new(),
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

    /// A group keeps the name it is given (an agent's `name=job` too, as its coordinator
    /// writes the default group); unnamed ones are numbered.
    #[test]
    fn groups_keep_their_names_and_unnamed_ones_are_numbered() {
        let names = |args: &[&str]| -> Vec<String> {
            let mut all: Vec<String> = vec!["nvme".into(), "perf".into()];
            all.extend(args.iter().map(|a| a.to_string()));
            parse_command::<PerfArgs>(&all).groups().unwrap().into_iter().map(|g| g.name).collect()
        };
        assert_eq!(names(&[]), ["job"]);
        assert_eq!(names(&["--group", "name=job,rw=read"]), ["job"]);
        assert_eq!(names(&["--group", "rw=read", "--group", "name=w,rw=write"]), ["group0", "w"]);
    }
}

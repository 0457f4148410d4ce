//! Soak: each server (the cache, the datagram service, the NVMe/TCP target, the
//! balancer in `balancer.rs`) runs for a while as a process of its own, in a namespace of its own, under valid load from
//! netlane's own client beside hostile clients of the kinds a black-box campaign found
//! (garbage, impossible lengths, oversized values and responses, connections that set
//! up and stall), and is held to bounds measured from outside: the valid clients lose
//! nothing and keep their tail latency, the server's file descriptors stay within its
//! connection limit, and its resident memory stops growing once warm. The NVMe target
//! is then killed with SIGKILL, started again on the same file, and every block the
//! valid client wrote is read back.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, ValueEnum};
use netlane::topology::Netns;

use super::{Scenario, Started};
use netlane_report::options::{OptionList, parse_positive_duration};

mod balancer;
mod hostile;
use crate::progress::Progress;
use crate::verdict::Spec;
use balancer::Forwarding;
use hostile::{hostile_tcp, hostile_udp, kv_garbage, nvme_garbage};
use netlane_report::{Column, Row, RunRecord, ScenarioReport, Table, Value};

/// The servers a soak runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SoakServer {
    /// `netlane kv serve` (memcached protocol over TCP).
    Kv,
    /// `netlane rr serve` (datagram request/response).
    Rr,
    /// `netlane nvme target` on a file namespace.
    Nvme,
    /// `netlane lb run` forwarding to two reals (each `netlane rr serve`) on veth.
    Lb,
}

impl SoakServer {
    fn name(self) -> String {
        crate::scenarios::value_name(&self)
    }
}

/// `netlane bench soak`.
#[derive(Debug, Clone, Args)]
pub struct SoakArgs {
    /// The servers to soak, one after another.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [SoakServer::Kv, SoakServer::Rr, SoakServer::Nvme, SoakServer::Lb])]
    pub servers: Vec<SoakServer>,
    /// How long each server is soaked.
    #[arg(long, default_value = "5m", value_parser = parse_positive_duration)]
    pub time: Duration,
    /// Connections the hostile clients hold open at once (each server's limit is set
    /// above it, so the valid client always gets in).
    #[arg(long, default_value_t = 48)]
    pub hostile_connections: usize,
    /// Highest p99 latency the valid client may see, in milliseconds.
    #[arg(long, default_value_t = 50)]
    pub p99_ms: u64,
    /// Most the server's resident memory may grow from a third of the run to its end, MiB.
    #[arg(long, default_value_t = 32)]
    pub growth_mib: u64,
}

/// The NVMe file namespace's size and the block the client writes and reads back: the
/// read-back must find every one of `NVME_IMAGE_BYTES / NVME_BLOCK` blocks intact.
const NVME_IMAGE_BYTES: u64 = 64 << 20;
const NVME_BLOCK: u64 = 4096;

/// The server's connection limit: room for the hostile clients and the valid ones.
const VALID_CONNECTIONS: usize = 8;

impl SoakArgs {
    /// The defaults, as `netlane bench soak` has them.
    pub fn defaults() -> SoakArgs {
        super::from_words(&[]).expect("the defaults parse")
    }

    fn max_connections(&self) -> usize {
        self.hostile_connections + VALID_CONNECTIONS + 16
    }
}

impl Scenario for SoakArgs {
    fn name(&self) -> &'static str {
        "soak"
    }

    fn options(&self) -> OptionList {
        let servers: Vec<String> = self.servers.iter().map(|s| s.name()).collect();
        OptionList::new()
            .words("servers", &servers)
            .duration("time", self.time)
            .int("hostile-connections", self.hostile_connections as u64)
            .int("p99-ms", self.p99_ms)
            .int("growth-mib", self.growth_mib)
    }

    fn validate(&self) -> Result<()> {
        if self.servers.is_empty() {
            bail!("no servers to soak (--servers)");
        }
        if self.time < Duration::from_secs(3) {
            bail!("--time {:?} is too short to see memory settle; at least 3s", self.time);
        }
        if !(1..=4096).contains(&self.hostile_connections) {
            bail!("--hostile-connections must be 1..=4096");
        }
        if !nix::unistd::geteuid().is_root() {
            bail!("the soak runs each server in a network namespace of its own: run as root");
        }
        Ok(())
    }

    fn runs(&self) -> usize {
        self.servers.len()
    }

    fn run(&self, progress: &dyn Progress) -> Result<ScenarioReport> {
        let mut soaks = Vec::new();
        for &server in &self.servers {
            progress.start(&server.name());
            let s = self.soak(server).with_context(|| format!("soak of {}", server.name()))?;
            progress.finish(&server.name(), &s.summary());
            soaks.push(s);
        }
        Ok(self.report(&soaks))
    }
}

/// The server's resident memory and open descriptors at one moment.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at_s: f64,
    rss: u64,
    fds: u64,
}

/// What the valid client saw.
#[derive(Debug, Clone, Default)]
struct Valid {
    completed: u64,
    failed: u64,
    p99_ms: f64,
    exit_ok: bool,
    detail: serde_json::Value,
}

/// One server's soak.
#[derive(Debug)]
struct Soak {
    server: SoakServer,
    samples: Vec<Sample>,
    valid: Valid,
    hostile_ops: u64,
    fd_limit: u64,
    /// NVMe: blocks read back after the kill and restart (None: not applicable).
    read_back: Option<Result<u64, String>>,
    /// The balancer: configuration edits it applied and bad ones it kept running through
    /// (None: not applicable).
    edits: Option<(u64, u64)>,
    /// The balancer: its own counters once stopped with SIGTERM (None: not applicable).
    forwarding: Option<Result<Forwarding, String>>,
}

impl Soak {
    fn peak(&self, f: impl Fn(&Sample) -> u64) -> u64 {
        self.samples.iter().map(f).max().unwrap_or(0)
    }

    /// Growth of resident memory from a third of the run to its end (what a leak
    /// shows once caches and buffers are warm).
    fn late_growth(&self) -> Option<u64> {
        let (first, last) = (self.samples.first()?, self.samples.last()?);
        let third = first.at_s + (last.at_s - first.at_s) / 3.0;
        let warm = self.samples.iter().find(|s| s.at_s >= third)?;
        Some(last.rss.saturating_sub(warm.rss))
    }

    fn summary(&self) -> String {
        format!(
            "{} valid requests, {} failed, p99 {:.2} ms; {} hostile operations{}; peak {} MiB, {} fds",
            self.valid.completed,
            self.valid.failed,
            self.valid.p99_ms,
            self.hostile_ops,
            self.edits.map(|(a, k)| format!(" ({a} edits applied, {k} refused)")).unwrap_or_default(),
            self.peak(|s| s.rss) >> 20,
            self.peak(|s| s.fds)
        )
    }
}

/// What a soak shares with its hostile clients and its sampler: the flag that stops
/// them, the count of hostile operations, and the sampler of `server` (started now).
fn watch(server: &Started) -> (Arc<AtomicBool>, Arc<AtomicU64>, std::thread::JoinHandle<Vec<Sample>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let (start, pid) = (Instant::now(), server.0.id());
    let sampler = {
        let stop = stop.clone();
        std::thread::spawn(move || sample(pid, &stop, start))
    };
    (stop, Arc::new(AtomicU64::new(0)), sampler)
}

/// Samples `pid`'s memory and descriptors every 250 ms until `stop`.
fn sample(pid: u32, stop: &AtomicBool, start: Instant) -> Vec<Sample> {
    let mut out = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let rss = std::fs::read_to_string(format!("/proc/{pid}/status")).ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        });
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count() as u64);
        let (Some(rss_kib), Ok(fds)) = (rss, fds) else { break };
        out.push(Sample { at_s: start.elapsed().as_secs_f64(), rss: rss_kib * 1024, fds });
        std::thread::sleep(Duration::from_millis(250));
    }
    out
}

impl SoakArgs {
    fn soak(&self, server: SoakServer) -> Result<Soak> {
        let exe = std::env::current_exe().context("find the netlane executable")?;
        let dir = std::env::temp_dir().join(format!("netlane-soak-{}-{}", std::process::id(), server.name()));
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let result = if server == SoakServer::Lb {
            self.soak_balancer(&exe, &dir)
        } else {
            Netns::create(&format!("soak-{}", server.name()))
                .context("create the soak's namespace")
                .and_then(|ns| self.soak_in(server, &ns, &exe, &dir))
        };
        let _ = std::fs::remove_dir_all(&dir);
        result
    }

    fn soak_in(&self, server: SoakServer, ns: &Netns, exe: &Path, dir: &Path) -> Result<Soak> {
        let secs = format!("{}ms", self.time.as_millis());
        let bs = NVME_BLOCK.to_string();
        let conns = self.max_connections().to_string();
        let image = dir.join("ns.img");
        let image_arg = format!("file:{}:{}", image.display(), NVME_IMAGE_BYTES);
        let (addr, server_args, client_args): (SocketAddr, Vec<String>, Vec<String>) = match server {
            SoakServer::Kv => (
                "127.0.0.1:11211".parse()?,
                words(&["kv", "serve", "-l", "127.0.0.1", "-p", "11211", "-m", "64", "-t", "2", "-c", &conns]),
                words(&[
                    "kv",
                    "load",
                    "--server",
                    "127.0.0.1:11211",
                    "--rate",
                    "2000",
                    "-c",
                    "8",
                    "--keys",
                    "10000",
                    "--duration",
                    &secs,
                ]),
            ),
            SoakServer::Rr => (
                "127.0.0.1:7000".parse()?,
                words(&["rr", "serve", "--listen", "127.0.0.1:7000"]),
                words(&[
                    "rr",
                    "clients",
                    "--server",
                    "127.0.0.1:7000",
                    "--clients",
                    "8",
                    "--rate",
                    "2000",
                    "-t",
                    &secs,
                ]),
            ),
            SoakServer::Lb => bail!("the balancer's soak has a network of its own"),
            SoakServer::Nvme => (
                "127.0.0.1:4420".parse()?,
                words(&[
                    "nvme",
                    "target",
                    "--listen",
                    "127.0.0.1:4420",
                    "--ns",
                    &image_arg,
                    "--max-connections",
                    &conns,
                ]),
                words(&[
                    "nvme",
                    "perf",
                    "--target",
                    "127.0.0.1:4420",
                    "--verify",
                    "--rw",
                    "randrw",
                    "--qd",
                    "4",
                    "--bs",
                    &bs,
                    "--ramp",
                    "0s",
                    "-t",
                    &secs,
                ]),
            ),
        };
        let target = start_server(ns, exe, &server_args, LISTENING, &[])?;
        let (stop, ops, sampler) = watch(&target);
        let hold = self.hostile_connections;
        let attackers = ns
            .run({
                let (stop, ops) = (stop.clone(), ops.clone());
                move || match server {
                    SoakServer::Kv => hostile_tcp(addr, hold, b"set k 0 0 100\r\nab".to_vec(), kv_garbage, stop, ops),
                    SoakServer::Nvme => {
                        let mut icreq = Vec::new();
                        netlane_nvme::proto::pdu::TxConfig::ic_req(
                            &mut icreq,
                            &netlane_nvme::proto::pdu::IcReq { pfv: 0, hpda: 0, hdgst: false, ddgst: false, maxr2t: 3 },
                        );
                        hostile_tcp(addr, hold, icreq, nvme_garbage, stop, ops)
                    }
                    SoakServer::Rr => hostile_udp(addr, stop, ops),
                    SoakServer::Lb => unreachable!("the balancer's soak has a network of its own"),
                }
            })
            .context("start the hostile clients in the namespace")?;
        let valid = run_client(ns, exe, &client_args, server, self.time + Duration::from_secs(60));
        stop.store(true, Ordering::Relaxed);
        for a in attackers {
            let _ = a.join();
        }
        let samples = sampler.join().map_err(|_| anyhow!("the sampler panicked"))?;
        let valid = valid?;
        let read_back = (server == SoakServer::Nvme).then(|| {
            // SIGKILL, then the same file again: every block the client wrote must read back.
            drop(target);
            let again = start_server(ns, exe, &server_args, LISTENING, &[]).map_err(|e| format!("{e:#}"))?;
            let check = words(&[
                "nvme",
                "perf",
                "--target",
                "127.0.0.1:4420",
                "--verify-only",
                "--bs",
                &bs,
                "--ramp",
                "0s",
                "-t",
                "60s",
            ]);
            let r = run_client(ns, exe, &check, server, Duration::from_secs(90)).map_err(|e| format!("{e:#}"))?;
            drop(again);
            let read = r.detail.pointer("/report/ops").and_then(|v| v.as_u64()).unwrap_or(0);
            if r.exit_ok && r.failed == 0 && read > 0 { Ok(read) } else { Err(format!("verify-only: {}", r.detail)) }
        });
        Ok(Soak {
            server,
            samples,
            valid,
            hostile_ops: ops.load(Ordering::Relaxed),
            fd_limit: self.max_connections() as u64 + 64,
            read_back,
            edits: None,
            forwarding: None,
        })
    }

    fn report(&self, soaks: &[Soak]) -> ScenarioReport {
        let mut table = Table::new(
            "soak",
            format!("Each server for {:?} under valid load beside hostile clients", self.time),
            vec![
                Column::new("server", "server", 0),
                Column::new("valid", "valid requests", 0),
                Column::new("failed", "failed", 0),
                Column::new("p99_ms", "p99 ms", 2),
                Column::new("hostile", "hostile ops", 0),
                Column::new("peak_rss_mib", "peak RSS MiB", 1),
                Column::new("late_growth_mib", "growth after 1/3 MiB", 1),
                Column::new("peak_fds", "peak fds", 0),
                Column::new("read_back", "read back after kill -9", 0),
                Column::new("edits", "edits applied / refused", 0),
                Column::new("forwarding", "balancer: sent on / dropped / passed", 0),
            ],
        );
        let mut checks = Vec::new();
        let mut runs = Vec::new();
        for (i, s) in soaks.iter().enumerate() {
            let w = s.server.name();
            let mib = |b: u64| b as f64 / f64::from(1 << 20);
            let growth = s.late_growth();
            table.push(Row::new(vec![
                Value::text(&w),
                Value::num(s.valid.completed as f64),
                Value::num(s.valid.failed as f64),
                Value::num(s.valid.p99_ms),
                Value::num(s.hostile_ops as f64),
                Value::num(mib(s.peak(|x| x.rss))),
                growth.map_or(Value::text("-"), |g| Value::num(mib(g))),
                Value::num(s.peak(|x| x.fds) as f64),
                match &s.read_back {
                    None => Value::text("-"),
                    Some(Ok(n)) => Value::text(format!("{n} blocks")),
                    Some(Err(_)) => Value::text("FAILED"),
                },
                s.edits.map_or(Value::text("-"), |(a, k)| Value::text(format!("{a} / {k}"))),
                match &s.forwarding {
                    None => Value::text("-"),
                    Some(Ok(f)) => Value::text(format!("{} / {} / {}", f.tx, f.dropped, f.passed)),
                    Some(Err(_)) => Value::text("FAILED"),
                },
            ]));
            // A soak that did nothing proves nothing.
            let idle = if s.valid.completed == 0 {
                Some("the valid client completed nothing")
            } else if s.hostile_ops == 0 {
                Some("the hostile clients did nothing")
            } else if s.edits.is_some_and(|(applied, kept)| applied == 0 || kept == 0) {
                Some("the balancer saw no good edit or no bad one")
            } else if s.forwarding.as_ref().is_some_and(|f| f.as_ref().is_ok_and(|f| f.dropped == 0)) {
                Some("no hostile frame reached the balancer (it dropped none)")
            } else {
                None
            };
            let spec_failed = Spec::at_most(
                &format!("soak.{w}_valid_failed"),
                format!("{w}: valid requests that failed or were lost beside hostile clients"),
                0.0,
                "requests",
            );
            let spec_p99 = Spec::at_most(
                &format!("soak.{w}_valid_p99"),
                format!("{w}: the valid client's p99 latency beside hostile clients"),
                self.p99_ms as f64,
                "ms",
            );
            let spec_growth = Spec::at_most(
                &format!("soak.{w}_rss_growth"),
                format!("{w}: the server's resident memory growth from a third of the run to its end"),
                self.growth_mib as f64,
                "MiB",
            );
            let spec_fds = Spec::at_most(
                &format!("soak.{w}_fds"),
                if s.server == SoakServer::Lb {
                    format!("{w}: the balancer's open file descriptors (its maps, programs and files; none per flow)")
                } else {
                    format!("{w}: the server's open file descriptors (its connection limit plus its own)")
                },
                s.fd_limit as f64,
                "fds",
            );
            let how = "one soak: the valid client's own report, the server sampled every 250 ms from /proc";
            match idle {
                Some(why) => {
                    checks.extend([&spec_failed, &spec_p99, &spec_growth, &spec_fds].map(|c| c.invalid(why)));
                }
                None => {
                    checks.push(spec_failed.evaluate(vec![Ok(s.valid.failed as f64)], how));
                    checks.push(spec_p99.evaluate(vec![Ok(s.valid.p99_ms)], how));
                    checks.push(
                        spec_growth.evaluate(
                            vec![growth.map(mib).ok_or_else(|| "the server was not sampled".to_string())],
                            how,
                        ),
                    );
                    checks.push(spec_fds.evaluate(vec![Ok(s.peak(|x| x.fds) as f64)], how));
                }
            }
            if let Some(f) = &s.forwarding {
                let spec = Spec::at_most(
                    &format!("soak.{w}_stop"),
                    format!("{w}: stops on SIGTERM within 10 s, exit 0, with its report written"),
                    0.0,
                    "failures",
                );
                checks.push(match f {
                    Ok(_) => spec.evaluate(vec![Ok(0.0)], "SIGTERM after the soak; its --json report read"),
                    Err(e) => spec.evaluate(vec![Ok(1.0)], e),
                });
            }
            if let Some(rb) = &s.read_back {
                let spec = Spec::at_least(
                    &format!("soak.{w}_read_back"),
                    format!("{w}: blocks read back intact after SIGKILL and a restart on the same file (all of them)"),
                    (NVME_IMAGE_BYTES / NVME_BLOCK) as f64,
                    "blocks",
                );
                checks.push(match rb {
                    Ok(n) => spec.evaluate(vec![Ok(*n as f64)], "nvme perf --verify-only over every block"),
                    Err(e) => spec.evaluate(vec![Ok(0.0)], e),
                });
            }
            let mut metrics = std::collections::BTreeMap::new();
            metrics.insert("valid_completed".into(), s.valid.completed as f64);
            metrics.insert("valid_failed".into(), s.valid.failed as f64);
            metrics.insert("valid_p99_ms".into(), s.valid.p99_ms);
            metrics.insert("hostile_ops".into(), s.hostile_ops as f64);
            metrics.insert("peak_rss_bytes".into(), s.peak(|x| x.rss) as f64);
            metrics.insert("peak_fds".into(), s.peak(|x| x.fds) as f64);
            if let Some(g) = growth {
                metrics.insert("late_growth_bytes".into(), g as f64);
            }
            if let Some((applied, kept)) = s.edits {
                metrics.insert("edits_applied".into(), applied as f64);
                metrics.insert("edits_refused".into(), kept as f64);
            }
            runs.push(RunRecord {
                index: i as u32 + 1,
                round: 1,
                label: w,
                metrics,
                path: vec![if s.server == SoakServer::Lb { "veth" } else { "loopback" }.into()],
                detail: s.valid.detail.clone(),
            });
        }
        let met = checks.iter().filter(|c| c.outcome == netlane_report::Outcome::Met).count();
        let options = self.options();
        ScenarioReport {
            name: "soak".into(),
            title: "Soak: servers under valid load beside hostile clients".into(),
            description: "Each server runs as a process of its own for the whole time, with netlane's own client \
                sending valid requests at a fixed rate and hostile clients beside it: junk, impossible lengths, \
                oversized values and responses, connections that start a message and stall (up to the hostile \
                connection count). The balancer forwards the valid client's datagrams to two reals on veth while \
                malformed frames from random sources reach it and its configuration is edited every 300 ms, \
                alternately well and badly (a parse error, no reals, a bad address, a FIFO, a file over the size \
                limit). Memory and descriptors are read from /proc every 250 ms; the NVMe target is then killed \
                with SIGKILL and started again on the same file, and every block is read back."
                .into(),
            headline: format!("{met} of {} soak checks met", checks.len()),
            options: options.object(),
            echo: options.echo(),
            tables: vec![table],
            charts: Vec::new(),
            checks,
            flags: Vec::new(),
            notes: Vec::new(),
            runs,
            cpu_plan: Vec::new(),
        }
    }
}

fn words(w: &[&str]) -> Vec<String> {
    w.iter().map(|s| s.to_string()).collect()
}

/// What a server's first line starts with once it serves.
const LISTENING: &str = "listening on";

/// Starts a server in `ns` and waits for its first line on standard output to start
/// with `ready`; afterwards, every line of its output (standard output and error)
/// starting with one of `count`'s texts adds one to that counter.
fn start_server(
    ns: &Netns,
    exe: &Path,
    args: &[String],
    ready: &str,
    count: &[(&'static str, Arc<AtomicU64>)],
) -> Result<Started> {
    let mut cmd = ns.command(exe);
    netlane_sys::process::kill_with_parent(&mut cmd);
    cmd.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = Started(cmd.spawn().with_context(|| format!("start netlane {}", args.join(" ")))?);
    let (out, err) = (child.0.stdout.take().context("the server's output")?, child.0.stderr.take());
    let count = count.to_vec();
    let counter = move |line: &str| {
        if let Some((_, n)) = count.iter().find(|(t, _)| line.starts_with(t)) {
            n.fetch_add(1, Ordering::Relaxed);
        }
    };
    let (tx, rx) = std::sync::mpsc::channel();
    // Both pipes are read to their end so the server never blocks on a full one.
    std::thread::spawn({
        let counter = counter.clone();
        move || {
            let mut lines = std::io::BufRead::lines(std::io::BufReader::new(out));
            let first = lines.next().and_then(|l| l.ok()).unwrap_or_default();
            let _ = tx.send(first);
            lines.map_while(Result::ok).for_each(|l| counter(&l));
        }
    });
    if let Some(err) = err {
        std::thread::spawn(move || {
            std::io::BufRead::lines(std::io::BufReader::new(err)).map_while(Result::ok).for_each(|l| counter(&l))
        });
    }
    let first = rx.recv_timeout(Duration::from_secs(20)).unwrap_or_default();
    if !first.starts_with(ready) {
        bail!("netlane {} did not start (it said {first:?})", args.join(" "));
    }
    Ok(child)
}

/// Runs a client in `ns` to the end (at most `limit`) and reads its JSON report.
fn run_client(ns: &Netns, exe: &Path, args: &[String], server: SoakServer, limit: Duration) -> Result<Valid> {
    let out_file: PathBuf = std::env::temp_dir().join(format!("netlane-soak-client-{}.json", std::process::id()));
    let mut cmd = ns.command(exe);
    netlane_sys::process::kill_with_parent(&mut cmd);
    cmd.args(args).arg("--json").arg(&out_file).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    let mut child = Started(cmd.spawn().with_context(|| format!("start netlane {}", args.join(" ")))?);
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.0.try_wait().context("wait for the client")? {
            break s;
        }
        if Instant::now() > deadline {
            bail!("netlane {} ran past {limit:?}", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(&out_file).unwrap_or_default();
    let _ = std::fs::remove_file(&out_file);
    let detail: serde_json::Value = serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
    let u = |p: &str| detail.pointer(p).and_then(serde_json::Value::as_u64).unwrap_or(0);
    let (completed, failed, p99_ms) = match server {
        SoakServer::Kv => {
            let p99 = detail
                .pointer("/report/latency_us")
                .and_then(|l| l.as_array())
                .and_then(|l| l.iter().find(|p| p[0] == "p99"))
                .and_then(|p| p[1].as_f64())
                .unwrap_or(f64::NAN);
            let failed = u("/report/counts/errors") + u("/report/counts/lost") + u("/report/connection_failures");
            (u("/report/counts/completed"), failed, p99 / 1000.0)
        }
        SoakServer::Rr | SoakServer::Lb => {
            let failed = u("/report/lost") + u("/report/corrupt") + u("/report/mismatched");
            (u("/report/responses"), failed, u("/report/latency_ns/p99") as f64 / 1e6)
        }
        SoakServer::Nvme => {
            let g = |k: &str| detail.pointer(&format!("/report/groups/0/{k}"));
            let failed = u("/report/groups/0/errors") + u("/report/groups/0/mismatches") + u("/report/queue_failures");
            let p99 = ["read_lat_ns", "write_lat_ns"]
                .iter()
                .filter_map(|k| g(k).and_then(|l| l.pointer("/p99")).and_then(serde_json::Value::as_f64))
                .fold(0.0, f64::max);
            (u("/report/ops"), failed, p99 / 1e6)
        }
    };
    // A client that gave up (exit 1: it measured nothing it can trust) failed at least once.
    let failed = if status.success() { failed } else { failed.max(1) };
    Ok(Valid { completed, failed, p99_ms, exit_ok: status.success(), detail })
}

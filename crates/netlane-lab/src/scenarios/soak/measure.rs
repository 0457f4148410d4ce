//! A soak's runs: the server as a process of its own, its memory and descriptors
//! sampled from /proc, the valid client and the hostile ones beside it, and for the
//! NVMe target the kill and the read-back.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use netlane::topology::Netns;

use super::balancer::Forwarding;
use super::hostile::hostile_clients;
use super::{Cpus, NVME_BLOCK, NVME_IMAGE_BYTES, SoakArgs, SoakServer};
use crate::host::{Host, LineHook, RoleProcess, RoleSample, RoleSpec};

/// What the valid client saw.
#[derive(Debug, Clone, Default)]
pub(super) struct Valid {
    pub(super) completed: u64,
    pub(super) failed: u64,
    pub(super) p99_ms: f64,
    pub(super) exit_ok: bool,
    pub(super) detail: serde_json::Value,
}

/// One server's soak.
#[derive(Debug)]
pub(super) struct Soak {
    pub(super) server: SoakServer,
    pub(super) samples: Vec<RoleSample>,
    pub(super) valid: Valid,
    pub(super) hostile_ops: u64,
    pub(super) fd_limit: u64,
    /// NVMe: blocks read back after the kill and restart (None: not applicable).
    pub(super) read_back: Option<Result<u64, String>>,
    /// The balancer: configuration edits it applied and bad ones it kept running through
    /// (None: not applicable).
    pub(super) edits: Option<(u64, u64)>,
    /// The balancer: its own counters once stopped with SIGTERM (None: not applicable).
    pub(super) forwarding: Option<Result<Forwarding, String>>,
    /// How the clients reached the server (`loopback`, `veth`, `testbed`).
    pub(super) path: &'static str,
}

impl Soak {
    /// Seconds from the first sample to the last.
    pub(super) fn sampled_span(&self) -> f64 {
        match (self.samples.first(), self.samples.last()) {
            (Some(a), Some(b)) => (b.at - a.at).as_secs_f64(),
            _ => 0.0,
        }
    }

    pub(super) fn peak(&self, f: impl Fn(&RoleSample) -> u64) -> u64 {
        self.samples.iter().map(f).max().unwrap_or(0)
    }

    /// Growth of resident memory from a third of the run to its end (what a leak
    /// shows once caches and buffers are warm).
    pub(super) fn late_growth(&self) -> Option<u64> {
        let (first, last) = (self.samples.first()?, self.samples.last()?);
        let third = first.at + (last.at - first.at) / 3;
        let warm = self.samples.iter().find(|s| s.at >= third)?;
        Some(last.rss.saturating_sub(warm.rss))
    }

    pub(super) fn summary(&self) -> String {
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

/// What a soak shares with its hostile clients: the flag that stops them and the count
/// of what they did.
pub(super) fn watch() -> (Arc<AtomicBool>, Arc<AtomicU64>) {
    (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)))
}

/// How often a soaked server's memory and descriptors are sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);

impl SoakArgs {
    pub(super) fn soak(&self, server: SoakServer, cpus: &Cpus) -> Result<Soak> {
        let dir = std::env::temp_dir().join(format!("netlane-soak-{}-{}", std::process::id(), server.name()));
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let result = if server == SoakServer::Lb {
            self.soak_balancer(&dir, cpus)
        } else {
            Netns::create(&format!("soak-{}", server.name()))
                .context("create the soak's namespace")
                .and_then(|ns| self.soak_in(server, &ns, &dir, cpus))
        };
        let _ = std::fs::remove_dir_all(&dir);
        result
    }

    fn soak_in(&self, server: SoakServer, ns: &Netns, dir: &Path, cpus: &Cpus) -> Result<Soak> {
        let addr = server.local_addr();
        let (server_args, client_args) = self.commands(server, &dir.to_string_lossy(), cpus, addr)?;
        let target = start_server(ns, &server_args, LISTENING, &[], &cpus.server)?;
        let (stop, ops) = watch();
        let attackers = self.attack(ns, server, addr, (&stop, &ops), cpus)?;
        let valid = run_client(ns, &client_args, server, self.time + Duration::from_secs(60), &cpus.clients);
        stop.store(true, Ordering::Relaxed);
        for a in attackers {
            let _ = a.join();
        }
        let samples = target.samples();
        let valid = valid?;
        let read_back = (server == SoakServer::Nvme).then(|| read_back((ns, ns), &server_args, target, cpus, addr));
        Ok(Soak {
            server,
            samples,
            valid,
            hostile_ops: ops.load(Ordering::Relaxed),
            fd_limit: self.max_connections() as u64 + 64,
            read_back,
            edits: None,
            forwarding: None,
            path: "loopback",
        })
    }

    /// The server's command line (listening on `addr`, its files under `dir` on its
    /// host) and the valid client's.
    pub(super) fn commands(
        &self,
        server: SoakServer,
        dir: &str,
        cpus: &Cpus,
        addr: SocketAddr,
    ) -> Result<(Vec<String>, Vec<String>)> {
        let secs = format!("{}ms", self.time.as_millis());
        let bs = NVME_BLOCK.to_string();
        let conns = self.max_connections().to_string();
        let image_arg = format!("file:{dir}/ns.img:{NVME_IMAGE_BYTES}");
        let (a, ip, port) = (addr.to_string(), addr.ip().to_string(), addr.port().to_string());
        // The target pins a reactor to each of its CPUs itself (every online CPU unless
        // told): told the plan's, it stays there.
        let target_cpus = cpus.server.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
        Ok(match server {
            SoakServer::Kv => (
                words(&["kv", "serve", "-l", &ip, "-p", &port, "-m", "64", "-t", "2", "-c", &conns]),
                words(&[
                    "kv",
                    "load",
                    "--server",
                    &a,
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
                words(&["rr", "serve", "--listen", &a]),
                words(&["rr", "clients", "--server", &a, "--clients", "8", "--rate", "2000", "-t", &secs]),
            ),
            SoakServer::Lb => bail!("the balancer's soak has a network of its own"),
            SoakServer::Nvme => {
                let mut target =
                    words(&["nvme", "target", "--listen", &a, "--ns", &image_arg, "--max-connections", &conns]);
                // Unpinned where the plan names no CPU (a testbed host without `cpus`).
                if !target_cpus.is_empty() {
                    target.extend(words(&["--cpus", &target_cpus]));
                }
                let perf = words(&[
                    "nvme", "perf", "--target", &a, "--verify", "--rw", "randrw", "--qd", "4", "--bs", &bs, "--ramp",
                    "0s", "-t", &secs,
                ]);
                (target, perf)
            }
        })
    }

    /// The hostile clients of `server` in `ns`, on the clients' CPU, until `stop`,
    /// counting into `ops`.
    fn attack(
        &self,
        ns: &Netns,
        server: SoakServer,
        addr: SocketAddr,
        (stop, ops): (&Arc<AtomicBool>, &Arc<AtomicU64>),
        cpus: &Cpus,
    ) -> Result<Vec<std::thread::JoinHandle<()>>> {
        let hold = self.hostile_connections;
        ns.run({
            let (stop, ops, cpus) = (stop.clone(), ops.clone(), cpus.clone());
            move || {
                cpus.pin_client_thread();
                hostile_clients(server, addr, hold, stop, ops)
            }
        })
        .context("start the hostile clients in the namespace")
    }
}

/// SIGKILL, then the same file again (on the server's host; the reader on the
/// client's): every block the client wrote must read back.
pub(super) fn read_back(
    (server, client): (&dyn Host, &dyn Host),
    server_args: &[String],
    target: RoleProcess,
    cpus: &Cpus,
    addr: SocketAddr,
) -> Result<u64, String> {
    let bs = NVME_BLOCK.to_string();
    // Ended as a crash would end it.
    let _ = target.end_with(nix::sys::signal::Signal::SIGKILL, Duration::from_secs(10));
    let again = start_server(server, server_args, LISTENING, &[], &cpus.server).map_err(|e| format!("{e:#}"))?;
    let a = addr.to_string();
    let check = words(&["nvme", "perf", "--target", &a, "--verify-only", "--bs", &bs, "--ramp", "0s", "-t", "60s"]);
    let r = run_client(client, &check, SoakServer::Nvme, Duration::from_secs(90), &cpus.clients)
        .map_err(|e| format!("{e:#}"))?;
    drop(again);
    let read = r.detail.pointer("/report/ops").and_then(|v| v.as_u64()).unwrap_or(0);
    if r.exit_ok && r.failed == 0 && read > 0 { Ok(read) } else { Err(format!("verify-only: {}", r.detail)) }
}

pub(super) fn words(w: &[&str]) -> Vec<String> {
    w.iter().map(|s| s.to_string()).collect()
}

/// What a server's first line starts with once it serves.
pub(super) const LISTENING: &str = "listening on";

/// Starts a server on `host` on `cpus`, its memory and descriptors sampled there, and
/// waits for its first line on standard output to start with `ready`; afterwards, every
/// line of its output (standard output and error) starting with one of `count`'s texts
/// adds one to that counter.
pub(super) fn start_server(
    host: &dyn Host,
    args: &[String],
    ready: &str,
    count: &[(&'static str, Arc<AtomicU64>)],
    cpus: &[usize],
) -> Result<RoleProcess> {
    let count = count.to_vec();
    let hook: LineHook = Arc::new(move |line: &str| {
        if let Some((_, n)) = count.iter().find(|(t, _)| line.starts_with(t)) {
            n.fetch_add(1, Ordering::Relaxed);
        }
    });
    let spec = RoleSpec::netlane(&format!("netlane {}", args.join(" ")), args.iter().cloned())
        .ready_when(ready, Duration::from_secs(20))
        .on_cpus(cpus)
        .sampled(SAMPLE_EVERY);
    RoleProcess::start(host, &spec, Some(hook))
}

/// Runs a client on `host` on `cpus` to the end (at most `limit`) and reads its JSON
/// report.
pub(super) fn run_client(
    host: &dyn Host,
    args: &[String],
    server: SoakServer,
    limit: Duration,
    cpus: &[usize],
) -> Result<Valid> {
    let mut args = args.to_vec();
    args.extend(["--json".to_string(), "-".to_string()]);
    let spec = RoleSpec::netlane(&format!("netlane {}", args.join(" ")), args.iter().cloned()).on_cpus(cpus);
    let done = RoleProcess::start(host, &spec, None)?.wait(limit)?;
    let status = done.status;
    let detail: serde_json::Value = serde_json::from_str(done.stdout.trim()).unwrap_or(serde_json::Value::Null);
    let u = |p: &str| detail.pointer(p).and_then(serde_json::Value::as_u64).unwrap_or(0);
    let (completed, failed, p99_ms) = match server {
        SoakServer::Kv => {
            // Null when the 99th percentile falls among failed requests.
            let p99 = detail.pointer("/report/latency_ns/p99").and_then(serde_json::Value::as_f64).unwrap_or(f64::NAN);
            let failed = u("/report/counts/errors") + u("/report/counts/lost") + u("/report/connection_failures");
            (u("/report/counts/completed"), failed, p99 / 1e6)
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

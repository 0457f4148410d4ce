//! A lab across machines: the hosts a testbed file names, reached (over SSH, or this
//! machine itself) and checked for what the scenarios need before anything runs.

mod file;

use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, bail};
use netlane::cpus::CpuList;

pub use file::{HostSpec, MAX_CLIENTS, TestbedError, TestbedSpec};

use crate::host::{Host, RoleProcess, RoleSpec, SshHost, SshSpec, ThisMachine};

/// One host of a testbed, reached.
pub struct TestbedHost {
    /// What the file says of it.
    pub spec: HostSpec,
    host: Box<dyn Host + Send + Sync>,
}

impl fmt::Debug for TestbedHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestbedHost").field("role", &self.spec.role).field("host", &self.host.name()).finish()
    }
}

impl TestbedHost {
    /// Where its roles run.
    pub fn host(&self) -> &dyn Host {
        self.host.as_ref()
    }

    /// `iface`'s root qdisc and its counters, as `netlane nic show` reads them there.
    pub fn root_qdisc(&self, iface: &str) -> Result<netlane::nic::RootQdisc> {
        #[derive(serde::Deserialize)]
        struct Readout {
            value: Option<netlane::nic::RootQdisc>,
            unavailable: Option<String>,
        }
        #[derive(serde::Deserialize)]
        struct NicShow {
            root_qdisc: Readout,
        }
        let r = self.nic_show::<NicShow>(iface)?.root_qdisc;
        r.value.with_context(|| {
            format!(
                "{iface}'s root qdisc on {}: {}",
                self.label(),
                r.unavailable.unwrap_or_else(|| "unreadable".into())
            )
        })
    }

    /// `iface`'s NAPI instances there (their ids), or why the kernel did not say.
    pub fn napi_ids(&self, iface: &str) -> Result<Result<Vec<u32>, String>> {
        #[derive(serde::Deserialize)]
        struct Napi {
            id: u32,
        }
        #[derive(serde::Deserialize)]
        struct NicShow {
            napis: Vec<Napi>,
            napis_unavailable: Option<String>,
        }
        let v = self.nic_show::<NicShow>(iface)?;
        Ok(match v.napis_unavailable {
            Some(why) => Err(why),
            None => Ok(v.napis.into_iter().map(|n| n.id).collect()),
        })
    }

    /// What `netlane nic show` reads of `iface` there.
    fn nic_show<T: serde::de::DeserializeOwned>(&self, iface: &str) -> Result<T> {
        let args = words(&["nic", "show", iface, "--json", "-"]);
        let spec = RoleSpec::netlane(&format!("nic show on {}", self.label()), args);
        let done = RoleProcess::start(self.host(), &spec, None)?.wait(crate::host::RUN_WITHIN)?;
        if !done.status.success() {
            bail!("nic show {iface} on {}: {}", self.label(), done.stderr_tail());
        }
        done.json::<T>()
    }

    /// `role (host)`, for messages.
    pub fn label(&self) -> String {
        format!("{} ({})", self.spec.role, self.host.name())
    }

    /// The CPUs the file gives its roles (none: not pinned).
    pub fn pinned(&self) -> Vec<usize> {
        self.spec.cpus.as_ref().map_or_else(Vec::new, |c| c.as_slice().to_vec())
    }

    /// The CPUs its roles take: the file's, or every CPU it has.
    pub fn cpus(&self) -> Result<CpuList> {
        if let Some(c) = &self.spec.cpus {
            return Ok(c.clone());
        }
        self.online()
    }

    fn online(&self) -> Result<CpuList> {
        let text = self.host.read_file("/sys/devices/system/cpu/online")?;
        netlane::cpus::parse_online(text.trim())
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("{}: its online CPUs", self.label()))
    }

    /// Why its `iface` is not a device with `n` receive queues, if it is not.
    pub fn rx_queues_lack(&self, n: usize) -> Option<String> {
        #[derive(serde::Deserialize)]
        struct Queues {
            rx_queues: usize,
        }
        let Some(iface) = &self.spec.iface else {
            return Some(format!("no `iface` (a device with {n} receive queues is needed)"));
        };
        match self.nic_show::<Queues>(iface) {
            Ok(q) if q.rx_queues >= n => None,
            Ok(q) => Some(format!("{iface} has {} receive queues, not {n}", q.rx_queues)),
            Err(e) => Some(format!("{e:#}")),
        }
    }

    /// What it lacks of `needs`, one line each, each naming it.
    fn missing(&self, needs: &Needs) -> Vec<String> {
        self.lacks(needs).into_iter().map(|what| format!("{}: {what}", self.label())).collect()
    }

    /// What it lacks of `needs`, one line each.
    fn lacks(&self, needs: &Needs) -> Vec<String> {
        let mut out = Vec::new();
        let mut say = |what: String| out.push(what);
        // Setting a device's NIC takes root too.
        if needs.root || self.spec.sets_nic() {
            match self.host.run(&words(&["id", "-u"])) {
                Ok(o) if String::from_utf8_lossy(&o.stdout).trim() == "0" => {}
                Ok(_) => say("not root (its roles build namespaces, load BPF and set devices)".into()),
                Err(e) => say(format!("cannot run `id -u`: {e:#}")),
            }
        }
        match (self.online(), &self.spec.cpus) {
            (Ok(online), Some(asked)) => {
                let absent: Vec<usize> =
                    asked.as_slice().iter().copied().filter(|c| !online.as_slice().contains(c)).collect();
                if !absent.is_empty() {
                    say(format!("no CPU {} (it has {online})", CpuList::new(absent)));
                }
            }
            (Ok(_), None) => {}
            (Err(e), _) => say(format!("{e:#}")),
        }
        if let Some(iface) = &self.spec.iface {
            match self.host.read_file(&format!("/sys/class/net/{iface}/ifindex")) {
                Ok(_) => {
                    if let Some(addr) = self.spec.addr
                        && !self.has_address(iface, addr)
                    {
                        say(format!("{addr} is not an address of {iface}"));
                    }
                }
                Err(_) => say(format!("no interface {iface}")),
            }
        }
        // The kernel has this file (Linux 4.4+) exactly when it has the bpf() system call.
        if needs.bpf && self.host.read_file("/proc/sys/kernel/unprivileged_bpf_disabled").is_err() {
            say("no BPF (its kernel has no bpf() system call)".into());
        }
        if let Some(why) = needs.rx_queues.and_then(|n| self.rx_queues_lack(n)) {
            say(why);
        }
        for program in &needs.programs {
            // The name as an argument of the shell, never as its script.
            let found = self.host.run(&words(&["sh", "-c", "command -v \"$1\"", "sh", program]));
            if !found.is_ok_and(|o| o.status.success()) {
                say(format!("{program} is not installed"));
            }
        }
        out
    }

    fn has_address(&self, iface: &str, addr: IpAddr) -> bool {
        self.host
            .run(&words(&["ip", "-o", "addr", "show", "dev", iface]))
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(&format!(" {addr}/")))
    }
}

fn words(w: &[&str]) -> Vec<String> {
    w.iter().map(|s| s.to_string()).collect()
}

/// What a scenario needs of a host.
#[derive(Debug, Clone, Default)]
pub struct Needs {
    /// Root.
    pub root: bool,
    /// Programs on its `PATH` (a peer's binary, cyclictest).
    pub programs: Vec<String>,
    /// A device (its `iface`) with at least this many receive queues.
    pub rx_queues: Option<usize>,
    /// BPF programs (a kernel with the bpf() system call).
    pub bpf: bool,
}

/// The options of a scenario that runs across machines.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TestbedArgs {
    /// Run on the machines a testbed file names instead of two namespaces of this one:
    /// the servers on its server host at its `addr`, the clients on its client hosts
    /// (several: agents of one merged measurement). A CPU option then names a CPU of the
    /// host its role runs on; a client host's `cpus` in the file replace the clients'.
    #[arg(long, value_name = "FILE")]
    pub testbed: Option<std::path::PathBuf>,
    /// Where a testbed host has no netlane of this version, copy this one there (over
    /// SSH, into ~/.cache/netlane/) and use that.
    #[arg(long, requires = "testbed")]
    pub deploy: bool,
    /// The testbed once reached, shared by every copy of these options (a scenario's
    /// checks and its run; the lab's scenarios): its hosts are reached once.
    #[arg(skip)]
    pub reached: Reached,
}

/// A testbed reached once and shared (see [`TestbedArgs::open`]).
#[derive(Clone, Default)]
pub struct Reached(Arc<Mutex<Option<Arc<Testbed>>>>);

impl std::fmt::Debug for Reached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let reached = self.0.lock().map(|r| r.is_some()).unwrap_or(false);
        f.debug_tuple("Reached").field(&reached).finish()
    }
}

impl TestbedArgs {
    /// The testbed, reached (none: this machine's namespaces): connected the first time,
    /// the same connections after that.
    pub fn open(&self) -> Result<Option<Arc<Testbed>>> {
        let Some(path) = &self.testbed else { return Ok(None) };
        let mut reached = self.reached.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(t) = &*reached {
            return Ok(Some(t.clone()));
        }
        let t = Arc::new(Testbed::open(path, self.deploy)?);
        *reached = Some(t.clone());
        Ok(Some(t))
    }

    /// `o` with the file, when there is one (the options a report lists; they read
    /// back as the same options).
    pub fn listed(&self, o: netlane_report::options::OptionList) -> netlane_report::options::OptionList {
        match &self.testbed {
            Some(p) => o.text("testbed", p.display().to_string()),
            None => o,
        }
    }

    /// The lab's: `testbed` with `deploy`, reached once for every scenario that shares
    /// `reached`, and what the file says (the CPUs it gives the hosts place the roles
    /// there).
    pub fn for_lab(testbed: &std::path::Path, deploy: bool, reached: &Reached) -> Result<(TestbedArgs, TestbedSpec)> {
        let text = std::fs::read_to_string(testbed).with_context(|| format!("read {}", testbed.display()))?;
        let spec = TestbedSpec::parse(&text).with_context(|| format!("the testbed {}", testbed.display()))?;
        Ok((TestbedArgs { testbed: Some(testbed.to_path_buf()), deploy, reached: reached.clone() }, spec))
    }
}

/// NIC settings held on a testbed's hosts while scenarios run.
#[derive(Debug, Default)]
pub struct NicHold {
    holds: Vec<(String, RoleProcess)>,
}

impl NicHold {
    /// Puts every setting back (the last held first): one note per device, saying what
    /// each setting did and whether it is as it was, or why that is not known. Every
    /// hold is stopped whatever became of the others.
    pub fn finish(mut self) -> Vec<String> {
        let mut notes = Vec::new();
        while let Some((what, role)) = self.holds.pop() {
            notes.push(match role.end_with(nix::sys::signal::Signal::SIGTERM, STOP_WITHIN) {
                Ok(done) => match done.json::<netlane::nic::Tried>() {
                    Ok(tried) => held_note(&what, &tried),
                    Err(e) => format!(
                        "NIC settings held on {what}: what was put back is not known ({e:#}; nic hold {}: {})",
                        done.status,
                        done.stderr_tail()
                    ),
                },
                Err(e) => format!("NIC settings held on {what}: what was put back is not known ({e:#})"),
            });
        }
        notes.reverse();
        notes
    }
}

/// What `nic hold` on `what` did and put back, as a report's note.
fn held_note(what: &str, tried: &netlane::nic::Tried) -> String {
    let said: Vec<String> = tried.outcomes.iter().map(|o| o.to_string()).collect();
    let left: Vec<String> = tried
        .put_back
        .iter()
        .filter(|p| !p.restored())
        .map(|p| format!("{} reads {} (was {})", p.what, p.now, p.before))
        .collect();
    format!(
        "NIC settings held on {what} while it ran: {}. {}",
        said.join("; "),
        if left.is_empty() {
            "All put back as they were.".to_string()
        } else {
            format!("NOT put back (netlane clean on that host tries again): {}.", left.join("; "))
        }
    )
}

impl Drop for NicHold {
    fn drop(&mut self) {
        // A scenario that failed: its settings are put back all the same, the last first.
        while let Some((what, role)) = self.holds.pop() {
            if let Err(e) = role.end_with(nix::sys::signal::Signal::SIGTERM, STOP_WITHIN) {
                tracing::warn!(device = %what, error = %format!("{e:#}"), "nic hold did not stop cleanly");
            }
        }
    }
}

/// How long `netlane nic hold` may take to put its settings back.
const STOP_WITHIN: std::time::Duration = std::time::Duration::from_secs(20);

/// A testbed's hosts, reached.
#[derive(Debug)]
pub struct Testbed {
    /// The server's host.
    pub server: TestbedHost,
    /// The client hosts.
    pub clients: Vec<TestbedHost>,
}

impl Testbed {
    /// Reads the testbed file at `path` and reaches its hosts ([`Testbed::connect`]).
    pub fn open(path: &std::path::Path, deploy: bool) -> Result<Testbed> {
        let text = std::fs::read_to_string(path).with_context(|| format!("read the testbed {}", path.display()))?;
        let spec = TestbedSpec::parse(&text).with_context(|| format!("the testbed {}", path.display()))?;
        Testbed::connect(&spec, deploy)
    }

    /// The CPUs each host's roles ran on: the server's `server_cpus` on its host, each
    /// client's (empty: not pinned), named by host.
    pub fn cpu_plan(&self, server_cpus: &[usize]) -> Vec<netlane_report::RoleCpus> {
        let role = |r: &str, h: &TestbedHost, cpus: Vec<usize>| netlane_report::RoleCpus {
            role: format!("{r} on {}", h.host.name()),
            cpus,
            beside: None,
        };
        std::iter::once(role("server", &self.server, server_cpus.to_vec()))
            .chain(self.clients.iter().map(|c| role("generator", c, c.pinned())))
            .collect()
    }

    /// Where its roles ran, for a report.
    pub fn describe(&self) -> String {
        let clients: Vec<String> = self.clients.iter().map(|c| c.host.name()).collect();
        format!(
            "Ran on a testbed: the server on {} at {}, the load from {}{}.",
            self.server.host.name(),
            self.server_addr(),
            clients.join(", "),
            if clients.len() > 1 { " (agents of one merged measurement)" } else { "" }
        )
    }

    /// Reaches every host of `spec` (each SSH host's netlane checked against this one;
    /// with `deploy`, this one copied where it differs).
    pub fn connect(spec: &TestbedSpec, deploy: bool) -> Result<Testbed> {
        let exe = if deploy { Some(std::env::current_exe().context("find the netlane executable")?) } else { None };
        let reach = |h: &HostSpec| -> Result<TestbedHost> {
            let host: Box<dyn Host + Send + Sync> = match &h.ssh {
                Some(d) => Box::new(
                    SshHost::connect(&SshSpec {
                        destination: d.clone(),
                        config: spec.ssh_config.clone(),
                        netlane: h.netlane.clone(),
                        deploy: exe.clone(),
                    })
                    .with_context(|| format!("testbed {}", h.role))?,
                ),
                None => Box::new(ThisMachine),
            };
            Ok(TestbedHost { spec: h.clone(), host })
        };
        let server = reach(&spec.server)?;
        let clients = spec.clients.iter().map(reach).collect::<Result<Vec<_>>>()?;
        Ok(Testbed { server, clients })
    }

    /// Refuses a testbed whose server lacks `server` or whose clients lack `clients`,
    /// saying everything missing, host by host.
    pub fn check(&self, server: &Needs, clients: &Needs) -> Result<()> {
        let mut missing = self.server.missing(server);
        for c in &self.clients {
            missing.extend(c.missing(clients));
        }
        if !missing.is_empty() {
            bail!("the testbed cannot run this:\n  {}", missing.join("\n  "));
        }
        Ok(())
    }

    /// Holds the NIC settings the file gives each host (`nic`, `irqs`, `threaded`, `xps`
    /// of its `iface`) until the returned hold finishes or drops: a `netlane nic hold` on
    /// that host, which puts them back when stopped (also when its SSH session ends).
    pub fn hold_nic(&self) -> Result<NicHold> {
        // Each started one goes into the hold at once: a later one that fails to start
        // drops it, which puts back what the others set.
        let mut hold = NicHold::default();
        for h in std::iter::once(&self.server).chain(&self.clients) {
            let (Some(iface), true) = (&h.spec.iface, h.spec.sets_nic()) else {
                continue;
            };
            let mut args = words(&["nic", "hold", iface, "--json", "-"]);
            args.extend(h.spec.nic_hold_args());
            let spec = RoleSpec::netlane(&format!("nic hold on {}", h.label()), args)
                .ready_on_stderr("holding ", std::time::Duration::from_secs(20));
            hold.holds.push((format!("{} {iface}", h.label()), RoleProcess::start(h.host(), &spec, None)?));
        }
        Ok(hold)
    }

    /// A token-bucket bottleneck (`rate` bytes/s, `burst` bytes of bucket, `queue` bytes of
    /// queue) as the root qdisc of the server host's `iface`, held (a `netlane nic hold
    /// --tbf` there) until the returned hold finishes or drops, which removes it. An
    /// error, with the host's reason, when it is not put there.
    pub fn hold_bottleneck(&self, rate: u64, burst: u64, queue: u64) -> Result<NicHold> {
        let iface = self.server.spec.iface.as_deref().context("the server host names no `iface` to shape")?;
        let tbf = format!("{rate}B/s,{burst},{queue}");
        let args = words(&["nic", "hold", iface, "--tbf", &tbf, "--json", "-"]);
        let spec = RoleSpec::netlane(&format!("bottleneck on {}", self.server.label()), args)
            .ready_on_stderr("holding ", std::time::Duration::from_secs(20));
        let mut hold = NicHold::default();
        let what = format!("{} {iface}", self.server.label());
        let role = RoleProcess::start(self.server.host(), &spec, None)?;
        // Its own tbf, not one found there: `holding 1 settings of DEV (0 refused) ...`.
        let refused = !role.first_line().contains("(0 refused)");
        hold.holds.push((what, role));
        let kind = self.server.root_qdisc(iface).map(|q| q.kind);
        if refused || !matches!(kind.as_deref(), Ok("tbf")) {
            let said = hold.finish().join(" ");
            bail!(
                "no bottleneck on {iface} of {} ({}): {said}",
                self.server.label(),
                match kind {
                    Ok(k) => format!("its root qdisc is {k}"),
                    Err(e) => format!("{e:#}"),
                }
            );
        }
        Ok(hold)
    }

    /// Refuses `cpu` for the servers when their host does not have it.
    pub fn check_server_cpu(&self, cpu: usize) -> Result<()> {
        let cpus = self.server.cpus()?;
        if !cpus.as_slice().contains(&cpu) {
            bail!(
                "the server's CPU {cpu} (--server-cpu, or the first of the testbed server's `cpus`): its host has CPUs {cpus}"
            );
        }
        Ok(())
    }

    /// The address the clients reach the server at.
    pub fn server_addr(&self) -> IpAddr {
        // The file is refused without one.
        self.server.spec.addr.unwrap_or(IpAddr::from([127, 0, 0, 1]))
    }
}

//! Where a role runs, and a role as a process.
//!
//! A [`Host`] is somewhere processes run: a network namespace of this machine
//! ([`Netns`]), the machine's own namespace ([`ThisMachine`]), either of them with its
//! processes inside an application's cgroup ([`InCgroup`]), or another machine reached
//! with OpenSSH ([`SshHost`]). A role (a server, a load generator, a sender, memcached,
//! cyclictest) starts as a [`RoleProcess`] from a [`RoleSpec`]: the program (`netlane`
//! itself with a public subcommand, or a peer's own binary), its arguments, and the CPUs
//! the plan gives it. The process is pinned before it runs (through `taskset`, so every
//! thread it starts inherits the CPUs), dies with the thread that started it (on another
//! machine: with its SSH session), says it is ready on its first line of output, stops on
//! SIGINT with its final report, and is killed if it is dropped unstopped.

mod output;
mod process;
mod sample;
mod ssh;
pub mod supervisor;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use netlane::cpus::CpuList;
use netlane::lanes::apps::AppCgroup;
use netlane::topology::Netns;

pub use process::{Finished, LineHook, RoleProcess, Starting};
pub use sample::RoleSample;
pub use ssh::{SshHost, SshSpec};

/// Somewhere a role's process runs (shared by the threads that start roles there).
pub trait Host: Sync {
    /// What to call it in messages.
    fn name(&self) -> String;

    /// How `spec`'s program starts there, pinned to its CPUs (none: not pinned).
    fn launch(&self, spec: &RoleSpec) -> Result<Launch>;

    /// Runs `words` (a program and its arguments) there to its end, at most
    /// [`RUN_WITHIN`]: a check or a reading, not a role.
    fn run(&self, words: &[String]) -> Result<Output> {
        let (program, args) = words.split_first().context("no program to run")?;
        let launch = self.launch(&RoleSpec::program(program, Program::Other(program.into()), args.iter().cloned()))?;
        output_within(launch.command, None, RUN_WITHIN, &format!("`{}` on {}", words.join(" "), self.name()))
    }

    /// Whether it is another machine, whose readings reach us a round trip late (not
    /// time-stamped with this machine's clock).
    fn remote(&self) -> bool {
        false
    }

    /// The text of the file at `path` there.
    fn read_file(&self, path: &str) -> Result<String> {
        let out = self.run(&["cat".to_string(), path.to_string()])?;
        if !out.status.success() {
            bail!("read {path} on {}: {}", self.name(), String::from_utf8_lossy(&out.stderr).trim());
        }
        String::from_utf8(out.stdout).with_context(|| format!("read {path} on {}: not UTF-8", self.name()))
    }
}

/// How much of a [`Host::run`]'s output is kept (a check's or a file's: far less).
const OUTPUT_KEPT: u64 = 16 << 20;

/// The longest a [`Host::run`] may take.
pub const RUN_WITHIN: Duration = Duration::from_secs(20);

/// Runs `cmd` (reading `input`, or nothing) to its end within `limit`, its output read
/// as it comes; killed past the limit, which is an error naming `what`.
pub(crate) fn output_within(
    mut cmd: Command,
    input: Option<std::fs::File>,
    limit: Duration,
    what: &str,
) -> Result<Output> {
    use std::io::Read;
    let mut child = cmd
        .stdin(input.map_or_else(Stdio::null, Stdio::from))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("start {what}"))?;
    // Read to the end (the process never blocks on a full pipe), kept up to a bound.
    let read = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = (&mut p).take(OUTPUT_KEPT).read_to_end(&mut buf);
                let _ = std::io::copy(&mut p, &mut std::io::sink());
            }
            buf
        })
    };
    let out = read(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let err = read(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().with_context(|| format!("wait for {what}"))? {
            break status;
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{what} did not end within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Ok(Output { status, stdout: out.join().unwrap_or_default(), stderr: err.join().unwrap_or_default() })
}

/// A role's process as this machine starts it.
#[derive(Debug)]
pub struct Launch {
    /// The command this machine runs.
    pub command: Command,
    /// How the role is told to stop, and where its end is read.
    pub control: Control,
}

/// How a started role is controlled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// The command is the role: signals go to the PID we started, and its CPU is what
    /// `wait4` says.
    Signals,
    /// The command reaches a [`supervisor`] on another machine (the ssh client): a signal
    /// is a line on its standard input, closing that input stops the role, and the
    /// supervisor's last line of standard error says how the role ended and its CPU.
    Supervised,
}

/// A local command that runs `program args` (through `taskset` when pinned to `cpus`,
/// which then executes the program: its PID is the program's), `base` making the
/// command for the program it is given.
fn local_launch(base: impl Fn(&Path) -> Command, spec: &RoleSpec) -> Result<Launch> {
    let (args, cpus) = (&spec.args, &spec.cpus);
    let program = match &spec.program {
        Program::Netlane => std::env::current_exe().context("find the netlane executable")?,
        Program::Other(p) => p.clone(),
    };
    let mut command = if cpus.is_empty() {
        base(&program)
    } else {
        let mut c = base(Path::new("taskset"));
        c.args(["-c", &CpuList::new(cpus.to_vec()).to_string()]).arg(&program);
        c
    };
    command.args(args);
    Ok(Launch { command, control: Control::Signals })
}

impl Host for Netns {
    fn name(&self) -> String {
        format!("namespace {}", Netns::name(self))
    }

    fn launch(&self, spec: &RoleSpec) -> Result<Launch> {
        local_launch(|p| Netns::command(self, p), spec)
    }
}

/// Where one agent of a measurement runs: a host, and the CPUs its threads take there
/// (none: as the configuration says).
pub struct Agent<'a> {
    /// The host.
    pub host: &'a dyn Host,
    /// Its CPUs there.
    pub cpus: Vec<usize>,
}

impl std::fmt::Debug for Agent<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent").field("host", &self.host.name()).field("cpus", &self.cpus).finish()
    }
}

impl Agent<'_> {
    /// Its CPUs, when it has some of its own.
    pub fn own_cpus(&self) -> Option<Vec<usize>> {
        (!self.cpus.is_empty()).then(|| self.cpus.clone())
    }
}

/// Starts every agent of one measurement at once and waits until each says it is ready
/// (as its spec expects: hosts that take a second each to reach do not add up), then
/// gives them all the word at once (SIGUSR1): they start together to within an order's
/// trip. When one fails to start, those started are stopped.
pub fn start_together(roles: &[(&dyn Host, RoleSpec)]) -> Result<Vec<RoleProcess>> {
    let starting =
        roles.iter().map(|(host, spec)| RoleProcess::spawn(*host, spec, None)).collect::<Result<Vec<_>>>()?;
    let mut started = starting.into_iter().map(Starting::ready).collect::<Result<Vec<_>>>()?;
    for role in &mut started {
        role.signal(nix::sys::signal::Signal::SIGUSR1);
    }
    Ok(started)
}

/// `host`'s CPU `cpu` counters from its `/proc/stat`, now.
pub fn cpu_counters(host: &dyn Host, cpu: usize) -> Result<netlane::metrics::cpu::SystemCpu> {
    let text = host.read_file("/proc/stat")?;
    netlane::metrics::cpu::SystemCpu::parse_cpu(&text, cpu)
        .map(|s| stamped(host, s))
        .with_context(|| format!("no cpu{cpu} line in /proc/stat on {}", host.name()))
}

/// `reading` (just taken from `host`) time-stamped with this machine's clock when the
/// host is this machine; another machine's is left without a time, so that its busy time
/// comes from its own counters, not from our clock around an SSH round trip.
pub fn stamped(host: &dyn Host, reading: netlane::metrics::cpu::SystemCpu) -> netlane::metrics::cpu::SystemCpu {
    if host.remote() { reading } else { reading.at(netlane::time::monotonic_ns()) }
}

/// This machine's own network namespace (loopback paths).
#[derive(Debug, Clone, Copy, Default)]
pub struct ThisMachine;

impl Host for ThisMachine {
    fn name(&self) -> String {
        "this machine".into()
    }

    fn read_file(&self, path: &str) -> Result<String> {
        std::fs::read_to_string(path).with_context(|| format!("read {path}"))
    }

    fn launch(&self, spec: &RoleSpec) -> Result<Launch> {
        local_launch(|p| Command::new(p), spec)
    }
}

/// A host whose processes start inside an application's cgroup (its socket priority,
/// mark and shaping class apply from their first socket on).
pub struct InCgroup<'a> {
    /// Where the processes run: this machine, or one of its namespaces.
    pub host: &'a dyn Host,
    /// The cgroup they start in.
    pub cgroup: &'a AppCgroup,
}

impl std::fmt::Debug for InCgroup<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&Host::name(self))
    }
}

impl Host for InCgroup<'_> {
    fn name(&self) -> String {
        format!("{}, in an application's cgroup", self.host.name())
    }

    fn launch(&self, spec: &RoleSpec) -> Result<Launch> {
        let mut launch = self.host.launch(spec)?;
        if launch.control != Control::Signals {
            bail!("an application's cgroup is on this machine, and {} is not", self.host.name());
        }
        self.cgroup.command(&mut launch.command);
        Ok(launch)
    }
}

/// The program a role runs.
#[derive(Debug, Clone)]
pub enum Program {
    /// This netlane executable (a public subcommand with its JSON output).
    Netlane,
    /// Another program (a peer's own binary), found on `PATH` or at this path.
    Other(PathBuf),
}

/// One role's process: what runs, where on the machine's CPUs, and when it counts as
/// started.
#[derive(Debug, Clone)]
pub struct RoleSpec {
    /// What to call it in messages and errors ("the nvme target").
    pub name: String,
    /// What it runs.
    pub program: Program,
    /// Its arguments.
    pub args: Vec<String>,
    /// The CPUs the plan gives it (empty: not pinned).
    pub cpus: Vec<usize>,
    /// Started once its first line of standard output begins with this (`None`: once
    /// it is running).
    pub ready: Option<String>,
    /// The ready line is the first line of standard error that begins with `ready`
    /// instead (for a command whose standard output is its JSON report alone).
    pub ready_on_stderr: bool,
    /// How long it may take to say so.
    pub ready_within: Duration,
    /// What it reads on standard input (`None`: nothing, standard input closed).
    pub stdin: Option<Vec<u8>>,
    /// How often its memory and descriptors are sampled (`None`: never).
    pub sample_every: Option<Duration>,
}

impl RoleSpec {
    /// `netlane args...`, unpinned, started once running.
    pub fn netlane(name: &str, args: impl IntoIterator<Item = impl Into<String>>) -> RoleSpec {
        RoleSpec::program(name, Program::Netlane, args)
    }

    /// `program args...`, unpinned, started once running.
    pub fn program(name: &str, program: Program, args: impl IntoIterator<Item = impl Into<String>>) -> RoleSpec {
        RoleSpec {
            name: name.into(),
            program,
            args: args.into_iter().map(Into::into).collect(),
            cpus: Vec::new(),
            ready: None,
            ready_on_stderr: false,
            ready_within: Duration::from_secs(20),
            stdin: None,
            sample_every: None,
        }
    }

    /// Its resident memory and open descriptors sampled this often where it runs (on
    /// another machine, by its supervisor), read with [`RoleProcess::samples`].
    pub fn sampled(mut self, every: Duration) -> RoleSpec {
        self.sample_every = Some(every);
        self
    }

    /// Pinned to `cpus`.
    pub fn on_cpus(mut self, cpus: &[usize]) -> RoleSpec {
        self.cpus = cpus.to_vec();
        self
    }

    /// Started once its first line begins with `prefix`, within `within`.
    pub fn ready_when(mut self, prefix: &str, within: Duration) -> RoleSpec {
        self.ready = Some(prefix.into());
        self.ready_within = within;
        self
    }

    /// Started once a line of its standard error begins with `prefix`, within `within`
    /// (what it writes there before is kept as its output).
    pub fn ready_on_stderr(mut self, prefix: &str, within: Duration) -> RoleSpec {
        self.ready_on_stderr = true;
        self.ready_when(prefix, within)
    }

    /// Reads `input` on standard input.
    pub fn with_stdin(mut self, input: Vec<u8>) -> RoleSpec {
        self.stdin = Some(input);
        self
    }

    /// The command line, for messages.
    pub fn describe(&self) -> String {
        let program = match &self.program {
            Program::Netlane => "netlane".to_string(),
            Program::Other(p) => p.display().to_string(),
        };
        format!("{program} {}", self.args.join(" ")).trim_end().to_string()
    }
}

/// A command line written from a configuration: `--name value` options and `--name`
/// flags after the subcommand's words.
#[derive(Debug, Clone)]
pub struct Args(Vec<String>);

impl Args {
    /// The subcommand's words (`["rr", "serve"]`).
    pub fn new(words: &[&str]) -> Args {
        Args(words.iter().map(|w| w.to_string()).collect())
    }

    /// `--name value`.
    pub fn opt(&mut self, name: &str, value: impl ToString) -> &mut Args {
        self.0.push(format!("--{name}"));
        self.0.push(value.to_string());
        self
    }

    /// `--name value` when there is a value.
    pub fn opt_some(&mut self, name: &str, value: Option<impl ToString>) -> &mut Args {
        if let Some(v) = value {
            self.opt(name, v);
        }
        self
    }

    /// `--name` when `on`.
    pub fn flag(&mut self, name: &str, on: bool) -> &mut Args {
        if on {
            self.0.push(format!("--{name}"));
        }
        self
    }

    /// A duration as the command line reads it back exactly (nanoseconds).
    pub fn duration(&mut self, name: &str, d: Duration) -> &mut Args {
        self.opt(name, format!("{}ns", d.as_nanos()))
    }

    /// The per-NAPI settings as `--napi-defer-hard-irqs`, `--gro-flush-timeout` and
    /// `--irq-suspend-timeout`, those that are set.
    pub fn napi(&mut self, s: &netlane::topology::netdev::NapiSettings) -> &mut Args {
        self.opt_some("napi-defer-hard-irqs", s.defer_hard_irqs)
            .opt_some("gro-flush-timeout", s.gro_flush_timeout_ns.map(|ns| format!("{ns}ns")))
            .opt_some("irq-suspend-timeout", s.irq_suspend_timeout_ns.map(|ns| format!("{ns}ns")))
    }

    /// The arguments.
    pub fn into_vec(self) -> Vec<String> {
        self.0
    }
}

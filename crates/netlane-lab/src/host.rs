//! Where a role runs, and a role as a process.
//!
//! A [`Host`] is somewhere processes run: today a network namespace of this machine
//! ([`Netns`]) or the machine's own namespace ([`ThisMachine`]), either of them with its
//! processes inside an application's cgroup ([`InCgroup`]); real interfaces and other
//! machines are the next kinds. A role (a server, a load generator, a sender,
//! memcached, cyclictest) starts as a [`RoleProcess`] from a [`RoleSpec`]: the program
//! (`netlane` itself with a public subcommand, or a peer's own binary), its arguments,
//! and the CPUs the plan gives it. The process is pinned before it runs (through
//! `taskset`, so every thread it starts inherits the CPUs), dies with the thread that
//! started it, says it is ready on its first line of output, stops on SIGINT with its
//! final report, and is killed (by the PID we started) if it is dropped unstopped.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use netlane::cpus::CpuList;
use netlane::lanes::apps::AppCgroup;
use netlane::metrics::CpuTime;
use netlane::topology::Netns;
use nix::sys::signal::Signal;

/// Somewhere a role's process runs.
pub trait Host {
    /// What to call it in messages.
    fn name(&self) -> String;

    /// A command that runs `program` there.
    fn command(&self, program: &Path) -> Command;
}

impl Host for Netns {
    fn name(&self) -> String {
        format!("namespace {}", Netns::name(self))
    }

    fn command(&self, program: &Path) -> Command {
        Netns::command(self, program)
    }
}

/// This machine's own network namespace (loopback paths).
#[derive(Debug, Clone, Copy, Default)]
pub struct ThisMachine;

impl Host for ThisMachine {
    fn name(&self) -> String {
        "this machine".into()
    }

    fn command(&self, program: &Path) -> Command {
        Command::new(program)
    }
}

/// A host whose processes start inside an application's cgroup (its socket priority,
/// mark and shaping class apply from their first socket on).
pub struct InCgroup<'a> {
    /// Where the processes run.
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

    fn command(&self, program: &Path) -> Command {
        let mut cmd = self.host.command(program);
        self.cgroup.command(&mut cmd);
        cmd
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
        }
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

    /// The arguments.
    pub fn into_vec(self) -> Vec<String> {
        self.0
    }
}

/// Called with every line a role writes (standard output after the first line, and
/// standard error).
pub type LineHook = Arc<dyn Fn(&str) + Send + Sync>;

/// A role's running process.
pub struct RoleProcess {
    name: String,
    child: Option<Child>,
    first_line: String,
    stdout: Option<mpsc::Receiver<Vec<String>>>,
    stderr: Option<mpsc::Receiver<Vec<String>>>,
}

impl std::fmt::Debug for RoleProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoleProcess").field("name", &self.name).field("pid", &self.pid()).finish()
    }
}

/// What a role's process left when it ended.
#[derive(Debug, Clone)]
pub struct Finished {
    /// How it ended.
    pub status: std::process::ExitStatus,
    /// Its CPU use (the whole process, from wait4).
    pub cpu: CpuTime,
    /// Its standard output (after the ready line, when it had one).
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

impl Finished {
    /// Its standard output read as JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_str(self.stdout.trim()).with_context(|| {
            format!(
                "its output is not the report it should write: {}",
                tail(&format!("{}\n{}", self.stdout, self.stderr))
            )
        })
    }
}

impl RoleProcess {
    /// Starts `spec` on `host`, feeding nothing on standard input, and waits until it
    /// says it is ready. `hook` sees every later line it writes.
    pub fn start(host: &dyn Host, spec: &RoleSpec, hook: Option<LineHook>) -> Result<RoleProcess> {
        let program = match &spec.program {
            Program::Netlane => std::env::current_exe().context("find the netlane executable")?,
            Program::Other(p) => p.clone(),
        };
        let mut cmd = if spec.cpus.is_empty() {
            host.command(&program)
        } else {
            // taskset pins, then executes the program: its PID is the program's, and
            // every thread it starts inherits the CPUs.
            let mut c = host.command(Path::new("taskset"));
            c.args(["-c", &CpuList::new(spec.cpus.clone()).to_string()]).arg(&program);
            c
        };
        let stdin = if spec.stdin.is_some() { Stdio::piped() } else { Stdio::null() };
        cmd.args(&spec.args).stdin(stdin).stdout(Stdio::piped()).stderr(Stdio::piped());
        // A lab that dies takes its roles with it (the starting thread outlives them).
        netlane_sys::process::kill_with_parent(&mut cmd);
        let mut child = cmd.spawn().with_context(|| format!("start {} ({})", spec.name, spec.describe()))?;
        let (out, err) = (child.stdout.take(), child.stderr.take());
        // The first line is the ready line only when one is awaited; otherwise it is
        // part of the output (a client's report).
        let (first_tx, first_rx) = mpsc::channel();
        let first = spec.ready.as_ref().map(|prefix| First { tx: first_tx, prefix: prefix.clone() });
        let (out_first, err_first) = if spec.ready_on_stderr { (None, first) } else { (first, None) };
        let stdout = out.map(|o| read_lines(o, out_first, false, hook.clone()));
        let stderr = err.map(|e| read_lines(e, err_first, true, hook));
        // Written on a thread of its own, after the readers started: a process that
        // writes before it has read all its input never blocks the start.
        if let (Some(input), Some(mut pipe)) = (spec.stdin.clone(), child.stdin.take()) {
            std::thread::spawn(move || {
                use std::io::Write;
                // A process that exits early closes the pipe; how it exited tells why.
                let _ = pipe.write_all(&input);
            });
        }
        let mut role =
            RoleProcess { name: spec.name.clone(), child: Some(child), first_line: String::new(), stdout, stderr };
        if let Some(prefix) = &spec.ready {
            match first_rx.recv_timeout(spec.ready_within) {
                Ok(line) if line.starts_with(prefix.as_str()) => role.first_line = line,
                Ok(line) => bail!("{} did not start: it said {line:?} ({})", spec.name, role.stop_now().stderr_tail()),
                Err(_) => bail!(
                    "{} did not start within {:?} ({})",
                    spec.name,
                    spec.ready_within,
                    role.stop_now().stderr_tail()
                ),
            }
        }
        Ok(role)
    }

    /// Its process ID.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The line it said it was ready with.
    pub fn first_line(&self) -> &str {
        &self.first_line
    }

    /// The address a server's ready line names: `listening on ADDR ...`, the form every
    /// netlane server writes.
    pub fn listening_on(&self) -> Result<std::net::SocketAddr> {
        self.first_line
            .strip_prefix("listening on ")
            .and_then(|r| r.split_whitespace().next())
            .and_then(|a| a.parse().ok())
            .with_context(|| format!("{} said {:?}, not the address it listens on", self.name, self.first_line))
    }

    /// Asks it to stop (SIGINT: servers stop at once and write their final report) and
    /// waits at most `grace` before killing it. A stop that needed the kill, or a
    /// failed exit, is an error.
    pub fn stop(self, grace: Duration) -> Result<Finished> {
        self.stop_with(Signal::SIGINT, grace)
    }

    /// [`RoleProcess::stop`] with another signal (the balancer stops on SIGTERM as a
    /// service manager would stop it).
    pub fn stop_with(mut self, signal: Signal, grace: Duration) -> Result<Finished> {
        if let Some(pid) = self.pid() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal);
        }
        let f = self.finish(grace, Some(signal))?;
        if !f.status.success() {
            bail!("{} exited with {} on {signal}: {}", self.name, f.status, f.stderr_tail());
        }
        Ok(f)
    }

    /// Waits at most `limit` for it to end by itself (a client running to its end);
    /// an error only when it had to be killed: how it exited is the caller's to judge.
    pub fn wait(mut self, limit: Duration) -> Result<Finished> {
        self.finish(limit, None)
    }

    fn finish(&mut self, limit: Duration, stopped_by: Option<Signal>) -> Result<Finished> {
        let deadline = Instant::now() + limit;
        let mut child = self.child.take().context("the role's process was already reaped")?;
        let mut killed = false;
        loop {
            if exited(&child) {
                break;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                killed = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let usage =
            netlane_sys::process::wait_with_usage(&mut child).with_context(|| format!("wait for {}", self.name))?;
        let finished = Finished {
            status: usage.status,
            cpu: CpuTime {
                user_s: usage.user.as_secs_f64(),
                system_s: usage.system.as_secs_f64(),
                voluntary_switches: usage.voluntary_switches,
                involuntary_switches: usage.involuntary_switches,
            },
            stdout: join_lines(self.stdout.take(), killed),
            stderr: join_lines(self.stderr.take(), killed),
        };
        if killed {
            let how = match stopped_by {
                Some(s) => format!("did not stop within {limit:?} of {s}"),
                None => format!("ran past {limit:?}"),
            };
            bail!("{} {how} and was killed ({})", self.name, finished.stderr_tail());
        }
        Ok(finished)
    }

    /// Kills it now, for an error path: what it wrote so far.
    fn stop_now(&mut self) -> Finished {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
        }
        self.finish(Duration::from_secs(2), None).unwrap_or_else(|e| Finished {
            status: std::os::unix::process::ExitStatusExt::from_raw(0),
            cpu: CpuTime::default(),
            stdout: String::new(),
            stderr: format!("{e:#}"),
        })
    }
}

impl Finished {
    /// The end of what it wrote on standard error, for an error message.
    pub fn stderr_tail(&self) -> String {
        let t = tail(&self.stderr);
        if t.is_empty() { "it wrote nothing on standard error".into() } else { t }
    }
}

impl Drop for RoleProcess {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Whether `child` has exited, without reaping it (wait4 reaps it with its resource
/// usage afterwards).
fn exited(child: &Child) -> bool {
    use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT | WaitPidFlag::WNOHANG;
    !matches!(waitid(Id::Pid(nix::unistd::Pid::from_raw(child.id() as i32)), flags), Ok(WaitStatus::StillAlive))
}

/// The last few lines of `text`, on one line.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(3)..].join(" / ")
}

/// Where a reader sends the ready line: the first line, or (`scan`) the first line that
/// begins with `prefix`.
struct First {
    tx: mpsc::Sender<String>,
    prefix: String,
}

/// Reads `r` to its end on a thread of its own (so the process never blocks on a full
/// pipe): the ready line to `first` when given (with `scan`, the lines before it are
/// output too), every other line to `hook`; the lines after the ready line come through
/// the returned channel at the end (the last [`KEPT_BYTES`] of them).
fn read_lines(
    r: impl Read + Send + 'static,
    first: Option<First>,
    scan: bool,
    hook: Option<LineHook>,
) -> mpsc::Receiver<Vec<String>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(r).lines().map_while(Result::ok);
        let mut before = Vec::new();
        if let Some(first) = first {
            let line = if scan {
                // Lines before the ready line (warnings) are output like any other;
                // the last one stands for the ready line a process that ended never wrote.
                let found = lines.by_ref().find(|l| {
                    let ready = l.starts_with(first.prefix.as_str());
                    if !ready {
                        before.push(l.clone());
                    }
                    ready
                });
                found.or_else(|| before.last().cloned())
            } else {
                lines.next()
            };
            let _ = first.tx.send(line.unwrap_or_default());
        }
        // The last KEPT_BYTES of it (a long-running server's log is not held whole; its
        // final report is at the end).
        let (mut kept, mut bytes) = (std::collections::VecDeque::new(), 0usize);
        for l in before.into_iter().chain(lines) {
            if let Some(h) = &hook {
                h(&l);
            }
            bytes += l.len() + 1;
            kept.push_back(l);
            while bytes > KEPT_BYTES {
                bytes -= kept.pop_front().map_or(0, |d: String| d.len() + 1);
            }
        }
        let _ = tx.send(Vec::from(kept));
    });
    rx
}

/// The lines read from a pipe of a process that has ended. A process it started may
/// still hold the pipe open: after [`PIPE_GRACE`] what was read is given up on (the
/// reader ends with the pipe).
fn join_lines(rx: Option<mpsc::Receiver<Vec<String>>>, killed: bool) -> String {
    // A killed process's output is only for the error message: not worth a long wait.
    let grace = if killed { KILLED_PIPE_GRACE } else { PIPE_GRACE };
    rx.and_then(|rx| rx.recv_timeout(grace).ok()).map(|l| l.join("\n")).unwrap_or_default()
}

/// How long the output of an ended process may take to reach its end.
const PIPE_GRACE: Duration = Duration::from_secs(10);

/// The same for a process that had to be killed.
const KILLED_PIPE_GRACE: Duration = Duration::from_secs(1);

/// How much of a role's output is kept, from its end.
const KEPT_BYTES: usize = 16 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(name: &str, script: &str) -> RoleSpec {
        RoleSpec::program(name, Program::Other("sh".into()), ["-c", script])
    }

    #[test]
    fn a_role_says_ready_then_stops_on_sigint_with_its_report() {
        let script =
            r#"trap 'echo "{\"served\": 3}"; exit 0' INT; echo "listening on here"; while :; do sleep 0.02; done"#;
        let spec = sh("a server", script).ready_when("listening on", Duration::from_secs(5));
        let role = RoleProcess::start(&ThisMachine, &spec, None).unwrap();
        assert_eq!(role.first_line(), "listening on here");
        let done = role.stop(Duration::from_secs(5)).unwrap();
        let report: serde_json::Value = done.json().unwrap();
        assert_eq!(report["served"], 3);
    }

    #[test]
    fn a_role_whose_output_is_its_json_says_ready_on_stderr_after_its_warnings() {
        let script = r#"trap 'echo "{\"served\": 4}"; exit 0' INT; echo "warning: generic XDP" >&2;
            echo "listening on there" >&2; while :; do sleep 0.02; done"#;
        let spec = sh("a server", script).ready_on_stderr("listening on", Duration::from_secs(5));
        let role = RoleProcess::start(&ThisMachine, &spec, None).unwrap();
        assert_eq!(role.first_line(), "listening on there");
        let done = role.stop(Duration::from_secs(5)).unwrap();
        assert_eq!(done.json::<serde_json::Value>().unwrap()["served"], 4);
        assert!(done.stderr.contains("warning: generic XDP"), "{}", done.stderr);
        // One that ends without the line did not start, and says what it said last.
        let spec =
            sh("a server", "echo 'bind: address in use' >&2").ready_on_stderr("listening on", Duration::from_secs(5));
        let e = format!("{:#}", RoleProcess::start(&ThisMachine, &spec, None).unwrap_err());
        assert!(e.contains("did not start") && e.contains("address in use"), "{e}");
    }

    #[test]
    fn a_role_that_says_something_else_did_not_start_and_the_error_says_what() {
        let spec = sh("a server", "echo 'bind: address in use' >&2; echo oops; sleep 5")
            .ready_when("listening on", Duration::from_secs(5));
        let e = format!("{:#}", RoleProcess::start(&ThisMachine, &spec, None).unwrap_err());
        assert!(e.contains("a server did not start") && e.contains("oops"), "{e}");
    }

    #[test]
    fn a_client_past_its_limit_is_killed_and_that_is_an_error() {
        let role = RoleProcess::start(&ThisMachine, &sh("a client", "sleep 5"), None).unwrap();
        let started = Instant::now();
        let e = format!("{:#}", role.wait(Duration::from_millis(100)).unwrap_err());
        assert!(e.contains("a client ran past") && e.contains("killed"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(4));
    }

    #[test]
    fn a_role_reads_its_input_runs_on_its_cpus_and_every_line_reaches_the_hook() {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let hook: LineHook = {
            let seen = seen.clone();
            Arc::new(move |l: &str| seen.lock().unwrap().push(l.to_string()))
        };
        let spec = sh("a sender", "cat; grep Cpus_allowed_list /proc/self/status; echo warned >&2")
            .on_cpus(&[0])
            .with_stdin(b"job 1\n".to_vec());
        let done = RoleProcess::start(&ThisMachine, &spec, Some(hook)).unwrap().wait(Duration::from_secs(5)).unwrap();
        assert!(done.status.success());
        let lines: Vec<&str> = done.stdout.lines().collect();
        assert_eq!(lines[0], "job 1");
        assert_eq!(lines[1].split_whitespace().collect::<Vec<_>>(), ["Cpus_allowed_list:", "0"]);
        assert_eq!(done.stderr, "warned");
        let mut seen = seen.lock().unwrap().clone();
        seen.sort();
        assert_eq!(seen.len(), 3, "{seen:?}");
    }
}

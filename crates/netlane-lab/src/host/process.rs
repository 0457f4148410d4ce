//! A role's process: started on a [`Host`], ready on its first line, stopped with its
//! final report.

use std::io::Write;
use std::process::{Child, ChildStdin, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use netlane::metrics::CpuTime;
use nix::sys::signal::Signal;

use super::output::{First, join_lines, read_lines};
use super::sample::{RoleSample, Samples};
use super::supervisor::{HEARTBEAT, RoleEnd, order};
use super::{Control, Host, RoleSpec};

/// Called with every line a role writes (standard output after the first line, and
/// standard error).
pub type LineHook = Arc<dyn Fn(&str) + Send + Sync>;

/// A role's running process.
pub struct RoleProcess {
    name: String,
    child: Option<Child>,
    control: Control,
    /// A supervised role's orders (its supervisor's standard input; a heartbeat thread
    /// writes there too while it is open).
    orders: Option<Arc<Mutex<ChildStdin>>>,
    first_line: String,
    stdout: Option<mpsc::Receiver<Vec<String>>>,
    stderr: Option<mpsc::Receiver<Vec<String>>>,
    samples: Samples,
}

impl std::fmt::Debug for RoleProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoleProcess").field("name", &self.name).field("pid", &self.pid()).finish()
    }
}

/// A role process started, not yet ready.
#[derive(Debug)]
pub struct Starting {
    role: RoleProcess,
    first: mpsc::Receiver<String>,
    ready: Option<String>,
    within: Duration,
}

impl Starting {
    /// Waits until it says it is ready (at once when its spec awaits nothing); stops it
    /// when it says something else or nothing in time.
    pub fn ready(self) -> Result<RoleProcess> {
        let Starting { mut role, first, ready, within } = self;
        if let Some(prefix) = ready {
            let name = role.name.clone();
            match first.recv_timeout(within) {
                Ok(line) if line.starts_with(prefix.as_str()) => role.first_line = line,
                Ok(line) => bail!("{name} did not start: it said {line:?} ({})", role.stop_now().stderr_tail()),
                Err(_) => bail!("{name} did not start within {within:?} ({})", role.stop_now().stderr_tail()),
            }
        }
        Ok(role)
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

/// `pipe` shared with a thread that writes an empty line to it every [`HEARTBEAT`]
/// until the role closes it (drops the last strong reference) or it breaks: the remote
/// supervisor's sign that the lab is still there.
fn heartbeat(pipe: ChildStdin) -> Arc<Mutex<ChildStdin>> {
    let shared = Arc::new(Mutex::new(pipe));
    let weak = Arc::downgrade(&shared);
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(HEARTBEAT);
            let Some(pipe) = weak.upgrade() else { break };
            let mut p = pipe.lock().unwrap_or_else(|e| e.into_inner());
            if p.write_all(b"\n").and_then(|()| p.flush()).is_err() {
                break;
            }
        }
    });
    shared
}

impl RoleProcess {
    /// Starts `spec` on `host`, feeding nothing on standard input, and waits until it
    /// says it is ready. `hook` sees every later line it writes.
    pub fn start(host: &dyn Host, spec: &RoleSpec, hook: Option<LineHook>) -> Result<RoleProcess> {
        RoleProcess::spawn(host, spec, hook)?.ready()
    }

    /// Starts `spec` on `host` without waiting for it to say it is ready: several can be
    /// started at once and awaited afterwards. The process dies with this thread, which
    /// must outlive it.
    pub fn spawn(host: &dyn Host, spec: &RoleSpec, hook: Option<LineHook>) -> Result<Starting> {
        let launch = host.launch(spec)?;
        let (mut cmd, control) = (launch.command, launch.control);
        let stdin = match (control, &spec.stdin) {
            (Control::Supervised, None) => Stdio::piped(),
            (Control::Supervised, Some(_)) => {
                bail!("{} reads input, which a role on {} cannot", spec.name, host.name())
            }
            (Control::Signals, Some(_)) => Stdio::piped(),
            (Control::Signals, None) => Stdio::null(),
        };
        cmd.stdin(stdin).stdout(Stdio::piped()).stderr(Stdio::piped());
        // A lab that dies takes its roles with it (the starting thread outlives them; a
        // supervised role ends with its session).
        netlane_sys::process::kill_with_parent(&mut cmd);
        let mut child =
            cmd.spawn().with_context(|| format!("start {} ({}) on {}", spec.name, spec.describe(), host.name()))?;
        let orders = if control == Control::Supervised { child.stdin.take().map(heartbeat) } else { None };
        let (out, err) = (child.stdout.take(), child.stderr.take());
        // The first line is the ready line only when one is awaited; otherwise it is
        // part of the output (a client's report).
        let (first_tx, first_rx) = mpsc::channel();
        let first = spec.ready.as_ref().map(|prefix| First { tx: first_tx, prefix: prefix.clone() });
        let (out_first, err_first) = if spec.ready_on_stderr { (None, first) } else { (first, None) };
        // Sampled here, or by the supervisor, whose sample lines are taken out of its
        // standard error.
        let samples = Samples::default();
        let remote_samples = match (spec.sample_every, control) {
            (Some(every), Control::Signals) => {
                samples.watch(child.id(), every, || true);
                None
            }
            (Some(_), Control::Supervised) => Some(samples.clone()),
            (None, _) => None,
        };
        let stdout = out.map(|o| read_lines(o, out_first, false, hook.clone(), None));
        let stderr = err.map(|e| read_lines(e, err_first, true, hook, remote_samples));
        // Written on a thread of its own, after the readers started: a process that
        // writes before it has read all its input never blocks the start.
        if let (Some(input), Some(mut pipe)) = (spec.stdin.clone(), child.stdin.take()) {
            std::thread::spawn(move || {
                // A process that exits early closes the pipe; how it exited tells why.
                let _ = pipe.write_all(&input);
            });
        }
        let role = RoleProcess {
            name: spec.name.clone(),
            child: Some(child),
            control,
            orders,
            first_line: String::new(),
            stdout,
            stderr,
            samples,
        };
        Ok(Starting { role, first: first_rx, ready: spec.ready.clone(), within: spec.ready_within })
    }

    /// Its process ID.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Its memory and descriptors so far, sampled where it runs (none unless its spec
    /// asked for them).
    pub fn samples(&self) -> Vec<RoleSample> {
        self.samples.all()
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

    /// Sends `signal` and waits at most `grace` for its end (then kills it), however it
    /// exits: what it left, for the caller to judge.
    pub fn end_with(mut self, signal: Signal, grace: Duration) -> Result<Finished> {
        self.signal(signal);
        self.finish(grace, Some(signal))
    }

    /// [`RoleProcess::stop`] with another signal (the balancer stops on SIGTERM as a
    /// service manager would stop it).
    pub fn stop_with(mut self, signal: Signal, grace: Duration) -> Result<Finished> {
        self.signal(signal);
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

    /// Sends `signal` to the role: to the PID we started, or as an order to its
    /// supervisor.
    pub fn signal(&mut self, signal: Signal) {
        match (self.control, self.child.as_ref(), self.orders.as_mut()) {
            (Control::Signals, Some(c), _) => {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), signal);
            }
            // A broken pipe: the session has ended, and the role with it.
            (Control::Supervised, _, Some(o)) => {
                let mut o = o.lock().unwrap_or_else(|p| p.into_inner());
                let _ = o.write_all(order(signal).as_bytes()).and_then(|()| o.flush());
            }
            _ => {}
        }
    }

    /// Kills it: a supervised role is ordered to die and its session closed (the ssh
    /// client killed if it does not end within [`SESSION_GRACE`]).
    fn kill(&mut self) {
        if self.control == Control::Supervised {
            self.signal(Signal::SIGKILL);
            self.orders = None;
            let deadline = Instant::now() + SESSION_GRACE;
            while self.child.as_ref().is_some_and(|c| !exited(c)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
        }
    }

    fn finish(&mut self, limit: Duration, stopped_by: Option<Signal>) -> Result<Finished> {
        let deadline = Instant::now() + limit;
        let mut killed = false;
        loop {
            let child = self.child.as_ref().context("the role's process was already reaped")?;
            if exited(child) {
                break;
            }
            if Instant::now() >= deadline {
                self.kill();
                killed = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut child = self.child.take().context("the role's process was already reaped")?;
        self.orders = None;
        let usage =
            netlane_sys::process::wait_with_usage(&mut child).with_context(|| format!("wait for {}", self.name))?;
        let mut finished = Finished {
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
        if self.control == Control::Supervised {
            // The role's own end and CPU, not the ssh client's.
            match take_trailer(&mut finished.stderr) {
                Some(end) => (finished.status, finished.cpu) = (end.status(), end.cpu()),
                None if !killed => bail!(
                    "lost {}: its session ended before it did (ssh exited with {}: {})",
                    self.name,
                    finished.status,
                    finished.stderr_tail()
                ),
                None => {}
            }
        }
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
        self.kill();
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
        if self.child.is_some() {
            self.kill();
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }
}

/// Removes the supervisor's trailer from a role's standard error and reads it. The
/// supervisor starts it on a line of its own (a newline first: the role's last write may
/// not have ended its line), so that empty line goes too.
fn take_trailer(stderr: &mut String) -> Option<RoleEnd> {
    let mut lines: Vec<&str> = stderr.lines().collect();
    while lines.last().is_some_and(|l| l.trim().is_empty()) {
        lines.pop();
    }
    let end = RoleEnd::parse(lines.pop()?.trim_end())?;
    if lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    *stderr = lines.join("\n");
    Some(end)
}

/// How long a supervised role's session may take to end once it is told to die.
const SESSION_GRACE: Duration = Duration::from_secs(5);

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

#[cfg(test)]
mod tests {
    use super::super::output::{MAX_LINE, bounded_lines};
    use super::*;
    use crate::host::{Program, ThisMachine};

    fn sh(name: &str, script: &str) -> RoleSpec {
        RoleSpec::program(name, Program::Other("sh".into()), ["-c", script])
    }

    #[test]
    fn output_is_read_to_its_end_in_bounded_lines() {
        let mut text = b"one\r\n\xff\xfetwo\n".to_vec();
        text.extend(std::iter::repeat_n(b'x', MAX_LINE + 10));
        text.extend(b"\nlast");
        let lines: Vec<String> = bounded_lines(&text[..]).collect();
        assert_eq!(lines.len(), 4);
        assert_eq!((lines[0].as_str(), lines[1].as_str(), lines[3].as_str()), ("one", "\u{fffd}\u{fffd}two", "last"));
        assert_eq!(lines[2].len(), MAX_LINE);
    }

    #[test]
    fn the_trailer_is_found_after_a_line_the_role_left_open() {
        let end =
            RoleEnd { wait_status: 0, user_s: 0.5, system_s: 0.25, voluntary_switches: 1, involuntary_switches: 2 };
        for (text, left) in [
            (format!("warned\n\n{}\n", end.line()), "warned"),
            (format!("no newline\n{}", end.line()), "no newline"),
            (format!("\n{}\n\n", end.line()), ""),
        ] {
            let mut stderr = text.clone();
            assert_eq!(take_trailer(&mut stderr), Some(end), "{text:?}");
            assert_eq!(stderr, left, "{text:?}");
        }
        let mut none = "just output".to_string();
        assert_eq!(take_trailer(&mut none), None);
        assert_eq!(none, "just output");
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

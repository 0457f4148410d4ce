//! `netlane role`: a role's process on another machine, tied to the SSH session that
//! started it.
//!
//! Without a terminal, ssh gives a remote command no signals, and a dropped connection
//! goes unnoticed there until the command writes. So the supervisor runs the role as its
//! child and takes orders on its standard input, one signal name a line (`INT`, `TERM`,
//! `HUP`, `KILL`, and `USR1`: an agent's start); the end of that input (the session ended, the
//! lab was killed, the master connection ended) stops the role: SIGTERM, then SIGKILL
//! after a grace. A connection that breaks without closing says nothing at all: with
//! `--silence` (as the lab starts every remote role) input that stays quiet that long
//! counts as ended too, the lab writing an empty line every [`HEARTBEAT`]. When the role
//! has ended, the supervisor's last line of standard error (after a newline of its own)
//! is [`TRAILER`] and a [`RoleEnd`] as JSON: the role's wait status and CPU use, which
//! the ssh client's own cannot tell.

use std::io::BufRead;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use netlane::metrics::CpuTime;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

/// What begins the supervisor's last line.
pub const TRAILER: &str = "netlane role ended: ";

/// How a supervised role ended.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RoleEnd {
    /// Its wait status, as `wait4` gave it.
    pub wait_status: i32,
    /// User CPU seconds.
    pub user_s: f64,
    /// System CPU seconds.
    pub system_s: f64,
    /// Voluntary context switches.
    pub voluntary_switches: u64,
    /// Involuntary context switches.
    pub involuntary_switches: u64,
}

impl RoleEnd {
    /// How it exited.
    pub fn status(&self) -> ExitStatus {
        ExitStatus::from_raw(self.wait_status)
    }

    /// Its CPU use.
    pub fn cpu(&self) -> CpuTime {
        CpuTime {
            user_s: self.user_s,
            system_s: self.system_s,
            voluntary_switches: self.voluntary_switches,
            involuntary_switches: self.involuntary_switches,
        }
    }

    /// The exit code that passes its end on: its own, or 128 + the signal that ended it.
    pub fn exit_code(&self) -> u8 {
        let s = self.status();
        match (s.code(), s.signal()) {
            (Some(c), _) => c as u8,
            (None, Some(sig)) => 128u8.saturating_add(sig as u8),
            (None, None) => 1,
        }
    }

    /// The trailer line.
    pub fn line(&self) -> String {
        // A struct of numbers always serializes.
        format!("{TRAILER}{}", serde_json::to_string(self).unwrap_or_default())
    }

    /// The end a trailer line gives (`None`: not a trailer).
    pub fn parse(line: &str) -> Option<RoleEnd> {
        serde_json::from_str(line.strip_prefix(TRAILER)?).ok()
    }
}

/// An order as the line the supervisor reads.
pub fn order(signal: Signal) -> String {
    format!("{}\n", signal.as_str().trim_start_matches("SIG"))
}

/// The signal an order line names (`None`: not an order).
fn parse_order(line: &str) -> Option<Signal> {
    match line.trim() {
        "INT" => Some(Signal::SIGINT),
        "TERM" => Some(Signal::SIGTERM),
        "HUP" => Some(Signal::SIGHUP),
        "KILL" => Some(Signal::SIGKILL),
        "USR1" => Some(Signal::SIGUSR1),
        _ => None,
    }
}

/// A role running under the supervisor.
#[derive(Debug)]
pub struct Supervised {
    child: Child,
    signaller: Signaller,
}

/// Sends signals to a supervised role while it runs (never to a PID it no longer holds).
#[derive(Debug, Clone)]
pub struct Signaller {
    pid: Pid,
    /// Set once the role has exited, before it is reaped: its PID cannot be reused while
    /// this is false.
    ended: Arc<Mutex<bool>>,
}

impl Signaller {
    /// Writes a sample of the role's memory and descriptors to standard error every
    /// `every` until it ends ([`super::sample::SAMPLE`] lines).
    pub fn report_samples(&self, every: Duration) {
        let (pid, ended) = (self.pid.as_raw() as u32, self.ended.clone());
        std::thread::spawn(move || {
            let start = std::time::Instant::now();
            while !*ended.lock().unwrap_or_else(PoisonError::into_inner) {
                let Some(s) = super::sample::RoleSample::read(pid, start.elapsed()) else { break };
                // One write: a line of its own unless the role's last write ended
                // mid-line (the lab finds it there too).
                let _ = std::io::Write::write_all(&mut std::io::stderr(), format!("{}\n", s.line()).as_bytes());
                std::thread::sleep(every);
            }
        });
    }

    /// Sends `signal` to the role unless it has ended.
    pub fn send(&self, signal: Signal) {
        let ended = self.ended.lock().unwrap_or_else(PoisonError::into_inner);
        if !*ended {
            let _ = nix::sys::signal::kill(self.pid, signal);
        }
    }
}

impl Supervised {
    /// Starts `argv` (program, then its arguments): no input, its output the supervisor's
    /// own, dead with the supervisor.
    pub fn start(argv: &[String]) -> Result<Supervised> {
        let Some((program, args)) = argv.split_first() else { bail!("no program to run") };
        let mut cmd = Command::new(program);
        cmd.args(args).stdin(Stdio::null());
        netlane_sys::process::kill_with_parent(&mut cmd);
        let child = cmd.spawn().with_context(|| format!("start {program}"))?;
        let signaller = Signaller { pid: Pid::from_raw(child.id() as i32), ended: Arc::new(Mutex::new(false)) };
        Ok(Supervised { child, signaller })
    }

    /// What signals it.
    pub fn signaller(&self) -> Signaller {
        self.signaller.clone()
    }

    /// Waits until it ends.
    pub fn wait(mut self) -> Result<RoleEnd> {
        use nix::sys::wait::{Id, WaitPidFlag, waitid};
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT;
        loop {
            match waitid(Id::Pid(self.signaller.pid), flags) {
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e).context("wait for the role"),
                Ok(_) => break,
            }
        }
        *self.signaller.ended.lock().unwrap_or_else(PoisonError::into_inner) = true;
        let u = netlane_sys::process::wait_with_usage(&mut self.child).context("reap the role")?;
        Ok(RoleEnd {
            wait_status: u.status.into_raw(),
            user_s: u.user.as_secs_f64(),
            system_s: u.system.as_secs_f64(),
            voluntary_switches: u.voluntary_switches,
            involuntary_switches: u.involuntary_switches,
        })
    }
}

/// Passes the orders read from `input` on to the role until the input ends, then stops
/// it: SIGTERM, and SIGKILL `grace` later if it still runs. With `silence`, input that
/// says nothing for that long counts as ended: the lab writes an empty line every
/// [`HEARTBEAT`], so a connection that died without closing ends the role too.
pub fn obey(input: impl BufRead + Send + 'static, role: &Signaller, grace: Duration, silence: Option<Duration>) {
    let (tx, rx) = std::sync::mpsc::channel();
    // Read on a thread of its own so that a silent input can be given up on.
    std::thread::spawn(move || {
        for line in input.lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    loop {
        let line = match silence {
            Some(limit) => match rx.recv_timeout(limit) {
                Ok(line) => line,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    tracing::warn!(?limit, "no word from the lab: its connection is taken for lost");
                    break;
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            },
            None => match rx.recv() {
                Ok(line) => line,
                Err(_) => break,
            },
        };
        if line.is_empty() {
            continue;
        }
        match parse_order(&line) {
            Some(signal) => role.send(signal),
            None => tracing::warn!(line, "not an order (INT, TERM, HUP, KILL or USR1); ignored"),
        }
    }
    role.send(Signal::SIGTERM);
    std::thread::sleep(grace);
    role.send(Signal::SIGKILL);
}

/// How often the lab tells a remote role it is still there (an empty line).
pub const HEARTBEAT: Duration = Duration::from_secs(5);

/// How long a remote role waits for a word from the lab before it stops: six
/// heartbeats missed.
pub const SILENCE: Duration = Duration::from_secs(30);

#[cfg(test)]
mod tests {
    use super::*;

    /// `sh -c traps...; loop`, started once its traps are set (an order sent before
    /// would meet the shell's default dispositions).
    fn trapping(name: &str, traps: &str) -> Supervised {
        let mark = std::env::temp_dir().join(format!("netlane-supervisor-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&mark);
        let script = format!("{traps}; touch '{}'; while :; do sleep 0.01; done", mark.display());
        let role = Supervised::start(&["sh".into(), "-c".into(), script]).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !mark.exists() {
            assert!(std::time::Instant::now() < deadline, "{name}: its traps were never set");
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = std::fs::remove_file(&mark);
        role
    }

    #[test]
    fn an_order_reaches_the_role_and_its_end_comes_back_as_a_trailer() {
        // SIGTERM ignored: the end of input that follows the order cannot overtake it.
        let role = trapping("int", "trap 'exit 7' INT; trap '' TERM");
        let s = role.signaller();
        // Not joined: it sends SIGKILL only to a role that still runs a minute on.
        std::thread::spawn(move || {
            obey(std::io::Cursor::new(order(Signal::SIGINT)), &s, Duration::from_secs(60), None)
        });
        let end = role.wait().unwrap();
        assert_eq!(end.status().code(), Some(7));
        assert_eq!(end.exit_code(), 7);
        assert_eq!(RoleEnd::parse(&end.line()), Some(end));
        assert_eq!(RoleEnd::parse("netlane role ended: {"), None);
        assert_eq!(RoleEnd::parse("listening on x"), None);
    }

    #[test]
    fn the_end_of_input_stops_a_role_that_ignores_sigterm_with_sigkill() {
        let role = trapping("term", "trap '' TERM");
        let s = role.signaller();
        let orders = std::thread::spawn(move || obey(std::io::empty(), &s, Duration::from_millis(50), None));
        let end = role.wait().unwrap();
        orders.join().unwrap();
        assert_eq!(end.status().signal(), Some(libc::SIGKILL));
        assert_eq!(end.exit_code(), 128 + 9);
    }

    #[test]
    fn input_that_stays_open_but_silent_past_the_limit_stops_the_role() {
        let role = trapping("silent", "trap 'exit 9' TERM");
        let s = role.signaller();
        // The writer is kept open: the input never ends, it only goes quiet after two
        // heartbeats.
        let (r, mut w) = std::io::pipe().unwrap();
        std::io::Write::write_all(&mut w, b"\n\n").unwrap();
        let started = std::time::Instant::now();
        let input = std::io::BufReader::new(r);
        std::thread::spawn(move || obey(input, &s, Duration::from_secs(60), Some(Duration::from_millis(300))));
        let end = role.wait().unwrap();
        assert_eq!(end.exit_code(), 9, "stopped with SIGTERM");
        assert!(started.elapsed() >= Duration::from_millis(300), "{:?}", started.elapsed());
        drop(w);
    }

    #[test]
    fn orders_are_signal_names() {
        assert_eq!(order(Signal::SIGINT), "INT\n");
        for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP, Signal::SIGKILL, Signal::SIGUSR1] {
            assert_eq!(parse_order(&order(s)), Some(s));
        }
        assert_eq!(parse_order("STOP"), None);
        assert!(Supervised::start(&[]).is_err());
    }
}

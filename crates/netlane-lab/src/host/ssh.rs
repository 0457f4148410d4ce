//! Another machine, reached with OpenSSH.
//!
//! Nothing of ours runs there but the roles: the user's `ssh` client (their keys, agent
//! and configuration) opens one master connection per host, which every role's session
//! shares; each role runs under `netlane role` (the [`supervisor`](super::supervisor)),
//! so it stops on our orders and dies with its session. The host's netlane must be this
//! one's version: results from two builds are not one measurement.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use netlane::cpus::CpuList;

use super::{Control, Host, Launch, Program, RUN_WITHIN, RoleSpec, output_within};

/// How to reach a host over SSH.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshSpec {
    /// `[user@]host`, or a `Host` of the SSH configuration.
    pub destination: String,
    /// An SSH configuration file read instead of the user's (`ssh -F`).
    pub config: Option<PathBuf>,
    /// The netlane executable there (a bare name is looked up on its `PATH`).
    pub netlane: String,
    /// Where the host has no netlane of this version, copy this executable (this very
    /// netlane) there, over SSH into `~/.cache/netlane/` on it, and use that.
    pub deploy: Option<PathBuf>,
}

impl SshSpec {
    /// `destination` with the user's configuration and `netlane` on the host's `PATH`.
    pub fn new(destination: &str) -> SshSpec {
        SshSpec { destination: destination.into(), config: None, netlane: "netlane".into(), deploy: None }
    }
}

/// A host reached over SSH, its master connection open.
#[derive(Debug)]
pub struct SshHost {
    spec: SshSpec,
    /// Holds the master's control socket and log; removed on drop.
    dir: PathBuf,
    master: Child,
}

/// How long copying netlane to a host may take.
const COPY_WITHIN: Duration = Duration::from_secs(600);

/// How long the master connection may take to come up.
const CONNECT_WITHIN: Duration = Duration::from_secs(20);

/// Options every ssh invocation gets: no prompts (a lab never waits on a password), a
/// connection that is dead after 15 s without answers is given up.
const OPTIONS: [&str; 8] =
    ["-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"];

impl SshHost {
    /// Opens the master connection to `spec`'s host and checks that its netlane is this
    /// one's version.
    pub fn connect(spec: &SshSpec) -> Result<SshHost> {
        if spec.destination.is_empty() || spec.destination.starts_with('-') {
            bail!("{:?} is not an SSH destination", spec.destination);
        }
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "netlane-ssh-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
            .create(&dir)
            .with_context(|| format!("create {}", dir.display()))?;
        let log = dir.join("master.log");
        let log_file = std::fs::File::create(&log).with_context(|| format!("create {}", log.display()))?;
        let mut cmd = Command::new("ssh");
        config_arg(&mut cmd, spec);
        cmd.args(OPTIONS)
            .args(["-o", "ControlMaster=yes", "-o", "ControlPersist=no", "-N", "-S"])
            .arg(dir.join("m"))
            .arg(&spec.destination)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file);
        netlane_sys::process::kill_with_parent(&mut cmd);
        let master = match cmd.spawn() {
            Ok(m) => m,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e).context("start ssh (the OpenSSH client)");
            }
        };
        let mut host = SshHost { spec: spec.clone(), dir, master };
        host.wait_for_master()?;
        match (host.check_version(), &spec.deploy) {
            (Err(e), Some(exe)) => {
                tracing::info!(host = %spec.destination, why = %format!("{e:#}"), "copying this netlane there");
                host.deploy(exe)?;
                host.check_version().context("the netlane copied there")?;
            }
            (checked, _) => checked?,
        }
        Ok(host)
    }

    /// Waits until the master connection is up (its control socket exists).
    fn wait_for_master(&mut self) -> Result<()> {
        let deadline = Instant::now() + CONNECT_WITHIN;
        loop {
            if self.dir.join("m").exists() {
                return Ok(());
            }
            if let Ok(Some(status)) = self.master.try_wait() {
                bail!("cannot reach {} over SSH (ssh exited with {status}: {})", self.spec.destination, self.log());
            }
            if Instant::now() >= deadline {
                bail!("cannot reach {} over SSH within {CONNECT_WITHIN:?} ({})", self.spec.destination, self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What the master wrote, on one line.
    fn log(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("master.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        if lines.is_empty() { "it said nothing".into() } else { lines.join(" / ") }
    }

    /// An ssh command over the master connection that runs `words` there (each quoted
    /// for the remote shell).
    fn session(&self, words: &[String]) -> Command {
        let mut cmd = Command::new("ssh");
        config_arg(&mut cmd, &self.spec);
        cmd.args(OPTIONS)
            .args(["-o", "ControlMaster=no", "-S"])
            .arg(self.dir.join("m"))
            .arg(&self.spec.destination)
            .arg(words.iter().map(|w| quote(w)).collect::<Vec<_>>().join(" "));
        cmd
    }

    /// Copies this netlane to `~/.cache/netlane/netlane-COMMIT` there (streamed through the
    /// master connection; written under another name and renamed, so a half-copied file is
    /// never run) and uses it from now on.
    fn deploy(&mut self, exe: &std::path::Path) -> Result<()> {
        let commit = netlane_report::provenance::GIT_COMMIT;
        let made =
            self.run(&["sh".into(), "-c".into(), "mkdir -p ~/.cache/netlane && cd ~/.cache/netlane && pwd".into()])?;
        let dir = String::from_utf8_lossy(&made.stdout).trim().to_string();
        if !made.status.success() || !dir.starts_with('/') {
            bail!(
                "make ~/.cache/netlane on {}: {}",
                self.spec.destination,
                String::from_utf8_lossy(&made.stderr).trim()
            );
        }
        let path = format!("{dir}/netlane-{commit}");
        // Copied before (an earlier connection of this lab): used as it is.
        let cached = std::mem::replace(&mut self.spec.netlane, path.clone());
        if self.check_version().is_ok() {
            return Ok(());
        }
        self.spec.netlane = cached;
        let partial = format!("{path}.part-{}", std::process::id());
        let file = std::fs::File::open(exe).with_context(|| format!("open {}", exe.display()))?;
        // Streamed through the session (no SFTP server needed there).
        let copy = self.session(&["sh".into(), "-c".into(), format!("cat > {}", quote(&partial))]);
        let copied =
            output_within(copy, Some(file), COPY_WITHIN, &format!("copy netlane to {}", self.spec.destination));
        let failed = match &copied {
            Ok(out) if out.status.success() => None,
            Ok(out) => Some(String::from_utf8_lossy(&out.stderr).trim().to_string()),
            Err(e) => Some(format!("{e:#}")),
        };
        if let Some(why) = failed {
            // A half-copied file is not left behind.
            let _ = self.run(&["rm".into(), "-f".into(), partial.clone()]);
            bail!("copy netlane to {}: {why}", self.spec.destination);
        }
        let placed = self.run(&[
            "sh".into(),
            "-c".into(),
            format!("chmod 0755 {p} && mv -f {p} {}", quote(&path), p = quote(&partial)),
        ])?;
        if !placed.status.success() {
            bail!("install netlane on {}: {}", self.spec.destination, String::from_utf8_lossy(&placed.stderr).trim());
        }
        self.spec.netlane = path;
        Ok(())
    }

    /// The netlane executable used there.
    pub fn netlane(&self) -> &str {
        &self.spec.netlane
    }

    /// Refuses a host whose netlane is missing or another version.
    fn check_version(&self) -> Result<()> {
        let out = self.run(&[self.spec.netlane.clone(), "--version".into()])?;
        let theirs = String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or_default().trim().to_string();
        let ours = format!("netlane {}", netlane_report::provenance::VERSION_LINE);
        if !out.status.success() {
            let said = String::from_utf8_lossy(&out.stderr).trim().to_string();
            bail!("no netlane at {:?} on {} ({said})", self.spec.netlane, self.spec.destination);
        }
        if theirs != ours {
            bail!("{} has {theirs:?} at {:?}, and this is {ours:?}", self.spec.destination, self.spec.netlane);
        }
        Ok(())
    }
}

impl Host for SshHost {
    fn name(&self) -> String {
        format!("host {}", self.spec.destination)
    }

    fn remote(&self) -> bool {
        true
    }

    /// Runs `words` there directly (no supervisor: it ends by itself).
    fn run(&self, words: &[String]) -> Result<Output> {
        output_within(self.session(words), None, RUN_WITHIN, &format!("`{}` on {}", words.join(" "), self.name()))
    }

    fn launch(&self, spec: &RoleSpec) -> Result<Launch> {
        let (program, args, cpus) = (&spec.program, &spec.args, &spec.cpus);
        let silence = format!("{}s", super::supervisor::SILENCE.as_secs());
        let mut words = vec![self.spec.netlane.clone(), "role".into(), "--silence".into(), silence];
        if let Some(every) = spec.sample_every {
            words.extend(["--sample".into(), format!("{}ms", every.as_millis().max(1))]);
        }
        words.push("--".into());
        if !cpus.is_empty() {
            words.extend(["taskset".into(), "-c".into(), CpuList::new(cpus.to_vec()).to_string()]);
        }
        words.push(match program {
            Program::Netlane => self.spec.netlane.clone(),
            Program::Other(p) => p.display().to_string(),
        });
        words.extend(args.iter().cloned());
        Ok(Launch { command: self.session(&words), control: Control::Supervised })
    }
}

impl Drop for SshHost {
    fn drop(&mut self) {
        // The master's end closes every session it carried: their roles stop.
        let _ = self.master.kill();
        let _ = self.master.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn config_arg(cmd: &mut Command, spec: &SshSpec) {
    if let Some(c) = &spec.config {
        cmd.arg("-F").arg(c);
    }
}

/// `word` as one word of a POSIX shell's command line (ssh hands the remote command to
/// the user's shell as one string).
fn quote(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./:=,@%+".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        return word.to_string();
    }
    format!("'{}'", word.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_reach_the_remote_shell_as_they_are() {
        let words = ["plain-1.0:x", "", "two words", "it's", "$HOME", "a;b", "*"];
        let line: Vec<String> = words.iter().map(|w| quote(w)).collect();
        assert_eq!(line[0], "plain-1.0:x");
        let out = Command::new("sh").arg("-c").arg(format!("printf '%s\\n' {}", line.join(" "))).output().unwrap();
        assert_eq!(String::from_utf8(out.stdout).unwrap(), words.map(|w| format!("{w}\n")).concat());
    }

    #[test]
    fn a_destination_that_would_be_an_option_is_refused_before_ssh_runs() {
        let e = SshHost::connect(&SshSpec::new("-oProxyCommand=x")).unwrap_err().to_string();
        assert!(e.contains("not an SSH destination"), "{e}");
    }
}

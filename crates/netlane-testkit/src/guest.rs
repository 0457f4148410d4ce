//! A stock Linux kernel in a QEMU guest, for tests against real kernel peers (the
//! kernel's NVMe/TCP host and target, qdiscs this kernel lacks).
//!
//! `scripts/build-guest.sh` builds `target/guest/` from Debian's packages: the kernel
//! (`vmlinux`) and an initramfs (`base.cpio.gz`: busybox, nvme-cli, the modules) whose
//! `/init` brings up the network (10.0.2.15/24, gateway 10.0.2.2, QEMU's user-mode
//! networking, where 10.0.2.2 is the host's 127.0.0.1) and runs `/test.sh`. A test
//! puts its own archive with that script in front, boots, and reads the serial console: the
//! guest prints `NETLANE-GUEST: ...` lines. Host services are reached from the guest at
//! 10.0.2.2; guest services from the host through forwarded loopback ports. Nothing
//! leaves the machine.
//!
//! QEMU runs under TCG (the VMs this is developed on have a /dev/kvm that cannot run a
//! stock kernel usefully); the guest reaches `/test.sh` in about five seconds.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Where `scripts/build-guest.sh` puts the guest.
pub fn guest_dir() -> PathBuf {
    std::env::var_os("NETLANE_GUEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/guest"))
}

/// Whether guest tests can run: the guest is built and QEMU is installed. Without them
/// a test is skipped with a message, unless `NETLANE_REQUIRE_GUEST=1` (set by `make
/// test`, which builds the guest first), in which case it fails.
///
/// # Panics
/// When the guest cannot run and `NETLANE_REQUIRE_GUEST=1` forbids skipping.
pub fn guest_available(test: &str) -> bool {
    let dir = guest_dir();
    let missing = if !dir.join("vmlinux").is_file() || !dir.join("base.cpio.gz").is_file() {
        Some(format!("no guest in {} (scripts/build-guest.sh builds it)", dir.display()))
    } else if Command::new("qemu-system-x86_64").arg("--version").output().is_err() {
        Some("qemu-system-x86_64 is not installed (scripts/setup.sh installs it)".into())
    } else if Command::new("cpio").arg("--version").output().is_err() {
        Some("cpio is not installed (scripts/setup.sh installs it)".into())
    } else {
        None
    };
    match missing {
        None => true,
        Some(why) if std::env::var("NETLANE_REQUIRE_GUEST").as_deref() == Ok("1") => {
            panic!("{test}: {why}, and NETLANE_REQUIRE_GUEST=1 forbids skipping")
        }
        Some(why) => {
            eprintln!("SKIPPED {test}: {why}");
            false
        }
    }
}

/// A free loopback TCP port (bound and released; QEMU binds it next).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).unwrap_or(0)
}

/// What to boot.
#[derive(Debug, Clone)]
pub struct GuestSpec {
    /// `/test.sh`: a busybox shell script the guest runs after booting.
    pub script: String,
    /// Host loopback port -> guest TCP port forwards.
    pub forwards: Vec<(u16, u16)>,
    /// Guest memory, MiB.
    pub memory_mib: u32,
    /// Guest CPUs.
    pub cpus: u32,
    /// The whole run's limit: the guest is killed when it is reached.
    pub timeout: Duration,
    /// Host files put into the guest, at these paths (relative to its root).
    pub files: Vec<(PathBuf, String)>,
    /// Whether it has the user-mode network device (`eth0`, 10.0.2.15).
    pub user_net: bool,
    /// More QEMU arguments (another network device, say).
    pub qemu_args: Vec<String>,
    /// A network namespace of this machine QEMU runs in (where its tap device is).
    pub netns: Option<String>,
}

impl GuestSpec {
    /// A 1 GiB, 2-CPU guest running `script`, for at most `timeout`.
    pub fn new(script: &str, timeout: Duration) -> GuestSpec {
        GuestSpec {
            script: script.to_string(),
            forwards: Vec::new(),
            memory_mib: 1024,
            cpus: 2,
            timeout,
            files: Vec::new(),
            user_net: true,
            qemu_args: Vec::new(),
            netns: None,
        }
    }
}

/// The test archive's folder, beside `/test.sh`.
fn spec_dir(script: &std::path::Path) -> PathBuf {
    script.parent().map(PathBuf::from).unwrap_or_default()
}

/// A running guest; killed (by the PID this process started) when dropped.
#[derive(Debug)]
pub struct Guest {
    child: Child,
    lines: mpsc::Receiver<String>,
    log: Vec<String>,
    deadline: Instant,
    dir: PathBuf,
}

/// The line guest scripts mark their output with.
pub const MARK: &str = "NETLANE-GUEST: ";

impl Guest {
    /// Boots `spec`. Fails when the guest is not built or QEMU cannot start.
    pub fn boot(spec: &GuestSpec) -> Result<Guest, String> {
        let base = guest_dir();
        let dir = std::env::temp_dir().join(format!("netlane-guest-{}-{}", std::process::id(), free_port()));
        std::fs::create_dir_all(dir.join("ir")).map_err(|e| format!("{}: {e}", dir.display()))?;
        let script = dir.join("ir/test.sh");
        std::fs::write(&script, format!("#!/bin/sh\n{}\n", spec.script)).map_err(|e| e.to_string())?;
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .map_err(|e| e.to_string())?;
        // The test's archive, uncompressed, then the base one: the kernel unpacks both
        // (an uncompressed archive after a compressed one is not found reliably; this
        // is the order early-microcode initramfs images use).
        let mut cpio = Command::new("cpio")
            .args(["-o", "-H", "newc", "--quiet"])
            .current_dir(dir.join("ir"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("run cpio: {e}"))?;
        let mut list = vec!["test.sh".to_string()];
        for (host, at) in &spec.files {
            let at = at.trim_start_matches('/');
            let mut dir = String::new();
            for part in at.split('/').collect::<Vec<_>>().split_last().map_or(&[][..], |(_, d)| d) {
                dir = if dir.is_empty() { part.to_string() } else { format!("{dir}/{part}") };
                if !list.contains(&dir) {
                    std::fs::create_dir_all(spec_dir(&script).join(&dir)).map_err(|e| e.to_string())?;
                    list.push(dir.clone());
                }
            }
            std::fs::copy(host, spec_dir(&script).join(at)).map_err(|e| format!("{}: {e}", host.display()))?;
            list.push(at.to_string());
        }
        let names = list.join("\n") + "\n";
        cpio.stdin.take().ok_or("cpio stdin")?.write_all(names.as_bytes()).map_err(|e| e.to_string())?;
        let out = cpio.wait_with_output().map_err(|e| e.to_string())?;
        let mut initrd = out.stdout;
        initrd.extend(std::fs::read(base.join("base.cpio.gz")).map_err(|e| format!("{}: {e}", base.display()))?);
        let initrd_path = dir.join("initrd");
        std::fs::write(&initrd_path, initrd).map_err(|e| e.to_string())?;

        let mut netdev = "user,id=n0".to_string();
        for (host, guest) in &spec.forwards {
            netdev.push_str(&format!(",hostfwd=tcp:127.0.0.1:{host}-:{guest}"));
        }
        let mut qemu = match &spec.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "qemu-system-x86_64"]);
                c
            }
            None => Command::new("qemu-system-x86_64"),
        };
        if spec.user_net {
            qemu.args(["-netdev", &netdev, "-device", "virtio-net-pci,netdev=n0"]);
        }
        let mut child = qemu
            .args(["-accel", "tcg,thread=multi", "-cpu", "max", "-nodefaults", "-no-reboot"])
            .args(["-m", &spec.memory_mib.to_string(), "-smp", &spec.cpus.to_string()])
            .arg("-kernel")
            .arg(base.join("vmlinux"))
            .arg("-initrd")
            .arg(&initrd_path)
            .args(["-append", "console=ttyS0 quiet panic=1 oops=panic"])
            .args(["-display", "none", "-serial", "stdio", "-monitor", "none"])
            .args(&spec.qemu_args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("start qemu-system-x86_64: {e}"))?;
        let (tx, rx) = mpsc::channel();
        for pipe in [
            child.stdout.take().map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
            child.stderr.take().map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    let line = line.trim_end_matches('\r').to_string();
                    if tx.send(line).is_err() {
                        return;
                    }
                }
            });
        }
        Ok(Guest { child, lines: rx, log: Vec::new(), deadline: Instant::now() + spec.timeout, dir })
    }

    fn next_line(&mut self, until: Instant) -> Option<String> {
        let now = Instant::now();
        let until = until.min(self.deadline);
        if now >= until {
            return None;
        }
        let l = self.lines.recv_timeout(until - now).ok()?;
        self.log.push(l.clone());
        Some(l)
    }

    /// Waits (at most `within`) for a console line containing `text`; the guest's
    /// console so far is in the error.
    pub fn expect(&mut self, text: &str, within: Duration) -> Result<String, String> {
        let until = Instant::now() + within;
        while let Some(l) = self.next_line(until) {
            if l.contains(text) {
                return Ok(l);
            }
        }
        Err(format!("the guest did not say {text:?} in time; its console:\n{}", self.tail(60)))
    }

    /// Waits for the guest to finish (power off), at most until its timeout; returns the
    /// lines it marked with [`MARK`], without the mark.
    pub fn finish(mut self) -> Result<Vec<String>, String> {
        while self.next_line(self.deadline).is_some() {}
        let done = self.log.iter().any(|l| l.contains("NETLANE-GUEST: done"));
        if !done {
            return Err(format!("the guest did not finish in time; its console:\n{}", self.tail(80)));
        }
        Ok(self.marked())
    }

    /// The lines the guest marked so far, without the mark.
    pub fn marked(&self) -> Vec<String> {
        self.log.iter().filter_map(|l| l.split_once(MARK).map(|(_, r)| r.to_string())).collect()
    }

    /// The last `n` console lines.
    pub fn tail(&self, n: usize) -> String {
        self.log[self.log.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

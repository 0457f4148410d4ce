//! Hosts reached over SSH, made of network namespaces of this machine: each runs
//! Debian's OpenSSH server (`sshd -D`) on its own loopback, with a host key and a
//! throwaway `authorized_keys` made for the test. The client reaches a host only
//! through `ssh`, with a configuration file of its own whose `ProxyCommand` carries the
//! connection into the host's namespace (as a jump host would); nothing listens on this
//! machine's own addresses.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use netlane::topology::Netns;

/// One SSH host.
#[derive(Debug)]
pub struct SshdHost {
    /// Its `Host` name in [`SshHosts::config`].
    pub alias: String,
    /// Its network namespace.
    pub ns: Netns,
    sshd: Child,
}

/// SSH hosts and the client configuration that reaches them.
#[derive(Debug)]
pub struct SshHosts {
    /// The hosts, in the order asked for.
    pub hosts: Vec<SshdHost>,
    /// The ssh configuration file (`ssh -F`) naming each host by its alias.
    pub config: PathBuf,
    dir: PathBuf,
}

/// The OpenSSH server.
const SSHD: &str = "/usr/sbin/sshd";

/// How long an sshd may take to listen.
const LISTEN_WITHIN: Duration = Duration::from_secs(10);

fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{what}: {} ({})", out.status, String::from_utf8_lossy(&out.stderr).trim()))
    }
}

impl SshHosts {
    /// A host for each of `aliases`, each running its sshd.
    pub fn start(aliases: &[&str]) -> Result<SshHosts, String> {
        if !Path::new(SSHD).is_file() {
            return Err(format!("{SSHD} is missing: scripts/setup.sh installs openssh-server"));
        }
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("netlane-sshd-{}-{n}-{}", std::process::id(), aliases.join("-")));
        let _ = std::fs::remove_dir_all(&dir);
        std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
            .create(&dir)
            .map_err(|e| format!("create {}: {e}", dir.display()))?;
        let mut made = SshHosts { hosts: Vec::new(), config: dir.join("ssh_config"), dir };
        made.keys()?;
        // sshd refuses to start without its privilege separation directory (made at boot
        // on a machine that runs it as a service).
        std::fs::create_dir_all("/run/sshd").map_err(|e| format!("create /run/sshd: {e}"))?;
        let mut config = String::new();
        for alias in aliases {
            let host = made.start_host(alias)?;
            config.push_str(&format!(
                "Host {alias}\n  HostName 127.0.0.1\n  User root\n  IdentityFile {d}/id\n  IdentitiesOnly yes\n  \
                 UserKnownHostsFile {d}/known_hosts\n  GlobalKnownHostsFile /dev/null\n  HostKeyAlias \
                 netlane-test-host\n  StrictHostKeyChecking yes\n  LogLevel ERROR\n  ProxyCommand ip netns exec {ns} \
                 socat STDIO TCP:127.0.0.1:22\n",
                d = made.dir.display(),
                ns = host.ns.name(),
            ));
            made.hosts.push(host);
        }
        std::fs::write(&made.config, config).map_err(|e| format!("write the ssh configuration: {e}"))?;
        Ok(made)
    }

    /// The client's key, the hosts' key, `authorized_keys` and `known_hosts`.
    fn keys(&self) -> Result<(), String> {
        for key in ["id", "host_key"] {
            run(
                Command::new("ssh-keygen")
                    .args(["-q", "-t", "ed25519", "-N", "", "-C", key, "-f"])
                    .arg(self.dir.join(key)),
                &format!("ssh-keygen {key}"),
            )?;
        }
        let read = |f: &str| std::fs::read_to_string(self.dir.join(f)).map_err(|e| format!("read {f}: {e}"));
        let write =
            |f: &str, text: String| std::fs::write(self.dir.join(f), text).map_err(|e| format!("write {f}: {e}"));
        write("authorized_keys", read("id.pub")?)?;
        write("known_hosts", format!("netlane-test-host {}", read("host_key.pub")?))
    }

    fn start_host(&self, alias: &str) -> Result<SshdHost, String> {
        let ns = Netns::create(&format!("ssh-{alias}")).map_err(|e| format!("namespace for {alias}: {e}"))?;
        let config = self.dir.join(format!("sshd_{alias}"));
        let d = self.dir.display();
        std::fs::write(
            &config,
            format!(
                "ListenAddress 127.0.0.1:22\nHostKey {d}/host_key\nAuthorizedKeysFile {d}/authorized_keys\n\
                 PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
                 UsePAM no\nStrictModes no\nPidFile none\nMaxSessions 100\nMaxStartups 100\nLogLevel ERROR\n"
            ),
        )
        .map_err(|e| format!("write {}: {e}", config.display()))?;
        // Its log (a line per connection the readiness probe below opens) goes to a file.
        let log = std::fs::File::create(self.dir.join(format!("sshd_{alias}.log"))).map_err(|e| e.to_string())?;
        // Through `ip netns exec`, which also mounts a sysfs of the namespace: what runs
        // there reads its own devices under /sys, as on a machine of its own.
        let sshd = Command::new("ip")
            .args(["netns", "exec", ns.name(), SSHD, "-D", "-e", "-f"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("start sshd for {alias}: {e}"))?;
        let host = SshdHost { alias: alias.into(), ns, sshd };
        let deadline = Instant::now() + LISTEN_WITHIN;
        while !host.ns.run(|| std::net::TcpStream::connect("127.0.0.1:22").is_ok()).unwrap_or(false) {
            if Instant::now() >= deadline {
                return Err(format!("sshd for {alias} did not listen within {LISTEN_WITHIN:?}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(host)
    }
}

impl SshHosts {
    /// Joins the hosts on one network: a bridge in the first host's namespace at
    /// `PREFIX.1/24`, every other host on it at `PREFIX.(i+1)` (on its `eth0`). The
    /// links go with the namespaces.
    pub fn bridge(&self, prefix: &str) -> Result<(), String> {
        let ip = |ns: &str, args: String| {
            run(Command::new("ip").args(["-n", ns]).args(args.split_whitespace()), &format!("ip -n {ns} {args}"))
        };
        let hub = self.hosts.first().ok_or("no hosts")?.ns.name();
        ip(hub, "link add br0 type bridge".into())?;
        ip(hub, format!("addr add {prefix}.1/24 dev br0"))?;
        ip(hub, "link set br0 up".into())?;
        for (i, h) in self.hosts.iter().enumerate().skip(1) {
            ip(hub, format!("link add p{i} type veth peer name eth0 netns {}", h.ns.name()))?;
            ip(hub, format!("link set p{i} master br0 up"))?;
            ip(h.ns.name(), format!("addr add {prefix}.{}/24 dev eth0", i + 1))?;
            ip(h.ns.name(), "link set eth0 up".into())?;
        }
        Ok(())
    }
}

impl SshdHost {
    /// The processes in its namespace other than its sshd's listener: connections (sshd
    /// and the proxy that carries one in) and what their sessions run.
    pub fn processes(&self) -> Vec<(u32, String)> {
        let listener = self.sshd.id();
        self.ns.processes().into_iter().filter(|(p, _)| *p != listener).collect()
    }

    /// Waits (at most `within`) until nothing but sshd's listener runs there (`roles_only`:
    /// until no role runs, connections may stay); what is still running when it fails.
    pub fn wait_until_bare(&self, roles_only: bool, within: Duration) -> Result<(), String> {
        let left = || if roles_only { self.roles() } else { self.processes() };
        let deadline = Instant::now() + within;
        while !left().is_empty() {
            if Instant::now() >= deadline {
                return Err(format!("still running on {} after {within:?}: {:?}", self.alias, left()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Waits (at most `within`) until `count` roles named `comm` run there: a shell that
    /// said it was ready may not yet have become the program it execs.
    pub fn wait_for_roles(&self, comm: &str, count: usize, within: Duration) -> Result<(), String> {
        let running = || self.roles().iter().filter(|(_, c)| c == comm).count();
        let deadline = Instant::now() + within;
        while running() != count {
            if Instant::now() >= deadline {
                return Err(format!(
                    "{count} {comm} not running on {} after {within:?}: {:?}",
                    self.alias,
                    self.roles()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// What sessions run there: its processes other than sshd's (`sshd-session` from
    /// OpenSSH 9.8) and the proxies'.
    pub fn roles(&self) -> Vec<(u32, String)> {
        let ours = |comm: &str| comm == "sshd" || comm.starts_with("sshd-") || comm == "socat";
        self.processes().into_iter().filter(|(_, comm)| !ours(comm)).collect()
    }
}

impl Drop for SshdHost {
    fn drop(&mut self) {
        let _ = self.sshd.kill();
        let _ = self.sshd.wait();
        // Sessions outlive the listener; none may outlive the host. Every process in this
        // namespace is the listener's or its sessions': ours.
        self.ns.end_processes();
    }
}

impl Drop for SshHosts {
    fn drop(&mut self) {
        self.hosts.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

//! Named network namespaces as RAII guards.
//!
//! A [`Netns`] is created the way `ip netns add` does it, so `ip netns exec` works on
//! it while it lives: a new namespace (`unshare(CLONE_NEWNET)` on a helper thread) is
//! bind-mounted on `/run/netns/<name>`. Dropping the guard unmounts and removes that
//! file; the kernel then destroys the namespace, with every veth end and qdisc in it,
//! once no socket or thread uses it any more. Names carry the creating process id
//! (`nl-<pid>-<n>-<label>`), so parallel runs never collide and namespaces left by a
//! killed run can be recognised and removed ([`super::registry::clean_stale`]).
//!
//! Code runs inside a namespace on a thread that has `setns(2)` into it
//! ([`Netns::run`], [`Netns::spawn`]), or in a child process that enters it before
//! exec ([`Netns::command`]). Sockets keep the namespace they were created in, so a
//! socket made by `run` can be used from any thread afterwards.

use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::JoinHandle;

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CloneFlags, setns, unshare};

use super::TopologyError;
use super::ethtool::Ethtool;
use super::netlink::{NetlinkError, Rtnl};
use super::registry;

/// Where named namespaces live (iproute2's NETNS_RUN_DIR).
pub const NETNS_RUN_DIR: &str = "/run/netns";
/// Prefix of every namespace netlane creates.
pub const NAME_PREFIX: &str = "nl-";

/// Names of every namespace under [`NETNS_RUN_DIR`] (netlane's start with
/// [`NAME_PREFIX`]), sorted; none when the directory is missing.
pub fn netns_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(NETNS_RUN_DIR)
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.sort();
    names
}

static NEXT_ID: AtomicU32 = AtomicU32::new(0);

/// A named network namespace, removed on drop.
pub struct Netns {
    name: String,
    path: PathBuf,
    fd: OwnedFd,
    rtnl: Mutex<Rtnl>,
    ethtool: Mutex<Option<Ethtool>>,
}

impl std::fmt::Debug for Netns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Netns").field("name", &self.name).finish()
    }
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> TopologyError {
    let what = what.into();
    move |source| TopologyError::Io(crate::error::IoError::new(what, source))
}

fn errno_err(what: impl Into<String>) -> impl FnOnce(nix::errno::Errno) -> TopologyError {
    let what = what.into();
    move |e| {
        if e == nix::errno::Errno::EPERM {
            TopologyError::NotPrivileged(format!("{what}: {e}"))
        } else {
            TopologyError::Io(crate::error::IoError::new(what, io::Error::from(e)))
        }
    }
}

/// Makes `/run/netns` exist and be a shared mount point, as iproute2 does, so the
/// namespace mounts below it propagate into mount namespaces made later (`ip netns
/// exec` makes one per command).
fn prepare_run_dir() -> Result<(), TopologyError> {
    fs::create_dir_all(NETNS_RUN_DIR).map_err(io_err(format!("create {NETNS_RUN_DIR}")))?;
    let shared =
        || mount(None::<&str>, NETNS_RUN_DIR, None::<&str>, MsFlags::MS_SHARED | MsFlags::MS_REC, None::<&str>);
    match shared() {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EINVAL) => {
            // Not a mount point yet: bind it onto itself first.
            mount(Some(NETNS_RUN_DIR), NETNS_RUN_DIR, None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REC, None::<&str>)
                .map_err(errno_err(format!("bind-mount {NETNS_RUN_DIR}")))?;
            shared().map_err(errno_err(format!("make {NETNS_RUN_DIR} shared")))
        }
        Err(e) => Err(errno_err(format!("make {NETNS_RUN_DIR} shared"))(e)),
    }
}

fn sanitize(label: &str) -> String {
    let s: String =
        label.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '-' }).take(24).collect();
    if s.is_empty() { "ns".into() } else { s }
}

impl Netns {
    /// Creates a namespace named `nl-<pid>-<n>-<label>` with its loopback up.
    ///
    /// Needs CAP_SYS_ADMIN (namespaces, mounts); fails with
    /// [`TopologyError::NotPrivileged`] without it.
    pub fn create(label: &str) -> Result<Self, TopologyError> {
        let name = format!(
            "{NAME_PREFIX}{}-{}-{}",
            std::process::id(),
            NEXT_ID.fetch_add(1, Ordering::Relaxed),
            sanitize(label)
        );
        Self::create_named(&name)
    }

    /// Creates a namespace with exactly this name.
    pub fn create_named(name: &str) -> Result<Self, TopologyError> {
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return Err(TopologyError::Invalid(format!("bad namespace name {name:?}")));
        }
        prepare_run_dir()?;
        let path = Path::new(NETNS_RUN_DIR).join(name);
        // O_EXCL: an existing namespace of that name is an error, never reused.
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(TopologyError::NameTaken(name.to_string()));
            }
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                return Err(TopologyError::NotPrivileged(format!("create {}: {e}", path.display())));
            }
            Err(e) => return Err(io_err(format!("create {}", path.display()))(e)),
        }
        registry::register(&path);
        let made = Self::unshare_and_bind(&path)
            .and_then(|()| File::open(&path).map(OwnedFd::from).map_err(io_err(format!("open {}", path.display()))));
        let fd = match made {
            Ok(fd) => fd,
            Err(e) => {
                let _ = umount2(&path, MntFlags::MNT_DETACH);
                let _ = fs::remove_file(&path);
                registry::unregister(&path);
                return Err(e);
            }
        };
        // From here on, Drop cleans up. The netlink socket must be created inside.
        let rtnl = run_in(fd.as_fd(), Rtnl::open)?.map_err(io_err(format!("open rtnetlink in {name}")))?;
        let ns = Self { name: name.to_string(), path, fd, rtnl: Mutex::new(rtnl), ethtool: Mutex::new(None) };
        ns.with_rtnl(|r| {
            let lo = r.link_index("lo")?;
            r.set_up(lo)
        })?;
        tracing::debug!(name, "created network namespace");
        Ok(ns)
    }

    fn unshare_and_bind(path: &Path) -> Result<(), TopologyError> {
        let target = path.to_path_buf();
        std::thread::spawn(move || -> Result<(), TopologyError> {
            unshare(CloneFlags::CLONE_NEWNET).map_err(errno_err("unshare a new network namespace"))?;
            mount(Some("/proc/thread-self/ns/net"), &target, None::<&str>, MsFlags::MS_BIND, None::<&str>)
                .map_err(errno_err(format!("bind the namespace to {}", target.display())))
        })
        .join()
        .map_err(|_| TopologyError::Invalid("namespace helper thread panicked".into()))?
    }

    /// The processes running inside it (PID and command name), this one excepted.
    pub fn processes(&self) -> Vec<(u32, String)> {
        registry::processes_in(&self.path)
    }

    /// Ends every process inside it (SIGTERM, SIGKILL a second later); returns them.
    pub fn end_processes(&self) -> Vec<(u32, String)> {
        registry::end_processes_in(&self.path)
    }

    /// The namespace's name (usable with `ip netns exec`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `f` on a thread inside the namespace and returns its result.
    pub fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> Result<R, TopologyError> {
        run_in(self.fd.as_fd(), f)
    }

    /// Starts a named thread inside the namespace (for long-running senders and
    /// receivers). Fails if the thread cannot enter the namespace; `f` then never runs.
    pub fn spawn<R: Send + 'static>(
        &self,
        thread_name: &str,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> Result<NsThread<R>, TopologyError> {
        let fd = self.fd.try_clone().map_err(io_err("duplicate namespace fd"))?;
        let (ok_tx, ok_rx) = std::sync::mpsc::sync_channel::<Result<(), nix::errno::Errno>>(1);
        let handle = std::thread::Builder::new()
            .name(thread_name.to_string())
            .spawn(move || {
                let entered = setns(&fd, CloneFlags::CLONE_NEWNET);
                drop(fd);
                let ok = entered.is_ok();
                let _ = ok_tx.send(entered);
                ok.then(f)
            })
            .map_err(io_err("spawn thread"))?;
        match ok_rx.recv() {
            Ok(Ok(())) => Ok(NsThread(handle)),
            Ok(Err(e)) => {
                let _ = handle.join();
                Err(errno_err(format!("enter namespace {}", self.name))(e))
            }
            Err(_) => Err(TopologyError::Invalid("namespace thread exited early".into())),
        }
    }

    /// Moves the calling thread into the namespace, for good (other threads stay where
    /// they are). For code that must run its whole life inside, e.g. a balancer whose
    /// device-bound program is bound to an interface by name at load time.
    pub fn enter_on_this_thread(&self) -> Result<(), TopologyError> {
        setns(&self.fd, CloneFlags::CLONE_NEWNET).map_err(errno_err(format!("enter namespace {}", self.name)))
    }

    /// A command whose process runs inside the namespace.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new(program);
        netlane_sys::process::enter_netns_before_exec(&mut cmd, self.fd.as_raw_fd());
        cmd
    }

    /// Runs `f` with the namespace's rtnetlink socket.
    pub fn with_rtnl<R>(&self, f: impl FnOnce(&mut Rtnl) -> Result<R, NetlinkError>) -> Result<R, TopologyError> {
        let mut guard = self.rtnl.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard).map_err(TopologyError::from)
    }

    /// Runs `f` with an ethtool-netlink socket in the namespace (opened on first use).
    pub fn with_ethtool<R>(&self, f: impl FnOnce(&mut Ethtool) -> Result<R, NetlinkError>) -> Result<R, TopologyError> {
        let mut guard = self.ethtool.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            *guard = Some(self.run(Ethtool::open)??);
        }
        let e = guard.as_mut().ok_or_else(|| TopologyError::Invalid("ethtool socket missing".into()))?;
        f(e).map_err(TopologyError::from)
    }

    /// Writes `value` to `/sys/<rel>` as seen from inside the namespace (e.g.
    /// `class/net/rx0/threaded`).
    ///
    /// sysfs shows the network devices of the namespace that mounted it, so this runs
    /// on a thread that enters the namespace, takes a private mount namespace and
    /// mounts its own sysfs there, as `ip netns exec` does. (The threaded-NAPI switch
    /// has no netlink interface on every kernel this supports; sysfs is the one that
    /// works everywhere.)
    pub fn write_sysfs(&self, rel: &str, value: &str) -> Result<(), TopologyError> {
        let rel = rel.trim_start_matches('/').to_string();
        let shown = rel.clone();
        let value = value.to_string();
        self.with_private_sysfs(move || {
            OpenOptions::new().write(true).open(Path::new("/sys").join(&rel))?.write_all(value.as_bytes())
        })
        .map_err(|e| match e {
            TopologyError::Io(e) => TopologyError::Io(e.renamed(format!("write /sys/{shown} in {}", self.name))),
            other => other,
        })
    }

    /// Reads `/sys/<rel>` as seen from inside the namespace (trimmed).
    pub fn read_sysfs(&self, rel: &str) -> Result<String, TopologyError> {
        let rel = rel.trim_start_matches('/').to_string();
        let shown = rel.clone();
        self.with_private_sysfs(move || {
            let mut s = String::new();
            File::open(Path::new("/sys").join(&rel))?.read_to_string(&mut s)?;
            Ok(s.trim().to_string())
        })
        .map_err(|e| match e {
            TopologyError::Io(e) => TopologyError::Io(e.renamed(format!("read /sys/{shown} in {}", self.name))),
            other => other,
        })
    }

    fn with_private_sysfs<R: Send>(&self, f: impl FnOnce() -> io::Result<R> + Send) -> Result<R, TopologyError> {
        let name = self.name.clone();
        self.run(move || -> Result<R, TopologyError> {
            mount_own_sysfs(&name)?;
            f().map_err(io_err("sysfs access"))
        })?
    }

    /// Reads a file under `/proc/net/` of the namespace (e.g. `snmp`).
    pub fn read_proc_net(&self, file: &str) -> Result<String, TopologyError> {
        let file = file.to_string();
        self.run(move || fs::read_to_string(Path::new("/proc/thread-self/net").join(&file)))?
            .map_err(io_err(format!("read /proc/net in {}", self.name)))
    }

    /// The namespace file descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = umount2(&self.path, MntFlags::MNT_DETACH) {
            tracing::warn!(name = %self.name, error = %e, "unmounting network namespace failed");
        }
        if let Err(e) = fs::remove_file(&self.path) {
            tracing::warn!(name = %self.name, error = %e, "removing network namespace file failed");
        }
        registry::unregister(&self.path);
        tracing::debug!(name = %self.name, "removed network namespace");
    }
}

/// A thread running inside a namespace (see [`Netns::spawn`]).
#[derive(Debug)]
pub struct NsThread<R>(JoinHandle<Option<R>>);

impl<R> NsThread<R> {
    /// Waits for the thread and returns its result; `Err` carries a panic payload.
    pub fn join(self) -> std::thread::Result<R> {
        // `spawn` only returns a handle once the thread entered the namespace, and
        // from then on the thread always runs `f`.
        self.0.join().map(|r| r.expect("thread entered the namespace, so it ran its closure"))
    }

    /// Whether the thread has finished.
    pub fn is_finished(&self) -> bool {
        self.0.is_finished()
    }
}

/// The network namespace the calling thread is in, held open (not owned: nothing is
/// removed on drop), so that work started later from any thread can run inside it:
/// a server started in a namespace that opens sockets or threads afterwards.
#[derive(Debug)]
pub struct NetnsHandle(File);

impl NetnsHandle {
    /// The calling thread's namespace.
    pub fn current() -> Result<NetnsHandle, TopologyError> {
        let f = File::open("/proc/thread-self/ns/net").map_err(io_err("open /proc/thread-self/ns/net"))?;
        Ok(NetnsHandle(f))
    }

    /// Runs `f` on a thread inside the namespace and returns its result; threads `f`
    /// starts are inside it too.
    pub fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> Result<R, TopologyError> {
        run_in(self.0.as_fd(), f)
    }

    /// Runs `f` on a thread inside the namespace whose `/sys` shows the namespace's own
    /// network devices (a private mount namespace with its own sysfs, as `ip netns
    /// exec` gives): sysfs shows the devices of the namespace that mounted it.
    pub fn with_sysfs<R: Send>(&self, f: impl FnOnce() -> R + Send) -> Result<R, TopologyError> {
        self.run(move || -> Result<R, TopologyError> {
            mount_own_sysfs("this namespace")?;
            Ok(f())
        })?
    }
}

/// On the calling thread: a private mount namespace with a sysfs of the thread's
/// network namespace on /sys.
pub(crate) fn mount_own_sysfs(name: &str) -> Result<(), TopologyError> {
    unshare(CloneFlags::CLONE_NEWNS).map_err(errno_err("unshare a private mount namespace"))?;
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_SLAVE | MsFlags::MS_REC, None::<&str>)
        .map_err(errno_err("make / a slave mount"))?;
    umount2("/sys", MntFlags::MNT_DETACH).map_err(errno_err("detach /sys"))?;
    mount(Some("sysfs"), "/sys", Some("sysfs"), MsFlags::empty(), None::<&str>)
        .map_err(errno_err(format!("mount sysfs for {name}")))
}

/// Runs `f` on a scoped thread that has entered the namespace `fd`.
/// Runs `f` on a thread inside the existing named namespace `name` (as `ip netns`
/// names them, under [`NETNS_RUN_DIR`]) and returns its result. The namespace is not
/// owned: nothing is removed afterwards.
pub fn run_in_named<R: Send>(name: &str, f: impl FnOnce() -> R + Send) -> Result<R, TopologyError> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(TopologyError::Invalid(format!("bad namespace name {name:?}")));
    }
    let path = Path::new(NETNS_RUN_DIR).join(name);
    let file = File::open(&path).map_err(io_err(format!("open network namespace {}", path.display())))?;
    run_in(file.as_fd(), f)
}

fn run_in<R: Send>(fd: BorrowedFd<'_>, f: impl FnOnce() -> R + Send) -> Result<R, TopologyError> {
    std::thread::scope(|s| {
        s.spawn(move || -> Result<R, TopologyError> {
            setns(fd, CloneFlags::CLONE_NEWNET).map_err(errno_err("enter network namespace"))?;
            Ok(f())
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

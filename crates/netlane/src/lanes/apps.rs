//! Per-application priority and egress shaping.
//!
//! The talk gives each application a queue group with mqprio's channel mode and steers
//! its traffic there with flower. [`Shaper`] uses mqprio's channel mode when the kernel
//! has mqprio, the device's driver offloads it and the plan fits (at most 15
//! applications, each with its own socket priority, and a transmit queue per class):
//! it asks the kernel and keeps the reason when the answer is no. Veth offloads
//! nothing and the lab's kernel has no mqprio, so there, and beyond 16 classes, the
//! software stand-in built from what stock kernels have is used:
//!
//! - [`AppCgroup`]: a cgroup (v2) per application with a socket program attached
//!   (`bpf/lanes/app_sock.bpf.c`): every IPv4/IPv6 socket any process of the
//!   application creates, and every TCP connection its listeners accept (a sock_ops
//!   program: accepted sockets do not keep the listener's priority), gets its priority
//!   (`SO_PRIORITY`) and mark (`SO_MARK`), with no change to the application;
//! - [`Shaper`]: an htb qdisc on the egress interface with a class per application
//!   (guaranteed and highest rate, priority for spare bandwidth) under a root class at
//!   the link's rate, and a TCX egress program (`bpf/lanes/app_class.bpf.c`) that puts
//!   each packet in its application's class by its mark: a hash map, so thousands of
//!   applications, not 16;
//! - [`plan`]: the sans-IO part: validates the applications against the link and lays
//!   out the classes.
//!
//! Everything is RAII: dropping an [`AppCgroup`] detaches its program and removes the
//! cgroup (once its processes are gone); dropping a [`Shaper`] removes the qdisc and
//! detaches the classifier.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::installed::{self, Change, Record};
use netlane_sys::bpf::{APP_CLASS_MAX, AppClassifier, AppSockPolicy, CgroupLink, TcxLink};

use crate::topology::{
    HTB_MAJOR, HtbClass, MQPRIO_MAJOR, MQPRIO_MAX_TC, MQPRIO_TC_MINOR, MqprioChannel, NetlinkError, QdiscStats, Rtnl,
};

/// Highest socket priority an application may get (`TC_PRIO_MAX`: mqprio maps 0..=15
/// to traffic classes).
pub const PRIORITY_MAX: u32 = 15;

/// Lowest htb priority (spare bandwidth goes to 0 first).
pub const HTB_PRIO_MAX: u32 = 7;

/// The htb class of traffic that belongs to no application.
pub const DEFAULT_MINOR: u16 = 2;

/// The htb class at the link's rate that every other class borrows from.
pub const ROOT_MINOR: u16 = 1;

/// The first application's class; the others follow.
pub const FIRST_APP_MINOR: u16 = 0x10;

/// Bad application policy, or a kernel facility that refused.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The policy is not valid.
    #[error("application policy: {0}")]
    Invalid(String),
    /// A system call, file or BPF operation failed.
    #[error(transparent)]
    Io(#[from] crate::error::IoError),
    /// Netlink (qdisc, classes) refused.
    #[error(transparent)]
    Topology(#[from] crate::topology::TopologyError),
    /// The backend asked for cannot be used on this kernel, device or policy.
    #[error("{0}")]
    Unsupported(String),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> AppError {
    let what = what.into();
    move |source| AppError::Io(crate::error::IoError::new(what, source))
}

/// One application's policy.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AppSpec {
    /// Its name (letters, digits, `-`, `_`, `.`; names its cgroup).
    pub name: String,
    /// Socket priority for every socket it creates (0..=15).
    pub priority: u32,
    /// Socket mark for every socket it creates (not 0; unique per application): what
    /// the egress classifier keys on.
    pub mark: u32,
    /// Guaranteed egress rate, bytes per second.
    pub min_rate: u64,
    /// Highest egress rate, bytes per second (borrowing what others leave).
    pub max_rate: u64,
    /// Its turn for spare bandwidth (0..=7, lower first).
    pub htb_prio: u32,
}

impl AppSpec {
    /// Checks the fields that do not depend on other applications or the link.
    pub fn validate(&self) -> Result<(), AppError> {
        let bad = |m: String| Err(AppError::Invalid(format!("application {:?}: {m}", self.name)));
        if self.name.is_empty()
            || self.name.len() > 64
            || !self.name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            || self.name.starts_with('.')
        {
            return bad("a name is 1 to 64 letters, digits, '-', '_' or '.' (not first)".into());
        }
        if self.priority > PRIORITY_MAX {
            return bad(format!("priority {} is above {PRIORITY_MAX}", self.priority));
        }
        if self.mark == 0 {
            return bad("mark 0 means unmarked; pick another".into());
        }
        if self.min_rate == 0 || self.min_rate > self.max_rate {
            return bad(format!(
                "the guaranteed rate ({} B/s) must be positive and at most the highest ({} B/s)",
                self.min_rate, self.max_rate
            ));
        }
        if self.htb_prio > HTB_PRIO_MAX {
            return bad(format!("htb priority {} is above {HTB_PRIO_MAX}", self.htb_prio));
        }
        Ok(())
    }
}

/// The classes of a link shared by applications (sans-IO).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapingPlan {
    /// The link's rate, bytes per second.
    pub link_rate: u64,
    /// The htb classes, parents first.
    pub classes: Vec<HtbClass>,
    /// (application name, mark, class id major << 16 | minor).
    pub apps: Vec<(String, u32, u32)>,
    /// The applications, as given.
    pub specs: Vec<AppSpec>,
}

impl ShapingPlan {
    /// The same classes as mqprio traffic classes in channel mode on a device with
    /// `tx_queues` transmit queues: class 0 for every socket priority no application
    /// has (with the default class's rates), then one class per application, found by
    /// its socket priority. The device's queues are split among the classes (the
    /// remainder to class 0). Says why not when mqprio cannot express the plan.
    pub fn mqprio_layout(&self, tx_queues: u32) -> Result<MqprioChannel, String> {
        let classes = self.specs.len() + 1;
        if classes > MQPRIO_MAX_TC {
            return Err(format!(
                "{} applications need {classes} traffic classes; mqprio has at most {MQPRIO_MAX_TC}",
                self.specs.len()
            ));
        }
        let mut prio_tc_map = [0u8; MQPRIO_MAX_TC];
        for (i, a) in self.specs.iter().enumerate() {
            if a.priority == 0 {
                return Err(format!(
                    "mqprio finds an application's class by socket priority, and application {:?} has \
                     priority 0, every other socket's",
                    a.name
                ));
            }
            if let Some(b) = self.specs[..i].iter().find(|b| b.priority == a.priority) {
                return Err(format!(
                    "mqprio finds an application's class by socket priority, and applications {:?} and {:?} \
                     share priority {}",
                    b.name, a.name, a.priority
                ));
            }
            // Fits: priority <= PRIORITY_MAX (validated) and i + 1 < MQPRIO_MAX_TC.
            prio_tc_map[a.priority as usize] = (i + 1) as u8;
        }
        let n = classes as u32;
        if tx_queues < n {
            return Err(format!(
                "the device has {tx_queues} transmit queue{}; mqprio needs one per traffic class ({n})",
                if tx_queues == 1 { "" } else { "s" }
            ));
        }
        let (per, rest) = (tx_queues / n, tx_queues % n);
        let mut queues = Vec::with_capacity(classes);
        let mut next = 0u32;
        for tc in 0..n {
            let count = per + if tc == 0 { rest } else { 0 };
            // Fits: the kernel has fewer than 0xffe0 transmit queues per device.
            queues.push((next.min(u32::from(u16::MAX)) as u16, count.min(u32::from(u16::MAX)) as u16));
            next += count;
        }
        let default = self.classes.iter().find(|c| c.minor == DEFAULT_MINOR).map_or(1, |c| c.rate);
        let mut min_rate = vec![default];
        let mut max_rate = vec![self.link_rate];
        for a in &self.specs {
            min_rate.push(a.min_rate);
            max_rate.push(a.max_rate);
        }
        Ok(MqprioChannel { prio_tc_map, queues, min_rate, max_rate })
    }
}

/// Lays out the classes for `apps` on a link of `link_rate` B/s: a root class at the
/// link's rate; per application a class with its guaranteed and highest rate; a default
/// class for everything else with what the guarantees leave (at least 1% of the link).
pub fn plan(link_rate: u64, apps: &[AppSpec]) -> Result<ShapingPlan, AppError> {
    if link_rate == 0 {
        return Err(AppError::Invalid("the link rate must be positive".into()));
    }
    if apps.is_empty() {
        return Err(AppError::Invalid("no applications to shape".into()));
    }
    let most = APP_CLASS_MAX.min(usize::from(u16::MAX - FIRST_APP_MINOR));
    if apps.len() > most {
        return Err(AppError::Invalid(format!("{} applications; at most {most}", apps.len())));
    }
    let mut guaranteed: u64 = 0;
    for (i, a) in apps.iter().enumerate() {
        a.validate()?;
        if let Some(b) = apps[..i].iter().find(|b| b.name == a.name || b.mark == a.mark) {
            return Err(AppError::Invalid(format!(
                "applications {:?} and {:?} share a name or a mark ({:#x})",
                b.name, a.name, a.mark
            )));
        }
        if a.max_rate > link_rate {
            return Err(AppError::Invalid(format!(
                "application {:?}: highest rate {} B/s is above the link's {link_rate} B/s",
                a.name, a.max_rate
            )));
        }
        guaranteed = guaranteed.saturating_add(a.min_rate);
    }
    if guaranteed > link_rate {
        return Err(AppError::Invalid(format!(
            "the guaranteed rates add up to {guaranteed} B/s, more than the link's {link_rate} B/s"
        )));
    }
    let mut classes = vec![
        HtbClass { minor: ROOT_MINOR, parent: 0, rate: link_rate, ceil: link_rate, prio: 0 },
        HtbClass {
            minor: DEFAULT_MINOR,
            parent: ROOT_MINOR,
            rate: (link_rate - guaranteed).max(link_rate / 100).max(1),
            ceil: link_rate,
            prio: HTB_PRIO_MAX,
        },
    ];
    let mut out = Vec::with_capacity(apps.len());
    for (i, a) in apps.iter().enumerate() {
        // Fits: apps.len() <= u16::MAX - FIRST_APP_MINOR.
        let minor = FIRST_APP_MINOR + i as u16;
        classes.push(HtbClass { minor, parent: ROOT_MINOR, rate: a.min_rate, ceil: a.max_rate, prio: a.htb_prio });
        out.push((a.name.clone(), a.mark, (u32::from(HTB_MAJOR) << 16) | u32::from(minor)));
    }
    Ok(ShapingPlan { link_rate, classes, apps: out, specs: apps.to_vec() })
}

/// The mounted cgroup v2 hierarchy (from `/proc/self/mountinfo`).
pub fn cgroup2_root() -> Result<PathBuf, AppError> {
    let info = fs::read_to_string("/proc/self/mountinfo").map_err(io_err("read /proc/self/mountinfo"))?;
    cgroup2_in_mountinfo(&info).ok_or_else(|| {
        AppError::Invalid(
            "no cgroup v2 hierarchy is mounted (mount one: mount -t cgroup2 none /sys/fs/cgroup/unified)".into(),
        )
    })
}

/// The mount point of the first cgroup2 file system in a mountinfo text.
fn cgroup2_in_mountinfo(info: &str) -> Option<PathBuf> {
    info.lines().find_map(|line| {
        // "... mount-point options [optional fields] - fstype source super-options"
        let (left, right) = line.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        left.split_whitespace().nth(4).map(PathBuf::from)
    })
}

/// Prefix of the cgroups netlane creates (`netlane-<pid>-<application>`).
pub const CGROUP_PREFIX: &str = "netlane-";

/// An application's cgroup with its socket policy attached. Processes started with
/// [`AppCgroup::command`] (or moved with [`AppCgroup::add_pid`]) and everything they
/// start run in it; every IPv4/IPv6 socket they create and every TCP connection they
/// accept gets the application's priority and mark.
pub struct AppCgroup {
    spec: AppSpec,
    path: PathBuf,
    procs: File,
    policy: AppSockPolicy,
    link: Option<CgroupLink>,
    // Kept for `netlane clean` until the cgroup is removed.
    record: Option<Record>,
}

impl std::fmt::Debug for AppCgroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppCgroup").field("name", &self.spec.name).field("path", &self.path).finish_non_exhaustive()
    }
}

impl AppCgroup {
    /// Creates the cgroup `netlane-<pid>-<name>` under the cgroup v2 hierarchy and
    /// attaches the application's socket program (needs root); recorded for `netlane clean`
    /// until it is removed.
    pub fn create(spec: &AppSpec) -> Result<AppCgroup, AppError> {
        spec.validate()?;
        let root = cgroup2_root()?;
        let path = root.join(format!("{CGROUP_PREFIX}{}-{}", std::process::id(), spec.name));
        let record = installed::record(&Change::Cgroup { path: path.clone() })
            .map_err(io_err(format!("record the cgroup in {}", installed::DIR)))?;
        fs::create_dir(&path).map_err(io_err(format!("create cgroup {}", path.display())))?;
        let made = (|| {
            let dir = File::open(&path).map_err(io_err(format!("open cgroup {}", path.display())))?;
            let procs = OpenOptions::new()
                .write(true)
                .open(path.join("cgroup.procs"))
                .map_err(io_err(format!("open {}/cgroup.procs", path.display())))?;
            let policy = AppSockPolicy::load(spec.priority, spec.mark)
                .map_err(io_err(format!("load the socket program of application {:?}", spec.name)))?;
            let link = policy
                .attach(dir.as_fd())
                .map_err(io_err(format!("attach the socket program to cgroup {}", path.display())))?;
            Ok::<_, AppError>((procs, policy, link))
        })();
        match made {
            Ok((procs, policy, link)) => {
                Ok(AppCgroup { spec: spec.clone(), path, procs, policy, link: Some(link), record: Some(record) })
            }
            Err(e) => {
                let _ = fs::remove_dir(&path);
                Err(e)
            }
        }
    }

    /// The application.
    pub fn spec(&self) -> &AppSpec {
        &self.spec
    }

    /// The cgroup's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Makes `cmd`'s process start inside the cgroup (it moves itself in before it
    /// executes, so even its first socket gets the policy) and die with the thread that
    /// spawns it: a process left in the cgroup would keep it from being removed, and
    /// run on without the policy its socket program gave. Keep `self` alive until the
    /// command is spawned.
    pub fn command(&self, cmd: &mut Command) {
        netlane_sys::process::enter_cgroup_before_exec(cmd, self.procs.as_raw_fd());
        netlane_sys::process::kill_with_parent(cmd);
    }

    /// Moves a running process (all its threads) into the cgroup; sockets it already
    /// has keep their priority and mark.
    pub fn add_pid(&self, pid: u32) -> Result<(), AppError> {
        fs::write(self.path.join("cgroup.procs"), pid.to_string())
            .map_err(io_err(format!("move process {pid} into {}", self.path.display())))
    }

    /// Sockets given the policy so far: created by the application's processes plus
    /// TCP connections its listeners accepted.
    pub fn sockets(&self) -> Result<u64, AppError> {
        let (created, accepted) = self.policy.sockets().map_err(io_err("read the socket program's counter"))?;
        Ok(created + accepted)
    }
}

impl Drop for AppCgroup {
    fn drop(&mut self) {
        drop(self.link.take());
        // A cgroup with processes cannot be removed; they may be exiting right now.
        if let Err(e) = installed::remove_cgroup(&self.path) {
            tracing::warn!(cgroup = %self.path.display(), error = %e, "could not remove the cgroup (netlane clean will)");
            if let Some(r) = self.record.take() {
                r.keep();
            }
        }
    }
}

/// One application's class and what it sent.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ClassReport {
    /// The application, or "(other)" for the default class.
    pub app: String,
    /// Class id "1:minor".
    pub class: String,
    /// Guaranteed and highest rate, B/s.
    pub rate: u64,
    /// Highest rate, B/s.
    pub ceil: u64,
    /// Counters.
    pub stats: QdiscStats,
}

/// How a [`Shaper`] enforces the classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum ShapingBackend {
    /// htb classes in software, fed by the TCX classifier (by socket mark).
    Htb,
    /// mqprio traffic classes in channel mode, shaped by the device (by socket
    /// priority): the talk's queue groups.
    MqprioChannel,
}

impl std::fmt::Display for ShapingBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ShapingBackend::Htb => "htb",
            ShapingBackend::MqprioChannel => "mqprio channel mode",
        })
    }
}

/// Which backend a [`Shaper`] may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// mqprio channel mode when the kernel, the device and the plan allow it (detected
    /// by asking the kernel), htb otherwise.
    #[default]
    Auto,
    /// htb only.
    Htb,
    /// mqprio channel mode only; an error says why when it cannot be had.
    Mqprio,
}

/// What enforces the classes, and the state it needs.
enum Installed {
    Htb { classifier: AppClassifier, tcx: Option<TcxLink> },
    Mqprio { layout: MqprioChannel },
}

/// The egress side: a class per application on one interface, either htb with the
/// classifier that puts packets in classes by mark, or mqprio's channel mode offloaded
/// to the device (classes by socket priority). Installed in the calling thread's
/// network namespace; removed on drop.
pub struct Shaper {
    rtnl: Rtnl,
    ifindex: u32,
    plan: ShapingPlan,
    installed: Installed,
    why_not_mqprio: Option<String>,
    // Kept for `netlane clean` until the qdisc is removed.
    record: Option<Record>,
}

impl std::fmt::Debug for Shaper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shaper")
            .field("ifindex", &self.ifindex)
            .field("backend", &self.backend())
            .field("plan", &self.plan)
            .finish_non_exhaustive()
    }
}

impl Shaper {
    /// Replaces `ifindex`'s root qdisc (in the calling thread's namespace) with the
    /// plan's htb and attaches the classifier to its egress.
    pub fn install(ifindex: u32, plan: ShapingPlan) -> Result<Shaper, AppError> {
        Shaper::install_with(ifindex, plan, BackendChoice::Htb)
    }

    /// Installs the plan with the backend `choice` allows. With
    /// [`BackendChoice::Auto`], mqprio channel mode is tried first; when the plan does
    /// not fit it, the kernel has no mqprio or the device does not offload it, htb is
    /// installed and [`Shaper::why_not_mqprio`] says why.
    pub fn install_with(ifindex: u32, plan: ShapingPlan, choice: BackendChoice) -> Result<Shaper, AppError> {
        let mut rtnl = Rtnl::open().map_err(io_err("open rtnetlink"))?;
        let why_not = match choice {
            BackendChoice::Htb => Some("htb was asked for".to_string()),
            BackendChoice::Auto | BackendChoice::Mqprio => {
                let record = record_qdisc(&mut rtnl, ifindex, "mqprio")?;
                match Shaper::try_mqprio(&mut rtnl, ifindex, &plan) {
                    Ok(layout) => {
                        return Ok(Shaper {
                            rtnl,
                            ifindex,
                            plan,
                            installed: Installed::Mqprio { layout },
                            why_not_mqprio: None,
                            record: Some(record),
                        });
                    }
                    Err(why) if choice == BackendChoice::Mqprio => {
                        return Err(AppError::Unsupported(format!(
                            "mqprio channel mode on interface {ifindex}: {why}"
                        )));
                    }
                    Err(why) => Some(why),
                }
            }
        };
        Shaper::install_htb(rtnl, ifindex, plan, why_not)
    }

    /// Lays the plan out for mqprio and asks the kernel for it; says why not.
    fn try_mqprio(rtnl: &mut Rtnl, ifindex: u32, plan: &ShapingPlan) -> Result<MqprioChannel, String> {
        let tx_queues = rtnl.link_tx_queues(ifindex).map_err(|e| crate::error::chain(&e).to_string())?;
        let layout = plan.mqprio_layout(tx_queues)?;
        match rtnl.add_mqprio_channel(ifindex, &layout) {
            Ok(()) => Ok(layout),
            Err(e) => Err(mqprio_refusal(&e)),
        }
    }

    fn install_htb(
        mut rtnl: Rtnl,
        ifindex: u32,
        plan: ShapingPlan,
        why_not_mqprio: Option<String>,
    ) -> Result<Shaper, AppError> {
        let record = record_qdisc(&mut rtnl, ifindex, "htb")?;
        rtnl.add_htb_root(ifindex, DEFAULT_MINOR).map_err(crate::topology::TopologyError::from)?;
        // From here on, dropping the shaper removes the qdisc again.
        let classifier = match AppClassifier::load() {
            Ok(c) => c,
            Err(e) => {
                let _ = rtnl.del_root_qdisc(ifindex);
                return Err(io_err("load the egress classifier")(e));
            }
        };
        let mut s = Shaper {
            rtnl,
            ifindex,
            plan,
            installed: Installed::Htb { classifier, tcx: None },
            why_not_mqprio,
            record: Some(record),
        };
        for c in s.plan.classes.clone() {
            s.rtnl.set_htb_class(ifindex, c).map_err(crate::topology::TopologyError::from)?;
        }
        let Installed::Htb { classifier, tcx } = &mut s.installed else { unreachable!("installed as htb just above") };
        for (name, mark, classid) in &s.plan.apps {
            classifier.set(*mark, *classid).map_err(io_err(format!("add application {name:?} to the classifier")))?;
        }
        *tcx = Some(
            classifier
                .attach_egress(ifindex)
                .map_err(io_err(format!("attach the classifier to egress of interface {ifindex}")))?,
        );
        Ok(s)
    }

    /// The plan it installed.
    pub fn plan(&self) -> &ShapingPlan {
        &self.plan
    }

    /// What enforces the classes.
    pub fn backend(&self) -> ShapingBackend {
        match self.installed {
            Installed::Htb { .. } => ShapingBackend::Htb,
            Installed::Mqprio { .. } => ShapingBackend::MqprioChannel,
        }
    }

    /// Why mqprio channel mode is not used (None when it is).
    pub fn why_not_mqprio(&self) -> Option<&str> {
        self.why_not_mqprio.as_deref()
    }

    /// Puts packets in their applications' classes (`true`, as installed), or leaves
    /// every packet to the default class (`false`: one FIFO at the link's rate, the
    /// baseline without per-application classes). htb only: mqprio's classes follow
    /// socket priorities inside the device.
    pub fn classify(&self, on: bool) -> Result<(), AppError> {
        let Installed::Htb { classifier, .. } = &self.installed else {
            return Err(AppError::Unsupported(
                "mqprio puts packets in classes by socket priority; only htb classes can be turned off".into(),
            ));
        };
        for (name, mark, classid) in &self.plan.apps {
            let r = if on { classifier.set(*mark, *classid) } else { classifier.remove(*mark) };
            r.map_err(io_err(format!("update application {name:?} in the classifier")))?;
        }
        Ok(())
    }

    /// (packets put in an application's class, packets left to the default class), as
    /// the htb classifier counted them; None with mqprio (the device classifies).
    pub fn classified(&self) -> Result<Option<(u64, u64)>, AppError> {
        match &self.installed {
            Installed::Htb { classifier, .. } => {
                classifier.counts().map(Some).map_err(io_err("read the classifier's counters"))
            }
            Installed::Mqprio { .. } => Ok(None),
        }
    }

    /// Every application's class (and the default class) with its counters.
    pub fn classes(&mut self) -> Result<Vec<ClassReport>, AppError> {
        let stats = self.rtnl.class_stats(self.ifindex).map_err(crate::topology::TopologyError::from)?;
        let of = |major: u16, minor: u16| {
            stats.iter().find(|((maj, min), _)| *maj == major && *min == minor).map(|(_, s)| *s).unwrap_or_default()
        };
        let mut out = Vec::new();
        match &self.installed {
            Installed::Htb { .. } => {
                for c in self.plan.classes.iter().filter(|c| c.minor != ROOT_MINOR) {
                    let app = if c.minor == DEFAULT_MINOR {
                        "(other)".to_string()
                    } else {
                        let id = (u32::from(HTB_MAJOR) << 16) | u32::from(c.minor);
                        self.plan.apps.iter().find(|a| a.2 == id).map_or_else(String::new, |a| a.0.clone())
                    };
                    out.push(ClassReport {
                        app,
                        class: format!("{HTB_MAJOR}:{:x}", c.minor),
                        rate: c.rate,
                        ceil: c.ceil,
                        stats: of(HTB_MAJOR, c.minor),
                    });
                }
            }
            Installed::Mqprio { layout } => {
                for tc in 0..layout.queues.len() {
                    let app = match tc {
                        0 => "(other)".to_string(),
                        _ => self.plan.specs.get(tc - 1).map_or_else(String::new, |a| a.name.clone()),
                    };
                    // Fits: tc < MQPRIO_MAX_TC.
                    let minor = MQPRIO_TC_MINOR + tc as u16;
                    out.push(ClassReport {
                        app,
                        class: format!("{MQPRIO_MAJOR}:{minor:x}"),
                        rate: layout.min_rate[tc],
                        ceil: layout.max_rate[tc],
                        stats: of(MQPRIO_MAJOR, minor),
                    });
                }
            }
        }
        Ok(out)
    }
}

/// Why the kernel refused mqprio channel mode, in words.
fn mqprio_refusal(refused: &NetlinkError) -> String {
    let e = crate::error::chain(refused);
    match refused.errno() {
        Some(libc::ENOENT) => format!("this kernel has no mqprio qdisc ({e})"),
        Some(libc::EOPNOTSUPP) => format!("the device's driver does not offload mqprio channel mode ({e})"),
        Some(libc::EINVAL) => format!(
            "refused: a device without traffic-class offload (no ndo_setup_tc) or a layout its driver \
             cannot take answers this ({e})"
        ),
        _ => e.to_string(),
    }
}

/// Records the root qdisc about to be installed on `ifindex` (before it is, so a kill
/// in between leaves a record of nothing rather than a qdisc with no record).
fn record_qdisc(rtnl: &mut Rtnl, ifindex: u32, qdisc: &str) -> Result<Record, AppError> {
    let ifname = rtnl.link_name(ifindex).map_err(crate::topology::TopologyError::from)?;
    let place = installed::Place::here().map_err(io_err("identify the network namespace"))?;
    installed::record(&Change::RootQdisc { place, ifindex, ifname, qdisc: qdisc.into() })
        .map_err(io_err(format!("record the qdisc in {}", installed::DIR)))
}

impl Drop for Shaper {
    fn drop(&mut self) {
        if let Installed::Htb { tcx, .. } = &mut self.installed {
            drop(tcx.take());
        }
        if let Err(e) = self.rtnl.del_root_qdisc(self.ifindex) {
            tracing::warn!(ifindex = self.ifindex, backend = %self.backend(), error = %e, "could not remove the root qdisc");
            if let Some(r) = self.record.take() {
                r.keep();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(name: &str, mark: u32, min: u64, max: u64) -> AppSpec {
        AppSpec { name: name.into(), priority: 1, mark, min_rate: min, max_rate: max, htb_prio: 0 }
    }

    #[test]
    fn a_plan_has_a_root_a_default_and_a_class_per_application() {
        let p = plan(1000, &[app("cache", 1, 100, 1000), app("bulk", 2, 200, 500)]).unwrap();
        assert_eq!(p.classes.len(), 4);
        assert_eq!(p.classes[0], HtbClass { minor: ROOT_MINOR, parent: 0, rate: 1000, ceil: 1000, prio: 0 });
        assert_eq!(p.classes[1].minor, DEFAULT_MINOR);
        assert_eq!(p.classes[1].rate, 700, "the default class gets what the guarantees leave");
        assert_eq!((p.classes[3].rate, p.classes[3].ceil, p.classes[3].parent), (200, 500, ROOT_MINOR));
        assert_eq!(p.apps, vec![("cache".into(), 1, 0x10010), ("bulk".into(), 2, 0x10011)]);
    }

    #[test]
    fn mqprio_gets_a_class_per_priority_and_a_share_of_the_queues() {
        let mut a = app("cache", 1, 100, 1000);
        a.priority = 6;
        let mut b = app("bulk", 2, 200, 500);
        b.priority = 2;
        let m = plan(1000, &[a, b]).unwrap().mqprio_layout(8).unwrap();
        assert_eq!(m.queues, [(0, 4), (4, 2), (6, 2)], "class 0 takes the remainder");
        let mut want = [0u8; MQPRIO_MAX_TC];
        want[6] = 1;
        want[2] = 2;
        assert_eq!(m.prio_tc_map, want);
        assert_eq!((m.min_rate, m.max_rate), (vec![700, 100, 200], vec![1000, 1000, 500]));
        let many: Vec<AppSpec> = (1..=16)
            .map(|i| {
                let mut x = app(&format!("a{i}"), i, 1, 10);
                x.priority = i.min(PRIORITY_MAX);
                x
            })
            .collect();
        let e = plan(1000, &many).unwrap().mqprio_layout(64).unwrap_err();
        assert!(e.contains("16 applications need 17 traffic classes"), "{e}");
    }

    #[test]
    fn the_default_class_keeps_a_share_when_guarantees_take_the_link() {
        let p = plan(1000, &[app("a", 1, 1000, 1000)]).unwrap();
        assert_eq!(p.classes[1].rate, 10);
    }

    #[test]
    fn bad_plans_are_refused_with_the_reason() {
        let cases: Vec<(Vec<AppSpec>, u64, &str)> = vec![
            (vec![], 1000, "no applications"),
            (vec![app("a", 1, 10, 10)], 0, "link rate"),
            (vec![app("a", 0, 10, 10)], 1000, "mark 0"),
            (vec![app("a", 1, 10, 10), app("b", 1, 10, 10)], 1000, "share a name or a mark"),
            (vec![app("a", 1, 10, 10), app("a", 2, 10, 10)], 1000, "share a name or a mark"),
            (vec![app("a", 1, 20, 10)], 1000, "guaranteed rate"),
            (vec![app("a", 1, 0, 10)], 1000, "guaranteed rate"),
            (vec![app("a", 1, 10, 2000)], 1000, "above the link"),
            (vec![app("a", 1, 600, 1000), app("b", 2, 600, 1000)], 1000, "add up to"),
            (vec![app("../x", 1, 10, 10)], 1000, "a name is"),
            (vec![app("", 1, 10, 10)], 1000, "a name is"),
            (vec![AppSpec { priority: 16, ..app("a", 1, 10, 10) }], 1000, "priority 16"),
            (vec![AppSpec { htb_prio: 8, ..app("a", 1, 10, 10) }], 1000, "htb priority"),
        ];
        for (apps, link, want) in cases {
            let e = plan(link, &apps).unwrap_err().to_string();
            assert!(e.contains(want), "{e:?} should say {want:?}");
        }
    }

    #[test]
    fn many_applications_fit_beyond_mqprio_s_sixteen() {
        let apps: Vec<AppSpec> = (1..=100).map(|i| app(&format!("a{i}"), i, 1, 10)).collect();
        let p = plan(1000, &apps).unwrap();
        assert_eq!(p.apps.len(), 100);
        assert_eq!(p.apps[99].2, 0x10000 | u32::from(FIRST_APP_MINOR + 99));
    }

    #[test]
    fn the_cgroup2_mount_is_found_in_mountinfo() {
        let info = "25 30 0:22 / /sys rw,nosuid shared:7 - sysfs sysfs rw\n\
                    35 25 0:30 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate\n\
                    36 25 0:31 / /sys/fs/cgroup/cpu rw shared:11 - cgroup cgroup rw,cpu\n";
        assert_eq!(cgroup2_in_mountinfo(info), Some(PathBuf::from("/sys/fs/cgroup/unified")));
        assert_eq!(cgroup2_in_mountinfo("25 30 0:22 / /sys rw - sysfs sysfs rw\n"), None);
        assert_eq!(cgroup2_in_mountinfo("garbage\n\n - \n"), None);
    }
}

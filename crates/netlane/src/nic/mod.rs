//! A network device as the lab would use it ([`show`]: queues, NAPI instances with
//! their interrupts, threads and CPUs, channels, rings, coalescing, offloads, XDP
//! features, XPS), and its settings changed for as long as a guard lives: channels,
//! rings and coalescing over ethtool netlink ([`set_group`]), an interrupt's CPUs
//! ([`set_irq_cpus`]), the device's own files: threaded NAPI, XPS ([`set_file`]), and a
//! token-bucket bottleneck or a pacing qdisc as its root qdisc ([`set_bottleneck`],
//! [`set_pacing_qdisc`]). Each change is reported applied (with the value read back) or
//! refused (with the kernel's reason), recorded before it is made (so `netlane clean`
//! puts it back after a SIGKILL), and put back when its guard drops unless someone
//! changed it since. Everything here acts in the calling thread's network namespace.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::cpus::CpuList;
use crate::error::chain;
use crate::installed::irq_affinity_path;
use crate::topology::ethtool::{Ethtool, Group, Values};
use crate::topology::netdev::{Netdev, XdpFeatures};
use crate::topology::{Rtnl, TopologyError};

mod rss;
mod settings;

pub use self::rss::{Rss, RssParts, RssSetting, RssTable, key_words, parse_key, set_rss};
pub(crate) use self::settings::one_bit_mask;
pub use self::settings::{
    Bottleneck, FileSetting, Holding, Outcome, PacingQdisc, PutBack, Settings, Tried, hold_settings, rfs_flow_counts,
    rx_queues, set_bottleneck, set_file, set_group, set_irq_cpus, set_mq, set_pacing_qdisc, try_settings,
    tx_queue_packets, tx_queues, xps_cpus, xps_rxqs,
};

/// The offloads [`show`] reports (those a fast path depends on).
pub const SHOWN_FEATURES: [&str; 10] = [
    "rx-gro",
    "rx-gro-hw",
    "rx-gro-list",
    "rx-udp-gro-forwarding",
    "tx-tcp-segmentation",
    "tx-udp-segmentation",
    "rx-hashing",
    "rx-ntuple-filter",
    "hw-tc-offload",
    "rx-checksum",
];

/// A device as [`show`] found it. What could not be read says why instead.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct NicView {
    /// Its name.
    pub ifname: String,
    /// Its index.
    pub ifindex: u32,
    /// Its driver (`None`: a virtual device without one, like veth).
    pub driver: Option<String>,
    /// Receive queues.
    pub rx_queues: usize,
    /// Transmit queues.
    pub tx_queues: usize,
    /// Its NAPI instances.
    pub napis: Vec<NapiView>,
    /// Why its NAPI instances could not be listed (netdev netlink needs Linux 6.8+).
    pub napis_unavailable: Option<String>,
    /// Whether its NAPI runs in kernel threads (`/sys/class/net/DEV/threaded`).
    pub threaded_napi: Option<bool>,
    /// Channels, rings and coalescing: each group's settings, or why not.
    pub groups: BTreeMap<String, Readout<Values>>,
    /// The offloads that are on, of those fast paths depend on (GRO, segmentation, RX
    /// hashing, n-tuple filters, TC offload, RX checksums).
    pub features_on: Vec<String>,
    /// What its driver does for XDP, or why that is unknown.
    pub xdp: Readout<XdpFeatures>,
    /// Each transmit queue's XPS map (`xps_cpus`), where it has one.
    pub xps_cpus: Vec<(u32, String)>,
    /// Its root qdisc (`noqueue` when it has none) and that qdisc's counters.
    pub root_qdisc: Readout<RootQdisc>,
    /// Its RSS indirection table, hash key and function, or why not (none on veth).
    pub rss: Readout<Rss>,
}

/// A device's root qdisc.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct RootQdisc {
    /// Its kind (`tbf`, `mq`, `noqueue`).
    pub kind: String,
    /// Its counters.
    pub stats: crate::topology::QdiscStats,
}

/// What was read, or why it could not be.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct Readout<T> {
    /// The value.
    pub value: Option<T>,
    /// Why there is none (the kernel's reason).
    pub unavailable: Option<String>,
}

impl<T> Readout<T> {
    fn of<E: std::error::Error + 'static>(r: Result<T, E>) -> Readout<T> {
        match r {
            Ok(value) => Readout { value: Some(value), unavailable: None },
            Err(e) => Readout { value: None, unavailable: Some(reason(&e)) },
        }
    }
}

/// One NAPI instance: its interrupt and the CPUs it may run on, its thread and its CPUs.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct NapiView {
    /// The NAPI id.
    pub id: u32,
    /// Its interrupt (none on veth).
    pub irq: Option<u32>,
    /// That interrupt's CPUs (`/proc/irq/N/smp_affinity_list`).
    pub irq_cpus: Option<String>,
    /// Its kernel thread, when NAPI is threaded.
    pub thread: Option<u32>,
    /// That thread's CPUs.
    pub thread_cpus: Option<String>,
    /// Empty polls before its interrupt is re-enabled (netdev netlink, Linux 6.13+).
    pub defer_hard_irqs: Option<u32>,
    /// Its GRO flush timeout, ns (6.13+).
    pub gro_flush_timeout_ns: Option<u64>,
    /// How long its interrupt stays suspended while the application finds events, ns
    /// (6.13+).
    pub irq_suspend_timeout_ns: Option<u64>,
}

/// Reads everything [`show`] reports of `dev`.
pub fn show(dev: &str) -> Result<NicView, TopologyError> {
    let mut rtnl = Rtnl::open().map_err(|e| TopologyError::Io(crate::error::IoError::new("open rtnetlink", e)))?;
    let ifindex = rtnl.link_index(dev).map_err(TopologyError::from)?;
    let sys = format!("/sys/class/net/{dev}");
    // The queues the device has now (sysfs lists them whether it is up or not; netdev
    // netlink only while it is up).
    let (rx_queues, tx_queues) = (settings::rx_queues(dev).len(), settings::tx_queues(dev).len());
    // Each asked on its own: a kernel may have the one (dev-get, 6.3) and not the other
    // (napi-get, 6.8).
    let (napis, napis_unavailable) = match Netdev::open().and_then(|mut nd| nd.napis(ifindex)) {
        Ok(napis) => (
            napis
                .into_iter()
                .map(|n| NapiView {
                    id: n.id,
                    irq: n.irq,
                    irq_cpus: n.irq.and_then(|i| read_trim(&irq_affinity_path(i).to_string_lossy())),
                    thread: n.pid,
                    thread_cpus: n.pid.and_then(thread_cpus),
                    defer_hard_irqs: n.defer_hard_irqs,
                    gro_flush_timeout_ns: n.gro_flush_timeout_ns,
                    irq_suspend_timeout_ns: n.irq_suspend_timeout_ns,
                })
                .collect(),
            None,
        ),
        Err(e) => (Vec::new(), Some(reason(&e))),
    };
    let xdp = Readout::of(Netdev::open().and_then(|mut nd| nd.xdp_features(ifindex)));
    let root_qdisc = Readout::of(rtnl.root_qdisc(ifindex).map(|q| {
        let (kind, stats) = q.unwrap_or_else(|| ("noqueue".into(), Default::default()));
        RootQdisc { kind, stats }
    }));
    let mut ethtool = Ethtool::open().map_err(TopologyError::from)?;
    let groups = Group::ALL.iter().map(|g| (g.name().to_string(), Readout::of(ethtool.settings(dev, *g)))).collect();
    let features = ethtool.active_features(dev).map_err(TopologyError::from)?;
    Ok(NicView {
        ifname: dev.to_string(),
        ifindex,
        driver: std::fs::read_link(format!("{sys}/device/driver"))
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned())),
        rx_queues,
        tx_queues,
        napis,
        napis_unavailable,
        threaded_napi: read_trim(&format!("{sys}/threaded")).map(|t| t != "0"),
        groups,
        features_on: SHOWN_FEATURES
            .iter()
            .filter(|f| features.get(**f).copied().unwrap_or(false))
            .map(|f| f.to_string())
            .collect(),
        xdp,
        xps_cpus: (0..tx_queues as u32)
            .filter_map(|q| read_trim(&format!("{sys}/queues/tx-{q}/xps_cpus")).map(|m| (q, m)))
            .collect(),
        root_qdisc,
        rss: Readout::of(Rss::read(dev)),
    })
}

fn read_trim(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

fn thread_cpus(pid: u32) -> Option<String> {
    let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(pid as i32)).ok()?;
    let cpus = (0..nix::sched::CpuSet::count()).filter(|c| set.is_set(*c).unwrap_or(false)).collect();
    Some(CpuList::new(cpus).to_string())
}

/// An error as the reason a setting was refused: what the kernel said, once.
fn reason(e: &(dyn std::error::Error + 'static)) -> String {
    chain(e).to_string()
}

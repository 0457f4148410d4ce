//! The lab's own network: namespaces, veth pairs, addresses, device knobs and qdiscs.
//!
//! Everything is created over netlink (rtnetlink for links, addresses and qdiscs;
//! ethtool netlink for offload features) except the NAPI knobs, which live in sysfs
//! ([`Netns::write_sysfs`] explains why). Everything is owned by RAII guards: dropping
//! a [`TwoHosts`] (or a [`Netns`]) removes its namespaces, and with them their veth
//! ends and qdiscs, also when a test panics. For Ctrl-C, the CLI calls
//! [`registry::cleanup_all`] from its signal handler.
//!
//! # veth as a stand-in for a NIC
//! A veth pair has no hardware queues, no interrupts and no NAPI by default: a packet
//! sent on one end is processed by the receiving stack on the sender's CPU, right away.
//! The receive knobs in [`RxTuning`] make the receiving end behave more like a NIC:
//! GRO on (with `rx-udp-gro-forwarding`) gives veth a NAPI instance, and threaded NAPI
//! moves receive processing to a kernel thread, off the sender's CPU, where GRO can
//! batch (measured on this machine class: without threaded NAPI nothing coalesces).

pub mod ethtool;
mod genl;
pub mod netdev;
pub mod netlink;
mod netns;
pub mod nexthop;
pub mod registry;
mod segmentation;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::Serialize;

pub use netlink::{
    HTB_MAJOR, HtbClass, MQPRIO_MAJOR, MQPRIO_MAX_TC, MQPRIO_TC_MINOR, MqprioChannel, NetlinkError, QdiscInfo,
    QdiscStats, Rtnl,
};
pub(crate) use netns::mount_own_sysfs;
pub use netns::{NAME_PREFIX, NETNS_RUN_DIR, Netns, NetnsHandle, NsThread, netns_names, run_in_named};
pub use segmentation::{Segmentation, SegmentationGuard};

/// Why the topology could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// Not root / missing capabilities.
    #[error(
        "building the lab network needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN): {0}. Run as root, or measure over loopback (`path` loopback)"
    )]
    NotPrivileged(String),
    /// A namespace of that name exists already.
    #[error("network namespace {0} already exists (left over from a killed run? `netlane clean` removes stale ones)")]
    NameTaken(String),
    /// A netlink request failed.
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    /// The kernel lacks something the topology needs.
    #[error("kernel feature missing: {0}")]
    Unsupported(String),
    /// Bad arguments.
    #[error("{0}")]
    Invalid(String),
    /// A system call failed.
    #[error(transparent)]
    Io(#[from] crate::error::IoError),
}

/// Receive-side tuning of a veth end (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RxTuning {
    /// `rx-gro` (ethtool -K gro).
    pub gro: bool,
    /// `rx-udp-gro-forwarding`: GRO for UDP also when not forwarding; gives veth NAPI.
    pub udp_gro_forwarding: bool,
    /// `/sys/class/net/<dev>/threaded` = 1: NAPI in a kernel thread.
    pub threaded_napi: bool,
    /// `/sys/class/net/<dev>/gro_flush_timeout` in nanoseconds.
    pub gro_flush_timeout_ns: Option<u64>,
    /// `/sys/class/net/<dev>/napi_defer_hard_irqs`.
    pub napi_defer_hard_irqs: Option<u32>,
    /// CPU to run the threaded-NAPI kernel threads on (like a NIC's IRQ affinity).
    pub napi_cpu: Option<usize>,
}

impl RxTuning {
    /// The veth defaults: no NAPI; receive work runs on the sender's CPU.
    pub fn none() -> Self {
        Self::default()
    }

    /// NAPI with GRO in a kernel thread: the closest veth gets to a NIC.
    pub fn threaded_napi() -> Self {
        Self { gro: true, udp_gro_forwarding: true, threaded_napi: true, ..Self::default() }
    }

    /// Short description for reports ("threaded-napi+gro", "none", ...).
    pub fn label(&self) -> String {
        let mut parts = Vec::new();
        if self.threaded_napi {
            parts.push("threaded-napi".to_string());
        }
        if self.gro {
            parts.push("gro".to_string());
        }
        if self.udp_gro_forwarding {
            parts.push("udp-gro-fwd".to_string());
        }
        if let Some(t) = self.gro_flush_timeout_ns {
            parts.push(format!("gro-flush={t}ns"));
        }
        if let Some(n) = self.napi_defer_hard_irqs {
            parts.push(format!("defer-irqs={n}"));
        }
        if let (true, Some(cpu)) = (self.threaded_napi, self.napi_cpu) {
            parts.push(format!("napi-cpu={cpu}"));
        }
        if parts.is_empty() { "none".into() } else { parts.join("+") }
    }

    /// Applies the tuning to device `dev` (interface index `ifindex`) in `ns`, and
    /// checks it took effect.
    pub fn apply(&self, ns: &Netns, dev: &str, ifindex: u32) -> Result<(), TopologyError> {
        let mut features = Vec::new();
        if self.gro {
            features.push(("rx-gro", true));
        }
        if self.udp_gro_forwarding {
            features.push(("rx-udp-gro-forwarding", true));
        }
        if !features.is_empty() {
            ns.with_ethtool(|e| e.set_features(dev, &features))?;
        }
        let mut knobs: Vec<(&str, String)> = Vec::new();
        if self.threaded_napi {
            knobs.push(("threaded", "1".into()));
        }
        if let Some(t) = self.gro_flush_timeout_ns {
            knobs.push(("gro_flush_timeout", t.to_string()));
        }
        if let Some(n) = self.napi_defer_hard_irqs {
            knobs.push(("napi_defer_hard_irqs", n.to_string()));
        }
        for (knob, value) in knobs {
            let rel = format!("class/net/{dev}/{knob}");
            ns.write_sysfs(&rel, &value)?;
            let now = ns.read_sysfs(&rel)?;
            // `threaded` reads back as "1" or "enabled" depending on the kernel.
            let ok = now == value || (knob == "threaded" && now == "enabled");
            if !ok {
                return Err(TopologyError::Unsupported(format!("{dev}: {knob} reads {now:?} after writing {value:?}")));
            }
        }
        if let (true, Some(cpu)) = (self.threaded_napi, self.napi_cpu) {
            pin_napi_threads(ns, dev, ifindex, cpu)?;
        }
        Ok(())
    }

    /// Like [`RxTuning::threaded_napi`], with the NAPI threads on `cpu`.
    pub fn threaded_napi_on(cpu: usize) -> Self {
        Self { napi_cpu: Some(cpu), ..Self::threaded_napi() }
    }
}

/// Pins the threaded-NAPI kernel threads of `ifindex` to `cpu`.
fn pin_napi_threads(ns: &Netns, dev: &str, ifindex: u32, cpu: usize) -> Result<(), TopologyError> {
    let napis = ns.run(move || netdev::Netdev::open().and_then(|mut n| n.napis(ifindex)))??;
    let pids: Vec<u32> = napis.iter().filter_map(|n| n.pid).collect();
    if pids.is_empty() {
        return Err(TopologyError::Unsupported(format!("{dev} has no threaded NAPI kernel thread to pin")));
    }
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).map_err(|_| TopologyError::Invalid(format!("CPU {cpu} does not exist")))?;
    for pid in pids {
        nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(pid as i32), &set).map_err(|e| {
            TopologyError::Io(crate::error::IoError::new(
                format!("pin NAPI thread {pid} of {dev} to CPU {cpu}"),
                e.into(),
            ))
        })?;
    }
    Ok(())
}

/// Every TCP segmentation offload feature (the kernel's `NETIF_F_ALL_TSO`).
fn tso_features(on: bool) -> [(&'static str, bool); 4] {
    [
        ("tx-tcp-segmentation", on),
        ("tx-tcp6-segmentation", on),
        ("tx-tcp-ecn-segmentation", on),
        ("tx-tcp-mangleid-segmentation", on),
    ]
}

/// Pins the threaded-NAPI kernel thread serving each receive queue of interface
/// `ifindex` in `ns` to `cpus[queue % cpus.len()]`, like a NIC whose queue interrupts
/// are spread one per CPU. Returns (queue, NAPI id, CPU) for each queue.
pub fn pin_napi_by_queue(ns: &Netns, ifindex: u32, cpus: &[usize]) -> Result<Vec<(u32, u32, usize)>, TopologyError> {
    if cpus.is_empty() {
        return Err(TopologyError::Invalid("no CPU to pin NAPI threads to".into()));
    }
    let (queues, napis) = ns.run(move || -> Result<_, TopologyError> {
        let mut nd = netdev::Netdev::open()?;
        Ok((nd.queues(ifindex)?, nd.napis(ifindex)?))
    })??;
    let rx: Vec<&netdev::Queue> = queues.iter().filter(|q| q.kind == netdev::QueueKind::Rx).collect();
    // A driver that does not link queues to NAPI instances (veth) added one per queue,
    // in queue order: ids in order then (as `lanes::queues::discover` reads them).
    let mut ids: Vec<u32> = napis.iter().map(|n| n.id).collect();
    ids.sort_unstable();
    let by_order = rx.iter().all(|q| q.napi_id.is_none()) && ids.len() == rx.len();
    let mut out = Vec::new();
    for (k, q) in rx.iter().enumerate() {
        let Some(napi_id) = (if by_order { Some(ids[k]) } else { q.napi_id }) else { continue };
        let pid = napis.iter().find(|n| n.id == napi_id).and_then(|n| n.pid).ok_or_else(|| {
            TopologyError::Unsupported(format!("queue {} (NAPI {napi_id}) has no NAPI thread: is NAPI threaded?", q.id))
        })?;
        let cpu = cpus[q.id as usize % cpus.len()];
        let mut set = nix::sched::CpuSet::new();
        set.set(cpu).map_err(|_| TopologyError::Invalid(format!("CPU {cpu} does not exist")))?;
        nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(pid as i32), &set).map_err(|e| {
            TopologyError::Io(crate::error::IoError::new(
                format!("pin NAPI thread {pid} (queue {}) to CPU {cpu}", q.id),
                e.into(),
            ))
        })?;
        out.push((q.id, napi_id, cpu));
    }
    if out.is_empty() {
        return Err(TopologyError::Unsupported(format!("interface {ifindex} has no receive queue with NAPI")));
    }
    Ok(out)
}

/// A veth link between two namespaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LinkConfig {
    /// MTU of both ends.
    pub mtu: u32,
    /// TX and RX queues of each end.
    pub queues: u32,
    /// Receive tuning of the receiving ("rx") end.
    pub rx: RxTuning,
}

impl Default for LinkConfig {
    fn default() -> Self {
        Self { mtu: 1500, queues: 1, rx: RxTuning::threaded_napi() }
    }
}

/// Two hosts, "tx" and "rx", each in its own namespace, joined by a veth pair with
/// IPv4 (10.77.0.1/24, 10.77.0.2/24) and IPv6 (fd00:77::1/64, fd00:77::2/64)
/// addresses. Dropping it removes both namespaces.
#[derive(Debug)]
pub struct TwoHosts {
    /// The sending host.
    pub tx: Netns,
    /// The receiving host.
    pub rx: Netns,
    /// Interface name in `tx`.
    pub tx_if: String,
    /// Interface name in `rx`.
    pub rx_if: String,
    /// Interface index in `tx`.
    pub tx_index: u32,
    /// Interface index in `rx`.
    pub rx_index: u32,
    /// What was built.
    pub config: LinkConfig,
}

impl TwoHosts {
    /// IPv4 address of the tx host.
    pub const TX_V4: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
    /// IPv4 address of the rx host.
    pub const RX_V4: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
    /// IPv6 address of the tx host.
    pub const TX_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x77, 0, 0, 0, 0, 0, 1);
    /// IPv6 address of the rx host.
    pub const RX_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x77, 0, 0, 0, 0, 0, 2);
    /// The tx host's end of the link (each host is a namespace of its own).
    pub const TX_IF: &'static str = "tx0";
    /// The rx host's end of the link.
    pub const RX_IF: &'static str = "rx0";

    /// Builds the two namespaces and the link. `label` goes into the namespace names.
    pub fn create(label: &str, config: LinkConfig) -> Result<Self, TopologyError> {
        if !(68..=65535).contains(&config.mtu) {
            return Err(TopologyError::Invalid(format!("MTU {} is outside 68..=65535", config.mtu)));
        }
        if !(1..=64).contains(&config.queues) {
            return Err(TopologyError::Invalid(format!("queue count {} is outside 1..=64", config.queues)));
        }
        let tx = Netns::create(&format!("{label}-tx"))?;
        let rx = Netns::create(&format!("{label}-rx"))?;
        let (tx_if, rx_if) = (Self::TX_IF.to_string(), Self::RX_IF.to_string());
        let (tx_fd, rx_fd) = (std::os::fd::AsRawFd::as_raw_fd(&tx.fd()), std::os::fd::AsRawFd::as_raw_fd(&rx.fd()));
        // The request goes through the tx namespace's socket; both ends are placed
        // directly in their namespaces by fd.
        tx.with_rtnl(|r| r.add_veth(&tx_if, tx_fd, &rx_if, rx_fd, config.mtu, config.queues))?;
        let tx_index = tx.with_rtnl(|r| {
            let i = r.link_index(&tx_if)?;
            r.add_address(i, IpAddr::V4(Self::TX_V4), 24)?;
            r.add_address(i, IpAddr::V6(Self::TX_V6), 64)?;
            r.set_up(i)?;
            Ok(i)
        })?;
        let rx_index = rx.with_rtnl(|r| {
            let i = r.link_index(&rx_if)?;
            r.add_address(i, IpAddr::V4(Self::RX_V4), 24)?;
            r.add_address(i, IpAddr::V6(Self::RX_V6), 64)?;
            r.set_up(i)?;
            Ok(i)
        })?;
        config.rx.apply(&rx, &rx_if, rx_index)?;
        // Static neighbours: no ARP or neighbour discovery during measurements, and no
        // first datagrams lost while the first solicitation is unanswered.
        let tx_mac = tx.with_rtnl(|r| r.link_mac(tx_index))?;
        let rx_mac = rx.with_rtnl(|r| r.link_mac(rx_index))?;
        tx.with_rtnl(|r| {
            r.add_neighbour(tx_index, Self::RX_V4.into(), &rx_mac)?;
            r.add_neighbour(tx_index, Self::RX_V6.into(), &rx_mac)
        })?;
        rx.with_rtnl(|r| {
            r.add_neighbour(rx_index, Self::TX_V4.into(), &tx_mac)?;
            r.add_neighbour(rx_index, Self::TX_V6.into(), &tx_mac)
        })?;
        let hosts = Self { tx, rx, tx_if, rx_if, tx_index, rx_index, config };
        hosts.wait_until_ready()?;
        Ok(hosts)
    }

    /// Sends probe datagrams tx -> rx over IPv4 and IPv6 until one arrives on each, so a
    /// returned topology carries traffic at once. Fails after 5 seconds.
    fn wait_until_ready(&self) -> Result<(), TopologyError> {
        for ipv6 in [false, true] {
            let bind = std::net::SocketAddr::new(self.rx_addr(ipv6), 0);
            let rx = self.rx.run(move || -> std::io::Result<std::net::UdpSocket> {
                let s = std::net::UdpSocket::bind(bind)?;
                s.set_read_timeout(Some(std::time::Duration::from_millis(10)))?;
                Ok(s)
            })?;
            let rx =
                rx.map_err(|source| TopologyError::Io(crate::error::IoError::new("bind readiness probe", source)))?;
            let dst = rx
                .local_addr()
                .map_err(|source| TopologyError::Io(crate::error::IoError::new("probe address", source)))?;
            let any = if ipv6 { "[::]:0" } else { "0.0.0.0:0" };
            let tx = self.tx.run(move || std::net::UdpSocket::bind(any))?;
            let tx =
                tx.map_err(|source| TopologyError::Io(crate::error::IoError::new("bind readiness probe", source)))?;
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            let mut buf = [0u8; 16];
            loop {
                let _ = tx.send_to(b"netlane-ready", dst);
                if rx.recv(&mut buf).is_ok() {
                    break;
                }
                if std::time::Instant::now() > deadline {
                    return Err(TopologyError::Unsupported(format!(
                        "the {} path {} -> {} did not carry a datagram within 5 s",
                        if ipv6 { "IPv6" } else { "IPv4" },
                        self.tx_addr(ipv6),
                        self.rx_addr(ipv6)
                    )));
                }
            }
        }
        Ok(())
    }

    /// The tx host's address.
    pub fn tx_addr(&self, ipv6: bool) -> IpAddr {
        if ipv6 { Self::TX_V6.into() } else { Self::TX_V4.into() }
    }

    /// The rx host's address.
    pub fn rx_addr(&self, ipv6: bool) -> IpAddr {
        if ipv6 { Self::RX_V6.into() } else { Self::RX_V4.into() }
    }

    /// Turns TCP segmentation offload on or off at the tx end (what the tx host sends).
    /// veth hands a locally sent packet to the peer's NAPI instance (so it gets a NAPI
    /// id and a receive queue, as from a NIC) only when the sending end has no TSO, or
    /// for UDP with GRO forwarding at the receiver (drivers/net/veth.c,
    /// `veth_skb_is_eligible_for_gro`): with TSO on, TCP bypasses NAPI, its receive work
    /// runs on the sender's CPU right after the send, and every TCP socket reads
    /// SO_INCOMING_NAPI_ID 0. Off, segmentation happens in software first (GSO), which
    /// small request/response messages never need.
    pub fn set_tx_tso(&self, on: bool) -> Result<(), TopologyError> {
        self.tx.with_ethtool(|e| e.set_features(&self.tx_if, &tso_features(on)))
    }

    /// Puts `s` in force at the tx end until the guard drops.
    pub fn tx_segmentation(&self, s: Segmentation) -> Result<SegmentationGuard<'_>, TopologyError> {
        SegmentationGuard::apply(&self.tx, &self.tx_if, self.tx_index, s)
    }

    /// The same at the rx end (what the rx host sends back).
    pub fn set_rx_tso(&self, on: bool) -> Result<(), TopologyError> {
        self.rx.with_ethtool(|e| e.set_features(&self.rx_if, &tso_features(on)))
    }

    /// Puts a token bucket on the tx end: `rate` bytes/s, `burst` bytes of bucket,
    /// `limit` bytes of queue (beyond which packets are dropped).
    pub fn set_bottleneck(&self, rate: u64, burst: u32, limit: u32) -> Result<(), TopologyError> {
        self.tx.with_rtnl(|r| r.add_tbf(self.tx_index, rate, burst, limit))
    }

    /// Kind and counters of the tx end's root qdisc ("noqueue" without one).
    pub fn egress_qdisc(&self) -> Result<(String, QdiscStats), TopologyError> {
        Ok(self
            .tx
            .with_rtnl(|r| r.root_qdisc(self.tx_index))?
            .unwrap_or_else(|| ("noqueue".to_string(), QdiscStats::default())))
    }
}

/// One end of a [`veth_link`]: namespace, interface name, addresses.
#[derive(Debug, Clone, Copy)]
pub struct End<'a> {
    /// Its namespace.
    pub ns: &'a Netns,
    /// The interface's name there.
    pub name: &'a str,
    /// Addresses with prefix lengths.
    pub addrs: &'a [(IpAddr, u8)],
}

/// Creates a veth pair between two namespaces with `mtu`, one queue each, addresses
/// and static neighbour entries for each other's addresses, both ends up. An end given
/// no IPv6 address has IPv6 turned off, so the kernel sends no frames of its own on the
/// link (neighbour discovery, MLD reports) to disturb what runs over it. Returns the two
/// interface indexes. The pair goes away with either namespace.
pub fn veth_link(a: End<'_>, b: End<'_>, mtu: u32) -> Result<(u32, u32), TopologyError> {
    veth_link_queues(a, b, mtu, 1)
}

/// [`veth_link`] with `queues` transmit and receive queues on each end.
pub fn veth_link_queues(a: End<'_>, b: End<'_>, mtu: u32, queues: u32) -> Result<(u32, u32), TopologyError> {
    if !(68..=65535).contains(&mtu) {
        return Err(TopologyError::Invalid(format!("MTU {mtu} is outside 68..=65535")));
    }
    if !(1..=64).contains(&queues) {
        return Err(TopologyError::Invalid(format!("queue count {queues} is outside 1..=64")));
    }
    let (a_fd, b_fd) = (std::os::fd::AsRawFd::as_raw_fd(&a.ns.fd()), std::os::fd::AsRawFd::as_raw_fd(&b.ns.fd()));
    a.ns.with_rtnl(|r| r.add_veth(a.name, a_fd, b.name, b_fd, mtu, queues))?;
    let mut idx = [0u32; 2];
    let mut macs: [Vec<u8>; 2] = [Vec::new(), Vec::new()];
    for (k, end) in [a, b].iter().enumerate() {
        if !end.addrs.iter().any(|(addr, _)| addr.is_ipv6()) {
            ipv6_off(end.ns, end.name)?;
        }
        let (i, mac) = end.ns.with_rtnl(|r| {
            let i = r.link_index(end.name)?;
            for (addr, len) in end.addrs {
                r.add_address(i, *addr, *len)?;
            }
            r.set_up(i)?;
            Ok((i, r.link_mac(i)?))
        })?;
        idx[k] = i;
        macs[k] = mac;
    }
    for (k, end) in [a, b].iter().enumerate() {
        let (other, mac) = if k == 0 { (b, &macs[1]) } else { (a, &macs[0]) };
        // An end with IPv6 off keeps no IPv6 neighbours.
        let has_v6 = end.addrs.iter().any(|(addr, _)| addr.is_ipv6());
        end.ns.with_rtnl(|r| {
            other
                .addrs
                .iter()
                .filter(|(addr, _)| has_v6 || addr.is_ipv4())
                .try_for_each(|(addr, _)| r.add_neighbour(idx[k], *addr, mac))
        })?;
    }
    for (k, end) in [a, b].iter().enumerate() {
        wait_until_transmitting(end.ns, end.name, idx[k])?;
    }
    Ok((idx[0], idx[1]))
}

/// Waits (up to 5 s) until link `index` can transmit. A link set up has the noop qdisc,
/// which drops every packet, until the kernel's link watcher activates its queues (up to
/// a second later): a datagram sent at once would be lost.
fn wait_until_transmitting(ns: &Netns, name: &str, index: u32) -> Result<(), TopologyError> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        if ns.with_rtnl(|r| r.link_qdisc(index))? != "noop" {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return Err(TopologyError::Io(crate::error::IoError::new(
                format!("wait for {name} to transmit (its qdisc stayed noop for 5 s)"),
                std::io::ErrorKind::TimedOut.into(),
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Turns IPv6 off on `link` in `ns` (before it comes up, so no link-local address, DAD,
/// router solicitation or MLD report ever leaves it). A kernel without IPv6 has nothing
/// to turn off.
fn ipv6_off(ns: &Netns, link: &str) -> Result<(), TopologyError> {
    match set_net_sysctl(ns, &format!("ipv6/conf/{link}/disable_ipv6"), "1") {
        Err(TopologyError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// Sets a `/proc/sys/net/...` knob (`rel` below /proc/sys/net) inside `ns`.
pub fn set_net_sysctl(ns: &Netns, rel: &str, value: &str) -> Result<(), TopologyError> {
    if rel.contains("..") {
        return Err(TopologyError::Invalid(format!("bad sysctl path {rel:?}")));
    }
    let path = format!("/proc/sys/net/{rel}");
    let v = value.to_string();
    ns.run(move || std::fs::write(&path, v))?
        .map_err(|source| TopologyError::Io(crate::error::IoError::new(format!("write {rel} = {value}"), source)))
}

/// Whether this process can build namespaces (root, or CAP_SYS_ADMIN + CAP_NET_ADMIN).
/// A cheap pre-check for friendlier messages; the real test is trying.
pub fn have_privileges() -> bool {
    nix::unistd::geteuid().is_root()
}

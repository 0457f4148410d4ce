//! Which kernel fast paths work here, and why not when they do not.
//!
//! Each probe uses the feature for real where it can (a GSO send over loopback that
//! must arrive as separate datagrams, a zerocopy send whose completion must arrive, a
//! qdisc created in a scratch namespace) rather than trusting a socket option that the
//! kernel accepts and then ignores (SO_TXTIME without fq, for one).

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsFd;
use std::time::Duration;

use serde::Serialize;

use crate::caps::Cap;
use crate::sockopt;
use crate::topology::{Netns, TopologyError};
use crate::udp::{GsoMode, Receiver, ReceiverConfig, RxBatching, Sender, SenderConfig, UdpSocket};
use crate::zerocopy::{self, Tracker};

/// Whether a feature works, with evidence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(tag = "status", content = "detail", rename_all = "lowercase")]
pub enum Support {
    /// It works; what was observed.
    Supported(String),
    /// It does not; why.
    Unsupported(String),
    /// Could not be checked (e.g. needs root); why.
    Unknown(String),
}

impl Support {
    /// Whether the feature works.
    pub fn is_supported(&self) -> bool {
        matches!(self, Support::Supported(_))
    }

    /// The evidence or reason.
    pub fn detail(&self) -> &str {
        match self {
            Support::Supported(s) | Support::Unsupported(s) | Support::Unknown(s) => s,
        }
    }
}

/// One probed feature.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct Feature {
    /// Short name, e.g. "udp-gso".
    pub name: &'static str,
    /// Result.
    pub support: Support,
}

fn loopback_pair() -> io::Result<(UdpSocket, UdpSocket)> {
    let rx = UdpSocket::bind(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0))?;
    rx.set_read_timeout(Some(Duration::from_millis(500)))?;
    let tx = UdpSocket::connect_to(rx.local_addr()?)?;
    Ok((tx, rx))
}

fn from_io(what: &str, r: io::Result<Support>) -> Support {
    r.unwrap_or_else(|e| Support::Unsupported(format!("{what}: {e}")))
}

/// The running kernel's (major, minor) version, from its release
/// (`/proc/sys/kernel/osrelease`, uname -r: "6.18.44-..."); None when unreadable.
pub fn kernel_version() -> Option<(u32, u32)> {
    parse_release(&std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?)
}

/// (major, minor) of a kernel release string such as "6.1.0-26-amd64".
pub fn parse_release(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// UDP GSO: a 3-segment send over loopback must arrive as 3 datagrams; also finds
/// the kernel's segment limit (64, or 128 on newer kernels).
pub fn udp_gso() -> Support {
    from_io(
        "UDP_SEGMENT",
        (|| {
            let (tx, rx) = loopback_pair()?;
            sockopt::set_udp_segment(tx.as_fd(), 1000)?;
            sockopt::set_udp_segment(tx.as_fd(), 0)?;
            let mut s = Sender::new(tx, SenderConfig { gso: GsoMode::Cmsg, ..SenderConfig::plain(false) });
            s.send(&[7u8; 2500], 1000, None).map_err(io::Error::other)?;
            let mut r = Receiver::new(ReceiverConfig::new(RxBatching::Mmsg(8)));
            let mut lens = Vec::new();
            while lens.len() < 3 {
                r.recv(rx.as_fd(), |d| lens.push(d.data.len()))?;
            }
            if lens != [1000, 1000, 500] {
                return Ok(Support::Unsupported(format!("a 3-segment send arrived as {lens:?}")));
            }
            // 128 segments of 100 bytes: accepted by kernels whose UDP_MAX_SEGMENTS is 128,
            // EINVAL where it is 64.
            let mut control = netlane_sys::cmsg::CmsgBuf::<32>::new();
            control.push_udp_segment(100).map_err(io::Error::other)?;
            let big = [1u8; 12_800];
            let max =
                match netlane_sys::msg::sendmsg(s.io().as_fd(), None, &[io::IoSlice::new(&big)], control.as_bytes(), 0)
                {
                    Ok(_) => 128,
                    Err(_) => 64,
                };
            Ok(Support::Supported(format!("3-segment send arrived as 1000+1000+500 B; up to {max} segments per send")))
        })(),
    )
}

/// UDP GRO: a GSO train to a UDP_GRO socket over loopback must arrive as one read with
/// the stride in a control message.
pub fn udp_gro() -> Support {
    from_io(
        "UDP_GRO",
        (|| {
            let (tx, rx) = loopback_pair()?;
            rx.enable_gro()?;
            let mut s = Sender::new(tx, SenderConfig { gso: GsoMode::Cmsg, ..SenderConfig::plain(false) });
            s.send(&[3u8; 4000], 1000, None).map_err(io::Error::other)?;
            let mut r = Receiver::new(ReceiverConfig::new(RxBatching::Mmsg(4)));
            let mut strides = Vec::new();
            while strides.len() < 4 {
                r.recv(rx.as_fd(), |d| strides.push(d.stride))?;
            }
            Ok(if strides.iter().all(|s| *s == Some(1000)) {
                Support::Supported("a 4-segment train arrived as one read with stride 1000; on veth, coalescing needs NAPI (GRO on + threaded)".into())
            } else {
                Support::Unsupported(format!("no UDP_GRO control message on the read (strides {strides:?})"))
            })
        })(),
    )
}

/// MSG_ZEROCOPY for UDP: a zerocopy send over loopback must be completed on the error
/// queue; reports whether the kernel copied.
pub fn msg_zerocopy() -> Support {
    from_io(
        "MSG_ZEROCOPY",
        (|| {
            let (tx, rx) = loopback_pair()?;
            if let Err(e) = tx.enable_zerocopy() {
                return Ok(Support::Unsupported(format!("SO_ZEROCOPY: {e}")));
            }
            netlane_sys::msg::sendmsg(tx.as_fd(), None, &[io::IoSlice::new(&[1u8; 16_384])], &[], libc::MSG_ZEROCOPY)?;
            let mut t: Tracker<()> = Tracker::new();
            t.on_send(());
            let mut other = zerocopy::OtherRecords::default();
            for _ in 0..100 {
                zerocopy::drain_errqueue(tx.as_fd(), &mut t, &mut other)?;
                if t.all_completed() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            let mut r = Receiver::new(ReceiverConfig::new(RxBatching::Single));
            r.recv(rx.as_fd(), |_| {})?;
            let st = t.stats();
            Ok(if st.completed == 1 {
                Support::Supported(format!(
                    "a loopback send was completed on the error queue ({}); whether data is really not copied depends on the path (udp-bulk reports the copied fraction)",
                    if st.copied == 1 { "flagged copied" } else { "not copied" }
                ))
            } else {
                Support::Unsupported("no completion within 500 ms".into())
            })
        })(),
    )
}

/// SO_TXTIME: the socket option, and whether any qdisc that honours it exists.
pub fn so_txtime(qdiscs: &[(&'static str, Support)]) -> Support {
    from_io(
        "SO_TXTIME",
        (|| {
            let (tx, _rx) = loopback_pair()?;
            sockopt::set_txtime_monotonic(tx.as_fd())?;
            let honouring: Vec<&str> = qdiscs
                .iter()
                .filter(|(k, s)| ["fq", "etf", "taprio"].contains(k) && s.is_supported())
                .map(|(k, _)| *k)
                .collect();
            let checked = qdiscs.iter().any(|(k, s)| ["fq", "etf"].contains(k) && !matches!(s, Support::Unknown(_)));
            Ok(if !honouring.is_empty() {
                Support::Supported(format!("socket option accepted; qdiscs that honour it: {}", honouring.join(", ")))
            } else if checked {
                Support::Unsupported(
                "socket option accepted, but no qdisc honours release times here (fq, etf, taprio are not in this kernel): times would be ignored, so pacing falls back to user space".into(),
            )
            } else {
                Support::Unknown("socket option accepted; qdisc availability needs root to check".into())
            })
        })(),
    )
}

/// SO_MAX_PACING_RATE (TCP paces itself; UDP needs fq).
pub fn max_pacing_rate() -> Support {
    from_io(
        "SO_MAX_PACING_RATE",
        (|| {
            let (tx, _rx) = loopback_pair()?;
            sockopt::set_max_pacing_rate(tx.as_fd(), 10_000_000)?;
            Ok(Support::Supported("accepted; honoured by TCP's own pacing, and for UDP only under fq".into()))
        })(),
    )
}

/// Busy polling: SO_BUSY_POLL, SO_PREFER_BUSY_POLL, SO_BUSY_POLL_BUDGET, EPIOCSPARAMS.
pub fn busy_poll() -> Support {
    from_io(
        "busy polling",
        (|| {
            let (tx, _rx) = loopback_pair()?;
            sockopt::set_busy_poll(tx.as_fd(), 50)?;
            sockopt::set_prefer_busy_poll(tx.as_fd(), true)?;
            sockopt::set_busy_poll_budget(tx.as_fd(), 64)?;
            let ep = nix::sys::epoll::Epoll::new(nix::sys::epoll::EpollCreateFlags::EPOLL_CLOEXEC)?;
            let params = netlane_sys::epoll::EpollParams {
                busy_poll_usecs: 50,
                busy_poll_budget: 64,
                prefer_busy_poll: 1,
                pad: 0,
            };
            let per_epoll = match netlane_sys::epoll::set_params(ep.0.as_fd(), &params) {
                Ok(()) => "EPIOCSPARAMS works".to_string(),
                Err(e) => format!("EPIOCSPARAMS unavailable ({e}; needs Linux 6.9)"),
            };
            Ok(Support::Supported(format!(
                "SO_BUSY_POLL, SO_PREFER_BUSY_POLL, SO_BUSY_POLL_BUDGET accepted; {per_epoll}"
            )))
        })(),
    )
}

/// How much memory a process may lock (RLIMIT_MEMLOCK): what an AF_XDP UMEM pins
/// counts against it (BPF maps are charged to the memory cgroup since Linux 5.11).
pub fn memlock() -> Support {
    use nix::sys::resource::{Resource, getrlimit};
    let show = |v: u64| if v == u64::MAX { "unlimited".to_string() } else { format!("{} KiB", v / 1024) };
    match getrlimit(Resource::RLIMIT_MEMLOCK) {
        Ok((soft, hard)) => Support::Supported(format!(
            "soft {}, hard {}: an AF_XDP UMEM (frames x frame size) must fit under the soft limit (`ulimit -l`; \
             root may raise it)",
            show(soft),
            show(hard)
        )),
        Err(e) => Support::Unknown(format!("getrlimit(RLIMIT_MEMLOCK): {e}")),
    }
}

/// The kernel's BTF (what CO-RE BPF programs such as netlane's are relocated against).
pub fn btf() -> Support {
    match std::fs::metadata("/sys/kernel/btf/vmlinux") {
        Ok(m) => Support::Supported(format!("/sys/kernel/btf/vmlinux, {} KiB: CO-RE programs load", m.len() / 1024)),
        Err(e) => Support::Unsupported(format!(
            "/sys/kernel/btf/vmlinux: {e} (a kernel built without CONFIG_DEBUG_INFO_BTF: netlane's BPF programs \
             cannot be relocated)"
        )),
    }
}

/// netdev netlink's NAPI instances (`napi-get`, Linux 6.8): what lanes place
/// connections by and `nic show` lists.
pub fn netdev_napi() -> Support {
    match crate::topology::netdev::Netdev::open().and_then(|mut nd| nd.napis(1)) {
        Ok(_) => Support::Supported("napi-get answers: NAPI ids, their interrupts and threads are listed".into()),
        Err(e) => Support::Unsupported(format!("napi-get: {}", crate::error::chain(&e))),
    }
}

/// Threaded NAPI busy polling (the instance's kernel thread polls without sleeping:
/// netdev netlink's `napi-set threaded busy-poll`), tried on a threaded veth in scratch
/// namespaces. Needs root.
pub fn napi_threaded_busy_poll() -> Support {
    use crate::topology::{LinkConfig, RxTuning, TwoHosts};
    if !crate::topology::have_privileges() {
        return Support::Unknown("trying it makes scratch network namespaces: run the probe as root".into());
    }
    let h = match TwoHosts::create("probe-napi", LinkConfig { mtu: 1500, queues: 1, rx: RxTuning::threaded_napi() }) {
        Ok(h) => h,
        Err(e) => return Support::Unknown(format!("could not check: {}", crate::error::chain(&e))),
    };
    let ifindex = h.rx_index;
    match h.rx.run(move || crate::lanes::queues::try_threaded_busy_poll(ifindex)) {
        Ok(Ok(said)) => Support::Supported(said),
        Ok(Err(why)) => Support::Unsupported(why),
        Err(e) => Support::Unknown(format!("could not check: {}", crate::error::chain(&e))),
    }
}

/// AF_XDP sockets (an `AF_XDP` socket made; binding one needs a device and a UMEM).
pub fn af_xdp() -> Support {
    match socket2::Socket::new(socket2::Domain::from(libc::AF_XDP), socket2::Type::RAW, None) {
        Ok(_) => Support::Supported("an AF_XDP socket was made (zero-copy needs a driver that has it)".into()),
        Err(e) if is_permission(&e) => needs("an AF_XDP socket", &[Cap::NetRaw]),
        Err(e) => Support::Unsupported(format!("socket(AF_XDP): {e} (a kernel without CONFIG_XDP_SOCKETS)")),
    }
}

/// What a permission error says: the capabilities it takes, and how to get them.
fn needs(what: &str, caps: &[crate::caps::Cap]) -> Support {
    Support::Unknown(crate::caps::Lacking { what: what.into(), lacking: caps.to_vec() }.to_string())
}

fn is_permission(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES))
}

/// TPACKET_V3 rings (the datagram service's block-based receive path): a small ring
/// opened on loopback.
pub fn tpacket_v3() -> Support {
    use netlane_sys::packet::{PacketRing, RingSpec};
    let spec = RingSpec::V3 { block_size: 1 << 16, blocks: 2, frame_size: 2048, retire_ms: 8 };
    // A classic BPF filter that takes nothing (`ret #0`): the probe wants the ring, not
    // the host's packets.
    let take_nothing = [netlane_sys::packet::Insn { code: 0x06, jt: 0, jf: 0, k: 0 }];
    match PacketRing::open(0x0003, 1, &take_nothing, spec) {
        Ok(r) => Support::Supported(format!("a ring of {} KiB mapped on lo", r.spec().bytes() / 1024)),
        Err(e) if is_permission(&e) => needs("a packet socket", &[Cap::NetRaw]),
        Err(e) => Support::Unsupported(format!("TPACKET_V3 ring: {e}")),
    }
}

/// What the BPF paths need, each tried on a veth pair in a scratch namespace: XDP
/// attached native and generic, the balancer's device-bound build whose RX-hash hint is
/// the `bpf_xdp_metadata_rx_hash` kfunc, and a TCX egress program. Needs root.
pub fn bpf_paths() -> Vec<(&'static str, Support)> {
    const NAMES: [&str; 4] = ["xdp-native", "xdp-generic", "xdp-rx-hash-kfunc", "tcx"];
    if !crate::topology::have_privileges() {
        let why = "trying it makes a scratch network namespace: run the probe as root";
        return NAMES.iter().map(|n| (*n, Support::Unknown(why.into()))).collect();
    }
    match try_bpf_paths() {
        Ok(v) => v,
        Err(e) => {
            let why = format!("could not check: {}", crate::error::chain(&e));
            NAMES.iter().map(|n| (*n, Support::Unknown(why.clone()))).collect()
        }
    }
}

fn try_bpf_paths() -> Result<Vec<(&'static str, Support)>, TopologyError> {
    use netlane_sys::bpf::{Balancer, BalancerOptions, BalancerSizes, FlowTagger, HintMode, XdpLink, XdpMode, XdpTx};
    let ns = Netns::create("probe-bpf")?;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&ns.fd());
    ns.with_rtnl(|r| r.add_veth("pb0", fd, "pb1", fd, 1500, 1))?;
    let index = ns.with_rtnl(|r| r.link_index("pb0"))?;
    let peer = ns.with_rtnl(|r| r.link_index("pb1"))?;
    ns.with_rtnl(|r| {
        r.set_up(index)?;
        r.set_up(peer)
    })?;
    let said = |r: io::Result<String>| match r {
        Ok(s) => Support::Supported(s),
        Err(e) if is_permission(&e) => needs("loading BPF programs", &[Cap::Bpf, Cap::NetAdmin]),
        Err(e) => Support::Unsupported(e.to_string()),
    };
    let out = ns.run(|| {
        let xdp = XdpTx::load();
        let attach = |mode: XdpMode| {
            let prog = xdp.as_ref().map_err(|e| io::Error::new(e.kind(), format!("load an XDP program: {e}")))?;
            XdpLink::attach(prog.program_fd(), index, mode)
                .map(|_| format!("attached on veth ({})", mode.name()))
                .map_err(|e| io::Error::new(e.kind(), format!("attach on veth: {e}")))
        };
        let native = said(attach(XdpMode::Native).map(|s| s + "; a NIC's driver must have it too (nic show)"));
        let generic = said(attach(XdpMode::Generic));
        let opts = BalancerOptions {
            sizes: BalancerSizes::new(1, 2, 13, 64),
            hint: HintMode::RxHash,
            bind_ifindex: Some(index),
        };
        let kfunc = said(
            Balancer::load(&opts)
                .map(|_| "the balancer's device-bound build loaded on veth (the NIC hints lb uses)".to_string())
                .map_err(|e| io::Error::new(e.kind(), format!("device-bound build with rx-hash: {e}"))),
        );
        let tcx = said(
            FlowTagger::load(1)
                .and_then(|t| t.attach_egress(index).map(|_| ()))
                .map(|()| "a TCX egress program attached (Linux 6.6)".to_string())
                .map_err(|e| io::Error::new(e.kind(), format!("TCX egress: {e}"))),
        );
        vec![("xdp-native", native), ("xdp-generic", generic), ("xdp-rx-hash-kfunc", kfunc), ("tcx", tcx)]
    })?;
    Ok(out)
}

/// Which of `kinds` the kernel can instantiate as a root qdisc, tried on a veth in a
/// scratch namespace (needs root; otherwise every answer is `Unknown`).
pub fn qdiscs(kinds: &[&'static str]) -> Vec<(&'static str, Support)> {
    match try_qdiscs(kinds) {
        Ok(v) => v,
        Err(e) => {
            let why = format!("could not check: {}", crate::error::chain(&e));
            kinds.iter().map(|k| (*k, Support::Unknown(why.clone()))).collect()
        }
    }
}

fn try_qdiscs(kinds: &[&'static str]) -> Result<Vec<(&'static str, Support)>, TopologyError> {
    let ns = Netns::create("probe-qdisc")?;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&ns.fd());
    ns.with_rtnl(|r| r.add_veth("pq0", fd, "pq1", fd, 1500, 1))?;
    let index = ns.with_rtnl(|r| r.link_index("pq0"))?;
    let mut out = Vec::new();
    for kind in kinds {
        let res = ns.with_rtnl(|r| r.add_root_qdisc(index, kind));
        let support = match res {
            Ok(()) => {
                let _ = ns.with_rtnl(|r| r.del_root_qdisc(index));
                Support::Supported("created".into())
            }
            Err(TopologyError::Netlink(e)) if e.errno() == Some(libc::ENOENT) => {
                Support::Unsupported(format!("not in this kernel ({})", e.message.as_deref().unwrap_or("unknown kind")))
            }
            // Present, but refused an empty configuration (etf and taprio need options).
            Err(TopologyError::Netlink(e)) => {
                Support::Supported(format!("present (an empty configuration is refused: {})", e.source))
            }
            Err(e) => return Err(e),
        };
        out.push((*kind, support));
    }
    Ok(out)
}

/// Probes everything. Qdiscs need root; without it they are `Unknown`.
pub fn probe_all() -> ProbeReport {
    let qd = if crate::topology::have_privileges() {
        qdiscs(&["fq", "etf", "taprio", "mqprio", "htb", "tbf", "fq_codel", "netem", "clsact"])
    } else {
        vec![("fq", Support::Unknown("needs root".into())), ("etf", Support::Unknown("needs root".into()))]
    };
    let features = vec![
        Feature { name: "udp-gso", support: udp_gso() },
        Feature { name: "udp-gro", support: udp_gro() },
        Feature { name: "msg-zerocopy", support: msg_zerocopy() },
        Feature { name: "so-txtime", support: so_txtime(&qd) },
        Feature { name: "so-max-pacing-rate", support: max_pacing_rate() },
        Feature { name: "busy-poll", support: busy_poll() },
        Feature { name: "af-xdp", support: af_xdp() },
        Feature { name: "tpacket-v3", support: tpacket_v3() },
        Feature { name: "btf", support: btf() },
        Feature { name: "netdev-napi", support: netdev_napi() },
        Feature { name: "napi-threaded-busy-poll", support: napi_threaded_busy_poll() },
        Feature { name: "memlock", support: memlock() },
    ];
    let mut features = features;
    features.extend(bpf_paths().into_iter().map(|(name, support)| Feature { name, support }));
    ProbeReport { features, qdiscs: qd.into_iter().map(|(qdisc, support)| QdiscSupport { qdisc, support }).collect() }
}

/// Whether a qdisc can be created here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct QdiscSupport {
    /// Its kind (`fq`, `etf`, ...).
    pub qdisc: &'static str,
    /// Result.
    pub support: Support,
}

/// Everything [`probe_all`] found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct ProbeReport {
    /// Socket features, each tried for real.
    pub features: Vec<Feature>,
    /// Qdiscs, each created in a scratch namespace (root only).
    pub qdiscs: Vec<QdiscSupport>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_releases_parse() {
        assert_eq!(parse_release("6.18.44-fc-v782"), Some((6, 18)));
        assert_eq!(parse_release("6.1.0-26-amd64"), Some((6, 1)));
        assert_eq!(parse_release("5.4"), Some((5, 4)));
        assert_eq!(parse_release("linux"), None);
        assert_eq!(parse_release("6"), None);
        assert!(kernel_version().is_some());
    }
}

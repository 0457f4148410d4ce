//! The load balancer's loader and map access (`bpf/lb/balancer.bpf.c`).
//!
//! Two builds of one program: the plain build reads hints from the XDP metadata area
//! and can be test-run; the device-bound build reads the NIC's RX hash through the
//! metadata kfunc and must be bound to its interface at load time. Both have the same
//! maps, which this module reaches through map handles so one `Balancer` serves both.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsFd, BorrowedFd};
use std::rc::Rc;
use std::time::Duration;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, MapHandle};

use super::{balancer_bound_skel, balancer_skel, object_storage, percpu_sum, to_io};

/// The generated map types used here are plain old data: `repr(C)`, every bit pattern
/// valid, no padding (checked by the size assertions below).
trait Pod: Copy {}
impl Pod for balancer_skel::types::vip_key {}
impl Pod for balancer_skel::types::vip_meta {}
impl Pod for balancer_skel::types::real_def {}
impl Pod for balancer_skel::types::lb_config {}
impl Pod for balancer_skel::types::vip_addr {}
const _: () = assert!(std::mem::size_of::<balancer_skel::types::vip_key>() == 20);
const _: () = assert!(std::mem::size_of::<balancer_skel::types::vip_meta>() == 8);
const _: () = assert!(std::mem::size_of::<balancer_skel::types::real_def>() == 28);
const _: () = assert!(std::mem::size_of::<balancer_skel::types::lb_config>() == 40);
const _: () = assert!(std::mem::size_of::<balancer_skel::types::vip_addr>() == 20);
const _: () = assert!(std::mem::size_of::<balancer_skel::types::flow_key>() == FlowKey::LEN);
const _: () = assert!(std::mem::size_of::<balancer_skel::types::flow_entry>() == FlowKey::LEN + 16);

fn pod_bytes<T: Pod>(v: &T) -> &[u8] {
    // SAFETY: `T: Pod` is a repr(C) struct without padding (sizes asserted above), so all
    // of its size_of::<T>() bytes are initialised; the slice borrows `v`.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}

/// `BPF_F_XDP_DEV_BOUND_ONLY` (Linux 6.3; not in the 6.1 headers this builds with).
const BPF_F_XDP_DEV_BOUND_ONLY: u32 = 1 << 6;

/// Family tags used in keys and reals.
const FAM_V4: u8 = 4;
const FAM_V6: u8 = 6;

/// Top byte of a per-flow tag (the rest is the tag id).
pub const TAG_KIND_FLOW: u32 = 0xf1;
/// Top byte of a per-destination tag (the rest is the real's index).
pub const TAG_KIND_DEST: u32 = 0xd5;

/// The hint value that names per-flow tag `id` (< 2^24).
pub fn flow_tag(id: u32) -> u32 {
    (TAG_KIND_FLOW << 24) | (id & 0xff_ffff)
}

/// The hint value that names real `index` (< 2^24) as the destination.
pub fn dest_tag(index: u32) -> u32 {
    (TAG_KIND_DEST << 24) | (index & 0xff_ffff)
}

/// What the data plane does with per-packet hints (chosen at load time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HintMode {
    /// No hints: every packet takes the full path (a legacy NIC).
    #[default]
    Off,
    /// The RX hash indexes a per-CPU flow cache that skips the VIP and connection
    /// lookups when the cached flow matches.
    RxHash,
    /// Per-flow tags installed by the control plane after new-flow events.
    FlowTag,
    /// Per-destination tags (tag = real), checked against the packet's VIP.
    DestTag,
}

impl HintMode {
    /// The value the program's `hint_mode` takes.
    fn code(self) -> u32 {
        match self {
            HintMode::Off => 0,
            HintMode::RxHash => 1,
            HintMode::FlowTag => 2,
            HintMode::DestTag => 3,
        }
    }

    /// "off", "rx-hash", "flow-tag", "dest-tag".
    pub fn name(self) -> &'static str {
        match self {
            HintMode::Off => "off",
            HintMode::RxHash => "rx-hash",
            HintMode::FlowTag => "flow-tag",
            HintMode::DestTag => "dest-tag",
        }
    }

    /// Parses a name as [`HintMode::name`] prints it.
    pub fn from_name(s: &str) -> Option<HintMode> {
        [HintMode::Off, HintMode::RxHash, HintMode::FlowTag, HintMode::DestTag].into_iter().find(|m| m.name() == s)
    }
}

/// Map sizes of a balancer, chosen from its configuration before loading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BalancerSizes {
    /// VIPs.
    pub max_vips: u32,
    /// Reals (indexes 0..max_reals).
    pub max_reals: u32,
    /// Maglev ring slots per VIP (a prime).
    pub ring_size: u32,
    /// Connection-table entries (split between the CPUs' LRU lists).
    pub conn_entries: u32,
    /// Per-flow tag ids (0..flow_tags, at most 2^24).
    pub flow_tags: u32,
    /// Slots of the per-CPU rx-hash flow cache (a power of two).
    pub hint_cache: u32,
    /// Bytes of the new-flow event ring (a power of two, at least one page).
    pub event_ring_bytes: u32,
}

impl BalancerSizes {
    /// Sizes for `max_vips` VIPs and `max_reals` reals with `ring_size` rings and
    /// `conn_entries` connection entries; the hint structures get defaults that fit.
    pub fn new(max_vips: u32, max_reals: u32, ring_size: u32, conn_entries: u32) -> BalancerSizes {
        BalancerSizes {
            max_vips,
            max_reals,
            ring_size,
            conn_entries,
            flow_tags: 65536,
            hint_cache: 65536,
            event_ring_bytes: 1 << 20,
        }
    }

    fn check(&self) -> io::Result<()> {
        let bad = |m: String| Err(io::Error::new(io::ErrorKind::InvalidInput, m));
        if self.max_vips == 0 || self.max_reals == 0 || self.ring_size == 0 || self.conn_entries == 0 {
            return bad(format!("balancer sizes must be positive: {self:?}"));
        }
        if self.max_reals > 1 << 24 {
            return bad(format!("at most 2^24 reals (tags carry 24 bits), not {}", self.max_reals));
        }
        if self.flow_tags == 0 || self.flow_tags > 1 << 24 {
            return bad(format!("flow tags must be 1..=2^24, not {}", self.flow_tags));
        }
        if !self.hint_cache.is_power_of_two() {
            return bad(format!("the hint cache size must be a power of two, not {}", self.hint_cache));
        }
        if !self.event_ring_bytes.is_power_of_two() || self.event_ring_bytes < 4096 {
            return bad(format!("the event ring must be a power of two >= 4096 bytes, not {}", self.event_ring_bytes));
        }
        if self.max_vips.checked_mul(self.ring_size).is_none() {
            return bad("max_vips x ring_size overflows".into());
        }
        Ok(())
    }
}

/// How to load a balancer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BalancerOptions {
    /// Map sizes.
    pub sizes: BalancerSizes,
    /// What hints are used for.
    pub hint: HintMode,
    /// Load the device-bound build for this interface (in the caller's network
    /// namespace): hints come from the RX-hash kfunc. `None`: the plain build, hints
    /// from the XDP metadata area.
    pub bind_ifindex: Option<u32>,
}

/// Outer addresses and limits of the data plane (the `lb_cfg` map).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataPlaneConfig {
    /// Next hop towards the reals (destination MAC of encapsulated packets).
    pub gw_mac: [u8; 6],
    /// This interface's MAC (their source).
    pub own_mac: [u8; 6],
    /// Outer IPv4 source base; its low 16 bits vary by flow.
    pub src4: Ipv4Addr,
    /// Outer IPv6 source base; its last 32 bits vary by flow.
    pub src6: Ipv6Addr,
    /// New connections each CPU records per second (the flood guard); 0 = no limit.
    pub max_new_conns_per_cpu: u32,
    /// Idle UDP connection entries expire after this long; 0 = never.
    pub udp_timeout_ms: u32,
}

/// A flow's 5-tuple as the data plane keys it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowKey {
    /// Source address.
    pub src: IpAddr,
    /// Destination address (the VIP).
    pub dst: IpAddr,
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
    /// IP protocol.
    pub proto: u8,
}

impl FlowKey {
    /// Bytes of `struct flow_key`.
    pub const LEN: usize = 40;

    /// The key's bytes as the data plane stores them.
    pub fn to_bytes(&self) -> [u8; FlowKey::LEN] {
        let mut b = [0u8; FlowKey::LEN];
        let family = match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                b[0..4].copy_from_slice(&s.octets());
                b[16..20].copy_from_slice(&d.octets());
                FAM_V4
            }
            (s, d) => {
                b[0..16].copy_from_slice(&v6_octets(s));
                b[16..32].copy_from_slice(&v6_octets(d));
                FAM_V6
            }
        };
        b[32..34].copy_from_slice(&self.sport.to_be_bytes());
        b[34..36].copy_from_slice(&self.dport.to_be_bytes());
        b[36] = self.proto;
        b[37] = family;
        b
    }

    /// Reads a key back; `None` for an unknown family or a short buffer.
    pub fn from_bytes(b: &[u8]) -> Option<FlowKey> {
        let b: &[u8; FlowKey::LEN] = b.get(..FlowKey::LEN)?.try_into().ok()?;
        let addr = |s: &[u8]| -> Option<IpAddr> {
            match b[37] {
                FAM_V4 => Some(IpAddr::V4(Ipv4Addr::new(s[0], s[1], s[2], s[3]))),
                FAM_V6 => Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&s[..16]).ok()?))),
                _ => None,
            }
        };
        Some(FlowKey {
            src: addr(&b[0..16])?,
            dst: addr(&b[16..32])?,
            sport: u16::from_be_bytes([b[32], b[33]]),
            dport: u16::from_be_bytes([b[34], b[35]]),
            proto: b[36],
        })
    }
}

fn v6_octets(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// A new flow the data plane saw (tag modes), with the real it chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowEvent {
    /// The flow.
    pub flow: FlowKey,
    /// The real's index.
    pub real: u32,
    /// The real's generation when chosen.
    pub generation: u32,
    /// The flow hash (outer source).
    pub hash: u32,
    /// The VIP's index.
    pub vip: u32,
}

impl FlowEvent {
    /// Bytes of `struct flow_event`.
    pub const LEN: usize = FlowKey::LEN + 16;

    /// Decodes an event record; `None` if it is malformed.
    pub fn from_bytes(b: &[u8]) -> Option<FlowEvent> {
        let word = |i: usize| -> Option<u32> { Some(u32::from_ne_bytes(b.get(i..i + 4)?.try_into().ok()?)) };
        let n = FlowKey::LEN;
        Some(FlowEvent {
            flow: FlowKey::from_bytes(b)?,
            real: word(n)?,
            generation: word(n + 4)?,
            hash: word(n + 8)?,
            vip: word(n + 12)?,
        })
    }

    /// The `struct flow_entry` a per-flow tag for this flow points at (same layout).
    fn entry_bytes(&self) -> [u8; FlowEvent::LEN] {
        let mut b = [0u8; FlowEvent::LEN];
        b[..FlowKey::LEN].copy_from_slice(&self.flow.to_bytes());
        for (i, w) in [self.real, self.generation, self.hash, self.vip].iter().enumerate() {
            b[FlowKey::LEN + 4 * i..FlowKey::LEN + 4 * i + 4].copy_from_slice(&w.to_ne_bytes());
        }
        b
    }
}

/// Packets and bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counter {
    /// Packets.
    pub packets: u64,
    /// Bytes (as received, before encapsulation).
    pub bytes: u64,
}

/// The global counters, in the program's `lb_global_stat` order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GlobalStat {
    /// Not IPv4/IPv6: to the stack.
    PassNonIp,
    /// IP but no VIP: to the stack.
    PassNonVip,
    /// Truncated or inconsistent headers: dropped.
    DropMalformed,
    /// IPv4 with options: dropped.
    DropIpOptions,
    /// Fragments: dropped.
    DropFragment,
    /// No real for the VIP's ring slot: dropped.
    DropNoReal,
    /// Encapsulation failed (headroom): dropped.
    DropEncap,
    /// Encapsulated and sent.
    Tx,
    /// Connection-table hits.
    ConnHit,
    /// Connection-table misses (ring lookups).
    ConnMiss,
    /// Echo requests answered.
    IcmpEcho,
    /// Too-big errors routed to the flow's real.
    IcmpTooBig,
    /// Connection entries for removed reals or idle UDP flows.
    ConnStale,
    /// New flows not recorded because of the rate guard.
    ConnRateLimited,
    /// Hints used.
    HintHit,
    /// Hints without a usable entry.
    HintMiss,
    /// Hints whose entry or tag was stale (real gone, wrong VIP, other flow).
    HintStale,
    /// New-flow events sent.
    Events,
    /// New-flow events lost (ring full).
    EventsLost,
}

impl GlobalStat {
    /// All, in map order.
    pub const ALL: [GlobalStat; 19] = [
        GlobalStat::PassNonIp,
        GlobalStat::PassNonVip,
        GlobalStat::DropMalformed,
        GlobalStat::DropIpOptions,
        GlobalStat::DropFragment,
        GlobalStat::DropNoReal,
        GlobalStat::DropEncap,
        GlobalStat::Tx,
        GlobalStat::ConnHit,
        GlobalStat::ConnMiss,
        GlobalStat::IcmpEcho,
        GlobalStat::IcmpTooBig,
        GlobalStat::ConnStale,
        GlobalStat::ConnRateLimited,
        GlobalStat::HintHit,
        GlobalStat::HintMiss,
        GlobalStat::HintStale,
        GlobalStat::Events,
        GlobalStat::EventsLost,
    ];

    /// A snake_case name for reports and metrics.
    pub fn name(self) -> &'static str {
        match self {
            GlobalStat::PassNonIp => "pass_non_ip",
            GlobalStat::PassNonVip => "pass_non_vip",
            GlobalStat::DropMalformed => "drop_malformed",
            GlobalStat::DropIpOptions => "drop_ip_options",
            GlobalStat::DropFragment => "drop_fragment",
            GlobalStat::DropNoReal => "drop_no_real",
            GlobalStat::DropEncap => "drop_encap",
            GlobalStat::Tx => "tx",
            GlobalStat::ConnHit => "conn_hit",
            GlobalStat::ConnMiss => "conn_miss",
            GlobalStat::IcmpEcho => "icmp_echo",
            GlobalStat::IcmpTooBig => "icmp_too_big",
            GlobalStat::ConnStale => "conn_stale",
            GlobalStat::ConnRateLimited => "conn_rate_limited",
            GlobalStat::HintHit => "hint_hit",
            GlobalStat::HintMiss => "hint_miss",
            GlobalStat::HintStale => "hint_stale",
            GlobalStat::Events => "events",
            GlobalStat::EventsLost => "events_lost",
        }
    }

    /// Its index in the counters.
    pub fn index(self) -> usize {
        GlobalStat::ALL.iter().position(|s| *s == self).unwrap_or(0)
    }
}

/// The loaded object: plain or device-bound build (same maps, same program name).
enum Skel {
    Plain(Box<balancer_skel::BalancerSkel<'static>>),
    Bound(Box<balancer_bound_skel::BalancerBoundSkel<'static>>),
}

/// Handles on the object's maps (shared by both builds).
struct Maps {
    vip_map: MapHandle,
    vip_addrs: MapHandle,
    ring_map: MapHandle,
    reals: MapHandle,
    lb_cfg: MapHandle,
    global_stats: MapHandle,
    vip_stats: MapHandle,
    real_stats: MapHandle,
    flow_tags: MapHandle,
    flow_events: MapHandle,
}

/// Opens one build's skeleton, sizes its maps, sets its constants, loads it and takes
/// handles on its maps.
macro_rules! load_build {
    ($builder:expr, $opts:expr) => {{
        let opts: &BalancerOptions = $opts;
        let s = &opts.sizes;
        let mut open = $builder.open(object_storage()).map_err(to_io)?;
        let m = &mut open.maps;
        m.vip_map.set_max_entries(s.max_vips).map_err(to_io)?;
        m.vip_addrs.set_max_entries(s.max_vips).map_err(to_io)?;
        m.vip_stats.set_max_entries(s.max_vips).map_err(to_io)?;
        m.ring_map.set_max_entries(s.max_vips * s.ring_size).map_err(to_io)?;
        m.reals.set_max_entries(s.max_reals).map_err(to_io)?;
        m.real_stats.set_max_entries(s.max_reals).map_err(to_io)?;
        m.conn_table.set_max_entries(s.conn_entries).map_err(to_io)?;
        m.flow_tags.set_max_entries(s.flow_tags).map_err(to_io)?;
        let cpus = libbpf_rs::num_possible_cpus().map_err(to_io)? as u32;
        let cache_entries = s.hint_cache.checked_mul(cpus).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} hint-cache slots x {cpus} CPUs overflows", s.hint_cache),
            )
        })?;
        m.hint_cache.set_max_entries(cache_entries).map_err(to_io)?;
        m.flow_events.set_max_entries(s.event_ring_bytes).map_err(to_io)?;
        let ro = m.rodata_data.as_deref_mut().ok_or_else(|| io::Error::other("balancer object has no .rodata"))?;
        ro.ring_size = s.ring_size;
        ro.hint_mode = opts.hint.code();
        ro.hint_cache_mask = s.hint_cache - 1;
        ro.hint_cache_cpus = cpus;
        ro.flow_tag_count = s.flow_tags;
        if let Some(ifindex) = opts.bind_ifindex {
            open.progs.balancer.set_ifindex(ifindex);
            open.progs.balancer.set_flags(BPF_F_XDP_DEV_BOUND_ONLY);
        }
        let skel = open.load().map_err(to_io)?;
        let maps = Maps {
            vip_map: MapHandle::try_from(&skel.maps.vip_map).map_err(to_io)?,
            vip_addrs: MapHandle::try_from(&skel.maps.vip_addrs).map_err(to_io)?,
            ring_map: MapHandle::try_from(&skel.maps.ring_map).map_err(to_io)?,
            reals: MapHandle::try_from(&skel.maps.reals).map_err(to_io)?,
            lb_cfg: MapHandle::try_from(&skel.maps.lb_cfg).map_err(to_io)?,
            global_stats: MapHandle::try_from(&skel.maps.global_stats).map_err(to_io)?,
            vip_stats: MapHandle::try_from(&skel.maps.vip_stats).map_err(to_io)?,
            real_stats: MapHandle::try_from(&skel.maps.real_stats).map_err(to_io)?,
            flow_tags: MapHandle::try_from(&skel.maps.flow_tags).map_err(to_io)?,
            flow_events: MapHandle::try_from(&skel.maps.flow_events).map_err(to_io)?,
        };
        (Box::new(skel), maps)
    }};
}

/// The balancer program, loaded, with its maps.
pub struct Balancer {
    skel: Skel,
    maps: Maps,
    opts: BalancerOptions,
}

impl std::fmt::Debug for Balancer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Balancer").field("opts", &self.opts).finish_non_exhaustive()
    }
}

/// An address as the data plane stores it: the packet's bytes in host-order words
/// (IPv4 in the first word), and its family.
fn addr_words(a: IpAddr) -> ([u32; 4], u8) {
    let mut w = [0u32; 4];
    match a {
        IpAddr::V4(v4) => {
            w[0] = u32::from_ne_bytes(v4.octets());
            (w, FAM_V4)
        }
        IpAddr::V6(v6) => {
            for (i, c) in v6.octets().chunks_exact(4).enumerate() {
                w[i] = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
            }
            (w, FAM_V6)
        }
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

impl Balancer {
    /// Opens the build `opts` asks for, sizes its maps, sets its constants and loads
    /// it; every ring slot starts empty.
    pub fn load(opts: &BalancerOptions) -> io::Result<Balancer> {
        opts.sizes.check()?;
        let (skel, maps) = match opts.bind_ifindex {
            None => {
                let (s, m) = load_build!(balancer_skel::BalancerSkelBuilder::default(), opts);
                (Skel::Plain(s), m)
            }
            Some(_) => {
                let (s, m) = load_build!(balancer_bound_skel::BalancerBoundSkelBuilder::default(), opts);
                (Skel::Bound(s), m)
            }
        };
        let b = Balancer { skel, maps, opts: *opts };
        let empty = vec![u32::MAX; opts.sizes.ring_size as usize];
        for v in 0..opts.sizes.max_vips {
            b.set_ring(v, &empty)?;
        }
        Ok(b)
    }

    /// The program, for test runs (the plain build only: the kernel refuses to
    /// test-run device-bound programs).
    pub fn program(&self) -> io::Result<&libbpf_rs::ProgramMut<'static>> {
        match &self.skel {
            Skel::Plain(s) => Ok(&s.progs.balancer),
            Skel::Bound(_) => Err(invalid("a device-bound program cannot be test-run".into())),
        }
    }

    /// The program's fd (to attach it).
    pub fn program_fd(&self) -> BorrowedFd<'_> {
        match &self.skel {
            Skel::Plain(s) => s.progs.balancer.as_fd(),
            Skel::Bound(s) => s.progs.balancer.as_fd(),
        }
    }

    /// How it was loaded.
    pub fn options(&self) -> BalancerOptions {
        self.opts
    }

    /// Sets the outer addresses and limits.
    pub fn set_config(&self, c: &DataPlaneConfig) -> io::Result<()> {
        let cfg = balancer_skel::types::lb_config {
            gw_mac: c.gw_mac,
            own_mac: c.own_mac,
            src4: addr_words(c.src4.into()).0[0],
            src6: addr_words(c.src6.into()).0,
            max_new_conns: c.max_new_conns_per_cpu,
            udp_timeout_ms: c.udp_timeout_ms,
        };
        self.maps.lb_cfg.update(&0u32.to_ne_bytes(), pod_bytes(&cfg), MapFlags::ANY).map_err(to_io)
    }

    fn vip_key(addr: IpAddr, port: u16, proto: u8) -> balancer_skel::types::vip_key {
        let (w, family) = addr_words(addr);
        balancer_skel::types::vip_key { addr: w, port: u16::from_ne_bytes(port.to_be_bytes()), proto, family }
    }

    /// Adds or updates a VIP (port 0 = any port) using ring `index`; `no_lru` makes
    /// it stateless (pure consistent hashing).
    pub fn set_vip(&self, addr: IpAddr, port: u16, proto: u8, index: u32, no_lru: bool) -> io::Result<()> {
        if index >= self.opts.sizes.max_vips {
            return Err(invalid(format!("VIP index {index} >= {}", self.opts.sizes.max_vips)));
        }
        let key = Self::vip_key(addr, port, proto);
        let meta = balancer_skel::types::vip_meta { index, flags: u32::from(no_lru) };
        self.maps.vip_map.update(pod_bytes(&key), pod_bytes(&meta), MapFlags::ANY).map_err(to_io)
    }

    /// Marks `addr` as a VIP address (answered to ICMP echo) or not. The control plane
    /// keeps it set while any VIP uses the address.
    pub fn set_vip_address(&self, addr: IpAddr, present: bool) -> io::Result<()> {
        let (w, family) = addr_words(addr);
        let key = balancer_skel::types::vip_addr { addr: w, family, pad: [0; 3] };
        if present {
            self.maps.vip_addrs.update(pod_bytes(&key), &1u32.to_ne_bytes(), MapFlags::ANY).map_err(to_io)
        } else {
            delete_if_present(&self.maps.vip_addrs, pod_bytes(&key))
        }
    }

    /// Removes a VIP.
    pub fn remove_vip(&self, addr: IpAddr, port: u16, proto: u8) -> io::Result<()> {
        delete_if_present(&self.maps.vip_map, pod_bytes(&Self::vip_key(addr, port, proto)))
    }

    /// Writes VIP `index`'s ring (`ring_size` real indexes, `u32::MAX` = none) in one
    /// batch update.
    pub fn set_ring(&self, index: u32, ring: &[u32]) -> io::Result<()> {
        let size = self.opts.sizes.ring_size;
        if ring.len() != size as usize || index >= self.opts.sizes.max_vips {
            return Err(invalid(format!(
                "ring of {} slots for VIP index {index} (want {size} slots, index < {})",
                ring.len(),
                self.opts.sizes.max_vips
            )));
        }
        let base = index * size;
        let keys: Vec<u8> = (0..size).flat_map(|i| (base + i).to_ne_bytes()).collect();
        let values: Vec<u8> = ring.iter().flat_map(|r| r.to_ne_bytes()).collect();
        self.maps.ring_map.update_batch(&keys, &values, size, MapFlags::ANY, MapFlags::ANY).map_err(to_io)
    }

    fn check_real(&self, index: u32) -> io::Result<()> {
        if index >= self.opts.sizes.max_reals {
            return Err(invalid(format!("real index {index} >= {}", self.opts.sizes.max_reals)));
        }
        Ok(())
    }

    /// Sets real `index`: its address, the VIP it serves and its generation (which
    /// must change whenever the index is given to another real or VIP).
    pub fn set_real(&self, index: u32, addr: IpAddr, vip: u32, generation: u32) -> io::Result<()> {
        self.check_real(index)?;
        let (w, family) = addr_words(addr);
        let real = balancer_skel::types::real_def { addr: w, family, pad: [0; 3], vip, generation };
        self.maps.reals.update(&index.to_ne_bytes(), pod_bytes(&real), MapFlags::ANY).map_err(to_io)
    }

    /// Removes real `index`: nothing is sent to it any more, and state naming it (the
    /// connection table, flow cache, tags) goes stale. `generation` must differ from the
    /// generation it had.
    pub fn clear_real(&self, index: u32, generation: u32) -> io::Result<()> {
        self.check_real(index)?;
        let real = balancer_skel::types::real_def { addr: [0; 4], family: 0, pad: [0; 3], vip: u32::MAX, generation };
        self.maps.reals.update(&index.to_ne_bytes(), pod_bytes(&real), MapFlags::ANY).map_err(to_io)
    }

    /// Installs per-flow tag `id` for the flow (and real) of `event`.
    pub fn set_flow_tag(&self, id: u32, event: &FlowEvent) -> io::Result<()> {
        if id >= self.opts.sizes.flow_tags {
            return Err(invalid(format!("tag id {id} >= {}", self.opts.sizes.flow_tags)));
        }
        self.maps.flow_tags.update(&id.to_ne_bytes(), &event.entry_bytes(), MapFlags::ANY).map_err(to_io)
    }

    /// Installs many per-flow tags in one batch update.
    pub fn set_flow_tags(&self, tags: &[(u32, FlowEvent)]) -> io::Result<()> {
        if tags.is_empty() {
            return Ok(());
        }
        if let Some((id, _)) = tags.iter().find(|(id, _)| *id >= self.opts.sizes.flow_tags) {
            return Err(invalid(format!("tag id {id} >= {}", self.opts.sizes.flow_tags)));
        }
        let keys: Vec<u8> = tags.iter().flat_map(|(id, _)| id.to_ne_bytes()).collect();
        let values: Vec<u8> = tags.iter().flat_map(|(_, e)| e.entry_bytes()).collect();
        self.maps.flow_tags.update_batch(&keys, &values, tags.len() as u32, MapFlags::ANY, MapFlags::ANY).map_err(to_io)
    }

    /// The global counters, summed over CPUs, in [`GlobalStat::ALL`] order.
    pub fn global_stats(&self) -> io::Result<Vec<u64>> {
        let map = &self.maps.global_stats;
        (0..map.max_entries()).map(|i| percpu_sum(map, i)).collect()
    }

    fn counter(map: &MapHandle, index: u32) -> io::Result<Counter> {
        let per_cpu = map.lookup_percpu(&index.to_ne_bytes(), MapFlags::ANY).map_err(to_io)?.unwrap_or_default();
        let word =
            |v: &[u8], i: usize| v.get(i..i + 8).map_or(0, |b| u64::from_ne_bytes(b.try_into().unwrap_or([0; 8])));
        Ok(per_cpu
            .iter()
            .fold(Counter::default(), |c, v| Counter { packets: c.packets + word(v, 0), bytes: c.bytes + word(v, 8) }))
    }

    /// VIP `index`'s forwarded packets and bytes, summed over CPUs.
    pub fn vip_counter(&self, index: u32) -> io::Result<Counter> {
        Self::counter(&self.maps.vip_stats, index)
    }

    /// Real `index`'s forwarded packets and bytes, summed over CPUs.
    pub fn real_counter(&self, index: u32) -> io::Result<Counter> {
        Self::counter(&self.maps.real_stats, index)
    }

    /// A reader of the new-flow events (tag modes).
    pub fn events(&self) -> io::Result<FlowEvents<'_>> {
        let queue: Rc<RefCell<VecDeque<FlowEvent>>> = Rc::default();
        let bad: Rc<RefCell<u64>> = Rc::default();
        let (q, b) = (queue.clone(), bad.clone());
        let mut builder = libbpf_rs::RingBufferBuilder::new();
        builder
            .add(&self.maps.flow_events, move |rec: &[u8]| {
                match FlowEvent::from_bytes(rec) {
                    Some(e) => q.borrow_mut().push_back(e),
                    None => *b.borrow_mut() += 1,
                }
                0
            })
            .map_err(to_io)?;
        Ok(FlowEvents { ring: builder.build().map_err(to_io)?, queue, malformed: bad })
    }
}

fn delete_if_present(map: &MapHandle, key: &[u8]) -> io::Result<()> {
    match map.delete(key) {
        Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(()),
        r => r.map_err(to_io),
    }
}

/// New-flow events from the data plane's ring buffer.
pub struct FlowEvents<'a> {
    ring: libbpf_rs::RingBuffer<'a>,
    queue: Rc<RefCell<VecDeque<FlowEvent>>>,
    malformed: Rc<RefCell<u64>>,
}

impl std::fmt::Debug for FlowEvents<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlowEvents").field("queued", &self.queue.borrow().len()).finish_non_exhaustive()
    }
}

impl FlowEvents<'_> {
    /// Waits up to `timeout` for events and returns all that are ready.
    pub fn poll(&mut self, timeout: Duration) -> io::Result<Vec<FlowEvent>> {
        self.ring.poll(timeout).map_err(to_io)?;
        Ok(self.queue.borrow_mut().drain(..).collect())
    }

    /// Returns the events that are ready without waiting.
    pub fn drain(&mut self) -> io::Result<Vec<FlowEvent>> {
        self.ring.consume().map_err(to_io)?;
        Ok(self.queue.borrow_mut().drain(..).collect())
    }

    /// Records too short to be events (never expected; counted, not fatal).
    pub fn malformed(&self) -> u64 {
        *self.malformed.borrow()
    }
}

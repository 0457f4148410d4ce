//! The data layout shared with `bpf/lb/` (`lb_structs.h`, `lb_consts.h`): the map key
//! and value types come from the object's BTF (libbpf-cargo skeleton types, never
//! hand-copied); this module adds what Rust needs around them: sizes checked at compile
//! time, the hint encodings, the counters' order, and keys built from addresses.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::super::balancer_skel;

/// The generated map types used here are plain old data: `repr(C)`, every bit pattern
/// valid, no padding (checked by the size assertions below).
pub(super) trait Pod: Copy {}
impl Pod for balancer_skel::types::vip_key {}
impl Pod for balancer_skel::types::vip_meta {}
impl Pod for balancer_skel::types::real_def {}
impl Pod for balancer_skel::types::lb_config {}
impl Pod for balancer_skel::types::vip_addr {}
impl Pod for balancer_skel::types::flow_key {}
impl Pod for balancer_skel::types::flow_entry {}
const _: () = assert!(std::mem::size_of::<balancer_skel::types::vip_key>() == 20);
const _: () = assert!(std::mem::size_of::<balancer_skel::types::vip_meta>() == 8);
const _: () = assert!(std::mem::size_of::<balancer_skel::types::real_def>() == 28);
const _: () = assert!(std::mem::size_of::<balancer_skel::types::lb_config>() == 40);
const _: () = assert!(std::mem::size_of::<balancer_skel::types::vip_addr>() == 20);
const _: () = assert!(std::mem::size_of::<balancer_skel::types::flow_key>() == FlowKey::LEN);
const _: () = assert!(std::mem::size_of::<balancer_skel::types::flow_entry>() == FlowKey::LEN + 16);

pub(super) fn pod_bytes<T: Pod>(v: &T) -> &[u8] {
    // SAFETY: `T: Pod` is a repr(C) struct without padding (sizes asserted above), so all
    // of its size_of::<T>() bytes are initialised; the slice borrows `v`.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}

/// A `T` read from the start of `b` (any alignment); `None` when `b` is too short.
pub(super) fn pod_read<T: Pod>(b: &[u8]) -> Option<T> {
    let bytes = b.get(..std::mem::size_of::<T>())?;
    // SAFETY: `bytes` holds size_of::<T>() initialised bytes, and every bit pattern is a
    // valid `T` (`T: Pod`); read_unaligned copies without an alignment requirement.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// `BPF_F_XDP_DEV_BOUND_ONLY` (Linux 6.3; not in the 6.1 headers this builds with).
pub(super) const BPF_F_XDP_DEV_BOUND_ONLY: u32 = 1 << 6;

/// Codes shared with the data plane (hint modes, tag kinds, families), generated from
/// `lb_consts.h`.
mod defines {
    include!(concat!(env!("OUT_DIR"), "/lb_defines.rs"));
}
pub use defines::TAG_VALUES;
const _: () = assert!(TAG_VALUES == 1 << defines::TAG_VALUE_BITS);

/// The secret a balancer's tags are keyed with: a tag is its value (a per-flow tag id
/// or a real's index, below [`TAG_VALUES`]) with check bits above it that only the
/// holder of the key can compute, so a NIC's RSS hash (which has the same width and
/// whose tuples an attacker may choose) is not read as a tag.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TagKey(u32);

impl std::fmt::Debug for TagKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TagKey(..)")
    }
}

impl TagKey {
    /// A key from the kernel's random source.
    pub fn random() -> io::Result<TagKey> {
        let mut b = [0u8; 4];
        std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut b)?;
        Ok(TagKey(u32::from_ne_bytes(b)))
    }

    /// A fixed key (tests).
    pub fn from_raw(key: u32) -> TagKey {
        TagKey(key)
    }

    pub(super) fn raw(self) -> u32 {
        self.0
    }

    /// `tag_check` in lb_hint.h: murmur3's finaliser over value, kind and key; the top
    /// 32 - TAG_VALUE_BITS bits.
    fn check(self, value: u32, kind: u32) -> u32 {
        let mut h = (value | (kind << defines::TAG_VALUE_BITS)) ^ self.0;
        h ^= h >> 16;
        h = h.wrapping_mul(0x85eb_ca6b);
        h ^= h >> 13;
        h = h.wrapping_mul(0xc2b2_ae35);
        h ^= h >> 16;
        h >> defines::TAG_VALUE_BITS
    }

    fn tag(self, value: u32, kind: u32) -> u32 {
        let value = value & (TAG_VALUES - 1);
        (self.check(value, kind) << defines::TAG_VALUE_BITS) | value
    }

    /// The hint value that names per-flow tag `id` (< [`TAG_VALUES`]).
    pub fn flow_tag(self, id: u32) -> u32 {
        self.tag(id, defines::TAG_KIND_FLOW)
    }

    /// The hint value that names real `index` (< [`TAG_VALUES`]) as the destination.
    pub fn dest_tag(self, index: u32) -> u32 {
        self.tag(index, defines::TAG_KIND_DEST)
    }
}

/// Family tags used in keys and reals.
pub(super) const FAM_V4: u8 = defines::FAM_V4 as u8;
pub(super) const FAM_V6: u8 = defines::FAM_V6 as u8;
const _: () = assert!(defines::FAM_V4 == FAM_V4 as u32 && defines::FAM_V6 == FAM_V6 as u32);

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
    /// Per-destination tags that skip parsing the transport header: an L3 check (the
    /// real's VIP has the packet's address and protocol), the ports read for the outer
    /// header's hash, and straight to encapsulation. The VIP's port is not checked, so
    /// the classifier must match it.
    DestTagDirect,
}

impl HintMode {
    /// The value the program's `hint_mode` takes.
    pub(super) fn code(self) -> u32 {
        match self {
            HintMode::Off => defines::HINT_OFF,
            HintMode::RxHash => defines::HINT_RX_HASH,
            HintMode::FlowTag => defines::HINT_FLOW_TAG,
            HintMode::DestTag | HintMode::DestTagDirect => defines::HINT_DEST_TAG,
        }
    }

    /// Every mode, in [`HintMode::name`]'s order.
    pub const ALL: [HintMode; 5] =
        [HintMode::Off, HintMode::RxHash, HintMode::FlowTag, HintMode::DestTag, HintMode::DestTagDirect];

    /// "off", "rx-hash", "flow-tag", "dest-tag", "dest-tag-direct".
    pub fn name(self) -> &'static str {
        match self {
            HintMode::Off => "off",
            HintMode::RxHash => "rx-hash",
            HintMode::FlowTag => "flow-tag",
            HintMode::DestTag => "dest-tag",
            HintMode::DestTagDirect => "dest-tag-direct",
        }
    }

    /// Parses a name as [`HintMode::name`] prints it.
    pub fn from_name(s: &str) -> Option<HintMode> {
        HintMode::ALL.into_iter().find(|m| m.name() == s)
    }

    /// The names, comma separated (for messages).
    pub fn names() -> String {
        HintMode::ALL.map(HintMode::name).join(", ")
    }

    /// Whether the classifier tags flows (per flow or per destination) from the
    /// balancer's new-flow events.
    pub fn tags(self) -> bool {
        matches!(self, HintMode::FlowTag | HintMode::DestTag | HintMode::DestTagDirect)
    }

    /// Whether a tag names the real (per destination) rather than a flow entry.
    pub fn names_real(self) -> bool {
        matches!(self, HintMode::DestTag | HintMode::DestTagDirect)
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
    /// Per-flow tag ids (0..flow_tags, at most [`TAG_VALUES`]).
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

    /// Kernel memory the maps of these sizes take on this machine (per-CPU maps have a
    /// value per possible CPU), by map, in bytes: LRU hashes and arrays are allocated
    /// whole when loaded.
    pub fn kernel_bytes(&self) -> io::Result<Vec<(&'static str, u64)>> {
        use balancer_skel::types::{conn_val, flow_entry, flow_key, lb_counter, real_def};
        use std::mem::size_of;
        let cpus = libbpf_rs::num_possible_cpus().map_err(super::super::to_io)? as u32;
        let size = |n: u32, each: usize| u64::from(n) * each as u64;
        // Arrays keep each value in a slot rounded up to 8 bytes.
        let array = |n: u32, each: usize| size(n, each.next_multiple_of(8));
        let per_cpu = |n: u32, each: usize| array(n, each) * u64::from(cpus);
        // A hash element carries about 48 bytes of the kernel's own beside its key and
        // value, and the table a 16-byte bucket per entry rounded up to a power of two.
        let hashed = |n: u32, key: usize, value: usize| {
            size(n, 48 + key.next_multiple_of(8) + value.next_multiple_of(8)) + 16 * u64::from(n.next_power_of_two())
        };
        Ok(vec![
            ("rings", array(self.max_vips, 4) * u64::from(self.ring_size)),
            ("connection table", hashed(self.conn_entries, size_of::<flow_key>(), size_of::<conn_val>())),
            ("reals", array(self.max_reals, size_of::<real_def>()) + per_cpu(self.max_reals, size_of::<lb_counter>())),
            ("hint cache", per_cpu(self.hint_cache, size_of::<flow_entry>())),
            ("flow tags", array(self.flow_tags, size_of::<flow_entry>())),
            ("event ring", u64::from(self.event_ring_bytes)),
        ])
    }

    pub(super) fn check(&self) -> io::Result<()> {
        let bad = |m: String| Err(io::Error::new(io::ErrorKind::InvalidInput, m));
        if self.max_vips == 0 || self.max_reals == 0 || self.ring_size == 0 || self.conn_entries == 0 {
            return bad(format!("balancer sizes must be positive: {self:?}"));
        }
        if self.max_reals > TAG_VALUES {
            return bad(format!(
                "at most {TAG_VALUES} reals (what a destination tag can name), not {}",
                self.max_reals
            ));
        }
        if self.flow_tags == 0 || self.flow_tags > TAG_VALUES {
            return bad(format!("flow tags must be 1..={TAG_VALUES}, not {}", self.flow_tags));
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

    /// The key as the data plane stores it (the generated `struct flow_key`).
    pub(super) fn to_raw(self) -> balancer_skel::types::flow_key {
        let (src, dst, family) = match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => (addr_words(s.into()).0, addr_words(d.into()).0, FAM_V4),
            (s, d) => (addr_words(IpAddr::V6(v6_addr(s))).0, addr_words(IpAddr::V6(v6_addr(d))).0, FAM_V6),
        };
        balancer_skel::types::flow_key {
            src,
            dst,
            sport: self.sport.to_be(),
            dport: self.dport.to_be(),
            proto: self.proto,
            family,
            pad: [0; 2],
        }
    }

    /// Reads a key back; `None` for an unknown family.
    pub(super) fn from_raw(k: &balancer_skel::types::flow_key) -> Option<FlowKey> {
        let addr = |w: &[u32; 4]| -> Option<IpAddr> {
            let mut b = [0u8; 16];
            for (chunk, word) in b.chunks_exact_mut(4).zip(w) {
                chunk.copy_from_slice(&word.to_ne_bytes());
            }
            match k.family {
                FAM_V4 => Some(IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]))),
                FAM_V6 => Some(IpAddr::V6(Ipv6Addr::from(b))),
                _ => None,
            }
        };
        Some(FlowKey {
            src: addr(&k.src)?,
            dst: addr(&k.dst)?,
            sport: u16::from_be(k.sport),
            dport: u16::from_be(k.dport),
            proto: k.proto,
        })
    }

    /// The key's bytes as the data plane stores them.
    pub fn to_bytes(&self) -> [u8; FlowKey::LEN] {
        let mut b = [0u8; FlowKey::LEN];
        b.copy_from_slice(pod_bytes(&self.to_raw()));
        b
    }

    /// Reads a key back; `None` for an unknown family or a short buffer.
    pub fn from_bytes(b: &[u8]) -> Option<FlowKey> {
        FlowKey::from_raw(&pod_read::<balancer_skel::types::flow_key>(b)?)
    }
}

fn v6_addr(a: IpAddr) -> Ipv6Addr {
    match a {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
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

    /// Decodes an event record; `None` if it is malformed. `struct flow_event` has
    /// `struct flow_entry`'s layout (lb_structs.h asserts it at compile time), and the
    /// generated `flow_entry` is what is read.
    pub fn from_bytes(b: &[u8]) -> Option<FlowEvent> {
        let e = pod_read::<balancer_skel::types::flow_entry>(b)?;
        Some(FlowEvent {
            flow: FlowKey::from_raw(&e.flow)?,
            real: e.real,
            generation: e.generation,
            hash: e.hash,
            vip: e.vip,
        })
    }

    /// The `struct flow_entry` a per-flow tag for this flow points at.
    pub(super) fn entry_bytes(&self) -> [u8; FlowEvent::LEN] {
        let e = balancer_skel::types::flow_entry {
            flow: self.flow.to_raw(),
            real: self.real,
            generation: self.generation,
            hash: self.hash,
            vip: self.vip,
        };
        let mut b = [0u8; FlowEvent::LEN];
        b.copy_from_slice(pod_bytes(&e));
        b
    }
}

/// One write to the reals map (see [`super::Balancer::write_reals`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RealWrite {
    /// Real `index` is `address`, serving VIP `vip`, at `generation`.
    Set {
        /// Real index.
        index: u32,
        /// Where to encapsulate to.
        address: IpAddr,
        /// Its VIP's index.
        vip: u32,
        /// Its generation.
        generation: u32,
    },
    /// Real `index` is gone, at `generation`.
    Clear {
        /// Real index.
        index: u32,
        /// Its new generation.
        generation: u32,
    },
}

/// Packets and bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counter {
    /// Packets.
    pub packets: u64,
    /// Bytes (as received, before encapsulation).
    pub bytes: u64,
}

include!(concat!(env!("OUT_DIR"), "/global_stats.rs"));

impl GlobalStat {
    /// Its index in the counters.
    pub fn index(self) -> usize {
        GlobalStat::ALL.iter().position(|s| *s == self).unwrap_or(0)
    }
}

/// An address as the data plane stores it: the packet's bytes in host-order words
/// (IPv4 in the first word), and its family.
pub(super) fn addr_words(a: IpAddr) -> ([u32; 4], u8) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flow_keys_and_events_have_the_data_plane_s_bytes_and_come_back() {
        let k = FlowKey {
            src: "10.1.2.3".parse().unwrap(),
            dst: "192.0.2.9".parse().unwrap(),
            sport: 0x1234,
            dport: 80,
            proto: 6,
        };
        let b = k.to_bytes();
        // struct flow_key: src[4] at 0, dst[4] at 16 (packet byte order), ports in
        // network order at 32 and 34, proto at 36, family at 37, padding.
        assert_eq!(&b[0..4], &[10, 1, 2, 3]);
        assert_eq!(&b[16..20], &[192, 0, 2, 9]);
        assert_eq!(&b[32..38], &[0x12, 0x34, 0, 80, 6, 4]);
        assert!(b[4..16].iter().chain(&b[20..32]).chain(&b[38..]).all(|&x| x == 0));
        assert_eq!(FlowKey::from_bytes(&b), Some(k));
        let k6 = FlowKey { src: "2001:db8::1".parse().unwrap(), dst: "2001:db8::2".parse().unwrap(), ..k };
        let b6 = k6.to_bytes();
        assert_eq!(&b6[0..4], &[0x20, 0x01, 0x0d, 0xb8]);
        assert_eq!((b6[31], b6[37]), (2, 6));
        assert_eq!(FlowKey::from_bytes(&b6), Some(k6));
        let e = FlowEvent { flow: k6, real: 7, generation: 3, hash: 0xdead_beef, vip: 2 };
        let eb = e.entry_bytes();
        assert_eq!(&eb[40..44], &7u32.to_ne_bytes());
        assert_eq!(&eb[52..56], &2u32.to_ne_bytes());
        assert_eq!(FlowEvent::from_bytes(&eb), Some(e));
        assert_eq!(FlowEvent::from_bytes(&eb[..FlowEvent::LEN - 1]), None, "short");
        let mut bad = b;
        bad[37] = 5;
        assert_eq!(FlowKey::from_bytes(&bad), None, "unknown family");
    }
}

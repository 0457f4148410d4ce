//! The netdev generic-netlink family (Linux 6.8+): a device's queues, the NAPI
//! instances that serve them and the kernel threads that run those, and per-NAPI
//! settings (`napi-set`, Linux 6.13+). The lab places threaded NAPI on chosen CPUs
//! like a NIC's interrupt affinity; lanes map queues to worker threads with it.
//!
//! Attribute and command numbers are `include/uapi/linux/netdev.h`'s (generated from
//! `Documentation/netlink/specs/netdev.yaml`).

use std::fmt;

use serde::{Deserialize, Serialize};

use super::genl::{Attr, Family, GenlSocket, attr_u32, attr_uint, attrs};
use super::netlink::NetlinkError;

const NETDEV_CMD_DEV_GET: u8 = 1;
const NETDEV_CMD_QUEUE_GET: u8 = 10;
const NETDEV_CMD_NAPI_GET: u8 = 11;
const NETDEV_CMD_NAPI_SET: u8 = 14;

const NETDEV_A_DEV_IFINDEX: u16 = 1;
const NETDEV_A_DEV_XDP_FEATURES: u16 = 3;
const NETDEV_A_DEV_XDP_ZC_MAX_SEGS: u16 = 4;
const NETDEV_A_DEV_XDP_RX_METADATA_FEATURES: u16 = 5;

/// `enum netdev_xdp_act`, bit by bit.
const XDP_ACTIONS: [(u64, &str); 7] = [
    (1, "basic"),
    (2, "redirect"),
    (4, "ndo-xmit"),
    (8, "xsk-zerocopy"),
    (16, "hw-offload"),
    (32, "rx-sg"),
    (64, "ndo-xmit-sg"),
];

/// `enum netdev_xdp_rx_metadata`, bit by bit.
const XDP_RX_METADATA: [(u64, &str); 3] = [(1, "timestamp"), (2, "hash"), (4, "vlan-tag")];

const NETDEV_A_NAPI_IFINDEX: u16 = 1;
const NETDEV_A_NAPI_ID: u16 = 2;
const NETDEV_A_NAPI_IRQ: u16 = 3;
const NETDEV_A_NAPI_PID: u16 = 4;
const NETDEV_A_NAPI_DEFER_HARD_IRQS: u16 = 5;
const NETDEV_A_NAPI_GRO_FLUSH_TIMEOUT: u16 = 6;
const NETDEV_A_NAPI_IRQ_SUSPEND_TIMEOUT: u16 = 7;
const NETDEV_A_NAPI_THREADED: u16 = 8;

const NETDEV_A_QUEUE_ID: u16 = 1;
const NETDEV_A_QUEUE_IFINDEX: u16 = 2;
const NETDEV_A_QUEUE_TYPE: u16 = 3;
const NETDEV_A_QUEUE_NAPI_ID: u16 = 4;

const NETDEV_QUEUE_TYPE_RX: u32 = 0;
const NETDEV_QUEUE_TYPE_TX: u32 = 1;

#[derive(Debug, Clone)]
struct NetdevFamily;

impl Family for NetdevFamily {
    const NAME: &'static str = "netdev";
    const VERSION: u8 = 1;
}

/// One NAPI instance of a device, with the settings the kernel reports for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Napi {
    /// The NAPI id (what SO_INCOMING_NAPI_ID reports).
    pub id: u32,
    /// The kernel thread running it, when NAPI is threaded.
    pub pid: Option<u32>,
    /// Its interrupt, when it has one (veth has none).
    pub irq: Option<u32>,
    /// Empty polls before interrupts are re-enabled (6.13+).
    pub defer_hard_irqs: Option<u32>,
    /// GRO flush / watchdog timeout, ns (6.13+).
    pub gro_flush_timeout_ns: Option<u64>,
    /// How long interrupts stay suspended while the application finds events, ns (6.13+).
    pub irq_suspend_timeout_ns: Option<u64>,
    /// How it is polled, where the kernel says (6.17+).
    pub threaded: Option<NapiThreaded>,
}

/// How a NAPI instance is polled: in softirq context, by a kernel thread of its own, or
/// by that thread busy polling without sleeping (netdev netlink's `napi-threaded`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NapiThreaded {
    /// In softirq context.
    Disabled,
    /// By its kernel thread, woken by the device.
    Enabled,
    /// By its kernel thread, polling without sleeping.
    BusyPoll,
}

impl NapiThreaded {
    fn code(self) -> u32 {
        match self {
            NapiThreaded::Disabled => 0,
            NapiThreaded::Enabled => 1,
            NapiThreaded::BusyPoll => 2,
        }
    }

    fn from_code(c: u32) -> Option<NapiThreaded> {
        [NapiThreaded::Disabled, NapiThreaded::Enabled, NapiThreaded::BusyPoll].into_iter().find(|t| t.code() == c)
    }
}

/// Which way a queue carries packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueKind {
    /// Receive.
    Rx,
    /// Transmit.
    Tx,
}

/// One queue of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Queue {
    /// The queue's index among the device's queues of its kind.
    pub id: u32,
    /// Receive or transmit.
    pub kind: QueueKind,
    /// The NAPI instance serving it (none while the device is down or has no NAPI).
    pub napi_id: Option<u32>,
}

/// What a device's driver does for XDP, as `dev-get` reports it (Linux 6.3+; the
/// receive metadata 6.8+).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct XdpFeatures {
    /// XDP actions and abilities: `basic`, `redirect`, `ndo-xmit`, `xsk-zerocopy`
    /// (AF_XDP zero-copy), `hw-offload`, `rx-sg`, `ndo-xmit-sg`; empty: native XDP is
    /// not supported (generic XDP still is).
    pub actions: Vec<String>,
    /// Receive metadata an XDP program can read from the NIC: `timestamp`, `hash`,
    /// `vlan-tag`.
    pub rx_metadata: Vec<String>,
    /// Most fragments of a zero-copy AF_XDP frame.
    pub zc_max_segs: Option<u32>,
}

/// The names of the bits of `mask` that `table` knows, and `bit N` for the others.
fn bit_names(mask: u64, table: &[(u64, &str)]) -> Vec<String> {
    (0..64)
        .map(|b| 1u64 << b)
        .filter(|bit| mask & bit != 0)
        .map(|bit| {
            table
                .iter()
                .find(|(v, _)| *v == bit)
                .map_or(format!("bit {}", bit.trailing_zeros()), |(_, n)| n.to_string())
        })
        .collect()
}

/// Per-NAPI settings to write with `napi-set`; `None` leaves one as it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NapiSettings {
    /// Empty polls before interrupts are re-enabled.
    pub defer_hard_irqs: Option<u32>,
    /// GRO flush / watchdog timeout, ns.
    pub gro_flush_timeout_ns: Option<u64>,
    /// IRQ suspension timeout, ns.
    pub irq_suspend_timeout_ns: Option<u64>,
}

impl NapiSettings {
    /// Whether it sets nothing.
    pub fn is_empty(&self) -> bool {
        *self == NapiSettings::default()
    }
}

/// A netdev-netlink socket in the namespace it was opened in.
pub struct Netdev {
    sock: GenlSocket<NetdevFamily>,
}

impl fmt::Debug for Netdev {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Netdev").finish_non_exhaustive()
    }
}

impl Netdev {
    /// Opens the socket.
    pub fn open() -> Result<Self, NetlinkError> {
        Ok(Self {
            sock: GenlSocket::open("the kernel has no netdev netlink family (needs Linux 6.8+ for NAPI queries)")?,
        })
    }

    /// The NAPI instances of interface `ifindex`.
    pub fn napis(&mut self, ifindex: u32) -> Result<Vec<Napi>, NetlinkError> {
        let op = format!("list NAPI instances of interface {ifindex}");
        let replies =
            self.sock.call(&op, NETDEV_CMD_NAPI_GET, vec![Attr::U32(NETDEV_A_NAPI_IFINDEX, ifindex)], true)?;
        Ok(replies.iter().filter_map(|raw| parse_napi(raw, ifindex)).collect())
    }

    /// What interface `ifindex`'s driver does for XDP.
    pub fn xdp_features(&mut self, ifindex: u32) -> Result<XdpFeatures, NetlinkError> {
        let op = format!("read the XDP features of interface {ifindex}");
        let replies = self.sock.call(&op, NETDEV_CMD_DEV_GET, vec![Attr::U32(NETDEV_A_DEV_IFINDEX, ifindex)], false)?;
        let mut f = XdpFeatures::default();
        for raw in &replies {
            for (kind, v) in attrs(raw) {
                match kind {
                    NETDEV_A_DEV_XDP_FEATURES => f.actions = bit_names(attr_uint(v).unwrap_or(0), &XDP_ACTIONS),
                    NETDEV_A_DEV_XDP_RX_METADATA_FEATURES => {
                        f.rx_metadata = bit_names(attr_uint(v).unwrap_or(0), &XDP_RX_METADATA)
                    }
                    NETDEV_A_DEV_XDP_ZC_MAX_SEGS => f.zc_max_segs = attr_u32(v),
                    _ => {}
                }
            }
        }
        Ok(f)
    }

    /// The queues of interface `ifindex`, receive then transmit, each by index.
    pub fn queues(&mut self, ifindex: u32) -> Result<Vec<Queue>, NetlinkError> {
        let op = format!("list queues of interface {ifindex}");
        let replies =
            self.sock.call(&op, NETDEV_CMD_QUEUE_GET, vec![Attr::U32(NETDEV_A_QUEUE_IFINDEX, ifindex)], true)?;
        let mut out: Vec<Queue> = replies.iter().filter_map(|raw| parse_queue(raw, ifindex)).collect();
        out.sort_by_key(|q| (q.kind == QueueKind::Tx, q.id));
        Ok(out)
    }

    /// Writes `settings` to NAPI instance `napi_id` (needs CAP_NET_ADMIN and Linux 6.13+
    /// for the IRQ suspension timeout).
    pub fn napi_set(&mut self, napi_id: u32, settings: &NapiSettings) -> Result<(), NetlinkError> {
        let mut a = vec![Attr::U32(NETDEV_A_NAPI_ID, napi_id)];
        if let Some(v) = settings.defer_hard_irqs {
            a.push(Attr::U32(NETDEV_A_NAPI_DEFER_HARD_IRQS, v));
        }
        if let Some(v) = settings.gro_flush_timeout_ns {
            a.push(Attr::U64(NETDEV_A_NAPI_GRO_FLUSH_TIMEOUT, v));
        }
        if let Some(v) = settings.irq_suspend_timeout_ns {
            a.push(Attr::U64(NETDEV_A_NAPI_IRQ_SUSPEND_TIMEOUT, v));
        }
        self.sock.call(&format!("set NAPI {napi_id}'s settings"), NETDEV_CMD_NAPI_SET, a, false)?;
        Ok(())
    }

    /// Sets how NAPI instance `napi_id` is polled (Linux 6.17+ for a single instance).
    pub fn napi_set_threaded(&mut self, napi_id: u32, mode: NapiThreaded) -> Result<(), NetlinkError> {
        let a = vec![Attr::U32(NETDEV_A_NAPI_ID, napi_id), Attr::U32(NETDEV_A_NAPI_THREADED, mode.code())];
        self.sock.call(&format!("set NAPI {napi_id} threaded {mode:?}"), NETDEV_CMD_NAPI_SET, a, false)?;
        Ok(())
    }
}

/// One `napi-get` reply; `None` when it has no id or belongs to another device.
fn parse_napi(raw: &[u8], ifindex: u32) -> Option<Napi> {
    let mut n = Napi {
        id: 0,
        pid: None,
        irq: None,
        defer_hard_irqs: None,
        gro_flush_timeout_ns: None,
        irq_suspend_timeout_ns: None,
        threaded: None,
    };
    let (mut id, mut dev) = (None, None);
    for (kind, v) in attrs(raw) {
        match kind {
            NETDEV_A_NAPI_ID => id = attr_u32(v),
            NETDEV_A_NAPI_PID => n.pid = attr_u32(v),
            NETDEV_A_NAPI_IRQ => n.irq = attr_u32(v),
            NETDEV_A_NAPI_IFINDEX => dev = attr_u32(v),
            NETDEV_A_NAPI_DEFER_HARD_IRQS => n.defer_hard_irqs = attr_u32(v),
            NETDEV_A_NAPI_GRO_FLUSH_TIMEOUT => n.gro_flush_timeout_ns = attr_uint(v),
            NETDEV_A_NAPI_IRQ_SUSPEND_TIMEOUT => n.irq_suspend_timeout_ns = attr_uint(v),
            NETDEV_A_NAPI_THREADED => n.threaded = attr_u32(v).and_then(NapiThreaded::from_code),
            _ => {}
        }
    }
    n.id = id?;
    dev.is_none_or(|d| d == ifindex).then_some(n)
}

/// One `queue-get` reply; `None` when incomplete or another device's.
fn parse_queue(raw: &[u8], ifindex: u32) -> Option<Queue> {
    let (mut id, mut kind, mut napi_id, mut dev) = (None, None, None, None);
    for (k, v) in attrs(raw) {
        match k {
            NETDEV_A_QUEUE_ID => id = attr_u32(v),
            NETDEV_A_QUEUE_TYPE => {
                kind = match attr_u32(v) {
                    Some(NETDEV_QUEUE_TYPE_RX) => Some(QueueKind::Rx),
                    Some(NETDEV_QUEUE_TYPE_TX) => Some(QueueKind::Tx),
                    _ => None,
                }
            }
            NETDEV_A_QUEUE_NAPI_ID => napi_id = attr_u32(v),
            NETDEV_A_QUEUE_IFINDEX => dev = attr_u32(v),
            _ => {}
        }
    }
    let q = Queue { id: id?, kind: kind?, napi_id };
    dev.is_none_or(|d| d == ifindex).then_some(q)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xdp_feature_bits_are_named_and_unknown_ones_numbered() {
        assert_eq!(bit_names(1 | 2 | 8, &XDP_ACTIONS), ["basic", "redirect", "xsk-zerocopy"]);
        assert_eq!(bit_names(2 | 1 << 9, &XDP_RX_METADATA), ["hash", "bit 9"]);
        assert!(bit_names(0, &XDP_ACTIONS).is_empty());
    }

    #[test]
    fn loopback_has_no_native_xdp_and_a_missing_device_is_the_kernel_s_error() {
        let mut nd = Netdev::open().unwrap();
        assert!(nd.xdp_features(1).unwrap().actions.is_empty());
        assert_eq!(nd.xdp_features(999_999).unwrap_err().errno(), Some(libc::ENODEV));
    }

    fn attr(kind: u16, v: &[u8]) -> Vec<u8> {
        let len = 4 + v.len();
        let mut out = Vec::new();
        out.extend_from_slice(&(len as u16).to_ne_bytes());
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(v);
        out.resize(len.next_multiple_of(4), 0);
        out
    }

    #[test]
    fn napi_replies_parse_with_settings_of_either_width() {
        let mut raw = attr(NETDEV_A_NAPI_IFINDEX, &7u32.to_ne_bytes());
        raw.extend(attr(NETDEV_A_NAPI_ID, &258u32.to_ne_bytes()));
        raw.extend(attr(NETDEV_A_NAPI_PID, &4242u32.to_ne_bytes()));
        raw.extend(attr(NETDEV_A_NAPI_DEFER_HARD_IRQS, &2u32.to_ne_bytes()));
        raw.extend(attr(NETDEV_A_NAPI_GRO_FLUSH_TIMEOUT, &20_000u32.to_ne_bytes()));
        raw.extend(attr(NETDEV_A_NAPI_IRQ_SUSPEND_TIMEOUT, &(5_000_000_000u64).to_ne_bytes()));
        let n = parse_napi(&raw, 7).unwrap();
        assert_eq!((n.id, n.pid, n.irq), (258, Some(4242), None));
        assert_eq!(n.defer_hard_irqs, Some(2));
        assert_eq!(n.gro_flush_timeout_ns, Some(20_000));
        assert_eq!(n.irq_suspend_timeout_ns, Some(5_000_000_000));
        assert_eq!(parse_napi(&raw, 8), None, "another device's");
        assert_eq!(parse_napi(&attr(NETDEV_A_NAPI_PID, &1u32.to_ne_bytes()), 7), None, "no id");
    }

    #[test]
    fn queue_replies_parse_and_odd_ones_are_dropped() {
        let mut raw = attr(NETDEV_A_QUEUE_ID, &1u32.to_ne_bytes());
        raw.extend(attr(NETDEV_A_QUEUE_IFINDEX, &3u32.to_ne_bytes()));
        raw.extend(attr(NETDEV_A_QUEUE_TYPE, &NETDEV_QUEUE_TYPE_RX.to_ne_bytes()));
        raw.extend(attr(NETDEV_A_QUEUE_NAPI_ID, &259u32.to_ne_bytes()));
        assert_eq!(parse_queue(&raw, 3), Some(Queue { id: 1, kind: QueueKind::Rx, napi_id: Some(259) }));
        let mut odd = attr(NETDEV_A_QUEUE_ID, &0u32.to_ne_bytes());
        odd.extend(attr(NETDEV_A_QUEUE_TYPE, &9u32.to_ne_bytes()));
        assert_eq!(parse_queue(&odd, 3), None, "an unknown queue type");
        // Truncated and garbage attribute bytes never panic.
        for cut in 0..raw.len() {
            let _ = parse_queue(&raw[..cut], 3);
            let _ = parse_napi(&raw[..cut], 3);
        }
    }
}

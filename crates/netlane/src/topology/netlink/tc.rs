//! Traffic control over rtnetlink: root qdiscs (tbf, htb, etf, mqprio channel mode), htb
//! classes, and their counters.

use netlink_packet_core::{DefaultNla, NLM_F_CREATE, NLM_F_EXCL, Nla};
use netlink_packet_route::tc::{TcAttribute, TcHandle, TcMessage, TcOption, TcStats2};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::{NetlinkError, Rtnl};

/// A qdisc of a device, as [`Rtnl::qdiscs`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QdiscInfo {
    /// Its handle (major, minor).
    pub handle: (u16, u16),
    /// Whether it is the device's root qdisc.
    pub root: bool,
    /// Its parent class (major, minor); meaningless for the root.
    pub parent: (u16, u16),
    /// Its kind (`fq`, `tbf`).
    pub kind: String,
    /// Its options the library does not decode: (attribute type, value).
    pub options: Vec<(u16, Vec<u8>)>,
}

impl QdiscInfo {
    /// etf's head start (`tc_etf_qopt.delta`, the first field of `TCA_ETF_PARMS`),
    /// nanoseconds; `None` for other kinds.
    pub fn etf_delta_ns(&self) -> Option<u32> {
        const TCA_ETF_PARMS: u16 = 1;
        if self.kind != "etf" {
            return None;
        }
        let (_, v) = self.options.iter().find(|(t, _)| *t == TCA_ETF_PARMS)?;
        Some(i32::from_ne_bytes(v.get(0..4)?.try_into().ok()?).max(0) as u32)
    }
}

fn raw_options(attributes: &[TcAttribute]) -> Vec<(u16, Vec<u8>)> {
    let mut out = Vec::new();
    for a in attributes {
        if let TcAttribute::Options(opts) = a {
            for o in opts {
                if let TcOption::Other(nla) = o {
                    let mut value = vec![0u8; nla.value_len()];
                    nla.emit_value(&mut value);
                    out.push((nla.kind(), value));
                }
            }
        }
    }
    out
}

/// Counters of a qdisc.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct QdiscStats {
    /// Bytes sent.
    pub bytes: u64,
    /// Packets sent.
    pub packets: u64,
    /// Packets dropped.
    pub drops: u64,
    /// Times the qdisc was over its limit (throttled).
    pub overlimits: u64,
}

impl Rtnl {
    /// Replaces the root qdisc of `index` with a token bucket filter: `rate` bytes per
    /// second, a bucket of `burst` bytes, and at most `limit` bytes queued (the rest is
    /// dropped). This is the bottleneck of the pacing experiment.
    pub fn add_tbf(&mut self, index: u32, rate: u64, burst: u32, limit: u32) -> Result<(), NetlinkError> {
        // struct tc_tbf_qopt (include/uapi/linux/pkt_sched.h): two tc_ratespec (rate,
        // peakrate; 12 bytes each), then limit, buffer, mtu. With linklayer = ethernet
        // (1) the kernel needs no rate table; TCA_TBF_BURST gives the bucket in bytes
        // (Linux 3.13) and TCA_TBF_RATE64 carries rates of 2^32 B/s and above.
        const TCA_TBF_PARMS: u16 = 1;
        const TCA_TBF_RATE64: u16 = 4;
        const TCA_TBF_BURST: u16 = 6;
        const TC_LINKLAYER_ETHERNET: u8 = 1;
        let mut qopt = [0u8; 36];
        qopt[1] = TC_LINKLAYER_ETHERNET;
        qopt[8..12].copy_from_slice(&(rate.min(u64::from(u32::MAX)) as u32).to_ne_bytes());
        qopt[13] = TC_LINKLAYER_ETHERNET;
        qopt[24..28].copy_from_slice(&limit.to_ne_bytes());
        let mut options = vec![
            TcOption::Other(DefaultNla::new(TCA_TBF_PARMS, qopt.to_vec())),
            TcOption::Other(DefaultNla::new(TCA_TBF_BURST, burst.to_ne_bytes().to_vec())),
        ];
        if rate >= u64::from(u32::MAX) {
            options.push(TcOption::Other(DefaultNla::new(TCA_TBF_RATE64, rate.to_ne_bytes().to_vec())));
        }
        let mut msg = TcMessage::default();
        msg.header.family = AddressFamily::Unspec;
        msg.header.index = index as i32;
        msg.header.handle = TcHandle { major: 1, minor: 0 };
        msg.header.parent = TcHandle::ROOT;
        msg.attributes = vec![TcAttribute::Kind("tbf".into()), TcAttribute::Options(options)];
        self.ack(
            &format!("add tbf qdisc (rate {rate} B/s, burst {burst} B, limit {limit} B) on interface {index}"),
            RouteNetlinkMessage::NewQueueDiscipline(msg),
            NLM_F_CREATE | NLM_F_EXCL,
        )
    }

    /// Replaces the root qdisc of `index` with mqprio in channel mode, offloaded to the
    /// device (`tc qdisc add dev D root mqprio num_tc N map ... queues ... hw 1 mode
    /// channel shaper bw_rlimit min_rate ... max_rate ...`). Only devices whose driver
    /// offloads it accept this (ice, i40e, mlx5 among them); a kernel without mqprio
    /// answers ENOENT, a device without offload EINVAL or EOPNOTSUPP.
    pub fn add_mqprio_channel(&mut self, index: u32, layout: &MqprioChannel) -> Result<(), NetlinkError> {
        const TCA_OPTIONS: u16 = 2;
        let mut msg = TcMessage::default();
        msg.header.index = index as i32;
        msg.header.handle = TcHandle { major: MQPRIO_MAJOR, minor: 0 };
        msg.header.parent = TcHandle::ROOT;
        msg.attributes =
            vec![TcAttribute::Kind("mqprio".into()), TcAttribute::Other(DefaultNla::new(TCA_OPTIONS, layout.encode()))];
        self.ack(
            &format!("add mqprio qdisc in channel mode ({} traffic classes) on interface {index}", layout.queues.len()),
            RouteNetlinkMessage::NewQueueDiscipline(msg),
            NLM_F_CREATE | NLM_F_EXCL,
        )
    }

    /// Adds a root qdisc of `kind` with no options (e.g. "fq", to probe whether the
    /// kernel has it).
    pub fn add_root_qdisc(&mut self, index: u32, kind: &str) -> Result<(), NetlinkError> {
        let mut msg = TcMessage::default();
        msg.header.index = index as i32;
        msg.header.handle = TcHandle { major: 1, minor: 0 };
        msg.header.parent = TcHandle::ROOT;
        msg.attributes = vec![TcAttribute::Kind(kind.into())];
        self.ack(
            &format!("add {kind} qdisc on interface {index}"),
            RouteNetlinkMessage::NewQueueDiscipline(msg),
            NLM_F_CREATE | NLM_F_EXCL,
        )
    }

    /// Adds etf (earliest txtime first) to `index`, as its root qdisc or under class
    /// `parent` of another: packets leave at the SO_TXTIME release times their sockets
    /// give, on CLOCK_TAI (the only clock etf takes), dequeued from `delta_ns` before
    /// their time; a packet whose time has passed, or whose socket uses another clock, is
    /// dropped and reported on that socket's error queue.
    pub fn add_etf(&mut self, index: u32, parent: Option<(u16, u16)>, delta_ns: u32) -> Result<(), NetlinkError> {
        // struct tc_etf_qopt (include/uapi/linux/pkt_sched.h): delta, clockid, flags.
        const TCA_ETF_PARMS: u16 = 1;
        const CLOCK_TAI: i32 = 11;
        let mut qopt = [0u8; 12];
        qopt[0..4].copy_from_slice(&(delta_ns.min(i32::MAX as u32) as i32).to_ne_bytes());
        qopt[4..8].copy_from_slice(&CLOCK_TAI.to_ne_bytes());
        let options = vec![TcOption::Other(DefaultNla::new(TCA_ETF_PARMS, qopt.to_vec()))];
        self.add_qdisc(index, parent, "etf", options, &format!("etf qdisc (CLOCK_TAI, delta {delta_ns} ns)"))
    }

    /// Adds fq with its defaults to `index`, as its root qdisc or under class `parent`
    /// of another.
    pub fn add_fq(&mut self, index: u32, parent: Option<(u16, u16)>) -> Result<(), NetlinkError> {
        self.add_qdisc(index, parent, "fq", Vec::new(), "fq qdisc")
    }

    /// A root qdisc takes handle 1:, one under a class of it 2:.
    fn add_qdisc(
        &mut self,
        index: u32,
        parent: Option<(u16, u16)>,
        kind: &str,
        options: Vec<TcOption>,
        what: &str,
    ) -> Result<(), NetlinkError> {
        let mut msg = TcMessage::default();
        msg.header.index = index as i32;
        (msg.header.handle, msg.header.parent) = match parent {
            None => (TcHandle { major: 1, minor: 0 }, TcHandle::ROOT),
            Some((major, minor)) => (TcHandle { major: 2, minor: 0 }, TcHandle { major, minor }),
        };
        msg.attributes = vec![TcAttribute::Kind(kind.into())];
        if !options.is_empty() {
            msg.attributes.push(TcAttribute::Options(options));
        }
        let place =
            parent.map_or_else(|| "root".to_string(), |(major, minor)| format!("under class {major:x}:{minor:x}"));
        self.ack(
            &format!("add {what} ({place}) on interface {index}"),
            RouteNetlinkMessage::NewQueueDiscipline(msg),
            NLM_F_CREATE | NLM_F_EXCL,
        )
    }

    /// Deletes the root qdisc of `index` (the device falls back to its default).
    pub fn del_root_qdisc(&mut self, index: u32) -> Result<(), NetlinkError> {
        let mut msg = TcMessage::default();
        msg.header.index = index as i32;
        msg.header.parent = TcHandle::ROOT;
        self.ack(&format!("delete root qdisc of interface {index}"), RouteNetlinkMessage::DelQueueDiscipline(msg), 0)
    }

    /// Replaces the root qdisc of `index` with htb (handle 1:), unclassified packets
    /// going to class 1:`default_minor`.
    pub fn add_htb_root(&mut self, index: u32, default_minor: u16) -> Result<(), NetlinkError> {
        // struct tc_htb_glob: version (3), rate2quantum (10, the kernel's default),
        // defcls, debug, direct_pkts.
        const TCA_HTB_INIT: u16 = 2;
        let mut glob = [0u8; 20];
        glob[0..4].copy_from_slice(&3u32.to_ne_bytes());
        glob[4..8].copy_from_slice(&10u32.to_ne_bytes());
        glob[8..12].copy_from_slice(&u32::from(default_minor).to_ne_bytes());
        let mut msg = TcMessage::default();
        msg.header.index = index as i32;
        msg.header.handle = TcHandle { major: HTB_MAJOR, minor: 0 };
        msg.header.parent = TcHandle::ROOT;
        msg.attributes = vec![
            TcAttribute::Kind("htb".into()),
            TcAttribute::Options(vec![TcOption::Other(DefaultNla::new(TCA_HTB_INIT, glob.to_vec()))]),
        ];
        self.ack(
            &format!("add htb qdisc (default class 1:{default_minor}) on interface {index}"),
            RouteNetlinkMessage::NewQueueDiscipline(msg),
            NLM_F_CREATE | NLM_F_EXCL,
        )
    }

    /// Adds (or changes) an htb class on `index`, whose root qdisc is htb 1:.
    pub fn set_htb_class(&mut self, index: u32, class: HtbClass) -> Result<(), NetlinkError> {
        // struct tc_htb_opt: rate, ceil (tc_ratespec), buffer, cbuffer (bursts in
        // ticks), quantum (0: the kernel derives it from the rate), level, prio.
        const TCA_HTB_PARMS: u16 = 1;
        const TCA_HTB_RATE64: u16 = 6;
        const TCA_HTB_CEIL64: u16 = 7;
        // A burst of a millisecond at the rate, and at least two 64 KiB GSO packets.
        let burst = |rate: u64| burst_ticks((rate / 1000).max(2 * 65536), rate);
        let mut opt = [0u8; 44];
        opt[0..12].copy_from_slice(&ratespec(class.rate));
        opt[12..24].copy_from_slice(&ratespec(class.ceil));
        opt[24..28].copy_from_slice(&burst(class.rate).to_ne_bytes());
        opt[28..32].copy_from_slice(&burst(class.ceil).to_ne_bytes());
        opt[40..44].copy_from_slice(&class.prio.to_ne_bytes());
        let mut options = vec![TcOption::Other(DefaultNla::new(TCA_HTB_PARMS, opt.to_vec()))];
        if class.rate >= u64::from(u32::MAX) {
            options.push(TcOption::Other(DefaultNla::new(TCA_HTB_RATE64, class.rate.to_ne_bytes().to_vec())));
        }
        if class.ceil >= u64::from(u32::MAX) {
            options.push(TcOption::Other(DefaultNla::new(TCA_HTB_CEIL64, class.ceil.to_ne_bytes().to_vec())));
        }
        let mut msg = TcMessage::default();
        msg.header.index = index as i32;
        msg.header.handle = TcHandle { major: HTB_MAJOR, minor: class.minor };
        msg.header.parent = TcHandle { major: HTB_MAJOR, minor: class.parent };
        msg.attributes = vec![TcAttribute::Kind("htb".into()), TcAttribute::Options(options)];
        self.ack(
            &format!(
                "set htb class 1:{} (parent 1:{}, rate {} B/s, ceil {} B/s) on interface {index}",
                class.minor, class.parent, class.rate, class.ceil
            ),
            RouteNetlinkMessage::NewTrafficClass(msg),
            NLM_F_CREATE,
        )
    }

    /// Counters of every class of `index`'s qdiscs, by class id (major, minor).
    pub fn class_stats(&mut self, index: u32) -> Result<Vec<ClassStats>, NetlinkError> {
        let mut req = TcMessage::default();
        req.header.index = index as i32;
        let op = format!("read classes of interface {index}");
        let replies = self.dump(&op, RouteNetlinkMessage::GetTrafficClass(req))?;
        Ok(replies
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewTrafficClass(c) if c.header.index == index as i32 => {
                    Some(((c.header.handle.major, c.header.handle.minor), kind_and_stats(&c.attributes).1))
                }
                _ => None,
            })
            .collect())
    }

    /// Every qdisc of `index`: its handle, its parent and kind, and its options as raw
    /// attributes (type, value) where the kernel gives them.
    pub fn qdiscs(&mut self, index: u32) -> Result<Vec<QdiscInfo>, NetlinkError> {
        let op = format!("read qdiscs of interface {index}");
        let replies = self.dump(&op, RouteNetlinkMessage::GetQueueDiscipline(TcMessage::default()))?;
        Ok(replies
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewQueueDiscipline(q) if q.header.index == index as i32 => Some(QdiscInfo {
                    handle: (q.header.handle.major, q.header.handle.minor),
                    root: q.header.parent == TcHandle::ROOT,
                    parent: (q.header.parent.major, q.header.parent.minor),
                    kind: kind_and_stats(&q.attributes).0,
                    options: raw_options(&q.attributes),
                }),
                _ => None,
            })
            .collect())
    }

    /// Kind and counters of the root qdisc of `index` ("noqueue" for a veth without
    /// one).
    pub fn root_qdisc(&mut self, index: u32) -> Result<Option<(String, QdiscStats)>, NetlinkError> {
        let op = format!("read qdiscs of interface {index}");
        let replies = self.dump(&op, RouteNetlinkMessage::GetQueueDiscipline(TcMessage::default()))?;
        for m in replies {
            let RouteNetlinkMessage::NewQueueDiscipline(q) = m else {
                continue;
            };
            if q.header.index != index as i32 || q.header.parent != TcHandle::ROOT {
                continue;
            }
            let (kind, stats) = kind_and_stats(&q.attributes);
            return Ok(Some((kind, stats)));
        }
        Ok(None)
    }
}

/// A qdisc's or class's kind and counters, from its attributes.
fn kind_and_stats(attributes: &[TcAttribute]) -> (String, QdiscStats) {
    let mut kind = String::new();
    let mut stats = QdiscStats::default();
    for a in attributes {
        match a {
            TcAttribute::Kind(k) => kind = k.clone(),
            TcAttribute::Stats(s) => {
                stats.bytes = s.bytes;
                stats.packets = u64::from(s.packets);
                stats.drops = u64::from(s.drops);
                stats.overlimits = u64::from(s.overlimits);
            }
            TcAttribute::Stats2(list) => {
                for s in list {
                    match s {
                        TcStats2::Basic(b) => {
                            stats.bytes = b.bytes;
                            stats.packets = u64::from(b.packets);
                        }
                        TcStats2::Queue(qs) => {
                            stats.drops = u64::from(qs.drops);
                            stats.overlimits = u64::from(qs.overlimits);
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    (kind, stats)
}

/// A class's id (major, minor) and its counters.
pub type ClassStats = ((u16, u16), QdiscStats);

/// One htb class: its id's minor number under qdisc 1:, its parent (0: the qdisc
/// itself), its guaranteed and its highest rate, and its priority for spare bandwidth
/// (0 first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HtbClass {
    /// The class is 1:`minor`.
    pub minor: u16,
    /// The parent class 1:`parent`, or 0 for the qdisc.
    pub parent: u16,
    /// Guaranteed rate, bytes per second.
    pub rate: u64,
    /// Most the class may send, bytes per second (borrowing from its parent).
    pub ceil: u64,
    /// Which classes get spare bandwidth first (0..=7, lower first).
    pub prio: u32,
}

/// The htb qdisc's handle major number (classes are 1:minor).
pub const HTB_MAJOR: u16 = 1;

/// struct tc_ratespec (12 bytes) with linklayer ethernet, which lets the kernel do
/// without a rate table.
fn ratespec(rate: u64) -> [u8; 12] {
    const TC_LINKLAYER_ETHERNET: u8 = 1;
    let mut r = [0u8; 12];
    r[1] = TC_LINKLAYER_ETHERNET;
    r[8..12].copy_from_slice(&(rate.min(u64::from(u32::MAX)) as u32).to_ne_bytes());
    r
}

/// A burst, in the packet scheduler's 64 ns ticks, of `bytes` at `rate` B/s.
fn burst_ticks(bytes: u64, rate: u64) -> u32 {
    let ns = u128::from(bytes) * 1_000_000_000 / u128::from(rate.max(1));
    u32::try_from(ns >> 6).unwrap_or(u32::MAX)
}

/// The mqprio qdisc's handle major number (traffic class `tc` is class
/// `MQPRIO_MAJOR:(MQPRIO_TC_MINOR + tc)`).
pub const MQPRIO_MAJOR: u16 = 1;

/// The class minor number of mqprio's first traffic class (`TC_H_MIN_PRIORITY`).
pub const MQPRIO_TC_MINOR: u16 = 0xffe0;

/// Most traffic classes mqprio has (`TC_QOPT_MAX_QUEUE`), and socket priorities it maps
/// (`TC_QOPT_BITMASK + 1`).
pub const MQPRIO_MAX_TC: usize = 16;

/// An mqprio layout in channel mode: which socket priority goes to which traffic class,
/// each class's transmit queues and its guaranteed and highest rate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MqprioChannel {
    /// Socket priority (0..=15) -> traffic class.
    pub prio_tc_map: [u8; MQPRIO_MAX_TC],
    /// Per traffic class: (first transmit queue, number of queues).
    pub queues: Vec<(u16, u16)>,
    /// Per traffic class: guaranteed rate, bytes per second.
    pub min_rate: Vec<u64>,
    /// Per traffic class: highest rate, bytes per second.
    pub max_rate: Vec<u64>,
}

impl MqprioChannel {
    /// The `TCA_OPTIONS` payload: `struct tc_mqprio_qopt` (include/uapi/linux/pkt_sched.h:
    /// num_tc u8, prio_tc_map [u8; 16], hw u8, count [u16; 16], offset [u16; 16]; 82
    /// bytes, padded to 84), then the channel-mode attributes: `TCA_MQPRIO_MODE` (u16,
    /// channel), `TCA_MQPRIO_SHAPER` (u16, bw_rlimit), and `TCA_MQPRIO_MIN_RATE64` /
    /// `TCA_MQPRIO_MAX_RATE64`, each a nest of one u64 per class (bytes per second, the
    /// unit `tc` converts to).
    pub fn encode(&self) -> Vec<u8> {
        const QOPT_LEN: usize = 1 + MQPRIO_MAX_TC + 1 + 2 * MQPRIO_MAX_TC + 2 * MQPRIO_MAX_TC;
        const _: () = assert!(QOPT_LEN == 82);
        const TCA_MQPRIO_MODE: u16 = 1;
        const TCA_MQPRIO_SHAPER: u16 = 2;
        const TCA_MQPRIO_MIN_RATE64: u16 = 3;
        const TCA_MQPRIO_MAX_RATE64: u16 = 4;
        const TC_MQPRIO_MODE_CHANNEL: u16 = 1;
        const TC_MQPRIO_SHAPER_BW_RATE: u16 = 1;
        const TC_MQPRIO_HW_OFFLOAD_TCS: u8 = 1;
        fn attr(out: &mut Vec<u8>, kind: u16, value: &[u8]) {
            let len = 4 + value.len();
            out.extend_from_slice(&(len as u16).to_ne_bytes());
            out.extend_from_slice(&kind.to_ne_bytes());
            out.extend_from_slice(value);
            out.resize(out.len().next_multiple_of(4), 0);
        }
        let n = self.queues.len().min(MQPRIO_MAX_TC);
        let mut out = vec![0u8; QOPT_LEN];
        out[0] = n as u8;
        out[1..1 + MQPRIO_MAX_TC].copy_from_slice(&self.prio_tc_map);
        out[1 + MQPRIO_MAX_TC] = TC_MQPRIO_HW_OFFLOAD_TCS;
        for (tc, &(first, count)) in self.queues.iter().take(n).enumerate() {
            let at = 18 + 2 * tc;
            out[at..at + 2].copy_from_slice(&count.to_ne_bytes());
            let at = 18 + 2 * MQPRIO_MAX_TC + 2 * tc;
            out[at..at + 2].copy_from_slice(&first.to_ne_bytes());
        }
        out.resize(QOPT_LEN.next_multiple_of(4), 0);
        attr(&mut out, TCA_MQPRIO_MODE, &TC_MQPRIO_MODE_CHANNEL.to_ne_bytes());
        attr(&mut out, TCA_MQPRIO_SHAPER, &TC_MQPRIO_SHAPER_BW_RATE.to_ne_bytes());
        for (kind, rates) in [(TCA_MQPRIO_MIN_RATE64, &self.min_rate), (TCA_MQPRIO_MAX_RATE64, &self.max_rate)] {
            let mut nest = Vec::new();
            for r in rates.iter().take(n) {
                attr(&mut nest, kind, &r.to_ne_bytes());
            }
            attr(&mut out, kind, &nest);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mqprio_channel_options_follow_the_uapi_layout() {
        let mut prio_tc_map = [0u8; MQPRIO_MAX_TC];
        prio_tc_map[3] = 1;
        prio_tc_map[5] = 2;
        let layout = MqprioChannel {
            prio_tc_map,
            queues: vec![(0, 2), (2, 1), (3, 1)],
            min_rate: vec![10, 20, 30],
            max_rate: vec![100, 200, 300],
        };
        let b = layout.encode();
        let u16_at = |at: usize| u16::from_ne_bytes([b[at], b[at + 1]]);
        assert_eq!(b[0], 3, "num_tc");
        assert_eq!(&b[1..17], &prio_tc_map);
        assert_eq!(b[17], 1, "hw: offload the traffic classes");
        assert_eq!((0..4).map(|tc| u16_at(18 + 2 * tc)).collect::<Vec<_>>(), [2, 1, 1, 0], "count[]");
        assert_eq!((0..4).map(|tc| u16_at(50 + 2 * tc)).collect::<Vec<_>>(), [0, 2, 3, 0], "offset[]");
        // The attributes start at NLA_ALIGN(82) = 84: mode, shaper, then the two nests.
        fn nlas(mut buf: &[u8]) -> Vec<(u16, &[u8])> {
            let mut out = Vec::new();
            while buf.len() >= 4 {
                let len = usize::from(u16::from_ne_bytes([buf[0], buf[1]]));
                out.push((u16::from_ne_bytes([buf[2], buf[3]]), &buf[4..len]));
                buf = &buf[len.next_multiple_of(4).min(buf.len())..];
            }
            out
        }
        let attrs = nlas(&b[84..]);
        assert_eq!(attrs.len(), 4);
        assert_eq!((attrs[0].0, attrs[0].1), (1, &1u16.to_ne_bytes()[..]), "mode channel");
        assert_eq!((attrs[1].0, attrs[1].1), (2, &1u16.to_ne_bytes()[..]), "shaper bw_rlimit");
        for (i, (kind, want)) in [(3u16, [10u64, 20, 30]), (4, [100, 200, 300])].into_iter().enumerate() {
            assert_eq!(attrs[2 + i].0, kind);
            let rates: Vec<(u16, u64)> =
                nlas(attrs[2 + i].1).into_iter().map(|(k, v)| (k, u64::from_ne_bytes(v.try_into().unwrap()))).collect();
            assert_eq!(rates, want.iter().map(|&r| (kind, r)).collect::<Vec<_>>());
        }
    }
}

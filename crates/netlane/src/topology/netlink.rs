//! A small synchronous rtnetlink client: links, veth pairs, addresses and qdiscs.
//!
//! Messages are built and parsed with `netlink-packet-route`; this module only frames
//! requests, collects replies until the kernel's ACK or DONE, and turns errors into
//! [`NetlinkError`]s that carry the kernel's extended-ACK text (the same message `ip`
//! and `tc` print, e.g. "Specified qdisc kind is unknown.").
//!
//! A netlink socket belongs to the network namespace it was created in, whichever
//! thread later uses it; [`super::Netns`] keeps one per namespace.

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::RawFd;

use netlink_packet_core::{
    DefaultNla, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST, NetlinkDeserializable, NetlinkHeader,
    NetlinkMessage, NetlinkPayload, NetlinkSerializable, NlaBuffer, NlasIterator,
};
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage, AddressScope};
use netlink_packet_route::link::{InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkInfo, LinkMessage};
use netlink_packet_route::neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState};
use netlink_packet_route::route::{RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType};
use netlink_packet_route::tc::{TcAttribute, TcHandle, TcMessage, TcOption, TcStats2};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

/// A failed netlink request.
#[derive(Debug)]
pub struct NetlinkError {
    /// What was being done, e.g. "create veth pair nl0/nl1".
    pub op: String,
    /// The error.
    pub source: io::Error,
    /// The kernel's extended-ACK message, if it sent one.
    pub message: Option<String>,
}

/// What was being done (and what the kernel said of it); the error itself is the
/// [`std::error::Error::source`], said once by whoever prints the chain.
impl fmt::Display for NetlinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.op)?;
        if let Some(m) = &self.message {
            write!(f, " (kernel says: {m})")?;
        }
        Ok(())
    }
}

impl std::error::Error for NetlinkError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

impl NetlinkError {
    pub(crate) fn io(op: &str, source: io::Error) -> Self {
        Self { op: op.to_string(), source, message: None }
    }

    /// The OS error number.
    pub fn errno(&self) -> Option<i32> {
        self.source.raw_os_error()
    }
}

/// `NLMSGERR_ATTR_MSG` (include/uapi/linux/netlink.h).
const NLMSGERR_ATTR_MSG: u16 = 1;
/// Length of `struct nlmsghdr`, echoed at the start of an error's payload.
const NLMSGHDR_LEN: usize = 16;

/// Extracts the extended-ACK message from an error payload (the echoed header, capped
/// by NETLINK_CAP_ACK, followed by attributes).
fn ext_ack_message(payload: &[u8]) -> Option<String> {
    let attrs = payload.get(NLMSGHDR_LEN..)?;
    NlasIterator::new(attrs).filter_map(Result::ok).find_map(|nla: NlaBuffer<&[u8]>| {
        (nla.kind() == NLMSGERR_ATTR_MSG).then(|| {
            let v = nla.value();
            let end = v.iter().position(|&b| b == 0).unwrap_or(v.len());
            String::from_utf8_lossy(&v[..end]).trim().to_string()
        })
    })
}

/// Rounds a netlink message length up to 4 bytes.
fn nl_align(len: usize) -> usize {
    (len + 3) & !3
}

/// Opens a netlink socket of `protocol` in the calling thread's namespace, with
/// extended ACKs (error text) and capped ACKs (errors do not echo the whole request).
pub(crate) fn open_socket(protocol: isize) -> io::Result<Socket> {
    let mut sock = Socket::new(protocol)?;
    sock.bind_auto()?;
    sock.connect(&SocketAddr::new(0, 0))?;
    // Best effort: older kernels lack these, and requests still work without.
    let _ = sock.set_ext_ack(true);
    let _ = sock.set_cap_ack(true);
    Ok(sock)
}

/// Sends one request with sequence number `seq` and collects the replies until the
/// kernel's ACK (or DONE, for dumps). Replies this crate cannot decode are skipped.
pub(crate) fn transact<I>(sock: &Socket, seq: u32, op: &str, msg: I, flags: u16) -> Result<Vec<I>, NetlinkError>
where
    I: NetlinkSerializable + NetlinkDeserializable + fmt::Debug,
{
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | flags;
    header.sequence_number = seq;
    let mut nl = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(msg));
    nl.finalize();
    let mut buf = vec![0u8; nl.buffer_len()];
    nl.serialize(&mut buf);
    sock.send(&buf, 0).map_err(|e| NetlinkError::io(op, e))?;
    let mut replies = Vec::new();
    loop {
        let (data, _) = sock.recv_from_full().map_err(|e| NetlinkError::io(op, e))?;
        let mut off = 0;
        while off + NLMSGHDR_LEN <= data.len() {
            let len = u32::from_ne_bytes([data[off], data[off + 1], data[off + 2], data[off + 3]]) as usize;
            if len < NLMSGHDR_LEN || off + len > data.len() {
                return Err(NetlinkError::io(
                    op,
                    io::Error::new(io::ErrorKind::InvalidData, "malformed netlink reply"),
                ));
            }
            let chunk = &data[off..off + len];
            off += nl_align(len);
            let Ok(reply) = NetlinkMessage::<I>::deserialize(chunk) else {
                // A reply this crate cannot decode (a newer attribute layout): skip it
                // rather than fail the whole request.
                tracing::debug!(op, "skipping undecodable netlink reply");
                continue;
            };
            if reply.header.sequence_number != seq {
                continue;
            }
            match reply.payload {
                NetlinkPayload::Error(e) => {
                    return match e.code {
                        None => Ok(replies),
                        Some(code) => Err(NetlinkError {
                            op: op.to_string(),
                            source: io::Error::from_raw_os_error(-code.get()),
                            message: ext_ack_message(&e.header),
                        }),
                    };
                }
                NetlinkPayload::Done(_) => return Ok(replies),
                NetlinkPayload::InnerMessage(m) => replies.push(m),
                _ => {}
            }
        }
    }
}

/// A route-netlink socket bound to the namespace it was opened in.
#[derive(Debug)]
pub struct Rtnl {
    sock: Socket,
    seq: u32,
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
    /// Opens a socket in the calling thread's network namespace.
    pub fn open() -> io::Result<Self> {
        Ok(Self { sock: open_socket(NETLINK_ROUTE)?, seq: 0 })
    }

    /// Sends one request and collects the replies until ACK or DONE.
    pub(crate) fn request(
        &mut self,
        op: &str,
        msg: RouteNetlinkMessage,
        flags: u16,
    ) -> Result<Vec<RouteNetlinkMessage>, NetlinkError> {
        self.seq = self.seq.wrapping_add(1);
        transact(&self.sock, self.seq, op, msg, flags)
    }

    fn dump(&mut self, op: &str, msg: RouteNetlinkMessage) -> Result<Vec<RouteNetlinkMessage>, NetlinkError> {
        self.request(op, msg, NLM_F_DUMP)
    }

    fn ack(&mut self, op: &str, msg: RouteNetlinkMessage, flags: u16) -> Result<(), NetlinkError> {
        self.request(op, msg, NLM_F_ACK | flags).map(drop)
    }

    /// Creates a veth pair: `a` in the namespace `a_ns` (an fd), its peer `b` in `b_ns`,
    /// both with `mtu` and `queues` TX and RX queues. Neither end ever exists in the
    /// caller's namespace, so names cannot collide there.
    pub fn add_veth(
        &mut self,
        a: &str,
        a_ns: RawFd,
        b: &str,
        b_ns: RawFd,
        mtu: u32,
        queues: u32,
    ) -> Result<(), NetlinkError> {
        let mut peer = LinkMessage::default();
        peer.attributes = vec![
            LinkAttribute::IfName(b.to_string()),
            LinkAttribute::NetNsFd(b_ns),
            LinkAttribute::Mtu(mtu),
            LinkAttribute::NumTxQueues(queues),
            LinkAttribute::NumRxQueues(queues),
        ];
        let mut link = LinkMessage::default();
        link.attributes = vec![
            LinkAttribute::IfName(a.to_string()),
            LinkAttribute::NetNsFd(a_ns),
            LinkAttribute::Mtu(mtu),
            LinkAttribute::NumTxQueues(queues),
            LinkAttribute::NumRxQueues(queues),
            LinkAttribute::LinkInfo(vec![
                LinkInfo::Kind(InfoKind::Veth),
                LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer))),
            ]),
        ];
        self.ack(&format!("create veth pair {a}/{b}"), RouteNetlinkMessage::NewLink(link), NLM_F_CREATE | NLM_F_EXCL)
    }

    /// The link message of one interface, looked up by `msg` (an index or a name).
    fn get_link(&mut self, op: &str, msg: LinkMessage) -> Result<LinkMessage, NetlinkError> {
        self.request(op, RouteNetlinkMessage::GetLink(msg), NLM_F_ACK)?
            .into_iter()
            .find_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(l),
                _ => None,
            })
            .ok_or_else(|| NetlinkError::io(op, io::Error::from_raw_os_error(libc::ENODEV)))
    }

    /// One attribute of interface `index`, picked by `pick`.
    fn link_attribute<T>(
        &mut self,
        index: u32,
        what: &str,
        pick: impl Fn(&LinkAttribute) -> Option<T>,
    ) -> Result<T, NetlinkError> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        let op = format!("read {what} of interface {index}");
        let link = self.get_link(&op, msg)?;
        link.attributes
            .iter()
            .find_map(pick)
            .ok_or_else(|| NetlinkError::io(&op, io::Error::from_raw_os_error(libc::ENODATA)))
    }

    /// The index of interface `name`.
    pub fn link_index(&mut self, name: &str) -> Result<u32, NetlinkError> {
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        Ok(self.get_link(&format!("look up interface {name}"), msg)?.header.index)
    }

    /// The name of interface `index`.
    pub fn link_name(&mut self, index: u32) -> Result<String, NetlinkError> {
        self.link_attribute(index, "name", |a| match a {
            LinkAttribute::IfName(n) => Some(n.clone()),
            _ => None,
        })
    }

    /// The MTU of interface `index`.
    pub fn link_mtu(&mut self, index: u32) -> Result<u32, NetlinkError> {
        self.link_attribute(index, "MTU", |a| match a {
            LinkAttribute::Mtu(m) => Some(*m),
            _ => None,
        })
    }

    /// The kind of interface `index`'s root qdisc (`noop` until the kernel activates
    /// the device's queues, which it does some time after the link comes up).
    pub fn link_qdisc(&mut self, index: u32) -> Result<String, NetlinkError> {
        self.link_attribute(index, "qdisc", |a| match a {
            LinkAttribute::Qdisc(q) => Some(q.clone()),
            _ => None,
        })
    }

    /// The hardware (MAC) address of interface `index`.
    pub fn link_mac(&mut self, index: u32) -> Result<Vec<u8>, NetlinkError> {
        self.link_attribute(index, "MAC address", |a| match a {
            LinkAttribute::Address(mac) => Some(mac.clone()),
            _ => None,
        })
    }

    /// How many transmit queues interface `index` has.
    pub fn link_tx_queues(&mut self, index: u32) -> Result<u32, NetlinkError> {
        self.link_attribute(index, "transmit queue count", |a| match a {
            LinkAttribute::NumTxQueues(n) => Some(*n),
            _ => None,
        })
    }

    /// Adds a permanent neighbour entry (`ip neigh add ... lladdr ... nud permanent`):
    /// `addr` on interface `index` is at `mac`, with no ARP or neighbour discovery.
    pub fn add_neighbour(&mut self, index: u32, addr: IpAddr, mac: &[u8]) -> Result<(), NetlinkError> {
        let mut msg = NeighbourMessage::default();
        msg.header.ifindex = index;
        msg.header.state = NeighbourState::Permanent;
        msg.header.family = match addr {
            IpAddr::V4(_) => AddressFamily::Inet,
            IpAddr::V6(_) => AddressFamily::Inet6,
        };
        msg.attributes = vec![
            NeighbourAttribute::Destination(match addr {
                IpAddr::V4(a) => NeighbourAddress::Inet(a),
                IpAddr::V6(a) => NeighbourAddress::Inet6(a),
            }),
            NeighbourAttribute::LinkLayerAddress(mac.to_vec()),
        ];
        self.ack(
            &format!("add permanent neighbour {addr} on interface {index}"),
            RouteNetlinkMessage::NewNeighbour(msg),
            NLM_F_CREATE | netlink_packet_core::NLM_F_REPLACE,
        )
    }

    /// Deletes the neighbour entry for `addr` on interface `index` (`ip neigh del`).
    pub fn del_neighbour(&mut self, index: u32, addr: IpAddr) -> Result<(), NetlinkError> {
        let mut msg = NeighbourMessage::default();
        msg.header.ifindex = index;
        msg.header.family = match addr {
            IpAddr::V4(_) => AddressFamily::Inet,
            IpAddr::V6(_) => AddressFamily::Inet6,
        };
        msg.attributes = vec![NeighbourAttribute::Destination(match addr {
            IpAddr::V4(a) => NeighbourAddress::Inet(a),
            IpAddr::V6(a) => NeighbourAddress::Inet6(a),
        })];
        self.ack(&format!("delete neighbour {addr} on interface {index}"), RouteNetlinkMessage::DelNeighbour(msg), 0)
    }

    /// Adds a route to `dst/prefix_len` via `gateway` in the main table (`ip route add
    /// dst/prefix via gateway`; prefix 0 is the default route).
    pub fn add_route(&mut self, dst: IpAddr, prefix_len: u8, gateway: IpAddr) -> Result<(), NetlinkError> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = match dst {
            IpAddr::V4(_) => AddressFamily::Inet,
            IpAddr::V6(_) => AddressFamily::Inet6,
        };
        msg.header.destination_prefix_length = prefix_len;
        msg.header.table = RouteHeader::RT_TABLE_MAIN;
        msg.header.protocol = RouteProtocol::Static;
        msg.header.scope = RouteScope::Universe;
        msg.header.kind = RouteType::Unicast;
        if prefix_len > 0 {
            msg.attributes.push(RouteAttribute::Destination(dst.into()));
        }
        msg.attributes.push(RouteAttribute::Gateway(gateway.into()));
        self.ack(
            &format!("add route {dst}/{prefix_len} via {gateway}"),
            RouteNetlinkMessage::NewRoute(msg),
            NLM_F_CREATE | NLM_F_EXCL,
        )
    }

    /// Brings interface `index` up.
    pub fn set_up(&mut self, index: u32) -> Result<(), NetlinkError> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.header.flags = LinkFlags::Up;
        msg.header.change_mask = LinkFlags::Up;
        self.ack(&format!("bring interface {index} up"), RouteNetlinkMessage::SetLink(msg), 0)
    }

    /// Adds `addr/prefix_len` to interface `index` (IPv6 without duplicate address
    /// detection, so it is usable at once).
    pub fn add_address(&mut self, index: u32, addr: IpAddr, prefix_len: u8) -> Result<(), NetlinkError> {
        let mut msg = AddressMessage::default();
        msg.header.index = index;
        msg.header.prefix_len = prefix_len;
        msg.header.scope = AddressScope::Universe;
        match addr {
            IpAddr::V4(_) => {
                msg.header.family = AddressFamily::Inet;
                msg.attributes.push(AddressAttribute::Local(addr));
                msg.attributes.push(AddressAttribute::Address(addr));
            }
            IpAddr::V6(_) => {
                msg.header.family = AddressFamily::Inet6;
                msg.header.flags = AddressHeaderFlags::Nodad;
                msg.attributes.push(AddressAttribute::Address(addr));
                msg.attributes.push(AddressAttribute::Flags(AddressFlags::Nodad));
            }
        }
        self.ack(
            &format!("add address {addr}/{prefix_len} to interface {index}"),
            RouteNetlinkMessage::NewAddress(msg),
            NLM_F_CREATE | NLM_F_EXCL,
        )
    }

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

    /// The kernel's route for packets to `dst` (from `src` when it is one of our
    /// addresses), as `ip route get` asks; `None` when there is none (unreachable).
    pub fn get_route(&mut self, dst: IpAddr, src: IpAddr) -> Result<Option<RouteMessage>, NetlinkError> {
        let op = format!("route to {dst}");
        let mut msg = RouteMessage::default();
        let full = if dst.is_ipv4() { 32 } else { 128 };
        msg.header.address_family = if dst.is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 };
        msg.header.destination_prefix_length = full;
        msg.header.table = RouteHeader::RT_TABLE_UNSPEC;
        msg.attributes.push(RouteAttribute::Destination(dst.into()));
        if !src.is_unspecified() && src.is_ipv4() == dst.is_ipv4() {
            msg.header.source_prefix_length = full;
            msg.attributes.push(RouteAttribute::Source(src.into()));
        }
        match self.request(&op, RouteNetlinkMessage::GetRoute(msg), NLM_F_ACK) {
            Ok(replies) => Ok(replies.into_iter().find_map(|m| match m {
                RouteNetlinkMessage::NewRoute(r) => Some(r),
                _ => None,
            })),
            // No route at all (ENETUNREACH, EHOSTUNREACH, ...): an answer, not a failure.
            Err(e) if matches!(e.errno(), Some(libc::ENETUNREACH | libc::EHOSTUNREACH | libc::EINVAL)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The interface packets to `dst` leave through, when a route has one.
    pub fn output_interface(&mut self, dst: IpAddr) -> Result<Option<u32>, NetlinkError> {
        let unspecified: IpAddr =
            if dst.is_ipv4() { Ipv4Addr::UNSPECIFIED.into() } else { Ipv6Addr::UNSPECIFIED.into() };
        Ok(self.get_route(dst, unspecified)?.and_then(|r| {
            r.attributes.iter().find_map(|a| match a {
                RouteAttribute::Oif(i) => Some(*i),
                _ => None,
            })
        }))
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
    fn ext_ack_text_is_extracted() {
        let mut payload = vec![0u8; NLMSGHDR_LEN];
        let text = b"Specified qdisc kind is unknown.\0";
        let len = 4 + text.len();
        payload.extend_from_slice(&(len as u16).to_ne_bytes());
        payload.extend_from_slice(&NLMSGERR_ATTR_MSG.to_ne_bytes());
        payload.extend_from_slice(text);
        while !payload.len().is_multiple_of(4) {
            payload.push(0);
        }
        assert_eq!(ext_ack_message(&payload).as_deref(), Some("Specified qdisc kind is unknown."));
        assert_eq!(ext_ack_message(&payload[..10]), None);
        assert_eq!(ext_ack_message(&payload[..NLMSGHDR_LEN]), None);
    }

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

    #[test]
    fn loopback_exists_in_the_current_namespace() {
        let mut rtnl = Rtnl::open().unwrap();
        let lo = rtnl.link_index("lo").unwrap();
        assert_eq!(lo, 1);
        assert_eq!(rtnl.link_mtu(lo).unwrap(), 65536);
        let err = rtnl.link_index("nodev-xyz").unwrap_err();
        assert_eq!(err.errno(), Some(libc::ENODEV));
    }
}

//! A small synchronous rtnetlink client: links, veth pairs, addresses, routes and
//! neighbours; qdiscs and classes in `tc.rs`.
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
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST, NetlinkDeserializable, NetlinkHeader,
    NetlinkMessage, NetlinkPayload, NetlinkSerializable, NlaBuffer, NlasIterator,
};
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage, AddressScope};
use netlink_packet_route::link::{InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkInfo, LinkMessage};
use netlink_packet_route::neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState};
use netlink_packet_route::route::{RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

mod tc;

pub use tc::{
    ClassStats, HTB_MAJOR, HtbClass, MQPRIO_MAJOR, MQPRIO_MAX_TC, MQPRIO_TC_MINOR, MqprioChannel, QdiscInfo, QdiscStats,
};

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

    /// The largest number of segments interface `index` takes in one GSO packet
    /// (`gso_max_segs`).
    pub fn link_gso_max_segs(&mut self, index: u32) -> Result<u32, NetlinkError> {
        self.link_attribute(index, "gso_max_segs", |a| match a {
            LinkAttribute::GsoMaxSegs(n) => Some(*n),
            _ => None,
        })
    }

    /// Sets interface `index`'s `gso_max_segs` (`ip link set ... gso_max_segs n`). TCP
    /// sizes its packets by it: at 1 it builds one segment per packet, with no
    /// segmentation left for GSO or the device.
    pub fn set_gso_max_segs(&mut self, index: u32, segs: u32) -> Result<(), NetlinkError> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.attributes.push(LinkAttribute::GsoMaxSegs(segs));
        self.ack(&format!("set gso_max_segs {segs} on interface {index}"), RouteNetlinkMessage::SetLink(msg), 0)
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
    fn loopback_exists_in_the_current_namespace() {
        let mut rtnl = Rtnl::open().unwrap();
        let lo = rtnl.link_index("lo").unwrap();
        assert_eq!(lo, 1);
        assert_eq!(rtnl.link_mtu(lo).unwrap(), 65536);
        let err = rtnl.link_index("nodev-xyz").unwrap_err();
        assert_eq!(err.errno(), Some(libc::ENODEV));
    }
}

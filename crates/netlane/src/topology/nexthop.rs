//! Where a packet to an address leaves, for code that writes whole frames (PF_PACKET
//! and AF_XDP transmit paths): the route's output interface and next hop
//! (`RTM_GETROUTE`, as `ip route get` asks), the next hop's link-layer address
//! (`RTM_GETNEIGH`), and the interface's own address, type and MTU (`RTM_GETLINK`).
//!
//! Answers are cached and kept current by the kernel's notifications: a second netlink
//! socket joins the link, neighbour and IPv4/IPv6 route groups; a neighbour change drops
//! the entries that use that neighbour, a route or link change (or lost notifications)
//! drops them all, and the next lookup asks the kernel again.
//!
//! This module never resolves a neighbour itself: when the kernel has no usable
//! link-layer address yet, the answer is [`Unresolved::Neighbour`] and the caller sends
//! that packet through a socket, which makes the kernel resolve it (ARP or neighbour
//! discovery); the notification that follows clears the cached miss.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use netlink_packet_core::{NLM_F_ACK, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::AddressFamily;
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkLayerType, LinkMessage};
use netlink_packet_route::neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMetric, RouteType};
use netlink_sys::Socket;
use netlink_sys::protocols::NETLINK_ROUTE;

use super::netlink::{NetlinkError, Rtnl};

/// Most notification reads one [`NextHops::process_events`] makes.
const MAX_READS_PER_CALL: usize = 64;

/// Where frames to one destination go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NextHop {
    /// The output interface.
    pub ifindex: u32,
    /// The interface's own address.
    pub src_mac: [u8; 6],
    /// The next hop's address (the interface's own on loopback and NOARP links).
    pub dst_mac: [u8; 6],
    /// The path MTU (the route's, else the interface's).
    pub mtu: u32,
}

/// Why a destination has no next hop to write frames for (yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unresolved {
    /// The kernel has no usable link-layer address for the next hop yet.
    Neighbour,
    /// The route is not a unicast or local one (unreachable, blackhole, ...), or none.
    NoRoute,
    /// The output interface is not Ethernet or loopback.
    NotEthernet,
}

/// What the resolver did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct NextHopStats {
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups that asked the kernel.
    pub misses: u64,
    /// Notifications read.
    pub events: u64,
    /// Cache entries dropped by neighbour notifications.
    pub invalidated: u64,
    /// Whole-cache flushes (route or link changes, lost notifications).
    pub flushes: u64,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The neighbour this answer depends on (the gateway, or the destination).
    via: IpAddr,
    answer: Result<NextHop, Unresolved>,
    /// When it was asked (answers are asked again after [`MAX_AGE`]).
    at: Instant,
}

/// How long an answer is trusted without a notification: path MTU changes (route
/// exceptions learned from ICMP) come with none.
pub const MAX_AGE: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy)]
struct LinkInfo {
    mac: [u8; 6],
    mtu: u32,
    /// Loopback or NOARP: frames carry the interface's own address.
    own_address: bool,
}

/// Route-netlink multicast groups (include/uapi/linux/rtnetlink.h, `RTNLGRP_*`).
const RTNLGRP_LINK: u32 = 1;
const RTNLGRP_NEIGH: u32 = 3;
const RTNLGRP_IPV4_ROUTE: u32 = 7;
const RTNLGRP_IPV6_ROUTE: u32 = 11;

/// The most destinations cached; past it the cache starts over (a peer population
/// larger than this costs lookups, never memory).
pub const MAX_CACHED: usize = 65_536;

/// Next hops, looked up in the kernel of the calling thread's network namespace and
/// kept current.
#[derive(Debug)]
pub struct NextHops {
    rtnl: Rtnl,
    monitor: Socket,
    cache: HashMap<IpAddr, Entry>,
    links: HashMap<u32, LinkInfo>,
    stats: NextHopStats,
    buf: Vec<u8>,
}

/// A failed query as the `io::Error` this module returns: what was asked, then why.
fn io_err(e: NetlinkError) -> io::Error {
    io::Error::new(e.source.kind(), crate::error::chain(&e).to_string())
}

impl NextHops {
    /// Opens the query socket and the notification socket.
    pub fn open() -> io::Result<NextHops> {
        let rtnl = Rtnl::open()?;
        let mut monitor = Socket::new(NETLINK_ROUTE)?;
        monitor.bind_auto()?;
        for g in [RTNLGRP_LINK, RTNLGRP_NEIGH, RTNLGRP_IPV4_ROUTE, RTNLGRP_IPV6_ROUTE] {
            monitor.add_membership(g)?;
        }
        monitor.set_non_blocking(true)?;
        Ok(NextHops {
            rtnl,
            monitor,
            cache: HashMap::new(),
            links: HashMap::new(),
            stats: NextHopStats::default(),
            buf: vec![0; 64 << 10],
        })
    }

    /// What it did so far.
    pub fn stats(&self) -> NextHopStats {
        self.stats
    }

    /// The descriptor that becomes readable when the kernel's state changes: wait on
    /// it beside the traffic and call [`NextHops::process_events`].
    pub fn events_fd(&self) -> BorrowedFd<'_> {
        self.monitor.as_fd()
    }

    /// Where frames from `src` (one of our addresses) to `dst` go. `Err(Unresolved)`
    /// is an answer (send that packet another way); a failed query is an `io::Error`.
    pub fn lookup(&mut self, dst: IpAddr, src: IpAddr) -> io::Result<Result<NextHop, Unresolved>> {
        if let Some(e) = self.cache.get(&dst)
            && e.at.elapsed() < MAX_AGE
        {
            self.stats.hits += 1;
            return Ok(e.answer);
        }
        self.stats.misses += 1;
        let entry = self.query(dst, src)?;
        if self.cache.len() >= MAX_CACHED {
            self.cache.clear();
        }
        self.cache.insert(dst, entry);
        Ok(entry.answer)
    }

    fn query(&mut self, dst: IpAddr, src: IpAddr) -> io::Result<Entry> {
        let Some(route) = self.rtnl.get_route(dst, src).map_err(io_err)? else {
            return Ok(Entry { via: dst, answer: Err(Unresolved::NoRoute), at: Instant::now() });
        };
        if !matches!(route.header.kind, RouteType::Unicast | RouteType::Local) {
            return Ok(Entry { via: dst, answer: Err(Unresolved::NoRoute), at: Instant::now() });
        }
        let mut oif = None;
        let mut via = dst;
        let mut mtu = None;
        for a in &route.attributes {
            match a {
                RouteAttribute::Oif(i) => oif = Some(*i),
                RouteAttribute::Gateway(RouteAddress::Inet(g)) => via = IpAddr::V4(*g),
                RouteAttribute::Gateway(RouteAddress::Inet6(g)) => via = IpAddr::V6(*g),
                RouteAttribute::Metrics(ms) => {
                    for m in ms {
                        if let RouteMetric::Mtu(v) = m
                            && *v > 0
                        {
                            mtu = Some(*v);
                        }
                    }
                }
                _ => {}
            }
        }
        let Some(ifindex) = oif else { return Ok(Entry { via, answer: Err(Unresolved::NoRoute), at: Instant::now() }) };
        let link = match self.link(ifindex)? {
            Some(l) => l,
            None => return Ok(Entry { via, answer: Err(Unresolved::NotEthernet), at: Instant::now() }),
        };
        let dst_mac = if link.own_address {
            link.mac
        } else {
            match self.neighbour(ifindex, via)? {
                Some(m) => m,
                None => return Ok(Entry { via, answer: Err(Unresolved::Neighbour), at: Instant::now() }),
            }
        };
        let mtu = mtu.unwrap_or(link.mtu).min(link.mtu);
        Ok(Entry { via, answer: Ok(NextHop { ifindex, src_mac: link.mac, dst_mac, mtu }), at: Instant::now() })
    }

    /// The interface's address and MTU; None when it is not Ethernet or loopback.
    fn link(&mut self, ifindex: u32) -> io::Result<Option<LinkInfo>> {
        if let Some(l) = self.links.get(&ifindex) {
            return Ok(Some(*l));
        }
        let op = format!("read interface {ifindex}");
        let mut msg = LinkMessage::default();
        msg.header.index = ifindex;
        let replies = self.rtnl.request(&op, RouteNetlinkMessage::GetLink(msg), NLM_F_ACK).map_err(io_err)?;
        let Some(l) = replies.into_iter().find_map(|m| match m {
            RouteNetlinkMessage::NewLink(l) => Some(l),
            _ => None,
        }) else {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("{op}: no such interface")));
        };
        let loopback =
            l.header.link_layer_type == LinkLayerType::Loopback || l.header.flags.contains(LinkFlags::Loopback);
        if !loopback && l.header.link_layer_type != LinkLayerType::Ether {
            return Ok(None);
        }
        let mut info =
            LinkInfo { mac: [0; 6], mtu: 1500, own_address: loopback || l.header.flags.contains(LinkFlags::Noarp) };
        for a in &l.attributes {
            match a {
                LinkAttribute::Address(m) if m.len() == 6 => info.mac.copy_from_slice(m),
                LinkAttribute::Mtu(m) => info.mtu = *m,
                _ => {}
            }
        }
        self.links.insert(ifindex, info);
        Ok(Some(info))
    }

    /// The kernel's link-layer address for `addr` on `ifindex`, if it has a usable one.
    fn neighbour(&mut self, ifindex: u32, addr: IpAddr) -> io::Result<Option<[u8; 6]>> {
        let op = format!("neighbour {addr} on interface {ifindex}");
        let mut msg = NeighbourMessage::default();
        msg.header.family = if addr.is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 };
        msg.header.ifindex = ifindex;
        msg.attributes.push(NeighbourAttribute::Destination(match addr {
            IpAddr::V4(a) => NeighbourAddress::Inet(a),
            IpAddr::V6(a) => NeighbourAddress::Inet6(a),
        }));
        let replies = match self.rtnl.request(&op, RouteNetlinkMessage::GetNeighbour(msg), NLM_F_ACK) {
            Ok(r) => r,
            Err(e) if e.errno() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(io_err(e)),
        };
        Ok(replies.iter().find_map(|m| match m {
            RouteNetlinkMessage::NewNeighbour(n) => usable(n),
            _ => None,
        }))
    }

    /// Reads the pending notifications (up to 64 reads' worth) and drops what they make
    /// stale. Returns how many it read.
    pub fn process_events(&mut self) -> usize {
        let mut n = 0;
        // Bounded: a storm of neighbour changes cannot hold the caller's loop; what is
        // left keeps the socket readable for the next call.
        for _ in 0..MAX_READS_PER_CALL {
            let got = match self.monitor.recv(&mut &mut self.buf[..], libc::MSG_DONTWAIT) {
                Ok(0) => break,
                Ok(len) => len,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // ENOBUFS: notifications were lost; nothing cached can be trusted.
                    tracing::debug!(error = %e, "route notifications lost");
                    self.flush();
                    continue;
                }
            };
            let mut off = 0;
            while off + 16 <= got {
                let b = &self.buf[off..got];
                let len = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize;
                if len < 16 || len > b.len() {
                    self.flush();
                    break;
                }
                n += 1;
                match NetlinkMessage::<RouteNetlinkMessage>::deserialize(&b[..len]).map(|m| m.payload) {
                    Ok(NetlinkPayload::InnerMessage(
                        RouteNetlinkMessage::NewNeighbour(m) | RouteNetlinkMessage::DelNeighbour(m),
                    )) => self.neighbour_changed(&m),
                    Ok(NetlinkPayload::InnerMessage(
                        RouteNetlinkMessage::NewNeighbourTable(_) | RouteNetlinkMessage::SetNeighbourTable(_),
                    )) => {}
                    // Routes, links, anything else (or undecodable): start over.
                    _ => self.flush(),
                }
                off += (len + 3) & !3;
            }
        }
        self.stats.events += n as u64;
        n
    }

    fn neighbour_changed(&mut self, m: &NeighbourMessage) {
        let Some(addr) = m.attributes.iter().find_map(|a| match a {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => Some(IpAddr::V4(*a)),
            NeighbourAttribute::Destination(NeighbourAddress::Inet6(a)) => Some(IpAddr::V6(*a)),
            _ => None,
        }) else {
            return;
        };
        let before = self.cache.len();
        self.cache.retain(|_, e| e.via != addr);
        self.stats.invalidated += (before - self.cache.len()) as u64;
    }

    /// Forgets everything cached.
    pub fn flush(&mut self) {
        self.cache.clear();
        self.links.clear();
        self.stats.flushes += 1;
    }
}

/// The address of a neighbour entry in a state the kernel itself would send with.
fn usable(n: &NeighbourMessage) -> Option<[u8; 6]> {
    if !matches!(
        n.header.state,
        NeighbourState::Reachable
            | NeighbourState::Stale
            | NeighbourState::Delay
            | NeighbourState::Probe
            | NeighbourState::Permanent
            | NeighbourState::Noarp
    ) {
        return None;
    }
    n.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::LinkLayerAddress(m) if m.len() == 6 => {
            let mut mac = [0u8; 6];
            mac.copy_from_slice(m);
            Some(mac)
        }
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_destinations_leave_through_lo_with_its_own_address() {
        let mut hops = NextHops::open().unwrap();
        let lo = "127.0.0.1".parse().unwrap();
        let hop = hops.lookup(lo, lo).unwrap().unwrap();
        assert_eq!(hop.ifindex, 1);
        assert_eq!(hop.dst_mac, hop.src_mac);
        assert_eq!(hop.mtu, 65536);
        let v6: IpAddr = "::1".parse().unwrap();
        assert_eq!(hops.lookup(v6, v6).unwrap().unwrap().ifindex, 1);
        // Cached the second time.
        hops.lookup(lo, lo).unwrap().unwrap();
        assert_eq!(hops.stats().hits, 1);
        assert_eq!(hops.stats().misses, 2);
    }
}

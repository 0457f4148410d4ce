//! UDP datagram paths: sockets, a sender with GSO/zerocopy and latched fallbacks, and a
//! receiver with recvmmsg batching and GRO splitting.
//!
//! The shape follows quinn-udp: the caller says what to send (a buffer cut into
//! `segment_size` datagrams) and the [`Sender`] picks the cheapest path the socket has
//! left (GSO, sendmmsg, or one sendmsg per datagram), latching a fallback when the
//! kernel refuses a feature at run time. Unlike quinn-udp, a GSO send that fails with
//! EIO/EINVAL is sent again as individual datagrams, so a fallback never loses data.

pub mod gro;
pub mod gso;
mod rx;
mod tx;

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

pub use rx::{Datagram, Receiver, ReceiverConfig, RxBatching, RxStats};
pub use tx::{Batching, GsoMode, SendError, SendReport, Sender, SenderConfig, TxStats, TxSyscalls};

use crate::sockopt;

/// A UDP socket (blocking, close-on-exec) that knows its address family and peer.
#[derive(Debug)]
pub struct UdpSocket {
    inner: Socket,
    ipv6: bool,
    peer: Option<SocketAddr>,
}

impl UdpSocket {
    /// Binds a new socket to `addr` (port 0 picks a free port).
    pub fn bind(addr: SocketAddr) -> io::Result<Self> {
        let inner = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
        if addr.is_ipv6() {
            inner.set_only_v6(true)?;
        }
        inner.bind(&SockAddr::from(addr))?;
        Ok(Self { inner, ipv6: addr.is_ipv6(), peer: None })
    }

    /// Binds to the unspecified address of `peer`'s family and connects to `peer`.
    pub fn connect_to(peer: SocketAddr) -> io::Result<Self> {
        let any: SocketAddr = if peer.is_ipv6() {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        } else {
            (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
        };
        let mut s = Self::bind(any)?;
        s.connect(peer)?;
        Ok(s)
    }

    /// Connects to `peer`: sends need no address and the kernel caches the route.
    pub fn connect(&mut self, peer: SocketAddr) -> io::Result<()> {
        self.inner.connect(&SockAddr::from(peer))?;
        self.peer = Some(peer);
        Ok(())
    }

    /// The connected peer, if any.
    pub fn peer(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// The bound local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()?.as_socket().ok_or_else(|| io::Error::other("socket has a non-IP local address"))
    }

    /// Whether the socket is IPv6.
    pub fn is_ipv6(&self) -> bool {
        self.ipv6
    }

    /// The underlying socket2 socket, for options not wrapped here.
    pub fn socket(&self) -> &Socket {
        &self.inner
    }

    /// Blocking reads return `WouldBlock` after `timeout` (None: block forever).
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.inner.set_read_timeout(timeout)
    }

    /// Enables `UDP_GRO` on this socket.
    pub fn enable_gro(&self) -> io::Result<()> {
        sockopt::set_udp_gro(self.as_fd(), true)
    }

    /// Enables `SO_ZEROCOPY` (sends still need `MSG_ZEROCOPY`).
    pub fn enable_zerocopy(&self) -> io::Result<()> {
        sockopt::set_zerocopy(self.as_fd(), true)
    }

    /// Sets the receive buffer (forcing past `rmem_max` when privileged); returns the
    /// resulting size.
    pub fn set_recv_buffer(&self, bytes: usize) -> io::Result<usize> {
        sockopt::set_recv_buffer(self.as_fd(), bytes)
    }

    /// Sets the send buffer; returns the resulting size.
    pub fn set_send_buffer(&self, bytes: usize) -> io::Result<usize> {
        sockopt::set_send_buffer(self.as_fd(), bytes)
    }

    /// Largest UDP payload one datagram can carry to the connected peer without
    /// fragmenting (path MTU minus IP and UDP headers).
    pub fn max_datagram_payload(&self) -> io::Result<usize> {
        let mtu = sockopt::path_mtu(self.as_fd(), self.ipv6)?;
        Ok(mtu.saturating_sub(ip_udp_header_len(self.ipv6)))
    }
}

impl AsFd for UdpSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.as_fd()
    }
}

/// Bytes of IP and UDP header per datagram: 28 for IPv4 (no options), 48 for IPv6.
pub fn ip_udp_header_len(ipv6: bool) -> usize {
    if ipv6 { 40 + 8 } else { 20 + 8 }
}

/// Largest UDP payload a datagram may carry on a link with this MTU.
pub fn max_payload_for_mtu(mtu: usize, ipv6: bool) -> usize {
    mtu.saturating_sub(ip_udp_header_len(ipv6))
}

//! The receive paths: how requests get from the kernel to the server thread.

use std::fmt;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::str::FromStr;

use netlane_sys::msg::RecvBatch;

/// A receive path, selectable at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PathKind {
    /// `recvfrom` until `EAGAIN`, then `epoll_wait` (netserver's loop).
    Recvfrom,
    /// `recvmmsg` batches.
    Recvmmsg,
    /// A PF_PACKET TPACKET_V2 receive ring.
    TpacketV2,
    /// A PF_PACKET TPACKET_V3 receive ring (woken per block).
    TpacketV3,
    /// An AF_XDP socket per receive queue.
    AfXdp,
}

impl PathKind {
    /// Every path, in the order reports list them.
    pub const ALL: [PathKind; 5] =
        [PathKind::Recvfrom, PathKind::Recvmmsg, PathKind::TpacketV2, PathKind::TpacketV3, PathKind::AfXdp];

    /// The name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            PathKind::Recvfrom => "recvfrom",
            PathKind::Recvmmsg => "recvmmsg",
            PathKind::TpacketV2 => "tpacket-v2",
            PathKind::TpacketV3 => "tpacket-v3",
            PathKind::AfXdp => "af-xdp",
        }
    }

    /// Whether this build has the path.
    pub fn available(self) -> bool {
        matches!(self, PathKind::Recvfrom | PathKind::Recvmmsg)
    }
}

impl fmt::Display for PathKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PathKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        PathKind::ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| {
            let names: Vec<_> = PathKind::ALL.iter().map(|p| p.name()).collect();
            format!("unknown receive path {s:?}: expected one of {}", names.join(", "))
        })
    }
}

/// A receive path, set up.
#[derive(Debug)]
pub enum RxPath {
    /// One `recvfrom` per datagram.
    Recvfrom {
        /// Room for the largest datagram.
        buf: Vec<u8>,
    },
    /// `recvmmsg` into a batch of slots.
    Recvmmsg(RecvBatch),
}

/// Room for any UDP datagram.
const SLOT: usize = 65_536;

impl RxPath {
    /// Sets up `kind` on the service socket.
    pub fn new(kind: PathKind, _sock: &UdpSocket, batch: usize) -> io::Result<RxPath> {
        match kind {
            PathKind::Recvfrom => Ok(RxPath::Recvfrom { buf: vec![0; SLOT] }),
            PathKind::Recvmmsg => Ok(RxPath::Recvmmsg(RecvBatch::new(batch, SLOT, 0, true))),
            other => Err(io::Error::new(io::ErrorKind::Unsupported, format!("{other} is not available yet"))),
        }
    }

    /// The descriptor to wait on.
    pub fn fd<'a>(&'a self, sock: &'a UdpSocket) -> BorrowedFd<'a> {
        sock.as_fd()
    }

    /// One receive call: hands each datagram and its sender to `f`; returns how many.
    /// `WouldBlock` when there was nothing.
    pub fn recv(&mut self, sock: &UdpSocket, f: &mut dyn FnMut(&[u8], SocketAddr)) -> io::Result<usize> {
        match self {
            RxPath::Recvfrom { buf } => {
                let (n, from) = sock.recv_from(buf)?;
                f(&buf[..n], from);
                Ok(1)
            }
            RxPath::Recvmmsg(batch) => {
                let n = batch.recv_many(sock.as_fd(), batch.slots(), libc::MSG_DONTWAIT)?;
                for i in 0..n {
                    // A datagram without a source cannot be answered (an unnamed
                    // socket's); it is not a request anyone waits for.
                    if let Some(from) = batch.source(i) {
                        f(batch.data(i), from);
                    }
                }
                Ok(n)
            }
        }
    }
}

//! The netdev generic-netlink family (Linux 6.8+): which NAPI instances a device has
//! and which kernel threads run them, so the lab can place threaded NAPI on a chosen
//! CPU like a NIC's interrupt affinity.

use std::fmt;

use super::genl::{Attr, Family, GenlSocket, attr_u32, attrs};
use super::netlink::NetlinkError;

// include/uapi/linux/netdev.h
const NETDEV_CMD_NAPI_GET: u8 = 11;
const NETDEV_A_NAPI_IFINDEX: u16 = 1;
const NETDEV_A_NAPI_ID: u16 = 2;
const NETDEV_A_NAPI_PID: u16 = 4;

#[derive(Debug, Clone)]
struct NetdevFamily;

impl Family for NetdevFamily {
    const NAME: &'static str = "netdev";
    const VERSION: u8 = 1;
}

/// One NAPI instance of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Napi {
    /// The NAPI id (what SO_INCOMING_NAPI_ID reports).
    pub id: u32,
    /// The kernel thread running it, when NAPI is threaded.
    pub pid: Option<u32>,
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
        let mut out = Vec::new();
        for raw in &replies {
            let (mut id, mut pid, mut dev) = (None, None, None);
            for (kind, v) in attrs(raw) {
                match kind {
                    NETDEV_A_NAPI_ID => id = attr_u32(v),
                    NETDEV_A_NAPI_PID => pid = attr_u32(v),
                    NETDEV_A_NAPI_IFINDEX => dev = attr_u32(v),
                    _ => {}
                }
            }
            if let Some(id) = id
                && dev.is_none_or(|d| d == ifindex)
            {
                out.push(Napi { id, pid });
            }
        }
        Ok(out)
    }
}

//! The AF_XDP steering program (`bpf/rr/xsk_redirect.bpf.c`): the service's UDP
//! datagrams (its port, on the addresses its socket takes) to the queue's AF_XDP
//! socket, everything else to the stack.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use libbpf_rs::MapCore;
use libbpf_rs::MapFlags;
use libbpf_rs::skel::{OpenSkel, SkelBuilder};

use super::{object_storage, percpu_sum, to_io, xsk_redirect_skel};

/// Most queues the program can steer (the XSKMAP's size).
pub const MAX_QUEUES: u32 = 64;

/// Which destination addresses of one family the program steers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XskDst<A> {
    /// None of the family.
    No,
    /// Any address.
    Any,
    /// Only this address.
    Only(A),
}

/// The steering program, loaded for one service.
pub struct XskRedirect {
    skel: xsk_redirect_skel::XskRedirectSkel<'static>,
}

impl std::fmt::Debug for XskRedirect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XskRedirect").finish_non_exhaustive()
    }
}

impl XskRedirect {
    /// Loads the program for UDP port `port` on the destinations `v4` and `v6`, on an
    /// interface whose MAC is `own_mac` (unicast frames for another MAC pass to the
    /// stack; `None`: no check).
    pub fn load(
        port: u16,
        v4: XskDst<Ipv4Addr>,
        v6: XskDst<Ipv6Addr>,
        own_mac: Option<[u8; 6]>,
    ) -> io::Result<XskRedirect> {
        let mut open = xsk_redirect_skel::XskRedirectSkelBuilder::default().open(object_storage()).map_err(to_io)?;
        let ro = open.maps.rodata_data.as_deref_mut().ok_or_else(|| io::Error::other("xsk_redirect has no .rodata"))?;
        ro.service_port = port;
        if let Some(mac) = own_mac {
            ro.own_mac = mac;
        }
        ro.take_v4 = u8::from(v4 != XskDst::No);
        if let XskDst::Only(a) = v4 {
            ro.v4_exact = 1;
            ro.v4_dst = u32::from_ne_bytes(a.octets());
        }
        ro.take_v6 = u8::from(v6 != XskDst::No);
        if let XskDst::Only(a) = v6 {
            ro.v6_exact = 1;
            for (word, bytes) in ro.v6_dst.iter_mut().zip(a.octets().chunks_exact(4)) {
                *word = u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
            }
        }
        Ok(XskRedirect { skel: open.load().map_err(to_io)? })
    }

    /// The program, to attach with [`super::XdpLink`].
    pub fn prog_fd(&self) -> BorrowedFd<'_> {
        self.skel.progs.xsk_redirect.as_fd()
    }

    /// Steers queue `queue`'s datagrams to the socket `xsk`.
    pub fn register(&self, queue: u32, xsk: BorrowedFd<'_>) -> io::Result<()> {
        let fd = xsk.as_raw_fd() as u32;
        self.skel.maps.xsks.update(&queue.to_ne_bytes(), &fd.to_ne_bytes(), MapFlags::ANY).map_err(to_io)
    }

    /// Frames redirected to a socket, and frames passed to the stack.
    pub fn counts(&self) -> io::Result<(u64, u64)> {
        Ok((percpu_sum(&self.skel.maps.xsk_stats, 0)?, percpu_sum(&self.skel.maps.xsk_stats, 1)?))
    }
}

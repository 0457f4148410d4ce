//! The SO_REUSEPORT group selector (`bpf/lanes/reuseport_napi.bpf.c`): a new connection
//! (or datagram) goes to the group's socket that user space assigned to the NAPI id it
//! arrived through; others to the kernel's hash.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use libbpf_rs::MapCore;
use libbpf_rs::skel::{OpenSkel, SkelBuilder};

use super::{object_storage, percpu_sum, reuseport_napi_skel, to_io};

/// Most NAPI ids the program steers (`MAX_NAPI_IDS` in the C).
pub const REUSEPORT_MAX_NAPI_IDS: usize = 4096;

/// The program, loaded; attach it to a group with [`ReuseportNapi::attach`].
pub struct ReuseportNapi {
    skel: reuseport_napi_skel::ReuseportNapiSkel<'static>,
}

impl std::fmt::Debug for ReuseportNapi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReuseportNapi").finish_non_exhaustive()
    }
}

impl ReuseportNapi {
    /// Loads the program with an empty map: every packet goes to the kernel's hash.
    pub fn load() -> io::Result<ReuseportNapi> {
        let open = reuseport_napi_skel::ReuseportNapiSkelBuilder::default().open(object_storage()).map_err(to_io)?;
        Ok(ReuseportNapi { skel: open.load().map_err(to_io)? })
    }

    /// Makes it the selector of `sock`'s SO_REUSEPORT group (every socket of the group,
    /// those that join later too; `SO_ATTACH_REUSEPORT_EBPF`, Linux 4.6).
    pub fn attach(&self, sock: BorrowedFd<'_>) -> io::Result<()> {
        let prog = self.skel.progs.reuseport_napi.as_fd().as_raw_fd();
        crate::sockopt::set_int(sock, libc::SOL_SOCKET, libc::SO_ATTACH_REUSEPORT_EBPF, prog)
    }

    /// Packets arriving through `napi_id` go to the group's socket number `index`.
    pub fn steer(&self, napi_id: u32, index: u32) -> io::Result<()> {
        self.skel
            .maps
            .napi_lane
            .update(&napi_id.to_ne_bytes(), &index.to_ne_bytes(), libbpf_rs::MapFlags::ANY)
            .map_err(to_io)
    }

    /// Packets arriving through `napi_id` go to the kernel's hash again.
    pub fn forget(&self, napi_id: u32) -> io::Result<()> {
        match self.skel.maps.napi_lane.delete(&napi_id.to_ne_bytes()) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(to_io(e)),
        }
    }

    /// (packets steered by their NAPI id, packets left to the kernel's hash).
    pub fn counts(&self) -> io::Result<(u64, u64)> {
        Ok((percpu_sum(&self.skel.maps.napi_stats, 0)?, percpu_sum(&self.skel.maps.napi_stats, 1)?))
    }
}

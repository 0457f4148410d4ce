//! The packet fanout program (`bpf/rr/ring_select.bpf.c`) that hands every frame to one
//! member of a fanout group, the one user space names.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};

use libbpf_rs::skel::{OpenSkel, SkelBuilder};

use super::{object_storage, ring_select_skel, to_io};

/// The program, loaded; steer with [`RingSelect::select`].
pub struct RingSelect {
    skel: ring_select_skel::RingSelectSkel<'static>,
}

impl std::fmt::Debug for RingSelect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingSelect").field("active", &self.active()).finish()
    }
}

impl RingSelect {
    /// Loads the program, selecting member 0. Fails when the kernel cannot map the
    /// program's global data (before 5.5): a selection would then change nothing.
    pub fn load() -> io::Result<RingSelect> {
        let open = ring_select_skel::RingSelectSkelBuilder::default().open(object_storage()).map_err(to_io)?;
        let skel = open.load().map_err(to_io)?;
        if skel.maps.bss_data.is_none() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the ring selector's global data is not memory-mapped (a kernel before 5.5)",
            ));
        }
        Ok(RingSelect { skel })
    }

    /// The program, for [`crate::packet::PacketRing::set_fanout_program`].
    pub fn prog_fd(&self) -> BorrowedFd<'_> {
        self.skel.progs.ring_select.as_fd()
    }

    /// Hands the frames that arrive from now on to member `index` (joining order; the
    /// kernel takes it modulo the members). A plain store into the program's
    /// memory-mapped global data: frames already being delivered may still go to the
    /// previous member.
    pub fn select(&mut self, index: u32) {
        if let Some(bss) = self.skel.maps.bss_data.as_deref_mut() {
            // A volatile store: the kernel reads this word concurrently, so the write
            // must happen now and exactly once, not be merged or deferred.
            let slot: *mut u32 = &mut bss.active_ring;
            // SAFETY: `slot` comes from a live `&mut` into the mapped .bss (aligned,
            // valid for writes for as long as the skeleton lives, which `self` holds).
            unsafe { std::ptr::write_volatile(slot, index) };
        }
    }

    /// The member selected.
    pub fn active(&self) -> u32 {
        self.skel.maps.bss_data.as_deref().map_or(0, |b| b.active_ring)
    }
}

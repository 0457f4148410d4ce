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
    /// Loads the program, selecting member 0.
    pub fn load() -> io::Result<RingSelect> {
        let open = ring_select_skel::RingSelectSkelBuilder::default().open(object_storage()).map_err(to_io)?;
        Ok(RingSelect { skel: open.load().map_err(to_io)? })
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
            bss.active_ring = index;
        }
    }

    /// The member selected.
    pub fn active(&self) -> u32 {
        self.skel.maps.bss_data.as_deref().map_or(0, |b| b.active_ring)
    }
}

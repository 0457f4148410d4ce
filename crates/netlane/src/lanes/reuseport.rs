//! Lanes without an acceptor: an `SO_REUSEPORT` group with one socket per lane and a
//! BPF selector that gives each new connection (TCP) or datagram (UDP) to the socket of
//! the lane owning the NAPI id it arrived through (the talk's "no application change"
//! path: the kernel places the flow, no thread hands it over).
//!
//! The selector returns an index into the group, and the kernel numbers a group's
//! sockets in the order they joined (`listen(2)` for TCP, `bind(2)` for UDP); when one
//! closes, the last takes its place (socket(7), `SO_ATTACH_REUSEPORT_EBPF`). The group
//! mirrors that order, so the indices it writes stay right as lanes come and go.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::BorrowedFd;

use netlane_sys::bpf::{REUSEPORT_MAX_NAPI_IDS, ReuseportNapi};

use super::map::{LaneId, LaneMap};

/// The selector and the group's order.
#[derive(Debug)]
pub struct ReuseportSteering {
    prog: ReuseportNapi,
    /// The group's sockets in the kernel's order: index -> lane.
    order: Vec<LaneId>,
    /// What the selector's map holds: NAPI id -> index.
    written: BTreeMap<u32, u32>,
}

impl ReuseportSteering {
    /// Loads the selector (its map empty: everything to the kernel's hash).
    pub fn load() -> io::Result<ReuseportSteering> {
        Ok(ReuseportSteering { prog: ReuseportNapi::load()?, order: Vec::new(), written: BTreeMap::new() })
    }

    /// Attaches the selector to the group `sock` belongs to (or will found: attach to
    /// the first socket before `listen`/`bind`... any member works).
    pub fn attach(&self, sock: BorrowedFd<'_>) -> io::Result<()> {
        self.prog.attach(sock)
    }

    /// `lane`'s socket joined the group (it is now last).
    pub fn joined(&mut self, lane: LaneId) {
        self.order.push(lane);
    }

    /// `lane`'s socket left the group: the last socket takes its index.
    pub fn left(&mut self, lane: LaneId) {
        if let Some(i) = self.order.iter().position(|&l| l == lane) {
            self.order.swap_remove(i);
        }
    }

    /// The index of `lane`'s socket in the group.
    pub fn index_of(&self, lane: LaneId) -> Option<u32> {
        self.order.iter().position(|&l| l == lane).map(|i| i as u32)
    }

    /// Writes every NAPI id `map` assigns to a lane in the group, with that lane's
    /// index, and removes the ids it no longer has a lane for. At most
    /// [`REUSEPORT_MAX_NAPI_IDS`] ids are steered; the rest go to the kernel's hash.
    pub fn sync(&mut self, map: &LaneMap) -> io::Result<()> {
        let mut want = BTreeMap::new();
        for (lane, share) in map.lanes() {
            if let Some(index) = self.index_of(lane) {
                for &id in &share.napi_ids {
                    if want.len() < REUSEPORT_MAX_NAPI_IDS {
                        want.insert(id, index);
                    }
                }
            }
        }
        // Stale entries go first (room in a full map, and no id left pointing at an
        // index that now belongs to another socket); `written` follows each change, so a
        // failure leaves it true and the next sync repairs the rest.
        let stale: Vec<u32> = self.written.keys().filter(|id| !want.contains_key(id)).copied().collect();
        for id in stale {
            self.prog.forget(id)?;
            self.written.remove(&id);
        }
        for (&id, &index) in &want {
            if self.written.get(&id) != Some(&index) {
                self.prog.steer(id, index)?;
                self.written.insert(id, index);
            }
        }
        Ok(())
    }

    /// What the selector holds: NAPI id -> index.
    pub fn steered(&self) -> &BTreeMap<u32, u32> {
        &self.written
    }

    /// (packets steered by NAPI id, packets left to the kernel's hash).
    pub fn counts(&self) -> io::Result<(u64, u64)> {
        self.prog.counts()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_group_order_follows_the_kernels_rule() {
        // Loading the selector needs root (CAP_BPF).
        if !netlane_testkit::privileged("the_group_order_follows_the_kernels_rule") {
            return;
        }
        let mut g = ReuseportSteering::load().unwrap();
        for lane in [0, 1, 2, 3] {
            g.joined(lane);
        }
        g.left(1);
        // socket(7): the last socket moves into the closed one's place.
        assert_eq!((g.index_of(0), g.index_of(3), g.index_of(2), g.index_of(1)), (Some(0), Some(1), Some(2), None));
        let mut map = LaneMap::new(4).unwrap();
        map.learn(&[10, 11, 12, 13]);
        map.remove_lane(1).unwrap();
        g.sync(&map).unwrap();
        let steered = g.steered().clone();
        assert_eq!(steered.len(), 4);
        for (id, index) in steered {
            let lane = map.owner(id).unwrap();
            assert_eq!(Some(index), g.index_of(lane), "id {id}");
        }
    }
}

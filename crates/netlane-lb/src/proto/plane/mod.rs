//! What the data plane must be told, as a list of operations: the control plane's
//! bookkeeping of VIP and real indexes and real generations, kept here without I/O.
//!
//! Real indexes belong to one VIP. A real's generation changes whenever its index is
//! removed or reused, and the data plane compares generations before trusting any state
//! that names a real (connection entries, flow cache, tags), so a removed real never
//! receives another packet. Freed indexes are reused last-freed-last (FIFO) to keep
//! stale state rare.
//!
//! Operations come in a safe order: new reals before the rings that use them, rings
//! before the VIP entries that make them reachable, and removed reals cleared only
//! after no ring points at them.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::IpAddr;

use crate::proto::config::{Config, Vip, VipChange, VipKey, VipRings, diff_with_rings};
use crate::proto::maglev;

/// One change to the data plane's maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Real `index` is `address`, serving VIP `vip`, at `generation`.
    SetReal {
        /// Real index.
        index: u32,
        /// Where to encapsulate to.
        address: IpAddr,
        /// Its VIP's index.
        vip: u32,
        /// Its generation.
        generation: u32,
    },
    /// Real `index` is gone; its generation moves on.
    ClearReal {
        /// Real index.
        index: u32,
        /// The new generation.
        generation: u32,
    },
    /// The VIP entry {address, port, proto} -> ring `index`.
    SetVip {
        /// Address.
        address: IpAddr,
        /// Port (0 = any).
        port: u16,
        /// IP protocol number.
        proto: u8,
        /// Ring index.
        index: u32,
        /// No connection state.
        no_lru: bool,
    },
    /// The VIP entry is removed.
    RemoveVip {
        /// Address.
        address: IpAddr,
        /// Port.
        port: u16,
        /// IP protocol number.
        proto: u8,
    },
    /// Ring `vip`'s slots (real indexes, `u32::MAX` = none).
    SetRing {
        /// Ring index.
        vip: u32,
        /// The slots.
        ring: Vec<u32>,
    },
    /// Some of ring `vip`'s slots: `(slot, real index)`, `u32::MAX` = none.
    PatchRing {
        /// Ring index.
        vip: u32,
        /// The slots that change.
        slots: Vec<(u32, u32)>,
    },
    /// `address` is (or stops being) a VIP address for ICMP echo.
    VipAddress {
        /// Address.
        address: IpAddr,
        /// Present or not.
        present: bool,
    },
}

/// Why a configuration cannot be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// More VIPs or reals than the data plane was sized for.
    #[error("{0}")]
    Capacity(String),
    /// A setting that is fixed once the data plane is loaded.
    #[error("{0}")]
    NeedsRestart(String),
    /// A ring could not be built.
    #[error(transparent)]
    Ring(#[from] maglev::RingError),
}

#[derive(Debug, Clone)]
struct VipState {
    index: u32,
    no_lru: bool,
    /// Real address -> real index.
    reals: HashMap<IpAddr, u32>,
}

/// The result of applying a configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    /// What to write, in order.
    pub ops: Vec<Op>,
    /// What changed, per VIP (reals added/removed/reweighted, ring slots moved).
    pub changes: Vec<VipChange>,
}

/// The control plane's view of the data plane's indexes.
#[derive(Debug, Clone)]
pub struct ControlPlane {
    max_vips: u32,
    max_reals: u32,
    current: Option<Config>,
    vips: HashMap<VipKey, VipState>,
    free_vips: VecDeque<u32>,
    free_reals: VecDeque<u32>,
    generations: Vec<u32>,
}

impl ControlPlane {
    /// A control plane for a data plane with room for `max_vips` VIPs and `max_reals`
    /// reals.
    pub fn new(max_vips: u32, max_reals: u32) -> ControlPlane {
        ControlPlane {
            max_vips,
            max_reals,
            current: None,
            vips: HashMap::new(),
            free_vips: (0..max_vips).collect(),
            free_reals: (0..max_reals).collect(),
            generations: vec![0; max_reals as usize],
        }
    }

    /// Real `index`'s current generation (bumped whenever the index is assigned or
    /// cleared): state that names another generation is stale.
    pub fn real_generation(&self, index: u32) -> Option<u32> {
        self.generations.get(index as usize).copied()
    }

    /// The configuration applied last.
    pub fn current(&self) -> Option<&Config> {
        self.current.as_ref()
    }

    /// VIP `v`'s ring index and its reals' indexes (by address), if configured.
    pub fn indexes(&self, v: &Vip) -> Option<(u32, &HashMap<IpAddr, u32>)> {
        self.vips.get(&(v.address, v.port, v.proto)).map(|s| (s.index, &s.reals))
    }

    /// The operations that take the data plane from the current configuration to
    /// `new` (which must be valid), and applies them to this view. Nothing changes here
    /// if it fails.
    pub fn apply(&mut self, new: &Config) -> Result<Update, PlanError> {
        let (update, next) = self.plan(new)?;
        *self = next;
        Ok(update)
    }

    /// The operations that take the data plane from the current configuration to
    /// `new` (which must be valid), and the view after them; this one is left as it
    /// is, so a plan may be made on another thread from a copy.
    pub fn plan(&self, new: &Config) -> Result<(Update, ControlPlane), PlanError> {
        if let Some(cur) = &self.current
            && (cur.ring_size != new.ring_size || cur.conn_entries != new.conn_entries)
        {
            return Err(PlanError::NeedsRestart(format!(
                "ring_size and conn_entries size the data plane's maps: changing them ({} -> {}, {} -> {}) needs a restart",
                cur.ring_size, new.ring_size, cur.conn_entries, new.conn_entries
            )));
        }
        let empty = Config { vips: Vec::new(), ..new.clone() };
        let old = self.current.as_ref().unwrap_or(&empty);
        let (changes, rings) = diff_with_rings(old, new)?;
        let old_vips: HashMap<VipKey, &Vip> = old.vips.iter().map(|v| (v.key(), v)).collect();
        let new_keys: HashSet<VipKey> = new.vips.iter().map(Vip::key).collect();
        // Work on a copy; it becomes the view only if everything fits.
        let mut next = self.clone();
        let mut ops = Vec::new();
        let mut clears = Vec::new();

        next.plan_gone_vips(&new_keys, new.ring_size, &mut ops);
        for v in &new.vips {
            let k = v.key();
            next.plan_vip(v, rings.get(&k), old_vips.get(&k).copied(), &mut ops, &mut clears)?;
        }
        for idx in clears {
            next.clear_real(idx, &mut ops);
        }
        ops.extend(vip_address_ops(old, new));
        next.current = Some(new.clone());
        Ok((Update { ops, changes }, next))
    }

    /// VIPs that go away: unreachable first, then their reals, at once: before this
    /// update can give the VIP's index to a new VIP, whose packets would otherwise
    /// accept a destination tag naming one of the old VIP's reals (a real belongs
    /// to the VIP whose index it carries).
    fn plan_gone_vips(&mut self, new_keys: &HashSet<VipKey>, ring_size: u32, ops: &mut Vec<Op>) {
        let mut gone: Vec<VipKey> = self.vips.keys().filter(|k| !new_keys.contains(k)).copied().collect();
        gone.sort_unstable_by_key(|k| self.vips[k].index);
        for k in gone {
            let Some(st) = self.vips.remove(&k) else { continue };
            ops.push(Op::RemoveVip { address: k.0, port: k.1, proto: k.2.number() });
            ops.push(Op::SetRing { vip: st.index, ring: vec![maglev::EMPTY; ring_size as usize] });
            let mut reals: Vec<u32> = st.reals.into_values().collect();
            reals.sort_unstable();
            for idx in reals {
                self.clear_real(idx, ops);
            }
            self.free_vips.push_back(st.index);
        }
    }

    /// One VIP of the new configuration: its index if it is new, its reals that arrive
    /// (those that go are left in `clears`, to be cleared once no ring points at them),
    /// its ring if it changed (`vip_rings`; `old` is the VIP as configured before), and
    /// its entry if it is new or its connection tracking changed.
    fn plan_vip(
        &mut self,
        v: &Vip,
        vip_rings: Option<&VipRings>,
        old: Option<&Vip>,
        ops: &mut Vec<Op>,
        clears: &mut Vec<u32>,
    ) -> Result<(), PlanError> {
        let k = v.key();
        let is_new = !self.vips.contains_key(&k);
        if is_new {
            let index = self.free_vips.pop_front().ok_or_else(|| {
                PlanError::Capacity(format!("VIP {}: the data plane has room for {} VIPs", v.name(), self.max_vips))
            })?;
            self.vips.insert(k, VipState { index, no_lru: v.no_lru, reals: HashMap::new() });
        }
        let Some(mut st) = self.vips.remove(&k) else { return Ok(()) };
        // The ring as the data plane holds it (real indexes), before reals go: a
        // changed ring is written as the slots that differ from it.
        let old_ring: Option<Vec<u32>> = match (vip_rings.and_then(|r| r.old.as_ref()), old) {
            (Some(slots), Some(ov)) if !is_new => Some(ring_indexes(slots, ov, &st.reals)),
            _ => None,
        };
        // Reals that go away.
        let listed: HashSet<IpAddr> = v.reals.iter().map(|r| r.address).collect();
        let removed: Vec<IpAddr> = st.reals.keys().filter(|a| !listed.contains(a)).copied().collect();
        for a in removed {
            if let Some(idx) = st.reals.remove(&a) {
                clears.push(idx);
            }
        }
        // Reals that arrive.
        for r in &v.reals {
            if st.reals.contains_key(&r.address) {
                continue;
            }
            let index = self.free_reals.pop_front().ok_or_else(|| {
                PlanError::Capacity(format!(
                    "VIP {}: real {}: the data plane has room for {} reals",
                    v.name(),
                    r.address,
                    self.max_reals
                ))
            })?;
            let g = &mut self.generations[index as usize];
            *g = g.wrapping_add(1);
            ops.push(Op::SetReal { index, address: r.address, vip: st.index, generation: *g });
            st.reals.insert(r.address, index);
        }
        if let Some(vr) = vip_rings {
            let ring = ring_indexes(&vr.new, v, &st.reals);
            match old_ring {
                Some(before) => {
                    let slots: Vec<(u32, u32)> = (0u32..)
                        .zip(ring.iter().zip(&before))
                        .filter(|(_, (a, b))| a != b)
                        .map(|(s, (a, _))| (s, *a))
                        .collect();
                    if !slots.is_empty() {
                        ops.push(Op::PatchRing { vip: st.index, slots });
                    }
                }
                None => ops.push(Op::SetRing { vip: st.index, ring }),
            }
        }
        if is_new || st.no_lru != v.no_lru {
            ops.push(Op::SetVip {
                address: v.address,
                port: v.port,
                proto: v.proto.number(),
                index: st.index,
                no_lru: v.no_lru,
            });
            st.no_lru = v.no_lru;
        }
        self.vips.insert(k, st);
        Ok(())
    }

    /// Real `idx` is gone: its generation moves on and its index is free again, last.
    fn clear_real(&mut self, idx: u32, ops: &mut Vec<Op>) {
        let g = &mut self.generations[idx as usize];
        *g = g.wrapping_add(1);
        ops.push(Op::ClearReal { index: idx, generation: *g });
        self.free_reals.push_back(idx);
    }
}

/// ICMP echo addresses: every address some VIP uses. Those that arrive, then those
/// that leave, each in address order.
fn vip_address_ops(old: &Config, new: &Config) -> Vec<Op> {
    let old_addrs: HashSet<IpAddr> = old.vips.iter().map(|v| v.address).collect();
    let new_addrs: HashSet<IpAddr> = new.vips.iter().map(|v| v.address).collect();
    let mut arrived: Vec<IpAddr> = new_addrs.difference(&old_addrs).copied().collect();
    arrived.sort();
    let mut left: Vec<IpAddr> = old_addrs.difference(&new_addrs).copied().collect();
    left.sort();
    let mut ops: Vec<Op> = arrived.into_iter().map(|address| Op::VipAddress { address, present: true }).collect();
    ops.extend(left.into_iter().map(|address| Op::VipAddress { address, present: false }));
    ops
}

/// A ring of slots indexing `vip`'s reals as the real indexes of `indexes` (by address).
fn ring_indexes(slots: &[maglev::Slot], vip: &Vip, indexes: &HashMap<IpAddr, u32>) -> Vec<u32> {
    slots
        .iter()
        .map(|&s| vip.reals.get(s as usize).and_then(|r| indexes.get(&r.address)).copied().unwrap_or(maglev::EMPTY))
        .collect()
}

/// Tag ids for per-flow tags: at most `capacity` flows hold one; when all are taken the
/// oldest is taken back (its classifier rule must be removed before the id is reused).
#[derive(Debug, Clone)]
pub struct TagTable<K> {
    capacity: u32,
    order: VecDeque<(u32, K)>,
    by_flow: HashMap<K, u32>,
    free: VecDeque<u32>,
}

impl<K: Clone + Eq + std::hash::Hash> TagTable<K> {
    /// Room for `capacity` tags (ids 0..capacity).
    pub fn new(capacity: u32) -> TagTable<K> {
        TagTable { capacity, order: VecDeque::new(), by_flow: HashMap::new(), free: (0..capacity).collect() }
    }

    /// Tags in use.
    pub fn len(&self) -> usize {
        self.by_flow.len()
    }

    /// Whether no tag is in use.
    pub fn is_empty(&self) -> bool {
        self.by_flow.is_empty()
    }

    /// The tag id for `flow`, new or existing, and the flow it was taken from if the
    /// table was full. `None` for a table of capacity 0.
    pub fn assign(&mut self, flow: K) -> Option<(u32, Option<K>)> {
        if let Some(id) = self.by_flow.get(&flow) {
            return Some((*id, None));
        }
        let (id, evicted) = match self.free.pop_front() {
            Some(id) => (id, None),
            None => {
                let (id, old) = self.order.pop_front()?;
                self.by_flow.remove(&old);
                (id, Some(old))
            }
        };
        self.order.push_back((id, flow.clone()));
        self.by_flow.insert(flow, id);
        debug_assert!(self.by_flow.len() <= self.capacity as usize);
        Some((id, evicted))
    }

    /// Takes back the tags of every flow `drop` selects; returns them.
    pub fn release_where(&mut self, mut drop: impl FnMut(&K) -> bool) -> Vec<(u32, K)> {
        let mut out = Vec::new();
        self.order.retain(|(id, k)| {
            if drop(k) {
                out.push((*id, k.clone()));
                false
            } else {
                true
            }
        });
        for (id, k) in &out {
            self.by_flow.remove(k);
            self.free.push_back(*id);
        }
        out
    }
}

#[cfg(test)]
mod tests;

//! Which lane owns which receive queue, and where a new connection goes. Sans-IO: the
//! caller says which NAPI ids the device has and what each connection reported; the
//! map answers with lanes.
//!
//! Invariants:
//! - every NAPI id the map knows has exactly one owner, a lane that exists;
//! - ownership is stable: an id changes lane only when a lane is added or removed, and
//!   then only the ids the change needs move (never a reset of every binding, which is
//!   what memcached's `-N` does when it sees more ids than threads);
//! - the kernel's ids are dealt out in queue order, so lanes own equal shares (within
//!   one) of the queues; an id first seen on a connection goes to the lane owning the
//!   fewest ids, and is counted;
//! - NAPI id 0 (the packet came through no NAPI instance: loopback, or a device without
//!   NAPI) has no owner: such a connection goes to the lane with the fewest connections,
//!   and is counted;
//! - the map remembers at most [`MAX_NAPI_IDS`] ids; past that a new id is placed like
//!   id 0 (and counted), so connections can never grow it without bound.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

/// Most lanes a map holds.
pub const MAX_LANES: usize = 1024;
/// Most NAPI ids a map remembers.
pub const MAX_NAPI_IDS: usize = 65_536;

/// A lane's number: stable for the lane's life (a removed lane's number is not reused).
pub type LaneId = usize;

/// Why a connection went where it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Why {
    /// Its NAPI id's owner.
    Owner,
    /// Its NAPI id was new to the map: it now belongs to the lane with the fewest ids.
    NewId,
    /// NAPI id 0, or no room for another id: the lane with the fewest connections.
    NoNapi,
}

/// Where a connection goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// The lane.
    pub lane: LaneId,
    /// Why.
    pub why: Why,
}

/// A NAPI id that changed owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Move {
    /// The id.
    pub napi_id: u32,
    /// Its owner before.
    pub from: LaneId,
    /// Its owner now.
    pub to: LaneId,
}

/// What the map was asked to do that it cannot.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    /// A lane count outside 1..=[`MAX_LANES`].
    #[error("{0} lanes: must be 1..={MAX_LANES}")]
    Count(usize),
    /// No such lane (never was, or removed).
    #[error("lane {0} does not exist")]
    NoLane(LaneId),
    /// Removing the last lane would leave connections nowhere to go.
    #[error("lane {0} is the last one: a map keeps at least one lane")]
    LastLane(LaneId),
}

/// One lane's share.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LaneShare {
    /// The NAPI ids it owns.
    pub napi_ids: BTreeSet<u32>,
    /// Connections placed on it and not yet closed.
    pub connections: u64,
}

/// Counters of placements.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct MapCounts {
    /// Placed on their NAPI id's owner.
    pub by_owner: u64,
    /// Brought an id the map did not know (it now has an owner).
    pub new_ids: u64,
    /// Reported NAPI id 0, or an id past the map's bound: placed by load.
    pub no_napi: u64,
}

/// The map.
#[derive(Debug, Clone)]
pub struct LaneMap {
    /// Slots by lane id; `None`: removed.
    lanes: Vec<Option<LaneShare>>,
    owner: BTreeMap<u32, LaneId>,
    counts: MapCounts,
}

impl LaneMap {
    /// `lanes` lanes (ids 0..lanes), owning nothing yet.
    pub fn new(lanes: usize) -> Result<Self, MapError> {
        if !(1..=MAX_LANES).contains(&lanes) {
            return Err(MapError::Count(lanes));
        }
        Ok(LaneMap {
            lanes: vec![Some(LaneShare::default()); lanes],
            owner: BTreeMap::new(),
            counts: MapCounts::default(),
        })
    }

    /// Takes the device's NAPI ids, in the order of the queues they serve: each one not
    /// yet owned goes to the lane owning the fewest (the first of them on a tie), so a
    /// fresh map deals queue k to lane k mod lanes. Id 0 is skipped.
    pub fn learn(&mut self, napi_ids: &[u32]) {
        for &id in napi_ids {
            if id != 0 && !self.owner.contains_key(&id) && self.owner.len() < MAX_NAPI_IDS {
                let lane = self.fewest_ids(None);
                self.own(id, lane);
            }
        }
    }

    /// Where a new connection whose packets came through `napi_id` goes; the lane counts
    /// it until [`LaneMap::closed`].
    pub fn place(&mut self, napi_id: u32) -> Placement {
        let p = match self.owner.get(&napi_id) {
            Some(&lane) => {
                self.counts.by_owner += 1;
                Placement { lane, why: Why::Owner }
            }
            None if napi_id != 0 && self.owner.len() < MAX_NAPI_IDS => {
                let lane = self.fewest_ids(None);
                self.own(napi_id, lane);
                self.counts.new_ids += 1;
                Placement { lane, why: Why::NewId }
            }
            None => {
                self.counts.no_napi += 1;
                Placement { lane: self.fewest_connections(None), why: Why::NoNapi }
            }
        };
        self.share_mut(p.lane).connections += 1;
        p
    }

    /// A connection the caller put on `lane` itself (round robin, or left where a
    /// listener took it); the lane counts it until [`LaneMap::closed`].
    pub fn place_on(&mut self, lane: LaneId) -> Result<(), MapError> {
        self.share(lane)?;
        self.share_mut(lane).connections += 1;
        Ok(())
    }

    /// The `n`-th lane that exists, wrapping (for round robin).
    pub fn nth_lane(&self, n: usize) -> LaneId {
        let count = self.active().count();
        self.active().nth(n % count).map(|(l, _)| l).expect("a map has at least one lane")
    }

    /// A connection placed on `lane` closed (or moved away: [`LaneMap::moved`]).
    pub fn closed(&mut self, lane: LaneId) {
        if let Some(Some(s)) = self.lanes.get_mut(lane) {
            s.connections = s.connections.saturating_sub(1);
        }
    }

    /// A connection moved from lane `from` to lane `to`.
    pub fn moved(&mut self, from: LaneId, to: LaneId) -> Result<(), MapError> {
        self.share(to)?;
        self.closed(from);
        self.share_mut(to).connections += 1;
        Ok(())
    }

    /// The lane owning `napi_id`.
    pub fn owner(&self, napi_id: u32) -> Option<LaneId> {
        self.owner.get(&napi_id).copied()
    }

    /// Adds a lane and gives it ids from the lanes owning the most, until no lane owns
    /// more than one id more than another. Returns its id and the ids that moved (their
    /// connections may follow, or stay to drain: the caller decides).
    pub fn add_lane(&mut self) -> Result<(LaneId, Vec<Move>), MapError> {
        let active = self.active().count();
        if active >= MAX_LANES {
            return Err(MapError::Count(active + 1));
        }
        self.lanes.push(Some(LaneShare::default()));
        let new = self.lanes.len() - 1;
        let mut moves = Vec::new();
        loop {
            let from = self.most_ids();
            let (have_most, have_new) = (self.share_ref(from).napi_ids.len(), self.share_ref(new).napi_ids.len());
            if from == new || have_most <= have_new + 1 {
                break;
            }
            // The highest id of the richest lane: the one it most recently would have
            // been dealt.
            let Some(&id) = self.share_ref(from).napi_ids.last() else { break };
            self.share_mut(from).napi_ids.remove(&id);
            self.own(id, new);
            moves.push(Move { napi_id: id, from, to: new });
        }
        Ok((new, moves))
    }

    /// Removes `lane`: each id it owned goes to the remaining lane owning the fewest.
    /// Its connections must move (the caller moves them and calls [`LaneMap::moved`]).
    pub fn remove_lane(&mut self, lane: LaneId) -> Result<Vec<Move>, MapError> {
        self.share(lane)?;
        if self.active().count() == 1 {
            return Err(MapError::LastLane(lane));
        }
        let gone = self.lanes[lane].take().unwrap_or_default();
        let mut moves = Vec::new();
        for id in gone.napi_ids {
            let to = self.fewest_ids(None);
            self.own(id, to);
            moves.push(Move { napi_id: id, from: lane, to });
        }
        Ok(moves)
    }

    /// The lane with the fewest connections other than `except` (for a connection that
    /// must leave a lane and has no owner to go to).
    pub fn least_loaded(&self, except: Option<LaneId>) -> Option<LaneId> {
        self.active().any(|(l, _)| Some(l) != except).then(|| self.fewest_connections(except))
    }

    /// The lanes that exist, by id.
    pub fn lanes(&self) -> impl Iterator<Item = (LaneId, &LaneShare)> {
        self.active()
    }

    /// The number [`LaneMap::add_lane`] will give the next lane.
    pub fn next_lane_id(&self) -> LaneId {
        self.lanes.len()
    }

    /// Whether `lane` exists.
    pub fn has_lane(&self, lane: LaneId) -> bool {
        self.share(lane).is_ok()
    }

    /// The placement counters.
    pub fn counts(&self) -> MapCounts {
        self.counts
    }

    fn active(&self) -> impl Iterator<Item = (LaneId, &LaneShare)> {
        self.lanes.iter().enumerate().filter_map(|(i, s)| s.as_ref().map(|s| (i, s)))
    }

    fn share(&self, lane: LaneId) -> Result<&LaneShare, MapError> {
        self.lanes.get(lane).and_then(Option::as_ref).ok_or(MapError::NoLane(lane))
    }

    /// A lane the map itself chose: it exists.
    fn share_ref(&self, lane: LaneId) -> &LaneShare {
        self.lanes[lane].as_ref().expect("the map only picks lanes that exist")
    }

    fn share_mut(&mut self, lane: LaneId) -> &mut LaneShare {
        self.lanes[lane].as_mut().expect("the map only picks lanes that exist")
    }

    fn own(&mut self, id: u32, lane: LaneId) {
        if let Some(old) = self.owner.insert(id, lane)
            && let Some(Some(s)) = self.lanes.get_mut(old)
        {
            s.napi_ids.remove(&id);
        }
        self.share_mut(lane).napi_ids.insert(id);
    }

    /// Fewest ids, then fewest connections, then lowest id.
    fn fewest_ids(&self, except: Option<LaneId>) -> LaneId {
        self.active()
            .filter(|(l, _)| Some(*l) != except)
            .min_by_key(|(l, s)| (s.napi_ids.len(), s.connections, *l))
            .map(|(l, _)| l)
            .expect("a map has at least one lane")
    }

    /// Most ids, then the lowest id.
    fn most_ids(&self) -> LaneId {
        self.active()
            .max_by_key(|(l, s)| (s.napi_ids.len(), std::cmp::Reverse(*l)))
            .map(|(l, _)| l)
            .expect("a map has at least one lane")
    }

    /// Fewest connections, then lowest id.
    fn fewest_connections(&self, except: Option<LaneId>) -> LaneId {
        self.active()
            .filter(|(l, _)| Some(*l) != except)
            .min_by_key(|(l, s)| (s.connections, *l))
            .map(|(l, _)| l)
            .unwrap_or_else(|| self.fewest_ids(None))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn ids(m: &LaneMap, lane: LaneId) -> Vec<u32> {
        m.lanes().find(|(l, _)| *l == lane).map(|(_, s)| s.napi_ids.iter().copied().collect()).unwrap_or_default()
    }

    #[test]
    fn queues_are_dealt_in_order_and_more_ids_than_lanes_stay_put() {
        let mut m = LaneMap::new(2).unwrap();
        m.learn(&[258, 259, 260, 261, 262]);
        assert_eq!((ids(&m, 0), ids(&m, 1)), (vec![258, 260, 262], vec![259, 261]));
        // Learning the same list again, or a connection on any of them, moves nothing.
        m.learn(&[262, 261, 260, 259, 258]);
        for _ in 0..3 {
            for (id, lane) in [(258, 0), (259, 1), (260, 0), (261, 1), (262, 0)] {
                assert_eq!(m.place(id), Placement { lane, why: Why::Owner });
            }
        }
        assert_eq!(m.counts(), MapCounts { by_owner: 15, new_ids: 0, no_napi: 0 });
    }

    #[test]
    fn an_unknown_id_gets_an_owner_and_keeps_it() {
        let mut m = LaneMap::new(3).unwrap();
        m.learn(&[300, 301]);
        assert_eq!(m.place(999), Placement { lane: 2, why: Why::NewId }, "lane 2 owned nothing");
        assert_eq!(m.place(999), Placement { lane: 2, why: Why::Owner });
        assert_eq!(m.counts().new_ids, 1);
    }

    #[test]
    fn napi_id_zero_goes_to_the_least_loaded_lane_and_is_counted() {
        let mut m = LaneMap::new(3).unwrap();
        m.learn(&[300]);
        for _ in 0..4 {
            m.place(300);
        }
        let lanes: Vec<LaneId> = (0..4).map(|_| m.place(0).lane).collect();
        assert_eq!(lanes, vec![1, 2, 1, 2], "lane 0 has four connections");
        m.closed(1);
        m.closed(1);
        assert_eq!(m.place(0).lane, 1);
        assert_eq!(m.counts().no_napi, 5);
        assert_eq!(m.owner(0), None);
    }

    #[test]
    fn adding_a_lane_takes_only_what_balances() {
        let mut m = LaneMap::new(2).unwrap();
        m.learn(&[1, 2, 3, 4, 5, 6]);
        let (new, moves) = m.add_lane().unwrap();
        assert_eq!(new, 2);
        // 3 + 3 -> 2 + 2 + 2: one id from each.
        assert_eq!(moves.len(), 2);
        assert!(moves.iter().all(|mv| mv.to == 2 && m.owner(mv.napi_id) == Some(2)));
        for l in 0..3 {
            assert_eq!(ids(&m, l).len(), 2);
        }
        // Ids that did not move kept their lane.
        let unmoved = [1u32, 2, 3, 4, 5, 6].into_iter().filter(|id| !moves.iter().any(|mv| mv.napi_id == *id));
        for id in unmoved {
            assert_eq!(m.owner(id), Some(((id - 1) % 2) as usize));
        }
    }

    #[test]
    fn removing_a_lane_hands_its_ids_to_the_others_and_never_the_last() {
        let mut m = LaneMap::new(3).unwrap();
        m.learn(&[1, 2, 3, 4, 5, 6]);
        let moves = m.remove_lane(1).unwrap();
        assert_eq!(moves.iter().map(|mv| mv.napi_id).collect::<Vec<_>>(), vec![2, 5]);
        assert!(moves.iter().all(|mv| mv.from == 1 && mv.to != 1));
        assert_eq!(ids(&m, 0).len() + ids(&m, 2).len(), 6);
        assert_eq!(m.remove_lane(1), Err(MapError::NoLane(1)));
        assert_eq!(m.place(2).why, Why::Owner);
        m.remove_lane(0).unwrap();
        assert_eq!(m.remove_lane(2), Err(MapError::LastLane(2)));
        assert_eq!(ids(&m, 2).len(), 6);
        // A lane added later gets a new number.
        assert_eq!(m.add_lane().unwrap().0, 3);
    }

    #[test]
    fn connections_follow_their_counts() {
        let mut m = LaneMap::new(2).unwrap();
        let p = m.place(0);
        m.moved(p.lane, 1 - p.lane).unwrap();
        assert_eq!(
            m.lanes().map(|(_, s)| s.connections).collect::<Vec<_>>(),
            [0, 1].map(|c| if p.lane == 0 { c } else { 1 - c })
        );
        assert_eq!(m.moved(0, 7), Err(MapError::NoLane(7)));
        assert_eq!(m.least_loaded(None), Some(p.lane));
    }

    #[test]
    fn bad_counts_are_refused() {
        assert_eq!(LaneMap::new(0).unwrap_err(), MapError::Count(0));
        assert_eq!(LaneMap::new(MAX_LANES + 1).unwrap_err(), MapError::Count(MAX_LANES + 1));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Learn(Vec<u32>),
        Place(u32),
        Close(usize),
        Add,
        Remove(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            prop::collection::vec(0u32..40, 0..8).prop_map(Op::Learn),
            (0u32..60).prop_map(Op::Place),
            (0usize..12).prop_map(Op::Close),
            Just(Op::Add),
            (0usize..12).prop_map(Op::Remove),
        ]
    }

    proptest! {
        #[test]
        fn every_known_id_has_one_owner_that_exists(lanes in 1usize..6, ops in prop::collection::vec(op(), 0..80)) {
            let mut m = LaneMap::new(lanes).unwrap();
            for o in ops {
                match o {
                    Op::Learn(v) => m.learn(&v),
                    Op::Place(id) => {
                        let p = m.place(id);
                        prop_assert!(m.has_lane(p.lane));
                        if id != 0 {
                            prop_assert_eq!(m.owner(id), Some(p.lane));
                        }
                    }
                    Op::Close(l) => m.closed(l),
                    Op::Add => { let _ = m.add_lane(); }
                    Op::Remove(l) => { let _ = m.remove_lane(l); }
                }
                prop_assert!(m.lanes().count() >= 1);
                let mut seen = BTreeSet::new();
                for (l, s) in m.lanes() {
                    for id in &s.napi_ids {
                        prop_assert!(seen.insert(*id), "id {} owned twice", id);
                        prop_assert_eq!(m.owner(*id), Some(l));
                    }
                }
                prop_assert_eq!(seen.len(), m.owner.len());
                prop_assert!(!seen.contains(&0));
            }
        }

        #[test]
        fn learning_deals_the_queues_evenly(lanes in 1usize..9, n in 0u32..64) {
            let mut m = LaneMap::new(lanes).unwrap();
            m.learn(&(1..=n).collect::<Vec<_>>());
            let sizes: Vec<usize> = m.lanes().map(|(_, s)| s.napi_ids.len()).collect();
            prop_assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1, "{:?}", sizes);
        }
    }
}

//! The control plane's tests: the order of operations, generations, ring patches,
//! capacity, VIP indexes reused, and the tag table; a model of the maps checks the
//! rings the operations leave after any edits.

use super::*;

fn cfg(reals: &[(&str, u32)]) -> Config {
    let mut text = String::from("ring_size = 13\n[[vip]]\naddress = \"10.100.0.1\"\nport = 80\nproto = \"tcp\"\n");
    for (a, w) in reals {
        text += &format!("[[vip.real]]\naddress = \"{a}\"\nweight = {w}\n");
    }
    Config::parse(&text).unwrap()
}

fn rings(ops: &[Op]) -> Vec<&Vec<u32>> {
    ops.iter()
        .filter_map(|o| match o {
            Op::SetRing { ring, .. } => Some(ring),
            _ => None,
        })
        .collect()
}

#[test]
fn first_apply_sets_reals_then_ring_then_vip() {
    let mut cp = ControlPlane::new(4, 8);
    let u = cp.apply(&cfg(&[("10.0.0.1", 1), ("10.0.0.2", 1)])).unwrap();
    let kinds: Vec<&str> = u
        .ops
        .iter()
        .map(|o| match o {
            Op::SetReal { .. } => "real",
            Op::SetRing { .. } => "ring",
            Op::SetVip { .. } => "vip",
            Op::VipAddress { .. } => "addr",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["real", "real", "ring", "vip", "addr"]);
    let ring = rings(&u.ops)[0];
    assert!(ring.iter().all(|r| *r == 0 || *r == 1));
    assert_eq!(u.changes[0].slots_moved, 13);
}

#[test]
fn removing_a_real_clears_it_after_the_ring_and_bumps_its_generation() {
    let mut cp = ControlPlane::new(4, 8);
    let mut dp = DataPlane::default();
    dp.run(&cp.apply(&cfg(&[("10.0.0.1", 1), ("10.0.0.2", 1), ("10.0.0.3", 1)])).unwrap().ops);
    let u = cp.apply(&cfg(&[("10.0.0.1", 1), ("10.0.0.3", 1)])).unwrap();
    let ring_at = u.ops.iter().position(|o| matches!(o, Op::PatchRing { .. })).unwrap();
    let clear_at = u.ops.iter().position(|o| matches!(o, Op::ClearReal { .. })).unwrap();
    assert!(ring_at < clear_at, "ring first: {:?}", u.ops);
    assert!(matches!(u.ops[clear_at], Op::ClearReal { index: 1, generation: 2 }));
    dp.run(&u.ops);
    assert!(!dp.rings[&0].contains(&1), "the removed real is out of the ring");
    assert_eq!(u.changes[0].removed, vec!["10.0.0.2".parse::<IpAddr>().unwrap()]);
    // Its index is reused last, with a new generation.
    let u = cp.apply(&cfg(&[("10.0.0.1", 1), ("10.0.0.3", 1), ("10.0.0.4", 1)])).unwrap();
    assert!(matches!(u.ops[0], Op::SetReal { index: 3, generation: 1, .. }), "{:?}", u.ops);
}

#[test]
fn reweight_only_writes_the_slots_that_move_and_unchanged_config_writes_nothing() {
    let mut cp = ControlPlane::new(4, 8);
    cp.apply(&cfg(&[("10.0.0.1", 1), ("10.0.0.2", 1)])).unwrap();
    let u = cp.apply(&cfg(&[("10.0.0.1", 1), ("10.0.0.2", 3)])).unwrap();
    let [Op::PatchRing { slots, .. }] = u.ops.as_slice() else { panic!("one ring patch: {:?}", u.ops) };
    assert!(u.changes[0].slots_moved > 0);
    assert_eq!(slots.len(), u.changes[0].slots_moved);
    let u = cp.apply(&cfg(&[("10.0.0.1", 1), ("10.0.0.2", 3)])).unwrap();
    assert!(u.ops.is_empty() && u.changes.is_empty());
    // The same reals listed in another order: nothing to write.
    let u = cp.apply(&cfg(&[("10.0.0.2", 3), ("10.0.0.1", 1)])).unwrap();
    assert!(u.ops.is_empty() && u.changes.is_empty(), "{:?}", u.ops);
}

/// The maps as the operations leave them: reals by index, rings by VIP index.
#[derive(Default)]
struct DataPlane {
    reals: HashMap<u32, IpAddr>,
    rings: HashMap<u32, Vec<u32>>,
}

impl DataPlane {
    fn run(&mut self, ops: &[Op]) {
        for op in ops {
            match op {
                Op::SetReal { index, address, .. } => {
                    self.reals.insert(*index, *address);
                }
                Op::ClearReal { index, .. } => {
                    self.reals.remove(index);
                }
                Op::SetRing { vip, ring } => {
                    self.rings.insert(*vip, ring.clone());
                }
                Op::PatchRing { vip, slots } => {
                    let ring = self.rings.get_mut(vip).expect("a patch of a ring written before");
                    for &(s, r) in slots {
                        ring[s as usize] = r;
                    }
                }
                _ => {}
            }
        }
    }

    /// VIP `v`'s ring as real addresses.
    fn ring(&self, cp: &ControlPlane, v: &Vip) -> Vec<Option<IpAddr>> {
        let (index, _) = cp.indexes(v).unwrap();
        self.rings[&index].iter().map(|r| self.reals.get(r).copied()).collect()
    }
}

/// A configuration of VIPs 10.100.0.<v> with reals 10.0.<v>.<host> (weights as given,
/// the first real of each at least 1, duplicates dropped).
fn multi(vips: &[(u8, Vec<(u8, u32)>)]) -> Config {
    let mut text = String::from("ring_size = 13\n");
    let mut seen_vips = HashSet::new();
    for (v, reals) in vips {
        if !seen_vips.insert(*v) {
            continue;
        }
        text += &format!("[[vip]]\naddress = \"10.100.0.{v}\"\nport = 80\nproto = \"tcp\"\n");
        let mut seen = HashSet::new();
        for (host, weight) in reals {
            if seen.insert(*host) {
                let w = if seen.len() == 1 { (*weight).max(1) } else { *weight };
                text += &format!("[[vip.real]]\naddress = \"10.0.{v}.{host}\"\nweight = {w}\n");
            }
        }
    }
    Config::parse(&text).unwrap()
}

proptest::proptest! {
    // VIPs come and go (their indexes reused by others), reals come and go and
    // change weight: after every edit, the rings the operations leave are the
    // configured Maglev rings, and no ring slot names a real the maps no longer hold.
    #[test]
    fn written_rings_are_the_configured_rings_after_any_edits(
        edits in proptest::collection::vec(
            proptest::collection::vec((0u8..5, proptest::collection::vec((0u8..24, 0u32..4), 1..12)), 1..4),
            1..8,
        )
    ) {
        let mut cp = ControlPlane::new(3, 64);
        let mut dp = DataPlane::default();
        for vips in edits {
            let c = multi(&vips);
            dp.run(&cp.apply(&c).unwrap().ops);
            for v in &c.vips {
                let want: Vec<Option<IpAddr>> = maglev::build(&v.backends(), c.ring_size)
                    .unwrap()
                    .iter()
                    .map(|&s| v.reals.get(s as usize).map(|r| r.address))
                    .collect();
                proptest::prop_assert_eq!(dp.ring(&cp, v), want);
            }
        }
    }
}

#[test]
fn capacity_errors_change_nothing() {
    let mut cp = ControlPlane::new(4, 2);
    cp.apply(&cfg(&[("10.0.0.1", 1)])).unwrap();
    let e = cp.apply(&cfg(&[("10.0.0.1", 1), ("10.0.0.2", 1), ("10.0.0.3", 1)])).unwrap_err();
    assert!(e.to_string().contains("room for 2 reals"), "{e}");
    assert_eq!(cp.current().unwrap().vips[0].reals.len(), 1);
    let mut bigger = cfg(&[("10.0.0.1", 1)]);
    bigger.ring_size = 17;
    assert!(matches!(cp.apply(&bigger), Err(PlanError::NeedsRestart(_))));
}

#[test]
fn removing_a_vip_unpublishes_it_first() {
    let mut cp = ControlPlane::new(4, 8);
    cp.apply(&cfg(&[("10.0.0.1", 1)])).unwrap();
    let mut two = cfg(&[("10.0.0.1", 1)]);
    let mut v2 = two.vips[0].clone();
    v2.address = "10.100.0.2".parse().unwrap();
    two.vips.push(v2);
    cp.apply(&two).unwrap();
    let u = cp.apply(&cfg(&[("10.0.0.1", 1)])).unwrap();
    assert!(matches!(u.ops[0], Op::RemoveVip { .. }), "{:?}", u.ops);
    assert!(u.ops.iter().any(|o| matches!(o, Op::ClearReal { .. })));
    assert!(u.ops.contains(&Op::VipAddress { address: "10.100.0.2".parse().unwrap(), present: false }));
}

#[test]
fn a_vip_index_given_to_a_new_vip_has_lost_its_old_reals_first() {
    // One VIP slot: replacing the VIP reuses index 0 in the same update. The old
    // VIP's reals (which carry index 0) must be gone before the new VIP is
    // published, or a destination tag naming one would pass the new VIP's check.
    let mut cp = ControlPlane::new(1, 8);
    cp.apply(&cfg(&[("10.0.0.1", 1), ("10.0.0.2", 1)])).unwrap();
    let mut other = cfg(&[("10.0.0.3", 1)]);
    other.vips[0].address = "10.100.0.9".parse().unwrap();
    let u = cp.apply(&other).unwrap();
    let pos = |f: &dyn Fn(&Op) -> bool| u.ops.iter().position(f).unwrap();
    let last_clear = u.ops.iter().rposition(|o| matches!(o, Op::ClearReal { .. })).unwrap();
    assert_eq!(u.ops.iter().filter(|o| matches!(o, Op::ClearReal { .. })).count(), 2, "{:?}", u.ops);
    assert!(last_clear < pos(&|o| matches!(o, Op::SetVip { index: 0, .. })), "{:?}", u.ops);
    assert!(last_clear < pos(&|o| matches!(o, Op::SetReal { vip: 0, .. })), "{:?}", u.ops);
}

#[test]
fn tag_table_reuses_the_oldest_id_when_full() {
    let mut t = TagTable::new(2);
    assert_eq!(t.assign("a"), Some((0, None)));
    assert_eq!(t.assign("b"), Some((1, None)));
    assert_eq!(t.assign("a"), Some((0, None)));
    assert_eq!(t.assign("c"), Some((0, Some("a"))));
    assert_eq!(t.release_where(|k| *k == "b"), vec![(1, "b")]);
    assert_eq!(t.assign("d"), Some((1, None)));
    assert_eq!(t.len(), 2);
    assert_eq!(TagTable::<u8>::new(0).assign(1), None);
}

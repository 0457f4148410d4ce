use super::*;

fn small(memory: u64, shards: usize) -> Store {
    Store::new(StoreConfig::new(memory, 1024, shards)).unwrap()
}

fn set(s: &Store, key: &[u8], value: &[u8], exp: u64, now: u64) -> Result<u64, StoreError> {
    s.with_slot(key, now, |slot| slot.store(value, 0, exp, None))
}

fn get(s: &Store, key: &[u8], now: u64) -> Option<Vec<u8>> {
    s.with_slot(key, now, |slot| {
        slot.hit();
        slot.item().map(|it| it.value().to_vec())
    })
}

#[test]
fn config_is_checked_and_shards_fit_the_memory() {
    assert!(matches!(Store::new(StoreConfig::new(1 << 20, 1 << 20, 4)), Err(ConfigError::MemoryTooSmall { .. })));
    assert_eq!(Store::new(StoreConfig::new(1 << 30, 100, 4)).unwrap_err(), ConfigError::ItemMax(100));
    // 64 MiB with 1 MiB items: a shard must hold 4 of them, so at most 15 shards -> 8.
    let s = Store::new(StoreConfig::new(64 << 20, 1 << 20, 64)).unwrap();
    assert_eq!(s.shard_count(), 8);
    assert_eq!(Store::new(StoreConfig::new(1 << 30, 1 << 20, 48)).unwrap().shard_count(), 32);
    assert_eq!(Store::new(StoreConfig::new(1 << 30, 1 << 20, 0)).unwrap().shard_count(), 1);
}

#[test]
fn stores_replaces_and_accounts_bytes() {
    let s = small(1 << 20, 4);
    let c1 = set(&s, b"k", b"one", NEVER, 0).unwrap();
    assert_eq!(get(&s, b"k", 0).unwrap(), b"one");
    let c2 = set(&s, b"k", b"three", NEVER, 0).unwrap();
    assert!(c2 > c1, "a new store gets a new CAS value");
    let st = s.stats();
    assert_eq!((st.curr_items, st.total_items), (1, 2));
    assert_eq!(st.bytes, accounted(1, 5));
    assert!(s.with_slot(b"k", 0, |slot| slot.remove()));
    assert_eq!(s.stats().bytes, 0);
    assert!(get(&s, b"k", 0).is_none());
}

#[test]
fn too_large_values_are_refused_and_the_old_item_is_gone() {
    let s = small(1 << 20, 1);
    set(&s, b"k", b"v", NEVER, 0).unwrap();
    assert_eq!(set(&s, b"k", &[0; 1025], NEVER, 0), Err(StoreError::TooLarge));
    assert!(get(&s, b"k", 0).is_none());
}

#[test]
fn eviction_keeps_memory_under_the_limit_and_spares_referenced_items() {
    // One shard of 64 KiB: about 100 items of 500 bytes.
    let s = small(64 << 10, 1);
    let value = [7u8; 500];
    set(&s, b"hot", &value, NEVER, 0).unwrap();
    for i in 0..2000u32 {
        // The hot key is read between every store: CLOCK must keep it.
        assert!(get(&s, b"hot", 0).is_some(), "hot key evicted after {i} stores");
        set(&s, format!("cold{i}").as_bytes(), &value, NEVER, 0).unwrap();
        assert!(s.stats().bytes <= 64 << 10);
    }
    let st = s.stats();
    assert!(st.evictions > 1800, "{st:?}");
    assert_eq!(st.evicted_unfetched, st.evictions, "only cold (never fetched) items were evicted");
    // The most recent cold items are there, the first ones are not.
    assert!(get(&s, b"cold1999", 0).is_some());
    assert!(get(&s, b"cold0", 0).is_none());
}

#[test]
fn expired_items_are_gone_lazily_and_reaped_actively() {
    let s = small(1 << 20, 2);
    set(&s, b"short", b"x", 1000, 0).unwrap();
    set(&s, b"long", b"x", NEVER, 0).unwrap();
    for i in 0..100 {
        set(&s, format!("r{i}").as_bytes(), b"x", 500, 0).unwrap();
    }
    assert!(get(&s, b"short", 999).is_some());
    let gone = s.with_slot(b"short", 1000, |slot| (slot.item().is_none(), slot.gone()));
    assert_eq!(gone, (true, Some(Gone::Expired)));
    assert_eq!(s.reap(1000, 1000), 100);
    let st = s.stats();
    assert_eq!((st.curr_items, st.reaped, st.reclaimed, st.expired_unfetched), (1, 100, 101, 100));
}

#[test]
fn flush_all_now_and_delayed() {
    let s = small(1 << 20, 4);
    set(&s, b"a", b"1", NEVER, 0).unwrap();
    s.flush_all(10, 0);
    assert_eq!(s.with_slot(b"a", 10, |slot| slot.gone()), Some(Gone::Flushed));
    set(&s, b"b", b"2", NEVER, 10).unwrap();
    assert!(get(&s, b"b", 10).is_some(), "stored after the flush");
    s.flush_all(10, 5000);
    set(&s, b"c", b"3", NEVER, 4000).unwrap();
    assert!(get(&s, b"b", 4999).is_some(), "the delayed flush has not come yet");
    assert!(get(&s, b"b", 5010).is_none());
    assert!(get(&s, b"c", 5010).is_none(), "stored before the delayed flush took effect");
    set(&s, b"d", b"4", NEVER, 5020).unwrap();
    assert!(get(&s, b"d", 5020).is_some());
}

#[test]
fn cas_values_are_unique_and_can_be_given() {
    let s = small(1 << 20, 4);
    let a = set(&s, b"a", b"1", NEVER, 0).unwrap();
    let b = set(&s, b"b", b"1", NEVER, 0).unwrap();
    assert_ne!(a, b);
    let given = s.with_slot(b"a", 0, |slot| slot.bump_cas(Some(77)));
    assert_eq!(given, Some(77));
    assert_eq!(s.with_slot(b"a", 0, |slot| slot.item().map(Item::cas)), Some(77));
    // A client-chosen CAS below the flush mark does not make the item look flushed.
    s.flush_all(0, 0);
    set(&s, b"e", b"1", NEVER, 0).unwrap();
    s.with_slot(b"e", 0, |slot| slot.bump_cas(Some(1)));
    assert!(get(&s, b"e", 0).is_some());
}

#[test]
fn a_value_a_reply_still_sends_stays_charged_until_the_reply_lets_go() {
    // One shard of 8 KiB: room for one 4500-byte item, not two.
    let s = Store::new(StoreConfig::new(8 << 10, 6000, 1)).unwrap();
    set(&s, b"k", &[b'a'; 4500], NEVER, 0).unwrap();
    let held = s.with_slot(b"k", 0, |slot| slot.item().map(|it| it.shared_value().0.clone())).unwrap();
    // Replaced while a reply still sends it: the old value keeps its memory, so the new
    // one finds none (memcached: an item being sent is not freed either).
    assert_eq!(set(&s, b"k", &[b'b'; 4500], NEVER, 0), Err(StoreError::OutOfMemory));
    let st = s.stats();
    assert_eq!((st.replaced_in_flight, st.curr_items), (accounted(1, 4500), 0), "{st:?}");
    assert_eq!(&held[1..], &[b'a'; 4500][..], "the reply's bytes are intact");
    drop(held);
    set(&s, b"k", &[b'b'; 4500], NEVER, 0).unwrap();
    assert_eq!(s.stats().replaced_in_flight, 0);
    assert_eq!(get(&s, b"k", 0).unwrap(), vec![b'b'; 4500]);
}

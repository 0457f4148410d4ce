//! One shard: a hash table of slot indices, the slots, and the CLOCK hand.

use std::sync::atomic::{AtomicU64, Ordering};

use hashbrown::HashTable;

use super::item::{Item, accounted};
use super::{Gone, StoreError, StoreStats};

#[derive(Debug)]
pub(crate) struct Shard {
    /// Indices into `slots`, hashed by the item's stored hash.
    table: HashTable<u32>,
    slots: Vec<Option<Item>>,
    free: Vec<u32>,
    /// The CLOCK hand: the next slot the eviction sweep looks at.
    hand: usize,
    /// Where the reaper continues.
    reap_at: usize,
    limit: u64,
    stats: StoreStats,
}

impl Shard {
    pub(crate) fn new(limit: u64) -> Shard {
        Shard {
            table: HashTable::new(),
            slots: Vec::new(),
            free: Vec::new(),
            hand: 0,
            reap_at: 0,
            limit,
            stats: StoreStats::default(),
        }
    }

    pub(crate) fn stats(&self) -> StoreStats {
        self.stats
    }

    fn find(&self, key: &[u8], hash: u64) -> Option<u32> {
        let slots = &self.slots;
        self.table.find(hash, |&i| slots[i as usize].as_ref().is_some_and(|it| it.key() == key)).copied()
    }

    /// Takes item `idx` out of the table and the slots; returns it.
    fn unlink(&mut self, idx: u32) -> Option<Item> {
        let item = self.slots.get_mut(idx as usize)?.take()?;
        if let Ok(e) = self.table.find_entry(item.hash, |&i| i == idx) {
            e.remove();
        }
        self.free.push(idx);
        self.stats.curr_items -= 1;
        self.stats.bytes -= item.accounted();
        Some(item)
    }

    /// Removes a dead item, counting why.
    fn reclaim(&mut self, idx: u32, why: Gone) {
        if let Some(it) = self.unlink(idx) {
            self.stats.reclaimed += 1;
            if why == Gone::Expired && !it.fetched {
                self.stats.expired_unfetched += 1;
            }
        }
    }

    /// The entry point of every command: the slot for `key`, dead items removed.
    pub(crate) fn slot<'a>(
        &'a mut self,
        key: &'a [u8],
        hash: u64,
        now: u64,
        flushed_through: u64,
        seq: &'a AtomicU64,
        item_max: usize,
    ) -> Slot<'a> {
        let mut idx = self.find(key, hash);
        let mut gone = None;
        if let Some(i) = idx
            && let Some(why) = self.slots[i as usize].as_ref().and_then(|it| it.dead(now, flushed_through))
        {
            self.reclaim(i, why);
            idx = None;
            gone = Some(why);
        }
        Slot { shard: self, key, hash, now, flushed_through, idx, gone, seq, item_max }
    }

    /// One step of the CLOCK sweep: evicts or reclaims at most one item. Returns false
    /// when the shard is empty.
    fn sweep_once(&mut self, now: u64, flushed_through: u64) -> bool {
        if self.stats.curr_items == 0 {
            return false;
        }
        // Each used slot is passed at most twice (once to clear its bit) before one is
        // taken, so this loop ends within 2 * len steps.
        for _ in 0..2 * self.slots.len() + 1 {
            if self.hand >= self.slots.len() {
                self.hand = 0;
            }
            let i = self.hand;
            self.hand += 1;
            let Some(it) = self.slots[i].as_mut() else { continue };
            if let Some(why) = it.dead(now, flushed_through) {
                self.reclaim(i as u32, why);
                return true;
            }
            if it.referenced {
                it.referenced = false;
                continue;
            }
            let fetched = it.fetched;
            self.unlink(i as u32);
            self.stats.evictions += 1;
            if !fetched {
                self.stats.evicted_unfetched += 1;
            }
            return true;
        }
        false
    }

    /// Calls `f` on each live item; false when `f` asked to stop.
    pub(crate) fn visit(&self, now: u64, flushed_through: u64, f: &mut impl FnMut(&Item) -> bool) -> bool {
        self.slots.iter().flatten().filter(|it| it.dead(now, flushed_through).is_none()).all(f)
    }

    pub(crate) fn reap(&mut self, now: u64, flushed_through: u64, budget: usize) -> u64 {
        let mut n = 0;
        for _ in 0..budget.min(self.slots.len()) {
            if self.reap_at >= self.slots.len() {
                self.reap_at = 0;
            }
            let i = self.reap_at;
            self.reap_at += 1;
            if let Some(why) = self.slots[i].as_ref().and_then(|it| it.dead(now, flushed_through)) {
                self.reclaim(i as u32, why);
                self.stats.reaped += 1;
                n += 1;
            }
        }
        // Trailing free slots are dropped so an emptied shard gives its memory back.
        let before = self.slots.len();
        while self.slots.last().is_some_and(Option::is_none) {
            self.slots.pop();
        }
        if self.slots.len() < before {
            let len = self.slots.len();
            self.free.retain(|&i| (i as usize) < len);
            self.slots.shrink_to(len.max(self.slots.capacity() / 2));
        }
        n
    }
}

/// The place of one key in its (locked) shard: the live item if there is one, and the
/// operations every command is made of.
#[derive(Debug)]
pub struct Slot<'a> {
    shard: &'a mut Shard,
    key: &'a [u8],
    hash: u64,
    now: u64,
    flushed_through: u64,
    idx: Option<u32>,
    gone: Option<Gone>,
    seq: &'a AtomicU64,
    item_max: usize,
}

impl Slot<'_> {
    /// The live item, if any.
    pub fn item(&self) -> Option<&Item> {
        self.idx.and_then(|i| self.shard.slots[i as usize].as_ref())
    }

    /// The live item's metadata, to change in place.
    pub fn item_mut(&mut self) -> Option<&mut Item> {
        self.idx.and_then(|i| self.shard.slots[i as usize].as_mut())
    }

    /// Why the key has no item, when a lookup just found it expired or flushed.
    pub fn gone(&self) -> Option<Gone> {
        self.gone
    }

    /// Records an access: fetched, referenced for CLOCK, last access time. Returns
    /// whether it had been fetched before and its previous access time.
    pub fn hit(&mut self) -> Option<(bool, u64)> {
        let now = self.now;
        let it = self.item_mut()?;
        let before = (it.fetched, it.last_access);
        it.fetched = true;
        it.referenced = true;
        it.last_access = now;
        Some(before)
    }

    /// A new CAS value for the live item (`cas` from the client, or a fresh one).
    pub fn bump_cas(&mut self, cas: Option<u64>) -> Option<u64> {
        let fresh = self.seq.fetch_add(1, Ordering::Relaxed);
        let it = self.item_mut()?;
        it.seq = fresh;
        it.cas = cas.unwrap_or(fresh);
        Some(it.cas)
    }

    /// Removes the live item. Returns whether there was one.
    pub fn remove(&mut self) -> bool {
        match self.idx.take() {
            Some(i) => self.shard.unlink(i).is_some(),
            None => false,
        }
    }

    /// Stores `value` under the key, replacing the live item (its slot is freed first,
    /// so eviction never has to skip it). `cas` overrides the new CAS value. Returns the
    /// CAS value stored. On error the old item is gone too (as in memcached: a failed
    /// set must not leave stale data behind).
    pub fn store(&mut self, value: &[u8], flags: u32, exp: u64, cas: Option<u64>) -> Result<u64, StoreError> {
        self.remove();
        if value.len() > self.item_max || self.key.len() > super::KEY_MAX {
            return Err(StoreError::TooLarge);
        }
        let size = accounted(self.key.len(), value.len());
        if size > self.shard.limit {
            return Err(StoreError::OutOfMemory);
        }
        while self.shard.stats.bytes + size > self.shard.limit {
            if !self.shard.sweep_once(self.now, self.flushed_through) {
                return Err(StoreError::OutOfMemory);
            }
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let mut data = Vec::with_capacity(self.key.len() + value.len());
        data.extend_from_slice(self.key);
        data.extend_from_slice(value);
        let item = Item {
            data: data.into_boxed_slice(),
            key_len: self.key.len() as u8,
            hash: self.hash,
            flags,
            exp,
            cas: cas.unwrap_or(seq),
            seq,
            last_access: self.now,
            referenced: false,
            fetched: false,
            stale: false,
            win_sent: false,
        };
        let cas = item.cas;
        let sh = &mut *self.shard;
        let idx = match sh.free.pop() {
            Some(i) => {
                sh.slots[i as usize] = Some(item);
                i
            }
            None => {
                sh.slots.push(Some(item));
                (sh.slots.len() - 1) as u32
            }
        };
        let slots = &sh.slots;
        sh.table.insert_unique(self.hash, idx, |&i| slots[i as usize].as_ref().map_or(0, |it| it.hash));
        sh.stats.curr_items += 1;
        sh.stats.total_items += 1;
        sh.stats.bytes += size;
        self.idx = Some(idx);
        self.gone = None;
        Ok(cas)
    }
}

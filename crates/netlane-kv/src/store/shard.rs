//! One shard: a hash table of slot indices, the slots, and the CLOCK hand.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hashbrown::HashTable;

use super::classes::{Classes, MAX_CLASSES};
use super::item::{Item, accounted};
use super::{Gone, StoreError, StoreStats};

/// One size class's counters (memcached's `stats items` and `stats slabs` fields).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ClassCounters {
    /// Items held now.
    pub items: u64,
    /// Bytes held now (as accounted).
    pub bytes: u64,
    /// Bytes the items held now would take in memcached's layout (`mem_requested`).
    pub requested: u64,
    /// Live items evicted.
    pub evicted: u64,
    /// Evicted items never fetched.
    pub evicted_unfetched: u64,
    /// Expired items never fetched.
    pub expired_unfetched: u64,
    /// Dead items removed.
    pub reclaimed: u64,
    /// Dead items the reaper removed.
    pub reaped: u64,
    /// Stores refused for lack of memory.
    pub outofmemory: u64,
}

impl ClassCounters {
    pub(crate) fn add(&mut self, o: &ClassCounters) {
        self.items += o.items;
        self.bytes += o.bytes;
        self.requested += o.requested;
        self.evicted += o.evicted;
        self.evicted_unfetched += o.evicted_unfetched;
        self.expired_unfetched += o.expired_unfetched;
        self.reclaimed += o.reclaimed;
        self.reaped += o.reaped;
        self.outofmemory += o.outofmemory;
    }
}

/// What a store into a shard is told about the whole store.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Policy<'a> {
    pub seq: &'a AtomicU64,
    pub item_max: usize,
    pub classes: &'a Classes,
    /// CAS values are kept (memcached without `-C`).
    pub cas: bool,
    /// Live items may be evicted to make room (memcached without `-M`).
    pub evict: bool,
}

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
    classes: [ClassCounters; MAX_CLASSES],
    /// Items unlinked while a reply still sends their value (by reference): their
    /// memory stays charged to this shard until the last reply lets go of it.
    zombies: Vec<(Arc<[u8]>, u64)>,
    zombie_bytes: u64,
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
            classes: [ClassCounters::default(); MAX_CLASSES],
            zombies: Vec::new(),
            zombie_bytes: 0,
        }
    }

    /// Bytes charged: the items held and the replaced ones replies still send.
    fn held(&self) -> u64 {
        self.stats.bytes + self.zombie_bytes
    }

    /// Frees the unlinked items no reply refers to any more; returns the bytes freed.
    /// (A reply takes a reference only under this shard's lock, so a count of one seen
    /// here stays one.)
    fn collect_zombies(&mut self) -> u64 {
        let before = self.zombie_bytes;
        let mut freed = 0;
        self.zombies.retain(|(data, size)| {
            let alive = Arc::strong_count(data) > 1;
            if !alive {
                freed += size;
            }
            alive
        });
        self.zombie_bytes = before - freed;
        freed
    }

    pub(crate) fn stats(&self) -> StoreStats {
        StoreStats { replaced_in_flight: self.zombie_bytes, ..self.stats }
    }

    pub(crate) fn class_counters(&self) -> &[ClassCounters; MAX_CLASSES] {
        &self.classes
    }

    pub(crate) fn set_limit(&mut self, limit: u64) {
        self.limit = limit;
    }

    /// Clears the cumulative counters (`stats reset`); what is held now stays.
    pub(crate) fn reset_stats(&mut self) {
        let (items, bytes) = (self.stats.curr_items, self.stats.bytes);
        self.stats = StoreStats { curr_items: items, bytes, ..StoreStats::default() };
        for c in &mut self.classes {
            *c = ClassCounters { items: c.items, bytes: c.bytes, requested: c.requested, ..ClassCounters::default() };
        }
    }

    fn class(&mut self, it: &Item) -> &mut ClassCounters {
        &mut self.classes[(it.class as usize).saturating_sub(1).min(MAX_CLASSES - 1)]
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
        let requested = item.requested();
        let c = self.class(&item);
        c.items -= 1;
        c.bytes -= item.accounted();
        c.requested -= requested;
        if Arc::strong_count(&item.data) > 1 {
            self.zombie_bytes += item.accounted();
            self.zombies.push((item.data.clone(), item.accounted()));
        }
        Some(item)
    }

    /// Removes a dead item, counting why. Returns whether there was one.
    fn reclaim(&mut self, idx: u32, why: Gone) -> bool {
        let Some(it) = self.unlink(idx) else { return false };
        self.stats.reclaimed += 1;
        let unfetched = why == Gone::Expired && !it.fetched;
        if unfetched {
            self.stats.expired_unfetched += 1;
        }
        let c = self.class(&it);
        c.reclaimed += 1;
        c.expired_unfetched += u64::from(unfetched);
        true
    }

    /// The entry point of every command: the slot for `key`, dead items removed.
    pub(crate) fn slot<'a>(
        &'a mut self,
        key: &'a [u8],
        hash: u64,
        now: u64,
        flushed_through: u64,
        policy: Policy<'a>,
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
        Slot { shard: self, key, hash, now, flushed_through, idx, gone, policy }
    }

    /// One step of the CLOCK sweep: evicts (if `evict`) or reclaims at most one item.
    /// Returns false when nothing could be taken.
    fn sweep_once(&mut self, now: u64, flushed_through: u64, evict: bool) -> bool {
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
                return self.reclaim(i as u32, why);
            }
            if !evict {
                continue;
            }
            if it.referenced {
                it.referenced = false;
                continue;
            }
            let Some(gone) = self.unlink(i as u32) else { continue };
            self.stats.evictions += 1;
            if !gone.fetched {
                self.stats.evicted_unfetched += 1;
            }
            let c = self.class(&gone);
            c.evicted += 1;
            c.evicted_unfetched += u64::from(!gone.fetched);
            return true;
        }
        false
    }

    /// Calls `f` on each live item; false when `f` asked to stop.
    pub(crate) fn visit(&self, now: u64, flushed_through: u64, f: &mut impl FnMut(&Item) -> bool) -> bool {
        self.slots.iter().flatten().filter(|it| it.dead(now, flushed_through).is_none()).all(f)
    }

    pub(crate) fn reap(&mut self, now: u64, flushed_through: u64, budget: usize) -> u64 {
        self.collect_zombies();
        let mut n = 0;
        for _ in 0..budget.min(self.slots.len()) {
            if self.reap_at >= self.slots.len() {
                self.reap_at = 0;
            }
            let i = self.reap_at;
            self.reap_at += 1;
            if let Some(why) = self.slots[i].as_ref().and_then(|it| it.dead(now, flushed_through)) {
                let class = self.slots[i].as_ref().map_or(0, |it| it.class);
                if self.reclaim(i as u32, why) {
                    self.stats.reaped += 1;
                    self.classes[(class as usize).saturating_sub(1).min(MAX_CLASSES - 1)].reaped += 1;
                    n += 1;
                }
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
    policy: Policy<'a>,
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

    /// The largest value the store takes.
    pub fn item_max(&self) -> usize {
        self.policy.item_max
    }

    /// Promotes the live item for eviction as a hit would, without marking it
    /// fetched (an `add` that found it).
    pub fn touch_lru(&mut self) {
        let now = self.now;
        if let Some(it) = self.item_mut() {
            it.referenced = true;
            it.last_access = now;
        }
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
        let fresh = self.policy.seq.fetch_add(1, Ordering::Relaxed);
        let keep = self.policy.cas;
        let it = self.item_mut()?;
        it.seq = fresh;
        it.cas = if keep { cas.unwrap_or(fresh) } else { 0 };
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
    /// CAS value stored (0 when the store keeps none). On error the old item is gone
    /// too (as in memcached: a failed set must not leave stale data behind).
    pub fn store(&mut self, value: &[u8], flags: u32, exp: u64, cas: Option<u64>) -> Result<u64, StoreError> {
        self.remove();
        let p = self.policy;
        if value.len() > p.item_max || self.key.len() > super::KEY_MAX {
            return Err(StoreError::TooLarge);
        }
        let size = accounted(self.key.len(), value.len());
        let class = p.classes.class_of_size(super::Classes::item_size(self.key.len(), value.len(), flags, p.cas));
        let oom = |shard: &mut Shard| {
            shard.classes[(class as usize - 1).min(MAX_CLASSES - 1)].outofmemory += 1;
            Err(StoreError::OutOfMemory)
        };
        if size > self.shard.limit {
            return oom(self.shard);
        }
        while self.shard.held() + size > self.shard.limit {
            if self.shard.zombie_bytes > 0 && self.shard.collect_zombies() > 0 {
                continue;
            }
            if !self.shard.sweep_once(self.now, self.flushed_through, p.evict) {
                return oom(self.shard);
            }
        }
        let seq = p.seq.fetch_add(1, Ordering::Relaxed);
        // One allocation for key and value (the iterator's exact length sizes it).
        let data: Arc<[u8]> = self.key.iter().chain(value).copied().collect();
        let item = Item {
            data,
            key_len: self.key.len() as u8,
            hash: self.hash,
            flags,
            exp,
            cas: if p.cas { cas.unwrap_or(seq) } else { 0 },
            seq,
            last_access: self.now,
            referenced: false,
            fetched: false,
            stale: false,
            win_sent: false,
            key_binary: false,
            class: class as u8,
        };
        let cas = item.cas;
        let requested = item.requested();
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
        let c = &mut sh.classes[(class as usize - 1).min(MAX_CLASSES - 1)];
        c.items += 1;
        c.bytes += size;
        c.requested += requested;
        self.idx = Some(idx);
        self.gone = None;
        Ok(cas)
    }
}

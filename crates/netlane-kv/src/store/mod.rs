//! The cache: a sharded hash table of items under a memory limit.
//!
//! # Design, and why
//! - **Shards, each behind its own mutex.** A key's 64-bit hash picks the shard (bits
//!   32 and up) and its bucket and tag in the shard's table (low and top bits); a command locks one shard for the
//!   few hundred nanoseconds it needs. With several times more shards than workers two
//!   workers rarely meet on one lock, and there is no global lock on the hot path: the
//!   CAS counter is the only shared write (one atomic add per mutation).
//! - **CLOCK eviction per shard** (second chance), not a linked LRU list: a hit only sets
//!   the item's `referenced` bit (no list surgery under the lock, no cache-line writes to
//!   neighbours); when a shard needs room its hand sweeps the slots, clearing bits and
//!   evicting the first item that was not referenced since the last sweep. CLOCK
//!   approximates LRU closely for cache workloads, and it is what memcached's segmented
//!   LRU also approximates (bump at most once per interval) with more machinery.
//! - **Memory** is accounted per shard (the limit divided evenly; keys hash uniformly):
//!   the key and value's allocation as the allocator sizes it, plus [`ITEM_OVERHEAD`]
//!   ([`item::accounted`]). An item never exceeds a shard's share (checked at
//!   construction), so a store can always make room by evicting (unless evictions
//!   are off, memcached's `-M`: then a full shard refuses the store).
//! - **Size classes** are reporting only: each item is counted in the class memcached
//!   would keep it in ([`Classes`]), so per-class stats and dumps read as memcached's.
//! - **Expiry** is lazy (an expired item found by a lookup is removed and counted) and
//!   active ([`Store::reap`], which the server calls on a timer, walks a bounded number
//!   of slots per shard).
//! - **flush_all** never walks the table: it records the internal sequence number at the
//!   moment it takes effect, and every item stored before it (lower sequence) is dead.
//!   A delayed flush takes effect at the first access at or after its time.
//!
//! Time is an argument (milliseconds on the caller's monotonic clock): the store reads no
//! clock and starts no thread.

mod classes;
mod item;
mod shard;

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

pub use classes::{ClassConfig, Classes, MAX_CLASSES};
pub use item::{ITEM_OVERHEAD, Item, NEVER, accounted};
pub use shard::{ClassCounters, Slot};
use shard::{Policy, Shard};

/// Longest key, in bytes (memcached's `KEY_MAX_LENGTH`).
pub const KEY_MAX: usize = 250;

/// What a store is built with.
#[derive(Debug, Clone, Copy)]
pub struct StoreConfig {
    /// Memory for items, bytes (keys, values and per-item overhead).
    pub memory: u64,
    /// Largest value, bytes (memcached's `-I`, 1 MiB by default).
    pub item_max: usize,
    /// Shards wanted (rounded down to a power of two and reduced until every shard's
    /// share holds at least four of the largest items, or to one).
    pub shards: usize,
    /// Keep CAS values (memcached's `-C` turns them off: every CAS value is 0).
    pub cas: bool,
    /// Evict live items to make room (memcached's `-M` turns it off: a full store
    /// refuses new values).
    pub evictions: bool,
    /// The size classes items are reported in; `None`: memcached's defaults for
    /// `item_max`.
    pub classes: Option<ClassConfig>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig { memory: 64 << 20, item_max: 1 << 20, shards: 64, cas: true, evictions: true, classes: None }
    }
}

impl StoreConfig {
    /// A store of `memory` bytes for values of up to `item_max`, in `shards` shards, with
    /// memcached's defaults otherwise.
    pub fn new(memory: u64, item_max: usize, shards: usize) -> StoreConfig {
        StoreConfig { memory, item_max, shards, ..StoreConfig::default() }
    }
}

/// A configuration that cannot work.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// The memory limit cannot hold even one of the largest items.
    #[error(
        "a memory limit of {memory} bytes is too small for items of up to {item_max} bytes (needs at least {need})"
    )]
    MemoryTooSmall {
        /// The limit asked for.
        memory: u64,
        /// The largest item.
        item_max: usize,
        /// The smallest limit that works.
        need: u64,
    },
    /// The largest item is outside 1 KiB ..= 1 GiB (memcached's bounds for `-I`).
    #[error("item size limit {0} bytes is outside 1 KiB ..= 1 GiB")]
    ItemMax(usize),
}

/// Why a key's item was found gone by a lookup (memcached's `get_expired` and
/// `get_flushed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gone {
    /// Its time ran out.
    Expired,
    /// A flush_all came after it was stored.
    Flushed,
}

/// Why a value was not stored (the protocol turns these into memcached's error lines).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// Bigger than the item size limit: `SERVER_ERROR object too large for cache`.
    #[error("object too large for cache")]
    TooLarge,
    /// The shard could not make room: `SERVER_ERROR out of memory storing object`.
    #[error("out of memory storing object")]
    OutOfMemory,
}

/// Counters kept by the store (the rest are the protocol's, per worker).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StoreStats {
    /// Items held now.
    pub curr_items: u64,
    /// Bytes held now (as accounted: key + value + overhead).
    pub bytes: u64,
    /// Items ever stored.
    pub total_items: u64,
    /// Items evicted to make room while still live.
    pub evictions: u64,
    /// Evicted items that had never been fetched.
    pub evicted_unfetched: u64,
    /// Expired or flushed items removed (by a lookup, by the sweep or by the reaper).
    pub reclaimed: u64,
    /// Expired items that had never been fetched.
    pub expired_unfetched: u64,
    /// Items the reaper (active expiry) removed.
    pub reaped: u64,
    /// Bytes of items replaced or evicted while replies still send them (by
    /// reference): still charged to the memory limit until the replies are out.
    pub replaced_in_flight: u64,
}

impl StoreStats {
    fn add(&mut self, o: &StoreStats) {
        self.curr_items += o.curr_items;
        self.bytes += o.bytes;
        self.total_items += o.total_items;
        self.evictions += o.evictions;
        self.evicted_unfetched += o.evicted_unfetched;
        self.reclaimed += o.reclaimed;
        self.expired_unfetched += o.expired_unfetched;
        self.reaped += o.reaped;
        self.replaced_in_flight += o.replaced_in_flight;
    }
}

/// One size class, summed over shards (`stats items`, `stats slabs`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ClassStats {
    /// The class (1-based).
    pub class: u32,
    /// Its chunk size in memcached.
    pub chunk_size: u64,
    /// Seconds since the least recently used item was accessed.
    pub oldest_age_s: u64,
    /// Its counters.
    pub counters: ClassCounters,
}

/// One shard on a cache line of its own.
#[derive(Debug)]
#[repr(align(64))]
struct Padded(Mutex<Shard>);

/// The cache. Share it between workers behind an `Arc`.
#[derive(Debug)]
pub struct Store {
    shards: Box<[Padded]>,
    /// Shard count less one (a power of two less one).
    mask: u64,
    item_max: usize,
    memory: AtomicU64,
    cas: bool,
    evictions: bool,
    classes: Classes,
    /// Next sequence number (also the default CAS value); starts at 1.
    seq: AtomicU64,
    /// Items with a lower or equal sequence number were flushed.
    flushed_through: AtomicU64,
    /// Time (ms) a delayed flush takes effect, [`NEVER`] when none is pending.
    flush_at: AtomicU64,
}

/// The 64-bit hash a key is stored under (xxh3: fast on short keys, well mixed).
pub fn hash_key(key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key)
}

impl Store {
    /// A store with `cfg`'s limits.
    pub fn new(cfg: StoreConfig) -> Result<Store, ConfigError> {
        if !(1024..=1 << 30).contains(&cfg.item_max) {
            return Err(ConfigError::ItemMax(cfg.item_max));
        }
        let biggest = accounted(KEY_MAX, cfg.item_max);
        if cfg.memory < biggest {
            return Err(ConfigError::MemoryTooSmall { memory: cfg.memory, item_max: cfg.item_max, need: biggest });
        }
        // The largest power of two not above the shards asked for, then halved until
        // every shard's share holds four of the largest items (or one shard is left).
        let wanted = cfg.shards.clamp(1, 1 << 16);
        let mut n = 1usize << (usize::BITS - 1 - wanted.leading_zeros());
        while n > 1 && cfg.memory / (n as u64) < 4 * biggest {
            n /= 2;
        }
        let share = cfg.memory / n as u64;
        let shards = (0..n).map(|_| Padded(Mutex::new(Shard::new(share)))).collect();
        Ok(Store {
            shards,
            mask: n as u64 - 1,
            item_max: cfg.item_max,
            memory: AtomicU64::new(cfg.memory),
            cas: cfg.cas,
            evictions: cfg.evictions,
            classes: Classes::new(cfg.classes.unwrap_or(ClassConfig::for_item_max(cfg.item_max))),
            seq: AtomicU64::new(1),
            flushed_through: AtomicU64::new(0),
            flush_at: AtomicU64::new(NEVER),
        })
    }

    /// Largest value accepted, bytes.
    pub fn item_max(&self) -> usize {
        self.item_max
    }

    /// The memory limit, bytes.
    pub fn memory(&self) -> u64 {
        self.memory.load(Ordering::Relaxed)
    }

    /// Changes the memory limit (memcached's `cache_memlimit`): false, and nothing
    /// changed, when a shard's share would not hold one of the largest items. A lower
    /// limit is reached as stores evict.
    pub fn set_memory(&self, bytes: u64, _now: u64) -> bool {
        let share = bytes / self.shards.len() as u64;
        if share < accounted(KEY_MAX, self.item_max) {
            return false;
        }
        self.memory.store(bytes, Ordering::Relaxed);
        for s in self.shards.iter() {
            lock(&s.0).set_limit(share);
        }
        true
    }

    /// Whether CAS values are kept.
    pub fn cas_enabled(&self) -> bool {
        self.cas
    }

    /// Whether live items are evicted for room.
    pub fn evictions_enabled(&self) -> bool {
        self.evictions
    }

    /// The size classes items are reported in.
    pub fn classes(&self) -> &Classes {
        &self.classes
    }

    /// Number of shards.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    fn shard_of(&self, hash: u64) -> &Mutex<Shard> {
        // Bits 32.. pick the shard. Not the top bits: hashbrown keeps the top 7 as each
        // entry's tag, and with 64 shards picked by the top 6 every key of a shard
        // would share 6 of its 7 tag bits (a key comparison for half the entries of a
        // probe group instead of 1 in 128); not the low bits either, which pick the
        // bucket.
        let i = ((hash >> 32) & self.mask) as usize;
        &self.shards[i].0
    }

    /// A new sequence number.
    fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Applies a delayed flush whose time has come; returns the flushed-through mark.
    fn flush_mark(&self, now: u64) -> u64 {
        let at = self.flush_at.load(Ordering::Relaxed);
        if now >= at && self.flush_at.compare_exchange(at, NEVER, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            let s = self.seq.load(Ordering::Relaxed).saturating_sub(1);
            self.flushed_through.fetch_max(s, Ordering::AcqRel);
        }
        self.flushed_through.load(Ordering::Acquire)
    }

    /// Runs `f` on the slot for `key` with its shard locked; expired or flushed items
    /// are gone before `f` sees the slot. Keep `f` short: it holds the shard's lock.
    pub fn with_slot<R>(&self, key: &[u8], now: u64, f: impl FnOnce(&mut Slot<'_>) -> R) -> R {
        let hash = hash_key(key);
        let mark = self.flush_mark(now);
        let mut guard = lock(self.shard_of(hash));
        let policy = Policy {
            seq: &self.seq,
            item_max: self.item_max,
            classes: &self.classes,
            cas: self.cas,
            evict: self.evictions,
        };
        let mut slot = guard.slot(key, hash, now, mark, policy);
        f(&mut slot)
    }

    /// Invalidates every item now (`delay_ms` 0) or at `now + delay_ms`. A later call
    /// replaces a pending delayed flush.
    pub fn flush_all(&self, now: u64, delay_ms: u64) {
        if delay_ms == 0 {
            self.flush_at.store(NEVER, Ordering::Relaxed);
            let s = self.next_seq();
            self.flushed_through.fetch_max(s, Ordering::AcqRel);
        } else {
            self.flush_at.store(now.saturating_add(delay_ms), Ordering::Relaxed);
        }
    }

    /// Active expiry: visits up to `budget` slots in each shard (continuing where the
    /// last call stopped) and removes expired or flushed items. Returns how many.
    pub fn reap(&self, now: u64, budget: usize) -> u64 {
        let mark = self.flush_mark(now);
        let mut n = 0;
        for s in self.shards.iter() {
            n += lock(&s.0).reap(now, mark, budget);
        }
        n
    }

    /// Calls `f` on live items, shard by shard (each locked while it is walked), until
    /// `f` returns false. For `stats cachedump`; not for the hot path.
    pub fn visit(&self, now: u64, mut f: impl FnMut(&Item) -> bool) {
        let mark = self.flush_mark(now);
        for s in self.shards.iter() {
            if !lock(&s.0).visit(now, mark, &mut f) {
                return;
            }
        }
    }

    /// The store's counters, summed over shards (locks each shard briefly).
    pub fn stats(&self) -> StoreStats {
        let mut t = StoreStats::default();
        for s in self.shards.iter() {
            t.add(&lock(&s.0).stats());
        }
        t
    }

    /// Per size class, the classes holding or having held items (locks each shard
    /// briefly, and walks the items for the ages: not for the hot path).
    pub fn class_stats(&self, now: u64) -> Vec<ClassStats> {
        let mut sum = [ClassCounters::default(); MAX_CLASSES];
        let mut oldest = [u64::MAX; MAX_CLASSES];
        for s in self.shards.iter() {
            let g = lock(&s.0);
            for (t, c) in sum.iter_mut().zip(g.class_counters()) {
                t.add(c);
            }
        }
        self.visit(now, |it| {
            let i = (it.class() as usize).saturating_sub(1).min(MAX_CLASSES - 1);
            oldest[i] = oldest[i].min(it.last_access());
            true
        });
        sum.iter()
            .enumerate()
            .filter(|(_, c)| **c != ClassCounters::default())
            .map(|(i, c)| ClassStats {
                class: i as u32 + 1,
                chunk_size: self.classes.chunk_size(i as u32 + 1),
                oldest_age_s: if oldest[i] == u64::MAX { 0 } else { now.saturating_sub(oldest[i]) / 1000 },
                counters: *c,
            })
            .collect()
    }

    /// Clears the cumulative counters (memcached's `stats reset` clears its item
    /// stats too).
    pub fn reset_stats(&self) {
        for s in self.shards.iter() {
            lock(&s.0).reset_stats();
        }
    }
}

/// A shard's lock. A panic inside a closure on another thread poisons it; the shard's
/// invariants hold between statements that can panic, so keep serving.
fn lock(m: &Mutex<Shard>) -> std::sync::MutexGuard<'_, Shard> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests;

//! Text commands carried out against the store, answered as memcached 1.6.18 answers
//! them (`proto_text.c`, and `do_store_item`/`do_add_delta` in `memcached.c`).
//!
//! Each function here takes a parsed command, runs it with the key's shard locked (one
//! lock per key, held only while the item is read or changed and its reply written),
//! counts it, and appends the reply. The meta commands are in [`super::meta`].

use super::out::Out;
use super::parse::{Command, StatsKind, StoreMode};
use super::reply::{line, push_u64};
use super::stats::Counters;
use super::{Clock, Host};
use crate::store::{Gone, Item, NEVER, Slot, Store, StoreError};

/// What the server lets clients do (memcached's options), as the protocol sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Commands beyond the common ones.
    pub allowed: super::parse::Allowed,
    /// `flush_all` (memcached's `-F` turns it off).
    pub flush: bool,
    /// `stats cachedump` (memcached's `-X` turns it off).
    pub dump: bool,
    /// Which protocols a connection may speak.
    pub protocol: Protocol,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            allowed: super::parse::Allowed { shutdown: false, debug_time: false },
            flush: true,
            dump: true,
            protocol: Protocol::Auto,
        }
    }
}

/// memcached's `-B`: the protocols a connection may speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// Either, told apart by the first byte (0x80: binary).
    Auto,
    /// The text (and meta) protocol only.
    Ascii,
    /// The binary protocol only.
    Binary,
}

/// What a command needs besides itself.
#[derive(Debug)]
pub struct Ctx<'a> {
    /// The cache.
    pub store: &'a Store,
    /// The time now.
    pub clock: Clock,
    /// The server around the protocol (stats, version).
    pub host: &'a dyn Host,
    /// This worker's counters.
    pub counters: &'a mut Counters,
    /// What the server allows.
    pub settings: &'a Settings,
}

pub(crate) const STORED: &[u8] = b"STORED";
pub(crate) const NOT_STORED: &[u8] = b"NOT_STORED";
pub(crate) const EXISTS: &[u8] = b"EXISTS";
pub(crate) const NOT_FOUND: &[u8] = b"NOT_FOUND";
/// A value over the item size limit.
pub const TOO_LARGE: &[u8] = b"SERVER_ERROR object too large for cache";
/// No memory for a value.
pub const NO_MEMORY: &[u8] = b"SERVER_ERROR out of memory storing object";
pub(crate) const NON_NUMERIC: &[u8] = b"CLIENT_ERROR cannot increment or decrement non-numeric value";

/// Counts a refused store and gives its reply.
pub(crate) fn store_error(c: &mut Counters, e: StoreError) -> &'static [u8] {
    match e {
        StoreError::TooLarge => {
            c.store_too_large += 1;
            TOO_LARGE
        }
        StoreError::OutOfMemory => {
            c.store_no_memory += 1;
            NO_MEMORY
        }
    }
}

/// Counts what a lookup found gone (memcached counts it on every lookup).
pub(crate) fn count_gone(c: &mut Counters, gone: Option<Gone>) {
    match gone {
        Some(Gone::Expired) => c.get_expired += 1,
        Some(Gone::Flushed) => c.get_flushed += 1,
        None => {}
    }
}

/// Counts one key looked up by a get (gat: a touch only), as memcached counts it.
pub(crate) fn count_lookup(c: &mut Counters, touch: bool, hit: bool) {
    if touch {
        c.cmd_touch += 1;
        if hit {
            c.touch_hits += 1;
        } else {
            c.touch_misses += 1;
        }
    } else {
        c.cmd_get += 1;
        if hit {
            c.get_hits += 1;
        } else {
            c.get_misses += 1;
        }
    }
}

/// One key of get/gets/gat/gats: its `VALUE` block if present. `touch` is gat's new
/// deadline. Counted as memcached counts it: a gat key counts as a touch only.
pub fn get_key(ctx: &mut Ctx<'_>, key: &[u8], cas: bool, touch: Option<u64>, out: &mut Out) {
    let c = &mut *ctx.counters;
    ctx.store.with_slot(key, ctx.clock.now_ms, |slot| {
        count_gone(c, slot.gone());
        if let (Some(e), Some(it)) = (touch, slot.item_mut()) {
            it.set_exp(e);
        }
        let hit = slot.hit().is_some();
        count_lookup(c, touch.is_some(), hit);
        if let Some(it) = slot.item() {
            value_block(out, it, cas);
        }
    });
}

/// `VALUE <key> <flags> <bytes> [<cas>]\r\n<data>\r\n` (a large value by reference).
fn value_block(out: &mut Out, it: &Item, cas: bool) {
    out.extend_from_slice(b"VALUE ");
    out.extend_from_slice(it.key());
    out.push(b' ');
    push_u64(out, u64::from(it.flags()));
    out.push(b' ');
    push_u64(out, it.value().len() as u64);
    if cas {
        out.push(b' ');
        push_u64(out, it.cas());
    }
    out.extend_from_slice(b"\r\n");
    let (data, value) = it.shared_value();
    out.push_value(data, value);
    out.extend_from_slice(b"\r\n");
}

/// How a store's CAS value compares with the present item's (memcached's
/// `do_store_item`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CasCheck {
    /// No CAS value given (0).
    None,
    /// Equal.
    Match,
    /// Lower, and the command may store a stale value (meta `I`).
    Stale,
    /// Different.
    BadVal,
}

pub(crate) fn cas_check(given: u64, present: u64, may_stale: bool) -> CasCheck {
    if given == 0 {
        CasCheck::None
    } else if given == present {
        CasCheck::Match
    } else if may_stale && given < present {
        CasCheck::Stale
    } else {
        CasCheck::BadVal
    }
}

/// The outcome of a store, before it is turned into a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Stored,
    NotStored,
    Exists,
    NotFound,
    Failed(StoreError),
}

/// A store into `slot` as memcached's `do_store_item` does it: `mode` with its CAS
/// value (`given`, 0 for none), `stale` allowing a lower CAS to store a stale value.
/// Counts cas_hits, cas_badval and cas_misses.
#[allow(clippy::too_many_arguments)]
pub(crate) fn store_in(
    c: &mut Counters,
    slot: &mut Slot<'_>,
    mode: StoreMode,
    data: &[u8],
    flags: u32,
    exp: u64,
    given: u64,
    stale: bool,
) -> Outcome {
    let Some((old_cas, old_flags, old_exp, old_win)) =
        slot.item().map(|it| (it.cas(), it.flags(), it.exp(), it.win_sent()))
    else {
        return match mode {
            StoreMode::Set | StoreMode::Add => match slot.store(data, flags, exp, None) {
                Ok(_) => Outcome::Stored,
                Err(e) => Outcome::Failed(e),
            },
            StoreMode::Cas => {
                c.cas_misses += 1;
                Outcome::NotFound
            }
            StoreMode::Replace | StoreMode::Append | StoreMode::Prepend => Outcome::NotStored,
        };
    };
    let check = cas_check(given, old_cas, stale);
    let done = |r: Result<u64, StoreError>| match r {
        Ok(_) => Outcome::Stored,
        Err(e) => Outcome::Failed(e),
    };
    match mode {
        StoreMode::Add => {
            // Not stored, but promoted as a hit would be.
            slot.touch_lru();
            Outcome::NotStored
        }
        StoreMode::Cas => match check {
            CasCheck::Match => {
                c.cas_hits += 1;
                done(slot.store(data, flags, exp, None))
            }
            CasCheck::Stale => {
                // A stale value keeps the present TTL and recache state.
                c.cas_hits += 1;
                let r = slot.store(data, flags, old_exp, None);
                if let Some(it) = slot.item_mut() {
                    it.set_stale(true);
                    it.set_win_sent(old_win);
                }
                done(r)
            }
            CasCheck::None | CasCheck::BadVal => {
                c.cas_badval += 1;
                Outcome::Exists
            }
        },
        StoreMode::Append | StoreMode::Prepend => {
            if !matches!(check, CasCheck::None | CasCheck::Match) {
                return Outcome::Exists;
            }
            let old = slot.item().map_or(&[][..], Item::value);
            if old.len() + data.len() > slot.item_max() {
                return Outcome::NotStored;
            }
            let joined = if mode == StoreMode::Append { [old, data].concat() } else { [data, old].concat() };
            // Append and prepend keep the item's flags and expiry.
            done(slot.store(&joined, old_flags, old_exp, None))
        }
        StoreMode::Set | StoreMode::Replace => done(slot.store(data, flags, exp, None)),
    }
}

/// A text storage command with its data block (CRLF already checked and removed).
#[allow(clippy::too_many_arguments)]
pub fn store(
    ctx: &mut Ctx<'_>,
    mode: StoreMode,
    key: &[u8],
    flags: u32,
    exptime: i32,
    cas_in: u64,
    data: &[u8],
) -> &'static [u8] {
    let c = &mut *ctx.counters;
    c.cmd_set += 1;
    let exp = ctx.clock.deadline(i64::from(exptime));
    let r = ctx.store.with_slot(key, ctx.clock.now_ms, |slot| {
        count_gone(c, slot.gone());
        store_in(c, slot, mode, data, flags, exp, cas_in, false)
    });
    match r {
        Outcome::Stored => STORED,
        Outcome::NotStored => NOT_STORED,
        Outcome::Exists => EXISTS,
        Outcome::NotFound => NOT_FOUND,
        Outcome::Failed(e) => store_error(c, e),
    }
}

/// A store refused before its data arrived (too large, no memory): counted, and for a
/// set the key's present value is removed, as memcached does, so that a failed update
/// is never followed by a read of the old value.
pub fn refuse_store(ctx: &mut Ctx<'_>, key: &[u8], unlink: bool, e: StoreError) -> &'static [u8] {
    if unlink {
        ctx.store.with_slot(key, ctx.clock.now_ms, |slot| slot.remove());
    }
    store_error(ctx.counters, e)
}

/// The number an incr/decr works on, read as memcached's `safe_strtoull` reads the
/// item's data: the value ends at a NUL byte, and may have white space around the
/// digits (a decr pads a shorter number with spaces).
pub(crate) fn numeric(v: &[u8]) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    let v = &v[..memchr::memchr(0, v).unwrap_or(v.len())];
    super::parse::Num::parse(v)?.u64()
}

pub(crate) enum Arith {
    Done(u64),
    Missing,
    NonNumeric,
    CasMismatch,
    Failed,
}

/// Applies a delta to the slot's live item as memcached's `do_add_delta` does: incr
/// wraps at 2^64, decr stops at 0; a shorter result is padded with spaces to the
/// value's length (memcached rewrites the value in place); a longer one is a new
/// value. Flags and expiry stay; the CAS value is new. `given` is a CAS value to
/// compare (0: none).
pub(crate) fn arith_slot(slot: &mut Slot<'_>, incr: bool, delta: u64, given: u64) -> Arith {
    let Some(it) = slot.item() else { return Arith::Missing };
    if given != 0 && it.cas() != given {
        return Arith::CasMismatch;
    }
    let Some(v) = numeric(it.value()) else { return Arith::NonNumeric };
    let (flags, exp, old_len) = (it.flags(), it.exp(), it.value().len());
    let n = if incr { v.wrapping_add(delta) } else { v.saturating_sub(delta) };
    let mut text = Vec::with_capacity(old_len.max(20));
    push_u64(&mut text, n);
    if text.len() < old_len {
        text.resize(old_len, b' ');
    }
    match slot.store(&text, flags, exp, None) {
        Ok(_) => Arith::Done(n),
        Err(_) => Arith::Failed,
    }
}

/// incr/decr.
fn arith(ctx: &mut Ctx<'_>, incr: bool, key: &[u8], delta: u64, out: &mut Vec<u8>) {
    let c = &mut *ctx.counters;
    let r = ctx.store.with_slot(key, ctx.clock.now_ms, |slot| {
        count_gone(c, slot.gone());
        arith_slot(slot, incr, delta, 0)
    });
    match r {
        Arith::Done(n) => {
            if incr {
                c.incr_hits += 1
            } else {
                c.decr_hits += 1
            }
            push_u64(out, n);
            out.extend_from_slice(b"\r\n");
        }
        Arith::Missing | Arith::CasMismatch => {
            if incr {
                c.incr_misses += 1
            } else {
                c.decr_misses += 1
            }
            line(out, NOT_FOUND);
        }
        Arith::NonNumeric => {
            c.client_errors += 1;
            line(out, NON_NUMERIC);
        }
        Arith::Failed => {
            c.store_no_memory += 1;
            line(out, b"SERVER_ERROR out of memory");
        }
    }
}

/// What a command asks of the connection beyond its reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// Nothing.
    Continue,
    /// Close once the replies are out (`quit`, `shutdown`).
    Close,
}

/// Runs a command that has no data block. The reply is appended to `out` unless the
/// command asked for none (`noreply`, or a meta command's `q` on its nominal reply).
pub fn simple(ctx: &mut Ctx<'_>, cmd: Command<'_>, out: &mut Out) -> After {
    let mark = out.mark();
    let (after, silent) = run(ctx, cmd, out);
    if silent {
        out.truncate(mark);
    }
    after
}

fn run(ctx: &mut Ctx<'_>, cmd: Command<'_>, out: &mut Out) -> (After, bool) {
    let now = ctx.clock.now_ms;
    let go = |silent: bool| (After::Continue, silent);
    match cmd {
        Command::Delete { key, noreply } => {
            let c = &mut *ctx.counters;
            let hit = ctx.store.with_slot(key, now, |slot| {
                count_gone(c, slot.gone());
                slot.remove()
            });
            if hit {
                c.delete_hits += 1;
                line(out, b"DELETED");
            } else {
                c.delete_misses += 1;
                line(out, NOT_FOUND);
            }
            go(noreply)
        }
        Command::Arith { incr, key, delta, noreply } => {
            arith(ctx, incr, key, delta, out);
            go(noreply)
        }
        Command::Touch { key, exptime, noreply } => {
            let exp = ctx.clock.deadline(i64::from(exptime));
            let c = &mut *ctx.counters;
            c.cmd_touch += 1;
            let hit = ctx.store.with_slot(key, now, |slot| {
                count_gone(c, slot.gone());
                slot.item_mut().map(|it| it.set_exp(exp)).is_some() && slot.hit().is_some()
            });
            if hit {
                c.touch_hits += 1;
                line(out, b"TOUCHED");
            } else {
                c.touch_misses += 1;
                line(out, NOT_FOUND);
            }
            go(noreply)
        }
        Command::FlushAll { exptime, noreply } => {
            ctx.counters.cmd_flush += 1;
            if !ctx.settings.flush {
                line(out, b"CLIENT_ERROR flush_all not allowed");
                return go(noreply);
            }
            flush_at(ctx.store, ctx.clock, exptime);
            line(out, b"OK");
            go(noreply)
        }
        Command::Stats(StatsKind::Detail { dump }) => {
            line(out, if dump { b"END" } else { b"OK" });
            go(false)
        }
        Command::Stats(kind) => {
            if matches!(kind, StatsKind::CacheDump { .. }) && !ctx.settings.dump {
                line(out, b"CLIENT_ERROR stats cachedump not allowed");
            } else {
                ctx.host.stats(kind, ctx.store, ctx.counters, ctx.clock, out);
            }
            go(false)
        }
        Command::Version => {
            out.extend_from_slice(b"VERSION ");
            line(out, ctx.host.version().as_bytes());
            go(false)
        }
        Command::Verbosity { level, noreply } => {
            ctx.host.verbosity(level.min(2));
            line(out, b"OK");
            go(noreply)
        }
        Command::Quit => (After::Close, false),
        Command::Shutdown { graceful } => {
            ctx.host.shutdown(graceful);
            (After::Close, false)
        }
        Command::SlabsAutomove { noreply } => {
            line(out, b"OK");
            go(noreply)
        }
        Command::CacheMemlimit { megabytes, noreply } => {
            let reply: &[u8] = if megabytes < 8 {
                b"MEMLIMIT_TOO_SMALL cannot set maxbytes to less than 8m"
            } else if megabytes > 1_000_000_000 {
                b"MEMLIMIT_ADJUST_FAILED input value is megabytes not bytes"
            } else if !ctx.host.may_grow((u64::from(megabytes) << 20).saturating_sub(ctx.store.memory())) {
                b"MEMLIMIT_ADJUST_FAILED out of memory"
            } else if ctx.store.set_memory(u64::from(megabytes) << 20, now) {
                b"OK"
            } else {
                b"MEMLIMIT_ADJUST_FAILED out of bounds or unable to adjust"
            };
            line(out, reply);
            go(noreply)
        }
        Command::DebugTime(secs) => {
            ctx.host.advance_clock(secs);
            ctx.clock = ctx.clock.advanced(secs);
            line(out, b"OK");
            go(false)
        }
        Command::MetaNoop => {
            ctx.counters.cmd_meta += 1;
            line(out, b"MN");
            go(false)
        }
        Command::MetaGet(key, flags) => go(super::meta::get(ctx, &key, &flags, out)),
        Command::MetaDelete(key, flags) => go(super::meta::delete(ctx, &key, &flags, out)),
        Command::MetaArith(key, flags) => go(super::meta::arith(ctx, &key, &flags, out)),
        Command::MetaDebug(key) => {
            super::meta::debug(ctx, &key, out);
            go(false)
        }
        // Storage commands are the connection's to run (they wait for their data).
        Command::Store { .. } | Command::MetaSet(..) => {
            debug_assert!(false, "not a simple command");
            go(true)
        }
    }
}

/// `flush_all [exptime]` as memcached 1.6.18 times it: now for 0 or a negative time;
/// else at the time given (relative up to 30 days, else a Unix time). A Unix time at or
/// before the server started flushes now (memcached answers OK and flushes nothing).
pub(crate) fn flush_at(store: &Store, clock: Clock, exptime: i32) {
    let now = clock.now_ms;
    if exptime <= 0 {
        store.flush_all(now, 0);
        return;
    }
    let at = clock.deadline(i64::from(exptime));
    store.flush_all(now, if at == NEVER { 0 } else { at.saturating_sub(now) });
}

/// memcached's largest `stats cachedump` reply.
const CACHEDUMP_MAX: usize = 2 << 20;

/// `stats cachedump <class> <limit>`: `ITEM <key> [<bytes> b; <expiry> s]` per key
/// of size class `class` (expiry as a Unix time, 0 for none), then `END`. At most
/// `limit` keys (0: no limit) and 2 MB, as memcached.
pub fn cachedump(class: u32, limit: u32, store: &Store, clock: Clock, out: &mut Vec<u8>) {
    let start = out.len();
    let mut shown = 0u32;
    store.visit(clock.now_ms, |it| {
        if (limit != 0 && shown >= limit) || out.len() - start + it.key().len() + 64 > CACHEDUMP_MAX {
            return false;
        }
        if it.class() != class {
            return true;
        }
        out.extend_from_slice(b"ITEM ");
        out.extend_from_slice(it.key());
        out.extend_from_slice(b" [");
        push_u64(out, it.value().len() as u64);
        out.extend_from_slice(b" b; ");
        push_u64(out, if it.exp() == NEVER { 0 } else { (clock.epoch_ms + it.exp()) / 1000 });
        out.extend_from_slice(b" s]\r\n");
        shown += 1;
        true
    });
    out.extend_from_slice(b"END\r\n");
}

/// `stats items`, `stats slabs` and `stats sizes`: the store has no slabs, but its
/// items are reported by the size class memcached would keep them in
/// ([`crate::store::Classes`]), so tools that walk the classes (memcdump, memcached-tool)
/// find every item.
pub fn store_class_stats(kind: StatsKind, store: &Store, clock: Clock, w: &mut super::reply::StatsWriter<'_>) {
    let s = store.stats();
    let classes = store.class_stats(clock.now_ms);
    match kind {
        StatsKind::Items => {
            for cs in &classes {
                let (p, c) = (|name: &str| format!("items:{}:{name}", cs.class), &cs.counters);
                w.num(&p("number"), c.items)
                    .num(&p("number_hot"), 0)
                    .num(&p("number_warm"), 0)
                    .num(&p("number_cold"), c.items)
                    .num(&p("age"), cs.oldest_age_s)
                    .num(&p("mem_requested"), c.requested)
                    .num(&p("evicted"), c.evicted)
                    .num(&p("evicted_nonzero"), c.evicted)
                    .num(&p("evicted_unfetched"), c.evicted_unfetched)
                    .num(&p("expired_unfetched"), c.expired_unfetched)
                    .num(&p("outofmemory"), c.outofmemory)
                    .num(&p("reclaimed"), c.reclaimed)
                    .num(&p("crawler_reclaimed"), c.reaped);
            }
        }
        StatsKind::Slabs => {
            for cs in &classes {
                let (p, c) = (|name: &str| format!("{}:{name}", cs.class), &cs.counters);
                w.num(&p("chunk_size"), cs.chunk_size)
                    .num(&p("used_chunks"), c.items)
                    .num(&p("mem_requested"), c.requested);
            }
            w.num("active_slabs", classes.len() as u64).num("total_malloced", s.bytes);
        }
        StatsKind::Sizes => {
            w.text("sizes_status", "disabled");
        }
        _ => {}
    }
}

//! Text commands carried out against the store, answered as memcached 1.6.18 answers
//! them (`proto_text.c`, and `do_store_item`/`do_add_delta` in `memcached.c`).
//!
//! Each function here takes a parsed command, runs it with the key's shard locked (one
//! lock per key, held only while the item is read or changed and its reply written),
//! counts it, and appends the reply. The meta commands are in [`super::meta`].
//!
//! This file holds the text commands and what they share with the meta and binary
//! ones (the context, replies, counting); a store into one item and incr/decr on it are
//! in `slot.rs`, the stats listings that walk the store's items in `store_stats.rs`.

mod slot;
mod store_stats;

pub(crate) use slot::{Arith, Outcome, arith_slot, store_in};
pub use store_stats::{cachedump, store_class_stats};

use super::out::Out;
use super::parse::{Command, StatsKind, StoreMode};
use super::reply::{line, push_u64};
use super::stats::Counters;
use super::{Clock, Host};
use crate::store::{Gone, Item, NEVER, Store, StoreError};

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
    let go = |silent: bool| (After::Continue, silent);
    match cmd {
        Command::Delete { key, noreply } => {
            delete(ctx, key, out);
            go(noreply)
        }
        Command::Arith { incr, key, delta, noreply } => {
            arith(ctx, incr, key, delta, out);
            go(noreply)
        }
        Command::Touch { key, exptime, noreply } => {
            touch(ctx, key, exptime, out);
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
            line(out, cache_memlimit(ctx, megabytes));
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

/// delete.
fn delete(ctx: &mut Ctx<'_>, key: &[u8], out: &mut Out) {
    let c = &mut *ctx.counters;
    let hit = ctx.store.with_slot(key, ctx.clock.now_ms, |slot| {
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
}

/// touch.
fn touch(ctx: &mut Ctx<'_>, key: &[u8], exptime: i32, out: &mut Out) {
    let exp = ctx.clock.deadline(i64::from(exptime));
    let c = &mut *ctx.counters;
    c.cmd_touch += 1;
    let hit = ctx.store.with_slot(key, ctx.clock.now_ms, |slot| {
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
}

/// `cache_memlimit <megabytes>`: the new limit set, or why not; the reply line.
fn cache_memlimit(ctx: &mut Ctx<'_>, megabytes: u32) -> &'static [u8] {
    if megabytes < 8 {
        b"MEMLIMIT_TOO_SMALL cannot set maxbytes to less than 8m"
    } else if megabytes > 1_000_000_000 {
        b"MEMLIMIT_ADJUST_FAILED input value is megabytes not bytes"
    } else if !ctx.host.may_grow((u64::from(megabytes) << 20).saturating_sub(ctx.store.memory())) {
        b"MEMLIMIT_ADJUST_FAILED out of memory"
    } else if ctx.store.set_memory(u64::from(megabytes) << 20, ctx.clock.now_ms) {
        b"OK"
    } else {
        b"MEMLIMIT_ADJUST_FAILED out of bounds or unable to adjust"
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

//! Commands carried out against the store, answered as memcached answers them.
//!
//! Each function here takes a parsed command, runs it with the key's shard locked (one
//! lock per key, held only while the item is read or changed and its reply written),
//! counts it, and appends the reply.

use super::parse::{Command, MetaFlags, MetaKey, ParseError, StatsKind, StoreMode, Tokens};
use super::reply::{line, push_i64, push_u64};
use super::stats::Counters;
use super::{Clock, Host};
use crate::store::{Gone, Item, KEY_MAX, NEVER, Slot, Store, StoreError};

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
}

const STORED: &[u8] = b"STORED";
const NOT_STORED: &[u8] = b"NOT_STORED";
const EXISTS: &[u8] = b"EXISTS";
const NOT_FOUND: &[u8] = b"NOT_FOUND";
const TOO_LARGE: &[u8] = b"SERVER_ERROR object too large for cache";
const NO_MEMORY: &[u8] = b"SERVER_ERROR out of memory storing object";
const NON_NUMERIC: &[u8] = b"CLIENT_ERROR cannot increment or decrement non-numeric value";

fn store_error(c: &mut Counters, e: StoreError) -> &'static [u8] {
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

/// Where a multi-key get stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GetProgress {
    /// All keys answered and `END` written.
    Done,
    /// The output reached the limit; continue with this key index.
    Paused(usize),
}

/// get/gets/gat/gats from key index `skip`, pausing when `out` reaches `pause_at` bytes.
pub fn get(
    ctx: &mut Ctx<'_>,
    keys: Tokens<'_>,
    cas: bool,
    touch: Option<i64>,
    skip: usize,
    out: &mut Vec<u8>,
    pause_at: usize,
) -> Result<GetProgress, ParseError> {
    if skip == 0 && keys.clone().any(|k| k.len() > KEY_MAX) {
        return Err(super::parse::BAD_FORMAT);
    }
    let exp = touch.map(|t| ctx.clock.deadline(t));
    for (i, key) in keys.enumerate().skip(skip) {
        if out.len() >= pause_at && i > skip {
            return Ok(GetProgress::Paused(i));
        }
        let c = &mut *ctx.counters;
        ctx.store.with_slot(key, ctx.clock.now_ms, |slot| {
            if let (Some(e), Some(it)) = (exp, slot.item_mut()) {
                it.set_exp(e);
            }
            let gone = slot.gone();
            if slot.hit().is_none() {
                count_get(c, touch.is_some(), false, gone);
                return;
            }
            count_get(c, touch.is_some(), true, None);
            if let Some(it) = slot.item() {
                value_block(out, it, cas);
            }
        });
    }
    out.extend_from_slice(b"END\r\n");
    Ok(GetProgress::Done)
}

fn count_get(c: &mut Counters, touch: bool, hit: bool, gone: Option<Gone>) {
    if touch {
        c.cmd_touch += 1;
        if hit {
            c.touch_hits += 1;
        } else {
            c.touch_misses += 1;
        }
    }
    c.cmd_get += 1;
    if hit {
        c.get_hits += 1;
    } else {
        c.get_misses += 1;
        match gone {
            Some(Gone::Expired) => c.get_expired += 1,
            Some(Gone::Flushed) => c.get_flushed += 1,
            None => {}
        }
    }
}

/// `VALUE <key> <flags> <bytes> [<cas>]\r\n<data>\r\n`.
fn value_block(out: &mut Vec<u8>, it: &Item, cas: bool) {
    out.reserve(it.key().len() + it.value().len() + 48);
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
    out.extend_from_slice(it.value());
    out.extend_from_slice(b"\r\n");
}

/// A storage command with its data block (CRLF already checked and removed).
pub fn store(
    ctx: &mut Ctx<'_>,
    mode: StoreMode,
    key: &[u8],
    flags: u32,
    exptime: i64,
    cas_in: u64,
    data: &[u8],
) -> &'static [u8] {
    let c = &mut *ctx.counters;
    c.cmd_set += 1;
    if data.len() > ctx.store.item_max() {
        c.store_too_large += 1;
        return TOO_LARGE;
    }
    let exp = ctx.clock.deadline(exptime);
    let item_max = ctx.store.item_max();
    ctx.store.with_slot(key, ctx.clock.now_ms, |slot| {
        let present = slot.item().map(|it| (it.cas(), it.flags(), it.exp(), it.value().len()));
        // Only the refusals return early; every other case stores `data`.
        match (mode, present) {
            (StoreMode::Set, _) => {}
            (StoreMode::Add, Some(_)) => {
                slot.hit();
                return NOT_STORED;
            }
            (StoreMode::Replace | StoreMode::Append | StoreMode::Prepend, None) => return NOT_STORED,
            (StoreMode::Add | StoreMode::Replace, _) => {}
            (StoreMode::Cas, None) => {
                c.cas_misses += 1;
                return NOT_FOUND;
            }
            (StoreMode::Cas, Some((cas, ..))) if cas != cas_in => {
                c.cas_badval += 1;
                return EXISTS;
            }
            (StoreMode::Cas, Some(_)) => {
                c.cas_hits += 1;
            }
            (StoreMode::Append | StoreMode::Prepend, Some((_, old_flags, old_exp, old_len))) => {
                if old_len + data.len() > item_max {
                    c.store_too_large += 1;
                    return TOO_LARGE;
                }
                let old = slot.item().map_or(&[][..], Item::value);
                let joined = if mode == StoreMode::Append { [old, data].concat() } else { [data, old].concat() };
                // Append and prepend keep the item's flags and expiry.
                return match slot.store(&joined, old_flags, old_exp, None) {
                    Ok(_) => STORED,
                    Err(e) => store_error(c, e),
                };
            }
        };
        match slot.store(data, flags, exp, None) {
            Ok(_) => STORED,
            Err(e) => store_error(c, e),
        }
    })
}

/// The number an incr/decr works on: decimal digits, optionally space-padded (as
/// memcached pads a value a decr shortened).
fn numeric(v: &[u8]) -> Option<u64> {
    let digits = v.iter().rposition(|&b| b != b' ').map_or(&[][..], |end| &v[..=end]);
    if digits.is_empty() || digits.len() > 20 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

fn apply_delta(v: u64, delta: u64, incr: bool) -> u64 {
    if incr { v.wrapping_add(delta) } else { v.saturating_sub(delta) }
}

enum Arith {
    Done(u64),
    Missing,
    NonNumeric,
    Failed(StoreError),
}

/// Applies a delta to the slot's live item, keeping its flags and expiry.
fn arith_slot(slot: &mut Slot<'_>, incr: bool, delta: u64, new_cas: Option<u64>) -> Arith {
    let Some(it) = slot.item() else { return Arith::Missing };
    let Some(v) = numeric(it.value()) else { return Arith::NonNumeric };
    let (flags, exp) = (it.flags(), it.exp());
    let n = apply_delta(v, delta, incr);
    let mut text = Vec::with_capacity(20);
    push_u64(&mut text, n);
    match slot.store(&text, flags, exp, new_cas) {
        Ok(_) => Arith::Done(n),
        Err(e) => Arith::Failed(e),
    }
}

/// incr/decr.
pub fn arith(ctx: &mut Ctx<'_>, incr: bool, key: &[u8], delta: u64, out: &mut Vec<u8>) {
    let c = &mut *ctx.counters;
    let r = ctx.store.with_slot(key, ctx.clock.now_ms, |slot| arith_slot(slot, incr, delta, None));
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
        Arith::Missing => {
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
        Arith::Failed(e) => line(out, store_error(c, e)),
    }
}

/// Runs a command that has no data block and is not a get. Returns whether the reply
/// may be written (false under noreply).
pub fn simple(ctx: &mut Ctx<'_>, cmd: Command<'_>, out: &mut Vec<u8>) -> bool {
    let now = ctx.clock.now_ms;
    match cmd {
        Command::Delete { key, noreply } => {
            let hit = ctx.store.with_slot(key, now, |slot| slot.remove());
            if hit {
                ctx.counters.delete_hits += 1;
                line(out, b"DELETED");
            } else {
                ctx.counters.delete_misses += 1;
                line(out, NOT_FOUND);
            }
            !noreply
        }
        Command::Arith { incr, key, delta, noreply } => {
            arith(ctx, incr, key, delta, out);
            !noreply
        }
        Command::Touch { key, exptime, noreply } => {
            let exp = ctx.clock.deadline(exptime);
            ctx.counters.cmd_touch += 1;
            let hit = ctx.store.with_slot(key, now, |slot| {
                slot.item_mut().map(|it| it.set_exp(exp)).is_some() && slot.hit().is_some()
            });
            if hit {
                ctx.counters.touch_hits += 1;
                line(out, b"TOUCHED");
            } else {
                ctx.counters.touch_misses += 1;
                line(out, NOT_FOUND);
            }
            !noreply
        }
        Command::FlushAll { delay, noreply } => {
            ctx.counters.cmd_flush += 1;
            let at = if delay == 0 { now } else { ctx.clock.deadline(delay) };
            ctx.store.flush_all(now, at.saturating_sub(now));
            line(out, b"OK");
            !noreply
        }
        Command::Stats(kind) => {
            ctx.host.stats(kind, ctx.store, ctx.counters, ctx.clock, out);
            true
        }
        Command::Version => {
            out.extend_from_slice(b"VERSION ");
            line(out, ctx.host.version().as_bytes());
            true
        }
        Command::Verbosity { level, noreply } => {
            match level {
                Some(l) => {
                    ctx.host.verbosity(l);
                    line(out, b"OK");
                }
                None => {
                    ctx.counters.client_errors += 1;
                    line(out, super::parse::BAD_FORMAT.reply.as_bytes());
                }
            }
            !noreply
        }
        Command::MetaNoop => {
            ctx.counters.cmd_meta += 1;
            line(out, b"MN");
            true
        }
        Command::MetaGet(key, flags) => meta_get(ctx, &key, &flags, out),
        Command::MetaDelete(key, flags) => meta_delete(ctx, &key, &flags, out),
        Command::MetaArith(key, flags) => meta_arith(ctx, &key, &flags, out),
        Command::MetaDebug(key) => {
            ctx.counters.cmd_meta += 1;
            let clock = ctx.clock;
            ctx.store.with_slot(key.bytes(), now, |slot| match slot.item() {
                None => line(out, b"EN"),
                Some(it) => {
                    out.extend_from_slice(b"ME ");
                    out.extend_from_slice(key.token);
                    out.extend_from_slice(b" exp=");
                    push_i64(out, clock.ttl_secs(it.exp()));
                    out.extend_from_slice(b" la=");
                    push_u64(out, clock.now_ms.saturating_sub(it.last_access()) / 1000);
                    out.extend_from_slice(b" cas=");
                    push_u64(out, it.cas());
                    out.extend_from_slice(if it.fetched() { b" fetch=yes" } else { b" fetch=no" });
                    out.extend_from_slice(b" cls=1 size=");
                    push_u64(out, it.accounted());
                    out.extend_from_slice(b"\r\n");
                }
            });
            true
        }
        // Gets, storage commands and quit are the connection's to run.
        Command::Get { .. } | Command::Store { .. } | Command::MetaSet(..) | Command::Quit => {
            debug_assert!(false, "not a simple command");
            false
        }
    }
}

/// What meta flags may report about an item, taken before the command changed it.
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    cas: u64,
    flags: u32,
    fetched: bool,
    last_access: u64,
    size: usize,
    exp: u64,
}

impl Seen {
    fn of(it: &Item) -> Seen {
        Seen {
            cas: it.cas(),
            flags: it.flags(),
            fetched: it.fetched(),
            last_access: it.last_access(),
            size: it.value().len(),
            exp: it.exp(),
        }
    }
}

/// The return flags, in the order the client sent them, then W, X and Z.
fn meta_flags_out(out: &mut Vec<u8>, key: &MetaKey<'_>, f: &MetaFlags<'_>, seen: Option<Seen>, clock: Clock) {
    for &c in f.order() {
        match (c, seen) {
            // As memcached: a key sent in base64 is returned as sent, followed by `b`.
            (b'k', _) => {
                out.extend_from_slice(b" k");
                out.extend_from_slice(key.token);
                if key.binary() {
                    out.extend_from_slice(b" b");
                }
            }
            (b'O', _) => {
                out.extend_from_slice(b" O");
                out.extend_from_slice(f.opaque.unwrap_or_default());
            }
            (b'c', Some(s)) => {
                out.extend_from_slice(b" c");
                push_u64(out, s.cas);
            }
            (b'f', Some(s)) => {
                out.extend_from_slice(b" f");
                push_u64(out, u64::from(s.flags));
            }
            (b'h', Some(s)) => out.extend_from_slice(if s.fetched { b" h1" } else { b" h0" }),
            (b'l', Some(s)) => {
                out.extend_from_slice(b" l");
                push_u64(out, clock.now_ms.saturating_sub(s.last_access) / 1000);
            }
            (b's', Some(s)) => {
                out.extend_from_slice(b" s");
                push_u64(out, s.size as u64);
            }
            (b't', Some(s)) => {
                out.extend_from_slice(b" t");
                push_i64(out, clock.ttl_secs(s.exp));
            }
            _ => {}
        }
    }
}

fn meta_head(out: &mut Vec<u8>, code: &[u8]) {
    out.extend_from_slice(code);
}

fn meta_get(ctx: &mut Ctx<'_>, key: &MetaKey<'_>, f: &MetaFlags<'_>, out: &mut Vec<u8>) -> bool {
    let clock = ctx.clock;
    let c = &mut *ctx.counters;
    c.cmd_meta += 1;
    ctx.store.with_slot(key.bytes(), clock.now_ms, |slot| {
        let gone = slot.gone();
        let mut created = false;
        if slot.item().is_none()
            && let Some(ttl) = f.vivify
        {
            match slot.store(&[], 0, clock.deadline(ttl), f.new_cas) {
                Ok(_) => created = true,
                Err(e) => {
                    line(out, store_error(c, e));
                    return true;
                }
            }
        }
        let Some(it) = slot.item_mut() else {
            count_get(c, f.ttl.is_some(), false, gone);
            line(out, b"EN");
            return !f.quiet;
        };
        let mut seen = Seen::of(it);
        if let Some(t) = f.ttl {
            let e = clock.deadline(t);
            it.set_exp(e);
            seen.exp = e;
        }
        // Recache arbitration, as memcached: one client wins (W) the right to refill a
        // new (vivified), stale or nearly expired (R) item; once a win was handed out,
        // every reader sees Z until the item is replaced.
        let lost = it.win_sent();
        let stale = it.stale();
        let soon = f.recache.is_some_and(|r| it.exp() != NEVER && clock.ttl_secs(it.exp()) < r.max(0));
        let win = created || (!lost && (stale || soon));
        if win {
            it.set_win_sent(true);
        }
        if !f.no_bump {
            slot.hit();
        }
        count_get(c, f.ttl.is_some(), true, None);
        let send_value = f.value && f.compare_cas.is_none_or(|cas| cas != seen.cas);
        if send_value {
            out.extend_from_slice(b"VA ");
            push_u64(out, seen.size as u64);
        } else {
            meta_head(out, b"HD");
        }
        meta_flags_out(out, key, f, Some(seen), clock);
        if lost {
            out.extend_from_slice(b" Z");
        }
        if stale {
            out.extend_from_slice(b" X");
        }
        if win {
            out.extend_from_slice(b" W");
        }
        out.extend_from_slice(b"\r\n");
        if send_value {
            out.extend_from_slice(slot.item().map_or(&[][..], Item::value));
            out.extend_from_slice(b"\r\n");
        }
        true
    })
}

/// ms with its data block.
pub fn meta_set(ctx: &mut Ctx<'_>, key: &MetaKey<'_>, f: &MetaFlags<'_>, data: &[u8], out: &mut Vec<u8>) -> bool {
    let clock = ctx.clock;
    let c = &mut *ctx.counters;
    c.cmd_meta += 1;
    c.cmd_set += 1;
    let mode = match f.mode.unwrap_or(b'S') {
        b'S' | b's' => StoreMode::Set,
        b'E' | b'e' => StoreMode::Add,
        b'A' | b'a' => StoreMode::Append,
        b'P' | b'p' => StoreMode::Prepend,
        b'R' | b'r' => StoreMode::Replace,
        _ => {
            c.client_errors += 1;
            line(out, b"CLIENT_ERROR invalid mode for ms M token");
            return true;
        }
    };
    if data.len() > ctx.store.item_max() {
        c.store_too_large += 1;
        line(out, TOO_LARGE);
        return true;
    }
    let item_max = ctx.store.item_max();
    let exp = f.ttl.map_or(NEVER, |t| clock.deadline(t));
    let flags = f.client_flags.unwrap_or(0);
    ctx.store.with_slot(key.bytes(), clock.now_ms, |slot| {
        let present = slot.item().map(Seen::of);
        let mut stale = false;
        if let Some(want) = f.compare_cas {
            match present {
                None => {
                    c.cas_misses += 1;
                    meta_head(out, b"NF");
                    meta_flags_out(out, key, f, None, clock);
                    out.extend_from_slice(b"\r\n");
                    return true;
                }
                // With I, an older CAS still stores, but the item is marked stale.
                Some(s) if f.invalidate && want < s.cas => stale = true,
                Some(s) if want != s.cas => {
                    c.cas_badval += 1;
                    meta_head(out, b"EX");
                    meta_flags_out(out, key, f, None, clock);
                    out.extend_from_slice(b"\r\n");
                    return true;
                }
                Some(_) => c.cas_hits += 1,
            }
        }
        let not_stored = |out: &mut Vec<u8>| {
            meta_head(out, b"NS");
            meta_flags_out(out, key, f, None, clock);
            out.extend_from_slice(b"\r\n");
            true
        };
        let result = match (mode, present) {
            (StoreMode::Add, Some(_)) => {
                slot.hit();
                return not_stored(out);
            }
            (StoreMode::Replace, None) => return not_stored(out),
            (StoreMode::Append | StoreMode::Prepend, None) => match f.vivify {
                Some(ttl) => slot.store(data, flags, clock.deadline(ttl), f.new_cas),
                None => return not_stored(out),
            },
            (StoreMode::Append | StoreMode::Prepend, Some(s)) => {
                if s.size + data.len() > item_max {
                    c.store_too_large += 1;
                    line(out, TOO_LARGE);
                    return true;
                }
                let old = slot.item().map_or(&[][..], Item::value);
                let joined = if mode == StoreMode::Append { [old, data].concat() } else { [data, old].concat() };
                slot.store(&joined, s.flags, s.exp, f.new_cas)
            }
            _ => slot.store(data, flags, exp, f.new_cas),
        };
        match result {
            Ok(_) => {
                if let Some(it) = slot.item_mut() {
                    it.set_stale(stale);
                }
                if f.quiet {
                    return false;
                }
                meta_head(out, b"HD");
                meta_flags_out(out, key, f, slot.item().map(Seen::of), clock);
                out.extend_from_slice(b"\r\n");
                true
            }
            Err(e) => {
                line(out, store_error(c, e));
                true
            }
        }
    })
}

fn meta_delete(ctx: &mut Ctx<'_>, key: &MetaKey<'_>, f: &MetaFlags<'_>, out: &mut Vec<u8>) -> bool {
    let clock = ctx.clock;
    let c = &mut *ctx.counters;
    c.cmd_meta += 1;
    ctx.store.with_slot(key.bytes(), clock.now_ms, |slot| {
        let Some(s) = slot.item().map(Seen::of) else {
            c.delete_misses += 1;
            meta_head(out, b"NF");
            meta_flags_out(out, key, f, None, clock);
            out.extend_from_slice(b"\r\n");
            return true;
        };
        if f.compare_cas.is_some_and(|want| want != s.cas) {
            meta_head(out, b"EX");
            meta_flags_out(out, key, f, None, clock);
            out.extend_from_slice(b"\r\n");
            return true;
        }
        if f.invalidate {
            // Stale, not removed: the next reader wins the recache.
            slot.bump_cas(f.new_cas);
            if let Some(it) = slot.item_mut() {
                it.set_stale(true);
                it.set_win_sent(false);
                if let Some(t) = f.ttl {
                    it.set_exp(clock.deadline(t));
                }
            }
        } else if f.remove_value {
            if let Err(e) = slot.store(&[], s.flags, s.exp, f.new_cas) {
                line(out, store_error(c, e));
                return true;
            }
            c.delete_hits += 1;
        } else {
            slot.remove();
            c.delete_hits += 1;
        }
        if f.quiet {
            return false;
        }
        meta_head(out, b"HD");
        meta_flags_out(out, key, f, None, clock);
        out.extend_from_slice(b"\r\n");
        true
    })
}

fn meta_arith(ctx: &mut Ctx<'_>, key: &MetaKey<'_>, f: &MetaFlags<'_>, out: &mut Vec<u8>) -> bool {
    let clock = ctx.clock;
    let c = &mut *ctx.counters;
    c.cmd_meta += 1;
    let incr = match f.mode.unwrap_or(b'I') {
        b'I' | b'i' | b'+' => true,
        b'D' | b'd' | b'-' => false,
        _ => {
            c.client_errors += 1;
            line(out, b"CLIENT_ERROR invalid mode for ma M token");
            return true;
        }
    };
    let delta = f.delta.unwrap_or(1);
    ctx.store.with_slot(key.bytes(), clock.now_ms, |slot| {
        let code: &[u8] = match slot.item().map(Seen::of) {
            None => match f.vivify {
                Some(ttl) => {
                    let mut text = Vec::with_capacity(20);
                    push_u64(&mut text, f.initial.unwrap_or(0));
                    match slot.store(&text, 0, clock.deadline(ttl), f.new_cas) {
                        Ok(_) => b"HD",
                        Err(e) => {
                            line(out, store_error(c, e));
                            return true;
                        }
                    }
                }
                None => {
                    if incr {
                        c.incr_misses += 1
                    } else {
                        c.decr_misses += 1
                    }
                    b"NF"
                }
            },
            Some(s) if f.compare_cas.is_some_and(|want| want != s.cas) => b"EX",
            Some(_) => match arith_slot(slot, incr, delta, f.new_cas) {
                Arith::Done(..) => {
                    if incr {
                        c.incr_hits += 1
                    } else {
                        c.decr_hits += 1
                    }
                    if let (Some(t), Some(it)) = (f.ttl, slot.item_mut()) {
                        it.set_exp(clock.deadline(t));
                    }
                    b"HD"
                }
                Arith::NonNumeric => {
                    c.client_errors += 1;
                    line(out, NON_NUMERIC);
                    return true;
                }
                Arith::Failed(e) => {
                    line(out, store_error(c, e));
                    return true;
                }
                Arith::Missing => b"NF",
            },
        };
        let ok = code == b"HD";
        if ok && f.quiet {
            return false;
        }
        let seen = if ok { slot.item().map(Seen::of) } else { None };
        let value = if ok && f.value { slot.item().map(|it| it.value().to_vec()) } else { None };
        match &value {
            Some(v) => {
                out.extend_from_slice(b"VA ");
                push_u64(out, v.len() as u64);
            }
            None => meta_head(out, code),
        }
        meta_flags_out(out, key, f, seen, clock);
        out.extend_from_slice(b"\r\n");
        if let Some(v) = value {
            out.extend_from_slice(&v);
            out.extend_from_slice(b"\r\n");
        }
        true
    })
}

/// memcached's cap on a `stats cachedump` reply.
const CACHEDUMP_MAX: usize = 2 << 20;

/// `stats cachedump <class> <limit>`: `ITEM <key> [<bytes> b; <expiry> s]` per key
/// (expiry as a Unix time, 0 for none), then `END`; class 1 is the whole store, any
/// other is empty. At most `limit` keys (0: no limit) and 2 MB, as memcached.
pub fn cachedump(class: u32, limit: u32, store: &Store, clock: Clock, out: &mut Vec<u8>) {
    let start = out.len();
    if class == 1 {
        let mut shown = 0u32;
        store.visit(clock.now_ms, |it| {
            if (limit != 0 && shown >= limit) || out.len() - start + it.key().len() + 64 > CACHEDUMP_MAX {
                return false;
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
    }
    out.extend_from_slice(b"END\r\n");
}

/// `stats items` and `stats slabs` for a store without slab classes: one class, 1,
/// holding every item (so tools that read them see the totals).
pub fn store_class_stats(kind: StatsKind, store: &Store, w: &mut super::reply::StatsWriter<'_>) {
    let s = store.stats();
    match kind {
        StatsKind::Items => {
            w.num("items:1:number", s.curr_items)
                .num("items:1:evicted", s.evictions)
                .num("items:1:evicted_unfetched", s.evicted_unfetched)
                .num("items:1:expired_unfetched", s.expired_unfetched)
                .num("items:1:reclaimed", s.reclaimed)
                .num("items:1:crawler_reclaimed", s.reaped)
                .num("items:1:mem_requested", s.bytes);
        }
        StatsKind::Slabs => {
            w.num("1:chunk_size", store.item_max() as u64)
                .num("1:used_chunks", s.curr_items)
                .num("1:mem_requested", s.bytes)
                .num("active_slabs", u64::from(s.curr_items > 0))
                .num("total_malloced", s.bytes);
        }
        _ => {}
    }
}

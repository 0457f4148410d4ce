//! The meta commands (mg, ms, md, ma, me) carried out as memcached 1.6.18 does
//! (`process_m*_command` in `proto_text.c`): return flags written in the order they
//! were sent, `T` and `N` applied where they stand in that order, the recache
//! arbitration (`W` to one client, then `Z` to the others, `X` on a stale item), and
//! `q` hiding only the nominal reply of each command.
//!
//! Each function returns whether its reply is to be hidden (`q`).

use base64::Engine as _;

use super::exec::{Arith, Ctx, Outcome, arith_slot, count_gone, store_error, store_in};
use super::out::Out;
use super::parse::{MetaFlags, MetaKey, StoreMode};
use super::reply::{line, push_i64, push_u64};
use super::{Clock, Counters};
use crate::store::{Classes, Item, NEVER};

/// ` k<key>`, and ` b` when the key is binary (then the key in base64).
fn key_flag(out: &mut Vec<u8>, key: &[u8], binary: bool) {
    out.extend_from_slice(b" k");
    if binary {
        let at = out.len();
        out.resize(at + key.len().div_ceil(3) * 4, 0);
        let n = base64::engine::general_purpose::STANDARD.encode_slice(key, &mut out[at..]).unwrap_or(0);
        out.truncate(at + n);
        out.extend_from_slice(b" b");
    } else {
        out.extend_from_slice(key);
    }
}

/// The `O` and `k` flags, the only ones a reply without an item carries, and ms's `c`
/// (`cas`: the CAS value it stored).
fn return_flags(out: &mut Vec<u8>, f: &MetaFlags<'_>, key: &MetaKey<'_>, cas: Option<u64>) {
    for t in f.tokens() {
        match (t[0], cas) {
            (b'O', _) => {
                out.push(b' ');
                out.extend_from_slice(t);
            }
            (b'k', _) => key_flag(out, key.bytes(), key.binary()),
            (b'c', Some(cas)) => {
                out.extend_from_slice(b" c");
                push_u64(out, cas);
            }
            _ => {}
        }
    }
}

fn opaque_and_key(out: &mut Vec<u8>, f: &MetaFlags<'_>, key: &MetaKey<'_>) {
    return_flags(out, f, key, None);
}

/// A TTL flag's deadline: memcached's `realtime()` of a relative or absolute time
/// (0: never).
fn deadline(clock: Clock, ttl: i32) -> u64 {
    clock.deadline(i64::from(ttl))
}

fn ttl_flag(out: &mut Vec<u8>, clock: Clock, exp: u64) {
    out.extend_from_slice(b" t");
    push_i64(out, clock.ttl_secs(exp));
}

/// mg.
pub fn get(ctx: &mut Ctx<'_>, key: &MetaKey<'_>, f: &MetaFlags<'_>, out: &mut Out) -> bool {
    let clock = ctx.clock;
    let c = &mut *ctx.counters;
    c.cmd_meta += 1;
    ctx.store.with_slot(key.bytes(), clock.now_ms, |slot| {
        count_gone(c, slot.gone());
        let mut created = false;
        if slot.item().is_none() && f.vivify.is_some() {
            // A vivified item is empty; N sets its TTL below. Without memory it is a miss.
            created = slot.store(&[], 0, NEVER, None).is_ok();
        }
        let Some(it) = slot.item_mut() else {
            c.cmd_get += 1;
            c.get_misses += 1;
            out.extend_from_slice(b"EN");
            opaque_and_key(out, f, key);
            out.extend_from_slice(b"\r\n");
            return f.quiet;
        };
        // What h and l report is from before this access.
        let (fetched, last_access) = (it.fetched(), it.last_access());
        if f.value {
            out.extend_from_slice(b"VA ");
            push_u64(out, it.value().len() as u64);
        } else {
            out.extend_from_slice(b"HD");
        }
        let mut won = false;
        let mut ttl_set = false;
        for t in f.tokens() {
            match t[0] {
                b'T' => {
                    ttl_set = true;
                    it.set_exp(deadline(clock, f.ttl.unwrap_or(0)));
                }
                b'N' if created => {
                    it.set_exp(deadline(clock, f.vivify.unwrap_or(0)));
                    won = true;
                }
                b'R' => {
                    let r = f.recache.unwrap_or(0);
                    if !it.win_sent() && !created && it.exp() != NEVER && r > 0 && it.exp() < deadline(clock, r) {
                        won = true;
                    }
                }
                b's' => {
                    out.extend_from_slice(b" s");
                    push_u64(out, it.value().len() as u64);
                }
                b't' => ttl_flag(out, clock, it.exp()),
                b'c' => {
                    out.extend_from_slice(b" c");
                    push_u64(out, it.cas());
                }
                b'f' => {
                    out.extend_from_slice(b" f");
                    push_u64(out, u64::from(it.flags()));
                }
                b'l' => {
                    out.extend_from_slice(b" l");
                    push_u64(out, clock.now_ms.saturating_sub(last_access) / 1000);
                }
                b'h' => out.extend_from_slice(if fetched { b" h1" } else { b" h0" }),
                b'O' => {
                    out.push(b' ');
                    out.extend_from_slice(t);
                }
                b'k' => key_flag(out, it.key(), it.key_binary()),
                _ => {}
            }
        }
        // One client wins the right to refill a new, stale or nearly expired item; once
        // a win was handed out every reader sees Z until the item is replaced.
        if it.win_sent() {
            out.extend_from_slice(b" Z");
        }
        if it.stale() {
            out.extend_from_slice(b" X");
            if !it.win_sent() {
                won = true;
            }
        }
        if won {
            out.extend_from_slice(b" W");
            it.set_win_sent(true);
        }
        out.extend_from_slice(b"\r\n");
        if f.value {
            let (data, value) = it.shared_value();
            out.push_value(data, value);
            out.extend_from_slice(b"\r\n");
        }
        if !f.no_bump {
            slot.hit();
        }
        if ttl_set {
            c.cmd_touch += 1;
            c.touch_hits += 1;
        } else {
            c.cmd_get += 1;
            c.get_hits += 1;
        }
        false
    })
}

/// The storage mode of an ms: its `M` flag, and CAS mode when it compares a CAS value.
fn set_mode(f: &MetaFlags<'_>) -> StoreMode {
    let mode = match f.mode.unwrap_or(b'S') {
        b'E' => StoreMode::Add,
        b'A' => StoreMode::Append,
        b'P' => StoreMode::Prepend,
        b'R' => StoreMode::Replace,
        _ => StoreMode::Set,
    };
    match mode {
        StoreMode::Set | StoreMode::Replace if f.compare_cas.is_some() => StoreMode::Cas,
        m => m,
    }
}

/// ms with its data block.
pub fn set(ctx: &mut Ctx<'_>, key: &MetaKey<'_>, f: &MetaFlags<'_>, data: &[u8], out: &mut Vec<u8>) -> bool {
    let clock = ctx.clock;
    let c = &mut *ctx.counters;
    c.cmd_meta += 1;
    c.cmd_set += 1;
    let mode = set_mode(f);
    let exp = f.ttl.map_or(NEVER, |t| deadline(clock, t));
    let given = f.compare_cas.unwrap_or(0);
    let (r, cas) = ctx.store.with_slot(key.bytes(), clock.now_ms, |slot| {
        count_gone(c, slot.gone());
        let r = store_in(c, slot, mode, data, f.client_flags, exp, given, f.invalidate && mode == StoreMode::Cas);
        let mut cas = 0;
        if r == Outcome::Stored
            && let Some(it) = slot.item_mut()
        {
            it.set_key_binary(key.binary());
            cas = it.cas();
        }
        (r, cas)
    });
    let code: &[u8] = match r {
        Outcome::Stored => b"HD",
        Outcome::NotStored => b"NS",
        Outcome::Exists => b"EX",
        Outcome::NotFound => b"NF",
        Outcome::Failed(e) => {
            line(out, store_error(c, e));
            return false;
        }
    };
    out.extend_from_slice(code);
    // The CAS value stored; 0 when nothing was.
    return_flags(out, f, key, Some(cas));
    out.extend_from_slice(b"\r\n");
    r == Outcome::Stored && f.quiet
}

/// md.
pub fn delete(ctx: &mut Ctx<'_>, key: &MetaKey<'_>, f: &MetaFlags<'_>, out: &mut Vec<u8>) -> bool {
    let clock = ctx.clock;
    let c = &mut *ctx.counters;
    c.cmd_meta += 1;
    let (code, nominal): (&'static [u8], bool) = ctx.store.with_slot(key.bytes(), clock.now_ms, |slot| {
        count_gone(c, slot.gone());
        let Some(cas) = slot.item().map(Item::cas) else {
            c.delete_misses += 1;
            return (&b"NF"[..], false);
        };
        if f.compare_cas.is_some_and(|want| want != cas) {
            c.delete_misses += 1;
            return (b"EX", false);
        }
        if f.invalidate {
            // Stale, not removed: the next reader wins the recache.
            if let Some(it) = slot.item_mut() {
                if let Some(t) = f.ttl {
                    it.set_exp(deadline(clock, t));
                }
                it.set_stale(true);
                it.set_win_sent(false);
            }
            slot.bump_cas(None);
        } else {
            c.delete_hits += 1;
            slot.remove();
        }
        (b"HD", true)
    });
    out.extend_from_slice(code);
    opaque_and_key(out, f, key);
    out.extend_from_slice(b"\r\n");
    nominal && f.quiet
}

/// ma.
pub fn arith(ctx: &mut Ctx<'_>, key: &MetaKey<'_>, f: &MetaFlags<'_>, out: &mut Vec<u8>) -> bool {
    let clock = ctx.clock;
    let c = &mut *ctx.counters;
    c.cmd_meta += 1;
    let incr = !matches!(f.mode, Some(b'D' | b'-'));
    let delta = f.delta.unwrap_or(1);
    let count_miss = |c: &mut Counters| {
        if incr { c.incr_misses += 1 } else { c.decr_misses += 1 }
    };
    ctx.store.with_slot(key.bytes(), clock.now_ms, |slot| {
        count_gone(c, slot.gone());
        // The number as the reply shows it (without a decr's padding), and whether the
        // item was created here.
        let (number, created) = match arith_slot(slot, incr, delta, f.compare_cas.unwrap_or(0)) {
            Arith::Done(n) => {
                if incr {
                    c.incr_hits += 1
                } else {
                    c.decr_hits += 1
                }
                (n, false)
            }
            Arith::NonNumeric => {
                c.client_errors += 1;
                line(out, super::exec::NON_NUMERIC);
                return false;
            }
            Arith::Failed => {
                c.store_no_memory += 1;
                line(out, b"SERVER_ERROR out of memory");
                return false;
            }
            Arith::CasMismatch => {
                out.extend_from_slice(b"EX");
                opaque_and_key(out, f, key);
                out.extend_from_slice(b"\r\n");
                return false;
            }
            Arith::Missing if f.vivify.is_some() => {
                let mut text = Vec::with_capacity(20);
                push_u64(&mut text, f.initial);
                if let Err(e) = slot.store(&text, 0, NEVER, None) {
                    line(out, b"SERVER_ERROR Out of memory allocating new item");
                    let _ = store_error(c, e);
                    return false;
                }
                (f.initial, true)
            }
            Arith::Missing => {
                count_miss(c);
                out.extend_from_slice(b"NF");
                opaque_and_key(out, f, key);
                out.extend_from_slice(b"\r\n");
                return false;
            }
        };
        let Some(it) = slot.item_mut() else { return false };
        let mut text = Vec::with_capacity(20);
        push_u64(&mut text, number);
        if f.value {
            out.extend_from_slice(b"VA ");
            push_u64(out, text.len() as u64);
        } else {
            out.extend_from_slice(b"HD");
        }
        for t in f.tokens() {
            match t[0] {
                b'c' => {
                    out.extend_from_slice(b" c");
                    push_u64(out, it.cas());
                }
                b't' => ttl_flag(out, clock, it.exp()),
                b'T' => it.set_exp(deadline(clock, f.ttl.unwrap_or(0))),
                b'N' if created => it.set_exp(deadline(clock, f.vivify.unwrap_or(0))),
                b'O' => {
                    out.push(b' ');
                    out.extend_from_slice(t);
                }
                b'k' => key_flag(out, key.bytes(), key.binary()),
                _ => {}
            }
        }
        out.extend_from_slice(b"\r\n");
        if f.value {
            out.extend_from_slice(&text);
            out.extend_from_slice(b"\r\n");
        }
        // Only a change of an existing item is the nominal reply q hides.
        !created && f.quiet
    })
}

/// me: `ME <key> exp=<s> la=<s> cas=<cas> fetch=<yes|no> cls=<class> size=<bytes>` or
/// `EN`. As memcached 1.6.18 prints them: exp is the expiry time less now (negative
/// while the item lives, -1 for never), size the item's size in memcached's layout.
pub fn debug(ctx: &mut Ctx<'_>, key: &MetaKey<'_>, out: &mut Vec<u8>) {
    let clock = ctx.clock;
    let cas_kept = ctx.store.cas_enabled();
    ctx.counters.cmd_meta += 1;
    ctx.store.with_slot(key.bytes(), clock.now_ms, |slot| match slot.item() {
        None => line(out, b"EN"),
        Some(it) => {
            out.extend_from_slice(b"ME ");
            let at = out.len();
            key_flag(out, it.key(), it.key_binary());
            // key_flag writes " k<key>[ b]": keep only the key.
            let written: Vec<u8> = out[at + 2..].strip_suffix(b" b").unwrap_or(&out[at + 2..]).to_vec();
            out.truncate(at);
            out.extend_from_slice(&written);
            out.extend_from_slice(b" exp=");
            push_i64(out, if it.exp() == NEVER { -1 } else { -clock.ttl_secs(it.exp()) });
            out.extend_from_slice(b" la=");
            push_u64(out, clock.now_ms.saturating_sub(it.last_access()) / 1000);
            out.extend_from_slice(b" cas=");
            push_u64(out, it.cas());
            out.extend_from_slice(if it.fetched() { b" fetch=yes" } else { b" fetch=no" });
            out.extend_from_slice(b" cls=");
            push_u64(out, u64::from(it.class()));
            out.extend_from_slice(b" size=");
            push_u64(out, Classes::item_size(it.key().len(), it.value().len(), it.flags(), cas_kept));
            out.extend_from_slice(b"\r\n");
        }
    });
}

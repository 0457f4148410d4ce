//! One item changed as memcached changes it, shared by the text, meta and binary
//! commands: a store (`do_store_item`: the modes, CAS values, stale values) and an
//! incr/decr (`do_add_delta`).

use crate::proto::parse::StoreMode;
use crate::proto::reply::push_u64;
use crate::proto::stats::Counters;
use crate::store::{Item, Slot, StoreError};

/// How a store's CAS value compares with the present item's (memcached's
/// `do_store_item`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CasCheck {
    /// No CAS value given (0).
    None,
    /// Equal.
    Match,
    /// Lower, and the command may store a stale value (meta `I`).
    Stale,
    /// Different.
    BadVal,
}

fn cas_check(given: u64, present: u64, may_stale: bool) -> CasCheck {
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

/// The number an incr/decr works on, read as memcached's `safe_strtoull` reads the
/// item's data: the value ends at a NUL byte, and may have white space around the
/// digits (a decr pads a shorter number with spaces).
fn numeric(v: &[u8]) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    let v = &v[..memchr::memchr(0, v).unwrap_or(v.len())];
    crate::proto::parse::Num::parse(v)?.u64()
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

//! The stats listings that walk the store's items: `stats cachedump`, and `stats
//! items`, `stats slabs` and `stats sizes` by size class.

use crate::proto::Clock;
use crate::proto::parse::StatsKind;
use crate::proto::reply::{StatsWriter, push_u64};
use crate::store::{NEVER, Store};

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
pub fn store_class_stats(kind: StatsKind, store: &Store, clock: Clock, w: &mut StatsWriter<'_>) {
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

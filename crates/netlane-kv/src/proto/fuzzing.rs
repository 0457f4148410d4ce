//! The fuzz target's body, here so the stable test suite runs it over the seed corpus
//! too (`fuzz/fuzz_targets/kv_conn.rs` is the cargo-fuzz wrapper).

use netlane_counters::CounterSet;

use super::parse::StatsKind;
use super::reply::StatsWriter;
use super::{Clock, Conn, Counters, Ctx, Host, Limits, Settings, Turn};
use crate::store::{Store, StoreConfig};

/// A host with fixed answers (tests and fuzzing).
#[derive(Debug, Default)]
pub struct FixedHost;

impl Host for FixedHost {
    fn version(&self) -> &str {
        "1.6.18-netlane-test"
    }

    fn stats(&self, kind: StatsKind, store: &Store, own: &Counters, clock: Clock, out: &mut Vec<u8>) {
        let mut w = StatsWriter::new(out);
        match kind {
            StatsKind::General => {
                own.each(&mut |name, _, v| {
                    w.num(name, v);
                });
                w.num("curr_items", store.stats().curr_items);
            }
            StatsKind::Items | StatsKind::Slabs | StatsKind::Sizes => {
                super::exec::store_class_stats(kind, store, clock, &mut w)
            }
            StatsKind::Reset => {
                out.extend_from_slice(b"RESET\r\n");
                return;
            }
            StatsKind::CacheDump { class, limit } => {
                super::exec::cachedump(class, limit, store, clock, out);
                return;
            }
            StatsKind::Settings | StatsKind::Conns | StatsKind::Detail { .. } => {}
        }
        w.end();
    }

    fn verbosity(&self, _level: u32) {}

    fn shutdown(&self, _graceful: bool) {}

    fn advance_clock(&self, _secs: i64) {}

    /// A machine with 1 GiB to spare.
    fn may_grow(&self, bytes: u64) -> bool {
        bytes <= 1 << 30
    }
}

/// What the tests and the fuzz target allow: everything memcached-debug does.
pub const TEST_SETTINGS: Settings = Settings {
    allowed: super::parse::Allowed { shutdown: true, debug_time: true },
    flush: true,
    dump: true,
    protocol: super::Protocol::Auto,
};

/// Input layout: byte 0 picks small limits (bit 0), a tiny item limit (bit 1) and the
/// binary protocol only (bit 2, memcached's `-B binary`; else either, by the first byte); then
/// chunks, each behind a one-byte length (`len % 64`, 0 meaning "drain the output"),
/// fed to one connection whose commands run against a small store. The clock advances
/// 700 ms per chunk. Invariants checked: the connection never buffers more than its
/// bounds allow and never panics.
pub fn conn(data: &[u8]) {
    let Some((&mode, mut rest)) = data.split_first() else { return };
    let limits = if mode & 1 != 0 {
        Limits { max_line: 40, output_pause: 200, commands_per_turn: 3, read_chunk: 16 }
    } else {
        Limits::default()
    };
    let item_max = if mode & 2 != 0 { 1024 } else { 4096 };
    let Ok(store) = Store::new(StoreConfig::new(64 << 10, item_max, 2)) else { return };
    let host = FixedHost;
    let settings = Settings {
        protocol: if mode & 4 != 0 { super::Protocol::Binary } else { super::Protocol::Auto },
        ..TEST_SETTINGS
    };
    let mut counters = Counters::default();
    let mut conn = Conn::new(limits, item_max);
    let bound = limits.max_line + item_max + 4 + limits.read_chunk;
    let mut now = 0;
    while let Some((&len, tail)) = rest.split_first() {
        let n = usize::from(len % 64).min(tail.len());
        let (chunk, after) = tail.split_at(n);
        rest = after;
        now += 700;
        let mut ctx = Ctx {
            store: &store,
            clock: Clock { now_ms: now, epoch_ms: 1_700_000_000_000 },
            host: &host,
            counters: &mut counters,
            settings: &settings,
        };
        if n == 0 {
            let all = conn.poll_output_vec().len();
            conn.handle_written(all);
        } else {
            conn.handle_input(chunk);
        }
        for _ in 0..4 {
            match conn.process(&mut ctx) {
                Turn::Yield => continue,
                Turn::Close => return,
                Turn::NeedRead | Turn::Blocked => break,
            }
        }
        assert!(
            conn.memory() <= 2 * bound + 4 * limits.output_pause + 2 * item_max + (64 << 10),
            "buffers grew unbounded"
        );
    }
}

//! The protocol core's tests: the conformance table (`conformance.rs`) and the bounds.

use super::conformance::conformance_table;
use super::fuzzing::{FixedHost, TEST_SETTINGS};
use super::*;
use crate::store::StoreConfig;

/// A context on `store` at time 0.
fn ctx_at_zero<'a>(store: &'a Store, host: &'a FixedHost, counters: &'a mut Counters) -> Ctx<'a> {
    Ctx { store, clock: Clock { now_ms: 0, epoch_ms: 0 }, host, counters, settings: &TEST_SETTINGS }
}

struct Harness {
    store: Store,
    host: FixedHost,
    counters: Counters,
    conn: Conn,
    now: u64,
}

impl Harness {
    fn new(limits: Limits) -> Self {
        let store = Store::new(StoreConfig::new(1 << 20, 1024, 4)).unwrap();
        Harness { store, host: FixedHost, counters: Counters::default(), conn: Conn::new(limits, 1024), now: 0 }
    }

    /// Feeds `bytes` in chunks of `chunk`, runs, and returns all output.
    fn exchange(&mut self, bytes: &[u8], chunk: usize) -> (Vec<u8>, bool) {
        let mut out = Vec::new();
        let mut closed = false;
        for part in bytes.chunks(chunk.max(1)) {
            let mut fed = 0;
            while fed < part.len() && !closed {
                fed += self.conn.handle_input(&part[fed..]);
                closed |= self.run(&mut out);
            }
        }
        if bytes.is_empty() {
            closed |= self.run(&mut out);
        }
        (out, closed)
    }

    fn run(&mut self, out: &mut Vec<u8>) -> bool {
        loop {
            let mut ctx = Ctx {
                store: &self.store,
                clock: Clock { now_ms: self.now, epoch_ms: 1_700_000_000_000 },
                host: &self.host,
                counters: &mut self.counters,
                settings: &TEST_SETTINGS,
            };
            let turn = self.conn.process(&mut ctx);
            out.extend_from_slice(&self.conn.poll_output_vec());
            let n = self.conn.poll_output_vec().len();
            self.conn.handle_written(n);
            match turn {
                Turn::NeedRead => return false,
                Turn::Close => return true,
                Turn::Blocked | Turn::Yield => {}
            }
        }
    }
}

fn show(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn conformance_table_in_one_piece_and_byte_by_byte() {
    for chunk in [usize::MAX, 1, 7] {
        for (name, steps) in conformance_table() {
            let mut h = Harness::new(Limits::default());
            for (i, st) in steps.iter().enumerate() {
                h.now += st.advance_ms;
                let (out, closed) = h.exchange(&st.send, chunk);
                let what = format!("{name}, step {i} ({}), chunks of {chunk}", show(&st.send));
                assert_eq!(show(&out), show(&st.expect), "{what}");
                assert_eq!(closed, st.closes, "{what}: closed");
                if closed {
                    // The next step comes on a new connection to the same store.
                    h.conn = Conn::new(Limits::default(), 1024);
                }
            }
        }
    }
}

#[test]
fn a_line_over_the_limit_is_refused_and_closes() {
    let mut h = Harness::new(Limits::default());
    let (out, closed) = h.exchange(&[b'x'; 3000], 512);
    assert_eq!(show(&out), "CLIENT_ERROR line too long\r\n");
    assert!(closed);
    // A long get line is allowed up to the multi-get limit.
    let mut h = Harness::new(Limits::default());
    let mut line = b"get".to_vec();
    for i in 0..2000 {
        line.extend_from_slice(format!(" k{i}").as_bytes());
    }
    line.extend_from_slice(b"\r\n");
    let (out, closed) = h.exchange(&line, 4096);
    assert_eq!(show(&out), "END\r\n");
    assert!(!closed);
    assert_eq!(h.counters.cmd_get, 2000);
}

#[test]
fn quit_closes_after_earlier_replies() {
    let mut h = Harness::new(Limits::default());
    let (out, closed) = h.exchange(b"mn\r\nquit\r\nmn\r\n", usize::MAX);
    assert_eq!(show(&out), "MN\r\n");
    assert!(closed);
}

#[test]
fn a_huge_multiget_pauses_instead_of_buffering() {
    let limits = Limits { output_pause: 4096, ..Limits::default() };
    let mut h = Harness::new(limits);
    h.exchange(b"set v 0 0 1000\r\n", usize::MAX);
    let (out, _) = h.exchange(&[[b'a'; 1000].as_slice(), b"\r\n"].concat(), usize::MAX);
    assert_eq!(show(&out), "STORED\r\n");
    let mut line = b"get".to_vec();
    for _ in 0..100 {
        line.extend_from_slice(b" v");
    }
    line.extend_from_slice(b"\r\n");
    h.conn.handle_input(&line);
    let mut total = Vec::new();
    let mut blocked = 0;
    loop {
        let mut ctx = ctx_at_zero(&h.store, &h.host, &mut h.counters);
        let turn = h.conn.process(&mut ctx);
        assert!(
            h.conn.poll_output_vec().len() <= 4096 + 1100,
            "output {} over the pause limit",
            h.conn.poll_output_vec().len()
        );
        assert!(h.conn.read_space().is_empty() || turn == Turn::NeedRead);
        total.extend_from_slice(&h.conn.poll_output_vec());
        let n = h.conn.poll_output_vec().len();
        h.conn.handle_written(n);
        match turn {
            Turn::Blocked => blocked += 1,
            Turn::NeedRead => break,
            t => panic!("{t:?}"),
        }
    }
    assert!(blocked >= 20, "paused {blocked} times");
    assert_eq!(total.len(), 100 * (b"VALUE v 0 1000\r\n".len() + 1002) + 5);
    assert!(total.ends_with(b"END\r\n"));
}

#[test]
fn one_connection_cannot_run_more_than_its_turn() {
    let limits = Limits { commands_per_turn: 4, ..Limits::default() };
    let mut h = Harness::new(limits);
    h.conn.handle_input(&b"mn\r\n".repeat(10));
    let mut ctx = ctx_at_zero(&h.store, &h.host, &mut h.counters);
    assert_eq!(h.conn.process(&mut ctx), Turn::Yield);
    assert_eq!(h.conn.poll_output_vec(), b"MN\r\n".repeat(4));
    assert_eq!(h.conn.process(&mut ctx), Turn::Yield);
    assert_eq!(h.conn.process(&mut ctx), Turn::NeedRead);
    assert_eq!(h.conn.poll_output_vec(), b"MN\r\n".repeat(10));
}

#[test]
fn a_refused_value_is_skipped_as_it_arrives_not_buffered() {
    let mut h = Harness::new(Limits::default());
    let (out, _) = h.exchange(b"set k 0 0 100000000\r\n", usize::MAX);
    assert_eq!(show(&out), "SERVER_ERROR object too large for cache\r\n");
    for _ in 0..1000 {
        let (out, _) = h.exchange(&[b'z'; 100_000], 16 << 10);
        assert!(out.is_empty());
        assert!(h.conn.memory() < 64 << 10, "buffers grew to {}", h.conn.memory());
    }
    let (out, _) = h.exchange(b"\r\nmn\r\n", usize::MAX);
    assert_eq!(show(&out), "MN\r\n");
}

#[test]
fn cas_race_between_two_connections() {
    let mut a = Harness::new(Limits::default());
    a.exchange(b"set k 0 0 1\r\n0\r\n", usize::MAX);
    let mut b = Conn::new(Limits::default(), 1024);
    // Both read CAS 1; a wins, b loses.
    let (out, _) = a.exchange(b"gets k\r\n", usize::MAX);
    assert_eq!(show(&out), "VALUE k 0 1 1\r\n0\r\nEND\r\n");
    let (out, _) = a.exchange(b"cas k 0 0 1 1\r\na\r\n", usize::MAX);
    assert_eq!(show(&out), "STORED\r\n");
    b.handle_input(b"cas k 0 0 1 1\r\nb\r\n");
    let mut ctx = ctx_at_zero(&a.store, &a.host, &mut a.counters);
    b.process(&mut ctx);
    assert_eq!(show(&b.poll_output_vec()), "EXISTS\r\n");
    assert_eq!((a.counters.cas_hits, a.counters.cas_badval), (1, 1));
}

#[test]
fn eviction_under_the_memory_limit_through_the_protocol() {
    let mut h = Harness::new(Limits::default());
    // 1 MiB over 4 shards; 4000 values of 900 bytes (~4 MB) must evict.
    for i in 0..4000 {
        let mut req = format!("set k{i} 0 0 900\r\n").into_bytes();
        req.extend_from_slice(&[b'v'; 900]);
        req.extend_from_slice(b"\r\n");
        let (out, _) = h.exchange(&req, usize::MAX);
        assert_eq!(show(&out), "STORED\r\n");
    }
    let st = h.store.stats();
    assert!(st.bytes <= 1 << 20, "{st:?}");
    assert!(st.evictions > 2500, "{st:?}");
    let (out, _) = h.exchange(b"get k3999\r\n", usize::MAX);
    assert!(out.starts_with(b"VALUE k3999 0 900\r\n"));
    let (out, _) = h.exchange(b"get k0\r\n", usize::MAX);
    assert_eq!(show(&out), "END\r\n");
}

#[test]
fn counters_follow_memcached_names() {
    let mut h = Harness::new(Limits::default());
    h.exchange(b"set a 0 0 1\r\n1\r\nget a b\r\nget a\r\ndelete b\r\n", usize::MAX);
    let c = &h.counters;
    assert_eq!((c.cmd_set, c.cmd_get, c.get_hits, c.get_misses, c.delete_misses), (1, 3, 2, 1, 1));
    let (out, _) = h.exchange(b"stats\r\n", usize::MAX);
    let text = show(&out);
    assert!(text.contains("STAT get_hits 2\r\n") && text.ends_with("END\r\n"), "{text}");
}

#[test]
fn clock_deadlines_follow_memcached() {
    let c = Clock { now_ms: 5_000, epoch_ms: 1_700_000_000_000 };
    assert_eq!(c.deadline(0), NEVER);
    assert_eq!(c.deadline(-5), 0);
    assert_eq!(c.deadline(10), 15_000);
    // Absolute Unix times beyond 30 days: 1_700_000_100 is 100 s after the epoch.
    assert_eq!(c.deadline(1_700_000_100), 100_000);
    assert_eq!(c.deadline(REALTIME_MAXDELTA + 1), 0, "an absolute time before the server started");
    assert_eq!(c.ttl_secs(NEVER), -1);
    assert_eq!(c.ttl_secs(6_001), 2);
}

#[test]
fn binary_bodies_past_the_key_are_skipped_and_refused_values_leave_no_stale_copy() {
    use super::binary::{HEADER, op, request};
    let mut h = Harness::new(Limits::default());
    let set = |key: &[u8], v: &[u8]| request(op::SET, &[0; 8], key, v, 1, 0);
    let (out, _) = h.exchange(&set(b"k", b"v1"), usize::MAX);
    assert_eq!(out.len(), HEADER, "a stored reply");
    // A touch whose body runs past its key: the extra bytes are skipped (memcached reads
    // them as the next packet), and the no-op after it is answered.
    let mut touch = request(op::TOUCH, &100u32.to_be_bytes(), b"k", b"junk", 2, 0);
    touch.extend_from_slice(&request(op::NOOP, &[], b"", b"", 3, 0));
    let (out, closed) = h.exchange(&touch, 5);
    assert!(!closed);
    assert_eq!(out.len(), 2 * HEADER + 4, "the touch's flags and the no-op");
    assert_eq!(&out[HEADER + 4 + 12..HEADER + 4 + 16], &3u32.to_be_bytes());
    // A value over the item limit: E2BIG, its bytes skipped, the key's old value gone.
    let (out, _) = h.exchange(&set(b"k", &[b'x'; 2000]), 100);
    assert_eq!(out[7], 0x03, "E2BIG");
    let (out, _) = h.exchange(&request(op::GET, &[], b"k", b"", 4, 0), usize::MAX);
    assert_eq!(out[7], 0x01, "ENOENT: no stale read");
}

#[test]
fn a_connection_without_memory_refuses_values_as_memcached_does() {
    use std::sync::Arc;
    let budget = super::ConnMemory::new(128 << 10);
    let mut h = Harness::new(Limits::default());
    h.conn = Conn::new(Limits::default(), 1024).with_budget(Arc::clone(&budget));
    // A second connection holds the budget with an unfinished value.
    let store = Store::new(StoreConfig::new(4 << 20, 200 << 10, 1)).unwrap();
    h.store = store;
    let mut hog = Conn::new(Limits::default(), 200 << 10).with_budget(Arc::clone(&budget));
    hog.handle_input(b"set big 0 0 100000\r\n");
    let mut ctx = ctx_at_zero(&h.store, &h.host, &mut h.counters);
    assert_eq!(hog.process(&mut ctx), Turn::NeedRead);
    assert!(budget.used() > 64 << 10, "the first value took most of the budget: {}", budget.used());
    h.conn = Conn::new(Limits::default(), 200 << 10).with_budget(Arc::clone(&budget));
    h.exchange(b"set k 0 0 1\r\na\r\n", usize::MAX);
    let (out, _) = h.exchange(b"set k 0 0 100000\r\n", usize::MAX);
    assert_eq!(show(&out), "SERVER_ERROR out of memory storing object\r\n");
    // Its data is skipped as it arrives, and the key's old value is gone.
    let (out, _) = h.exchange(&[[b'z'; 100_000].as_slice(), b"\r\nget k\r\n"].concat(), 4096);
    assert_eq!(show(&out), "END\r\n");
    drop(hog);
    assert_eq!(budget.used(), 0, "a closed connection gives its memory back");
    assert_eq!(budget.refused_values(), 1);
}

#[test]
fn every_difference_from_memcached_is_in_the_docs() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/memcached.md");
    let doc = std::fs::read_to_string(path).unwrap();
    for (name, steps) in conformance_table() {
        for (i, st) in steps.iter().enumerate() {
            if let Some(d) = &st.memcached {
                assert!(doc.contains(d.why), "{name}, step {i}: docs/memcached.md does not say why: {}", d.why);
            }
        }
    }
}

#[test]
fn a_streamed_get_answers_the_keys_before_a_key_too_long() {
    // A get line longer than the line limit, fed in pieces: its keys are answered as
    // they arrive; a key over 250 bytes ends it with the error, and the connection goes on.
    let mut h = Harness::new(Limits::default());
    h.exchange(b"set a 0 0 1\r\n1\r\n", usize::MAX);
    let line = [b"get".as_slice(), &b" a".repeat(1500), b" ", &[b'k'; 300], b" a\r\nmn\r\n"].concat();
    let (out, closed) = h.exchange(&line, 512);
    assert!(!closed);
    let want =
        [b"VALUE a 0 1\r\n1\r\n".repeat(1500).as_slice(), b"CLIENT_ERROR bad command line format\r\nMN\r\n"].concat();
    assert_eq!(show(&out), show(&want));
}

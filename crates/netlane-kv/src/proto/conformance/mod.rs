//! The protocol conformance table: named sequences of (request bytes, exact reply)
//! steps. The unit tests run it against the sans-IO core (whole and cut into every
//! chunk size), `tests/server.rs` over TCP against the server and against memcached
//! 1.6.18 itself: one table, three runs.
//!
//! Where netlane answers differently on purpose, the step carries memcached's reply and
//! the reason ([`differs`]); `docs/memcached.md` lists every such step (a test checks
//! that it does).
//!
//! This file holds the steps and the reasons; the text and meta rows are in `text.rs`,
//! the binary sequences in `binary.rs`.

mod binary;
mod text;

/// One step: bytes sent, the exact reply expected, and milliseconds to advance the
/// clock before sending.
#[derive(Debug)]
pub struct Step {
    /// Bytes sent.
    pub send: Vec<u8>,
    /// The exact reply.
    pub expect: Vec<u8>,
    /// Milliseconds that pass before the step (the store's clock; real time over TCP).
    pub advance_ms: u64,
    /// The connection closes after the reply.
    pub closes: bool,
    /// Where memcached answers differently on purpose: its reply, and why netlane's
    /// differs.
    pub memcached: Option<Divergence>,
}

/// memcached's reply to a step that netlane answers differently, and the reason.
#[derive(Debug)]
pub struct Divergence {
    /// memcached 1.6.18's exact reply; `None` where it depends on its background
    /// threads' timing (then only netlane's is checked).
    pub reply: Option<Vec<u8>>,
    /// memcached closes the connection after it.
    pub closes: bool,
    /// Why netlane differs (`docs/memcached.md` has the same words).
    pub why: &'static str,
}

/// A step at the same time as the one before.
pub fn s(send: impl AsRef<[u8]>, expect: impl AsRef<[u8]>) -> Step {
    Step {
        send: send.as_ref().to_vec(),
        expect: expect.as_ref().to_vec(),
        advance_ms: 0,
        closes: false,
        memcached: None,
    }
}

/// A step `advance_ms` after the one before.
pub fn later(advance_ms: u64, send: impl AsRef<[u8]>, expect: impl AsRef<[u8]>) -> Step {
    Step { advance_ms, ..s(send, expect) }
}

/// A step after which the connection closes (memcached's too).
pub fn closing(send: impl AsRef<[u8]>, expect: impl AsRef<[u8]>) -> Step {
    Step { closes: true, ..s(send, expect) }
}

/// A step netlane answers `ours` and memcached `theirs`, for the reason `why`.
pub fn differs(send: impl AsRef<[u8]>, ours: impl AsRef<[u8]>, theirs: impl AsRef<[u8]>, why: &'static str) -> Step {
    Step { memcached: Some(Divergence { reply: Some(theirs.as_ref().to_vec()), closes: false, why }), ..s(send, ours) }
}

/// A step netlane answers `ours` and memcached in a way that depends on timing.
pub fn varies(send: impl AsRef<[u8]>, ours: impl AsRef<[u8]>, why: &'static str) -> Step {
    Step { memcached: Some(Divergence { reply: None, closes: false, why }), ..s(send, ours) }
}

/// A malformed storage line whose length is readable.
pub const SKIP_BLOCK: &str = "a storage command refused for its line (a key over 250 bytes, bad flags) skips its data \
     block when the length is readable, so one request gets one reply; memcached reads the data block as commands";
/// The version string.
pub const VERSION: &str = "the version string names netlane (1.6.18-netlane-<version>)";
/// cachedump.
pub const CACHEDUMP: &str = "stats cachedump lists every live item of the class; memcached walks only the class's cold \
     LRU segment, where an item is only once its LRU maintainer thread moved it there";
/// Numbers wider than their field.
pub const WRAP: &str = "a number wider than its 32-bit field is refused; memcached reads it as 64 bits and keeps \
     the low 32 (flags 4294967296 are stored as 0)";
/// Long lines.
pub const LINE: &str = "a command line (not a get) longer than --max-line (2048 bytes) is refused and the \
     connection closes, wherever the read boundaries fall; memcached answers it if it arrived in one read and \
     closes without a reply otherwise";
/// Why `cache_memlimit` past what the machine has differs.
pub const MEMLIMIT_GROWTH: &str = "cache_memlimit is refused when the machine does not have the memory it adds; memcached \
     raises its limit to any size and grows until the OOM killer ends it";
/// flush_all at a past Unix time.
pub const FLUSH_PAST: &str = "flush_all at a Unix time at or before the server started flushes now; memcached answers \
     OK and flushes nothing";

/// The conformance table: named sequences of steps, each run on a fresh store with a
/// 1 KiB item limit, a version string of `1.6.18-netlane-test`
/// ([`super::fuzzing::FixedHost`]'s). CAS values are deterministic on a fresh store (1, 2, ...).
pub fn conformance_table() -> Vec<(&'static str, Vec<Step>)> {
    [
        text::storage_rows(),
        text::expiry_and_server_rows(),
        text::limit_rows(),
        text::meta_rows(),
        text::hostile_input_rows(),
        text::argument_rows(),
        text::pipelining_rows(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Binary protocol sequences: each step is one or more request packets. The tests run
/// them against netlane's server and against memcached 1.6.18 and compare the replies
/// byte for byte (but the version string), over TCP and over UDP; each step is followed
/// by a no-op (opaque [`SYNC`]) whose reply marks its end.
pub fn binary_table() -> Vec<(&'static str, Vec<Vec<u8>>)> {
    [binary::item_rows(), binary::server_rows(), binary::refused_rows(), binary::quit_rows()]
        .into_iter()
        .flatten()
        .collect()
}

/// The opaque of the no-op that ends each binary step.
pub const SYNC: u32 = 0x5359_4e43;

//! The protocol conformance table: named sequences of (request bytes, exact reply)
//! steps. The unit tests run it against the sans-IO core (whole and cut into every
//! chunk size), `tests/server.rs` over TCP against the server: one table, two
//! transports.

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
}

/// A step at the same time as the one before.
pub fn s(send: impl AsRef<[u8]>, expect: impl AsRef<[u8]>) -> Step {
    Step { send: send.as_ref().to_vec(), expect: expect.as_ref().to_vec(), advance_ms: 0 }
}

/// A step `advance_ms` after the one before.
pub fn later(advance_ms: u64, send: impl AsRef<[u8]>, expect: impl AsRef<[u8]>) -> Step {
    Step { advance_ms, ..s(send, expect) }
}

/// The conformance table: named sequences of steps, each run on a fresh store with a
/// 1 KiB item limit, a version string of `1.6.18-netlane-test`
/// ([`super::fuzzing::FixedHost`]'s). CAS values are deterministic on a fresh store (1, 2, ...).
pub fn conformance_table() -> Vec<(&'static str, Vec<Step>)> {
    vec![
        ("get of a missing key", vec![s(b"get nope\r\n", b"END\r\n")]),
        (
            "set and get, gets returns the CAS value",
            vec![
                s(b"set k 5 0 3\r\nabc\r\n", b"STORED\r\n"),
                s(b"get k\r\n", b"VALUE k 5 3\r\nabc\r\nEND\r\n"),
                s(b"gets k\r\n", b"VALUE k 5 3 1\r\nabc\r\nEND\r\n"),
                s(b"set k 0 0 0\r\n\r\n", b"STORED\r\n"),
                s(b"get k\r\n", b"VALUE k 0 0\r\n\r\nEND\r\n"),
            ],
        ),
        (
            "multi-get returns the present keys in order",
            vec![
                s(b"set a 0 0 1\r\n1\r\nset c 0 0 1\r\n3\r\n", b"STORED\r\nSTORED\r\n"),
                s(b"get a b c a\r\n", b"VALUE a 0 1\r\n1\r\nVALUE c 0 1\r\n3\r\nVALUE a 0 1\r\n1\r\nEND\r\n"),
            ],
        ),
        (
            "add, replace, append, prepend",
            vec![
                s(b"add k 0 0 1\r\na\r\n", b"STORED\r\n"),
                s(b"add k 0 0 1\r\nb\r\n", b"NOT_STORED\r\n"),
                s(b"replace x 0 0 1\r\nb\r\n", b"NOT_STORED\r\n"),
                s(b"replace k 7 0 1\r\nb\r\n", b"STORED\r\n"),
                s(b"append k 9 0 2\r\ncd\r\n", b"STORED\r\n"),
                s(b"prepend k 9 0 2\r\nzz\r\n", b"STORED\r\n"),
                s(b"append x 0 0 1\r\nq\r\n", b"NOT_STORED\r\n"),
                s(b"get k\r\n", b"VALUE k 7 5\r\nzzbcd\r\nEND\r\n"),
            ],
        ),
        (
            "cas: stored, exists, not found",
            vec![
                s(b"set k 0 0 1\r\na\r\n", b"STORED\r\n"),
                s(b"cas k 0 0 1 99\r\nb\r\n", b"EXISTS\r\n"),
                s(b"cas k 0 0 1 1\r\nb\r\n", b"STORED\r\n"),
                s(b"cas k 0 0 1 1\r\nc\r\n", b"EXISTS\r\n"),
                s(b"cas nope 0 0 1 1\r\nc\r\n", b"NOT_FOUND\r\n"),
                s(b"gets k\r\n", b"VALUE k 0 1 2\r\nb\r\nEND\r\n"),
            ],
        ),
        (
            "delete",
            vec![
                s(b"set k 0 0 1\r\na\r\n", b"STORED\r\n"),
                s(b"delete k\r\n", b"DELETED\r\n"),
                s(b"delete k\r\n", b"NOT_FOUND\r\n"),
                s(b"delete k 0\r\n", b"NOT_FOUND\r\n"),
                s(b"delete k 5\r\n", b"CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n"),
            ],
        ),
        (
            "incr and decr: wrap, floor, errors",
            vec![
                s(b"incr n 1\r\n", b"NOT_FOUND\r\n"),
                s(b"set n 3 0 2\r\n10\r\n", b"STORED\r\n"),
                s(b"incr n 5\r\n", b"15\r\n"),
                s(b"decr n 100\r\n", b"0\r\n"),
                s(b"set n 0 0 20\r\n18446744073709551615\r\n", b"STORED\r\n"),
                s(b"incr n 2\r\n", b"1\r\n"),
                s(b"incr n x\r\n", b"CLIENT_ERROR invalid numeric delta argument\r\n"),
                s(b"incr n -1\r\n", b"CLIENT_ERROR invalid numeric delta argument\r\n"),
                s(b"set t 0 0 2\r\nab\r\n", b"STORED\r\n"),
                s(b"incr t 1\r\n", b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n"),
                s(b"set f 4 0 2\r\n99\r\n", b"STORED\r\n"),
                s(b"incr f 1\r\n", b"100\r\n"),
                s(b"get f\r\n", b"VALUE f 4 3\r\n100\r\nEND\r\n"),
            ],
        ),
        (
            "expiry: relative, negative, touch, gat",
            vec![
                // memcached counts time in whole seconds from its start, so an item set
                // for 3 s lives between 2 and 3 s: read at 1.5 s and at 3.1 s.
                s(b"set e 0 3 1\r\na\r\n", b"STORED\r\n"),
                later(1500, b"get e\r\n", b"VALUE e 0 1\r\na\r\nEND\r\n"),
                later(1600, b"get e\r\n", b"END\r\n"),
                s(b"set e 0 -1 1\r\na\r\n", b"STORED\r\n"),
                s(b"get e\r\n", b"END\r\n"),
                s(b"set t 0 1 1\r\na\r\n", b"STORED\r\n"),
                s(b"touch t 10\r\n", b"TOUCHED\r\n"),
                s(b"touch nope 10\r\n", b"NOT_FOUND\r\n"),
                later(5000, b"gat 1 t\r\n", b"VALUE t 0 1\r\na\r\nEND\r\n"),
                later(1001, b"gats 0 t\r\n", b"END\r\n"),
                s(b"gat x t\r\n", b"CLIENT_ERROR invalid exptime argument\r\n"),
            ],
        ),
        (
            "flush_all now and delayed",
            vec![
                s(b"set a 0 0 1\r\n1\r\n", b"STORED\r\n"),
                s(b"flush_all\r\n", b"OK\r\n"),
                s(b"get a\r\n", b"END\r\n"),
                s(b"set a 0 0 1\r\n1\r\n", b"STORED\r\n"),
                // memcached's delayed flush takes effect up to 1 s early (it keeps time in
                // whole seconds and subtracts one): read well before and after.
                s(b"flush_all 3\r\n", b"OK\r\n"),
                later(500, b"get a\r\n", b"VALUE a 0 1\r\n1\r\nEND\r\n"),
                later(2600, b"get a\r\n", b"END\r\n"),
                s(b"set a 0 0 1\r\n1\r\nflush_all -1\r\nget a\r\n", b"STORED\r\nOK\r\nEND\r\n"),
                s(b"flush_all x\r\n", b"CLIENT_ERROR invalid exptime argument\r\n"),
            ],
        ),
        (
            "noreply everywhere it applies",
            vec![
                s(
                    b"set k 0 0 1 noreply\r\na\r\nadd k 0 0 1 noreply\r\nb\r\nreplace k 0 0 1 noreply\r\nc\r\n\
                      append k 0 0 1 noreply\r\nd\r\nprepend k 0 0 1 noreply\r\ne\r\ncas k 0 0 1 1 noreply\r\nf\r\n\
                      incr k 1 noreply\r\ntouch k 0 noreply\r\nverbosity 1 noreply\r\nflush_all 100 noreply\r\n\
                      get k\r\n",
                    b"VALUE k 0 3\r\necd\r\nEND\r\n",
                ),
                s(b"delete k noreply\r\nget k\r\n", b"END\r\n"),
                s([b"set big 0 0 2000 noreply\r\n".as_slice(), &[b'x'; 2000], b"\r\n"].concat(), b""),
            ],
        ),
        (
            "version, verbosity, stats reset, mn, unknown commands",
            vec![
                s(b"version\r\n", b"VERSION 1.6.18-netlane-test\r\n"),
                s(b"verbosity 1\r\n", b"OK\r\n"),
                s(b"verbosity 1 2\r\n", b"OK\r\n"),
                s(b"verbosity\r\n", b"ERROR\r\n"),
                s(b"verbosity foo\r\n", b"CLIENT_ERROR bad command line format\r\n"),
                s(b"verbosity noreply\r\nverbosity 2 noreply\r\nmn\r\n", b"MN\r\n"),
                s(b"stats reset\r\n", b"RESET\r\n"),
                s(b"mn\r\n", b"MN\r\n"),
                s(b"bogus\r\n", b"ERROR\r\n"),
                s(b"\r\n", b"ERROR\r\n"),
                s(b"get\r\n", b"ERROR\r\n"),
                s(b"stats nonsense\r\n", b"ERROR\r\n"),
                s(b"set dump 0 0 3\r\nabc\r\nstats cachedump 1 1\r\n", b"STORED\r\nITEM dump [3 b; 0 s]\r\nEND\r\n"),
                s(b"stats cachedump 7 0\r\n", b"END\r\n"),
                s(b"set k 0 0\r\n", b"ERROR\r\n"),
            ],
        ),
        (
            "limits: key length, value size, data chunk",
            vec![
                s(format!("get {}\r\n", "a".repeat(251)), b"CLIENT_ERROR bad command line format\r\n"),
                // A too-long key in a storage command: the data block is skipped.
                s(format!("set {} 0 0 3\r\nabc\r\n", "a".repeat(251)), b"CLIENT_ERROR bad command line format\r\n"),
                // The 1025 bytes and CRLF that follow are skipped, not read as commands.
                s(
                    [b"set k 0 0 1025\r\n".as_slice(), &[b'x'; 1025], b"\r\n"].concat(),
                    b"SERVER_ERROR object too large for cache\r\n",
                ),
                s(b"set k 0 0 3\r\nabcde\r\n", b"CLIENT_ERROR bad data chunk\r\nERROR\r\n"),
                s(b"set k 0 0 -1\r\n", b"CLIENT_ERROR bad command line format\r\n"),
                s(b"set k x 0 1\r\na\r\n", b"CLIENT_ERROR bad command line format\r\n"),
                s(b"get k\r\n", b"END\r\n"),
            ],
        ),
        (
            "meta get, set, delete, arithmetic",
            vec![
                s(b"mg k v\r\n", b"EN\r\n"),
                s(b"mg k v q\r\nmn\r\n", b"MN\r\n"),
                s(b"ms k 2 T0 F5 c\r\nhi\r\n", b"HD c1\r\n"),
                s(b"mg k s v f t c k Oabc\r\n", b"VA 2 s2 f5 t-1 c1 kk Oabc\r\nhi\r\n"),
                s(b"mg k\r\n", b"HD\r\n"),
                s(b"mg k h l\r\n", b"HD h1 l0\r\n"),
                s(b"mg k v C1\r\n", b"VA 2\r\nhi\r\n"),
                s(b"ms k 1 MA\r\n!\r\n", b"HD\r\n"),
                s(b"ms k 1 MP q\r\n<\r\nmg k v\r\n", b"VA 4\r\n<hi!\r\n"),
                s(b"ms k 1 ME\r\nx\r\n", b"NS\r\n"),
                s(b"ms n 1 MR\r\nx\r\n", b"NS\r\n"),
                s(b"ms k 1 C99\r\nx\r\n", b"EX\r\n"),
                s(b"ms k 1 MX\r\nx\r\n", b"CLIENT_ERROR invalid mode for ms M token\r\n"),
                s(b"md n q\r\n", b"NF\r\n"),
                s(b"md k C1\r\n", b"EX\r\n"),
                s(b"md k q\r\nmg k\r\n", b"EN\r\n"),
                s(b"ma c\r\n", b"NF\r\n"),
                s(b"ma c N0 J10 v\r\n", b"VA 2\r\n10\r\n"),
                s(b"ma c D5 v t\r\n", b"VA 2 t-1\r\n15\r\n"),
                s(b"ma c MD D100 v\r\n", b"VA 1\r\n0\r\n"),
                s(b"ma c q\r\nma c v\r\n", b"VA 1\r\n2\r\n"),
                s(b"ma c MZ\r\n", b"CLIENT_ERROR invalid mode for ma M token\r\n"),
                s(b"mg k v v\r\n", b"CLIENT_ERROR duplicate flag\r\n"),
                s(b"mg k !\r\n", b"CLIENT_ERROR invalid flag\r\n"),
                s(b"mg k O123456789012345678901234567890123\r\n", b"CLIENT_ERROR opaque token too long\r\n"),
                s(b"mg k Tx\r\n", b"CLIENT_ERROR bad token in command line format\r\n"),
            ],
        ),
        (
            "meta: base64 keys, stale items and the recache win",
            vec![
                // "Zm9v" is "foo".
                s(b"ms Zm9v 3 b\r\nbar\r\n", b"HD\r\n"),
                s(b"get foo\r\n", b"VALUE foo 0 3\r\nbar\r\nEND\r\n"),
                s(b"mg Zm9v b k v\r\n", b"VA 3 kZm9v b\r\nbar\r\n"),
                s(b"mg !!!! b\r\n", b"CLIENT_ERROR error decoding key\r\n"),
                s(b"md foo I T30\r\n", b"HD\r\n"),
                s(b"mg foo v c\r\n", b"VA 3 c2 X W\r\nbar\r\n"),
                s(b"mg foo\r\n", b"HD Z X\r\n"),
                s(b"mg new N30 s\r\n", b"HD s0 W\r\n"),
                s(b"mg new N30 s\r\n", b"HD s0 Z\r\n"),
                s(b"me foo\r\n", b"ME Zm9v exp=-30 la=0 cas=2 fetch=yes cls=1 size=65\r\n"),
                s(b"me none\r\n", b"EN\r\n"),
            ],
        ),
        (
            "pipelined commands in one read",
            vec![s(
                b"set a 0 0 1\r\n1\r\nget a\r\nincr a 1\r\ndelete a\r\nget a\r\nmn\r\n",
                b"STORED\r\nVALUE a 0 1\r\n1\r\nEND\r\n2\r\nDELETED\r\nEND\r\nMN\r\n",
            )],
        ),
    ]
}

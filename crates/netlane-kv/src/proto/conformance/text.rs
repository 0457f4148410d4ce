//! The text and meta protocol's rows of the conformance table, by command family, in
//! the table's order (the fuzz seeds are named by their place in it).

use super::{
    CACHEDUMP, FLUSH_PAST, LINE, MEMLIMIT_GROWTH, SKIP_BLOCK, Step, VERSION, WRAP, closing, differs, later, s, varies,
};

/// get and the storage commands: set, add, replace, append, prepend, cas, delete,
/// incr, decr.
pub(super) fn storage_rows() -> Vec<(&'static str, Vec<Step>)> {
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
    ]
}

/// Expiry and flush_all, noreply, and the commands about the server itself (version,
/// verbosity, stats, mn) or about nothing (unknown commands).
pub(super) fn expiry_and_server_rows() -> Vec<(&'static str, Vec<Step>)> {
    vec![
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
                differs(b"version\r\n", b"VERSION 1.6.18-netlane-test\r\n", b"VERSION 1.6.18\r\n", VERSION),
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
                varies(
                    b"set dump 0 0 3\r\nabc\r\nstats cachedump 1 1\r\n",
                    b"STORED\r\nITEM dump [3 b; 0 s]\r\nEND\r\n",
                    CACHEDUMP,
                ),
                s(b"stats cachedump 7 0\r\n", b"END\r\n"),
                s(b"set k 0 0\r\n", b"ERROR\r\n"),
            ],
        ),
    ]
}

/// Limits: key length, value size, data chunk.
pub(super) fn limit_rows() -> Vec<(&'static str, Vec<Step>)> {
    vec![(
        "limits: key length, value size, data chunk",
        vec![
            s(format!("get {}\r\n", "a".repeat(251)), b"CLIENT_ERROR bad command line format\r\n"),
            // A too-long key in a storage command: the data block is skipped.
            differs(
                format!("set {} 0 0 3\r\nabc\r\n", "a".repeat(251)),
                b"CLIENT_ERROR bad command line format\r\n",
                b"CLIENT_ERROR bad command line format\r\nERROR\r\n",
                SKIP_BLOCK,
            ),
            // The 1025 bytes and CRLF that follow are skipped, not read as commands.
            s(
                [b"set k 0 0 1025\r\n".as_slice(), &[b'x'; 1025], b"\r\n"].concat(),
                b"SERVER_ERROR object too large for cache\r\n",
            ),
            s(b"set k 0 0 3\r\nabcde\r\n", b"CLIENT_ERROR bad data chunk\r\nERROR\r\n"),
            s(b"set k 0 0 -1\r\n", b"CLIENT_ERROR bad command line format\r\n"),
            differs(
                b"set k x 0 1\r\na\r\n",
                b"CLIENT_ERROR bad command line format\r\n",
                b"CLIENT_ERROR bad command line format\r\nERROR\r\n",
                SKIP_BLOCK,
            ),
            s(b"get k\r\n", b"END\r\n"),
        ],
    )]
}

/// The meta commands: mg, ms, md, ma, me, base64 keys, stale items, the recache win.
pub(super) fn meta_rows() -> Vec<(&'static str, Vec<Step>)> {
    vec![
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
    ]
}

/// Hostile and oversized input, much of it from memcached's own tests: a failed update,
/// lengths memcached refuses, get lines of any length, the line limit, HTTP.
pub(super) fn hostile_input_rows() -> Vec<(&'static str, Vec<Step>)> {
    vec![
        (
            "a failed update leaves no stale value (memcached's t/getset.t)",
            vec![
                s(b"set k 0 0 1\r\na\r\n", b"STORED\r\n"),
                s(
                    [b"set k 0 0 1025\r\n".as_slice(), &[b'x'; 1025], b"\r\n"].concat(),
                    b"SERVER_ERROR object too large for cache\r\n",
                ),
                s(b"get k\r\n", b"END\r\n"),
                s(b"set k 0 0 1\r\na\r\n", b"STORED\r\n"),
                s(
                    [b"ms k 2000 T0\r\n".as_slice(), &[b'x'; 2000], b"\r\n"].concat(),
                    b"SERVER_ERROR object too large for cache\r\n",
                ),
                s(b"get k\r\n", b"END\r\n"),
            ],
        ),
        (
            "lengths memcached refuses read no data block (memcached's t/issue_70.t)",
            vec![
                s(b"set k 0 0 4294967295\r\nmn\r\n", b"CLIENT_ERROR bad command line format\r\nMN\r\n"),
                s(b"set k 0 0 2147483647\r\nmn\r\n", b"CLIENT_ERROR bad command line format\r\nMN\r\n"),
                s(b"set k 0 0 -1\r\nmn\r\n", b"CLIENT_ERROR bad command line format\r\nMN\r\n"),
                s(b"ms k 4294967295\r\nmn\r\n", b"CLIENT_ERROR bad command line format\r\nMN\r\n"),
                s(b"set k 0 0 +3\r\nabc\r\n", b"STORED\r\n"),
                differs(
                    b"set k 4294967296 0 1\r\na\r\nget k\r\n",
                    b"CLIENT_ERROR bad command line format\r\nVALUE k 0 3\r\nabc\r\nEND\r\n",
                    b"STORED\r\nVALUE k 0 1\r\na\r\nEND\r\n",
                    WRAP,
                ),
            ],
        ),
        (
            "a get line of any length (memcached's t/getset.t)",
            vec![
                s(b"set a 0 0 1\r\n1\r\n", b"STORED\r\n"),
                s(
                    [b"get".as_slice(), &b" a".repeat(20_000), b"\r\n"].concat(),
                    [b"VALUE a 0 1\r\n1\r\n".repeat(20_000).as_slice(), b"END\r\n"].concat(),
                ),
                // A NUL byte ends a line, as memcached reads lines as C strings.
                s(b"get a\0zzz\r\n", b"VALUE a 0 1\r\n1\r\nEND\r\n"),
                s(b"get zzz\0 a\r\n", b"END\r\n"),
                s(b"gat 10\r\n", b"END\r\n"),
            ],
        ),
        (
            "lines up to the line limit, and past it",
            vec![
                s([b"verbosity 1".as_slice(), &[b' '; 2037], b"\r\n"].concat(), b"OK\r\n"),
                Step {
                    closes: true,
                    ..differs(
                        [b"verbosity 1".as_slice(), &[b' '; 2100], b"\r\n"].concat(),
                        b"CLIENT_ERROR line too long\r\n",
                        b"OK\r\n",
                        LINE,
                    )
                },
            ],
        ),
        (
            "HTTP on the memcached port closes (memcached's t/malicious-commands.t)",
            vec![
                closing(b"GET / HTTP/1.0\r\n", b""),
                closing(b"PUT /asdf/asd/fasdfasdf/sadf HTTP/1.1\r\n", b""),
                // The body of a browser's POST is never read as commands.
                closing(b"POST / HTTP/1.1\r\nContent-Length: 20\r\n\r\nset pwned 0 0 5\r\nhello\r\n", b""),
                s(b"get pwned\r\n", b"END\r\n"),
            ],
        ),
    ]
}

/// Arguments read as memcached reads them: the legacy delete and errors noreply
/// silences, numbers, flush_all times, meta tokens.
pub(super) fn argument_rows() -> Vec<(&'static str, Vec<Step>)> {
    vec![
        (
            "legacy delete, and errors noreply silences (memcached's t/issue_3.t)",
            vec![
                s(b"set k 0 0 1\r\na\r\n", b"STORED\r\n"),
                s(b"delete k 10 noreply\r\nmn\r\n", b"MN\r\n"),
                s(b"delete k 0 noreply\r\nget k\r\n", b"END\r\n"),
                s(b"incr k x noreply\r\nmn\r\n", b"MN\r\n"),
                s(b"set k 0 0 1 foo\r\nb\r\n", b"STORED\r\n"),
            ],
        ),
        (
            "numbers as memcached reads them (memcached's t/strtol-testing.t)",
            vec![
                s(b"verbosity invalid\r\n", b"CLIENT_ERROR bad command line format\r\n"),
                s(b"slabs automove invalid\r\n", b"CLIENT_ERROR bad command line format\r\n"),
                s(b"slabs automove 1\r\n", b"OK\r\n"),
                s(b"set n 0 0 3\r\n007\r\nincr n 1\r\nget n\r\n", b"STORED\r\n8\r\nVALUE n 0 3\r\n8  \r\nEND\r\n"),
                s(
                    b"set n 0 0 3\r\n 12\r\nincr n 1\r\nget n\r\nincr n +1\r\n",
                    b"STORED\r\n13\r\nVALUE n 0 3\r\n13 \r\nEND\r\n14\r\n",
                ),
                s(b"touch n 007\r\n", b"TOUCHED\r\n"),
                s(b"cache_memlimit 2\r\n", b"MEMLIMIT_TOO_SMALL cannot set maxbytes to less than 8m\r\n"),
                s(b"cache_memlimit 100\r\n", b"OK\r\n"),
                differs(
                    b"cache_memlimit 900000000\r\n",
                    b"MEMLIMIT_ADJUST_FAILED out of memory\r\n",
                    b"OK\r\n",
                    MEMLIMIT_GROWTH,
                ),
                s(
                    b"stats detail on\r\nstats detail dump\r\nstats detail\r\n",
                    b"OK\r\nEND\r\nCLIENT_ERROR usage: stats detail on|off|dump\r\n",
                ),
            ],
        ),
        (
            "flush_all times",
            vec![
                s(b"set a 0 0 1\r\n1\r\n", b"STORED\r\n"),
                s(b"flush_all 2147483647\r\nget a\r\n", b"OK\r\nVALUE a 0 1\r\n1\r\nEND\r\n"),
                differs(
                    b"flush_all 1000000000\r\nget a\r\n",
                    b"OK\r\nEND\r\n",
                    b"OK\r\nVALUE a 0 1\r\n1\r\nEND\r\n",
                    FLUSH_PAST,
                ),
            ],
        ),
        (
            "meta tokens as memcached 1.6.18 (memcached's t/metaget.t)",
            vec![
                s(b"mg nope k Oab\r\n", b"EN knope Oab\r\n"),
                s(b"ms k 1 T0\r\nx\r\n", b"HD\r\n"),
                s(b"ms k 1 c C99\r\ny\r\n", b"EX c0\r\n"),
                s(b"mg k x\r\n", b"CLIENT_ERROR invalid flag\r\n"),
                s(b"ms k 1 x\r\nz\r\nmn\r\n", b"CLIENT_ERROR invalid flag\r\nMN\r\n"),
                s(b"ms k 1 MEE\r\nz\r\nmn\r\n", b"CLIENT_ERROR incorrect length for M token\r\nMN\r\n"),
                s(b"ms r 1 T10\r\nx\r\nmg r R30 t\r\nmg r R30 t\r\n", b"HD\r\nHD t10 W\r\nHD t10 Z\r\n"),
            ],
        ),
    ]
}

/// Pipelining: commands in one read.
pub(super) fn pipelining_rows() -> Vec<(&'static str, Vec<Step>)> {
    vec![(
        "pipelined commands in one read",
        vec![s(
            b"set a 0 0 1\r\n1\r\nget a\r\nincr a 1\r\ndelete a\r\nget a\r\nmn\r\n",
            b"STORED\r\nVALUE a 0 1\r\n1\r\nEND\r\n2\r\nDELETED\r\nEND\r\nMN\r\n",
        )],
    )]
}

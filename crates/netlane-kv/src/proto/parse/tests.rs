//! The line parser against memcached's rules: numbers, token counts, noreply, get
//! heads, meta flags.

use super::*;

const ALL: Allowed = Allowed { shutdown: true, debug_time: true };

#[test]
fn numbers_read_as_memcacheds_strtol() {
    let n = |s: &str| Num::parse(s.as_bytes());
    assert_eq!(n("+3").and_then(Num::i32), Some(3));
    assert_eq!(n("007").and_then(Num::u32), Some(7));
    assert_eq!(n("\t5").and_then(Num::u32), Some(5));
    assert_eq!(n("5\tjunk").and_then(Num::u32), Some(5));
    assert_eq!(n("-0").and_then(Num::u64), Some(0));
    assert_eq!(n("-1").and_then(Num::u64), None);
    assert_eq!(n("-1").and_then(Num::i32), Some(-1));
    assert_eq!(n("2147483648").and_then(Num::i32), None);
    assert_eq!(n("-2147483648").and_then(Num::i32), Some(i32::MIN));
    assert_eq!(n("4294967296").and_then(Num::u32), None);
    assert_eq!(n("18446744073709551616"), None);
    assert_eq!(n("5x"), None);
    assert_eq!(n(""), None);
    assert_eq!(n("-"), None);
}

#[test]
fn token_counts_and_noreply_as_memcached() {
    // A sixth token that is not noreply is ignored.
    assert!(matches!(parse(b"set k 0 0 1 foo", ALL), Ok(Command::Store { noreply: false, .. })));
    assert_eq!(parse(b"set k 0 0", ALL).unwrap_err(), UNKNOWN);
    // Errors after noreply was read are silent.
    let e = parse(b"incr k x noreply", ALL).unwrap_err();
    assert!(e.silent);
    let e = parse(b"delete k 10 noreply", ALL).unwrap_err();
    assert!(e.silent && e.reply.starts_with("CLIENT_ERROR bad command line format."));
    assert!(matches!(parse(b"delete k 0 noreply", ALL), Ok(Command::Delete { noreply: true, .. })));
    assert!(matches!(parse(b"delete k noreply", ALL), Ok(Command::Delete { noreply: true, .. })));
    // Lengths memcached refuses, and no data block is read for them.
    for l in ["-1", "4294967295", "2147483647", "2147483646"] {
        let e = parse(format!("set k 0 0 {l}").as_bytes(), ALL).unwrap_err();
        assert_eq!((e.reply, e.swallow), (BAD_FORMAT.reply, None), "{l}");
    }
    assert!(matches!(parse(b"set k 0 0 2147483645", ALL), Ok(Command::Store { len: 2147483645, .. })));
    assert!(matches!(parse(b"set k 0 0 +3", ALL), Ok(Command::Store { len: 3, .. })));
    // A NUL byte ends the line.
    assert_eq!(parse(b"set k\0 0 0 1", ALL).unwrap_err(), UNKNOWN);
}

#[test]
fn memcached_internals_have_no_counterpart() {
    for l in ["lru_crawler metadump all", "lru mode flat", "watch", "extstore free_memchunks 0 0"] {
        assert_eq!(parse(l.as_bytes(), ALL).unwrap_err(), UNKNOWN, "{l}");
    }
    assert_eq!(parse(b"slabs reassign 1 2", ALL).unwrap_err().reply, "CLIENT_ERROR slab reassignment disabled");
    let no = Allowed { shutdown: false, debug_time: false };
    assert_eq!(parse(b"debugtime 1", no).unwrap_err(), UNKNOWN);
    assert_eq!(parse(b"shutdown", no).unwrap_err().reply, "ERROR: shutdown not enabled");
}

#[test]
fn http_request_lines_close() {
    for l in ["GET / HTTP/1.0", "PUT /asdf/asd/fasdfasdf/sadf HTTP/1.1", "DELETE HTTP/1.1", "POST / HTTP/1.1"] {
        assert!(parse(l.as_bytes(), ALL).unwrap_err().close, "{l}");
    }
    assert!(!parse(b"bogus", ALL).unwrap_err().close);
}

#[test]
fn get_heads_and_long_lines() {
    assert_eq!(get_head(b"get a b", true), Ok(Some(GetHead { cas: false, touch: None, keys_at: 3 })));
    assert_eq!(get_head(b"gats 10 a", true), Ok(Some(GetHead { cas: true, touch: Some(10), keys_at: 7 })));
    assert_eq!(get_head(b"gat x a", true), Err(BAD_EXPTIME));
    assert_eq!(get_head(b"gat", true), Err(UNKNOWN));
    assert_eq!(get_head(b"get  ", true), Err(UNKNOWN));
    assert_eq!(get_head(b"get\0 a", true), Err(UNKNOWN));
    assert!(get_head(b"gat 10", true).unwrap().is_some());
    assert_eq!(get_head(b"gat 1", false), Ok(None));
    assert_eq!(get_head(b"set a", true), Ok(None));
    assert!(is_get_line(b"  get a"));
    assert!(!is_get_line(b"set a"));
}

#[test]
fn meta_flags_as_memcached() {
    let e = |l: &str| parse(l.as_bytes(), ALL).unwrap_err().reply;
    assert_eq!(e("mg k x"), "CLIENT_ERROR invalid flag");
    assert_eq!(e("mg k v v"), "CLIENT_ERROR duplicate flag");
    assert_eq!(e("md k x"), "CLIENT_ERROR invalid or duplicate flag");
    assert_eq!(e("ms k 1 MEE"), "CLIENT_ERROR incorrect length for M token");
    assert_eq!(parse(b"ms k 1 x", ALL).unwrap_err().swallow, Some(3));
    assert_eq!(e("ms"), "ERROR");
    assert_eq!(e("ms k"), "CLIENT_ERROR bad command line format");
    assert_eq!(e("mg k O123456789012345678901234567890123"), "CLIENT_ERROR opaque token too long");
    let many = format!("mg k {}", (b'a'..=b'z').map(|c| (c as char).to_string()).collect::<Vec<_>>().join(" "));
    assert_eq!(e(&many), "CLIENT_ERROR options flags are too long");
}

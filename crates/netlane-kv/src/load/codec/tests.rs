//! The codec's tests: requests byte for byte, replies decoded across every split point,
//! hostile and malformed replies refused with bounded buffering (and fuzzed).

use proptest::prelude::*;

use super::*;
use crate::load::workload::{SizeDist, Workload, WorkloadSpec};

fn keys(n: u64) -> Vec<Key> {
    let w = Workload::new(WorkloadSpec { key_size: SizeDist::Fixed(10), ..WorkloadSpec::default() }).unwrap();
    (0..n).map(|i| w.key(i)).collect()
}

fn decode_all(c: &mut Codec, chunks: &[&[u8]]) -> (Vec<Completion>, Result<(), ProtocolError>) {
    let mut got = Vec::new();
    for chunk in chunks {
        if let Err(e) = c.decode(chunk, |x| got.push(x)) {
            return (got, Err(e));
        }
    }
    (got, Ok(()))
}

#[test]
fn requests_encode_as_the_protocol_says() {
    let k = keys(3);
    let mut c = Codec::new(1 << 20);
    let mut out = Vec::new();
    c.encode(1, &Request::Get { keys: &k[..1] }, &mut out);
    c.encode(2, &Request::Get { keys: &k }, &mut out);
    c.encode(3, &Request::Set { key: k[2], value_len: 30 }, &mut out);
    c.encode(4, &Request::Set { key: k[0], value_len: 0 }, &mut out);
    let expected = b"get key:000000\r\nget key:000000 key:000001 key:000002\r\n\
        set key:000002 0 0 30\r\nabcdefghijklmnopqrstuvwxyzabcd\r\nset key:000000 0 0 0\r\n\r\n";
    assert_eq!(String::from_utf8_lossy(&out), String::from_utf8_lossy(expected));
    assert_eq!(c.outstanding(), 4);
    // A value longer than the filler repeats it.
    let mut big = Vec::new();
    c.encode(5, &Request::Set { key: k[0], value_len: 5000 }, &mut big);
    assert_eq!(big.len(), "set key:000000 0 0 5000\r\n".len() + 5000 + 2);
}

/// The requests and replies of [`stream`], with what they must complete as.
fn exchange() -> (Codec, Vec<u8>, Vec<Completion>) {
    let k = keys(3);
    let mut c = Codec::new(1000);
    let mut sink = Vec::new();
    c.encode(10, &Request::Get { keys: &k }, &mut sink);
    c.encode(11, &Request::Set { key: k[0], value_len: 5 }, &mut sink);
    c.encode(12, &Request::Get { keys: &k[..1] }, &mut sink);
    c.encode(13, &Request::Set { key: k[1], value_len: 5 }, &mut sink);
    c.encode(14, &Request::Get { keys: &k[..2] }, &mut sink);
    c.encode(15, &Request::Set { key: k[1], value_len: 5 }, &mut sink);
    c.encode(16, &Request::Set { key: k[1], value_len: 5 }, &mut sink);
    c.encode(17, &Request::Get { keys: &k[..1] }, &mut sink);
    // Value data that looks like replies must be skipped by length, not parsed.
    let replies = b"VALUE key:000000 0 5\r\nEND\r\n\r\nVALUE key:000002 42 0 999\r\n\r\nEND\r\n\
        STORED\r\n\
        END\r\n\
        SERVER_ERROR out of memory storing object\r\n\
        VALUE key:000000 0 3\r\nabc\r\nVALUE key:000001 0 1\r\nx\r\nEND\r\n\
        NOT_STORED\r\n\
        CLIENT_ERROR bad data chunk\r\n\
        ERROR\r\n"
        .to_vec();
    let done = |token, reply| Completion { token, reply };
    let expected = vec![
        done(10, Reply::Get { hits: 2, misses: 1 }),
        done(11, Reply::Set(SetReply::Stored)),
        done(12, Reply::Get { hits: 0, misses: 1 }),
        done(13, Reply::Error(ReplyError::Server)),
        done(14, Reply::Get { hits: 2, misses: 0 }),
        done(15, Reply::Set(SetReply::NotStored)),
        done(16, Reply::Error(ReplyError::Client)),
        done(17, Reply::Error(ReplyError::Error)),
    ];
    (c, replies, expected)
}

#[test]
fn replies_decode_across_every_split_point() {
    let (_, replies, expected) = exchange();
    let whole = {
        let (mut c, ..) = exchange();
        decode_all(&mut c, &[&replies])
    };
    assert_eq!(whole, (expected.clone(), Ok(())));
    for i in 0..=replies.len() {
        let (mut c, ..) = exchange();
        let (a, b) = replies.split_at(i);
        assert_eq!(decode_all(&mut c, &[a, b]), (expected.clone(), Ok(())), "split at {i}");
        assert_eq!(c.outstanding(), 0);
    }
    // Every pair of split points, and byte by byte.
    for i in 0..=replies.len() {
        for j in i..=replies.len() {
            let (mut c, ..) = exchange();
            let got = decode_all(&mut c, &[&replies[..i], &replies[i..j], &replies[j..]]);
            assert_eq!(got, (expected.clone(), Ok(())), "split at {i}, {j}");
        }
    }
    let (mut c, ..) = exchange();
    let bytes: Vec<&[u8]> = replies.chunks(1).collect();
    assert_eq!(decode_all(&mut c, &bytes), (expected, Ok(())));
}

#[test]
fn value_lines_are_checked() {
    let k = keys(2);
    let value = |line: &[u8]| {
        let mut c = Codec::new(100);
        c.encode(0, &Request::Get { keys: &k }, &mut Vec::new());
        decode_all(&mut c, &[line]).1
    };
    assert_eq!(value(b"VALUE k 0 3 77\r\nabc\r\n"), Ok(()), "with a CAS unique");
    assert_eq!(value(b"VALUE k 0 100\r\n"), Ok(()), "at the limit");
    for bad in [
        &b"VALUE k 0\r\n"[..],
        b"VALUE k 0 3 77 9\r\n",
        b"VALUE k x 3\r\n",
        b"VALUE k 0 -3\r\n",
        b"VALUE k 0 3x\r\n",
        b"VALUE k 4294967296 3\r\n",
        b"VALUE  0 3\r\n",
        b"VALUE k 0 99999999999999999999999\r\n",
    ] {
        assert!(matches!(value(bad), Err(ProtocolError::BadValue { .. })), "{}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn hostile_replies_are_refused_with_bounded_buffering() {
    let k = keys(1);
    let codec = || {
        let mut c = Codec::new(1 << 20);
        c.encode(0, &Request::Get { keys: &k }, &mut Vec::new());
        c
    };
    // A huge declared size: refused at the line, nothing allocated for it.
    let mut c = codec();
    let (_, r) = decode_all(&mut c, &[b"VALUE key:0 0 18446744073709551615\r\n"]);
    assert_eq!(r, Err(ProtocolError::ValueTooLarge { declared: u64::MAX, limit: 1 << 20 }));
    // An endless line: refused once it passes MAX_LINE, the buffer never larger.
    let mut c = codec();
    let junk = [b'A'; 1000];
    let mut r = Ok(());
    for _ in 0..100 {
        r = c.decode(&junk, |_| ());
        assert!(c.line.len() <= MAX_LINE);
        if r.is_err() {
            break;
        }
    }
    assert_eq!(r, Err(ProtocolError::LineTooLong));
    // A long line arriving whole is refused too.
    let mut c = codec();
    let mut long = vec![b'A'; MAX_LINE];
    long.extend_from_slice(b"\r\n");
    assert_eq!(decode_all(&mut c, &[&long]).1, Err(ProtocolError::LineTooLong));
    // A line of exactly MAX_LINE bytes is a line.
    let mut c = codec();
    let mut exact = b"SERVER_ERROR ".to_vec();
    exact.resize(MAX_LINE - 2, b'x');
    exact.extend_from_slice(b"\r\n");
    assert_eq!(decode_all(&mut c, &[&exact[..100], &exact[100..]]).0.len(), 1);
    // Garbage, bare newlines, replies of the wrong kind, replies to nothing, more
    // values than keys, data without its CRLF.
    let cases: [(&[u8], ProtocolError); 6] = [
        (
            b"HTTP/1.1 400 Bad Request\r\n",
            ProtocolError::Unexpected { request: "get", line: "HTTP/1.1 400 Bad Request".into() },
        ),
        (b"END\n", ProtocolError::BareNewline { line: "END\n".into() }),
        (b"STORED\r\n", ProtocolError::Unexpected { request: "get", line: "STORED".into() }),
        (b"END\r\nEND\r\n", ProtocolError::Unsolicited { line: "END".into() }),
        (b"VALUE a 0 1\r\nx\r\nVALUE a 0 1\r\n", ProtocolError::TooManyValues { keys: 1 }),
        (b"VALUE a 0 1\r\nxy\r\n", ProtocolError::DataNotTerminated),
    ];
    for (input, err) in cases {
        let mut c = codec();
        assert_eq!(decode_all(&mut c, &[input]).1, Err(err.clone()));
        // The codec stays failed until abandoned, then takes a new connection.
        assert_eq!(c.decode(b"END\r\n", |_| ()), Err(err));
        assert_eq!(c.abandon(), usize::from(input != b"END\r\nEND\r\n"));
        c.encode(1, &Request::Get { keys: &k }, &mut Vec::new());
        assert_eq!(
            decode_all(&mut c, &[b"END\r\n"]).0,
            vec![Completion { token: 1, reply: Reply::Get { hits: 0, misses: 1 } }]
        );
    }
    // A set answered like a get.
    let mut c = Codec::new(100);
    c.encode(0, &Request::Set { key: k[0], value_len: 1 }, &mut Vec::new());
    assert_eq!(
        decode_all(&mut c, &[b"END\r\n"]).1,
        Err(ProtocolError::Unexpected { request: "set", line: "END".into() })
    );
    // Quotes of bad lines are bounded.
    let mut c = Codec::new(100);
    let mut long_garbage = vec![b'Z'; 4000];
    long_garbage.extend_from_slice(b"\r\n");
    let Err(ProtocolError::Unsolicited { line }) = c.decode(&long_garbage, |_| ()) else { panic!("accepted") };
    assert_eq!(line.len(), QUOTE);
}

#[test]
fn error_lines_need_their_exact_words() {
    assert!(is_error(b"SERVER_ERROR", b"SERVER_ERROR"));
    assert!(is_error(b"SERVER_ERROR busy", b"SERVER_ERROR"));
    assert!(!is_error(b"SERVER_ERRORS", b"SERVER_ERROR"));
    assert_eq!(parse_decimal(b""), None);
    assert_eq!(parse_decimal(b"18446744073709551615"), Some(u64::MAX));
    assert_eq!(parse_decimal(b"18446744073709551616"), None);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    #[test]
    fn the_decoder_never_panics_and_stays_bounded(
        requests in proptest::collection::vec((any::<bool>(), 0u64..4), 0..16),
        bytes in proptest::collection::vec(any::<u8>(), 0..4096),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..8),
    ) {
        let k = keys(4);
        let mut c = Codec::new(512);
        for (i, (get, n)) in requests.iter().enumerate() {
            let r = if *get { Request::Get { keys: &k[..*n as usize] } } else { Request::Set { key: k[0], value_len: 3 } };
            c.encode(i as u64, &r, &mut Vec::new());
        }
        let mut cuts: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
        cuts.push(0);
        cuts.push(bytes.len());
        cuts.sort_unstable();
        let mut completed = Vec::new();
        for w in cuts.windows(2) {
            let r = c.decode(&bytes[w[0]..w[1]], |x| completed.push(x.token));
            prop_assert!(c.line.len() <= MAX_LINE);
            if r.is_err() {
                break;
            }
        }
        // Completions come in request order, each once.
        prop_assert!(completed.windows(2).all(|w| w[0] < w[1]));
        prop_assert_eq!(completed.len() + c.outstanding(), requests.len());
    }

    #[test]
    fn the_decoder_survives_reply_shaped_noise(
        lines in proptest::collection::vec(
            prop_oneof![
                Just(b"END\r\n".to_vec()),
                Just(b"STORED\r\n".to_vec()),
                Just(b"ERROR\r\n".to_vec()),
                Just(b"SERVER_ERROR x\r\n".to_vec()),
                (0u64..2000).prop_map(|n| format!("VALUE key:1 0 {n}\r\n").into_bytes()),
                proptest::collection::vec(any::<u8>(), 0..64),
            ],
            0..32,
        ),
        chunk in 1usize..64,
    ) {
        let k = keys(4);
        let mut c = Codec::new(1000);
        for i in 0..24u64 {
            let r = if i % 3 == 0 { Request::Set { key: k[0], value_len: 3 } } else { Request::Get { keys: &k[..(i % 4) as usize] } };
            c.encode(i, &r, &mut Vec::new());
        }
        let stream = lines.concat();
        for piece in stream.chunks(chunk) {
            if c.decode(piece, |_| ()).is_err() {
                break;
            }
            prop_assert!(c.line.len() <= MAX_LINE);
        }
    }
}

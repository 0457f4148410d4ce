//! The fuzz target's body over the committed seed corpus and over random input, on the
//! stable toolchain (cargo-fuzz needs nightly: `cd fuzz && cargo fuzz run rr_exchange`).
//! `cargo test -p netlane-rr --test fuzz_corpus -- --ignored` writes the seeds again.

use std::path::PathBuf;

use netlane_rr::proto::fuzzing::{exchange, frames, stream};
use netlane_rr::proto::server::{ResponderConfig, respond};
use netlane_rr::proto::wire::{self, Header};
use proptest::prelude::*;

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/rr_exchange")
}

fn framed(mode: u8, datagrams: &[&[u8]]) -> Vec<u8> {
    let mut v = vec![mode];
    for d in datagrams {
        v.extend_from_slice(&(d.len() as u16).to_be_bytes());
        v.extend_from_slice(d);
    }
    v
}

/// Seeds: a real request, a real segmented response, an echo, and junk.
fn make_seeds() -> Vec<(String, Vec<u8>)> {
    let mut req = [0u8; 512];
    let n = wire::encode(&Header::request(2, 0, 472, 200), &mut req).unwrap();
    let rc = ResponderConfig { segment: Some(1440), ..ResponderConfig::default() };
    let mut out = vec![0u8; rc.max_reply_bytes()];
    let mut big = [0u8; 512];
    let m = wire::encode(&Header::request(2, 0, 472, 4000), &mut big).unwrap();
    let r = respond(&rc, &big[..m], &mut out).unwrap();
    let segs: Vec<&[u8]> = out[..r.len].chunks(r.segment_len).collect();
    vec![
        ("request".into(), framed(0, &[&req[..n]])),
        ("segmented".into(), framed(2, &segs)),
        ("echo".into(), framed(4, &[&req[..n], &req[..n]])),
        ("junk".into(), framed(1, &[b"NLRR\x01\x02", &[0xff; 60]])),
    ]
}

#[test]
#[ignore = "writes the seed corpus"]
fn write_seeds() {
    std::fs::create_dir_all(corpus_dir()).unwrap();
    for (name, data) in make_seeds() {
        std::fs::write(corpus_dir().join(name), data).unwrap();
    }
}

#[test]
fn seed_corpus_runs_clean() {
    let seeds: Vec<Vec<u8>> = std::fs::read_dir(corpus_dir())
        .map(|d| d.flatten().filter_map(|e| std::fs::read(e.path()).ok()).collect())
        .unwrap_or_default();
    assert!(seeds.len() >= 4, "seed corpus missing");
    for seed in &seeds {
        exchange(seed);
        for cut in (0..seed.len()).step_by(5) {
            exchange(&seed[..cut]);
        }
        for i in (1..seed.len()).step_by(11) {
            let mut m = seed.clone();
            m[i] ^= 0x21;
            exchange(&m);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]
    #[test]
    fn random_input_never_panics(data in proptest::collection::vec(any::<u8>(), 0..3000)) {
        exchange(&data);
    }

    #[test]
    fn any_sizes_build_frames_that_parse_back(
        mtu in 0u16..10_000,
        slot in 0u16..17_000,
        v6 in any::<bool>(),
        id in any::<u32>(),
        len in 0usize..70_000,
    ) {
        let mut data = Vec::with_capacity(9 + len);
        data.extend_from_slice(&mtu.to_be_bytes());
        data.extend_from_slice(&slot.to_be_bytes());
        data.push(u8::from(v6));
        data.extend_from_slice(&id.to_be_bytes());
        data.extend((0..len).map(|i| i as u8));
        frames(&data);
    }

    #[test]
    fn any_stream_read_in_any_pieces_gives_whole_messages_or_an_error(
        step in any::<u8>(),
        requests in 0usize..6,
        junk in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        // Real messages first (so lengths are reached and taken), then anything.
        let mut data = vec![step];
        for i in 0..requests {
            let mut req = [0u8; 300];
            let n = wire::encode(&Header::request(i as u64, 0, 260, 100), &mut req).unwrap();
            data.extend_from_slice(&req[..n]);
        }
        data.extend(junk);
        stream(&data);
    }
}

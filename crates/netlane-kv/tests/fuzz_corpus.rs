//! The fuzz target's body over the committed seed corpus and over random input, on the
//! stable toolchain (cargo-fuzz needs nightly: `cd fuzz && cargo fuzz run kv_conn`).
//! `cargo test -p netlane-kv --test fuzz_corpus -- --ignored` writes the seeds again.

use std::path::PathBuf;

use netlane_kv::proto::conformance::{binary_table, conformance_table};
use netlane_kv::proto::fuzzing::conn;
use proptest::prelude::*;

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/kv_conn")
}

/// `data` as the target's input: a mode byte, then chunks of up to 63 bytes.
fn framed(mode: u8, data: &[u8]) -> Vec<u8> {
    let mut v = vec![mode];
    for c in data.chunks(63) {
        v.push(c.len() as u8);
        v.extend_from_slice(c);
    }
    v.push(0);
    v
}

/// Seeds: every sequence of the conformance table, with default and with small limits.
fn make_seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for (i, (_, steps)) in conformance_table().into_iter().enumerate() {
        let bytes: Vec<u8> = steps.iter().flat_map(|s| s.send.clone()).collect();
        out.push((format!("table-{i:02}"), framed(0, &bytes)));
        out.push((format!("table-{i:02}-small"), framed(3, &bytes)));
    }
    for (i, (_, steps)) in binary_table().into_iter().enumerate() {
        let bytes: Vec<u8> = steps.concat();
        out.push((format!("binary-{i:02}"), framed(0, &bytes)));
        out.push((format!("binary-{i:02}-small"), framed(7, &bytes)));
    }
    out
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
    assert!(seeds.len() >= 20, "seed corpus missing");
    for seed in &seeds {
        conn(seed);
        for cut in (0..seed.len()).step_by(7) {
            conn(&seed[..cut]);
        }
        for i in (1..seed.len()).step_by(13) {
            let mut m = seed.clone();
            m[i] ^= 0x21;
            conn(&m);
        }
    }
}

/// A binary request from parts a fuzzer would pick: any opcode, lengths that agree or
/// not with what follows.
fn binary_packet(opcode: u8, extlen: u8, keylen: u16, bodylen: u32, body: &[u8]) -> Vec<u8> {
    let mut p = netlane_kv::proto::binary::request(opcode, &[], b"", b"", 1, 0);
    p[2..4].copy_from_slice(&keylen.to_be_bytes());
    p[4] = extlen;
    p[8..12].copy_from_slice(&bodylen.to_be_bytes());
    p.extend_from_slice(body);
    p
}

proptest! {
    // Fewer cases: a packet announcing a large value makes the connection buffer it.
    #![proptest_config(ProptestConfig::with_cases(512))]
    #[test]
    fn random_binary_packets_never_panic(
        mode in prop_oneof![Just(0u8), Just(3), Just(4), Just(7)],
        packets in proptest::collection::vec(
            (0u8..0x40, prop_oneof![Just(0u8), Just(4), Just(8), Just(20), any::<u8>()],
             prop_oneof![Just(0u16), 1u16..8, Just(250), Just(251), any::<u16>()],
             prop_oneof![0u32..64, Just(1100), any::<u32>()],
             proptest::collection::vec(any::<u8>(), 0..80)),
            0..20,
        ),
    ) {
        let bytes: Vec<u8> = packets.iter().flat_map(|(o, e, k, b, body)| binary_packet(*o, *e, *k, *b, body)).collect();
        conn(&framed(mode, &bytes));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn random_input_never_panics(data in proptest::collection::vec(any::<u8>(), 0..4000)) {
        conn(&data);
    }

    #[test]
    fn random_commands_never_panic(
        mode in 0u8..4,
        words in proptest::collection::vec(
            prop_oneof![
                Just("get "), Just("gets "), Just("set "), Just("add "), Just("cas "), Just("incr "), Just("decr "),
                Just("mg "), Just("ms "), Just("md "), Just("ma "), Just("me "), Just("touch "), Just("gat "),
                Just("flush_all "), Just("stats "), Just("delete "), Just("append "), Just("noreply "),
                Just("k "), Just("0 "), Just("5 "), Just("-1 "), Just("99999999999 "), Just("v "), Just("q "),
                Just("N30 "), Just("T1 "), Just("C1 "), Just("E7 "), Just("MA "), Just("MD "), Just("I "),
                Just("b "), Just("Zm9v "), Just("\r\n"), Just("hello\r\n"), Just("\n"), Just("x")
            ],
            0..200,
        ),
    ) {
        let text: String = words.concat();
        conn(&framed(mode, text.as_bytes()));
    }
}

//! The fuzz targets' bodies over the committed seed corpus and over random input, on
//! the stable toolchain (cargo-fuzz itself needs nightly: `cd fuzz && cargo fuzz run
//! nvme_target_queue`). `cargo test -p netlane-nvme --test fuzz_corpus -- --ignored`
//! regenerates the seeds from a real host/controller session.

use std::path::PathBuf;

use netlane_nvme::proto::cmd::{Sqe, nvm};
use netlane_nvme::proto::fuzzing;
use netlane_nvme::proto::host::{HostQueue, HostQueueConfig};
use proptest::prelude::*;

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus").join(target)
}

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = std::fs::read_dir(corpus_dir(target))
        .map(|d| d.flatten().filter_map(|e| std::fs::read(e.path()).ok()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn seed_corpus_runs_clean() {
    for (target, f) in [
        ("nvme_pdu_decode", fuzzing::decode_stream as fn(&[u8])),
        ("nvme_target_queue", fuzzing::target_queue),
        ("nvme_host_queue", fuzzing::host_queue),
    ] {
        let s = seeds(target);
        assert!(s.len() >= 3, "{target}: seed corpus missing");
        for seed in &s {
            f(seed);
            // Every truncation and a few bit flips of every seed.
            for cut in (0..seed.len()).step_by(7) {
                f(&seed[..cut]);
            }
            for i in (2..seed.len()).step_by(13) {
                let mut m = seed.clone();
                m[i] ^= 0x5a;
                f(&m);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    #[test]
    fn random_input_never_panics(mode in 0u8..8, split: u8, body in proptest::collection::vec(any::<u8>(), 0..600)) {
        let mut d = vec![mode, split];
        d.extend_from_slice(&body);
        fuzzing::target_queue(&d);
        fuzzing::host_queue(&d);
        fuzzing::decode_stream(&body);
    }
}

/// An I/O queue session's bytes in both directions: ICReq and Connect, then writes
/// (in-capsule and by R2T) and reads (split into several C2HData).
fn session(hd: bool, dd: bool) -> (Vec<u8>, Vec<u8>) {
    use netlane_nvme::proto::target::TargetQueue;
    let (subsys, _admin) = fuzzing::enabled_subsystem();
    let mut t = TargetQueue::new(subsys, 0);
    let mut h = HostQueue::new(HostQueueConfig { qid: 1, in_capsule: 1024, ..HostQueueConfig::admin(hd, dd) });
    let mut to_target = Vec::new();
    let mut to_host = Vec::new();
    let mut pump = |h: &mut HostQueue, t: &mut TargetQueue| loop {
        let out = h.poll_output().to_vec();
        let k = out.len();
        h.handle_written(k);
        to_target.extend_from_slice(&out);
        t.handle_input(&out, 0);
        t.run_storage(0);
        let back = t.poll_output().to_vec();
        let k = back.len();
        t.handle_written(k);
        to_host.extend_from_slice(&back);
        h.handle_input(&back).unwrap();
        if out.is_empty() && back.is_empty() {
            break;
        }
    };
    pump(&mut h, &mut t);
    let (sqe, data) = netlane_nvme::proto::fabrics::Connect {
        recfmt: 0,
        qid: 1,
        sqsize: 31,
        cattr: netlane_nvme::proto::fabrics::CATTR_DISABLE_SQFLOW,
        kato_ms: 0,
        hostid: [0; 16],
        cntlid: 1,
        subnqn: fuzzing::FUZZ_NQN.into(),
        hostnqn: "nqn.fuzz-host".into(),
    }
    .encode(0);
    h.submit(sqe, data, 0).unwrap();
    pump(&mut h, &mut t);
    assert!(h.pop_completion().unwrap().cqe.status.is_success());
    for (i, (op, len)) in
        [(nvm::WRITE, 512), (nvm::WRITE, 12288), (nvm::READ, 12288), (nvm::READ, 512)].into_iter().enumerate()
    {
        let mut s = Sqe::default();
        s.set_opcode(op);
        s.set_nsid(1);
        s.set_lba_range(i as u64 * 32, (len / 512) as u32);
        h.submit(s, vec![i as u8 + 1; len], i as u64 + 1).unwrap();
        pump(&mut h, &mut t);
        assert!(h.pop_completion().unwrap().cqe.status.is_success());
    }
    (to_target, to_host)
}

#[test]
#[ignore = "writes the seed corpus"]
fn write_seed_corpus() {
    for target in ["nvme_pdu_decode", "nvme_target_queue", "nvme_host_queue"] {
        std::fs::create_dir_all(corpus_dir(target)).unwrap();
    }
    for mode in 0u8..4 {
        let (hd, dd) = (mode & 1 != 0, mode & 2 != 0);
        let (to_target, to_host) = session(hd, dd);
        let prefix_len = fuzzing::io_prefix(hd, dd).len();
        std::fs::write(corpus_dir("nvme_pdu_decode").join(format!("h2c-{mode}")), &to_target).unwrap();
        std::fs::write(corpus_dir("nvme_pdu_decode").join(format!("c2h-{mode}")), &to_host).unwrap();
        // target_queue: odd first byte = after the admin prefix (digest bits 1, 2).
        let mut t = vec![1 | (u8::from(hd) << 1) | (u8::from(dd) << 2), 128];
        t.extend_from_slice(&to_target[prefix_len..]);
        std::fs::write(corpus_dir("nvme_target_queue").join(format!("session-{mode}")), &t).unwrap();
        let mut raw = vec![0u8, 64];
        raw.extend_from_slice(&to_target);
        std::fs::write(corpus_dir("nvme_target_queue").join(format!("raw-{mode}")), &raw).unwrap();
        let mut hq = vec![mode];
        hq.extend_from_slice(&to_host[128..]);
        std::fs::write(corpus_dir("nvme_host_queue").join(format!("session-{mode}")), &hq).unwrap();
    }
}

//! Unit tests of PDU framing: round trips with and without digests, header fields
//! checked in order, oversized and truncated PDUs, and a decoder that never panics.

use super::*;
use crate::proto::cmd::{Cqe, Sqe, Status};

fn est(role: Role, hdgst: bool, ddgst: bool) -> RxConfig {
    RxConfig { role, established: true, hdgst, ddgst, pda: 4, max_icd: 8192, max_data: 131072 }
}

#[test]
fn ic_req_round_trip_is_128_bytes() {
    let mut out = Vec::new();
    let p = IcReq { pfv: 0, hpda: 0, hdgst: true, ddgst: false, maxr2t: 3 };
    TxConfig::ic_req(&mut out, &p);
    assert_eq!(out.len(), 128);
    assert_eq!(&out[..8], &[0, 0, 128, 0, 128, 0, 0, 0]);
    let d = decode(&out, &RxConfig::initial(Role::Controller)).unwrap();
    assert_eq!(d.len, 128);
    assert_eq!(d.pdu, Pdu::IcReq(p));
}

#[test]
fn capsule_with_digests_round_trips_and_detects_corruption() {
    for (hd, dd) in [(false, false), (true, false), (false, true), (true, true)] {
        let tx = TxConfig { hdgst: hd, ddgst: dd, pda: 4 };
        let mut sqe = Sqe::default();
        sqe.set_opcode(0x01);
        sqe.set_cid(7);
        let data: Vec<u8> = (0..100u8).collect();
        let mut out = Vec::new();
        tx.capsule_cmd(&mut out, &sqe, &data);
        let want = 72 + if hd { 4 } else { 0 } + 100 + if dd { 4 } else { 0 };
        assert_eq!(out.len(), want);
        let cfg = est(Role::Controller, hd, dd);
        let d = decode(&out, &cfg).unwrap();
        match d.pdu {
            Pdu::CapsuleCmd { sqe: s, data: got, ddgst_ok } => {
                assert_eq!(s.cid(), 7);
                assert_eq!(got, &data[..]);
                assert!(ddgst_ok);
            }
            other => panic!("{other:?}"),
        }
        // Every strict prefix is incomplete, never an error or a panic.
        for n in 8..out.len() {
            assert!(matches!(decode(&out[..n], &cfg), Err(DecodeError::Incomplete(_))), "prefix {n}");
        }
        if hd {
            let mut bad = out.clone();
            bad[20] ^= 1;
            assert_eq!(
                decode(&bad, &cfg).unwrap_err(),
                DecodeError::Violation(Violation::new(Fes::HeaderDigestError, 0, "header digest mismatch"))
            );
        }
        if dd {
            let mut bad = out.clone();
            let n = bad.len();
            bad[n - 10] ^= 1;
            assert!(matches!(decode(&bad, &cfg).unwrap().pdu, Pdu::CapsuleCmd { ddgst_ok: false, .. }));
        }
    }
}

#[test]
fn digest_flag_mismatch_is_invalid_field_1() {
    let mut out = Vec::new();
    TxConfig::default().capsule_resp(&mut out, &Cqe { cid: 1, status: Status::SUCCESS, ..Cqe::default() });
    let err = decode(&out, &est(Role::Host, true, false)).unwrap_err();
    assert!(matches!(err, DecodeError::Violation(Violation { fes: Fes::InvalidHeaderField, fei: 1, .. })));
}

#[test]
fn header_fields_are_checked_in_order() {
    let cfg = est(Role::Controller, false, false);
    let mut sqe_pdu = Vec::new();
    TxConfig::default().capsule_cmd(&mut sqe_pdu, &Sqe::default(), &[]);
    let fei = |b: &[u8]| match decode(b, &cfg) {
        Err(DecodeError::Violation(v)) => (v.fes, v.fei),
        other => panic!("{other:?}"),
    };
    let mut b = sqe_pdu.clone();
    b[0] = 0x05; // a controller-to-host type sent to a controller
    assert_eq!(fei(&b), (Fes::InvalidHeaderField, 0));
    let mut b = sqe_pdu.clone();
    b[0] = 0x0a; // unknown even type
    assert_eq!(fei(&b), (Fes::InvalidHeaderField, 0));
    let mut b = sqe_pdu.clone();
    b[1] = FLAG_LAST;
    assert_eq!(fei(&b), (Fes::InvalidHeaderField, 1));
    let mut b = sqe_pdu.clone();
    b[2] = 18; // hlen in dwords: wrong
    assert_eq!(fei(&b), (Fes::InvalidHeaderField, 2));
    let mut b = sqe_pdu.clone();
    b[4] = 80; // plen with 8 bytes of data but pdo 0
    assert_eq!(fei(&b), (Fes::InvalidHeaderField, 3));
    let mut b = sqe_pdu.clone();
    b[4] = 60; // plen shorter than the header: the pdo check sees it first
    assert_eq!(fei(&b), (Fes::InvalidHeaderField, 3));
    let dd = RxConfig { ddgst: true, ..cfg };
    let mut b = sqe_pdu.clone();
    b[1] = FLAG_DDGSTF;
    b[3] = 72;
    b[4] = 75; // three bytes: too short to hold a data digest
    b.resize(75, 0);
    assert!(matches!(decode(&b, &dd), Err(DecodeError::Violation(Violation { fei: 4, .. }))));
    let mut b = sqe_pdu.clone();
    b[0] = 0x00; // ICReq on an established connection
    assert_eq!(fei(&b), (Fes::InvalidHeaderField, 0));
    let b = sqe_pdu.clone();
    let pre = RxConfig::initial(Role::Controller);
    assert!(matches!(decode(&b, &pre), Err(DecodeError::Violation(Violation { fes: Fes::PduSequenceError, .. }))));
}

#[test]
fn oversized_data_is_refused_from_the_header_alone() {
    let cfg = est(Role::Controller, false, false);
    let mut b = Vec::new();
    TxConfig::default().h2c_data(&mut b, 1, 2, 0, &[1, 2, 3, 4], true);
    b[4..8].copy_from_slice(&(24u32 + 200_000).to_le_bytes());
    b[3] = 24;
    assert!(matches!(
        decode(&b[..8], &cfg),
        Err(DecodeError::Violation(Violation { fes: Fes::DataLimitExceeded, .. }))
    ));
    let mut c = Vec::new();
    TxConfig::default().capsule_cmd(&mut c, &Sqe::default(), &vec![0; 9000]);
    assert!(matches!(decode(&c[..8], &cfg), Err(DecodeError::Violation(Violation { fes: Fes::DataOutOfRange, .. }))));
}

#[test]
fn term_req_bad_length_resets() {
    let mut b = Vec::new();
    TxConfig::term_req(&mut b, Role::Host, Fes::PduSequenceError, 0, &[0; 200]);
    assert_eq!(b.len(), TERM_MAX_PLEN);
    assert!(matches!(decode(&b, &est(Role::Controller, false, false)).unwrap().pdu, Pdu::TermReq { fes: 2, .. }));
    b[4] = 200;
    assert_eq!(decode(&b, &est(Role::Controller, false, false)), Err(DecodeError::Reset));
}

#[test]
fn c2h_success_requires_last_and_aligned_pdo() {
    let tx = TxConfig { hdgst: true, ddgst: true, pda: 16 };
    let mut b = Vec::new();
    tx.c2h_data_with(&mut b, 3, 0, 10, true, true, |d| d.fill(0xab));
    assert_eq!(b[3], 32, "pdo rounds 24+4 up to 16-byte alignment");
    let cfg = RxConfig { pda: 16, ..est(Role::Host, true, true) };
    match decode(&b, &cfg).unwrap().pdu {
        Pdu::C2hData { cccid: 3, last: true, success: true, data, ddgst_ok: true, .. } => {
            assert_eq!(data, &[0xab; 10])
        }
        other => panic!("{other:?}"),
    }
    let mut bad = b.clone();
    bad[1] &= !FLAG_LAST;
    assert!(matches!(decode(&bad, &cfg), Err(DecodeError::Violation(Violation { fei: 1, .. }))));
}

#[test]
fn datal_must_match_framing() {
    let cfg = est(Role::Controller, false, false);
    let mut b = Vec::new();
    TxConfig::default().h2c_data(&mut b, 1, 2, 0, &[9; 16], true);
    b[16] = 15;
    assert!(matches!(decode(&b, &cfg), Err(DecodeError::Violation(Violation { fei: 16, .. }))));
}

proptest::proptest! {
    #[test]
    fn decode_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..400),
                           hd: bool, dd: bool, est_: bool, host: bool) {
        let cfg = RxConfig {
            role: if host { Role::Host } else { Role::Controller },
            established: est_, hdgst: hd, ddgst: dd, pda: 4, max_icd: 8192, max_data: 65536,
        };
        if let Ok(d) = decode(&bytes, &cfg) {
            proptest::prop_assert!(d.len <= bytes.len() && d.len >= 8);
        }
    }
}

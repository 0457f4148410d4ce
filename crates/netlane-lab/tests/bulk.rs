//! The bulk-transfer engine across a real veth pair between namespaces (needs root)
//! and over loopback: zerocopy completions, the pacer, every mode's data verified.

use std::time::Duration;

use netlane::pace::Quantum;
use netlane::topology::{LinkConfig, RxTuning, TwoHosts};
use netlane::udp::{Batching, GsoMode, RxBatching};
use netlane_lab::engines::bulk::{self, BulkRun, Endpoints, Pacing, Roles, RxSpec, TxSource, TxSpec, Verify};

fn hosts(label: &str, rx: RxTuning) -> TwoHosts {
    TwoHosts::create(label, LinkConfig { rx, ..LinkConfig::default() }).expect("build topology")
}

fn bulk_run(tx: TxSpec, rx: RxSpec, ipv6: bool) -> BulkRun {
    BulkRun { tx: TxSource::Netlane(tx), rx, ipv6, run_id: 7, roles: Roles::Threads }
}

#[test]
fn zerocopy_sends_each_complete_exactly_once() {
    if !netlane_testkit::privileged("zerocopy_sends_each_complete_exactly_once") {
        return;
    }
    let h = hosts("zc", RxTuning::threaded_napi());
    for ipv6 in [false, true] {
        let tx = TxSpec {
            gso: GsoMode::Cmsg,
            zerocopy: true,
            segments_per_send: 40,
            duration: Duration::from_millis(400),
            ..TxSpec::udp()
        };
        let r = bulk::run(Endpoints::Veth(&h), &bulk_run(tx, RxSpec { verify: Verify::Full, ..RxSpec::udp() }, ipv6))
            .unwrap();
        let z = r.tx.zerocopy.expect("zerocopy stats");
        assert!(z.sends > 100, "ipv6={ipv6}: only {} zerocopy sends", z.sends);
        assert_eq!(z.completed, z.sends, "ipv6={ipv6}: every send completes");
        assert_eq!(z.unexpected, 0, "ipv6={ipv6}: no completion twice or for an unknown send");
        assert!(z.copied <= z.completed);
        assert_eq!(r.rx.integrity.corrupt, 0, "buffers were not reused before completion");
        assert_eq!(r.rx.integrity.duplicates, 0);
    }
    // TCP zerocopy too.
    let tx = TxSpec { zerocopy: true, duration: Duration::from_millis(300), ..TxSpec::tcp() };
    let r =
        bulk::run(Endpoints::Veth(&h), &bulk_run(tx, RxSpec { verify: Verify::Full, ..RxSpec::tcp() }, false)).unwrap();
    let z = r.tx.zerocopy.expect("zerocopy stats");
    assert!(z.sends > 10);
    assert_eq!((z.completed, z.unexpected), (z.sends, 0));
    assert_eq!(r.rx.bytes, r.tx.bytes, "TCP delivers every byte");
    assert_eq!(r.rx.integrity.corrupt, 0);
}

#[test]
fn pacer_holds_a_low_rate() {
    if !netlane_testkit::privileged("pacer_holds_a_low_rate") {
        return;
    }
    let h = hosts("pace", RxTuning::threaded_napi());
    let rate = 20_000_000;
    let tx = TxSpec {
        gso: GsoMode::Cmsg,
        segments_per_send: 20,
        pacing: Some(Pacing::new(rate, Quantum::Fixed(2_000_000))),
        duration: Duration::from_secs(1),
        ..TxSpec::udp()
    };
    let r = bulk::run(Endpoints::Veth(&h), &bulk_run(tx, RxSpec::udp(), false)).unwrap();
    let p = r.tx.pacing.as_ref().expect("pacing report");
    assert!((p.accuracy - 1.0).abs() < 0.2, "sender achieved {} of the target", p.accuracy);
    let at_receiver = r.rx_pacing_accuracy().expect("a paced run").unwrap();
    assert!((at_receiver - 1.0).abs() < 0.2, "the receiver saw {at_receiver} of the {rate} B/s target");
    let loss = r.loss().unwrap();
    assert!(loss < 0.01, "loss {loss}");
    assert!(r.tx.path.iter().any(|p| p.contains("user-space pacer")), "{:?}", r.tx.path);
}

#[test]
fn every_mode_delivers_verified_data_over_veth() {
    if !netlane_testkit::privileged("every_mode_delivers_verified_data_over_veth") {
        return;
    }
    let h = hosts("modes", RxTuning::threaded_napi());
    let d = Duration::from_millis(250);
    // Paced so that nothing is lost: this checks integrity, not speed.
    let pace = Some(Pacing::new(50_000_000, Quantum::Auto));
    let cases = [
        (
            TxSpec { duration: d, pacing: pace, ..TxSpec::udp() },
            RxSpec { batching: RxBatching::Single, ..RxSpec::udp() },
        ),
        (
            TxSpec { duration: d, batching: Batching::Mmsg, segments_per_send: 32, pacing: pace, ..TxSpec::udp() },
            RxSpec::udp(),
        ),
        (
            TxSpec { duration: d, gso: GsoMode::Sockopt, segments_per_send: 46, pacing: pace, ..TxSpec::udp() },
            RxSpec::udp(),
        ),
        (
            TxSpec { duration: d, gso: GsoMode::Cmsg, segments_per_send: 46, pacing: pace, ..TxSpec::udp() },
            RxSpec { gro: true, batching: RxBatching::Mmsg(8), ..RxSpec::udp() },
        ),
    ];
    for ipv6 in [false, true] {
        for (tx, rx) in &cases {
            let r = bulk::run(Endpoints::Veth(&h), &bulk_run(tx.clone(), RxSpec { verify: Verify::Full, ..*rx }, ipv6))
                .unwrap();
            let i = r.rx.integrity;
            assert!(r.tx.datagrams > 0);
            assert_eq!(i.unique, r.tx.datagrams, "ipv6={ipv6} {:?}: lost datagrams", r.tx.path);
            assert_eq!((i.corrupt, i.duplicates, i.foreign, i.bad_length), (0, 0, 0, 0), "{:?}", r.tx.path);
        }
    }
}

#[test]
fn loopback_runs_without_namespaces_and_counts_syscalls() {
    // No root needed: this one always runs.
    let tx = TxSpec {
        batching: Batching::Mmsg,
        segments_per_send: 46,
        duration: Duration::from_millis(200),
        pacing: Some(Pacing::new(30_000_000, Quantum::Auto)),
        ..TxSpec::udp()
    };
    let r =
        bulk::run(Endpoints::Loopback, &bulk_run(tx, RxSpec { verify: Verify::Full, ..RxSpec::udp() }, false)).unwrap();
    assert_eq!(r.tx.gso_fallbacks, 0);
    // Every release is a whole number of 46-datagram sendmmsg calls, except partial
    // tails: never more than one call per 46 datagrams plus one per release.
    let releases = r.tx.pacing.unwrap().stats.releases as f64;
    let calls = r.tx.syscalls as f64;
    assert!(calls <= r.tx.datagrams as f64 / 46.0 + releases + 1.0, "{calls} calls for {} datagrams", r.tx.datagrams);
    assert_eq!(r.rx.integrity.unique, r.tx.datagrams);
    assert_eq!(r.rx.integrity.corrupt, 0);
}

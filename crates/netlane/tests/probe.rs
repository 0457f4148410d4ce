//! The capability probe, for real.

use netlane::probe::{self, Support};

#[test]
fn loopback_features_are_probed_with_evidence() {
    // GSO and GRO exist on every kernel netlane supports (4.18 / 5.0); the probe must
    // find them by sending, and say what it saw.
    let gso = probe::udp_gso();
    assert!(gso.is_supported(), "{gso:?}");
    assert!(gso.detail().contains("1000+1000+500"), "{gso:?}");
    let gro = probe::udp_gro();
    assert!(gro.is_supported(), "{gro:?}");
    assert!(matches!(probe::msg_zerocopy(), Support::Supported(_) | Support::Unsupported(_)));
}

#[test]
fn qdisc_probe_tells_present_from_absent() {
    if !netlane_testkit::privileged("qdisc_probe_tells_present_from_absent") {
        return;
    }
    let q = probe::qdiscs(&["tbf", "no-such-qdisc"]);
    assert!(q[0].1.is_supported(), "{q:?}");
    assert!(matches!(&q[1].1, Support::Unsupported(why) if why.contains("not in this kernel")), "{q:?}");
    // SO_TXTIME is judged by the qdiscs that honour it.
    let tx = probe::so_txtime(&[("fq", Support::Unsupported("x".into())), ("etf", Support::Unsupported("x".into()))]);
    assert!(matches!(tx, Support::Unsupported(_)), "{tx:?}");
    let tx = probe::so_txtime(&[("fq", Support::Supported("created".into()))]);
    assert!(tx.is_supported(), "{tx:?}");
}

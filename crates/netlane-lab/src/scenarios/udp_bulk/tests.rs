//! The udp-bulk scenario's checks and report from hand-made runs.

use netlane::metrics::CpuTime;

use super::plan::{Arm, Role};
use super::*;
use crate::engines::bulk::{Integrity, PaceReport, RxReport, TxReport};
use netlane_report::{FlagKind, Outcome};

/// A run that moved `bytes` in a second with 0.1 s of CPU on each side.
fn run(bytes: u64, pacing: Option<u64>) -> BulkResult {
    let datagrams = bytes / 1400;
    let cpu = CpuTime { user_s: 0.05, system_s: 0.05, ..CpuTime::default() };
    BulkResult {
        tx: TxReport {
            datagrams,
            bytes,
            syscalls: datagrams,
            seconds: 1.0,
            cpu,
            pacing: pacing.map(|r| PaceReport {
                target_rate_bytes_per_s: r,
                quantum_ns: 1_000_000,
                accuracy: 1.0,
                ..PaceReport::default()
            }),
            ..TxReport::default()
        },
        rx: RxReport {
            datagrams,
            bytes,
            syscalls: datagrams,
            seconds: 0.999,
            cpu,
            integrity: Integrity { unique: datagrams, ..Integrity::default() },
            ..RxReport::default()
        },
        ..BulkResult::default()
    }
}

fn args() -> UdpBulkArgs {
    let mut a = UdpBulkArgs::defaults();
    a.net.path = super::super::PathKind::Loopback;
    a.no_selftest = true;
    a.repeat = 2;
    a.rates = vec![10_000_000];
    a
}

/// Every arm's results: two good rounds, except `bad` (an arm label) whose second
/// round is `degenerate`.
fn results(arms: &[Arm], bad: &str, degenerate: BulkResult) -> Vec<Vec<BulkResult>> {
    arms.iter()
        .map(|a| {
            let good = match a.role {
                Role::Main(Mode::Paced, Some(r)) => run(r, Some(r)),
                _ => run(1_400_000_000, None),
            };
            let second = if a.label == bad { degenerate.clone() } else { good.clone() };
            vec![good, second]
        })
        .collect()
}

fn outcome(checks: &[netlane_report::Check], id: &str) -> (Outcome, String) {
    let c = checks.iter().find(|c| c.id == id).unwrap_or_else(|| panic!("no check {id}"));
    (c.outcome, c.reason.clone())
}

#[test]
fn good_runs_give_measured_checks() {
    let a = args();
    let arms = a.arms();
    let checks = a.checks(&arms, &results(&arms, "none", BulkResult::default()));
    for id in
        ["udp-bulk.gso-cpu-vs-udp", "udp-bulk.gso-cpu-vs-tcp", "udp-bulk.gro-rx-vs-udp", "udp-bulk.paced-10MB/s-rate"]
    {
        let (o, why) = outcome(&checks, id);
        assert_ne!(o, Outcome::Invalid, "{id}: {why}");
    }
}

#[test]
fn every_check_is_invalid_when_a_mode_it_reads_moved_nothing() {
    let a = args();
    let arms = a.arms();
    let nothing = BulkResult::default();
    for (arm, ids) in [
        ("gso", &["udp-bulk.gso-cpu-vs-udp", "udp-bulk.gso-cpu-vs-tcp", "udp-bulk.paced-10MB/s-cpu"][..]),
        ("udp", &["udp-bulk.gso-cpu-vs-udp", "udp-bulk.gro-rx-vs-udp"][..]),
        ("tcp", &["udp-bulk.gso-cpu-vs-tcp"][..]),
        ("gso-gro", &["udp-bulk.gro-rx-vs-udp"][..]),
        ("paced 10MB/s", &["udp-bulk.paced-10MB/s-rate", "udp-bulk.paced-10MB/s-cpu"][..]),
    ] {
        let checks = a.checks(&arms, &results(&arms, arm, nothing.clone()));
        for id in ids {
            let (o, why) = outcome(&checks, id);
            assert_eq!(o, Outcome::Invalid, "{arm} moved nothing, yet {id} is {o:?} ({why})");
            assert!(why.contains("sample 2"), "{id}: {why}");
        }
    }
}

#[test]
fn no_cpu_time_and_impossible_runs_are_invalid() {
    let a = args();
    let arms = a.arms();
    let mut no_cpu = run(1_400_000_000, None);
    no_cpu.tx.cpu = CpuTime::default();
    let (o, why) = outcome(&a.checks(&arms, &results(&arms, "gso", no_cpu)), "udp-bulk.gso-cpu-vs-udp");
    assert_eq!(o, Outcome::Invalid);
    assert!(why.contains("no CPU time"), "{why}");
    // The receiver counting more than was sent cannot be true.
    let mut impossible = run(1_400_000_000, None);
    impossible.rx.integrity.unique = impossible.tx.datagrams * 2;
    let (o, why) = outcome(&a.checks(&arms, &results(&arms, "gso-gro", impossible)), "udp-bulk.gro-rx-vs-udp");
    assert_eq!(o, Outcome::Invalid);
    assert!(why.contains("receiver counted"), "{why}");
}

#[test]
fn the_kernel_comparison_is_invalid_when_the_kernel_sender_sent_nothing() {
    let mut a = args();
    a.no_selftest = false;
    a.selftest = Some("/bin/true".into());
    let arms = a.arms();
    let checks = a.checks(&arms, &results(&arms, "udpgso_bench_tx -S", BulkResult::default()));
    let (o, why) = outcome(&checks, "udp-bulk.gso-sender-vs-kernel");
    assert_eq!(o, Outcome::Invalid, "{why}");
    assert_ne!(outcome(&checks, "udp-bulk.plain-sender-vs-kernel").0, Outcome::Invalid);
}

#[test]
fn the_report_flags_impossible_and_lossy_modes() {
    let a = args();
    let arms = a.arms();
    let mut lossy = run(1_400_000_000, None);
    lossy.rx.integrity.unique /= 10;
    lossy.rx.bytes /= 10;
    let mut rs = results(&arms, "gso", lossy.clone());
    let gso = arms.iter().position(|x| x.label == "gso").unwrap();
    rs[gso][0] = lossy;
    let r = a.report(&arms, &rs, Vec::new());
    assert!(r.flags.iter().any(|f| f.kind == FlagKind::Lossy && f.subject == "gso"), "{:?}", r.flags);
    let mut impossible = run(1_400_000_000, None);
    impossible.rx.integrity.unique *= 2;
    let r = a.report(&arms, &results(&arms, "udp", impossible), Vec::new());
    assert!(r.flags.iter().any(|f| f.kind == FlagKind::Impossible && f.subject == "udp"), "{:?}", r.flags);
}

#[test]
fn modes_that_switch_the_device_run_only_on_the_lab_s_own_veth() {
    // Over loopback: left out, and said so; so is GRO coalescing (no receive NAPI).
    let a = args();
    let arms = a.arms();
    assert_eq!(a.left_out(), [Mode::TcpSw, Mode::TcpMss, Mode::SendmmsgGro, Mode::GsoSw]);
    assert!(arms.iter().all(|x| !matches!(x.role, Role::Main(m, _) if a.left_out().contains(&m))), "{arms:?}");
    let r = a.report(&arms, &results(&arms, "none", BulkResult::default()), Vec::new());
    assert!(r.notes.iter().any(|n| n.starts_with("Left out: tcp-sw, tcp-mss, gso-sw (it switches")), "{:?}", r.notes);
    assert!(r.notes.iter().any(|n| n.starts_with("Left out: sendmmsg-gro (GRO coalesces")), "{:?}", r.notes);
    let (o, why) = outcome(&r.checks, "udp-bulk.gro-coalesced-rx-cpu");
    assert_eq!(o, Outcome::Skipped, "{why}");
    let (o, why) = outcome(&r.checks, "udp-bulk.tcp-sw-cpu-vs-tcp");
    assert_eq!(o, Outcome::Skipped, "{why}");
    // On the lab's veth: each with its own segmentation, the others' the device's.
    let mut a = args();
    a.net.path = super::super::PathKind::Veth;
    assert!(a.left_out().is_empty());
    let seg = |label: &str| match a.arms().iter().find(|x| x.label == label).unwrap().role {
        Role::Main(m, _) => m.segmentation(),
        other => panic!("{other:?}"),
    };
    use netlane::topology::Segmentation;
    assert_eq!(seg("tcp-sw"), Segmentation::Software);
    assert_eq!(seg("gso-sw"), Segmentation::Software);
    assert_eq!(seg("tcp-mss"), Segmentation::None);
    assert_eq!(seg("gso"), Segmentation::Device);
    // The cold modes send from the span, copying or zerocopy.
    for label in ["gso-cold", "gso-zc-cold"] {
        let arm = a.arms().into_iter().find(|x| x.label == label).unwrap();
        let crate::engines::bulk::TxSource::Netlane(tx) = arm.run.tx else { panic!("{label}") };
        assert_eq!(tx.payload_span, Some(256 << 20), "{label}");
        assert_eq!(tx.zerocopy, label == "gso-zc-cold");
    }
}

#[test]
fn zerocopy_from_cold_memory_is_not_shown_where_the_kernel_copied_the_sends() {
    let a = args();
    let arms = a.arms();
    let zc_cold = arms.iter().position(|x| x.label == "gso-zc-cold").unwrap();
    let zc = |copied: u64| netlane::zerocopy::ZerocopyStats { sends: 10, completed: 10, copied, ..Default::default() };
    let mut rs = results(&arms, "none", BulkResult::default());
    for r in &mut rs[zc_cold] {
        r.tx.zerocopy = Some(zc(10));
    }
    let (o, why) = outcome(&a.checks(&arms, &rs), "udp-bulk.zc-cold-vs-cold");
    assert_eq!(o, Outcome::NotShown, "{why}");
    assert!(why.contains("copied 20 of 20 zerocopy sends"), "{why}");
    // Sent from the pinned pages (none copied): measured, and here it saved nothing.
    for r in &mut rs[zc_cold] {
        r.tx.zerocopy = Some(zc(0));
    }
    let (o, why) = outcome(&a.checks(&arms, &rs), "udp-bulk.zc-cold-vs-cold");
    assert_eq!(o, Outcome::Missed, "{why}");
    // Refused and copied from then on: not a zerocopy sender.
    rs[zc_cold][1].tx.zerocopy_fallbacks = 1;
    let (o, why) = outcome(&a.checks(&arms, &rs), "udp-bulk.zc-cold-vs-cold");
    assert_eq!(o, Outcome::Invalid, "{why}");
    assert!(why.contains("ENOBUFS"), "{why}");
}

#[test]
fn gro_coalescing_is_judged_by_the_receivers_cpu_with_its_napi() {
    let mut a = args();
    a.net.path = super::super::PathKind::Veth;
    let arms = a.arms();
    let at = |label: &str| arms.iter().position(|x| x.label == label).unwrap();
    let busy = |s: f64| Some(netlane::metrics::SystemCpuDelta { busy_s: s, cpus: 1, ..Default::default() });
    let mut rs = results(&arms, "none", BulkResult::default());
    // Unpinned receivers: nothing to read.
    let (o, why) = outcome(&a.checks(&arms, &rs), "udp-bulk.gro-coalesced-rx-cpu");
    assert_eq!(o, Outcome::Invalid, "{why}");
    assert!(why.contains("not pinned"), "{why}");
    for r in &mut rs[at("sendmmsg-gro")] {
        r.receiving_cpu = busy(0.6);
    }
    for r in &mut rs[at("sendmmsg")] {
        r.receiving_cpu = busy(1.0);
    }
    let c = a.checks(&arms, &rs);
    let m = c.iter().find(|c| c.id == "udp-bulk.gro-coalesced-rx-cpu").unwrap();
    assert_eq!(m.outcome, Outcome::Met, "{}", m.reason);
    assert!((m.measured.as_ref().unwrap().median - 0.6).abs() < 1e-9);
    // The receiving NAPI elsewhere: the receiver's CPU is not the receive path.
    let mut apart = a.clone();
    apart.net.napi_cpu = Some(apart.net.rx_cpu() + 1);
    let (o, why) = outcome(&apart.checks(&arms, &rs), "udp-bulk.gro-coalesced-rx-cpu");
    assert_eq!(o, Outcome::Skipped, "{why}");
}

/// A many-flow run: `count` flows of `share` bytes/s each seen (`seen` of them), the
/// sender's CPU `cpu_s` for 100 MB.
fn flows_run(count: u32, seen: u32, share: u64, cpu_s: f64) -> BulkResult {
    let mut r = run(100_000_000, Some(100_000_000));
    r.tx.cpu = CpuTime { system_s: cpu_s, ..CpuTime::default() };
    let rate = netlane::metrics::Summary { p50: share, min: share, max: share, ..Default::default() };
    r.rx.flows =
        Some(netlane_bulk::flows::FlowsReport { expected: count, seen, rate_bytes_per_s: rate, ..Default::default() });
    r
}

#[test]
fn many_flows_are_judged_against_fewer_flows_and_unpaced_and_at_each_flows_receiver() {
    let mut a = args();
    a.flows = vec![1, 100];
    a.flows_rate = 100_000_000;
    let arms = a.arms();
    let labels: Vec<&str> =
        arms.iter().filter(|x| matches!(x.role, Role::Flows(..))).map(|x| x.label.as_str()).collect();
    assert_eq!(labels, ["1 flows paced", "100 flows paced", "100 flows unpaced"]);
    let results = |seen_at_100: u32| -> Vec<Vec<BulkResult>> {
        arms.iter()
            .map(|x| {
                let r = match x.role {
                    Role::Flows(1, true) => flows_run(1, 1, 100_000_000, 0.1),
                    Role::Flows(n, true) => flows_run(n, seen_at_100, 1_000_000, 0.5),
                    Role::Flows(n, false) => flows_run(n, n, 2_000_000, 0.05),
                    _ => run(1_400_000_000, None),
                };
                vec![r.clone(), r]
            })
            .collect()
    };
    let good = results(100);
    let checks = a.flow_checks(&arms, &good);
    for id in ["udp-bulk.flows-100-cpu-vs-1", "udp-bulk.flows-100-paced-vs-unpaced", "udp-bulk.flows-100-rate"] {
        assert_eq!(outcome(&checks, id).0, Outcome::Met, "{id}: {}", outcome(&checks, id).1);
    }
    let table = a.flows_table(&arms, &good).expect("a flows table");
    assert_eq!(table.rows.len(), 3);
    // A run where flows never arrived cannot say what each flow got.
    let checks = a.flow_checks(&arms, &results(60));
    let (o, why) = outcome(&checks, "udp-bulk.flows-100-rate");
    assert_eq!(o, Outcome::Invalid, "{why}");
    assert!(why.contains("only 60 of 100 flows arrived"), "{why}");
    // A count whose flows could not each send ten times in the run is left out, said.
    a.flows = vec![1, 10_000];
    a.time = std::time::Duration::from_millis(300);
    let labels: Vec<String> = a.flow_arms().into_iter().map(|x| x.label).collect();
    assert_eq!(labels, ["1 flows paced", "1 flows unpaced"]);
    let left = a.flows_left_out();
    assert!(left.len() == 1 && left[0].starts_with("10000 flows: ") && left[0].contains("fewer than 10"), "{left:?}");
    // None asked: no arms, no checks.
    a.flows = vec![0];
    assert!(a.flow_arms().is_empty() && a.flow_checks(&a.arms(), &[]).is_empty());
}

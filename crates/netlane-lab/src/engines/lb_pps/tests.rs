//! The harness's sizing, warm-up judgement and slice arithmetic, without a network.

use netlane_sys::bpf::HintMode;

use super::contender::lb_config;
use super::results::{Bare, Slice};
use super::*;

#[test]
fn the_connection_table_is_sized_for_every_possible_cpu_even_from_a_pinned_thread() {
    // available_parallelism() on a thread pinned to one CPU says 1, which gave each
    // CPU's LRU list half the room it needed on a 2-CPU machine.
    let (pinned, possible) = std::thread::spawn(|| {
        netlane::cpus::pin(Some(0));
        (std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1), netlane::cpus::possible_count())
    })
    .join()
    .unwrap();
    assert_eq!(pinned, 1, "the trap: a pinned thread sees one CPU");
    assert_eq!(possible, netlane::cpus::possible_count());
    let cfg = lb_config(10_000);
    assert_eq!(cfg.conn_entries, conn_entries(10_000, possible));
    assert_eq!(conn_entries(10_000, 2), 40_000);
    assert_eq!(conn_entries(1, 2), 4096, "a floor for tiny flow counts");
    assert_eq!(conn_entries(1_000_000, 64), 1 << 24, "at most what a configuration may ask for");
}

#[test]
fn a_warm_up_pass_whose_frames_never_arrived_is_not_accepted() {
    // The old test (misses <= 0.1% of the flows) passed this: 44% of the frames
    // reached the balancer, none of them missing the table.
    let lost = WarmPass { flows: 1_000_000, ran: 440_000, fast: 440_000, tagged: None };
    assert!(lost.check().unwrap_err().contains("reached the balancer"));
    // Or this: every frame arrived, 44% found state.
    let cold = WarmPass { flows: 1_000_000, ran: 1_000_000, fast: 440_000, tagged: None };
    assert!(cold.check().unwrap_err().contains("fast path"));
    let untagged = WarmPass { flows: 1000, ran: 1000, fast: 1000, tagged: Some(500) };
    assert!(untagged.check().unwrap_err().contains("tag"));
    assert!(WarmPass { flows: 1000, ran: 1000, fast: 999, tagged: Some(1000) }.check().is_ok());
    // A majority arrived and all of them were warm: a fair sample of warm state.
    assert!(WarmPass { flows: 10_000, ran: 8_180, fast: 8_180, tagged: None }.check().is_ok());
    assert!(WarmPass { flows: 10_000, ran: 8_180, fast: 8_000, tagged: None }.check().is_err());
}

#[test]
fn a_slice_where_the_napi_thread_got_no_cpu_is_left_out_not_zero() {
    let ok = Slice {
        runs: 3_000_000,
        prog_ns: 300_000_000,
        prog_runs: 3_000_000,
        cpu_ns: 1_000_000_000,
        cpu_ns_min: 1_000_000_000,
        secs: 1.0,
        bare: Some(Bare { program_ns: 150.0, xdp_tx_ns: 90.0, room_ns: 120.0 }),
    };
    let starved = Slice { runs: 0, prog_runs: 0, prog_ns: 0, cpu_ns: 0, cpu_ns_min: 0, ..ok };
    let no_cpu = Slice { runs: 10, prog_ns: 100, prog_runs: 10, cpu_ns: 0, cpu_ns_min: 0, bare: None, ..ok };
    assert_eq!(starved.mpps_per_core(), None);
    assert_eq!(no_cpu.mpps_per_core(), None);
    let r = PpsResult::from_slices(Subject::XdpTxCeiling, 1, &[ok, starved, ok, no_cpu], 0.0, 0.0, 0, None);
    assert_eq!(r.mpps_per_core, Some(3.0), "the median of the measured slices, not dragged down by zeros");
    assert_eq!(r.measured_slices().len(), 2);
    let none = PpsResult::from_slices(Subject::XdpTxCeiling, 1, &[starved], 0.0, 0.0, 0, None);
    assert_eq!((none.mpps_per_core, none.core_ns_per_packet), (None, None));
    // Times with no device: differences on the same frames; a slice without them
    // is left out of the medians too.
    assert_eq!((r.bare_ns_per_packet, r.over_xdp_tx_ns), (Some(150.0), Some(60.0)));
    assert_eq!((r.room_ns, r.beyond_room_ns, r.bare_slices), (Some(30.0), Some(30.0), 3));
    assert_eq!(r.over_xdp_tx_spread_ns, Some(0.0));
    // Medians of the parts: over 60, room 20, so the rest is 40 (the median of the
    // slices' own rests would be 30, and the parts would not add up).
    let timed = |p, r| Slice { bare: Some(Bare { program_ns: 90.0 + p, xdp_tx_ns: 90.0, room_ns: 90.0 + r }), ..ok };
    let r = PpsResult::from_slices(
        Subject::XdpTxCeiling,
        1,
        &[timed(60.0, 30.0), timed(70.0, 10.0), timed(50.0, 20.0)],
        0.0,
        0.0,
        0,
        None,
    );
    assert_eq!((r.over_xdp_tx_ns, r.room_ns, r.beyond_room_ns), (Some(60.0), Some(20.0), Some(40.0)));
    assert_eq!(r.over_xdp_tx_spread_ns, Some(20.0));
}

#[test]
fn a_two_core_slice_where_one_thread_did_the_work_is_left_out() {
    // Both NAPI threads: 0.6 s and 0.4 s of CPU for 3 M packets: 3 Mpps per core.
    let two = Slice {
        runs: 3_000_000,
        prog_ns: 0,
        prog_runs: 0,
        cpu_ns: 1_000_000_000,
        cpu_ns_min: 400_000_000,
        secs: 1.0,
        bare: None,
    };
    assert_eq!(two.mpps_per_core(), Some(3.0));
    // One thread did 0.9 s, the other 0.1 s: that measured one core, not two.
    let lopsided = Slice { cpu_ns_min: 100_000_000, ..two };
    assert_eq!(lopsided.mpps_per_core(), None);
    let r = PpsResult::from_slices(Subject::TwoCoreBalancer(HintMode::Off), 100, &[two, lopsided], 0.0, 0.0, 0, None);
    assert_eq!((r.cores, r.measured_slices().len()), (2, 1));
    assert_eq!(Subject::TwoCoreBalancer(HintMode::DestTag).on_one_core(), Some(Subject::Balancer(HintMode::DestTag)));
    assert_eq!(Subject::TwoCoreBalancer(HintMode::Off).ceiling(), Subject::TwoCoreCeiling);
    assert!(!splits_in_two(1) && !splits_in_two(101) && splits_in_two(100) && splits_in_two(1_000_000));
}

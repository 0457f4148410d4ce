//! The stall probe runs the real cyclictest (rt-tests) and reads its histogram. Root:
//! cyclictest's SCHED_FIFO thread needs it.

use std::time::Duration;

use netlane_lab::engines::stalls;

#[test]
fn cyclictest_measures_one_wake_up_per_interval_on_the_cpu_asked() {
    if !netlane_testkit::privileged("cyclictest_measures_one_wake_up_per_interval_on_the_cpu_asked") {
        return;
    }
    let s =
        stalls::probe(&netlane_lab::host::ThisMachine, 0, Duration::from_secs(1), Duration::from_millis(1)).unwrap();
    // One wake-up a millisecond for a second, less those a stall skipped.
    assert!((500..=1001).contains(&s.samples), "{s:?}");
    assert!(s.max_us >= s.p999_us && s.max_us > 0, "{s:?}");
    assert_eq!(s.cpu, 0);
    assert!(s.long_us.iter().all(|&l| l >= stalls::LONG_US && l <= s.max_us.max(20_000)), "{s:?}");
    assert!((0.0..1.0).contains(&s.delayed_share(1000)), "{s:?}");
    // A CPU that does not exist is refused by cyclictest, and said so.
    let err = stalls::probe(&netlane_lab::host::ThisMachine, 4096, Duration::from_secs(1), Duration::from_millis(1))
        .unwrap_err();
    assert!(err.to_string().starts_with("cyclictest"), "{err}");
}

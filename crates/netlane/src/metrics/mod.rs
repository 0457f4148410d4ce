//! Measurement: CPU time (per thread, per process, system-wide), HDR histograms,
//! units for rates, sizes and durations, counters declared once ([`crate::counters`]), and the
//! Prometheus text format with its endpoint.
//!
//! CPU cost is reported two ways because receive work does not stay put: softirq
//! processing runs on whichever CPU raised it, and is charged to whatever task was
//! running there. [`cpu::thread_cpu`] says what one thread paid; [`cpu::SystemCpu`]
//! (from `/proc/stat`) says what the whole machine paid over the same interval.
//! [`kstat`] counts the kernel's events over an interval: context switches, interrupts
//! (inter-processor ones apart), softirqs.

pub mod cpu;
pub mod hist;
pub mod kstat;
pub mod prom;
pub mod run_status;
pub mod sla;
pub mod units;

pub use cpu::{CpuTime, SystemCpu, SystemCpuDelta};
pub use hist::{Hist, Summary};
pub use netlane_counters::CounterSet;

/// Median of the finite values (NaN for none).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

//! Measurement: CPU time (per thread, per process, system-wide), HDR histograms, and
//! units for rates, sizes and durations.
//!
//! CPU cost is reported two ways because receive work does not stay put: softirq
//! processing runs on whichever CPU raised it, and is charged to whatever task was
//! running there. [`cpu::thread_cpu`] says what one thread paid; [`cpu::SystemCpu`]
//! (from `/proc/stat`) says what the whole machine paid over the same interval.

pub mod cpu;
pub mod hist;
pub mod units;

pub use cpu::{CpuTime, SystemCpu, SystemCpuDelta};
pub use hist::{Hist, Summary};

//! Engines that exist only to measure.

pub mod bulk;
pub mod lb_pps;
pub mod stalls;

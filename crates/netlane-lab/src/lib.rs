//! netlane's lab: it builds its own network, runs every mechanism side by side, and
//! writes a report.
//!
//! - [`scenarios`]: the scenario registry; each scenario's options, plan, run,
//!   statistics and target checks;
//! - [`engines`]: what exists only to measure: the bulk-transfer engine
//!   ([`engines::bulk`]) and the load balancer's packets-per-second harness
//!   ([`engines::lb_pps`]);
//! - [`report`]: the report model (numbers, not markup) and its renderers;
//! - [`lab`]: `netlane lab`, every scenario in one run.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod engines;
pub mod lab;
pub mod report;
pub mod scenarios;

//! netlane's lab: it builds its own network, runs every mechanism side by side, and
//! writes a report whose verdicts cannot pass on a run that did nothing.
//!
//! - [`scenarios`]: the registry; each scenario's options, plan, run, statistics and
//!   target checks, one module each;
//! - [`engines`]: what exists only to measure: the bulk-transfer engine
//!   ([`engines::bulk`]) and the load balancer's packets-per-second harness
//!   ([`engines::lb_pps`]);
//! - [`verdict`]: target checks (met, within noise, missed, invalid) over paired
//!   samples, and the quantities that refuse degenerate inputs;
//! - [`runner`]: the one runner: rounds and their rotation, progress, run records;
//! - [`stats`]: medians, spread, collapsed repeats, round order;
//! - [`report`]: the report directory: the HTML page with SVG charts beside the JSON and
//!   CSV of `netlane_report` (the model and its writers);
//! - [`machine`]: the machine's state around a run; [`plan`]: which CPUs each role
//!   of a scenario runs on;
//! - [`progress`]: k/N and ETA on a terminal or as lines;
//! - [`host`]: where a role runs (a namespace, this machine, another over SSH) and a
//!   role as a process; [`testbed`]: the machines a lab across hosts runs on;
//! - [`lab`]: `netlane lab`.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod engines;
pub mod host;
pub mod lab;
pub mod machine;
pub mod plan;
pub mod progress;
pub mod report;
pub mod runner;
pub mod scenarios;
pub mod stats;
pub mod testbed;
pub mod verdict;

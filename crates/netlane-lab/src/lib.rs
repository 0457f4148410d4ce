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
//! - [`stats`]: medians, spread, collapsed repeats, round order;
//! - [`report`]: the report model (numbers, not markup) and its renderers (terminal,
//!   JSON, CSV, HTML with SVG charts), and [`schema`]: its JSON Schema;
//! - [`machine`]: provenance and the machine's state around a run;
//! - [`progress`]: k/N and ETA on a terminal or as lines;
//! - [`lab`]: `netlane lab`.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod engines;
pub mod lab;
pub mod machine;
pub mod progress;
pub mod report;
pub mod scenarios;
pub mod stats;
pub mod verdict;

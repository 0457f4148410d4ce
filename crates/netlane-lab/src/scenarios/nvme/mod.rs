//! `nvme`: the NVMe/TCP talk's experiments, host and target on their own CPUs and (by
//! default) their own network namespaces joined by a veth pair.
//!
//! - QD1 4 KiB random-read latency through the I/O worker, with direct send, and with
//!   poll queues;
//! - QD32 4 KiB random-read IOPS per host core with one send per command, with batching,
//!   and with i10 caravans;
//! - the mixed workload: 16 QD1 4 KiB readers and one QD32 1 MiB writer, on one shared
//!   queue map and on separate read/write maps (at least five rounds: its p99.99 ratio
//!   swings between runs);
//! - queue-CPU affinity: QD1 latency and QD32 IOPS per host core with each queue's I/O
//!   worker on the submitting CPU (aligned) and on the other one (crossed);
//! - caravans against plain batching over request sizes 512 B..128 KiB and one or four
//!   jobs (a 512-byte-block namespace).
//!
//! Every mode runs once per round (rotating order); checks pair two modes per round.

mod checks;
mod measure;
mod options;
mod plan;
mod report;
mod role;
#[cfg(test)]
mod tests;

use std::time::Duration;

use anyhow::{Context, Result};

use crate::progress::Progress;
use crate::runner::Runner;
use crate::scenarios::Scenario;
use netlane_report::ScenarioReport;
use netlane_report::options::OptionList;

use self::measure::perf;
use self::options::size_name;
pub use self::options::{NvmeBenchArgs, Part};
pub use self::report::perf_table;
pub use self::role::{perf_args, perf_report, perf_spec};

impl Scenario for NvmeBenchArgs {
    fn name(&self) -> &'static str {
        "nvme"
    }

    fn options(&self) -> OptionList {
        let parts: Vec<String> = self.parts.iter().map(|p| p.name()).collect();
        OptionList::new()
            .text("path", self.path.name())
            .int("mtu", u64::from(self.mtu))
            .words("parts", &parts)
            .duration("time", self.time)
            .duration("ramp", self.ramp)
            .int("repeat", u64::from(self.repeat))
            .int("host-cpu", self.host_cpu as u64)
            .int("target-cpu", self.target_cpu() as u64)
            .size("ns-size", self.ns_size)
            .words("caravan-sizes", &self.caravan_sizes.iter().map(|b| size_name(*b)).collect::<Vec<_>>())
    }

    fn validate(&self) -> Result<()> {
        self.validate_options()
    }

    fn runs(&self) -> usize {
        self.labels().iter().map(|(p, _)| self.rounds(*p) as usize).sum()
    }

    fn run(&self, progress: &dyn Progress) -> Result<ScenarioReport> {
        self.validate()?;
        let hosts = self.network()?;
        let (target, addr) = self.start_target(hosts.as_ref())?;
        let modes = self.modes(addr, target.pid().context("the target's process ID")?)?;
        let mut runner = Runner::new(progress);
        let all = runner.rounds(
            modes.len(),
            |i| self.rounds(modes[i].part),
            |runner, i, turn| {
                let m = &modes[i];
                runner.measure(turn, &m.what(), |label| perf(hosts.as_ref(), &m.opts, label))
            },
        )?;
        // Every round is measured by now: a target that stops badly is said, not a
        // reason to lose them.
        if let Err(e) = target.stop(Duration::from_secs(5)) {
            progress.say(&format!("nvme: the target did not stop cleanly: {e:#}"));
        }
        Ok(self.report(&modes, &all, runner.into_records()))
    }
}

//! `udp-bulk`: UDP bulk transfer in every mode, side by side with TCP and with the
//! kernel's own selftest sender, over veth between namespaces (or loopback).
//!
//! Every mode (and each paced rate, and each side of the comparison with
//! `udpgso_bench_tx`) is an arm; `--repeat` rounds run every arm once, in a rotating
//! order. Checks compare two arms round by round; the tables show medians of the
//! rounds, measured at the receiver where it counts (bytes that arrived, the rate they
//! arrived at).
//!
//! The folder: `options.rs` (modes and what can be asked), `plan` (the arms a round
//! runs), `checks` (the targets as one list), `report` (its sections).

mod checks;
mod options;
mod plan;
mod report;
#[cfg(test)]
mod tests;

use anyhow::{Result, bail};
use netlane_report::ScenarioReport;
use netlane_report::options::{OptionList, quantum_name};

use super::Scenario;
use super::net::{run_one, summary_line};
use crate::engines::bulk::{BulkResult, BulkRun};
use crate::progress::Progress;
use crate::runner::{Measured, Runner};

pub use self::options::{Mode, UdpBulkArgs};

impl Scenario for UdpBulkArgs {
    fn name(&self) -> &'static str {
        "udp-bulk"
    }

    fn options(&self) -> OptionList {
        let modes: Vec<String> = self.modes.iter().map(|m| m.name()).collect();
        let o = self
            .net
            .options()
            .words("modes", &modes)
            .duration("time", self.time)
            .int("repeat", u64::from(self.repeat))
            .int("gso-size", self.gso_size as u64)
            .int("segments", self.segments() as u64)
            .rates("rates", &self.rates)
            .text("quantum", quantum_name(self.quantum))
            .text("verify", crate::scenarios::value_name(&self.verify))
            .flag("no-selftest", self.no_selftest);
        match self.selftest_binary() {
            Some(p) => o.text("selftest", p.display().to_string()),
            None => o,
        }
    }

    fn validate(&self) -> Result<()> {
        self.net.validate()?;
        if self.modes.is_empty() {
            bail!("--modes: no modes given");
        }
        if let Some(dup) = self.modes.iter().enumerate().find(|(i, m)| self.modes[..*i].contains(m)) {
            bail!("--modes: {} is listed twice", dup.1.name());
        }
        if self.modes.contains(&Mode::Paced) && self.rates.is_empty() {
            bail!("the paced mode needs at least one --rates value");
        }
        let mtu = Some(self.net.path_mtu());
        for arm in self.arms() {
            arm.run.validate(mtu).map_err(|e| anyhow::Error::new(e).context(arm.label.clone()))?;
        }
        Ok(())
    }

    fn runs(&self) -> usize {
        self.arms().len() * self.repeat as usize
    }

    fn run(&self, progress: &dyn Progress) -> Result<ScenarioReport> {
        self.validate()?;
        let arms = self.arms();
        let hosts = self.net.build("udp-bulk")?;
        let mut runner = Runner::new(progress);
        let results = runner.rounds(
            arms.len(),
            |_| self.repeat,
            |runner, a, turn| {
                let arm = &arms[a];
                let run = BulkRun { run_id: runner.next_index(), ..arm.run.clone() };
                runner.measure(turn, &arm.label, |label| run_one(&hosts, label, &run))
            },
        )?;
        let records = runner.into_records();
        Ok(self.report(&arms, &results, records))
    }
}

/// A bulk run as the runner shows and records it.
impl Measured for BulkResult {
    fn summary(&self) -> String {
        summary_line(self)
    }

    fn figures(&self) -> Vec<(&'static str, Option<f64>)> {
        vec![
            ("tx_mb_per_s", self.tx_rate().ok().map(|v| v / 1e6)),
            ("rx_mb_per_s", self.rx_rate().ok().map(|v| v / 1e6)),
            ("rx_kpps", self.rx_pps().ok().map(|v| v / 1e3)),
            ("tx_cpu_s_per_gb", self.tx_cpu_s_per_gb().ok()),
            ("tx_cpu_s_per_gb_delivered", self.tx_cpu_s_per_gb_delivered().ok()),
            ("rx_cpu_s_per_gb", self.rx_cpu_s_per_gb().ok()),
            ("system_cpu_s_per_gb", self.system_cpu_s_per_gb().ok()),
            ("tx_calls_per_datagram", self.tx_calls_per_datagram().ok()),
            ("rx_calls_per_datagram", self.rx_calls_per_datagram().ok()),
            ("loss_pct", self.loss().ok().map(|l| l * 100.0)),
            ("pacing_accuracy_rx_pct", self.rx_pacing_accuracy().and_then(Result::ok).map(|a| a * 100.0)),
        ]
    }

    fn path(&self) -> Vec<String> {
        self.tx.path.clone()
    }
}

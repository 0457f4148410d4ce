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
//!   jobs (a 512-byte-block namespace);
//! - polling: QD1 completions taken in by interrupts (moderated or not), by spinning,
//!   and by the kernel's busy polling (`polling.rs`);
//! - lanes: the target's connections on the reactor owning their receive queue against
//!   dealt to its reactors in turn, from four hosts over a two-queue veth (`lanes.rs`).
//!
//! Every mode runs once per round (rotating order); checks pair two modes per round.

mod agents;
mod checks;
mod lanes;
mod measure;
mod options;
mod plan;
mod polling;
mod report;
mod role;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::progress::Progress;
use crate::runner::Runner;
use crate::scenarios::Scenario;
use netlane_report::ScenarioReport;
use netlane_report::options::OptionList;

pub use self::agents::{NvmeAgent, run_perf};
use self::measure::{NvmeSite, TargetTsoOff, perf};
use self::options::size_name;
pub use self::options::{NvmeBenchArgs, Part};
use self::plan::{Mode, TargetCpu};
pub use self::report::perf_table;
pub use self::role::{perf_agent_spec, perf_args, perf_report, perf_spec};
use crate::host::RoleProcess;
use crate::testbed::{Needs, Testbed};

impl Scenario for NvmeBenchArgs {
    fn name(&self) -> &'static str {
        "nvme"
    }

    fn options(&self) -> OptionList {
        let parts: Vec<String> = self.parts.iter().map(|p| p.name()).collect();
        self.on
            .listed(OptionList::new())
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
        self.validate_options()?;
        if let Some(t) = self.on.open()? {
            self.check_testbed(&t)?;
        }
        Ok(())
    }

    fn runs(&self) -> usize {
        self.labels().iter().map(|(p, _)| self.rounds(*p) as usize).sum()
    }

    fn run(&self, progress: &dyn Progress) -> Result<ScenarioReport> {
        self.validate()?;
        if let Some(t) = self.on.open()? {
            return self.run_on_testbed(&t, progress);
        }
        let hosts = self.network()?;
        let site = NvmeSite::here(hosts.as_ref());
        let (target, addr) = self.start_target(&site)?;
        // The target end's NAPI threads do the target's receive work: counted with it.
        let threads = match &hosts {
            Some(h) => {
                let ifindex = h.rx_index;
                let found = h.rx.run(move || -> Result<Vec<u32>> {
                    let napis = netlane::topology::netdev::Netdev::open()?.napis(ifindex)?;
                    Ok(napis.into_iter().filter_map(|n| n.pid).collect())
                });
                // A kernel without napi-get: the target's process alone, and said.
                found.map_err(anyhow::Error::from).and_then(|r| r).unwrap_or_else(|e| {
                    progress.say(&format!("nvme: the target end's NAPI threads are not counted: {e:#}"));
                    Vec::new()
                })
            }
            None => Vec::new(),
        };
        let cpu = TargetCpu { pid: Some(target.pid().context("the target's process ID")?), threads };
        let modes = self.modes(addr, &cpu, self.target_cpu())?;
        let lanes = self.parts.contains(&Part::Lanes) && self.lanes_here();
        self.run_modes(progress, &site, target, &modes, lanes)
    }
}

impl NvmeBenchArgs {
    /// Every mode's rounds against `target`, then the target stopped; then, with `lanes`,
    /// the lanes part on a network and targets of its own (its failure is reported as
    /// such, the other parts' rounds kept).
    fn run_modes(
        &self,
        progress: &dyn Progress,
        site: &NvmeSite<'_>,
        target: RoleProcess,
        modes: &[Mode],
        lanes: bool,
    ) -> Result<ScenarioReport> {
        let mut runner = Runner::new(progress);
        let all = runner.rounds(
            modes.len(),
            |i| self.rounds(modes[i].part),
            |runner, i, turn| {
                let m = &modes[i];
                runner.measure(turn, &m.what(), |label| {
                    // Held for the run: the target's segments then take the host's NAPI.
                    let _tso = match (m.part, site.veth) {
                        (Part::Polling, Some(h)) => Some(TargetTsoOff::hold(h)?),
                        _ => None,
                    };
                    perf(site, &m.opts, label)
                })
            },
        )?;
        // Every round is measured by now: a target that stops badly is said, not a
        // reason to lose them.
        if let Err(e) = target.stop(Duration::from_secs(5)) {
            progress.say(&format!("nvme: the target did not stop cleanly: {e:#}"));
        }
        let lanes = lanes.then(|| {
            self.lanes_part(&mut runner).map_err(|e| {
                progress.say(&format!("nvme: the lanes part failed: {e:#}"));
                format!("{e:#}")
            })
        });
        Ok(self.report(modes, &all, lanes.as_ref(), runner.into_records()))
    }

    /// The target on the testbed's server host, nvme perf on its first client host. The
    /// affinity part crosses to another CPU of that host (left out when it has one).
    fn run_on_testbed(&self, t: &Testbed, progress: &dyn Progress) -> Result<ScenarioReport> {
        let first = t.clients.first().context("the testbed has no client host")?;
        let site = NvmeSite {
            target: t.server.host(),
            host: first.host(),
            listen: SocketAddr::new(t.server_addr(), netlane_nvme::DEFAULT_PORT),
            target_cpu_across: Some(self.target_cpu()),
            veth: None,
        };
        let crossed = first.cpus()?.as_slice().iter().copied().find(|c| *c != self.host_cpu);
        let mut this = self.clone();
        let mut notes = vec![format!(
            "Ran on a testbed: the target on {} at {}, nvme perf on {}{}. The target's CPU per I/O is its CPU's \
             busy time there over each measured window (the target's threads and whatever the kernel ran on that \
             CPU: its network receive and transmit work), not the target process's time as on one machine.",
            t.server.host().name(),
            t.server_addr(),
            first.host().name(),
            if t.clients.len() > 1 { " (one NVMe host per run: the other client hosts stay idle)" } else { "" }
        )];
        if crossed.is_none() && this.parts.contains(&Part::Affinity) {
            this.parts.retain(|p| *p != Part::Affinity);
            notes.push(format!(
                "Left out on this testbed: the affinity part ({} has no CPU but {} to cross to).",
                first.label(),
                self.host_cpu
            ));
            if this.parts.is_empty() {
                bail!("nothing to run on this testbed: {}", notes[1]);
            }
        }
        let nic = t.hold_nic()?;
        let (target, addr) = this.start_target(&site)?;
        let modes = this.modes(addr, &TargetCpu::default(), crossed.unwrap_or(self.host_cpu))?;
        let mut report = this.run_modes(progress, &site, target, &modes, false)?;
        report.notes.extend(nic.finish());
        report.notes.splice(0..0, notes);
        report.cpu_plan = vec![
            netlane_report::RoleCpus {
                role: format!("target on {}", t.server.host().name()),
                cpus: vec![self.target_cpu()],
                beside: None,
            },
            netlane_report::RoleCpus {
                role: format!("host on {}", first.host().name()),
                cpus: vec![self.host_cpu],
                beside: None,
            },
        ];
        Ok(report)
    }

    /// Refuses a testbed that lacks --target-cpu on its server host or --host-cpu on its
    /// first client host.
    fn check_testbed(&self, t: &Testbed) -> Result<()> {
        t.check(&Needs::default(), &Needs::default())?;
        t.check_server_cpu(self.target_cpu())?;
        let first = t.clients.first().context("the testbed has no client host")?;
        let cpus = first.cpus()?;
        if !cpus.as_slice().contains(&self.host_cpu) {
            bail!(
                "the NVMe host's CPU {} (--host-cpu, or the first of the first client's `cpus`): {} has CPUs {cpus}",
                self.host_cpu,
                first.label()
            );
        }
        Ok(())
    }
}

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
mod flows;
mod options;
mod plan;
mod report;
#[cfg(test)]
mod tests;

use anyhow::{Context, Result, bail};
use netlane_report::ScenarioReport;
use netlane_report::options::{OptionList, quantum_name};

use super::Scenario;
use super::net::{NetArgs, Placement, endpoints, run_one, summary_line};
use crate::engines::bulk::{BulkResult, BulkRun, Endpoints};
use crate::progress::Progress;
use crate::runner::{Measured, Runner};
use crate::testbed::{Needs, Testbed};

pub use self::options::{Mode, QUICK_MODES, UdpBulkArgs};
use self::plan::Role;

impl Scenario for UdpBulkArgs {
    fn name(&self) -> &'static str {
        "udp-bulk"
    }

    fn options(&self) -> OptionList {
        let modes: Vec<String> = self.modes.iter().map(|m| m.name()).collect();
        // On a testbed the path is the testbed's network: no veth, MTU or NAPI of ours.
        let net = match self.on.testbed {
            Some(_) => OptionList::new()
                .flag("ipv6", self.net.ipv6)
                .int("tx-cpu", self.net.tx_cpu as u64)
                .int("rx-cpu", self.net.rx_cpu() as u64),
            None => self.net.options(),
        };
        let o = self
            .on
            .listed(net)
            .words("modes", &modes)
            .duration("time", self.time)
            .int("repeat", u64::from(self.repeat))
            .int("gso-size", self.gso_size as u64)
            .int("segments", self.segments() as u64)
            .rates("rates", &self.rates)
            .size("cold-span", self.cold_span as u64)
            .text("quantum", quantum_name(self.quantum))
            .words("flows", &self.flows.iter().filter(|n| **n > 0).map(u32::to_string).collect::<Vec<_>>())
            .rate("flows-rate", self.flows_rate)
            .words("flow-mtus", &self.flow_mtus.iter().map(u32::to_string).collect::<Vec<_>>())
            .text("verify", crate::scenarios::value_name(&self.verify))
            .flag("no-selftest", self.no_selftest);
        match self.selftest_binary() {
            Some(p) => o.text("selftest", p.display().to_string()),
            None => o,
        }
    }

    fn validate(&self) -> Result<()> {
        match self.on.open()? {
            Some(t) => self.check_testbed(&t)?,
            None => self.net.validate()?,
        }
        if self.modes.is_empty() {
            bail!("--modes: no modes given");
        }
        if let Some(dup) = self.modes.iter().enumerate().find(|(i, m)| self.modes[..*i].contains(m)) {
            bail!("--modes: {} is listed twice", dup.1.name());
        }
        if self.modes.contains(&Mode::Paced) && self.rates.is_empty() {
            bail!("the paced mode needs at least one --rates value");
        }
        // A testbed's path MTU is its network's (checked by the kernel, not here).
        let mtu = self.on.testbed.is_none().then(|| self.net.path_mtu());
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
        if let Some(t) = self.on.open()? {
            return self.run_on_testbed(&t, progress);
        }
        let hosts = self.net.build("udp-bulk")?;
        self.rounds(progress, endpoints(&hosts))
    }
}

impl UdpBulkArgs {
    /// Every arm's rounds between `ends`.
    fn rounds(&self, progress: &dyn Progress, ends: Endpoints<'_>) -> Result<ScenarioReport> {
        let arms = self.arms();
        let mut runner = Runner::new(progress);
        let results = runner.rounds(
            arms.len(),
            |_| self.repeat,
            |runner, a, turn| {
                let arm = &arms[a];
                let run = BulkRun { run_id: runner.next_index(), ..arm.run.clone() };
                runner.measure(turn, &arm.label, |label| {
                    // The device's offloads as the arm has them, for its run only.
                    let _segmentation = match (arm.role, ends) {
                        (Role::Main(m, _), Endpoints::Veth(hosts)) => Some(
                            hosts
                                .tx_segmentation(m.segmentation())
                                .with_context(|| format!("{label}: segmentation {}", m.segmentation().name()))?,
                        ),
                        _ => None,
                    };
                    run_one(ends, label, &run)
                })
            },
        )?;
        let records = runner.into_records();
        Ok(self.report(&arms, &results, records))
    }

    /// The sender on the testbed's server host, the receiver on its first client host.
    fn run_on_testbed(&self, t: &Testbed, progress: &dyn Progress) -> Result<ScenarioReport> {
        let (ends, receiver, rx_addr) = testbed_ends(t)?;
        let nic = t.hold_nic()?;
        let mut report = self.rounds(progress, ends)?;
        report.notes.extend(nic.finish());
        report.notes.insert(
            0,
            format!(
                "Ran on a testbed: the sender on {}, the receiver on {} at {rx_addr}; \"machine CPU\" is both hosts' \
                 together. The kernel's udpgso_bench_tx is not compared here.",
                t.server.host().name(),
                receiver.host().name()
            ),
        );
        report.cpu_plan = ends_plan(t, receiver, &self.net);
        Ok(report)
    }

    fn check_testbed(&self, t: &Testbed) -> Result<()> {
        t.check(&Needs::default(), &Needs::default())?;
        check_ends(&self.net, t)
    }
}

/// The ends on a testbed: the sender on the server host, the receiver on the first
/// client host at its `addr` (that host and address returned too), at the MTU of the
/// server's interface where the file names one.
pub(crate) fn testbed_ends(t: &Testbed) -> Result<(Endpoints<'_>, &crate::testbed::TestbedHost, std::net::IpAddr)> {
    let (receiver, rx_addr) = receiver(t)?;
    let mtu = match &t.server.spec.iface {
        Some(iface) => {
            let text = t.server.host().read_file(&format!("/sys/class/net/{iface}/mtu"))?;
            Some(text.trim().parse::<u32>().with_context(|| format!("the MTU of {iface} on {}", t.server.label()))?)
        }
        None => None,
    };
    let (tx, rx) = (t.server.host(), receiver.host());
    Ok((Endpoints::Hosts { tx, rx, rx_addr, mtu, one_machine: Endpoints::one_machine(tx, rx) }, receiver, rx_addr))
}

/// Where the ends ran on a testbed: the sender on the server host, the receiver on
/// `receiver`, each on its CPU of `net`.
pub(crate) fn ends_plan(
    t: &Testbed,
    receiver: &crate::testbed::TestbedHost,
    net: &NetArgs,
) -> Vec<netlane_report::RoleCpus> {
    let role = |r: &str, h: &crate::testbed::TestbedHost, cpu: usize| netlane_report::RoleCpus {
        role: format!("{r} on {}", h.host().name()),
        cpus: vec![cpu],
        beside: None,
    };
    vec![role("sender", &t.server, net.tx_cpu), role("receiver", receiver, net.rx_cpu())]
}

/// Refuses a testbed whose hosts lack the ends' CPUs or whose first client host has no
/// address, and ends that are threads (another machine's end is a process).
pub(crate) fn check_ends(net: &NetArgs, t: &Testbed) -> Result<()> {
    if net.ends == Placement::Thread {
        bail!("--ends thread: on a testbed each end runs as a process on its host");
    }
    let (receiver, addr) = receiver(t)?;
    if addr.is_ipv6() != net.ipv6 {
        bail!(
            "the receiver's address {addr} (the first client's `addr`) is not {}",
            if net.ipv6 { "IPv6 (-6 was given)" } else { "IPv4 (give -6 for IPv6)" }
        );
    }
    let cpus = t.server.cpus()?;
    if !cpus.as_slice().contains(&net.tx_cpu) {
        bail!("the sender's CPU {} (--tx-cpu): {} has CPUs {cpus}", net.tx_cpu, t.server.label());
    }
    let cpus = receiver.cpus()?;
    if !cpus.as_slice().contains(&net.rx_cpu()) {
        bail!("the receiver's CPU {} (--rx-cpu): {} has CPUs {cpus}", net.rx_cpu(), receiver.label());
    }
    Ok(())
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
            ("receiving_cpu_s_per_gb", self.receiving_cpu_s_per_gb().ok()),
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

/// The receiver's host (the testbed's first client) and its address.
fn receiver(t: &Testbed) -> Result<(&crate::testbed::TestbedHost, std::net::IpAddr)> {
    let first = t.clients.first().context("the testbed has no client host")?;
    let addr = first.spec.addr.with_context(|| {
        format!("{}: no `addr` (udp-bulk receives there, at the address the server reaches it at)", first.label())
    })?;
    Ok((first, addr))
}

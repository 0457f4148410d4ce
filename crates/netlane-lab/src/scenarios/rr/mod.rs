//! `rr`: the datagram request/response talk's experiments. One server thread on its own
//! CPU in one namespace, a closed-loop client population on the other CPU in another,
//! joined by a veth pair.
//!
//! - paths: throughput, latency and the server's CPU at 64 clients on each receive path
//!   (`recvfrom`, `recvmmsg`, TPACKET_V2, TPACKET_V3, AF_XDP); and, where the clients
//!   can have two CPUs beside the server's, TPACKET_V2's rate against recvfrom's (the
//!   talk: about 2x) with a note on what held each;
//! - blocks: TPACKET_V3 at the ten block sizes the adaptive ring chooses from (4 to 128
//!   KiB), 16 to 128 clients without a pause (the talk's sweep) and pausing between
//!   requests: throughput and the server CPU's idle time (the talk: a block of half the
//!   burst keeps a third of the CPU idle for a tenth less throughput), and the adaptive
//!   block size against the best fixed block at each;
//! - wall: clients 1, 2, 4 ... 128 on each path, throughput against latency;
//! - large: 8 KiB responses IP-fragmented at MTU 1500, whole at MTU 9000, and as GSO
//!   segments read with GRO (the talk: jumbo frames moved the wall from ~24 K to ~34 K
//!   responses/s and cut latency from ~2700 to ~1800 us);
//! - tx: what writing whole frames costs (headers, checksums and IP fragments built by
//!   netlane, sent through a PF_PACKET transmit ring or the AF_XDP socket's TX ring)
//!   against the UDP socket, with the receive path held at AF_XDP;
//! - pace: TPACKET_V3 hands the server a block of requests and it answers them in one
//!   burst; open-loop clients count how many of them one response wake-up finds ready
//!   (a herd), unpaced against responses paced by `netlane::pace` (the talk's Q&A);
//! - busy: recvmmsg and AF_XDP, each without and with busy polling (the ADQ talk's
//!   receive alignment for the datagram service): latency, the server CPU, and how many
//!   datagrams the server took from its queue by polling, with the NAPI id it polled;
//! - queues: every path on two receive queues, the clients' flows spread over them by
//!   hash, AF_XDP with a socket per queue, each of which must serve its share.
//!
//! Every mode runs once per round (rotating order); checks pair two modes per round.
//! Throughput and latency are measured by the clients, at the receiving side.

mod agents;
mod busy;
mod checks;
mod large;
mod measure;
mod options;
mod plan;
mod queues;
mod report;
mod role;
mod tcp;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;

use anyhow::{Context, Result, bail};
use netlane::topology::TwoHosts;

use crate::host::Agent;
use crate::progress::Progress;
use crate::runner::Runner;
use crate::scenarios::Scenario;
use crate::testbed::{Needs, Testbed};
use netlane_report::ScenarioReport;
use netlane_report::options::OptionList;

pub use self::agents::{RrAgent, run_clients};
use self::checks::*;
pub use self::measure::RrRun;
use self::measure::RrSite;
pub use self::options::{Part, RrBenchArgs};
use self::plan::*;
pub use self::plan::{BLOCK_CLIENTS, WALL_CLIENTS, v3_block_for, v3_request_footprint};
pub use self::role::{clients_args, clients_report, clients_spec, serve_args, serve_spec, server_stats};

impl Scenario for RrBenchArgs {
    fn name(&self) -> &'static str {
        "rr"
    }

    fn options(&self) -> OptionList {
        let parts: Vec<String> = self.parts.iter().map(|p| p.name()).collect();
        let paths: Vec<&str> = self.paths.iter().map(|p| p.name()).collect();
        let o = self
            .on
            .listed(OptionList::new())
            .words("parts", &parts)
            .words("paths", &paths)
            .int("clients", self.clients as u64)
            .int("request", self.request as u64)
            .int("response", self.response as u64)
            .duration("think", self.think)
            .words(
                "block-thinks",
                &self.block_thinks.iter().map(|t| netlane::metrics::units::format_duration(*t)).collect::<Vec<_>>(),
            )
            .words("block-sizes", &self.block_sizes.iter().map(|b| format!("{}K", b / 1024)).collect::<Vec<_>>())
            .words("block-clients", &self.block_clients.iter().map(|c| c.to_string()).collect::<Vec<_>>())
            .int("block", u64::from(self.block))
            .int("retire-ms", u64::from(self.retire_ms))
            .int("pace-load", self.pace_load)
            .text("pace-headroom", self.pace_headroom.to_string())
            .text("busy-poll", self.busy_poll.to_string())
            .int("busy-load", self.busy_load)
            .duration("time", self.time)
            .duration("ramp", self.ramp)
            .int("repeat", u64::from(self.repeat))
            .int("server-cpu", self.server_cpu as u64)
            .int("client-cpu", self.client_cpu as u64)
            .int("mtu", u64::from(self.mtu));
        match &self.client_cpus {
            Some(c) => o.cpus("client-cpus", c),
            None => o,
        }
    }

    fn validate(&self) -> Result<()> {
        self.check_arguments()?;
        if let Some(t) = self.on.open()? {
            self.check_testbed(&t)?;
        } else if !netlane::topology::have_privileges() {
            bail!("the rr scenario builds two network namespaces and packet rings: run it as root");
        }
        // Every server configuration must be buildable before the first run.
        for m in self.modes("10.0.0.1:7070".parse().expect("a literal address")) {
            m.server.validate().with_context(|| format!("mode {}", m.label))?;
            m.clients.validate().with_context(|| format!("mode {}", m.label))?;
        }
        Ok(())
    }

    fn runs(&self) -> usize {
        self.labels().len() * self.repeat as usize
    }

    fn run(&self, progress: &dyn Progress) -> Result<ScenarioReport> {
        self.validate()?;
        if let Some(t) = self.on.open()? {
            return self.run_on_testbed(&t, progress);
        }
        let modes = self.modes(SocketAddr::new(TwoHosts::RX_V4.into(), PORT));
        let nets = self.networks(&modes)?;
        let sites: Vec<(Net, RrSite<'_>)> = nets.iter().map(|(net, h)| (*net, RrSite::two_hosts(h))).collect();
        let report = self.rounds(progress, &modes, &sites);
        drop(sites);
        drop(nets);
        report
    }
}

/// The server's port.
const PORT: u16 = 7070;

impl RrBenchArgs {
    /// Every mode's rounds on `sites` (one per MTU).
    fn rounds(&self, progress: &dyn Progress, modes: &[Mode], sites: &[(Net, RrSite<'_>)]) -> Result<ScenarioReport> {
        let mut runner = Runner::new(progress);
        let all = runner.rounds(
            modes.len(),
            |_| self.repeat,
            |runner, i, turn| {
                let m = &modes[i];
                runner.measure(turn, &m.what(), |label| self.run_one(sites, m, label))
            },
        )?;
        Ok(self.report(modes, &all, runner.into_records()))
    }

    /// The modes whose MTU is the server interface's, the server on the testbed's
    /// server host, the clients on its client hosts; the other modes named as left out.
    fn run_on_testbed(&self, t: &Testbed, progress: &dyn Progress) -> Result<ScenarioReport> {
        let mtu = match &t.server.spec.iface {
            Some(iface) => {
                let text = t.server.host().read_file(&format!("/sys/class/net/{iface}/mtu"))?;
                text.trim().parse::<u32>().with_context(|| format!("the MTU of {iface} on {}", t.server.label()))?
            }
            None => self.mtu,
        };
        let (mut modes, left): (Vec<Mode>, Vec<Mode>) =
            self.modes(SocketAddr::new(t.server_addr(), PORT)).into_iter().partition(|m| m.mtu == mtu);
        // The queues part's device is the lab's own two-queue veth.
        let queues_left = modes.iter().any(|m| m.part == Part::Queues);
        modes.retain(|m| m.part != Part::Queues);
        // Lanes own the receive queues of the server's interface (none named: no lanes).
        let iface = t.server.spec.iface.clone();
        let lanes_left = iface.is_none() && modes.iter().any(|m| m.server.lane_device.is_some());
        modes.retain(|m| iface.is_some() || m.server.lane_device.is_none());
        for m in modes.iter_mut().filter(|m| m.server.lane_device.is_some()) {
            m.server.lane_device = iface.clone();
        }
        if modes.is_empty() {
            bail!("no mode of the parts asked for runs at the MTU of the testbed server's interface ({mtu})");
        }
        let site = || RrSite {
            server: t.server.host(),
            clients: t.clients.iter().map(|c| Agent { host: c.host(), cpus: c.pinned() }).collect(),
        };
        let sites = [((mtu, 1), site()), ((mtu, LANE_QUEUES), site())];
        let nic = t.hold_nic()?;
        let mut report = self.rounds(progress, &modes, &sites)?;
        report.notes.extend(nic.finish());
        report.notes.insert(0, t.describe());
        if !left.is_empty() {
            let labels: Vec<String> = left.iter().map(|m| format!("{} (MTU {})", m.what(), m.mtu)).collect();
            let why = match &t.server.spec.iface {
                Some(iface) => format!("{iface} on the server has MTU {mtu}"),
                None => format!("the testbed names no server interface: MTU {mtu} is assumed"),
            };
            report.notes.insert(1, format!("Left out on this testbed ({why}): {}.", labels.join(", ")));
        }
        if queues_left {
            report.notes.insert(
                1,
                "Left out on this testbed: the queues part (it runs on the lab's own two-queue veth).".to_string(),
            );
        }
        if lanes_left {
            report.notes.insert(
                1,
                format!(
                    "Left out on this testbed: {BUSY_LANES} (the testbed names no server interface for its lanes)."
                ),
            );
        }
        report.cpu_plan = t.cpu_plan(&[self.server_cpu]);
        Ok(report)
    }

    /// Refuses a testbed whose server host is not root (packet rings, AF_XDP), has no
    /// BPF for the AF_XDP path, or lacks --server-cpu.
    fn check_testbed(&self, t: &Testbed) -> Result<()> {
        let bpf = self.paths.contains(&netlane_rr::server::PathKind::AfXdp);
        t.check(&Needs { root: true, bpf, ..Needs::default() }, &Needs::default())?;
        t.check_server_cpu(self.server_cpu)
    }
}

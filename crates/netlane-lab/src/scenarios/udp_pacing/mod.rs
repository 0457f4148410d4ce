//! `udp-pacing`: the LPC 2018 talk's pacing experiment. A token-bucket bottleneck (tbf,
//! 200 Mbit/s with a small queue by default) sits on the sender's link; a GSO sender
//! offers a fixed share of the bottleneck's rate, released every quantum. Wider quanta
//! mean fewer wake-ups and fuller GSO sends (less CPU) but bigger bursts (more loss at
//! the bottleneck). "unpaced" sends the same bytes as one burst.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use netlane::metrics::units::{Rate, format_duration};
use netlane::pace::Quantum;
use netlane::topology::QdiscStats;
use netlane::udp::GsoMode;
use netlane::udp::gso::GsoLimits;

use super::net::{NetArgs, PathKind, endpoints, run_one, summary_line};
use super::udp_bulk::{check_ends, ends_plan, testbed_ends};
use super::{Heading, Scenario, Sections, from_words};
use crate::engines::bulk::{BulkResult, BulkRun, Endpoints, Pacing, RxSpec, TxSource, TxSpec};
use crate::progress::Progress;
use crate::runner::{Measured, Runner};
use crate::stats::{self, median, repeat_flags, sig};
use crate::testbed::{Needs, Testbed, TestbedArgs};
use crate::verdict::{Measure, Spec, finite, paired, ratio};
use netlane_report::options::{OptionList, parse_positive_duration, parse_rate, parse_size};
use netlane_report::{
    Axis, Chart, ChartKind, Column, Flag, Point, Row, RunRecord, Scale, ScenarioReport, Series, Table, Unit, Value,
    format,
};
use serde::Serialize;

/// One point of the sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepPoint {
    /// No pacer: the same bytes as fast as the socket takes them.
    Unpaced,
    /// Releases every this many nanoseconds.
    Quantum(u64),
}

impl SweepPoint {
    /// As the command line writes it.
    pub fn name(&self) -> String {
        match self {
            SweepPoint::Unpaced => "unpaced".into(),
            SweepPoint::Quantum(ns) => format_duration(Duration::from_nanos(*ns)),
        }
    }

    /// As people read it.
    fn label(&self) -> String {
        match self {
            SweepPoint::Unpaced => "unpaced".into(),
            SweepPoint::Quantum(ns) => format::seconds(*ns as f64 / 1e9),
        }
    }
}

fn parse_point(s: &str) -> Result<SweepPoint, String> {
    if s.eq_ignore_ascii_case("unpaced") {
        return Ok(SweepPoint::Unpaced);
    }
    Ok(SweepPoint::Quantum(parse_positive_duration(s)?.as_nanos() as u64))
}

/// Options of the `udp-pacing` scenario.
#[derive(Debug, Clone, Args)]
pub struct UdpPacingArgs {
    /// Network placement (the bottleneck needs --path veth).
    #[command(flatten)]
    pub net: NetArgs,
    /// Bottleneck rate (tbf on the sender's link).
    #[arg(long, default_value = "200mbit", value_parser = parse_rate, allow_hyphen_values = true)]
    pub bottleneck: u64,
    /// Bottleneck bucket size.
    #[arg(long, default_value = "32k", value_parser = parse_size)]
    pub burst: u64,
    /// Bottleneck queue limit (bytes queued before drops).
    #[arg(long, default_value = "64k", value_parser = parse_size)]
    pub queue: u64,
    /// Offered load, percent of the bottleneck's rate (counted in wire bytes).
    #[arg(long, default_value_t = 90, value_parser = clap::value_parser!(u32).range(1..=200))]
    pub offered: u32,
    /// Sweep points: release quanta and "unpaced" (the same bytes in one burst), comma separated.
    #[arg(long, value_delimiter = ',', default_value = "250us,1ms,4ms,8ms,unpaced", value_parser = parse_point)]
    pub quanta: Vec<SweepPoint>,
    /// How long each point sends.
    #[arg(short = 't', long, alias = "duration", default_value = "2s", value_parser = parse_positive_duration)]
    pub time: Duration,
    /// Rounds: every point runs once per round, in a rotating order.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub repeat: u32,
    /// UDP payload bytes per datagram.
    #[arg(long, default_value_t = 1400)]
    pub gso_size: usize,
    /// Across machines: the sender on the testbed's server host (the bottleneck on its
    /// `iface`), the receiver on its first client host at that host's `addr`.
    #[command(flatten)]
    pub on: TestbedArgs,
}

/// One run of a point, with what the bottleneck did during it.
#[derive(Debug, Clone, Serialize)]
struct PointRun {
    result: BulkResult,
    qdisc: QdiscStats,
}

impl Measured for PointRun {
    fn summary(&self) -> String {
        summary_line(&self.result)
    }

    fn figures(&self) -> Vec<(&'static str, Option<f64>)> {
        let r = &self.result;
        vec![
            ("tx_mb_per_s", r.tx_rate().ok().map(|v| v / 1e6)),
            ("rx_mb_per_s", r.rx_rate().ok().map(|v| v / 1e6)),
            ("loss_pct", r.loss().ok().map(|l| l * 100.0)),
            ("bottleneck_drops", Some(self.qdisc.drops as f64)),
            ("tx_cpu_s_per_gb", r.tx_cpu_s_per_gb().ok()),
            ("tx_cpu_s_per_gb_delivered", r.tx_cpu_s_per_gb_delivered().ok()),
        ]
    }

    fn path(&self) -> Vec<String> {
        self.result.tx.path.clone()
    }
}

impl UdpPacingArgs {
    /// The defaults, as `netlane bench udp-pacing` has them.
    pub fn defaults() -> UdpPacingArgs {
        from_words(&[]).expect("the defaults parse")
    }

    /// Payload rate that puts `offered`% of the bottleneck on the wire: each datagram
    /// also carries IP, UDP and Ethernet headers.
    fn offered_rate(&self) -> u64 {
        let overhead = netlane::udp::ip_udp_header_len(self.net.ipv6) + 14;
        let wire_share = self.gso_size as f64 / (self.gso_size + overhead) as f64;
        (self.bottleneck as f64 * f64::from(self.offered) / 100.0 * wire_share) as u64
    }

    fn segments(&self) -> usize {
        GsoLimits::for_family(self.net.ipv6).segments_per_send(self.gso_size)
    }

    fn run_for(&self, point: SweepPoint, run_id: u32) -> BulkRun {
        let rate = self.offered_rate();
        let base = TxSpec {
            gso: GsoMode::Cmsg,
            datagram_size: self.gso_size,
            segments_per_send: self.segments(),
            duration: self.time,
            cpu: Some(self.net.tx_cpu),
            ..TxSpec::udp()
        };
        let tx = match point {
            // The same bytes a paced run moves, as fast as possible (bounded by the
            // duration, which it will not need).
            SweepPoint::Unpaced => TxSpec { limit_bytes: Some((rate as f64 * self.time.as_secs_f64()) as u64), ..base },
            SweepPoint::Quantum(ns) => TxSpec { pacing: Some(Pacing::new(rate, Quantum::Fixed(ns))), ..base },
        };
        BulkRun {
            tx: TxSource::Netlane(tx),
            rx: RxSpec { cpu: Some(self.net.rx_cpu()), ..RxSpec::udp() },
            ipv6: self.net.ipv6,
            run_id,
            roles: self.net.roles(),
        }
    }
}

impl Scenario for UdpPacingArgs {
    fn name(&self) -> &'static str {
        "udp-pacing"
    }

    fn options(&self) -> OptionList {
        let quanta: Vec<String> = self.quanta.iter().map(SweepPoint::name).collect();
        let list = self
            .net
            .options()
            .rate("bottleneck", self.bottleneck)
            .size("burst", self.burst)
            .size("queue", self.queue)
            .int("offered", u64::from(self.offered))
            .words("quanta", &quanta)
            .duration("time", self.time)
            .int("repeat", u64::from(self.repeat))
            .int("gso-size", self.gso_size as u64);
        self.on.listed(list)
    }

    fn validate(&self) -> Result<()> {
        let on = self.on.open()?;
        match &on {
            Some(t) => {
                // The bottleneck is a root qdisc on the server's interface: root there.
                t.check(&Needs { root: true, ..Needs::default() }, &Needs::default())?;
                check_ends(&self.net, t)?;
                if t.server.spec.iface.is_none() {
                    bail!("{}: no `iface` (the bottleneck goes on the sender's interface)", t.server.label());
                }
            }
            None => {
                if self.net.path != PathKind::Veth {
                    bail!(
                        "the pacing experiment needs a bottleneck qdisc on a veth link: use --path veth (needs root)"
                    );
                }
                self.net.validate()?;
            }
        }
        if self.quanta.is_empty() {
            bail!("no sweep points given (--quanta)");
        }
        if self.burst < 2048 {
            bail!("--burst {} is below one full-size packet; tbf would never send", self.burst);
        }
        if self.burst > u64::from(u32::MAX) || self.queue > u64::from(u32::MAX) {
            bail!("--burst and --queue must be below 4 GiB");
        }
        for (i, p) in self.quanta.iter().enumerate() {
            // A testbed's path MTU is its network's (checked by the kernel, not here).
            self.run_for(*p, i as u32)
                .validate(on.is_none().then(|| self.net.path_mtu()))
                .map_err(|e| anyhow::Error::new(e).context(p.name()))?;
        }
        Ok(())
    }

    fn runs(&self) -> usize {
        self.quanta.len() * self.repeat as usize
    }

    fn run(&self, progress: &dyn Progress) -> Result<ScenarioReport> {
        self.validate()?;
        if let Some(t) = self.on.open()? {
            return self.run_on_testbed(&t, progress);
        }
        let hosts = self.net.build("udp-pacing")?;
        let h = hosts.as_ref().ok_or_else(|| anyhow::anyhow!("the pacing experiment needs the veth path"))?;
        h.set_bottleneck(self.bottleneck, self.burst as u32, self.queue as u32)?;
        self.sweep(progress, endpoints(&hosts), &|| Ok(h.egress_qdisc()?.1))
    }
}

impl UdpPacingArgs {
    /// Every point's rounds between `ends`, the bottleneck's counters (`qdisc`) read
    /// around each run.
    fn sweep(
        &self,
        progress: &dyn Progress,
        ends: Endpoints<'_>,
        qdisc: &dyn Fn() -> Result<QdiscStats>,
    ) -> Result<ScenarioReport> {
        let mut runner = Runner::new(progress);
        let runs = runner.rounds(
            self.quanta.len(),
            |_| self.repeat,
            |runner, i, turn| {
                let p = self.quanta[i];
                let run = self.run_for(p, runner.next_index());
                runner.measure(turn, &p.name(), |label| {
                    let before = qdisc()?;
                    let result = run_one(ends, label, &run)?;
                    let after = qdisc()?;
                    let qdisc = QdiscStats {
                        bytes: after.bytes.saturating_sub(before.bytes),
                        packets: after.packets.saturating_sub(before.packets),
                        drops: after.drops.saturating_sub(before.drops),
                        overlimits: after.overlimits.saturating_sub(before.overlimits),
                    };
                    Ok(PointRun { result, qdisc })
                })
            },
        )?;
        let records = runner.into_records();
        Ok(self.report(&runs, records))
    }

    /// The sender on the testbed's server host with the bottleneck on its `iface`, the
    /// receiver on its first client host.
    fn run_on_testbed(&self, t: &Testbed, progress: &dyn Progress) -> Result<ScenarioReport> {
        let (ends, receiver, rx_addr) = testbed_ends(t)?;
        let iface = t.server.spec.iface.clone().context("the server host names no `iface`")?;
        let nic = t.hold_nic()?;
        let bottleneck = t.hold_bottleneck(self.bottleneck, self.burst, self.queue)?;
        let swept = self.sweep(progress, ends, &|| Ok(t.server.root_qdisc(&iface)?.stats));
        // Put back whatever became of the sweep (a hold that drops puts back too,
        // without a word).
        let mut notes = bottleneck.finish();
        notes.extend(nic.finish());
        let mut report = swept?;
        report.notes.extend(notes);
        report.notes.insert(
            0,
            format!(
                "Ran on a testbed: the sender on {} behind a tbf bottleneck on {iface}, the receiver on {} at \
                 {rx_addr}; the bottleneck's drops are read on the sender's host around each run (the lab's own \
                 SSH traffic to that host crosses the bottleneck too when it leaves by {iface}).",
                t.server.host().name(),
                receiver.host().name()
            ),
        );
        report.cpu_plan = ends_plan(t, receiver, &self.net);
        Ok(report)
    }
}

mod report;

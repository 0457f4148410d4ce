//! `netlane bench udp-pacing`: the talk's pacing experiment. A token-bucket bottleneck
//! (tbf, e.g. 200 Mbit/s with a small queue) sits on the sender's link; a GSO sender
//! offers a fixed share of the bottleneck's rate, released every quantum. Wider quanta
//! mean fewer wake-ups and fuller GSO sends (less CPU) but bigger bursts (more loss at
//! the bottleneck). "unpaced" sends the same bytes as one burst.

use std::time::Duration;

use crate::engines::bulk::{BulkRun, Pacing, RxSpec, TxSpec};
use anyhow::{Result, bail};
use clap::Args;
use netlane::metrics::units::{Rate, format_duration};
use netlane::pace::Quantum;
use netlane::topology::QdiscStats;
use netlane::udp::GsoMode;
use netlane::udp::gso::GsoLimits;
use serde::Serialize;

use super::{NetArgs, PathKind, Progress, parse_positive_duration, parse_rate, parse_size};
use crate::report::chart::{self, Series};
use crate::report::{Cell, Check, ScenarioReport, Table};

/// One point of the sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Point {
    /// No pacer: the same bytes as fast as the socket takes them.
    Unpaced,
    /// Releases every this many nanoseconds.
    Quantum(u64),
}

impl Point {
    fn label(&self) -> String {
        match self {
            Point::Unpaced => "unpaced".into(),
            Point::Quantum(ns) => format_duration(Duration::from_nanos(*ns)),
        }
    }
}

fn parse_point(s: &str) -> Result<Point, String> {
    if s.eq_ignore_ascii_case("unpaced") {
        return Ok(Point::Unpaced);
    }
    Ok(Point::Quantum(parse_positive_duration(s)?.as_nanos() as u64))
}

/// Options of `netlane bench udp-pacing`.
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
    pub quanta: Vec<Point>,
    /// How long each point sends.
    #[arg(long, default_value = "2s", value_parser = parse_positive_duration)]
    pub duration: Duration,
    /// UDP payload bytes per datagram.
    #[arg(long, default_value_t = 1400)]
    pub gso_size: usize,
    /// Write all results as JSON to this file.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Write the table as CSV to this file.
    #[arg(long)]
    pub csv: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, Serialize)]
struct PointRecord {
    point: Point,
    result: crate::engines::bulk::BulkResult,
    qdisc: QdiscStats,
}

impl UdpPacingArgs {
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

    fn run_for(&self, point: Point, run_id: u32) -> BulkRun {
        let rate = self.offered_rate();
        let base = TxSpec {
            gso: GsoMode::Cmsg,
            datagram_size: self.gso_size,
            segments_per_send: self.segments(),
            duration: self.duration,
            cpu: Some(self.net.tx_cpu),
            ..TxSpec::udp()
        };
        let tx = match point {
            // The same bytes a paced run moves, as fast as possible (bounded by the
            // duration, which it will not need).
            Point::Unpaced => TxSpec { limit_bytes: Some((rate as f64 * self.duration.as_secs_f64()) as u64), ..base },
            Point::Quantum(ns) => TxSpec { pacing: Some(Pacing { rate, quantum: Quantum::Fixed(ns) }), ..base },
        };
        BulkRun {
            tx: self.net.sender(tx),
            rx: RxSpec { cpu: Some(self.net.rx_cpu()), ..RxSpec::udp() },
            ipv6: self.net.ipv6,
            run_id,
        }
    }

    /// Checks options before anything is built.
    pub fn validate(&self) -> Result<()> {
        self.net.validate()?;
        if self.net.path != PathKind::Veth {
            bail!("the pacing experiment needs a bottleneck qdisc on a veth link: use --path veth (needs root)");
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
            self.run_for(*p, i as u32).validate(Some(self.net.path_mtu())).map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        Ok(())
    }

    /// Number of runs.
    pub fn run_count(&self) -> usize {
        self.quanta.len()
    }

    /// Runs the sweep.
    pub fn run(&self, progress: &dyn Progress) -> Result<ScenarioReport> {
        self.validate()?;
        let hosts = self.net.build("udp-pacing")?;
        progress.plan(self.quanta.len());
        let h = hosts.as_ref().expect("validated: veth path");
        h.set_bottleneck(self.bottleneck, self.burst as u32, self.queue as u32)?;
        let mut records = Vec::new();
        for (i, p) in self.quanta.iter().enumerate() {
            let label = p.label();
            progress.start(&label);
            let before = h.egress_qdisc()?.1;
            let result = super::run_one(&hosts, &label, &self.run_for(*p, i as u32 + 1))?;
            let after = h.egress_qdisc()?.1;
            let qdisc = QdiscStats {
                bytes: after.bytes.saturating_sub(before.bytes),
                packets: after.packets.saturating_sub(before.packets),
                drops: after.drops.saturating_sub(before.drops),
                overlimits: after.overlimits.saturating_sub(before.overlimits),
            };
            progress.finish(&label, &super::summary_line(&result));
            records.push(PointRecord { point: *p, result, qdisc });
        }
        Ok(self.report(&records))
    }

    fn report(&self, records: &[PointRecord]) -> ScenarioReport {
        let mut table = Table {
            name: "udp-pacing".into(),
            title: format!(
                "Release quantum vs loss and sender CPU at a {} bottleneck ({}% offered)",
                Rate(self.bottleneck as f64),
                self.offered
            ),
            columns: [
                "quantum",
                "segments/release",
                "tx MB/s",
                "rx MB/s",
                "loss %",
                "bottleneck drops",
                "tx CPU s/GB sent",
                "tx CPU s/GB delivered",
                "wake-ups/s",
                "rx per-ms p99 kB",
            ]
            .map(String::from)
            .to_vec(),
            rows: Vec::new(),
        };
        let delivered = |r: &PointRecord| {
            let gb = r.result.rx.bytes as f64 / 1e9;
            if gb > 0.0 { r.result.tx.cpu.total_s() / gb } else { f64::NAN }
        };
        for r in records {
            let x = &r.result;
            let p = x.tx.pacing;
            table.rows.push(vec![
                Cell::text(r.point.label()),
                p.map_or(Cell::text("all"), |p| Cell::num(p.segments_per_release, 1)),
                Cell::num(x.tx_rate / 1e6, 1),
                Cell::num(x.rx.bytes as f64 / x.tx.seconds.max(1e-9) / 1e6, 1),
                Cell::num(x.loss * 100.0, 2),
                Cell::num(r.qdisc.drops as f64, 0),
                Cell::num(x.tx_cpu_per_gb, 3),
                Cell::num(delivered(r), 3),
                p.map_or(Cell::Empty, |p| Cell::num(p.stats.releases as f64 / x.tx.seconds.max(1e-9), 0)),
                Cell::num(x.rx.per_ms_bytes.p99 as f64 / 1e3, 1),
            ]);
        }
        let xs: Vec<String> = records.iter().map(|r| r.point.label()).collect();
        let charts = vec![
            chart::lines(
                "udp-pacing-loss",
                "Loss at the bottleneck vs release quantum",
                "release quantum",
                "loss %",
                &xs,
                &[Series::new("loss", records.iter().map(|r| r.result.loss * 100.0).collect())],
            ),
            chart::lines(
                "udp-pacing-cpu",
                "Sender CPU per GB vs release quantum",
                "release quantum",
                "CPU s/GB",
                &xs,
                &[
                    Series::new("per GB sent", records.iter().map(|r| r.result.tx_cpu_per_gb).collect()),
                    Series::new("per GB delivered", records.iter().map(delivered).collect()),
                ],
            ),
        ];
        // The talk's finding: widening the interval cut sender CPU a lot while the loss
        // rate rose. Compare the narrowest and widest paced points of this run.
        let paced: Vec<&PointRecord> = records.iter().filter(|r| matches!(r.point, Point::Quantum(_))).collect();
        let mut checks = Vec::new();
        if let (Some(narrow), Some(wide)) = (
            paced.iter().min_by_key(|r| match r.point {
                Point::Quantum(ns) => ns,
                Point::Unpaced => u64::MAX,
            }),
            paced.iter().max_by_key(|r| match r.point {
                Point::Quantum(ns) => ns,
                Point::Unpaced => 0,
            }),
        ) && narrow.point != wide.point
        {
            checks.push(Check::new(
                format!("sender CPU per GB falls from {} to {}", narrow.point.label(), wide.point.label()),
                "lower at the wider quantum (the talk's trade-off)",
                format!("{:.3} -> {:.3} s/GB", narrow.result.tx_cpu_per_gb, wide.result.tx_cpu_per_gb),
                wide.result.tx_cpu_per_gb < narrow.result.tx_cpu_per_gb,
            ));
            checks.push(Check::new(
                format!("loss rises from {} to {}", narrow.point.label(), wide.point.label()),
                "higher at the wider quantum (the talk's trade-off)",
                format!("{:.2}% -> {:.2}%", narrow.result.loss * 100.0, wide.result.loss * 100.0),
                wide.result.loss > narrow.result.loss,
            ));
        }
        let mut options = vec![("benchmark".to_string(), "udp-pacing".to_string())];
        self.net.echo(&mut options);
        options.extend([
            ("bottleneck".into(), Rate(self.bottleneck as f64).to_string()),
            ("burst".into(), self.burst.to_string()),
            ("queue".into(), self.queue.to_string()),
            ("offered".into(), format!("{}% = {} payload", self.offered, Rate(self.offered_rate() as f64))),
            ("quanta".into(), records.iter().map(|r| r.point.label()).collect::<Vec<_>>().join(",")),
            ("duration".into(), format_duration(self.duration)),
            ("gso_size".into(), self.gso_size.to_string()),
            ("segments".into(), self.segments().to_string()),
        ]);
        let notes = vec![format!(
            "Each paced point releases the bytes due in one quantum as full GSO sends; the bottleneck holds {} B of \
             bucket and {} B of queue, so releases larger than that are dropped at the qdisc. Pacing runs in user \
             space (no fq/etf for SO_TXTIME here).",
            self.burst, self.queue
        )];
        ScenarioReport {
            name: "udp-pacing".into(),
            title: "Pacing experiment: release quantum vs loss and CPU".into(),
            description: "The LPC 2018 talk's experiment: a QUIC server paced its sends in user space; widening the \
                pacing interval cut the sender's CPU a lot while the loss rate rose from a low base. Here a tbf \
                qdisc on the sender's veth is the bottleneck, and a GSO sender offers a fixed share of its rate with \
                each release quantum; 'unpaced' sends the same bytes in one burst."
                .into(),
            options,
            tables: vec![table],
            charts,
            checks,
            notes,
            raw: serde_json::to_value(records).unwrap_or_default(),
        }
    }
}

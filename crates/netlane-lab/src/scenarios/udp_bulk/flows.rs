//! The many-flow part: the talk's server, many clients served from a few unconnected
//! sockets, each send one client's train with its own UDP_SEGMENT, each client paced at
//! its share of the rate. Its sender CPU per GB against fewer flows at the same rate
//! and against the same flows unpaced, and what each flow got at the receiver.

use netlane::udp::{GsoMode, RxBatching};
use netlane_bulk::flows::Flows;
use netlane_bulk::{Pacer, Pacing};
use netlane_report::{Check, Column, Row, Table, Value};

use super::UdpBulkArgs;
use super::checks::{med, usable};
use super::plan::{Arm, Role};
use crate::engines::bulk::{BulkResult, BulkRun, RxSpec, TxSource, TxSpec};
use crate::verdict::{Measure, Spec, paired};

/// The unconnected sockets the flows are served from.
const FLOW_SOCKETS: u32 = 4;

impl UdpBulkArgs {
    /// The flow counts asked for, smallest first, but those left out.
    fn flow_counts(&self) -> Vec<u32> {
        let mut counts: Vec<u32> = self.flows.iter().copied().filter(|n| *n > 0).collect();
        counts.sort_unstable();
        counts.dedup();
        counts.retain(|n| self.flows_left_out_why(*n).is_none());
        counts
    }

    /// Why `count` flows cannot run here, if they cannot: each must send often enough in
    /// the run for its rate to mean anything (the sender's own rule).
    fn flows_left_out_why(&self, count: u32) -> Option<String> {
        let arm = self.flow_arm(count, true);
        let path_mtu = (self.on.testbed.is_none()).then(|| self.net.path_mtu());
        arm.run.validate(path_mtu).err().map(|e| e.to_string())
    }

    /// The flow counts left out, and why.
    pub(super) fn flows_left_out(&self) -> Vec<String> {
        let mut counts: Vec<u32> = self.flows.iter().copied().filter(|n| *n > 0).collect();
        counts.sort_unstable();
        counts.dedup();
        counts.into_iter().filter_map(|n| self.flows_left_out_why(n).map(|why| format!("{n} flows: {why}"))).collect()
    }

    /// Each flow count paced, and the most flows unpaced.
    pub(super) fn flow_arms(&self) -> Vec<Arm> {
        let counts = self.flow_counts();
        let Some(&most) = counts.last() else { return Vec::new() };
        let mut arms: Vec<Arm> = counts.iter().map(|n| self.flow_arm(*n, true)).collect();
        arms.push(self.flow_arm(most, false));
        arms
    }

    fn flow_arm(&self, count: u32, paced: bool) -> Arm {
        let flows = Flows { count, sockets: count.min(FLOW_SOCKETS), mtus: self.flow_mtus.clone() };
        let pacing = Pacing { pacer: Pacer::User, ..Pacing::new(self.flows_rate, self.quantum) };
        // Unpaced, the flows take turns sending whole GSO trains for the same time.
        let tx = TxSpec { gso: GsoMode::Cmsg, pacing: paced.then_some(pacing), flows: Some(flows), ..self.tx() };
        let rx = RxSpec { gro: true, batching: RxBatching::Mmsg(8), flows: count, ..self.rx() };
        Arm {
            label: format!("{count} flows {}", if paced { "paced" } else { "unpaced" }),
            role: Role::Flows(count, paced),
            run: BulkRun { tx: TxSource::Netlane(tx), rx, ipv6: self.net.ipv6, run_id: 0, roles: self.net.roles() },
        }
    }

    /// Every flow arm: sender cost, and what each flow got at the receiver.
    pub(super) fn flows_table(&self, arms: &[Arm], results: &[Vec<BulkResult>]) -> Option<Table> {
        let rows: Vec<usize> = (0..arms.len()).filter(|i| matches!(arms[*i].role, Role::Flows(..))).collect();
        if rows.is_empty() {
            return None;
        }
        let mut table = Table::new(
            "udp-bulk-flows",
            format!(
                "Many flows from {FLOW_SOCKETS} unconnected sockets, {} in all, path MTUs {}; medians of {} rounds",
                netlane::metrics::units::Rate(self.flows_rate as f64),
                self.flow_mtus.iter().map(u32::to_string).collect::<Vec<_>>().join(", "),
                self.repeat
            ),
            vec![
                Column::new("flows", "flows", 0),
                Column::new("pacing", "pacing", 0),
                Column::new("datagrams_per_call", "datagrams/call", 1),
                Column::new("tx_cpu_s_per_gb", "tx CPU s/GB", 3),
                Column::new("rx_mb_per_s", "rx MB/s", 1),
                Column::new("tx_kernel_drops", "dropped in the sender's kernel", 0),
                Column::new("flows_seen", "flows seen", 0),
                Column::new("flow_rate_p50_kb_per_s", "per flow kB/s p50", 1),
                Column::new("flow_rate_min_kb_per_s", "per flow kB/s min", 1),
                Column::new("flow_loss_p99_ppm", "per flow loss p99 ppm", 0),
                Column::new("flow_max_ms_p99_kb", "per flow largest ms p99 kB", 1),
            ],
        );
        for i in rows {
            let Role::Flows(count, paced) = arms[i].role else { continue };
            let rs = &results[i];
            let flows = |f: fn(&netlane_bulk::flows::FlowsReport) -> f64| {
                med(rs, move |r| r.rx.flows.as_ref().map(f).ok_or_else(|| "no per-flow counts".to_string()))
            };
            let pacing = if paced {
                format!("{}/s each", netlane_report::format::si(self.flows_rate as f64 / f64::from(count)) + "B")
            } else {
                "unpaced".into()
            };
            table.push(Row::new(vec![
                Value::num(f64::from(count)),
                Value::text(pacing),
                med(rs, |r| Ok(r.tx.datagrams as f64 / r.tx.syscalls.max(1) as f64)),
                med(rs, BulkResult::tx_cpu_s_per_gb),
                med(rs, |r| r.rx_rate().map(|v| v / 1e6)),
                med(rs, |r| Ok(r.tx.kernel_drops as f64)),
                flows(|f| f64::from(f.seen)),
                flows(|f| f.rate_bytes_per_s.p50 as f64 / 1e3),
                flows(|f| f.rate_bytes_per_s.min as f64 / 1e3),
                flows(|f| f.loss_ppm.p99 as f64),
                flows(|f| f.max_per_ms_bytes.p99 as f64 / 1e3),
            ]));
        }
        Some(table)
    }

    /// Where the flows' datagrams were lost, when some were: in the sender's kernel.
    pub(super) fn flows_note(&self, arms: &[Arm], results: &[Vec<BulkResult>]) -> Option<String> {
        let runs = arms.iter().zip(results).filter(|(a, _)| matches!(a.role, Role::Flows(..)));
        let (mut dropped, mut missing, mut sent) = (0u64, 0u64, 0u64);
        for r in runs.flat_map(|(_, rs)| rs) {
            dropped += r.tx.kernel_drops;
            missing += r.rx.integrity.high_water.saturating_sub(r.rx.integrity.unique);
            sent += r.tx.datagrams;
        }
        (dropped + missing > 0).then(|| {
            let mut note = format!("Many flows: {missing} of {sent} datagrams sent were missing at the receiver");
            if dropped > 0 {
                note.push_str(&format!(
                    "; the sender's kernel dropped {dropped} sends after accepting them (UDP SndbufErrors: a full \
                     device queue answered ENOBUFS, which a UDP socket does not report to its sender{})",
                    if self.on.testbed.is_none() { "; on veth, the receiving NAPI's ring of 256 packets" } else { "" }
                ));
            }
            if missing > dropped {
                note.push_str(&format!("; {} were lost past the sender's kernel", missing - dropped));
            }
            note + "."
        })
    }

    /// The sender's cost of serving more flows, and of pacing them; each paced flow's
    /// rate at the receiver.
    pub(super) fn flow_checks(&self, arms: &[Arm], results: &[Vec<BulkResult>]) -> Vec<Check> {
        let find = |role: Role| arms.iter().position(|a| a.role == role).map(|i| &results[i][..]);
        let counts = self.flow_counts();
        let (Some(&fewest), Some(&most)) = (counts.first(), counts.last()) else { return Vec::new() };
        let cpu = |a: &[BulkResult], b: &[BulkResult]| paired(a, b, |r| usable(r, &BulkResult::tx_cpu_s_per_gb));
        let mut checks = Vec::new();
        for &n in counts.iter().filter(|n| **n != fewest) {
            let spec = Spec::at_least(
                &format!("udp-bulk.flows-{n}-cpu-vs-{fewest}"),
                format!("{n} paced flows: sender CPU per GB vs {fewest} at the same rate in all"),
                1.0,
                "x",
            );
            checks.push(match (find(Role::Flows(n, true)), find(Role::Flows(fewest, true))) {
                (Some(a), Some(b)) => spec.evaluate(cpu(a, b), "sender CPU s/GB sent, per round"),
                _ => spec.skipped("not run"),
            });
        }
        let spec = Spec::at_least(
            &format!("udp-bulk.flows-{most}-paced-vs-unpaced"),
            format!("{most} flows: sender CPU per GB, each paced vs all served as fast as the sockets take them"),
            1.0,
            "x",
        );
        checks.push(match (find(Role::Flows(most, true)), find(Role::Flows(most, false))) {
            (Some(a), Some(b)) => spec.evaluate(cpu(a, b), "paced / unpaced sender CPU s/GB sent, per round"),
            _ => spec.skipped("not run"),
        });
        for &n in &counts {
            let Some(rs) = find(Role::Flows(n, true)) else { continue };
            let share = self.flows_rate as f64 / f64::from(n);
            checks.push(
                Spec::within(
                    &format!("udp-bulk.flows-{n}-rate"),
                    format!(
                        "{n} paced flows: each flow's rate at the receiver (median over the flows), % of its share"
                    ),
                    95.0,
                    105.0,
                    "%",
                )
                .evaluate(rs.iter().map(|r| usable(r, &|r| flow_share(r, n, share))).collect(), "per run"),
            );
        }
        checks
    }
}

/// The median flow's rate at the receiver as a percentage of `share`; an error when
/// some of the `count` flows never arrived.
fn flow_share(r: &BulkResult, count: u32, share: f64) -> Measure {
    let f = r.rx.flows.as_ref().ok_or("the receiver counted no flows")?;
    if f.seen < count {
        return Err(format!("only {} of {count} flows arrived", f.seen));
    }
    Ok(f.rate_bytes_per_s.p50 as f64 / share * 100.0)
}

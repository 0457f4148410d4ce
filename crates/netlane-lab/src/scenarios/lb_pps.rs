//! `netlane bench lb-pps`: packets per second per core through the XDP load balancer,
//! 1 to 1 M flows, hints off / rx-hash / per-flow tags / per-destination tags, with a
//! trivial XDP_TX program as the ceiling in the same run.

use std::time::Duration;

use crate::engines::lb_pps::{self as pps, PpsOptions, PpsResult, Subject};
use anyhow::{Result, bail};
use clap::Args;
use netlane_lb::HintMode;

use super::Progress;
use crate::report::chart::{Series, bars};
use crate::report::{Cell, Check, ScenarioReport, Table};

/// Options of `netlane bench lb-pps`.
#[derive(Debug, Clone, Args)]
pub struct LbPpsArgs {
    /// Flow counts (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "1,100,10000,1000000")]
    pub flows: Vec<u32>,
    /// Balancer hint modes (comma separated): off, rx-hash, flow-tag, dest-tag.
    #[arg(long, value_delimiter = ',', default_value = "off,rx-hash,flow-tag,dest-tag")]
    pub modes: Vec<String>,
    /// Measured time per program and flow count (taken in six turns).
    #[arg(long, default_value = "2s", value_parser = netlane::metrics::units::parse_duration)]
    pub time: Duration,
}

impl LbPpsArgs {
    fn options(&self) -> Result<PpsOptions> {
        let mut modes = Vec::new();
        for m in &self.modes {
            match HintMode::from_name(m) {
                Some(h) => modes.push(h),
                None => bail!("--modes: {m:?} is not one of off, rx-hash, flow-tag, dest-tag"),
            }
        }
        let o = PpsOptions { flows: self.flows.clone(), modes, time: self.time };
        o.validate()?;
        Ok(o)
    }

    /// Checks the options.
    pub fn validate(&self) -> Result<()> {
        self.options().map(drop)
    }

    /// Runs planned.
    pub fn run_count(&self) -> usize {
        self.flows.len() * (self.modes.len() + 2)
    }

    /// Runs the benchmark.
    pub fn run(&self, progress: &dyn Progress) -> Result<ScenarioReport> {
        let o = self.options()?;
        if !netlane::topology::have_privileges() {
            bail!("lb-pps builds namespaces and loads XDP programs: run it as root");
        }
        progress.plan(self.run_count());
        let last = std::sync::Mutex::new(String::new());
        let tell = |label: &str| {
            if let Ok(mut l) = last.lock() {
                if !l.is_empty() {
                    progress.finish(&l, "done");
                }
                *l = label.to_string();
            }
            progress.start(label);
        };
        let results = pps::run(&o, &tell)?;
        if let Ok(l) = last.lock()
            && !l.is_empty()
        {
            progress.finish(&l, "done");
        }
        Ok(self.report(&results))
    }

    fn report(&self, results: &[PpsResult]) -> ScenarioReport {
        let mut rep = ScenarioReport {
            name: "lb-pps".into(),
            title: "XDP load balancer: packets per second per core, hints off and on, vs XDP_TX".into(),
            description: "A generator (BPF_PROG_RUN live frames on CPU 0) sends 64-byte TCP frames of N flows over a \
                          veth pair to the balancer, which runs in the threaded NAPI of the other end pinned to CPU 1 \
                          and XDP_TXes them back into a sink. All programs of a flow count are loaded and warmed up \
                          first, then take turns on the interface (six slices each, rotating order); figures are the \
                          median of a program's slices. Mpps per core = packets / CPU time of that NAPI thread (veth + \
                          XDP + XDP_TX); program ns/packet from the kernel's BPF run-time statistics; spread = (max - \
                          min) / median of the slices. Hints arrive as XDP metadata written by the generator (the \
                          emulated NIC); tags are installed by the control plane from the balancer's new-flow events, \
                          as in `netlane lb`. Measured frames visit the flows in a scattered order."
                .into(),
            options: vec![
                ("flows".into(), format!("{:?}", self.flows)),
                ("modes".into(), self.modes.join(",")),
                ("time".into(), format!("{:?}", self.time)),
            ],
            tables: Vec::new(),
            charts: Vec::new(),
            checks: Vec::new(),
            notes: Vec::new(),
            raw: serde_json::to_value(results).unwrap_or_default(),
        };
        let mut t = Table {
            name: "lb-pps".into(),
            title: "Packets per second through the balancer".into(),
            columns: [
                "flows",
                "program",
                "Mpps per core",
                "spread",
                "x ceiling",
                "core ns/pkt",
                "prog ns/pkt",
                "Mpps (wall)",
                "hint hits",
                "conn hits",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
            rows: Vec::new(),
        };
        let find = |flows: u32, s: Subject| results.iter().find(|r| r.flows == flows && r.subject == s);
        for r in results {
            let ceiling = find(r.flows, Subject::XdpTxCeiling).map_or(f64::NAN, |c| c.mpps_per_core);
            t.rows.push(vec![
                Cell::num(f64::from(r.flows), 0),
                Cell::text(r.subject.label()),
                Cell::num(r.mpps_per_core, 3),
                Cell::text(format!("{:.0}%", 100.0 * r.spread())),
                Cell::num(r.mpps_per_core / ceiling, 2),
                Cell::num(r.core_ns_per_packet, 0),
                Cell::num(r.prog_ns_per_packet, 1),
                Cell::num(r.mpps, 3),
                Cell::text(format!("{:.1}%", 100.0 * r.hint_hit_ratio)),
                Cell::text(format!("{:.1}%", 100.0 * r.conn_hit_ratio)),
            ]);
        }
        rep.tables.push(t);
        let mut flows: Vec<u32> = results.iter().map(|r| r.flows).collect();
        flows.dedup();
        let mut subjects: Vec<Subject> = Vec::new();
        for r in results {
            if !subjects.contains(&r.subject) {
                subjects.push(r.subject);
            }
        }
        let cats: Vec<String> = flows.iter().map(|f| format!("{f} flows")).collect();
        let series = |get: fn(&PpsResult) -> f64| -> Vec<Series> {
            subjects
                .iter()
                .map(|s| Series::new(s.label(), flows.iter().map(|f| find(*f, *s).map_or(0.0, get)).collect()))
                .collect()
        };
        rep.charts.push(bars(
            "lb-pps-mpps",
            "Mpps per core",
            "Mpps per core",
            &cats,
            &series(|r| r.mpps_per_core),
            false,
        ));
        rep.charts.push(bars(
            "lb-pps-prog-ns",
            "Program time per packet (BPF run-time statistics)",
            "ns per packet",
            &cats,
            &series(|r| r.prog_ns_per_packet),
            false,
        ));
        let per_core = |f: u32, s: Subject| find(f, s).map(|r| r.mpps_per_core);
        let off = Subject::Balancer(HintMode::Off);
        for &f in &flows {
            if let (Some(l), Some(c)) = (per_core(f, off), per_core(f, Subject::XdpTxCeiling)) {
                rep.checks.push(Check::new(
                    format!("{f} flows: untagged balancer >= 0.7 x the XDP_TX ceiling (Mpps per core)"),
                    ">= 0.70",
                    format!("{l:.3} / {c:.3} = {:.2}", l / c),
                    l >= 0.7 * c,
                ));
            }
        }
        for (f, min, what) in [(10_000u32, 1.25, ">= 1.25"), (1_000_000, 1.0, ">= 1.00")] {
            for tag in [HintMode::FlowTag, HintMode::DestTag] {
                if let (Some(tg), Some(l)) = (per_core(f, Subject::Balancer(tag)), per_core(f, off)) {
                    rep.checks.push(Check::new(
                        format!("{f} flows: {} vs untagged (Mpps per core)", tag.name()),
                        what,
                        format!("{tg:.3} / {l:.3} = {:.2}", tg / l),
                        tg >= min * l,
                    ));
                }
            }
        }
        // Where the untagged path's cost goes as flows grow: its per-flow state.
        if let (Some(lo), Some(hi)) = (flows.first(), flows.last())
            && let (Some(a), Some(b)) = (find(*lo, off), find(*hi, off))
            && hi > lo
        {
            rep.notes.push(format!(
                "Untagged, the program took {:.0} ns per packet at {lo} flows and {:.0} ns at {hi}: the connection-table \
                 lookup (hash, bucket, entry) misses the CPU caches once the flows' entries no longer fit, as the talk \
                 found at 10 K flows. Tagged packets skip that lookup; their own per-flow state (tag entries, the \
                 rx-hash cache) grows too, which per-destination tags avoid.",
                a.prog_ns_per_packet, b.prog_ns_per_packet
            ));
        }
        // One sink count per flow count (every result of a flow count carries it).
        let returned: u64 =
            flows.iter().filter_map(|f| results.iter().find(|r| r.flows == *f)).map(|r| r.sink_frames_all_turns).sum();
        let ran: u64 = results.iter().map(|r| r.packets).sum();
        rep.notes.push(format!(
            "The sink got {returned} frames back for {ran} measured program runs (plus the lead-ins after each \
             switch). The rest were dropped when the balancer's XDP_TX found the generator end's ring full (that \
             end's NAPI shares CPU 0 with the generator); the balancer had done its work on them. Frames the \
             generator sends while the balancer end's ring is full are dropped before any program runs and do \
             not count."
        ));
        rep.notes.push(
            "The device-bound build (hints from the bpf_xdp_metadata_rx_hash kfunc) cannot be measured this way: veth \
             only has an RX hash for packets that arrive as skbs, and the generator sends XDP frames. It is exercised \
             end to end (tags via a TCX classifier on the sending side) by the namespace tests."
                .into(),
        );
        rep
    }
}

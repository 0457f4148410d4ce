//! The connection sweep: the SLA search of the plain and NAPI-id modes again at more
//! connections (the talk swept 300 to 4,400), each count's best rate tabled and the
//! largest count's NAPI-id / plain ratio checked.

use netlane_kv::loadgen::SearchReport;
use netlane_report::{Axis, Chart, ChartKind, Column, Point, Row, Scale, Series, Table, Unit, Value};
use serde::Serialize;

use crate::plan::CpuPlan;
use crate::scenarios::Sections;
use crate::verdict::{Measure, Spec};

use super::checks::{best_of, med};
use super::report::{Find, pair_check};
use super::*;

/// The modes the sweep searches again: the talk's comparison.
pub(crate) const SWEPT: [Mode; 2] = [Mode::Plain, Mode::Napi];

/// One count of the sweep: its search.
#[derive(Debug, Clone, Serialize)]
pub struct SweepPoint {
    /// Connections.
    pub connections: u32,
    /// The search at that count.
    pub search: SearchReport,
}

impl LanesBenchArgs {
    /// Whether `mode`'s rounds search again at the sweep's counts.
    pub(crate) fn sweeps(&self, mode: Mode) -> bool {
        !self.no_search && !self.no_sweep && SWEPT.contains(&mode)
    }

    /// Every count the sweep has: the search's own first, then the sweep's.
    fn sweep_counts(&self) -> Vec<u32> {
        let mut v = vec![self.connections[0]];
        v.extend(self.sweep_connections.iter().copied().filter(|c| *c != self.connections[0]));
        v
    }

    /// The best rate within the SLA of each swept mode at each count, and the check at
    /// the largest.
    pub(crate) fn sweep_section(&self, find: &Find<'_>, plan: Option<&CpuPlan>, out: &mut Sections) {
        if self.no_search || self.no_sweep || SWEPT.iter().all(|m| find(*m).is_none()) {
            return;
        }
        let (counts, first) = (self.sweep_counts(), self.connections[0]);
        let mut columns = vec![Column::new("connections", "connections", 0)];
        columns.extend(SWEPT.iter().map(|m| Column::new(&m.name(), &format!("{} requests/s", m.name()), 0)));
        let mut t = Table::new(
            "lanes-sweep",
            format!("Highest offered rate within {} by connections, medians of {} rounds", self.sla, self.repeat),
            columns,
        );
        let mut series: Vec<Series> = SWEPT.iter().map(|m| Series { name: m.name(), points: Vec::new() }).collect();
        for &c in &counts {
            let mut row = vec![Value::num(f64::from(c))];
            for (i, m) in SWEPT.iter().enumerate() {
                let rounds = find(*m).unwrap_or(&[]);
                row.push(med(rounds, |r| best_at(r, c, first)));
                let v: Vec<f64> = rounds.iter().filter_map(|r| best_at(r, c, first).ok()).collect();
                series[i].points.extend(Point::of(f64::from(c), &v));
            }
            t.push(Row::new(row));
        }
        out.tables.push(t);
        out.charts.push(Chart {
            name: "lanes-sweep".into(),
            title: format!("Requests/s within {} by connections", self.sla),
            kind: ChartKind::Lines,
            x: Axis::numeric("connections", Unit::Count("connections".into()), Scale::Log),
            y: Axis::numeric("requests/s", Unit::Count("requests/s".into()), Scale::Linear),
            series,
        });
        let most = *counts.iter().max().unwrap_or(&self.connections[0]);
        let spec = Spec::at_least(
            "lanes.aligned-throughput-connections",
            format!(
                "NAPI-id lanes hold more requests/s within {} than plain workers at {most} connections (talk: +70% \
                 over 300-4,400)",
                self.sla
            ),
            1.7,
            "x",
        );
        let what = format!("napi / plain requests/s within {} at {most} connections, per round", self.sla);
        out.checks.push(pair_check(
            spec,
            (Mode::Napi, Mode::Plain),
            find,
            plan,
            move |r| best_at(r, most, first),
            &what,
        ));
    }
}

/// A round's best rate within the SLA at `connections`: its main search's at `first`
/// (the count it searched at), the sweep's at the others.
pub(crate) fn best_at(r: &LaneRound, connections: u32, first: u32) -> Measure {
    match r.sweep.iter().find(|p| p.connections == connections) {
        Some(p) => best_of(&p.search, r.mode),
        None if connections == first => super::checks::best(r),
        None => Err(format!("{}: no search at {connections} connections", r.mode.name())),
    }
}

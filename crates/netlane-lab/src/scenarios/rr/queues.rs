//! The rr scenario's queues part: every receive path on a device with several receive
//! queues, the clients' flows spread over them by the sending end's hash. Its table, and
//! its check: the AF_XDP server has a socket per queue, and every queue's socket must
//! have served its share (a socket left on one queue would serve only its flows' share,
//! and a queue without one none).

use netlane_report::{Check, Column, Table, Value};
use netlane_rr::server::PathKind as RxPathKind;

use crate::scenarios::Sections;
use crate::verdict::{Measure, Spec};

use super::report::{columns, row};
use super::*;

/// The least-served of the device's `queues` receive queues' share of the frames, % of an
/// even share: 100 when every queue's socket delivered as many, 0 when a queue had no
/// socket (a server that bound fewer sockets than the device has queues).
pub(super) fn least_served(r: &RrRun, queues: usize) -> Measure {
    let x = r.server.xdp.as_ref().ok_or("not an AF_XDP server")?;
    let q = &x.frames_per_queue;
    if queues < 2 {
        return Err(format!("{queues} receive queue(s): nothing to spread over"));
    }
    if q.len() > queues {
        return Err(format!("{} queue sockets reported on a device with {queues} queues", q.len()));
    }
    let total: f64 = q.iter().map(|n| *n as f64).sum();
    if total == 0.0 {
        return Err("no queue's socket delivered a frame".into());
    }
    let least = if q.len() < queues { 0 } else { q.iter().copied().min().unwrap_or(0) };
    Ok(least as f64 * queues as f64 / total * 100.0)
}

/// Clients per queue below which their flows' hash may leave a queue short by chance.
const CLIENTS_PER_QUEUE: usize = 8;

/// Each queue's frames, `q0 n, q1 n` (AF_XDP), of a run.
fn per_queue(r: &RrRun) -> String {
    r.server.xdp.as_ref().map_or(String::new(), |x| {
        x.frames_per_queue.iter().enumerate().map(|(i, n)| format!("q{i} {n}")).collect::<Vec<_>>().join(", ")
    })
}

impl RrBenchArgs {
    /// Every path's run on all the queues; AF_XDP's frames per queue socket.
    pub(super) fn queues_section(&self, runs: &Runs<'_>, out: &mut Sections) {
        let mut cols = columns("receive path, queues");
        cols.push(Column::new("least_served_pct", "least-served queue % of even", 0));
        let mut t = Table::new(
            "rr-queues",
            format!(
                "Every receive path on a device with several receive queues, {} clients spread over them, medians of \
                 {} rounds",
                self.clients, self.repeat
            ),
            cols,
        );
        for p in &self.paths {
            let label = queues_label(*p);
            let Some(rs) = runs.find(Part::Queues, &label) else { continue };
            let mut r = row(&label, rs);
            r.cells.push(if *p == RxPathKind::AfXdp {
                med(rs, |r| least_served(r, LANE_QUEUES as usize))
            } else {
                Value::Missing
            });
            if *p == RxPathKind::AfXdp
                && let Some(first) = rs.first()
            {
                let frames = format!("frames per queue socket (round 1): {}", per_queue(first));
                r.footnote = Some(match r.footnote.take() {
                    Some(f) => format!("{f}; {frames}"),
                    None => frames,
                });
            }
            t.push(r);
        }
        out.tables.push(t);
    }

    /// AF_XDP on several queues: every queue's socket served at least half an even
    /// share of the frames, per round.
    pub(super) fn queues_check(&self, runs: &Runs<'_>) -> Check {
        let spec = Spec::at_least(
            "rr.queues-af-xdp-every-queue",
            "AF_XDP with a socket per receive queue: the least-served queue's share of the frames, % of an even share",
            50.0,
            "%",
        );
        let queues = LANE_QUEUES as usize;
        if self.clients < CLIENTS_PER_QUEUE * queues {
            return spec.skipped(format!(
                "{} clients' flows need not reach every one of {queues} queues: at least {} are needed",
                self.clients,
                CLIENTS_PER_QUEUE * queues
            ));
        }
        match runs.find(Part::Queues, &queues_label(RxPathKind::AfXdp)) {
            Some(rs) => spec.evaluate(rs.iter().map(|r| least_served(r, queues)).collect(), "per round"),
            None => spec.skipped("the queues part did not run af-xdp"),
        }
    }
}

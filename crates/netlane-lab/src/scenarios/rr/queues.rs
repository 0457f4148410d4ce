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

/// The least-served queue's share of the frames, % of an even share: 100 when every
/// queue's socket delivered as many frames.
pub(super) fn least_served(r: &RrRun) -> Measure {
    let x = r.server.xdp.as_ref().ok_or("not an AF_XDP server")?;
    let q = &x.frames_per_queue;
    if q.len() < 2 {
        return Err(format!("{} receive queue(s) with a socket: nothing to spread over", q.len()));
    }
    let total: u64 = q.iter().sum();
    if total == 0 {
        return Err("no queue's socket delivered a frame".into());
    }
    let least = q.iter().copied().min().unwrap_or(0);
    Ok(least as f64 * q.len() as f64 / total as f64 * 100.0)
}

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
            r.cells.push(if *p == RxPathKind::AfXdp { med(rs, least_served) } else { Value::Missing });
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
        match runs.find(Part::Queues, &queues_label(RxPathKind::AfXdp)) {
            Some(rs) => spec.evaluate(rs.iter().map(least_served).collect(), "per round"),
            None => spec.skipped("the queues part did not run af-xdp"),
        }
    }
}

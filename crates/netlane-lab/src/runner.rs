//! The one runner every scenario measures with: rounds, their rotation, the labels and
//! progress lines of each run, and the run records of the report.
//!
//! A scenario has modes (the things it compares). A round runs every mode once, in an
//! order rotated from round to round ([`crate::stats::round_order`]): a run's position
//! after another measurably shifts its cost, and a ratio between two modes is formed
//! from the two runs of one round, taken minutes apart at most. The runner hands each
//! run its [`Turn`] (which round, how many) and keeps the records; the scenario says what
//! one run is ([`Measured`]) and judges the results ([`crate::verdict`]).

use anyhow::Result;
use serde::Serialize;

use crate::progress::Progress;
use crate::stats::round_order;
use netlane_report::RunRecord;

/// What one run measured, as the runner shows and records it.
pub trait Measured: Serialize {
    /// One line for the progress display.
    fn summary(&self) -> String;
    /// Its figures for the runs table and CSV, units in the names; `None` where undefined.
    fn figures(&self) -> Vec<(&'static str, Option<f64>)>;
    /// The kernel paths that ran, where the run knows them.
    fn path(&self) -> Vec<String> {
        Vec::new()
    }
}

/// One mode's run in one round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turn {
    /// The round, from 0.
    pub round: usize,
    /// How many rounds the mode runs.
    pub rounds: u32,
}

impl Turn {
    /// `what` as the progress display says it: with the round when there are several.
    pub fn label(&self, what: &str) -> String {
        if self.rounds > 1 { format!("{what} #{}", self.round + 1) } else { what.to_string() }
    }
}

/// Runs a scenario's modes in rounds and keeps what each run recorded.
pub struct Runner<'p> {
    progress: &'p dyn Progress,
    records: Vec<RunRecord>,
}

impl std::fmt::Debug for Runner<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner").field("records", &self.records.len()).finish_non_exhaustive()
    }
}

impl<'p> Runner<'p> {
    /// A runner that reports on `progress`.
    pub fn new(progress: &'p dyn Progress) -> Runner<'p> {
        Runner { progress, records: Vec::new() }
    }

    /// Where runs are said.
    pub fn progress(&self) -> &'p dyn Progress {
        self.progress
    }

    /// The record index the next run gets (from 1, in execution order).
    pub fn next_index(&self) -> u32 {
        self.records.len() as u32 + 1
    }

    /// Runs `modes` modes, mode `i` in `rounds(i)` rounds, each round in rotated order;
    /// `one(runner, i, turn)` makes mode `i`'s run of a round. Returns each mode's
    /// results in round order.
    pub fn rounds<T>(
        &mut self,
        modes: usize,
        rounds: impl Fn(usize) -> u32,
        one: impl FnMut(&mut Self, usize, Turn) -> Result<T>,
    ) -> Result<Vec<Vec<T>>> {
        self.rounds_then(modes, rounds, one, |_, _| Ok(()))
    }

    /// [`Runner::rounds`], with `after(runner, round)` run at the end of every round.
    pub fn rounds_then<T>(
        &mut self,
        modes: usize,
        rounds: impl Fn(usize) -> u32,
        mut one: impl FnMut(&mut Self, usize, Turn) -> Result<T>,
        mut after: impl FnMut(&mut Self, usize) -> Result<()>,
    ) -> Result<Vec<Vec<T>>> {
        let mut out: Vec<Vec<T>> = (0..modes).map(|_| Vec::new()).collect();
        let most = (0..modes).map(&rounds).max().unwrap_or(0);
        for round in 0..most as usize {
            for i in round_order(modes, round) {
                let of = rounds(i);
                if round < of as usize {
                    out[i].push(one(self, i, Turn { round, rounds: of })?);
                }
            }
            after(self, round)?;
        }
        Ok(out)
    }

    /// One run: said as started, made by `run(label)`, said as finished with its
    /// summary, and recorded under `what`.
    pub fn measure<T: Measured>(&mut self, turn: Turn, what: &str, run: impl FnOnce(&str) -> Result<T>) -> Result<T> {
        let label = turn.label(what);
        self.progress.start(&label);
        let r = run(&label)?;
        self.progress.finish(&label, &r.summary());
        let mut rec = RunRecord::new(self.next_index(), turn.round as u32 + 1, what, r.figures());
        rec.path = r.path();
        rec.detail = serde_json::to_value(&r).unwrap_or_default();
        self.records.push(rec);
        Ok(r)
    }

    /// A step that is not recorded (a warm-up): said as started, made by `run(label)`,
    /// said as finished with the line it returns.
    pub fn step<T>(&mut self, turn: Turn, what: &str, run: impl FnOnce(&str) -> Result<(T, String)>) -> Result<T> {
        let label = turn.label(what);
        self.progress.start(&label);
        let (r, line) = run(&label)?;
        self.progress.finish(&label, &line);
        Ok(r)
    }

    /// Records a run measured by other means (a search of many runs) under `what`.
    pub fn record(
        &mut self,
        turn: Turn,
        what: &str,
        figures: Vec<(&'static str, Option<f64>)>,
        detail: &impl Serialize,
    ) {
        let mut rec = RunRecord::new(self.next_index(), turn.round as u32 + 1, what, figures);
        rec.detail = serde_json::to_value(detail).unwrap_or_default();
        self.records.push(rec);
    }

    /// The records, in execution order.
    pub fn into_records(self) -> Vec<RunRecord> {
        self.records
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::Silent;

    #[derive(Serialize)]
    struct Ran(usize);

    impl Measured for Ran {
        fn summary(&self) -> String {
            format!("mode {}", self.0)
        }
        fn figures(&self) -> Vec<(&'static str, Option<f64>)> {
            vec![("mode", Some(self.0 as f64)), ("nothing", None)]
        }
    }

    #[test]
    fn rounds_rotate_and_each_mode_runs_its_own_count() {
        let mut r = Runner::new(&Silent);
        let mut order = Vec::new();
        let mut ends = Vec::new();
        let all = r
            .rounds_then(
                3,
                |i| if i == 2 { 1 } else { 2 },
                |r, i, turn| {
                    order.push((turn.round, i));
                    r.measure(turn, &format!("m{i}"), |_| Ok(Ran(i)))
                },
                |_, round| {
                    ends.push(round);
                    Ok(())
                },
            )
            .unwrap();
        assert_eq!(order, vec![(0, 0), (0, 1), (0, 2), (1, 1), (1, 0)]);
        assert_eq!(ends, vec![0, 1]);
        assert_eq!(all.iter().map(Vec::len).collect::<Vec<_>>(), vec![2, 2, 1]);
        let recs = r.into_records();
        let idx: Vec<(u32, u32, &str)> = recs.iter().map(|x| (x.index, x.round, x.label.as_str())).collect();
        assert_eq!(idx, vec![(1, 1, "m0"), (2, 1, "m1"), (3, 1, "m2"), (4, 2, "m1"), (5, 2, "m0")]);
        assert_eq!(recs[0].metrics.len(), 1, "undefined figures are left out");
    }

    #[test]
    fn labels_carry_the_round_only_when_there_are_several() {
        assert_eq!(Turn { round: 1, rounds: 3 }.label("gso"), "gso #2");
        assert_eq!(Turn { round: 0, rounds: 1 }.label("gso"), "gso");
    }

    #[test]
    fn a_failed_run_stops_the_rounds() {
        let mut r = Runner::new(&Silent);
        let e = r.rounds(2, |_| 2, |_, i, _| if i == 1 { anyhow::bail!("broke") } else { Ok(i) }).unwrap_err();
        assert_eq!(e.to_string(), "broke");
    }
}

//! The soak's report: one row and a set of checks per server, each check invalid when
//! the soak did nothing (no valid request answered, no hostile operation made).

use netlane_report::{Check, Column, Row, RunRecord, ScenarioReport, Table, Value};

use super::measure::Soak;
use super::{NVME_BLOCK, NVME_IMAGE_BYTES, SoakArgs, SoakServer};
use crate::scenarios::{Heading, Sections};
use crate::verdict::Spec;

fn mib(b: u64) -> f64 {
    b as f64 / f64::from(1 << 20)
}

impl SoakArgs {
    pub(super) fn report(&self, soaks: &[Soak], plan: Vec<netlane_report::RoleCpus>) -> ScenarioReport {
        let mut table = Table::new(
            "soak",
            format!("Each server for {:?} under valid load beside hostile clients", self.time),
            vec![
                Column::new("server", "server", 0),
                Column::new("valid", "valid requests", 0),
                Column::new("failed", "failed", 0),
                Column::new("p99_ms", "p99 ms", 2),
                Column::new("hostile", "hostile ops", 0),
                Column::new("peak_rss_mib", "peak RSS MiB", 1),
                Column::new("late_growth_mib", "growth after 1/3 MiB", 1),
                Column::new("peak_fds", "peak fds", 0),
                Column::new("read_back", "read back after kill -9", 0),
                Column::new("edits", "edits applied / refused", 0),
                Column::new("forwarding", "balancer: sent on / dropped / passed", 0),
            ],
        );
        let mut out = Sections::default();
        let mut runs = Vec::new();
        for (i, s) in soaks.iter().enumerate() {
            table.push(row(s));
            out.checks.extend(self.checks(s));
            runs.push(record(i, s));
        }
        out.tables.push(table);
        let met = out.checks.iter().filter(|c| c.outcome == netlane_report::Outcome::Met).count();
        let heading = Heading {
            title: "Soak: servers under valid load beside hostile clients".into(),
            description: DESCRIPTION.into(),
            headline: format!("{met} of {} soak checks met", out.checks.len()),
        };
        out.report(self, heading, runs, plan)
    }

    /// One server's checks.
    fn checks(&self, s: &Soak) -> Vec<Check> {
        let w = s.server.name();
        let growth = s.late_growth();
        let mut checks = Vec::new();
        // A soak that did nothing proves nothing.
        let idle = if s.valid.completed == 0 {
            Some("the valid client completed nothing")
        } else if s.hostile_ops == 0 {
            Some("the hostile clients did nothing")
        } else if s.edits.is_some_and(|(applied, kept)| applied == 0 || kept == 0) {
            Some("the balancer saw no good edit or no bad one")
        } else if s.forwarding.as_ref().is_some_and(|f| f.as_ref().is_ok_and(|f| f.dropped == 0)) {
            Some("no hostile frame reached the balancer (it dropped none)")
        } else {
            None
        };
        let spec_failed = Spec::at_most(
            &format!("soak.{w}_valid_failed"),
            format!("{w}: valid requests that failed or were lost beside hostile clients"),
            0.0,
            "requests",
        );
        let spec_p99 = Spec::at_most(
            &format!("soak.{w}_valid_p99"),
            format!("{w}: the valid client's p99 latency beside hostile clients"),
            self.p99_ms as f64,
            "ms",
        );
        let spec_growth = Spec::at_most(
            &format!("soak.{w}_rss_growth"),
            format!("{w}: the server's resident memory growth from a third of the run to its end"),
            self.growth_mib as f64,
            "MiB",
        );
        let spec_fds = Spec::at_most(
            &format!("soak.{w}_fds"),
            if s.server == SoakServer::Lb {
                format!("{w}: the balancer's open file descriptors (its maps, programs and files; none per flow)")
            } else {
                format!("{w}: the server's open file descriptors (its connection limit plus its own)")
            },
            s.fd_limit as f64,
            "fds",
        );
        let how = "one soak: the valid client's own report, the server sampled every 250 ms from /proc where it runs";
        // Memory and descriptors sampled over less than half the run prove nothing of it.
        let (span, time) = (s.sampled_span(), self.time.as_secs_f64());
        let unsampled = (span < time / 2.0).then(|| {
            format!("the server was sampled over {span:.1} s of the {time:.1} s run ({} samples)", s.samples.len())
        });
        match idle {
            Some(why) => {
                checks.extend([&spec_failed, &spec_p99, &spec_growth, &spec_fds].map(|c| c.invalid(why)));
            }
            None => {
                checks.push(spec_failed.evaluate(vec![Ok(s.valid.failed as f64)], how));
                checks.push(spec_p99.evaluate(vec![Ok(s.valid.p99_ms)], how));
                match &unsampled {
                    Some(why) => checks.extend([spec_growth.invalid(why), spec_fds.invalid(why)]),
                    None => {
                        let growth = growth.map(mib).ok_or_else(|| "the server was not sampled".to_string());
                        checks.push(spec_growth.evaluate(vec![growth], how));
                        checks.push(spec_fds.evaluate(vec![Ok(s.peak(|x| x.fds) as f64)], how));
                    }
                }
            }
        }
        if let Some(f) = &s.forwarding {
            let spec = Spec::at_most(
                &format!("soak.{w}_stop"),
                format!("{w}: stops on SIGTERM within 10 s, exit 0, with its report written"),
                0.0,
                "failures",
            );
            checks.push(match f {
                Ok(_) => spec.evaluate(vec![Ok(0.0)], "SIGTERM after the soak; its --json report read"),
                Err(e) => spec.evaluate(vec![Ok(1.0)], e),
            });
        }
        if let Some(rb) = &s.read_back {
            let spec = Spec::at_least(
                &format!("soak.{w}_read_back"),
                format!("{w}: blocks read back intact after SIGKILL and a restart on the same file (all of them)"),
                (NVME_IMAGE_BYTES / NVME_BLOCK) as f64,
                "blocks",
            );
            checks.push(match rb {
                Ok(n) => spec.evaluate(vec![Ok(*n as f64)], "nvme perf --verify-only over every block"),
                Err(e) => spec.evaluate(vec![Ok(0.0)], e),
            });
        }
        checks
    }
}

/// One server's row.
fn row(s: &Soak) -> Row {
    let w = s.server.name();
    let growth = s.late_growth();
    Row::new(vec![
        Value::text(&w),
        Value::num(s.valid.completed as f64),
        Value::num(s.valid.failed as f64),
        Value::num(s.valid.p99_ms),
        Value::num(s.hostile_ops as f64),
        Value::num(mib(s.peak(|x| x.rss))),
        growth.map_or(Value::text("-"), |g| Value::num(mib(g))),
        Value::num(s.peak(|x| x.fds) as f64),
        match &s.read_back {
            None => Value::text("-"),
            Some(Ok(n)) => Value::text(format!("{n} blocks")),
            Some(Err(_)) => Value::text("FAILED"),
        },
        s.edits.map_or(Value::text("-"), |(a, k)| Value::text(format!("{a} / {k}"))),
        match &s.forwarding {
            None => Value::text("-"),
            Some(Ok(f)) => Value::text(format!("{} / {} / {}", f.tx, f.dropped, f.passed)),
            Some(Err(_)) => Value::text("FAILED"),
        },
    ])
}

/// One server's run record.
fn record(i: usize, s: &Soak) -> RunRecord {
    let growth = s.late_growth();
    let mut metrics = std::collections::BTreeMap::new();
    metrics.insert("valid_completed".into(), s.valid.completed as f64);
    metrics.insert("valid_failed".into(), s.valid.failed as f64);
    metrics.insert("valid_p99_ms".into(), s.valid.p99_ms);
    metrics.insert("hostile_ops".into(), s.hostile_ops as f64);
    metrics.insert("peak_rss_bytes".into(), s.peak(|x| x.rss) as f64);
    metrics.insert("peak_fds".into(), s.peak(|x| x.fds) as f64);
    if let Some(g) = growth {
        metrics.insert("late_growth_bytes".into(), g as f64);
    }
    if let Some((applied, kept)) = s.edits {
        metrics.insert("edits_applied".into(), applied as f64);
        metrics.insert("edits_refused".into(), kept as f64);
    }
    RunRecord {
        index: i as u32 + 1,
        round: 1,
        label: s.server.name(),
        metrics,
        path: vec![s.path.into()],
        detail: s.valid.detail.clone(),
    }
}

/// What the soak does, for the report.
const DESCRIPTION: &str = "Each server runs as a process of its own for the whole time, with netlane's own client \
    sending valid requests at a fixed rate and hostile clients beside it: junk, impossible lengths, \
    oversized values and responses, connections that start a message and stall (up to the hostile \
    connection count). The balancer forwards the valid client's datagrams to two reals on veth while \
    malformed frames from random sources reach it and its configuration is edited every 300 ms, \
    alternately well and badly (a parse error, no reals, a bad address, a FIFO, a file over the size \
    limit). Memory and descriptors are read from /proc every 250 ms on the server's own machine (over less \
    than half the run, their checks are invalid); the NVMe target is then killed with SIGKILL and \
    started again on the same file, and every block is read back.";

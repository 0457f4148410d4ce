//! The nvme scenario's target checks, and the quantities they compare: IOPS per host
//! CPU-second, the readers' latency percentiles and IOPS, each invalid when its run was
//! degenerate.

use netlane::metrics::Summary;
use netlane_nvme::perf::PerfReport;

use super::options::{NvmeBenchArgs, Part};
use super::plan::Mode;
use crate::verdict::{Measure, Spec, paired, positive, rate};
use netlane_report::Check;

/// Every mode's runs in round order, found by part and label.
#[derive(Clone, Copy)]
pub(super) struct Results<'a> {
    pub(super) modes: &'a [Mode],
    pub(super) all: &'a [Vec<PerfReport>],
}

impl<'a> Results<'a> {
    /// The runs of the mode `label` of `part`, when it ran.
    pub(super) fn find(&self, part: Part, label: &str) -> Option<&'a [PerfReport]> {
        self.modes.iter().position(|m| m.part == part && m.label == label).map(|i| &self.all[i][..])
    }

    /// A check on the per-round ratio f(a) / f(b) of two modes of `part`.
    fn compare(&self, spec: Spec, part: Part, a: &str, b: &str, f: Of, what: &str) -> Check {
        match (self.find(part, a), self.find(part, b)) {
            (Some(x), Some(y)) => spec.evaluate(paired(x, y, f), &format!("{what}, per round")),
            _ => spec.skipped(format!("the {} part did not run", part.name())),
        }
    }
}

pub(super) fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

/// The host's CPU seconds over the window: nvme perf's process and, where NAPI is
/// threaded, the host's NAPI threads towards the target (its receive work runs there);
/// invalid when those threads could not be read.
pub(super) fn host_cpu_s(r: &PerfReport) -> Measure {
    let napi = if r.host_napi_threads.is_empty() {
        0.0
    } else {
        let us = r.host_napi_cpu_us_per_io.ok_or("the host's NAPI threads' CPU time could not be read")?;
        us * r.ops as f64 / 1e6
    };
    Ok(r.host_cpu.total_s() + napi)
}

/// IOPS per host CPU-second (the NAPI threads' included).
pub(super) fn per_core(r: &PerfReport) -> Measure {
    rate(r.ops as f64, host_cpu_s(r)?, "host CPU")
}

/// Host CPU microseconds per command (the NAPI threads' included).
pub(super) fn host_us_per_io(r: &PerfReport) -> Measure {
    let ops = positive(r.ops as f64, "commands")?;
    positive(host_cpu_s(r)? * 1e6 / ops, "host CPU per I/O")
}

/// The main group's (the readers') latency percentile, degenerate when nothing completed.
pub(super) fn lat(r: &PerfReport, f: fn(&Summary) -> u64, what: &str) -> Measure {
    let s = &r.groups[0].read_lat_ns;
    if s.count == 0 {
        return Err(format!("no {} completed: empty latency histogram", r.groups[0].name));
    }
    positive(f(s) as f64, what)
}

pub(super) fn p50(r: &PerfReport) -> Measure {
    lat(r, |s| s.p50, "p50")
}

pub(super) fn p9999(r: &PerfReport) -> Measure {
    lat(r, |s| s.p9999, "p99.99")
}

pub(super) fn iops(r: &PerfReport) -> Measure {
    positive(r.groups[0].iops, &format!("{} IOPS", r.groups[0].name))
}

/// The readers' (the main group's) mean latency, ns.
pub(super) fn mean(r: &PerfReport) -> Measure {
    if r.groups[0].read_lat_ns.count == 0 {
        return Err(format!("no {} completed", r.groups[0].name));
    }
    positive(r.groups[0].read_lat_ns.mean, "mean latency")
}

/// The mixed workload's writer's MB/s.
pub(super) fn writer_mb_per_s(r: &PerfReport) -> Measure {
    positive(r.groups.get(1).ok_or("no writer")?.mb_per_s, "the writer's MB/s")
}

/// The share of the target's CPU its process (and threads) were busy over the window,
/// %, when perf could read it.
pub(super) fn target_busy_pct(r: &PerfReport) -> Measure {
    let us = r.target_cpu_us_per_io.ok_or("the target's CPU was not read")?;
    Ok(us * r.ops as f64 / 1e6 / positive(r.seconds, "seconds")? * 100.0)
}

pub(super) fn opt(o: Option<f64>, what: &str) -> Measure {
    o.ok_or_else(|| format!("no {what}"))
}

/// How a check reads one run.
type Of = fn(&PerfReport) -> Measure;

/// The wake-up check compares two ways of waking the queue's worker: a round where they
/// woke it alike (a worker that never slept) compares nothing. Why, if so.
fn wakes_alike(found: Results<'_>, spec: &Spec) -> Option<String> {
    if spec.id() != "nvme.qd32-wake-batch-end" {
        return None;
    }
    let (Some(end), Some(each)) = (found.find(Part::Qd32, "batched"), found.find(Part::Qd32, super::plan::WOKEN_EACH))
    else {
        return None;
    };
    end.iter().zip(each).find_map(|(a, b)| match (a.worker_wakes_per_io, b.worker_wakes_per_io) {
        (Some(x), Some(y)) if x < 0.5 * y => None,
        (x, y) => Some(format!("the two modes woke the worker alike ({x:?} and {y:?} per I/O): nothing to compare")),
    })
}

/// One target check: its part, its spec, the two modes it sets side by side, what it
/// reads of a run, and how its ratio is said.
type Pair = (Part, Spec, &'static str, &'static str, Of, &'static str);

impl NvmeBenchArgs {
    /// The target checks of the parts that ran, in the parts' order: each a ratio of two
    /// of a part's modes, per round.
    pub(super) fn checks(&self, found: Results<'_>) -> Vec<Check> {
        queue_pairs()
            .into_iter()
            .chain(map_pairs())
            .chain(super::polling::polling_pairs())
            .filter(|(part, ..)| self.parts.contains(part))
            .map(|(part, spec, a, b, f, what)| {
                if let Some(c) = super::polling::polling_verdict(found, &spec, a, b) {
                    return c;
                }
                match wakes_alike(found, &spec) {
                    Some(why) => spec.invalid(why),
                    None => found.compare(spec, part, a, b, f, what),
                }
            })
            .collect()
    }
}

/// The target checks of the QD1 and QD32 parts: how a queue sends.
fn queue_pairs() -> [Pair; 4] {
    [
        (
            Part::Qd1,
            Spec::below(
                "nvme.qd1-direct-send",
                "QD1: direct send lowers p50 latency (saves the hand-off to the I/O worker)",
                1.0,
                "x",
            ),
            "direct send",
            "I/O worker",
            p50,
            "direct send / I/O worker p50",
        ),
        (
            Part::Qd1,
            Spec::below(
                "nvme.qd1-polling",
                "QD1: polling lowers p50 latency further (no receive-side switch)",
                1.0,
                "x",
            ),
            "poll queue",
            "direct send",
            p50,
            "poll queue / direct send p50",
        ),
        (
            Part::Qd32,
            Spec::above(
                "nvme.qd32-batching",
                "QD32: batching raises IOPS per host core over one send per command",
                1.0,
                "x",
            ),
            "batched",
            "send per command",
            per_core,
            "batched / send per command IOPS per host core",
        ),
        (
            Part::Qd32,
            Spec::at_least(
                "nvme.qd32-wake-batch-end",
                "QD32: waking the queue's worker once a batch is complete (the block layer's rule) keeps IOPS \
                     per host core against waking it for every command",
                1.0,
                "x",
            ),
            "batched",
            super::plan::WOKEN_EACH,
            per_core,
            "batch-end / per-command wake-ups IOPS per host core",
        ),
    ]
}

/// The target checks of the mixed and affinity parts: which queue and CPU a command
/// takes.
fn map_pairs() -> [Pair; 6] {
    [
        (
            Part::Mixed,
            Spec::at_least(
                "nvme.mixed-read-iops",
                "Mixed: separate queue maps raise the readers' IOPS (talk: more than 2x)",
                2.0,
                "x",
            ),
            "separate maps",
            "shared map",
            iops,
            "separate / shared readers' IOPS",
        ),
        (
            Part::Mixed,
            Spec::at_least(
                "nvme.mixed-read-p9999",
                "Mixed: separate queue maps cut the readers' p99.99 latency (talk: about 10x)",
                5.0,
                "x lower",
            ),
            "shared map",
            "separate maps",
            p9999,
            "shared / separate readers' p99.99",
        ),
        (
            Part::Mixed,
            Spec::at_least(
                "nvme.mixed-read-mean",
                "Mixed: separate queue maps cut the readers' mean latency (talk: about 2x)",
                2.0,
                "x lower",
            ),
            "shared map",
            "separate maps",
            mean,
            "shared / separate readers' mean latency",
        ),
        (
            Part::Mixed,
            Spec::at_least(
                "nvme.mixed-writer",
                "Mixed: separate queue maps keep the writer's throughput (talk: throughput improves)",
                1.0,
                "x",
            ),
            "separate maps",
            "shared map",
            writer_mb_per_s,
            "separate / shared writer MB/s",
        ),
        (
            Part::Affinity,
            Spec::below(
                "nvme.affinity-qd1",
                "Affinity: an aligned I/O worker lowers QD1 p50 latency (talk: 30 -> 27 us, 0.9x)",
                1.0,
                "x",
            ),
            "QD1 aligned",
            "QD1 crossed",
            p50,
            "aligned / crossed p50",
        ),
        (
            Part::Affinity,
            Spec::at_least(
                "nvme.affinity-qd32",
                "Affinity: an aligned I/O worker raises QD32 IOPS per host core (talk: 180 K -> 230 K, 1.28x)",
                1.2,
                "x",
            ),
            "QD32 aligned",
            "QD32 crossed",
            per_core,
            "aligned / crossed IOPS per host core",
        ),
    ]
}

//! The polling part: QD1 completions taken in by interrupts (with and without
//! moderation), by a job spinning on poll queues in user space, and by the kernel's busy
//! polling from the job (alone, preferred with interrupts deferred, with IRQs suspended,
//! with the device coalescing its interrupts): its modes, its checks and its table.

use netlane::lanes::Knob;
use netlane::topology::ethtool::Values;
use netlane::topology::netdev::NapiSettings;
use netlane_nvme::perf::PerfReport;
use netlane_nvme::perf::{JobGroup, PerfOptions};
use netlane_report::{Check, Column, Row, Table, Value};

use super::checks::{Results, host_us_per_io, opt, p50};
use super::options::{NvmeBenchArgs, Part};
use super::plan::Mode;
use crate::scenarios::Sections;
use crate::stats::med;
use crate::verdict::{Measure, Spec};

/// The interrupt-driven baseline: direct send on a default queue (as Linux hosts run).
pub(super) const INTERRUPTS: &str = "interrupts";
/// The same with the host end's interrupts deferred (the stand-in for coalescing).
pub(super) const INTERRUPTS_DEFERRED: &str = "interrupts deferred";
/// A poll queue reaped by the job spinning in user space.
pub(super) const SPINNING: &str = "spinning";
/// A poll queue reaped with the kernel's busy polling, nothing else changed.
pub(super) const BUSY: &str = "busy polling";
/// Busy polling preferred over the NAPI thread, interrupts deferred while it polls.
pub(super) const BUSY_DEFERRED: &str = "busy polling, interrupts deferred";
/// The same with IRQ suspension while polling keeps finding completions.
pub(super) const BUSY_SUSPENDED: &str = "busy polling, IRQs suspended";
/// Busy polling as [`BUSY`], the device holding its interrupts off itself (a NIC's
/// coalescing: the talk's "works even better when the device holds off interrupts").
pub(super) const BUSY_COALESCED: &str = "busy polling, device coalescing";

/// The part's modes in the order they are tabled.
pub(super) const POLLING_MODES: [&str; 7] =
    [INTERRUPTS, INTERRUPTS_DEFERRED, SPINNING, BUSY, BUSY_DEFERRED, BUSY_SUSPENDED, BUSY_COALESCED];

/// Interrupt coalescing's stand-in for interrupt-driven queues: two empty polls, then
/// interrupts held off for 20 us.
const COALESCED: NapiSettings =
    NapiSettings { defer_hard_irqs: Some(2), gro_flush_timeout_ns: Some(20_000), irq_suspend_timeout_ns: None };

/// Interrupts held off while busy polling runs: longer than a command's round trip, so
/// that the watchdog does not schedule the NAPI thread between two polls.
const HELD_OFF: NapiSettings =
    NapiSettings { defer_hard_irqs: Some(2), gro_flush_timeout_ns: Some(200_000), irq_suspend_timeout_ns: None };

/// The device's coalescing for [`BUSY_COALESCED`], on the NVMe host's device towards the
/// target (on a testbed, its first client's NIC): receive interrupts held off 100 us,
/// longer than a QD1 command's round trip, so that the busy poll takes the completion in
/// first. Adaptive moderation, where a NIC runs it, may change the hold-off, and is not
/// asked off here (a NIC without it would refuse the whole setting): that client's `nic`
/// settings in the testbed file turn it off (`coalesce.adaptive-rx=off`). The knob reads
/// back what the driver made of it.
pub(super) fn coalescing() -> Values {
    [("rx-usecs".to_string(), 100)].into()
}

/// How long `epoll_wait` busy polls before the job sleeps (longer than a command takes
/// here, so that the fallback is for idle queues), and its budget.
const BUSY_POLL: netlane::lanes::BusyPoll =
    netlane::lanes::BusyPoll { usecs: 1000, budget: netlane::lanes::busy::DEFAULT_BUDGET, prefer: false };

impl NvmeBenchArgs {
    /// Whether the polling part can run: loopback has no NAPI instance to poll or to
    /// moderate.
    pub(super) fn polling_here(&self) -> bool {
        self.path == crate::scenarios::net::PathKind::Veth || self.on.testbed.is_some()
    }

    /// The polling part's modes from `base` (the options every mode shares).
    pub(super) fn polling_modes(&self, base: &dyn Fn(Vec<JobGroup>) -> PerfOptions, reader: JobGroup) -> Vec<Mode> {
        let hipri = JobGroup { hipri: true, ..reader.clone() };
        let direct = PerfOptions { direct_send: true, ..base(vec![reader]) };
        let poll = PerfOptions { poll_queues: 1, ..base(vec![hipri]) };
        let prefer = netlane::lanes::BusyPoll { prefer: true, ..BUSY_POLL };
        let suspended = NapiSettings { irq_suspend_timeout_ns: Some(20_000_000), ..HELD_OFF };
        let busy = PerfOptions { busy_poll: Some(BUSY_POLL), ..poll.clone() };
        let m = |label: &str, opts| Mode { part: Part::Polling, label: label.to_string(), opts };
        vec![
            m(INTERRUPTS, direct.clone()),
            m(INTERRUPTS_DEFERRED, PerfOptions { napi: COALESCED, ..direct }),
            m(SPINNING, poll.clone()),
            m(BUSY, busy.clone()),
            m(BUSY_DEFERRED, PerfOptions { busy_poll: Some(prefer), napi: HELD_OFF, ..poll.clone() }),
            m(BUSY_SUSPENDED, PerfOptions { busy_poll: Some(prefer), napi: suspended, ..poll }),
            m(BUSY_COALESCED, PerfOptions { coalesce: coalescing(), ..busy }),
        ]
    }

    /// Where each mode's completions were taken in: a table.
    pub(super) fn polling_section(&self, found: Results<'_>, out: &mut Sections) {
        if !self.polling_here() {
            out.notes.push(
                "Left out: the polling part (on loopback there is no NAPI instance to busy poll or to moderate)."
                    .into(),
            );
            return;
        }
        let mut t = Table::new(
            "nvme-polling",
            format!("QD1 4 KiB random read, where completions are taken in, medians of {} rounds", self.repeat),
            vec![
                Column::new("mode", "mode", 0),
                Column::new("p50_us", "p50 us", 1),
                Column::new("p99_us", "p99 us", 1),
                Column::new("host_cpu_us_per_io", "host CPU us/IO (+NAPI)", 2),
                Column::new("busy_polled_packets_per_io", "busy-polled packets/IO", 2),
                Column::new("host_napi_runs_per_io", "NAPI thread runs/IO", 3),
                Column::new("job_sleeps_per_io", "job sleeps/IO", 3),
            ],
        );
        let mut not_shown = Vec::new();
        for label in POLLING_MODES {
            let Some(rs) = found.find(Part::Polling, label) else { continue };
            // A mode the device refused to coalesce for ran as busy polling alone: no row.
            if let Some(k) = refused_coalescing(rs) {
                not_shown.push(format!(
                    "Not shown on this machine: {label} (the NVMe host's device took no coalescing: {k})."
                ));
                continue;
            }
            t.push(Row::new(vec![
                Value::text(label),
                med(rs, |r| p50(r).map(|v| v / 1e3)),
                med(rs, |r| super::checks::lat(r, |s| s.p99, "p99").map(|v| v / 1e3)),
                med(rs, host_us_per_io),
                med(rs, |r| opt(r.busy_polled_packets_per_io, "busy-polled packets")),
                med(rs, |r| opt(r.host_napi_runs_per_io, "NAPI thread runs")),
                med(rs, |r| opt(r.job_sleeps_per_io, "job sleeps")),
            ]));
        }
        out.tables.push(t);
        out.notes.push(
            "Polling part: the target end sends without TSO for these modes (a veth hands TSO segments to the \
             receiving side's backlog, past its NAPI instance, leaving busy polling nothing to take in). NAPI \
             thread runs per I/O count the host end's NAPI thread being put on a CPU: woken by the target's \
             transmit (a NIC's interrupt) or by the deferral's timer. Job sleeps per I/O count the poll job \
             blocking: its busy poll ended with nothing (the interrupt-driven fallback), or the scheduler cut its \
             busy loop short and it slept."
                .into(),
        );
        for label in POLLING_MODES {
            let runs = found.find(Part::Polling, label).unwrap_or_default();
            let mut refused: Vec<String> = runs
                .iter()
                .flat_map(|r| &r.knobs)
                .filter(|k| !k.applied() && !is_coalescing(k))
                .map(|k| k.to_string())
                .collect();
            refused.sort();
            refused.dedup();
            if !refused.is_empty() {
                out.notes.push(format!("Polling part: {label} ran without what it asked for: {}.", refused.join("; ")));
            }
        }
        out.notes.extend(not_shown);
    }
}

/// Whether `k` is the device's coalescing (as `apply_coalescing_towards` names it).
fn is_coalescing(k: &Knob) -> bool {
    k.name.ends_with(" coalesce")
}

/// The device's refusal to coalesce in any of `runs`.
fn refused_coalescing(runs: &[PerfReport]) -> Option<&Knob> {
    runs.iter().flat_map(|r| &r.knobs).find(|k| !k.applied() && is_coalescing(k))
}

/// A busy-polling check, comparing mode `a` against `b`, that compares nothing: not shown
/// when the device refused the coalescing either mode asked for (whatever else was
/// refused: the mode cannot run anywhere like this device); invalid when a mode ran
/// without another setting it asked for, or busy polling took no packet in in some round
/// of `a`.
pub(super) fn polling_verdict(found: Results<'_>, spec: &Spec, a: &str, b: &str) -> Option<Check> {
    if !spec.id().starts_with("nvme.busy-poll") {
        return None;
    }
    let [ra, rb] = [a, b].map(|m| found.find(Part::Polling, m).unwrap_or_default());
    if let Some(k) = refused_coalescing(ra).or_else(|| refused_coalescing(rb)) {
        return Some(
            spec.not_shown_for("a device that coalesces its interrupts (the NVMe host's NIC)", &k.to_string()),
        );
    }
    if let Some(k) = ra.iter().chain(rb).flat_map(|r| &r.knobs).find(|k| !k.applied()) {
        return Some(spec.invalid(format!("a mode ran without what it asked for: {k}")));
    }
    ra.iter().find_map(|r| match r.busy_polled_packets_per_io {
        Some(p) if p > 0.5 => None,
        p => Some(spec.invalid(format!("busy polling took {p:?} packets per I/O in: it did not run"))),
    })
}

/// How a check reads one run.
type Of = fn(&netlane_nvme::perf::PerfReport) -> Measure;

/// The polling part's checks.
pub(super) fn polling_pairs() -> [(Part, Spec, &'static str, &'static str, Of, &'static str); 3] {
    [
        (
            Part::Polling,
            Spec::below(
                "nvme.busy-poll-qd1",
                "Polling: the kernel's busy polling from the submitter lowers QD1 p50 latency against interrupts \
                 (talk: another ~10%)",
                0.9,
                "x",
            ),
            BUSY_DEFERRED,
            INTERRUPTS,
            p50,
            "busy polling (interrupts deferred) / interrupts p50",
        ),
        (
            Part::Polling,
            Spec::below(
                "nvme.busy-poll-held-off",
                "Polling: busy polling works better when the device holds off interrupts (talk: 'works even \
                 better'): lower QD1 p50 preferred with interrupts deferred than busy polling alone",
                1.0,
                "x",
            ),
            BUSY_DEFERRED,
            BUSY,
            p50,
            "busy polling with / without interrupts held off p50",
        ),
        (
            Part::Polling,
            Spec::below(
                "nvme.busy-poll-coalesced",
                "Polling: busy polling works better when the device itself holds off interrupts (talk: 'works \
                 even better'): lower QD1 p50 with the device coalescing than busy polling alone",
                1.0,
                "x",
            ),
            BUSY_COALESCED,
            BUSY,
            p50,
            "busy polling with / without the device coalescing p50",
        ),
    ]
}

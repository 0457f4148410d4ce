//! The rr scenario's busy part: recvmmsg and AF_XDP without and with busy polling. Its
//! table, and its checks: busy polling may lower a path's median latency only where the
//! server really took datagrams from its queue by polling, which needs the socket to
//! have a NAPI id to poll (an AF_XDP socket on a veth has none).

use netlane_report::{Check, Column, Table, Value};

use crate::scenarios::Sections;
use crate::verdict::{Measure, Spec, positive, ratio};

use super::report::{columns, row};
use super::*;

/// The share of the datagrams the server read that its namespace's NAPI instances handed
/// over to a busy-polling reader, %.
pub(super) fn polled_share(r: &RrRun) -> Measure {
    let b = r.server.busy_poll.as_ref().ok_or("the server did not busy poll")?;
    let polled = b.rx_packets.ok_or("BusyPollRxPackets could not be read")?;
    if r.server.counters.frames == 0 {
        return Err("the server read nothing".into());
    }
    Ok(polled as f64 / r.server.counters.frames as f64 * 100.0)
}

/// The NAPI ids the busy-polling server's sockets had at the end, said as `name: id`.
fn napi_ids(r: &RrRun) -> String {
    let Some(b) = &r.server.busy_poll else { return String::new() };
    b.napi_ids
        .iter()
        .map(|(name, id)| format!("{name}: {}", id.map_or("unreadable".to_string(), |i| i.to_string())))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether every socket the server busy polled had NAPI id 0: the kernel gave it no
/// instance to poll.
fn nothing_to_poll(r: &RrRun) -> bool {
    r.server
        .busy_poll
        .as_ref()
        .is_some_and(|b| !b.napi_ids.is_empty() && b.napi_ids.iter().all(|(_, id)| *id == Some(0)))
}

/// The busy run's median latency, valid only when it took at least 1% of its datagrams
/// by polling (a run that polled next to nothing shows nothing about polling) and every
/// per-NAPI setting it asked for was applied.
fn polled_p50(r: &RrRun) -> Measure {
    if let Some(k) = r.server.napi.iter().find(|k| !k.applied()) {
        return Err(format!("a per-NAPI setting did not take: {k}"));
    }
    let share = polled_share(r)?;
    if share < 1.0 {
        return Err(format!(
            "busy polling took {share:.2}% of the {} datagrams (NAPI ids: {})",
            r.server.counters.frames,
            napi_ids(r)
        ));
    }
    p50(r)
}

/// The share of a lanes run's lanes whose socket had a NAPI id the lane owns at the end;
/// invalid unless every lane read datagrams and busy polling took some of them.
fn lanes_polling_their_own(r: &RrRun) -> Measure {
    let lanes = r.server.lanes.as_ref().ok_or("the server ran without lanes")?;
    let b = r.server.busy_poll.as_ref().ok_or("the server did not busy poll")?;
    if let Some(l) = lanes.lanes.iter().find(|l| l.frames == 0) {
        return Err(format!("lane {} read nothing: the flows did not reach every queue", l.lane));
    }
    let share = polled_share(r)?;
    if share < 1.0 {
        return Err(format!("busy polling took {share:.2}% of the datagrams"));
    }
    let own = lanes
        .lanes
        .iter()
        .filter(|l| {
            let prefix = format!("lane {} ", l.lane);
            b.napi_ids.iter().any(|(name, id)| name.starts_with(&prefix) && id.is_some_and(|i| l.napi_ids.contains(&i)))
        })
        .count();
    positive(lanes.lanes.len() as f64, "lanes").map(|n| own as f64 / n)
}

impl RrBenchArgs {
    /// The busy part's table: the common columns, the busy-polled share and the NAPI ids.
    pub(super) fn busy_section(&self, runs: &Runs<'_>, out: &mut Sections) {
        let mut columns = columns("path");
        columns.push(Column::new("polled_pct", "datagrams busy polled %", 1));
        columns.push(Column::new("napi_ids", "NAPI ids polled", 0));
        let mut t = Table::new(
            "rr-busy",
            format!(
                "Busy polling ({}) against sleeping in epoll, {} clients offering {}/s (Poisson), medians of {} \
                 rounds",
                self.busy_poll, self.clients, self.busy_load, self.repeat
            ),
            columns,
        );
        for p in BUSY_PATHS {
            for wait in Wait::ALL {
                let label = busy_label(p, wait);
                let Some(rs) = runs.find(Part::Busy, &label) else { continue };
                let mut r = row(&label, rs);
                r.cells.push(if wait == Wait::Sleep { Value::Missing } else { med(rs, polled_share) });
                r.cells.push(rs.last().map_or(Value::Missing, |x| Value::text(napi_ids(x))));
                t.push(r);
            }
        }
        if let Some(rs) = runs.find(Part::Busy, BUSY_LANES) {
            let mut r = row(BUSY_LANES, rs);
            r.cells.push(med(rs, polled_share));
            r.cells.push(rs.last().map_or(Value::Missing, |x| Value::text(napi_ids(x))));
            t.push(r);
        }
        out.tables.push(t);
        if self.on.testbed.is_none() {
            out.notes.push(
                "Busy polling: the server's NAPI thread runs on the server CPU. While the server polls, a datagram \
                 that woke the thread waits for the poll to end (the kernel does not busy poll an instance whose \
                 thread has been scheduled), which the plain busy-polling rows show. The deferred rows keep that \
                 wake-up off (prefer busy polling, 2 empty polls, a 20 us watchdog); a veth has no interrupt to \
                 defer, and while the server sleeps only the watchdog brings datagrams in. \"Datagrams busy \
                 polled\" counts those the server took from the queue itself (the namespace's BusyPollRxPackets)."
                    .to_string(),
            );
        }
    }

    /// Per path: busy polling's median latency against sleeping in epoll, per round,
    /// plain and with the device's interrupts deferred.
    pub(super) fn busy_checks(&self, runs: &Runs<'_>) -> Vec<Check> {
        let mut checks = Vec::new();
        for p in BUSY_PATHS {
            for wait in [Wait::Poll, Wait::Deferred] {
                let (id, how) = match wait {
                    Wait::Deferred => (
                        format!("rr.busy-poll-deferred-{}-p50", p.name()),
                        "busy polling with the device's interrupts deferred (per NAPI, the later upstream form of the talk's idea)",
                    ),
                    _ => (format!("rr.busy-poll-{}-p50", p.name()), "busy polling"),
                };
                let spec = Spec::at_most(
                    &id,
                    format!(
                        "{how} lowers {p}'s median latency: the server takes requests from its queue instead of \
                         waiting for the NAPI thread's wake-up"
                    ),
                    1.0,
                    "x",
                );
                let (busy, plain) = (busy_label(p, wait), busy_label(p, Wait::Sleep));
                checks.push(match (runs.find(Part::Busy, &busy), runs.find(Part::Busy, &plain)) {
                    (Some(x), _) if x.iter().any(nothing_to_poll) => spec.not_shown_for(
                        "a device whose driver gives the socket a NAPI instance to poll",
                        &format!(
                            "{p}'s sockets' NAPI ids were {} on {} (a veth gives an AF_XDP socket none)",
                            x.iter().find(|r| nothing_to_poll(r)).map(napi_ids).unwrap_or_default(),
                            if self.on.testbed.is_some() { "the testbed's interface" } else { "the veth" }
                        ),
                    ),
                    (Some(x), Some(y)) => spec.evaluate(
                        x.iter().zip(y).map(|(a, b)| ratio(polled_p50(a), p50(b))).collect(),
                        &format!("{busy} / {plain} median latency, per round"),
                    ),
                    _ => spec.skipped(format!("the busy part did not run {busy} and {plain}")),
                });
            }
        }
        if let Some(rs) = runs.find(Part::Busy, BUSY_LANES) {
            let spec = Spec::at_least(
                "rr.lanes-busy-poll-own-queue",
                "each lane of the datagram service busy polls the queue it owns (the share of lanes whose socket's \
                 NAPI id is their own)",
                1.0,
                "share",
            );
            checks.push(spec.evaluate(rs.iter().map(lanes_polling_their_own).collect(), "lanes, per round"));
        }
        checks
    }
}

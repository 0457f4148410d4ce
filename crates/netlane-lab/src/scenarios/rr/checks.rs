//! The rr scenario's target checks, and what they compare: the quantities taken from a
//! run (throughput, latency, the server CPU's idle share and cost per response, herds)
//! and the best fixed block each adaptive run is held against.

use std::time::Duration;

use netlane_report::Check;
use netlane_rr::server::{PathKind as RxPathKind, TxKind};

use crate::stats::median;
use crate::verdict::{Measure, Spec, paired, positive, ratio};

use super::*;

/// The adaptive mode's targets: this share of the best fixed block's rate, with the
/// server CPU this many percent idle.
pub(super) const ADAPTIVE_RATE: f64 = 0.9;
pub(super) const ADAPTIVE_IDLE: f64 = 30.0;

/// Responses per second, at the clients.
pub(super) fn throughput(r: &RrRun) -> Measure {
    positive(r.clients.responses_per_s, "responses per second")
}

/// The clients' median latency, ns.
pub(super) fn p50(r: &RrRun) -> Measure {
    if r.clients.latency_ns.count == 0 {
        return Err("no response completed: empty latency histogram".into());
    }
    positive(r.clients.latency_ns.p50 as f64, "p50 latency")
}

/// The lower of two samples; a failed sample wins (a population that measured nothing
/// must not hide behind one that did).
fn worst(a: Measure, b: Measure) -> Measure {
    match (a, b) {
        (Ok(x), Ok(y)) => Ok(x.min(y)),
        (Err(e), _) | (_, Err(e)) => Err(e),
    }
}

/// The server CPU's idle share over the run, %; degenerate when it answered nothing.
pub(super) fn idle(r: &RrRun) -> Measure {
    let c = &r.server_cpu;
    if r.server.counters.responses == 0 || c.total_s <= 0.0 {
        return Err("the server answered nothing, or no CPU time was counted".into());
    }
    Ok((1.0 - c.busy_s / c.total_s).clamp(0.0, 1.0) * 100.0)
}

/// Server CPU microseconds per response (thread, NAPI and softirq on the server CPU).
pub(super) fn cost(r: &RrRun) -> Measure {
    let c = &r.server_cpu;
    if c.total_s <= 0.0 {
        return Err("no CPU time was counted".into());
    }
    let per_s = positive(r.clients.responses_per_s, "responses per second")?;
    positive(c.busy_s / c.total_s * 1e6 / per_s, "server CPU per response")
}

/// The share of responses a frame transmit path wrote as frames (the rest went through
/// the socket), %.
pub(super) fn frames_share(r: &RrRun) -> Measure {
    let raw = r.server.raw_tx.as_ref().ok_or_else(|| "the socket sent every response".to_string())?;
    if r.server.counters.responses == 0 {
        return Err("the server answered nothing".into());
    }
    Ok(raw.datagrams as f64 / r.server.counters.responses as f64 * 100.0)
}

/// Server CPU per response of a packet-ring run, invalid unless every datagram it wrote
/// left its checksum to the device where its server asked for that, and none did where
/// it did not: a fallback must not pass as the other way's cost.
fn checksum_cost(r: &RrRun) -> Measure {
    let raw = r.server.raw_tx.as_ref().ok_or_else(|| "the socket sent every response".to_string())?;
    let (offloaded, all) = (raw.checksum_offloaded, raw.datagrams);
    let want = if raw.checksum_offload { all } else { 0 };
    if offloaded != want || all == 0 {
        let asked = if raw.checksum_offload { "asked to offload" } else { "asked to sum them" };
        return Err(format!("{offloaded} of {all} datagrams left their checksum to the device ({asked})"));
    }
    frames_cost(r)
}

/// Server CPU per response of a transmit-path run, invalid when a frame path sent a
/// response any other way (a fallback to the socket must not pass as the frame path's
/// cost).
fn frames_cost(r: &RrRun) -> Measure {
    if r.server.raw_tx.is_some() {
        let share = frames_share(r)?;
        if share < 100.0 {
            return Err(format!("only {share:.1}% of the responses went out as frames"));
        }
    }
    cost(r)
}

/// Client sockets found ready in wake-ups of at least [`netlane_rr::clients::HERD`]
/// sockets, per 100 responses (a ready socket may hold more than one response); invalid
/// unless the run answered 90% of the offered `load` (a run that throttled or dropped
/// would look calm).
pub(super) fn herd_share(r: &RrRun, load: u64) -> Measure {
    let c = &r.clients;
    let rate = positive(c.responses_per_s, "responses per second")?;
    if rate < 0.9 * load as f64 {
        return Err(format!("answered {rate:.0} of {load} requests/s offered"));
    }
    Ok(c.herd_woken_sockets as f64 / c.responses as f64 * 100.0)
}

pub(super) use crate::stats::{med, values};

/// A latency percentile `f` of the clients' histogram, us.
pub(super) fn us(f: fn(&netlane::metrics::Summary) -> u64) -> impl Fn(&RrRun) -> Measure {
    move |r: &RrRun| {
        if r.clients.latency_ns.count == 0 {
            Err("no response completed".into())
        } else {
            Ok(f(&r.clients.latency_ns) as f64 / 1e3)
        }
    }
}

/// Every mode's rounds, found by part and label.
pub(super) struct Runs<'a> {
    modes: &'a [Mode],
    all: &'a [Vec<RrRun>],
    /// The fixed block sizes of the blocks part.
    sizes: &'a [usize],
}

impl<'a> Runs<'a> {
    /// `all[i]` holds the rounds of `modes[i]`; `sizes` are the blocks part's fixed
    /// block sizes.
    pub(super) fn new(modes: &'a [Mode], all: &'a [Vec<RrRun>], sizes: &'a [usize]) -> Runs<'a> {
        Runs { modes, all, sizes }
    }

    /// A mode's rounds, when the mode ran.
    pub(super) fn find(&self, part: Part, label: &str) -> Option<&'a [RrRun]> {
        self.modes.iter().position(|m| m.part == part && m.label == label).map(|i| &self.all[i][..])
    }

    /// The fixed blocks' rounds at `clients` pausing `think`, with their sizes, smallest
    /// first.
    pub(super) fn fixed(&self, clients: usize, think: Duration) -> Vec<(usize, &'a [RrRun])> {
        let mut sizes = self.sizes.to_vec();
        sizes.sort_unstable();
        sizes
            .into_iter()
            .filter_map(|b| self.find(Part::Blocks, &block_label(b, clients, think)).map(|rs| (b, rs)))
            .collect()
    }

    /// The best fixed block at `clients` pausing `think` in `round`: its responses/s and
    /// size (the smallest block of a tie).
    pub(super) fn best_fixed(&self, clients: usize, think: Duration, round: usize) -> Option<(f64, usize)> {
        self.fixed(clients, think)
            .into_iter()
            .filter_map(|(b, rs)| rs.get(round).and_then(|r| throughput(r).ok()).map(|v| (v, b)))
            .fold(None, |m: Option<(f64, usize)>, x| if m.is_some_and(|m| m.0 >= x.0) { m } else { Some(x) })
    }

    /// Per round: the adaptive runs' responses/s at `clients` pausing `think` over the
    /// best fixed block's.
    pub(super) fn adaptive_ratios(&self, clients: usize, think: Duration, adaptive: &[RrRun]) -> Vec<Measure> {
        adaptive
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let best = self.best_fixed(clients, think, i).map(|b| b.0).ok_or_else(|| "no fixed block".into());
                ratio(throughput(r), best)
            })
            .collect()
    }
}

/// `spec` over mode `a`'s rounds against mode `b`'s of `part` by `f` (`what` says how),
/// or skipped when either did not run.
pub(super) fn pair(
    runs: &Runs<'_>,
    spec: Spec,
    part: Part,
    a: &str,
    b: &str,
    f: fn(&RrRun) -> Measure,
    what: &str,
) -> Check {
    match (runs.find(part, a), runs.find(part, b)) {
        (Some(x), Some(y)) => spec.evaluate(paired(x, y, f), &format!("{what}, per round")),
        _ => spec.skipped(format!("the {} part did not run {a} and {b}", part.name())),
    }
}

impl RrBenchArgs {
    /// The target checks of the parts that ran, in the report's order.
    pub(super) fn checks(&self, runs: &Runs<'_>) -> Vec<Check> {
        let pair = |spec: Spec, part: Part, a: &str, b: &str, f: fn(&RrRun) -> Measure, what: &str| {
            pair(runs, spec, part, a, b, f, what)
        };
        let mut checks = Vec::new();
        if self.parts.contains(&Part::Paths) {
            // With one client core against one server core the clients, not the server,
            // set the rate here; what a receive path saves shows as server CPU per
            // response.
            for (p, talk) in [
                (RxPathKind::TpacketV2, " (talk: about 2x the rate on Linux 4.9, less on later kernels)"),
                (RxPathKind::AfXdp, ""),
            ] {
                checks.push(pair(
                    Spec::at_most(
                        &format!("rr.{}-cost", p.name()),
                        format!("{p} costs the server no more CPU per response than recvfrom{talk}"),
                        1.0,
                        "x",
                    ),
                    Part::Paths,
                    p.name(),
                    "recvfrom",
                    cost,
                    &format!("{p} / recvfrom server CPU per response"),
                ));
            }
            checks.push(self.v2_throughput_check(runs));
        }
        if self.parts.contains(&Part::Blocks) {
            checks.extend(self.block_checks(runs));
            checks.extend(self.adaptive_checks(runs));
        }
        if self.parts.contains(&Part::Tcp) {
            checks.extend(self.tcp_checks(runs));
        }
        if self.parts.contains(&Part::Large) {
            checks.extend(self.large_checks(runs));
        }
        if self.parts.contains(&Part::Tx) {
            for tx in [TxKind::Packet, TxKind::AfXdp] {
                for size in TX_SIZES {
                    let spec = Spec::at_most(
                        &format!("rr.tx-{}-{}k-cost", tx.name(), size / 1024),
                        format!(
                            "{} KiB responses written as frames through {} cost the server no more CPU per response \
                             than the UDP socket",
                            size / 1024,
                            if tx == TxKind::Packet { "a PF_PACKET ring" } else { "the AF_XDP socket" }
                        ),
                        1.0,
                        "x",
                    );
                    let (a, b) = (tx_label(tx, size), tx_label(TxKind::Socket, size));
                    let what = format!("{tx} / socket server CPU per response");
                    checks.push(pair(spec, Part::Tx, &a, &b, frames_cost, &what));
                }
            }
            let size = TX_SIZES[0] / 1024;
            checks.push(pair(
                Spec::at_most(
                    "rr.tx-packet-checksum-offload-cost",
                    format!(
                        "{size} KiB responses through a PF_PACKET ring: leaving the UDP checksum to the device \
                         (PACKET_VNET_HDR) costs the server no more CPU per response than summing it in user space"
                    ),
                    1.0,
                    "x",
                ),
                Part::Tx,
                &tx_label(TxKind::Packet, TX_SIZES[0]),
                &tx_software_checksum_label(),
                checksum_cost,
                "offload / software server CPU per response",
            ));
        }
        if self.parts.contains(&Part::Pace) {
            checks.push(self.pace_check(runs));
        }
        if self.parts.contains(&Part::Busy) {
            checks.extend(self.busy_checks(runs));
        }
        if self.parts.contains(&Part::Queues) {
            checks.push(self.queues_check(runs));
        }
        checks
    }

    /// TPACKET_V2's rate against recvfrom's with clients that no one CPU limits (the
    /// talk: about 2x on Linux 4.9). Not shown where the clients cannot have two CPUs
    /// beside the server's.
    fn v2_throughput_check(&self, runs: &Runs<'_>) -> Check {
        let spec = Spec::at_least(
            "rr.tpacket-v2-throughput",
            "TPACKET_V2 answers more requests per second than recvfrom, the clients on several CPUs (talk: about \
             2x on Linux 4.9)",
            2.0,
            "x",
        );
        let wide = self.wide_client_cpus();
        if self.on.testbed.is_some() {
            return spec.skipped("on a testbed the client hosts place the clients: not compared");
        }
        if wide.len() < 2 && (self.client_cpus.is_some() || self.clients < 2) {
            return spec.skipped(format!(
                "{} client(s) on the CPUs given ({wide}) make {} client thread(s): two are needed",
                self.clients,
                wide.len()
            ));
        }
        if wide.len() < 2 {
            return spec.not_shown(
                3,
                netlane::cpus::online_count(),
                "the server's, and two for client threads",
                &format!("server {}; clients {wide}", self.server_cpu),
            );
        }
        let (a, b) = (wide_label(RxPathKind::TpacketV2, wide.len()), wide_label(RxPathKind::Recvfrom, wide.len()));
        match (runs.find(Part::Paths, &a), runs.find(Part::Paths, &b)) {
            (Some(x), Some(y)) => {
                spec.evaluate(paired(x, y, throughput), "tpacket-v2 / recvfrom responses per second, per round")
            }
            _ => spec.skipped("the paths part did not run tpacket-v2 and recvfrom"),
        }
    }

    /// Where the time goes in the wide-client runs: each path's rate, the server's idle
    /// share and CPU per response, and what held the rate (the server, or the clients).
    pub(super) fn wide_note(&self, runs: &Runs<'_>) -> Option<String> {
        let n = self.wide_client_cpus().len();
        let side = |p: RxPathKind| {
            let rs = runs.find(Part::Paths, &wide_label(p, n))?;
            let (tp, id, c) = (values(rs, throughput), values(rs, idle), values(rs, cost));
            (!tp.is_empty() && !id.is_empty() && !c.is_empty()).then(|| (median(tp), median(id), median(c)))
        };
        let (v2, rf) = (side(RxPathKind::TpacketV2)?, side(RxPathKind::Recvfrom)?);
        let held = |idle: f64| if idle < 5.0 { "the server's CPU" } else { "the clients" };
        Some(format!(
            "With the clients on {n} CPUs: TPACKET_V2 {:.0} responses/s at {:.0}% server idle and {:.2} us of server \
             CPU each, recvfrom {:.0} at {:.0}% and {:.2} us ({:.2}x the rate, {:.2}x the CPU per response). What held \
             each rate: TPACKET_V2 {}, recvfrom {}; where the server's CPU held both, the rate ratio is the inverse \
             of the CPU ratio.",
            v2.0,
            v2.1,
            v2.2,
            rf.0,
            rf.1,
            rf.2,
            v2.0 / rf.0,
            v2.2 / rf.2,
            held(v2.1),
            held(rf.1)
        ))
    }

    /// The talk's trade-off at 64 clients that do not pause (each has a request waiting,
    /// so the burst is the population): the block that holds half the burst against the
    /// best block, per round.
    fn block_checks(&self, runs: &Runs<'_>) -> Vec<Check> {
        let no_think = Duration::ZERO;
        let half = self.half_burst_block(64);
        let (what, rounds) = match half {
            Some(b) => (
                format!("{} KiB ({} requests)", b / 1024, block_holds(b, self.request)),
                runs.find(Part::Blocks, &block_label(b, 64, no_think)),
            ),
            None => ("no block size holding 32 requests".to_string(), None),
        };
        let skipped = if self.block_thinks.contains(&no_think) {
            format!("the blocks part did not run a block holding 32 requests at 64 clients ({what})")
        } else {
            "the blocks part ran no population without a pause".to_string()
        };
        let spec = Spec::at_least(
            "rr.block-half-burst-throughput",
            format!(
                "TPACKET_V3, 64 clients, no think: the block holding half the burst, {what}, keeps most of the best \
                 block's throughput (talk: about 90%)"
            ),
            0.85,
            "x",
        );
        let best_of_round = |round: usize| {
            runs.best_fixed(64, no_think, round).map(|b| b.0).ok_or_else(|| "no block size answered".to_string())
        };
        let keeps = match rounds {
            Some(rs) => spec.evaluate(
                rs.iter().enumerate().map(|(i, r)| ratio(throughput(r), best_of_round(i))).collect(),
                "half-burst block / the best block's responses/s, per round",
            ),
            None => spec.skipped(skipped.clone()),
        };
        let spec = Spec::at_least(
            "rr.block-half-burst-idle",
            format!(
                "TPACKET_V3, 64 clients, no think: with the block holding half the burst, {what}, the server CPU \
                 is idle part of the time (talk: ~35%)"
            ),
            25.0,
            "%",
        );
        let idles = match rounds {
            Some(rs) => spec.evaluate(rs.iter().map(idle).collect(), "the server CPU's idle share, per round"),
            None => spec.skipped(skipped),
        };
        vec![keeps, idles]
    }

    /// The adaptive block size's targets at each think time, held at every client count:
    /// per round, the worst population's sample (not the populations' median). The ids
    /// of the pausing clients' have no suffix; the others' end in `-no-think`.
    fn adaptive_checks(&self, runs: &Runs<'_>) -> Vec<Check> {
        let mut checks = Vec::new();
        for &think in &self.block_thinks {
            let (mut tp_samples, mut idle_samples) = (Vec::new(), Vec::new());
            for &c in &self.block_clients {
                let Some(ad) = runs.find(Part::Blocks, &adaptive_label(c, think)) else { continue };
                let ratios = runs.adaptive_ratios(c, think, ad);
                for (i, (r, id)) in ratios.into_iter().zip(ad.iter().map(idle)).enumerate() {
                    if tp_samples.len() <= i {
                        tp_samples.push(r);
                        idle_samples.push(id);
                    } else {
                        tp_samples[i] = worst(std::mem::replace(&mut tp_samples[i], Ok(0.0)), r);
                        idle_samples[i] = worst(std::mem::replace(&mut idle_samples[i], Ok(0.0)), id);
                    }
                }
            }
            let suffix = if think.is_zero() { "-no-think" } else { "" };
            let who = think_name(think);
            let spec = Spec::at_least(
                &format!("rr.adaptive-throughput{suffix}"),
                format!(
                    "TPACKET_V3 adaptive blocks, {who}: at least 90% of the best fixed block's throughput at every \
                     client count, untuned"
                ),
                ADAPTIVE_RATE,
                "x",
            );
            checks.push(if tp_samples.is_empty() {
                spec.skipped("the blocks part did not run")
            } else {
                spec.evaluate(
                    tp_samples,
                    "adaptive / best fixed block responses/s at the worst client count, per round",
                )
            });
            let spec = Spec::at_least(
                &format!("rr.adaptive-idle{suffix}"),
                format!(
                    "TPACKET_V3 adaptive blocks, {who}: the server CPU stays at least 30% idle at every client count"
                ),
                ADAPTIVE_IDLE,
                "%",
            );
            checks.push(if idle_samples.is_empty() {
                spec.skipped("the blocks part did not run")
            } else {
                spec.evaluate(idle_samples, "the server CPU's idle share at the worst client count, per round")
            });
        }
        checks
    }

    /// Paced responses against responses released a block at a time: how often clients
    /// are woken in herds.
    fn pace_check(&self, runs: &Runs<'_>) -> Check {
        let spec = Spec::at_most(
            "rr.pace-herd",
            format!(
                "Paced responses wake clients in herds ({}+ at once) at most a quarter as often as responses \
                 released a block at a time (the talk's Q&A)",
                netlane_rr::clients::HERD
            ),
            0.25,
            "x",
        );
        let load = self.pace_load;
        match (runs.find(Part::Pace, PACE[1]), runs.find(Part::Pace, PACE[0])) {
            (Some(p), Some(u)) => spec.evaluate(
                paired(p, u, |r| herd_share(r, load)),
                "paced / unpaced share of responses woken in herds, per round",
            ),
            _ => spec.skipped("the pace part did not run"),
        }
    }
}

//! What the kv scenario's targets compare: sound runs, the server CPU per request, the
//! latency percentiles, the best rate within each SLA and netlane's over memcached's;
//! and the checks themselves, as one list.

use netlane_kv::load::stats::Sla;
use netlane_report::Check;

use super::{KvBenchArgs, KvRound, KvRun, Part, ServerKind};
use crate::scenarios::cache::{latency_of, pct, sound};
use crate::verdict::{Measure, Spec, paired, positive};

/// Server CPU microseconds per completed request.
pub(super) fn cpu_per_request(r: &KvRun) -> Measure {
    sound(&r.load)?;
    let per_s = positive(r.load.achieved_per_s, "completed requests per second")?;
    if r.server_total_s <= 0.0 {
        return Err("no CPU time was counted".into());
    }
    positive(r.server_busy_s / r.server_total_s * 1e6 / per_s, "server CPU per request")
}

/// Percentile `p` of a sound run, in µs.
pub(super) fn latency(p: &'static str) -> impl Fn(&KvRun) -> Measure {
    move |r: &KvRun| latency_of(&r.load, p)
}

/// The best rate of search `i`; invalid when no rate held the SLA, or every rate did
/// (the capacity lies above the range). A rate the generator's limit bounded is
/// returned: it is a lower bound of the server's ([`sla_ratio`] decides what it proves).
pub(super) fn best(r: &KvRound, i: usize) -> Measure {
    let s = r.searches.get(i).ok_or("the search did not run")?;
    match s.best_per_s {
        None => Err(format!("{}: no rate held {}", r.server, s.sla)),
        Some(_) if s.capped => Err(format!("{}: every rate held {}: raise --search-hi", r.server, s.sla)),
        Some(b) => positive(b, "best rate"),
    }
}

/// netlane's best rate over memcached's in one round, for a target of at least
/// `target`. A side whose search stopped at the generator's limit gave a lower bound:
/// netlane's still proves a ratio at or above the target (the true one is higher), and
/// anything else is undecided.
pub(super) fn sla_ratio(n: &KvRound, m: &KvRound, i: usize, target: f64) -> Measure {
    let r = crate::verdict::ratio(best(n, i), best(m, i))?;
    let limited = |x: &KvRound| x.searches.get(i).is_some_and(|s| s.generator_limited);
    match (limited(n), limited(m)) {
        (false, false) => Ok(r),
        (true, false) if r >= target => Ok(r),
        (true, false) => Err(format!(
            "netlane's search stopped where the generator could not keep its schedule, at {r:.2}x memcached's rate: \
             give the generator more CPU"
        )),
        (_, true) => Err("memcached's search stopped where the generator could not keep its schedule".into()),
    }
}

/// The ratio the SLA checks ask of netlane over memcached (Pelikan reported +40%).
pub(super) const SLA_TARGET: f64 = 1.3;

pub(super) fn sla_bound_us(sla: Sla) -> u64 {
    sla.latency_ns() / 1000
}

pub(super) fn sla_bound_text(sla: Sla) -> String {
    netlane_report::format::seconds(sla.latency_ns() as f64 / 1e9)
}

/// A server's rounds, when it ran.
type Find<'a> = dyn Fn(ServerKind) -> Option<&'a [KvRound]> + 'a;

impl KvBenchArgs {
    /// The targets, in the report's order: netlane's rate over memcached's within each
    /// SLA, then its CPU per request.
    pub(super) fn checks(&self, find: &Find<'_>) -> Vec<Check> {
        let pair = find(ServerKind::Netlane).zip(find(ServerKind::Memcached));
        let mut checks = Vec::new();
        if self.parts.contains(&Part::Sla) {
            for (i, sla, id) in [(0, self.sla, "kv.sla-throughput"), (1, self.tight_sla, "kv.tight-sla-throughput")] {
                let spec = Spec::at_least(
                    id,
                    format!("netlane's server holds at least 1.3x memcached's rate within {sla} (Pelikan: +40%)"),
                    SLA_TARGET,
                    "x",
                );
                checks.push(match pair {
                    Some((n, m)) => {
                        // A round's ratio, or why there is none; when a search found no
                        // rate, what its server's floor run saw of the machine.
                        let samples = n
                            .iter()
                            .zip(m)
                            .map(|(a, b)| sla_ratio(a, b, i, SLA_TARGET).map_err(|e| self.with_floor(e, a, b, i, sla)))
                            .collect();
                        spec.evaluate(samples, &format!("netlane / memcached highest rate within {sla}, per round"))
                    }
                    None => spec.skipped("needs both servers"),
                });
            }
        }
        if self.parts.contains(&Part::Rates)
            && let Some((n, m)) = pair
        {
            checks.push(self.cpu_check(n, m));
        }
        checks
    }

    /// netlane's server CPU per request over memcached's at the highest rate both
    /// answered soundly in every round.
    fn cpu_check(&self, n: &[KvRound], m: &[KvRound]) -> Check {
        let j = (0..self.rates.len())
            .rev()
            .find(|&j| n.iter().chain(m).all(|r| r.rates.get(j).is_some_and(|x| cpu_per_request(x).is_ok())));
        let spec = Spec::at_most(
            "kv.cpu-per-request",
            "netlane's server spends no more CPU per request than memcached",
            1.0,
            "x",
        );
        match j {
            Some(j) => spec.evaluate(
                paired(n, m, |r| r.rates.get(j).ok_or("no run".to_string()).and_then(cpu_per_request)),
                &format!("netlane / memcached server CPU per request at {}/s, per round", self.rates[j]),
            ),
            None => spec.invalid("no offered rate was answered soundly by both servers in every round"),
        }
    }

    /// `e` (why a round has no ratio) with what the floor run of the server whose
    /// search found no rate saw.
    fn with_floor(&self, e: String, a: &KvRound, b: &KvRound, i: usize, sla: Sla) -> String {
        let floor = [a, b]
            .into_iter()
            .find(|r| best(r, i).is_err())
            .and_then(|r| r.floor.as_ref().map(|f| (r.server.as_str(), f)));
        let Some((server, (run, f))) = floor else { return e };
        let p = format!("p{}", sla.quantile() * 100.0);
        format!(
            "{e} ({server} at {:.0}/s: {p} {}; meanwhile cyclictest saw {} stalls of the server CPU >= 1 ms, the longest \
             {} us, alone delaying {:.3}% of requests past {})",
            self.search_lo,
            pct(&run.load, &p).map_or("beyond every answer".into(), |v| format!("{v:.0} us")),
            f.over_1ms,
            f.max_us,
            f.delayed_share(sla_bound_us(sla)) * 100.0,
            sla_bound_text(sla)
        )
    }
}

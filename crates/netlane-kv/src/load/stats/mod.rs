//! What a run measured: counters and a latency histogram, one per driver thread, merged
//! at the end.
//!
//! Invariants:
//! - Latency runs from the request's scheduled time in open loop (from its actual send in
//!   closed loop), so time spent waiting for the generator, for a free slot or for a
//!   reconnection counts.
//! - Every offered request ends in exactly one outcome: completed (answered without an
//!   error line), failed by an error line, lost with its connection, unanswered at the
//!   end of the run, or never sent. Once every connection has finished, `offered` is the
//!   sum of the outcomes ([`Counts::settled`]).
//! - Percentiles are taken over every settled request, and only completed ones have a
//!   latency: all the others rank above every latency, as if infinite. A percentile whose
//!   rank falls among them is `None` (no latency bound holds), so a request that failed
//!   or was never answered can only make a percentile worse, never better.
//! - Latencies go into an HDR histogram of 1 ns to 60 s at 3 significant digits (at most
//!   0.1% error); a percentile reads the top of its bucket, so it never reads below the
//!   truth, and an SLA at a bucket's edge is judged strictly. Latencies over 60 s count
//!   as 60 s.

use hdrhistogram::Histogram;

use super::codec::{Reply, ReplyError, SetReply};

// Statistics between processes (the load generator's agents): a driver's concern, on the
// core's histogram encoding.
#[cfg(feature = "drivers")]
mod wire;
#[cfg(feature = "drivers")]
pub use wire::WireError;

/// The percentiles a report shows.
pub const REPORTED_QUANTILES: [f64; 5] = [0.5, 0.9, 0.99, 0.999, 0.9999];

/// The longest latency the histogram tells apart: 60 s, the longest an SLA may name.
pub const MAX_LATENCY_NS: u64 = 60_000_000_000;

// This core builds without the drivers (and the core crate with them): the bound is the
// same one on both sides.
#[cfg(feature = "drivers")]
const _: () = assert!(MAX_LATENCY_NS == netlane::metrics::sla::MAX_LATENCY_NS);

/// Counters of one run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "drivers", derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema))]
pub struct Counts {
    /// Requests scheduled (closed loop: sent).
    pub offered: u64,
    /// Requests written out.
    pub sent: u64,
    /// Requests written out more than the lateness tolerance after their scheduled time.
    pub sent_late: u64,
    /// Requests written out more than the lateness tolerance after they could have gone:
    /// after their scheduled time and after their connection had a free slot. This is
    /// the generator's own delay (its CPU, its timer), not the server's: a request that
    /// waited for a slot because the server was slow is late, not lagged.
    pub sent_lagged: u64,
    /// Requests answered without an error line: the ones with a latency.
    pub completed: u64,
    /// Keys found by gets.
    pub hits: u64,
    /// Keys gets did not find.
    pub misses: u64,
    /// Sets answered `STORED`.
    pub stored: u64,
    /// Sets answered `NOT_STORED`.
    pub not_stored: u64,
    /// Sets answered `EXISTS`.
    pub exists: u64,
    /// Sets answered `NOT_FOUND`.
    pub not_found: u64,
    /// Requests answered `ERROR`.
    pub error: u64,
    /// Requests answered `CLIENT_ERROR`.
    pub client_error: u64,
    /// Requests answered `SERVER_ERROR`.
    pub server_error: u64,
    /// Requests in flight when their connection failed (protocol error, reset, EOF).
    pub lost: u64,
    /// Requests still in flight when the run ended.
    pub unanswered: u64,
    /// Requests scheduled but never sent.
    pub not_sent: u64,
}

impl Counts {
    /// Requests that ended without a good answer.
    pub fn failed(&self) -> u64 {
        self.error + self.client_error + self.server_error + self.lost + self.unanswered + self.not_sent
    }

    /// Requests with an outcome: completed or failed.
    pub fn settled(&self) -> u64 {
        self.completed + self.failed()
    }

    /// The share of sends the generator itself delayed ([`Counts::sent_lagged`]).
    pub fn lag_share(&self) -> f64 {
        if self.sent == 0 { 0.0 } else { self.sent_lagged as f64 / self.sent as f64 }
    }

    fn add(&mut self, o: &Counts) {
        let Counts {
            offered,
            sent,
            sent_late,
            sent_lagged,
            completed,
            hits,
            misses,
            stored,
            not_stored,
            exists,
            not_found,
            error,
            client_error,
            server_error,
            lost,
            unanswered,
            not_sent,
        } = *o;
        self.offered += offered;
        self.sent += sent;
        self.sent_late += sent_late;
        self.sent_lagged += sent_lagged;
        self.completed += completed;
        self.hits += hits;
        self.misses += misses;
        self.stored += stored;
        self.not_stored += not_stored;
        self.exists += exists;
        self.not_found += not_found;
        self.error += error;
        self.client_error += client_error;
        self.server_error += server_error;
        self.lost += lost;
        self.unanswered += unanswered;
        self.not_sent += not_sent;
    }
}

/// A run's counters and latencies.
#[derive(Debug, Clone)]
pub struct Stats {
    counts: Counts,
    latency: Histogram<u64>,
}

impl Default for Stats {
    fn default() -> Self {
        Stats::new()
    }
}

impl Stats {
    /// Empty.
    pub fn new() -> Self {
        // Constant bounds that hdrhistogram accepts (low >= 1, high >= 2 * low, sigfig <= 5).
        let latency = Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3).expect("constant histogram bounds are valid");
        Stats { counts: Counts::default(), latency }
    }

    /// The counters.
    pub fn counts(&self) -> &Counts {
        &self.counts
    }

    /// Adds another thread's run.
    pub fn merge(&mut self, other: &Stats) {
        self.counts.add(&other.counts);
        for v in other.latency.iter_recorded() {
            self.latency.saturating_record_n(v.value_iterated_to(), v.count_at_value());
        }
    }

    /// The latency at `quantile` (0.999 for p99.9) over every settled request, or `None`
    /// when its rank falls among the requests without a latency (or there are none).
    pub fn latency_at(&self, quantile: f64) -> Option<u64> {
        let settled = self.counts.settled();
        if settled == 0 {
            return None;
        }
        // The rank (1-based) of the quantile among all settled requests; rounding up never
        // favours the server.
        let rank = ((quantile.clamp(0.0, 1.0) * settled as f64).ceil() as u64).clamp(1, settled);
        if rank > self.latency.len() {
            return None;
        }
        let mut seen = 0;
        self.latency.iter_recorded().find_map(|v| {
            seen += v.count_since_last_iteration();
            (seen >= rank).then(|| v.value_iterated_to())
        })
    }

    /// The shortest and longest latency of the completed requests, ns (`None`: none
    /// completed).
    pub fn latency_range(&self) -> Option<(u64, u64)> {
        (!self.latency.is_empty()).then(|| (self.latency.min(), self.latency.max()))
    }

    /// How many requests completed with a latency.
    pub fn answered(&self) -> u64 {
        self.latency.len()
    }

    /// The mean latency of the completed requests, ns (`None`: none completed). Unlike
    /// a percentile it ignores the failed ones, so read it beside [`Counts::failed`].
    pub fn mean_latency(&self) -> Option<f64> {
        (!self.latency.is_empty()).then(|| self.latency.mean())
    }

    /// The run judged against `sla`, over a run of `duration_ns`.
    #[cfg(feature = "drivers")]
    pub fn measure(&self, sla: &Sla, duration_ns: u64) -> Measurement {
        let per_s = |n: u64| if duration_ns == 0 { 0.0 } else { n as f64 * 1e9 / duration_ns as f64 };
        let at = self.latency_at(sla.quantile());
        Measurement {
            offered_per_s: per_s(self.counts.offered),
            achieved_per_s: per_s(self.counts.completed),
            sla_latency_ns: at,
            sla_met: sla.is_met_at(at),
            lag_share: self.counts.lag_share(),
            window_ns: duration_ns,
        }
    }

    /// A request went out; `late`: after the tolerance past its scheduled time; `lagged`:
    /// after the tolerance past the time it could have gone.
    pub(super) fn sent(&mut self, late: bool, lagged: bool) {
        self.counts.offered += 1;
        self.counts.sent += 1;
        self.counts.sent_late += u64::from(late);
        self.counts.sent_lagged += u64::from(lagged);
    }

    pub(super) fn replied(&mut self, reply: Reply, latency_ns: u64) {
        let c = &mut self.counts;
        match reply {
            Reply::Get { hits, misses } => {
                c.hits += u64::from(hits);
                c.misses += u64::from(misses);
            }
            Reply::Set(SetReply::Stored) => c.stored += 1,
            Reply::Set(SetReply::NotStored) => c.not_stored += 1,
            Reply::Set(SetReply::Exists) => c.exists += 1,
            Reply::Set(SetReply::NotFound) => c.not_found += 1,
            Reply::Error(e) => {
                match e {
                    ReplyError::Error => c.error += 1,
                    ReplyError::Client => c.client_error += 1,
                    ReplyError::Server => c.server_error += 1,
                }
                return;
            }
        }
        c.completed += 1;
        self.latency.saturating_record(latency_ns);
    }

    pub(super) fn lost(&mut self, n: u64) {
        self.counts.lost += n;
    }

    pub(super) fn unanswered(&mut self, n: u64) {
        self.counts.unanswered += n;
    }

    pub(super) fn not_sent(&mut self, n: u64) {
        self.counts.offered += n;
        self.counts.not_sent += n;
    }
}

/// `latencies` recorded as answered gets (for the tests of what merges runs).
#[cfg(test)]
pub(crate) fn record_for_tests(stats: &mut Stats, latencies: &[u64]) {
    for &ns in latencies {
        stats.sent(false, false);
        stats.replied(Reply::Get { hits: 1, misses: 0 }, ns);
    }
}

/// A run judged against an SLA: what the rate search needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measurement {
    /// Requests scheduled per second of the run.
    pub offered_per_s: f64,
    /// Requests completed per second of the run.
    pub achieved_per_s: f64,
    /// The latency at the SLA's percentile (`None`: beyond every answer).
    pub sla_latency_ns: Option<u64>,
    /// Whether it is within the SLA's bound.
    pub sla_met: bool,
    /// The share of sends the generator itself delayed: above a few percent the run
    /// measured the generator, not the server.
    pub lag_share: f64,
    /// The window the rates are over, ns.
    pub window_ns: u64,
}

/// A tail-latency objective (in the core, shared with the other clients; the sans-IO
/// core alone does not judge one).
#[cfg(feature = "drivers")]
pub use netlane::metrics::sla::{Sla, SlaError};

#[cfg(feature = "drivers")]
impl Stats {
    /// Whether these statistics meet `sla`: the latency at its percentile, counting every
    /// request without a good answer as slower than any, is within the bound.
    pub fn meets(&self, sla: &Sla) -> bool {
        sla.is_met_at(self.latency_at(sla.quantile()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn ok(stats: &mut Stats, latencies: impl IntoIterator<Item = u64>) {
        record_for_tests(stats, &latencies.into_iter().collect::<Vec<_>>());
    }

    fn sla(s: &str) -> Sla {
        s.parse().unwrap()
    }

    /// `got` is `want` or at most 0.1% above it (the top of its bucket).
    fn near(got: Option<u64>, want: u64) -> bool {
        got.is_some_and(|g| g >= want && g as f64 <= want as f64 * 1.001)
    }

    #[test]
    fn percentiles_read_the_top_of_their_bucket() {
        let mut s = Stats::new();
        ok(&mut s, (1..=1000).map(|i| i * 1000));
        for (q, want) in [(0.5, 500_000), (0.9, 900_000), (0.99, 990_000), (0.999, 999_000), (1.0, 1_000_000)] {
            assert!(near(s.latency_at(q), want), "p{} = {:?}", q * 100.0, s.latency_at(q));
        }
        assert!(near(s.latency_at(0.0), 1000));
        let reported: Vec<u64> = REPORTED_QUANTILES.iter().map(|&q| s.latency_at(q).unwrap()).collect();
        assert!(reported.is_sorted(), "{reported:?}");
        // Latencies past the histogram count as its top.
        ok(&mut s, [100 * MAX_LATENCY_NS]);
        assert!(near(s.latency_at(1.0), MAX_LATENCY_NS));
        assert_eq!(Stats::new().latency_at(0.5), None, "no requests, no bound");
    }

    #[test]
    fn requests_without_an_answer_rank_above_every_latency() {
        let mut s = Stats::new();
        ok(&mut s, std::iter::repeat_n(1_000_000, 990));
        s.unanswered(6);
        s.not_sent(4);
        assert_eq!(s.counts().settled(), 1000);
        // 990 of 1000 answered: p99 is the 990th, p99.1 the 991st: unanswered.
        assert!(near(s.latency_at(0.99), 1_000_000));
        assert_eq!(s.latency_at(0.991), None);
        assert!(s.meets(&sla("p99=2ms")));
        assert!(!s.meets(&sla("p99.9=1s")), "however generous the bound");
        // One more request lost with its connection tips p99 over.
        s.lost(1);
        assert_eq!(s.latency_at(0.99), None);
        assert!(!s.meets(&sla("p99=2ms")));
    }

    #[test]
    fn error_replies_are_failures_however_fast() {
        let mut s = Stats::new();
        for kind in [ReplyError::Error, ReplyError::Client, ReplyError::Server] {
            for _ in 0..100 {
                s.sent(false, false);
                s.replied(Reply::Error(kind), 1);
            }
        }
        let c = s.counts();
        assert_eq!((c.error, c.client_error, c.server_error, c.completed), (100, 100, 100, 0));
        assert_eq!(s.latency_at(0.5), None);
        let m = s.measure(&sla("p50=1ms"), 1_000_000_000);
        assert_eq!((m.offered_per_s, m.achieved_per_s, m.sla_met), (300.0, 0.0, false));
    }

    #[test]
    fn replies_are_counted_by_kind() {
        let mut s = Stats::new();
        for r in [
            Reply::Get { hits: 3, misses: 1 },
            Reply::Set(SetReply::Stored),
            Reply::Set(SetReply::NotStored),
            Reply::Set(SetReply::Exists),
            Reply::Set(SetReply::NotFound),
        ] {
            s.sent(true, false);
            s.replied(r, 10);
        }
        let c = *s.counts();
        assert_eq!((c.hits, c.misses, c.stored, c.not_stored, c.exists, c.not_found), (3, 1, 1, 1, 1, 1));
        assert_eq!((c.offered, c.sent, c.sent_late, c.completed, c.failed()), (5, 5, 5, 5, 0));
    }

    #[test]
    fn merging_equals_recording_together() {
        let (mut a, mut b, mut both) = (Stats::new(), Stats::new(), Stats::new());
        ok(&mut a, (1..=500).map(|i| i * 997));
        ok(&mut b, (501..=1000).map(|i| i * 997));
        b.unanswered(3);
        ok(&mut both, (1..=1000).map(|i| i * 997));
        both.unanswered(3);
        a.merge(&b);
        assert_eq!(a.counts(), both.counts());
        for q in [0.0, 0.5, 0.9, 0.99, 0.997, 0.998, 1.0] {
            assert_eq!(a.latency_at(q), both.latency_at(q), "{q}");
        }
    }

    #[test]
    fn an_sla_at_a_bucket_edge_is_judged_strictly() {
        // Between 2^19 and 2^20 ns the buckets are 512 ns wide: exactly 1 ms reads as the
        // top of [999,936, 1,000,447], over a 1 ms bound; 999 us reads as 999,423.
        let mut s = Stats::new();
        ok(&mut s, [1_000_000]);
        assert_eq!(s.latency_at(1.0), Some(1_000_447));
        assert!(!s.meets(&sla("p100=1ms")));
        let mut s = Stats::new();
        ok(&mut s, [999_000]);
        assert_eq!(s.latency_at(1.0), Some(999_423));
        assert!(s.meets(&sla("p100=1ms")));
    }

    #[test]
    fn measurements_are_rates_over_the_run() {
        let mut s = Stats::new();
        ok(&mut s, std::iter::repeat_n(50_000, 900));
        s.not_sent(100);
        let m = s.measure(&sla("p50=100us"), 500_000_000);
        assert_eq!(m.offered_per_s, 2000.0);
        assert_eq!(m.achieved_per_s, 1800.0);
        assert!(m.sla_met && near(m.sla_latency_ns, 50_000));
        assert_eq!(s.measure(&sla("p50=100us"), 0).offered_per_s, 0.0);
    }

    #[test]
    fn slas_parse_and_print_back() {
        let s = sla("p99.9=1ms");
        assert!((s.quantile() - 0.999).abs() < 1e-12);
        assert_eq!(s.latency_ns(), 1_000_000);
        assert_eq!(sla("p50=250us").latency_ns(), 250_000);
        assert_eq!(sla("p50=250µs").latency_ns(), 250_000);
        assert_eq!(sla("p99.99=1.5ms").latency_ns(), 1_500_000);
        assert_eq!(sla("p100=60s").latency_ns(), MAX_LATENCY_NS);
        assert_eq!(sla("p90=700ns").latency_ns(), 700);
        for s in ["p99.9=1ms", "p50=250us", "p99.99=1500us", "p100=60s", "p90=700ns", "p99=2s"] {
            assert_eq!(sla(s).to_string(), s);
        }
    }

    #[test]
    fn bad_slas_name_the_bad_part() {
        let err = |s: &str| s.parse::<Sla>().unwrap_err();
        assert_eq!(err("99.9=1ms"), SlaError::Syntax("99.9=1ms".into()));
        assert_eq!(err("p99.9"), SlaError::Syntax("p99.9".into()));
        assert_eq!(err("p0=1ms"), SlaError::Percentile("0".into()));
        assert_eq!(err("p100.1=1ms"), SlaError::Percentile("100.1".into()));
        assert_eq!(err("pNaN=1ms"), SlaError::Percentile("NaN".into()));
        assert_eq!(err("p99=1"), SlaError::Latency("1".into()));
        assert_eq!(err("p99=1h"), SlaError::Latency("1h".into()));
        assert_eq!(err("p99=0ms"), SlaError::Latency("0ms".into()));
        assert_eq!(err("p99=-1ms"), SlaError::Latency("-1ms".into()));
        assert_eq!(err("p99=61s"), SlaError::Latency("61s".into()));
        assert_eq!(err("p99=0.1ns"), SlaError::Latency("0.1ns".into()));
        assert_eq!(
            err("p99=fast").to_string(),
            "SLA latency \"fast\": expected a number and a unit (ns, us, ms or s), from 1 ns to 60 s"
        );
    }
}

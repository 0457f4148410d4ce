//! What a queue counts: commands, PDUs, bytes, failed completions by status, and a
//! latency histogram the Prometheus exposition shows as is.

/// Per-queue counters.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct QueueStats {
    /// Commands received.
    pub commands: u64,
    /// Response capsules sent.
    pub responses: u64,
    /// C2HData PDUs sent.
    pub c2h_pdus: u64,
    /// R2Ts sent.
    pub r2ts: u64,
    /// Completions carried by the C2HData SUCCESS flag.
    pub success_flag: u64,
    /// Reads completed, and their bytes.
    pub reads: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Writes completed.
    pub writes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Failed completions by status (SCT << 8 | SC).
    pub errors: std::collections::BTreeMap<u16, u64>,
    /// Time from a command's arrival to its completion being queued for sending.
    pub latency: LatencyHist,
}

/// A histogram of latencies in power-of-two microsecond buckets: bucket 0 counts those
/// under 1 us, bucket i those under 2^i us, the last one everything longer. Cheap
/// enough for the sans-IO core, and directly a Prometheus histogram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatencyHist {
    /// Counts per bucket.
    pub buckets: [u64; LATENCY_BUCKETS],
    /// Sum of all latencies, ns.
    pub sum_ns: u64,
}

/// Buckets of [`LatencyHist`]: up to 2^22 us (4.2 s), then overflow.
pub const LATENCY_BUCKETS: usize = 24;

impl Default for LatencyHist {
    fn default() -> Self {
        LatencyHist { buckets: [0; LATENCY_BUCKETS], sum_ns: 0 }
    }
}

impl LatencyHist {
    /// Counts one latency.
    pub fn record(&mut self, ns: u64) {
        let us = ns / 1000;
        let i = if us == 0 { 0 } else { (us.ilog2() as usize + 1).min(LATENCY_BUCKETS - 1) };
        self.buckets[i] += 1;
        self.sum_ns = self.sum_ns.saturating_add(ns);
    }
    /// Adds another histogram's counts.
    pub fn merge(&mut self, o: &LatencyHist) {
        for (a, b) in self.buckets.iter_mut().zip(o.buckets) {
            *a += b;
        }
        self.sum_ns = self.sum_ns.saturating_add(o.sum_ns);
    }
    /// Latencies counted.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }
    /// The upper bound of bucket `i` in seconds (`None` for the overflow bucket).
    pub fn bound_s(i: usize) -> Option<f64> {
        (i + 1 < LATENCY_BUCKETS).then(|| (1u64 << i) as f64 * 1e-6)
    }
}

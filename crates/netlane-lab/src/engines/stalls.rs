//! How long a CPU of this machine can be kept from running a thread that is ready: the
//! floor under any tail latency measured on it. Measured with `cyclictest` (rt-tests,
//! the standard tool for the job), not with our own code: a real-time thread pinned to
//! the CPU sleeps to an absolute deadline every interval and records how late it woke.
//! At SCHED_FIFO 99 no task of this kernel can delay it, so what it sees is the
//! machine's: a hypervisor that ran something else on the vCPU, a halted vCPU woken
//! late, interrupts and SMIs.
//!
//! cyclictest skips the periods a stall covered (its next deadline is the first one
//! still ahead), so one stall is one sample, whose latency is the stall's length. A
//! request arriving during a stall of length S waits for its end: with arrivals spread
//! evenly, the share of requests a stall delays by more than L is the sum of (S - L)
//! over the stalls longer than L, over the duration ([`Stalls::delayed_share`]),
//! whatever the server does. An SLA at p99.9 < 1 ms cannot hold when that share
//! passes 0.1%.

use std::time::Duration;

use serde::Serialize;

use crate::host::{Host, Program, RoleProcess, RoleSpec};

/// Histogram buckets, 1 us each: latencies beyond count as overflows.
const BUCKETS_US: u64 = 20_000;

/// What one probe measured on one CPU.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Stalls {
    /// The CPU.
    pub cpu: usize,
    /// How long it ran, s.
    pub seconds: f64,
    /// Wake-ups measured.
    pub samples: u64,
    /// The largest wake-up latency, us.
    pub max_us: u64,
    /// Wake-up latency at p99.9, us (at least the histogram's top bucket, `BUCKETS_US`, when it overflowed).
    pub p999_us: u64,
    /// Wake-ups at least 1 ms late.
    pub over_1ms: u64,
    /// Every wake-up at least [`LONG_US`] late, longest first, us (overflows count as
    /// the histogram's top, the largest as `max_us`: lower bounds).
    pub long_us: Vec<u64>,
}

/// Wake-ups at least this late are kept one by one, us.
pub const LONG_US: u64 = 100;

impl Stalls {
    /// The share of evenly arriving requests that the stalls delay by more than
    /// `bound_us`: the sum of (stall - bound) over the stalls longer than the bound, over
    /// the duration.
    pub fn delayed_share(&self, bound_us: u64) -> f64 {
        if self.seconds <= 0.0 {
            return 0.0;
        }
        let over: u64 = self.long_us.iter().map(|s| s.saturating_sub(bound_us)).sum();
        over as f64 / (self.seconds * 1e6)
    }
}

/// Why a probe could not be made.
#[derive(Debug, thiserror::Error)]
pub enum StallError {
    /// cyclictest could not be started, or did not end in time.
    #[error("run cyclictest (rt-tests; scripts/setup.sh --lab installs it): {0}")]
    Run(String),
    /// It failed or printed something else than its histogram.
    #[error("cyclictest: {0}")]
    Output(String),
}

/// Runs cyclictest on `host`'s `cpu` for `duration`, waking every `interval`.
pub fn probe(host: &dyn Host, cpu: usize, duration: Duration, interval: Duration) -> Result<Stalls, StallError> {
    let secs = duration.as_secs().max(1);
    let args = [
        "-q".to_string(),
        "--policy=fifo".into(),
        "-p".into(),
        "99".into(),
        "-t".into(),
        "1".into(),
        "-a".into(),
        cpu.to_string(),
        "-i".into(),
        interval.as_micros().max(100).to_string(),
        "-D".into(),
        secs.to_string(),
        "-h".into(),
        BUCKETS_US.to_string(),
    ];
    // SCHED_FIFO 99 on a CPU: as a role it never outlives an interrupted run (it dies
    // with this thread, which waits for it), and its output (about 20,000 short lines)
    // is read while it runs, so a full pipe cannot stop it. It pins itself (`-a`).
    let spec = RoleSpec::program("cyclictest", Program::Other("cyclictest".into()), args);
    let ran = RoleProcess::start(host, &spec, None)
        .and_then(|p| p.wait(Duration::from_secs(secs + 10)))
        .map_err(|e| StallError::Run(format!("{e:#}")))?;
    if !ran.status.success() {
        return Err(StallError::Output(format!("{}: {}", ran.status, ran.stderr.trim())));
    }
    parse(&ran.stdout, cpu, secs as f64).map_err(StallError::Output)
}

/// Reads cyclictest's histogram output (`-h N -t 1`): lines `BUCKET COUNT`, then
/// `# Max Latencies: M` and `# Histogram Overflows: O`.
pub fn parse(text: &str, cpu: usize, seconds: f64) -> Result<Stalls, String> {
    let mut buckets: Vec<(u64, u64)> = Vec::new();
    let (mut max_us, mut overflows) = (None, None);
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix('#') {
            let field = |name: &str| rest.trim().strip_prefix(name).and_then(|v| v.split_whitespace().next());
            if let Some(v) = field("Max Latencies:") {
                max_us = v.parse::<u64>().ok();
            } else if let Some(v) = field("Histogram Overflows:") {
                overflows = v.parse::<u64>().ok();
            }
            continue;
        }
        let mut f = line.split_whitespace();
        if let (Some(b), Some(c)) = (f.next(), f.next())
            && let (Ok(b), Ok(c)) = (b.parse::<u64>(), c.parse::<u64>())
            && c > 0
        {
            buckets.push((b, c));
        }
    }
    let (Some(max_us), Some(overflows)) = (max_us, overflows) else {
        return Err(format!("no histogram summary in its output: {:?}", text.lines().last().unwrap_or("")));
    };
    let samples = buckets.iter().map(|b| b.1).sum::<u64>() + overflows;
    if samples == 0 {
        return Err("no wake-up was measured".into());
    }
    let rank = ((samples as f64) * 0.999).ceil() as u64;
    let mut seen = 0;
    let p999_us = buckets
        .iter()
        .find_map(|&(b, c)| {
            seen += c;
            (seen >= rank).then_some(b)
        })
        .unwrap_or(BUCKETS_US);
    let mut long_us: Vec<u64> = Vec::new();
    if overflows > 0 {
        long_us.push(max_us.max(BUCKETS_US));
        long_us.extend(std::iter::repeat_n(BUCKETS_US, (overflows - 1).min(100_000) as usize));
    }
    for &(b, c) in buckets.iter().rev().filter(|b| b.0 >= LONG_US) {
        long_us.extend(std::iter::repeat_n(b, c.min(100_000) as usize));
    }
    Ok(Stalls {
        cpu,
        seconds,
        samples,
        max_us,
        p999_us,
        over_1ms: long_us.iter().filter(|&&l| l >= 1000).count() as u64,
        long_us,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(buckets: &[(u64, u64)], max: u64, overflows: u64) -> String {
        let mut s = String::new();
        for b in 0..30u64 {
            let c = buckets.iter().find(|x| x.0 == b).map_or(0, |x| x.1);
            s.push_str(&format!("{b:06} {c:06}\n"));
        }
        for (b, c) in buckets.iter().filter(|x| x.0 >= 30) {
            s.push_str(&format!("{b:06} {c:06}\n"));
        }
        s.push_str("# Total: 000009999\n# Min Latencies: 00007\n# Avg Latencies: 00013\n");
        s.push_str(&format!("# Max Latencies: {max:05}\n# Histogram Overflows: {overflows:05}\n"));
        s.push_str("# Histogram Overflow at cycle number:\n# Thread 0:\n");
        s
    }

    #[test]
    fn a_quiet_cpu_has_no_stalls() {
        let s = parse(&output(&[(12, 9000), (20, 990), (150, 10)], 150, 0), 1, 10.0).unwrap();
        assert_eq!((s.samples, s.max_us, s.over_1ms, s.long_us.len()), (10_000, 150, 0, 10));
        assert_eq!(s.p999_us, 20, "the 9990th of 10,000");
        assert_eq!(s.delayed_share(1000), 0.0);
        assert!((s.delayed_share(100) - 500.0 / 10e6).abs() < 1e-12);
    }

    #[test]
    fn stalls_delay_the_requests_that_arrive_during_them() {
        // Two stalls, of 9 ms and 1.5 ms, in 10 s: requests arriving in the first 8 ms
        // of the one and the first 0.5 ms of the other wait more than 1 ms: 0.085%.
        let s = parse(&output(&[(12, 9990), (1500, 1), (9000, 1)], 9000, 0), 0, 10.0).unwrap();
        assert_eq!((s.over_1ms, s.long_us.clone()), (2, vec![9000, 1500]));
        assert!((s.delayed_share(1000) - 0.00085).abs() < 1e-9);
        assert!((s.delayed_share(500) - 0.00095).abs() < 1e-9);
        // Overflows count at least the histogram's top, the largest as the maximum.
        let s = parse(&output(&[(12, 9990)], 45_000, 2), 0, 10.0).unwrap();
        assert_eq!((s.samples, s.over_1ms, s.long_us.clone()), (9992, 2, vec![45_000, 20_000]));
        assert_eq!(s.p999_us, 12, "2 of 9992 are under 0.1%");
        // When they are more than 0.1%, p99.9 reads the histogram's top.
        let s = parse(&output(&[(12, 990)], 45_000, 2), 0, 1.0).unwrap();
        assert_eq!(s.p999_us, BUCKETS_US);
    }

    #[test]
    fn output_without_a_histogram_is_refused() {
        assert!(parse("cyclictest: invalid option\n", 0, 1.0).is_err());
        assert!(parse(&output(&[], 0, 0), 0, 1.0).unwrap_err().contains("no wake-up"));
    }
}

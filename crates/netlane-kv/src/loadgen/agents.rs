//! One run made by several generator processes, agents on hosts of their own, as
//! mutilate's agents make one: the offered rate and the connections split between them,
//! each agent's latencies measured on its own clock from its own schedule, and their
//! full histograms merged exactly.

use serde::{Deserialize, Serialize};

use super::{LoadConfig, LoadError, LoadReport, Run};
use crate::load::schedule::{Arrivals, Pacing};
use crate::load::stats::{Counts, Stats};

/// Splits `cfg` between `agents` agents: the connections as evenly as they go (agent
/// `i` gets one more than the last ones when they do not divide), the open loop's rate
/// in proportion to each agent's connections (so every connection offers what it would
/// from one generator), a seed of its own for each agent past the first (their
/// schedules and requests independent draws; the first agent's are one generator's).
/// Threads (at most an agent's connections), CPUs, the workload, the run's length and
/// the server are each agent's as given.
pub fn split(cfg: &LoadConfig, agents: usize) -> Result<Vec<LoadConfig>, LoadError> {
    if agents == 0 || agents > cfg.connections as usize {
        return Err(LoadError::Config(format!(
            "{agents} agents for {} connections: each agent needs at least one",
            cfg.connections
        )));
    }
    let n = agents as u32;
    Ok((0..n)
        .map(|i| {
            let connections = cfg.connections / n + u32::from(i < cfg.connections % n);
            let pacing = match cfg.pacing {
                Pacing::Open(a) => Pacing::Open(Arrivals {
                    rate_per_s: a.rate_per_s * f64::from(connections) / f64::from(cfg.connections),
                    ..a
                }),
                closed => closed,
            };
            LoadConfig {
                connections,
                threads: cfg.threads.min(connections as usize),
                pacing,
                seed: cfg.seed.wrapping_add(u64::from(i).wrapping_mul(SEED_STRIDE)),
                ..cfg.clone()
            }
        })
        .collect())
}

/// Threads' seconds no run reaches (a thousand threads for a day).
const MAX_SECONDS: f64 = 1000.0 * 86_400.0;

/// Apart enough that no two agents' seeds meet (the golden ratio's odd 64-bit step).
const SEED_STRIDE: u64 = 0x9E37_79B9_7F4A_7C15;

/// What an agent sends back of its run: every counter, the latency histogram whole, and
/// the CPU and wall time of its threads.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AgentOutput {
    /// Every counter of the run.
    pub counts: Counts,
    /// The latency histogram: HdrHistogram's V2 serialized form, base64.
    pub latency_hdr: String,
    /// Connections that failed during the run.
    pub connection_failures: u64,
    /// CPU time of its threads, s.
    pub cpu_s: f64,
    /// Wall time of its threads, summed, s.
    pub wall_s: f64,
}

impl AgentOutput {
    /// What `run` sends back.
    pub fn of(run: &Run) -> AgentOutput {
        AgentOutput {
            counts: *run.stats.counts(),
            latency_hdr: run.stats.latency_encoded(),
            connection_failures: run.report.connection_failures,
            cpu_s: run.report.client_cpu_s,
            wall_s: run.threads_wall_s,
        }
    }

    /// Its statistics, checked ([`Stats::from_parts`]; times finite, at most a day of a
    /// thousand threads).
    pub fn stats(&self) -> Result<Stats, LoadError> {
        let sane = |t: f64| t.is_finite() && (0.0..=MAX_SECONDS).contains(&t);
        if !sane(self.cpu_s) || !sane(self.wall_s) || self.connection_failures > u64::from(u32::MAX) {
            return Err(LoadError::Config(format!(
                "an agent's run: CPU {} s, wall {} s, {} failed connections are not a run's",
                self.cpu_s, self.wall_s, self.connection_failures
            )));
        }
        Stats::from_parts(self.counts, &self.latency_hdr).map_err(|e| LoadError::Config(format!("an agent's run: {e}")))
    }
}

/// The run of `cfg` that agents made in its [`split`]: their statistics merged, their
/// failed connections, CPU and wall time summed.
pub fn merge(cfg: &LoadConfig, agents: &[AgentOutput]) -> Result<Run, LoadError> {
    let mut stats = Stats::new();
    for a in agents {
        stats.merge(&a.stats()?);
    }
    let failures = agents.iter().map(|a| a.connection_failures).sum();
    let cpu = agents.iter().map(|a| a.cpu_s).sum();
    let wall = agents.iter().map(|a| a.wall_s).sum();
    let report = LoadReport::summarize(cfg, &stats, failures, cpu, wall);
    Ok(Run { report, stats, threads_wall_s: wall })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::schedule::Process;

    fn open(rate: f64, connections: u32) -> LoadConfig {
        LoadConfig {
            connections,
            threads: 4,
            pacing: Pacing::Open(Arrivals { process: Process::Poisson, rate_per_s: rate }),
            seed: 42,
            ..LoadConfig::default()
        }
    }

    fn rates(parts: &[LoadConfig]) -> Vec<f64> {
        parts
            .iter()
            .map(|p| match p.pacing {
                Pacing::Open(a) => a.rate_per_s,
                Pacing::Closed { .. } => 0.0,
            })
            .collect()
    }

    #[test]
    fn connections_and_rate_split_so_each_connection_offers_what_it_would_alone() {
        let cfg = open(100_000.0, 10);
        let parts = split(&cfg, 3).unwrap();
        assert_eq!(parts.iter().map(|p| p.connections).collect::<Vec<_>>(), [4, 3, 3]);
        let r = rates(&parts);
        assert_eq!(r, [40_000.0, 30_000.0, 30_000.0]);
        assert!((r.iter().sum::<f64>() - 100_000.0).abs() < 1e-6);
        // Threads never outnumber an agent's connections; seeds all differ, the first is
        // one generator's.
        let parts = split(&open(1_000.0, 5), 4).unwrap();
        assert_eq!(parts.iter().map(|p| p.threads).collect::<Vec<_>>(), [2, 1, 1, 1]);
        let mut seeds: Vec<u64> = parts.iter().map(|p| p.seed).collect();
        assert_eq!(seeds[0], 42);
        seeds.sort_unstable();
        seeds.dedup();
        assert_eq!(seeds.len(), 4);
        // One agent is the generator itself.
        assert_eq!(
            format!("{:?}", split(&cfg, 1).unwrap()[0]),
            format!("{:?}", LoadConfig { threads: 4, ..cfg.clone() })
        );
        // Closed loop: the depth stays per connection.
        let closed = LoadConfig { pacing: Pacing::Closed { depth: 3 }, ..cfg.clone() };
        assert!(split(&closed, 2).unwrap().iter().all(|p| matches!(p.pacing, Pacing::Closed { depth: 3 })));
    }

    #[test]
    fn more_agents_than_connections_or_none_is_refused() {
        for n in [0, 11] {
            let e = split(&open(1_000.0, 10), n).unwrap_err().to_string();
            assert!(e.contains("each agent needs at least one"), "{e}");
        }
    }

    #[test]
    fn agents_runs_merge_into_the_run_of_the_whole() {
        let cfg = open(2_000.0, 4);
        let mut a = Stats::new();
        let mut b = Stats::new();
        crate::load::stats::record_for_tests(&mut a, &[10_000, 20_000, 30_000]);
        crate::load::stats::record_for_tests(&mut b, &[5_000_000]);
        let out = |s: &Stats, cpu: f64| AgentOutput {
            counts: *s.counts(),
            latency_hdr: s.latency_encoded(),
            connection_failures: 1,
            cpu_s: cpu,
            wall_s: 2.0,
        };
        let run = merge(&cfg, &[out(&a, 0.5), out(&b, 0.25)]).unwrap();
        assert_eq!(run.report.counts.completed, 4);
        assert_eq!(run.stats.counts().settled(), 4);
        assert_eq!(run.report.connection_failures, 2);
        assert!((run.report.client_cpu_s - 0.75).abs() < 1e-9);
        assert!((run.report.client_cpu_busy - 0.75 / 4.0).abs() < 1e-9);
        // p99 of the four is the slow agent's request.
        assert!(run.stats.latency_at(0.99).unwrap() >= 5_000_000);
        // An agent's output that does not hold together spoils the run.
        let mut bad = out(&a, 0.5);
        bad.counts.completed += 1;
        assert!(merge(&cfg, &[bad]).unwrap_err().to_string().contains("an agent's run"));
        for (cpu, wall) in [(f64::NAN, 1.0), (1.0, f64::INFINITY), (-1.0, 1.0)] {
            let odd = AgentOutput { cpu_s: cpu, wall_s: wall, ..out(&a, 0.5) };
            assert!(merge(&cfg, &[odd]).unwrap_err().to_string().contains("are not a run's"));
        }
        let odd = AgentOutput { connection_failures: u64::MAX, ..out(&a, 0.5) };
        assert!(merge(&cfg, &[odd.clone(), odd]).is_err());
    }
}

//! One population on several hosts at once, one measurement: each host's agent runs its
//! share of the clients (and of an open-loop rate) and sends back its report and its
//! whole latency histogram; the parts are merged exactly.

use netlane::metrics::hist::Hist;
use serde::{Deserialize, Serialize};

use super::{ClientsConfig, ClientsError, ClientsReport, Load};

/// What an agent sends beside its report.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AgentOutput {
    /// The latency histogram: HdrHistogram's V2 serialized form, base64.
    pub latency_hdr: String,
}

impl AgentOutput {
    /// The output of a run whose latencies are `hist`.
    pub fn of(hist: &Hist) -> AgentOutput {
        AgentOutput { latency_hdr: hist.encoded() }
    }
}

/// More than any run counts (ten million a second for four days, over a hundred times):
/// an agent's counts past it are not a run's, and sums of them cannot overflow.
const MAX_COUNT: u64 = 1 << 47;

/// `cfg` split between `n` agents: the clients as evenly as they go, each agent's
/// threads at most its clients, an open-loop rate in proportion to the clients, and a
/// seed of its own.
pub fn split(cfg: &ClientsConfig, n: usize) -> Result<Vec<ClientsConfig>, ClientsError> {
    cfg.validate()?;
    if n == 0 || n > cfg.clients {
        return Err(ClientsError::Invalid(format!("{} clients cannot be split between {n} agents", cfg.clients)));
    }
    Ok((0..n)
        .map(|i| {
            let clients = cfg.clients / n + usize::from(i < cfg.clients % n);
            let load = match cfg.load {
                Load::Open { rate } => Load::Open { rate: rate * clients as f64 / cfg.clients as f64 },
                closed => closed,
            };
            ClientsConfig {
                clients,
                threads: cfg.threads.min(clients),
                load,
                seed: cfg.seed.wrapping_add(i as u64 + 1),
                ..cfg.clone()
            }
        })
        .collect())
}

/// The agents' parts (each report and its latencies) as one report of `cfg`: counts
/// summed, the latencies merged, the rate over the longest measured time (they start
/// together), with the merged latencies. A part whose latencies are not one per response
/// is refused.
pub fn merge(cfg: &ClientsConfig, parts: &[(ClientsReport, Hist)]) -> Result<(ClientsReport, Hist), ClientsError> {
    let mut all = ClientsReport::empty(cfg);
    let mut hist = Hist::new();
    let mut seconds: f64 = 0.0;
    for (i, (report, h)) in parts.iter().enumerate() {
        if report.responses > MAX_COUNT || report.requests > MAX_COUNT {
            return Err(ClientsError::Invalid(format!(
                "agent {}: {} requests and {} responses: more than any run makes",
                i + 1,
                report.requests,
                report.responses
            )));
        }
        if h.count() != report.responses {
            return Err(ClientsError::Invalid(format!(
                "agent {}: {} latencies for {} responses",
                i + 1,
                h.count(),
                report.responses
            )));
        }
        if !(report.seconds.is_finite() && (0.0..=1e6).contains(&report.seconds)) {
            return Err(ClientsError::Invalid(format!("agent {}: measured for {} s", i + 1, report.seconds)));
        }
        all.add(report);
        hist.merge(h);
        seconds = seconds.max(report.seconds);
    }
    all.threads = parts.iter().map(|(r, _)| r.threads).sum();
    all.finish(seconds, &hist);
    Ok((all, hist))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::proto::client::ClientConfig;

    fn cfg(clients: usize, load: Load) -> ClientsConfig {
        ClientsConfig {
            server: "10.0.0.1:7070".parse().unwrap(),
            clients,
            threads: 2,
            cpus: None,
            client: ClientConfig {
                request_len: 64,
                response_len: 64,
                echo: false,
                timeout_ns: 500_000_000,
                max_retries: 3,
                max_outstanding: if matches!(load, Load::Open { .. }) { 8 } else { 1 },
            },
            load,
            ramp: Duration::from_millis(100),
            duration: Duration::from_secs(1),
            gro: false,
            seed: 7,
            transport: crate::server::Transport::Udp,
        }
    }

    #[test]
    fn clients_and_rate_are_split_whole_and_seeds_differ() {
        let c = cfg(7, Load::Open { rate: 7_000.0 });
        let parts = split(&c, 3).unwrap();
        assert_eq!(parts.iter().map(|p| p.clients).collect::<Vec<_>>(), [3, 2, 2]);
        assert_eq!(parts.iter().map(|p| p.threads).collect::<Vec<_>>(), [2, 2, 2]);
        let rates: Vec<f64> = parts.iter().map(|p| if let Load::Open { rate } = p.load { rate } else { 0.0 }).collect();
        assert_eq!(rates, [3_000.0, 2_000.0, 2_000.0]);
        let seeds: std::collections::BTreeSet<u64> = parts.iter().map(|p| p.seed).collect();
        assert_eq!(seeds.len(), 3);
        assert!(split(&c, 8).is_err());
        assert!(split(&c, 0).is_err());
        let ones = split(&cfg(3, Load::Closed { think: Duration::ZERO }), 3).unwrap();
        assert!(ones.iter().all(|p| (p.clients, p.threads) == (1, 1)));
    }

    #[test]
    fn parts_merge_into_their_sum_and_a_part_without_its_latencies_is_refused() {
        let c = cfg(4, Load::Closed { think: Duration::ZERO });
        let part = |responses: u64, seconds: f64, base: u64| {
            let mut h = Hist::new();
            (0..responses).for_each(|i| h.record(base + i));
            let r = ClientsReport { responses, requests: responses + 1, seconds, threads: 1, ..Default::default() };
            (r, Hist::decode(&AgentOutput::of(&h).latency_hdr).unwrap())
        };
        let parts = [part(1_000, 1.0, 10_000), part(3_000, 1.02, 50_000)];
        let (m, merged) = merge(&c, &parts).unwrap();
        assert_eq!(merged.count(), m.responses);
        assert_eq!((m.responses, m.requests, m.threads, m.clients), (4_000, 4_002, 2, 4));
        assert_eq!(m.seconds, 1.02);
        assert_eq!(m.latency_ns.count, 4_000);
        let mut both = Hist::new();
        parts.iter().for_each(|(_, h)| both.merge(h));
        assert_eq!(m.latency_ns, both.summary());
        let mut short = part(10, 1.0, 1);
        short.0.responses = 11;
        assert!(merge(&c, &[short]).is_err());
        assert!(merge(&c, &[part(1, f64::NAN, 1)]).is_err());
        let mut huge = part(1, 1.0, 1);
        huge.0.requests = u64::MAX;
        assert!(merge(&c, &[huge]).is_err());
    }

    /// A lost request ranks above every answer: it can only make a percentile worse.
    #[test]
    fn lost_requests_rank_above_every_answer() {
        use crate::clients::latency_at;
        let mut h = Hist::new();
        (1..=98u64).for_each(|v| h.record(v * 1000));
        assert_eq!(latency_at(&h, 0, 0.5), Some(h.quantile(0.5)));
        let p50 = latency_at(&h, 2, 0.5).unwrap();
        assert!((49_000..=50_100).contains(&p50), "{p50}");
        assert_eq!(latency_at(&h, 2, 0.98), Some(h.quantile(1.0)));
        assert_eq!(latency_at(&h, 2, 0.99), None, "p99 falls among the two lost");
        assert_eq!(latency_at(&Hist::new(), 0, 0.5), None);
        assert_eq!(latency_at(&Hist::new(), 5, 0.0), None);
        // Rank 7 of 100 values 1..=100 is the 7th, however 0.07 * 100 rounds.
        let mut h = Hist::new();
        (1..=100u64).for_each(|v| h.record(v));
        assert_eq!(latency_at(&h, 0, 0.07), Some(7));
        assert_eq!(latency_at(&h, 0, 1.0), Some(100));
        assert_eq!(latency_at(&h, 0, 0.0), Some(1));
    }
}

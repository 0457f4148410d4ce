//! What the benchmark can be asked: flow counts, hint modes, time, the skb path and the
//! two-core runs, and the checks on them before anything is built.

use std::time::Duration;

use netlane_lb::LbError;
use netlane_sys::bpf::HintMode;

/// Flow counts up to this are measured on the skb path too.
pub const SKB_MAX_FLOWS: u32 = 10_000;

/// How to run the benchmark.
#[derive(Debug, Clone)]
pub struct PpsOptions {
    /// Flow counts.
    pub flows: Vec<u32>,
    /// Hint modes of the balancer (the ceiling is always run too).
    pub modes: Vec<HintMode>,
    /// Measured time per run.
    pub time: Duration,
    /// Also measure frames that arrive as skbs (flow counts up to [`SKB_MAX_FLOWS`]):
    /// the path where veth has an RX hash, so the device-bound build is measured.
    pub skb: bool,
    /// Also measure every frames-path program on two cores (flow counts that split
    /// evenly between two queues, see [`splits_in_two`]).
    pub two_cores: bool,
    /// Where the generators and the balancer run.
    pub cpus: PpsCpus,
}

/// Where the harness runs: its generators and the balancer's NAPI threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PpsCpus {
    /// The generators' CPUs: the first sends the one-core turns, both the two-core ones.
    pub generators: [usize; 2],
    /// The CPUs of the balancer's NAPI threads: the first serves the one-core turns; in
    /// the two-core turns the i-th serves the receive queue the i-th generator feeds.
    pub balancers: [usize; 2],
}

impl PpsCpus {
    /// Receive queues a two-core link needs: veth puts a frame on the peer's queue of
    /// the sending CPU's number (modulo the queues), so one per CPU up to the highest
    /// used keeps every generator and every balancer thread on a queue of its own.
    pub fn queues(&self) -> u32 {
        self.generators.iter().chain(&self.balancers).max().map_or(1, |c| *c as u32 + 1)
    }

    fn validate(&self, two_cores: bool) -> Result<(), LbError> {
        let online = netlane::cpus::online_count();
        if let Some(c) = self.generators.iter().chain(&self.balancers).find(|c| **c >= online) {
            return Err(LbError::Invalid(format!("CPU {c} is not online (this machine has {online})")));
        }
        // veth has at most 64 queues a side, one per CPU number here.
        if self.queues() > 64 {
            return Err(LbError::Invalid(format!(
                "CPUs {:?} and {:?}: the two-core link has a queue per CPU number, and veth at most 64",
                self.generators, self.balancers
            )));
        }
        let [g0, g1] = self.generators;
        let [b0, b1] = self.balancers;
        if g0 == b0 {
            return Err(LbError::Invalid(format!("the generator and the balancer share CPU {g0}")));
        }
        if two_cores && (g0 == g1 || b0 == b1) {
            return Err(LbError::Invalid(format!(
                "the two-core runs need two generator CPUs and two balancer CPUs, got {:?} and {:?}",
                self.generators, self.balancers
            )));
        }
        Ok(())
    }
}

/// Whether `flows` flows can be measured on two cores: RSS keeps a flow on one queue,
/// so each of the two generators sends half of them (a single flow uses one core).
pub fn splits_in_two(flows: u32) -> bool {
    flows >= 2 && flows.is_multiple_of(2)
}

impl PpsOptions {
    /// Checks the options.
    pub fn validate(&self) -> Result<(), LbError> {
        if self.flows.is_empty() {
            return Err(LbError::Invalid("--flows: no flow counts given".into()));
        }
        if let Some(bad) = self.flows.iter().find(|f| **f == 0 || **f > 4_000_000) {
            return Err(LbError::Invalid(format!("--flows: flow counts must be 1 to 4000000, got {bad}")));
        }
        if let Some(dup) = self.flows.iter().enumerate().find(|(i, f)| self.flows[..*i].contains(f)) {
            return Err(LbError::Invalid(format!("--flows: {} is listed twice", dup.1)));
        }
        if self.time < Duration::from_millis(200) || self.time > Duration::from_secs(60) {
            return Err(LbError::Invalid(format!(
                "--time: {} per flow count is outside 200ms to 60s",
                netlane::metrics::units::format_duration(self.time)
            )));
        }
        if self.modes.iter().enumerate().any(|(i, m)| self.modes[..i].contains(m)) {
            let names: Vec<&str> = self.modes.iter().map(|m| m.name()).collect();
            return Err(LbError::Invalid(format!("--modes: a hint mode is listed twice: {}", names.join(","))));
        }
        if netlane::cpus::online_count() < 2 {
            return Err(LbError::Invalid("the pps benchmark needs 2 CPUs (generator and balancer)".into()));
        }
        self.cpus.validate(self.two_cores)
    }
}

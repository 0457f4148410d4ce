//! The machine's state around a measurement: how busy it was while the numbers were
//! taken (provenance, what built them and on what, is `netlane_report::provenance`).
//!
//! Noise on a shared 2-CPU VM comes from neighbours: another process on the machine
//! (busy CPU before the run starts), or the hypervisor giving the CPU to someone else
//! (steal time in `/proc/stat`). Both are recorded in every report, and a busy machine
//! is warned about before anything starts.

use std::time::{Duration, Instant};

use netlane::metrics::{SystemCpu, SystemCpuDelta};
use netlane_report::MachineState;

/// Share of all CPUs busy before a run above which the machine counts as busy, %.
const BUSY_PCT: f64 = 20.0;
/// Steal above this share of CPU time makes figures unreliable, %.
const STEAL_PCT: f64 = 5.0;

/// The 1-minute load average.
fn load_avg_1m() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok().and_then(|t| t.split_whitespace().next().and_then(|v| v.parse().ok()))
}

fn pct(part: f64, d: &SystemCpuDelta) -> Option<f64> {
    (d.total_s > 0.0).then(|| 100.0 * part / d.total_s)
}

/// Watches the machine around a measurement.
#[derive(Debug)]
pub struct Monitor {
    state: MachineState,
    stat0: Option<SystemCpu>,
    started: Instant,
}

impl Monitor {
    /// Samples the machine for `sample` (what else uses its CPUs before we start), and
    /// warns about a busy machine.
    pub fn start(sample: Duration) -> Monitor {
        let a = SystemCpu::read().ok();
        std::thread::sleep(sample);
        let b = SystemCpu::read().ok();
        let before = match (a, b) {
            (Some(a), Some(b)) => Some(a.delta(&b)),
            _ => None,
        };
        let busy = before.and_then(|d| pct(d.busy_s, &d));
        let steal = before.and_then(|d| pct(d.steal_s, &d));
        let load = load_avg_1m();
        let cpus = netlane::cpus::online_count() as f64;
        let mut warnings = Vec::new();
        if let Some(busy) = busy.filter(|b| *b > BUSY_PCT) {
            warnings.push(format!(
                "the machine was busy before the run: {busy:.0}% of its CPU time in use by other work; \
                 expect noisy figures"
            ));
        }
        if let Some(load) = load.filter(|l| *l > cpus * 0.5) {
            warnings.push(format!("the 1-minute load average is {load:.2} on {cpus:.0} CPUs; expect noisy figures"));
        }
        if let Some(steal) = steal.filter(|s| *s > STEAL_PCT) {
            warnings.push(format!("the hypervisor stole {steal:.0}% of CPU time before the run"));
        }
        Monitor {
            state: MachineState {
                load_avg_1m_start: load,
                load_avg_1m_end: None,
                busy_pct_before: busy,
                steal_pct_before: steal,
                steal_pct_during: None,
                seconds: None,
                warnings,
            },
            stat0: SystemCpu::read().ok(),
            started: Instant::now(),
        }
    }

    /// Warnings found before the run (print them before starting).
    pub fn warnings(&self) -> &[String] {
        &self.state.warnings
    }

    /// The state over the whole measurement.
    pub fn finish(mut self) -> MachineState {
        let s = &mut self.state;
        s.load_avg_1m_end = load_avg_1m();
        s.seconds = Some(self.started.elapsed().as_secs_f64());
        if let (Some(a), Ok(b)) = (self.stat0, SystemCpu::read()) {
            let d = a.delta(&b);
            s.steal_pct_during = pct(d.steal_s, &d);
            if let Some(steal) = s.steal_pct_during.filter(|s| *s > STEAL_PCT) {
                s.warnings.push(format!(
                    "the hypervisor stole {steal:.0}% of CPU time during the run: figures are less reliable"
                ));
            }
        }
        self.state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monitor_records_the_state() {
        let m = Monitor::start(Duration::from_millis(50));
        let s = m.finish();
        // /proc/stat counts in 10 ms ticks: a 50 ms sample always spans some.
        assert!(s.busy_pct_before.is_some_and(|b| (0.0..=100.0).contains(&b)), "{s:?}");
        assert!(s.load_avg_1m_start.is_some() && s.load_avg_1m_end.is_some() && s.seconds.is_some(), "{s:?}");
    }
}

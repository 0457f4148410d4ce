//! `lb-pps`: packets per second per core through the XDP load balancer, 1 to 1 M
//! flows, hints off / rx-hash / per-flow tags / per-destination tags, with a trivial
//! XDP_TX program as the ceiling in the same run, on one core and on two (two receive
//! queues, two NAPI threads, a generator per CPU with half of the flows each).
//!
//! The engine ([`crate::engines::lb_pps`]) loads and warms up every program of a flow
//! count, then gives them turns on the interface: six slices each, rotating order. A
//! round here is one turn of every program, so a ratio pairs two programs' slices of
//! the same round. Slices that measured nothing (the NAPI thread got no CPU) are left
//! out and said so.
//!
//! The folder: `options.rs` (what can be asked, and the engine's options from it),
//! `plan.rs` (where the generators and the balancer's threads run), `checks.rs` (the results by flow count and program, the paired slices the targets
//! compare, and the checks as one list), `report.rs` (its sections).

mod checks;
mod options;
mod plan;
mod report;
#[cfg(test)]
mod tests;

use std::sync::Mutex;

use anyhow::{Result, bail};
use netlane_report::ScenarioReport;
use netlane_report::options::OptionList;

use super::Scenario;
use crate::engines::lb_pps as pps;
use crate::progress::Progress;

pub use self::options::LbPpsArgs;

impl Scenario for LbPpsArgs {
    fn name(&self) -> &'static str {
        "lb-pps"
    }

    fn options(&self) -> OptionList {
        let flows: Vec<u64> = self.flows.iter().map(|f| u64::from(*f)).collect();
        OptionList::new()
            .ints("flows", &flows)
            .words("modes", &self.modes)
            .duration("time", self.time)
            .flag("no-skb", self.no_skb)
            .flag("no-two-cores", self.no_two_cores)
    }

    fn validate(&self) -> Result<()> {
        self.engine_options(plan::placement(&plan::cpu_plan()))?;
        if !netlane::topology::have_privileges() {
            bail!("lb-pps builds namespaces and loads XDP programs: run it as root");
        }
        Ok(())
    }

    /// Per flow count: one load-and-warm-up per program, then the turns; the same again
    /// on the skb path for flow counts up to its limit.
    fn runs(&self) -> usize {
        let skb = if self.no_skb { 0 } else { self.flows.iter().filter(|f| **f <= pps::SKB_MAX_FLOWS).count() };
        (self.flows.len() + skb) * (self.modes.len() + 2)
    }

    fn run(&self, progress: &dyn Progress) -> Result<ScenarioReport> {
        let plan = plan::cpu_plan();
        let o = self.engine_options(plan::placement(&plan))?;
        self.validate()?;
        // The engine says what it starts; the previous step is then done.
        let last = Mutex::new(String::new());
        let tell = |label: &str| {
            if let Ok(mut l) = last.lock() {
                if !l.is_empty() {
                    progress.finish(&l, "done");
                }
                *l = label.to_string();
            }
            progress.start(label);
        };
        let results = pps::run(&o, &tell)?;
        if let Ok(l) = last.lock()
            && !l.is_empty()
        {
            progress.finish(&l, "done");
        }
        Ok(self.report(&results, &plan))
    }
}

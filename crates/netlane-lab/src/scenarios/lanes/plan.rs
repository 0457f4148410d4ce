//! The lanes scenario's plan: where its roles run, and the load each run offers.

use std::net::SocketAddr;
use std::time::Duration;

use netlane::cpus::machine::CpuTopology;
use netlane_kv::load::schedule::Pacing;
use netlane_kv::loadgen::LoadConfig;

use crate::plan::{Ask, CpuPlan, Role};

use super::*;

/// Lanes, one receive queue each (and as many generator threads).
pub(crate) const LANES: usize = 2;

/// Where the lanes, their queues' NAPI threads and the generator's threads run: apart
/// where the machine has the CPUs; on two CPUs a lane, its NAPI thread and a generator
/// thread on each.
pub(crate) fn cpu_plan() -> CpuPlan {
    plan_on(&CpuTopology::read())
}

/// The plan on a described machine (whose device has no NUMA node: a veth).
pub(crate) fn plan_on(machine: &CpuTopology) -> CpuPlan {
    CpuPlan::new(
        machine,
        None,
        &[
            Ask::own(Role::Lane, LANES),
            Ask::or_beside(Role::Napi, LANES, Role::Lane),
            Ask::or_beside(Role::Generator, LANES, Role::Lane),
        ],
    )
}

impl LanesBenchArgs {
    /// The defaults, as `netlane bench lanes` has them.
    pub fn defaults() -> LanesBenchArgs {
        crate::scenarios::from_words(&[]).expect("the defaults parse")
    }

    pub(crate) fn load(&self, server: SocketAddr, connections: u32, pacing: Pacing, duration: Duration) -> LoadConfig {
        // On a testbed the client hosts' own CPUs place the generator (or nothing does).
        let cpus = if self.on.testbed.is_some() { Vec::new() } else { cpu_plan().cpus(Role::Generator).to_vec() };
        let workload = self.workload.spec(1 << 20);
        crate::scenarios::cache::load_config(server, (connections, LANES), cpus, pacing, workload, duration)
    }
}

//! The lb-pps scenario's plan: where its two generators and the balancer's two NAPI
//! threads run. Apart where the machine has four CPUs; on fewer, the balancer's threads
//! run beside the generators, each on the other generator's CPU (so the one-core turns
//! still have the generator and the balancer apart, and the two-core ones share).

use netlane::cpus::machine::CpuTopology;

use netlane_report::RoleCpus;

use crate::engines::lb_pps::PpsCpus;
use crate::plan::{Ask, CpuPlan, Role, as_given};

/// The plan on this machine.
pub(crate) fn cpu_plan() -> CpuPlan {
    plan_on(&CpuTopology::read())
}

/// The plan on a described machine (the veth pair has no NUMA node).
pub(crate) fn plan_on(machine: &CpuTopology) -> CpuPlan {
    CpuPlan::new(machine, None, &[Ask::own(Role::Generator, 2), Ask::or_beside(Role::Napi, 2, Role::Generator)])
}

/// Whether the two-core turns run with generators and balancer threads apart: what
/// the two-core checks need to stand for a balancer with cores of its own.
pub(crate) fn two_cores_apart(plan: &CpuPlan) -> bool {
    plan.apart(Role::Generator, Role::Napi)
}

/// The engine's placement from `plan`.
pub(crate) fn placement(plan: &CpuPlan) -> PpsCpus {
    let at = |cpus: &[usize], i: usize| cpus.get(i).or(cpus.first()).copied().unwrap_or(0);
    let g = plan.cpus(Role::Generator);
    let generators = [at(g, 0), at(g, 1)];
    let balancers = if two_cores_apart(plan) {
        let b = plan.cpus(Role::Napi);
        [at(b, 0), at(b, 1)]
    } else {
        [generators[1], generators[0]]
    };
    PpsCpus { generators, balancers }
}

/// Where the roles ran, as the report shows it: the engine's placement (beside the
/// generators, each balancer thread is on the other generator's CPU, which the plan's
/// own view does not say).
pub(crate) fn view(plan: &CpuPlan) -> Vec<RoleCpus> {
    let p = placement(plan);
    as_given(&[(Role::Generator, &p.generators), (Role::Napi, &p.balancers)])
}

/// One line for a check not shown: where the roles ran, and what keeping them apart needs.
pub(crate) fn describe(plan: &CpuPlan) -> String {
    let p = placement(plan);
    let list = |c: &[usize; 2]| format!("{},{}", c[0], c[1]);
    format!(
        "generators on CPUs {}, the balancer's NAPI threads on {}; {} CPUs, {} would keep every role apart",
        list(&p.generators),
        list(&p.balancers),
        plan.available(),
        plan.needs_apart()
    )
}

//! The CPU plan: which CPUs each role of a scenario runs on, derived from the machine
//! (sans-IO: the machine is a [`CpuTopology`], read from this one or described).
//!
//! A scenario asks for CPUs role by role ([`Ask`]). Where the machine has enough, every
//! role gets CPUs of its own: the device's NUMA node first, one thread of each physical
//! core before any core's second thread. Where it has not, roles that may double up
//! with another ([`Ask::shares`]) do so, in the order they were asked, until the rest
//! fits; a plan says what it would need to keep every role apart, so a check that needs
//! roles apart can say "not shown on this machine: needs N CPUs".

use netlane::cpus::machine::CpuTopology;
use netlane_report::RoleCpus;

/// What a role is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// A server thread that owns a receive queue (a lane).
    Lane,
    /// A threaded NAPI instance: the receive processing of one queue.
    Napi,
    /// A load generator's thread.
    Generator,
    /// A server (its threads and its end's NAPI) that is not split into lanes.
    Server,
}

impl Role {
    /// The role as the report names it.
    pub fn name(self) -> &'static str {
        match self {
            Role::Lane => "lane",
            Role::Napi => "napi",
            Role::Generator => "generator",
            Role::Server => "server",
        }
    }
}

/// CPUs one role asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    /// The role.
    pub role: Role,
    /// How many CPUs (one per thread).
    pub count: usize,
    /// The role it may run beside when CPUs run short: its i-th thread then takes the
    /// other's i-th CPU (wrapping).
    pub shares: Option<Role>,
}

impl Ask {
    /// `count` CPUs of its own, always.
    pub fn own(role: Role, count: usize) -> Ask {
        Ask { role, count, shares: None }
    }

    /// `count` CPUs, beside `other`'s when the machine is short of CPUs.
    pub fn or_beside(role: Role, count: usize, other: Role) -> Ask {
        Ask { role, count, shares: Some(other) }
    }
}

/// Where every role runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuPlan {
    placed: Vec<(Ask, Vec<usize>, bool)>,
    available: usize,
}

impl CpuPlan {
    /// The plan for `asks` on `machine`, whose device (when known) is on NUMA node
    /// `device_node`.
    pub fn new(machine: &CpuTopology, device_node: Option<usize>, asks: &[Ask]) -> CpuPlan {
        let order = preference(machine, device_node);
        // Fold the roles that may share, in the order asked, until the rest fits.
        let mut beside = vec![false; asks.len()];
        let own = |beside: &[bool]| asks.iter().zip(beside).filter(|(_, b)| !**b).map(|(a, _)| a.count).sum::<usize>();
        for (i, a) in asks.iter().enumerate() {
            if own(&beside) <= order.len() {
                break;
            }
            if a.shares.is_some_and(|o| asks.iter().any(|b| b.role == o && b.shares.is_none())) {
                beside[i] = true;
            }
        }
        let mut next = 0;
        let mut placed: Vec<(Ask, Vec<usize>, bool)> = Vec::new();
        for (a, &b) in asks.iter().zip(&beside) {
            if b {
                continue;
            }
            // Still short (asks that must have CPUs of their own, more than there are):
            // wrap around.
            let cpus = (0..a.count).map(|k| order[(next + k) % order.len().max(1)]).collect();
            next += a.count;
            placed.push((*a, cpus, false));
        }
        for (a, _) in asks.iter().zip(&beside).filter(|(_, b)| **b) {
            let host = a.shares.and_then(|o| placed.iter().find(|(p, _, _)| p.role == o)).map(|(_, c, _)| c.clone());
            let host = host.unwrap_or_default();
            let cpus = (0..a.count).map(|k| host[k % host.len().max(1)]).collect();
            placed.push((*a, cpus, true));
        }
        placed.sort_by_key(|(a, _, _)| asks.iter().position(|b| b.role == a.role));
        CpuPlan { placed, available: order.len() }
    }

    /// The CPUs of `role`, thread by thread (empty for a role not asked for).
    pub fn cpus(&self, role: Role) -> &[usize] {
        self.placed.iter().find(|(a, _, _)| a.role == role).map_or(&[], |(_, c, _)| c.as_slice())
    }

    /// Whether `a` and `b` run on CPUs of their own, none in common.
    pub fn apart(&self, a: Role, b: Role) -> bool {
        let (x, y) = (self.cpus(a), self.cpus(b));
        !x.is_empty() && !y.is_empty() && x.iter().all(|c| !y.contains(c))
    }

    /// CPUs the machine gave the plan.
    pub fn available(&self) -> usize {
        self.available
    }

    /// CPUs every role asked for, apart.
    pub fn needs_apart(&self) -> usize {
        self.placed.iter().map(|(a, _, _)| a.count).sum()
    }

    /// CPUs that `roles` need to run apart from each other (each its own).
    pub fn needs(&self, roles: &[Role]) -> usize {
        self.placed.iter().filter(|(a, _, _)| roles.contains(&a.role)).map(|(a, _, _)| a.count).sum()
    }

    /// The plan as the report shows it.
    pub fn view(&self) -> Vec<RoleCpus> {
        self.placed
            .iter()
            .map(|(a, cpus, beside)| RoleCpus {
                role: a.role.name().into(),
                cpus: cpus.clone(),
                beside: beside.then(|| a.shares.map(|o| o.name().to_string())).flatten(),
            })
            .collect()
    }

    /// One line: `lane 0,1; napi 0,1 (beside lane); generator 0,1 (beside lane); 2
    /// CPUs, 6 would keep every role apart`.
    pub fn describe(&self) -> String {
        let apart = if self.needs_apart() > self.available {
            format!("{} would keep every role apart", self.needs_apart())
        } else {
            "every role apart".to_string()
        };
        format!("{}; {} CPUs, {apart}", netlane_report::terminal::cpu_plan(&self.view()), self.available)
    }
}

/// The plan of a scenario with one server and one load generator (or initiator), each
/// with its end's NAPI on its CPU: the generator takes the first CPU, the server the
/// next (on two CPUs, 0 and 1); on one CPU the server runs beside the generator.
pub fn server_and_generator(machine: &CpuTopology) -> CpuPlan {
    CpuPlan::new(machine, None, &[Ask::own(Role::Generator, 1), Ask::or_beside(Role::Server, 1, Role::Generator)])
}

/// The CPU `role` has in [`server_and_generator`]'s plan on this machine: the default
/// of the scenarios' CPU options.
pub fn default_cpu(role: Role) -> usize {
    server_and_generator(&CpuTopology::read()).cpus(role).first().copied().unwrap_or(0)
}

/// The report's view of roles placed on the CPUs given (a scenario's options may move
/// them off the plan): a role on a CPU an earlier one has runs beside it.
pub fn as_given(roles: &[(Role, &[usize])]) -> Vec<RoleCpus> {
    roles
        .iter()
        .enumerate()
        .map(|(i, (role, cpus))| RoleCpus {
            role: role.name().into(),
            cpus: cpus.to_vec(),
            beside: roles[..i]
                .iter()
                .find(|(_, earlier)| earlier.iter().any(|c| cpus.contains(c)))
                .map(|(r, _)| r.name().to_string()),
        })
        .collect()
}

/// The CPUs in the order roles take them: the device's node first, then the others;
/// within a node one thread of every core, then the cores' second threads.
fn preference(machine: &CpuTopology, device_node: Option<usize>) -> Vec<usize> {
    let mut cpus: Vec<(bool, usize, usize, usize)> = machine
        .cpus()
        .iter()
        .map(|c| {
            let rank = machine.cpus().iter().filter(|o| o.core == c.core && o.id < c.id).count();
            (device_node.is_some_and(|n| n != c.node), c.node, rank, c.id)
        })
        .collect();
    cpus.sort_unstable();
    cpus.into_iter().map(|(_, _, _, id)| id).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lanes(m: &CpuTopology, node: Option<usize>) -> CpuPlan {
        CpuPlan::new(
            m,
            node,
            &[
                Ask::own(Role::Lane, 2),
                Ask::or_beside(Role::Napi, 2, Role::Lane),
                Ask::or_beside(Role::Generator, 2, Role::Lane),
            ],
        )
    }

    #[test]
    fn two_cpus_put_a_lane_its_napi_thread_and_a_generator_thread_on_each() {
        let p = lanes(&CpuTopology::uniform(1, 2, 1), None);
        assert_eq!(
            (p.cpus(Role::Lane), p.cpus(Role::Napi), p.cpus(Role::Generator)),
            (&[0, 1][..], &[0, 1][..], &[0, 1][..])
        );
        assert!(!p.apart(Role::Lane, Role::Generator));
        assert_eq!((p.available(), p.needs_apart(), p.needs(&[Role::Lane, Role::Generator])), (2, 6, 4));
        assert_eq!(
            p.describe(),
            "lane 0,1; napi 0,1 (beside lane); generator 0,1 (beside lane); 2 CPUs, 6 would keep every role apart"
        );
    }

    #[test]
    fn four_cpus_keep_the_generator_apart_first() {
        let p = lanes(&CpuTopology::uniform(1, 4, 1), None);
        assert!(p.apart(Role::Lane, Role::Generator) && p.apart(Role::Napi, Role::Generator));
        assert_eq!(p.cpus(Role::Napi), p.cpus(Role::Lane));
    }

    #[test]
    fn eight_and_sixty_four_cpus_keep_lanes_napi_threads_and_generators_apart() {
        for (m, node) in [
            (CpuTopology::uniform(1, 8, 1), None),
            (CpuTopology::uniform(1, 4, 2), None),
            (CpuTopology::uniform(2, 16, 2), Some(1)),
            (CpuTopology::uniform(1, 64, 1), None),
        ] {
            let p = lanes(&m, node);
            for (a, b) in [(Role::Lane, Role::Napi), (Role::Lane, Role::Generator), (Role::Napi, Role::Generator)] {
                assert!(p.apart(a, b), "{a:?} and {b:?} share a CPU on {m:?}: {}", p.describe());
            }
            let mut all: Vec<usize> =
                [Role::Lane, Role::Napi, Role::Generator].iter().flat_map(|r| p.cpus(*r).to_vec()).collect();
            all.sort_unstable();
            all.dedup();
            assert_eq!(all.len(), 6, "{}", p.describe());
        }
    }

    #[test]
    fn roles_take_the_devices_node_and_whole_cores_first() {
        // 2 nodes x 16 cores x 2 threads: node 1's first threads are CPUs 16-31.
        let p = lanes(&CpuTopology::uniform(2, 16, 2), Some(1));
        assert_eq!(p.cpus(Role::Lane), &[16, 17]);
        assert_eq!(p.cpus(Role::Napi), &[18, 19]);
        // 1 node x 4 cores x 2 threads: six roles take the four cores' first threads,
        // then two second threads.
        let p = lanes(&CpuTopology::uniform(1, 4, 2), None);
        assert_eq!(
            (p.cpus(Role::Lane), p.cpus(Role::Napi), p.cpus(Role::Generator)),
            (&[0, 1][..], &[2, 3][..], &[4, 5][..])
        );
    }

    #[test]
    fn a_server_and_its_generator_are_apart_from_two_cpus_on() {
        let one = server_and_generator(&CpuTopology::uniform(1, 1, 1));
        assert_eq!((one.cpus(Role::Generator), one.cpus(Role::Server)), (&[0][..], &[0][..]));
        let two = server_and_generator(&CpuTopology::uniform(1, 2, 1));
        assert_eq!((two.cpus(Role::Generator), two.cpus(Role::Server)), (&[0][..], &[1][..]));
        for n in [8, 64] {
            let p = server_and_generator(&CpuTopology::uniform(1, n, 1));
            assert!(p.apart(Role::Generator, Role::Server), "{n} CPUs: {}", p.describe());
        }
        let view = as_given(&[(Role::Generator, &[0]), (Role::Server, &[0])]);
        assert_eq!(view[1].beside.as_deref(), Some("generator"));
        assert_eq!(as_given(&[(Role::Generator, &[0]), (Role::Server, &[1])])[1].beside, None);
    }

    #[test]
    fn one_cpu_runs_everything() {
        let p = lanes(&CpuTopology::uniform(1, 1, 1), None);
        assert_eq!((p.cpus(Role::Lane), p.cpus(Role::Generator)), (&[0, 0][..], &[0, 0][..]));
    }
}

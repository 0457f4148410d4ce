//! The machine's CPUs as a placement needs them: which ones this process may use, which
//! share a physical core (SMT siblings), and which NUMA node each sits on.
//!
//! [`CpuTopology::read`] takes them from sysfs and the process's affinity mask;
//! [`CpuTopology::uniform`] describes a machine that is not this one (plans are
//! computed, and tested, from a description).

use std::path::Path;

use super::CpuList;

/// One CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cpu {
    /// Its number.
    pub id: usize,
    /// Its physical core: the lowest-numbered of its SMT siblings (unique on the
    /// machine, across packages).
    pub core: usize,
    /// Its NUMA node.
    pub node: usize,
}

/// The CPUs a plan may use, in number order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuTopology {
    cpus: Vec<Cpu>,
}

impl CpuTopology {
    /// These CPUs (sorted by number, duplicates dropped).
    pub fn new(mut cpus: Vec<Cpu>) -> CpuTopology {
        cpus.sort_by_key(|c| c.id);
        cpus.dedup_by_key(|c| c.id);
        CpuTopology { cpus }
    }

    /// A described machine: `nodes` NUMA nodes of `cores` cores each, `threads` SMT
    /// threads per core, numbered as Linux numbers x86 CPUs (the first thread of every
    /// core, node by node, then the second threads in the same order).
    pub fn uniform(nodes: usize, cores: usize, threads: usize) -> CpuTopology {
        let all_cores = nodes * cores;
        let cpus = (0..all_cores * threads)
            .map(|id| {
                let core = id % all_cores.max(1);
                Cpu { id, core, node: core / cores.max(1) }
            })
            .collect();
        CpuTopology::new(cpus)
    }

    /// This machine's online CPUs that the calling thread may run on.
    pub fn read() -> CpuTopology {
        let allowed = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).ok();
        let cpus = CpuList::online()
            .as_slice()
            .iter()
            .filter(|&&id| allowed.as_ref().is_none_or(|set| set.is_set(id).unwrap_or(false)))
            .map(|&id| read_cpu(Path::new("/sys/devices/system/cpu"), id))
            .collect();
        CpuTopology::new(cpus)
    }

    /// The CPUs, in number order.
    pub fn cpus(&self) -> &[Cpu] {
        &self.cpus
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.cpus.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.cpus.is_empty()
    }
}

/// One CPU's core and node from sysfs (`topology/thread_siblings_list`, the `nodeN`
/// link); a CPU whose files are missing is its own core on node 0.
fn read_cpu(sys: &Path, id: usize) -> Cpu {
    let dir = sys.join(format!("cpu{id}"));
    let core = std::fs::read_to_string(dir.join("topology/thread_siblings_list"))
        .ok()
        .and_then(|t| t.trim().parse::<CpuList>().ok())
        .and_then(|l| l.as_slice().first().copied())
        .unwrap_or(id);
    let node = std::fs::read_dir(&dir)
        .ok()
        .and_then(|d| {
            d.flatten().find_map(|e| e.file_name().to_str().and_then(|n| n.strip_prefix("node")?.parse().ok()))
        })
        .unwrap_or(0);
    Cpu { id, core, node }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_described_machine_numbers_its_threads_as_linux_does() {
        let m = CpuTopology::uniform(2, 4, 2);
        assert_eq!(m.len(), 16);
        // CPU 9 is the second thread of core 1 (node 0); CPU 4 the first of core 4 (node 1).
        assert_eq!(m.cpus()[9], Cpu { id: 9, core: 1, node: 0 });
        assert_eq!(m.cpus()[4], Cpu { id: 4, core: 4, node: 1 });
        assert_eq!(CpuTopology::uniform(1, 2, 1).cpus().iter().map(|c| c.core).collect::<Vec<_>>(), vec![0, 1]);
    }

    #[test]
    fn this_machine_has_the_cpus_it_may_use() {
        let m = CpuTopology::read();
        assert!(!m.is_empty() && m.len() <= super::super::online_count(), "{m:?}");
        assert!(m.cpus().iter().all(|c| c.core <= c.id), "{m:?}");
    }
}

//! The nvme scenario's plan: the modes of each part, the rounds each part runs, and the
//! CPU each side gets.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Result;
use netlane::cpus::CpuList;
use netlane_nvme::host::ConnectOptions;
use netlane_nvme::perf::{Caravan, CpuBinding, JobGroup, PerfOptions};
use netlane_nvme::target::DEFAULT_NQN;

use super::options::{NvmeBenchArgs, Part, size_name};

/// The caravan sweep's job counts (32 commands in flight in all); its request sizes are
/// an option.
pub(super) const SWEEP_JOBS: [u32; 2] = [1, 4];
/// The namespace the sweep uses (512-byte blocks, so 512-byte requests are possible).
const SWEEP_NSID: u32 = 2;
/// Fewest rounds of the mixed part when more than one is asked for.
const MIXED_MIN_ROUNDS: u32 = 5;

pub(super) fn sweep_label(mode: &str, bs: u32, jobs: u32) -> String {
    format!("{mode} {} x{jobs}", size_name(bs))
}

/// One mode of a part.
#[derive(Debug, Clone)]
pub(super) struct Mode {
    pub(super) part: Part,
    pub(super) label: String,
    pub(super) opts: PerfOptions,
}

impl Mode {
    /// The part and the mode, as runs are labelled and recorded (`qd1 direct send`).
    pub(super) fn what(&self) -> String {
        format!("{} {}", self.part.name(), self.label)
    }
}

/// What of the target perf counts as its CPU: its process, and the threads doing its
/// receive work (the target end's NAPI threads), when they are on perf's machine.
#[derive(Debug, Clone, Default)]
pub(super) struct TargetCpu {
    pub(super) pid: Option<u32>,
    pub(super) threads: Vec<u32>,
}

/// The QD32 part's batched mode whose worker is woken for every command.
pub(super) const WOKEN_EACH: &str = "batched, woken per command";

/// The QD32 part's modes.
pub(super) const QD32_MODES: [&str; 4] = ["send per command", "batched", WOKEN_EACH, "caravans"];

impl NvmeBenchArgs {
    pub(super) fn target_cpu(&self) -> usize {
        self.target_cpu
    }

    pub(super) fn labels(&self) -> Vec<(Part, String)> {
        let mut v: Vec<(Part, String)> = Vec::new();
        for p in &self.parts {
            let words: Vec<String> = match p {
                Part::Qd1 => ["I/O worker", "direct send", "poll queue"].map(String::from).to_vec(),
                Part::Qd32 => QD32_MODES.map(String::from).to_vec(),
                Part::Mixed => ["shared map", "separate maps", "readers alone"].map(String::from).to_vec(),
                Part::Affinity => {
                    ["QD1 aligned", "QD1 crossed", "QD32 aligned", "QD32 crossed"].map(String::from).to_vec()
                }
                Part::Caravans => self
                    .caravan_sizes
                    .iter()
                    .flat_map(|&bs| SWEEP_JOBS.iter().map(move |&j| (bs, j)))
                    .flat_map(|(bs, j)| ["batched", "caravans"].map(|m| sweep_label(m, bs, j)))
                    .collect(),
                Part::Polling if !self.polling_here() => Vec::new(),
                Part::Polling => super::polling::POLLING_MODES.map(String::from).to_vec(),
                Part::Lanes if !self.lanes_here() => Vec::new(),
                Part::Lanes => super::lanes::LANE_MODES.map(|m| m.label().to_string()).to_vec(),
            };
            v.extend(words.into_iter().map(|w| (*p, w)));
        }
        v
    }

    /// Rounds a part runs.
    pub(super) fn rounds(&self, part: Part) -> u32 {
        if part == Part::Mixed && self.repeat > 1 { self.repeat.max(MIXED_MIN_ROUNDS) } else { self.repeat }
    }

    /// What every mode shares: one queue on the host CPU, batching on, the target's
    /// process named so that its CPU time is read.
    pub(super) fn base(&self, addr: SocketAddr, target: &TargetCpu, groups: Vec<JobGroup>) -> PerfOptions {
        PerfOptions {
            connect: {
                let mut c = ConnectOptions::new(addr, DEFAULT_NQN);
                c.kato_ms = 10_000;
                c
            },
            nsid: 1,
            groups,
            duration: self.time,
            ramp: self.ramp,
            queues: 1,
            read_queues: 0,
            poll_queues: 0,
            queue_cpus: CpuList::one(self.host_cpu),
            queue_depth: 128,
            direct_send: false,
            batch: true,
            wake_each: false,
            caravan: None,
            verify: netlane_nvme::perf::VerifyMode::Off,
            size: None,
            target_pid: target.pid,
            target_threads: target.threads.clone(),
            busy_poll: None,
            napi: Default::default(),
            coalesce: Default::default(),
        }
    }

    /// Every part's modes against the target at `addr`: its CPU read by perf where
    /// `target` names it on perf's machine; the affinity part's crossed I/O worker on
    /// `crossed`.
    pub(super) fn modes(&self, addr: SocketAddr, target: &TargetCpu, crossed: usize) -> Result<Vec<Mode>> {
        let host = self.host_cpu;
        let base = |groups: Vec<JobGroup>| self.base(addr, target, groups);
        let g = |spec: &str| JobGroup::parse(spec).map_err(anyhow::Error::msg);
        let mut modes = Vec::new();
        for part in &self.parts {
            let m = |label: &str, opts| Mode { part: *part, label: label.to_string(), opts };
            match part {
                Part::Qd1 => {
                    let reader = g(&format!("name=qd1,rw=randread,bs=4k,qd=1,jobs=1,cpus={host}"))?;
                    let hipri = JobGroup { hipri: true, ..reader.clone() };
                    modes.push(m("I/O worker", base(vec![reader.clone()])));
                    modes.push(m("direct send", PerfOptions { direct_send: true, ..base(vec![reader]) }));
                    modes.push(m("poll queue", PerfOptions { poll_queues: 1, ..base(vec![hipri]) }));
                }
                Part::Qd32 => {
                    let reader = g(&format!("name=qd32,rw=randread,bs=4k,qd=32,jobs=1,cpus={host}"))?;
                    modes.push(m("send per command", PerfOptions { batch: false, ..base(vec![reader.clone()]) }));
                    modes.push(m("batched", base(vec![reader.clone()])));
                    modes.push(m(WOKEN_EACH, PerfOptions { wake_each: true, ..base(vec![reader.clone()]) }));
                    modes.push(m("caravans", PerfOptions { caravan: Some(Caravan::default()), ..base(vec![reader]) }));
                }
                Part::Mixed => {
                    let readers = g(&format!("name=readers,rw=randread,bs=4k,qd=1,jobs=16,cpus={host}"))?;
                    let writer =
                        JobGroup { cpus: CpuBinding::Unbound, ..g("name=writer,rw=write,bs=1M,qd=32,jobs=1")? };
                    // Direct send is on in both (as in current Linux hosts); only the
                    // queue maps differ.
                    let both = vec![readers.clone(), writer];
                    modes.push(m("shared map", PerfOptions { direct_send: true, ..base(both.clone()) }));
                    modes.push(m("separate maps", PerfOptions { read_queues: 1, direct_send: true, ..base(both) }));
                    // The floor no queue map can go below: the same readers with no
                    // writer at all.
                    modes.push(m(
                        "readers alone",
                        PerfOptions { read_queues: 1, direct_send: true, ..base(vec![readers]) },
                    ));
                }
                Part::Affinity => {
                    // The blk-mq map sends the host CPU's commands to its queue either way;
                    // what changes is where that queue's I/O worker runs. Crossed, it runs
                    // on the other CPU (on this machine also the target's).
                    let other = CpuList::one(crossed);
                    let qd1 = g(&format!("name=qd1,rw=randread,bs=4k,qd=1,jobs=1,cpus={host}"))?;
                    let qd32 = g(&format!("name=qd32,rw=randread,bs=4k,qd=32,jobs=1,cpus={host}"))?;
                    modes.push(m("QD1 aligned", base(vec![qd1.clone()])));
                    modes.push(m("QD1 crossed", PerfOptions { queue_cpus: other.clone(), ..base(vec![qd1]) }));
                    modes.push(m("QD32 aligned", base(vec![qd32.clone()])));
                    modes.push(m("QD32 crossed", PerfOptions { queue_cpus: other, ..base(vec![qd32]) }));
                }
                // Run apart, on a network and targets of its own (lanes.rs).
                Part::Lanes => {}
                Part::Polling if !self.polling_here() => {}
                Part::Polling => {
                    let reader = g(&format!("name=qd1,rw=randread,bs=4k,qd=1,jobs=1,cpus={host}"))?;
                    modes.extend(self.polling_modes(&base, reader));
                }
                Part::Caravans => {
                    for &bs in &self.caravan_sizes {
                        for jobs in SWEEP_JOBS {
                            let spec = format!(
                                "name=sweep,rw=randread,bs={},qd={},jobs={jobs},cpus={host}",
                                size_name(bs),
                                32 / jobs
                            );
                            let opts = PerfOptions {
                                nsid: SWEEP_NSID,
                                duration: self.time.min(Duration::from_secs(2)),
                                ..base(vec![g(&spec)?])
                            };
                            modes.push(m(&sweep_label("batched", bs, jobs), opts.clone()));
                            modes.push(m(
                                &sweep_label("caravans", bs, jobs),
                                PerfOptions { caravan: Some(Caravan::default()), ..opts },
                            ));
                        }
                    }
                }
            }
        }
        Ok(modes)
    }
}

//! The lanes part: the target on lanes (the ADQ talk's "other applications on their own
//! queues": each connection served by the reactor that owns the receive queue its packets
//! arrive on, that queue's NAPI thread on the reactor's CPU) against the same target
//! dealing its connections to the reactors in turn. Several NVMe hosts (nvme perf
//! agents) each open their own connections, which the host end's transmit hash spreads
//! over the target end's two receive queues.
//!
//! Both modes run on a veth of their own (two queues, each queue's NAPI thread pinned to
//! one reactor's CPU), a target started for each run (the two modes differ in its
//! options) and the same load; only where the target places connections differs.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use netlane::cpus::CpuList;
use netlane::cpus::machine::CpuTopology;
use netlane::topology::{LinkConfig, RxTuning, TwoHosts, pin_napi_by_queue};
use netlane_nvme::perf::{JobGroup, PerfOptions, PerfReport};
use netlane_nvme::target::TargetLanes;
use netlane_report::{Check, Column, Row, Table, Value};
use serde::{Deserialize, Serialize};

use super::agents::collect;
use super::checks::{host_us_per_io, iops, lat, opt};
use super::options::{NvmeBenchArgs, Part};
use super::plan::TargetCpu;
use super::role::perf_agent_spec;
use crate::host::{Host, RoleProcess, RoleSpec, start_together};
use crate::plan::{Ask, CpuPlan, Role};
use crate::runner::{Measured, Runner};
use crate::scenarios::Sections;
use crate::scenarios::net::PathKind;
use crate::stats::med;
use crate::verdict::{Measure, Spec, paired, positive};

/// The target's reactors, one per receive queue of the lanes' veth.
pub(super) const REACTORS: usize = 2;
/// NVMe hosts (nvme perf agents), each with its admin and one I/O connection.
pub(super) const AGENTS: usize = 4;
/// Commands each host keeps in flight (32 in all, as the QD32 part).
const QD: u32 = 8;

/// How the target places connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LaneMode {
    /// To the reactors in turn (the target's default).
    Dealt,
    /// To the reactor owning the receive queue the connection arrived on.
    Lanes,
}

/// The part's modes, in the order they are tabled.
pub(super) const LANE_MODES: [LaneMode; 2] = [LaneMode::Dealt, LaneMode::Lanes];

impl LaneMode {
    pub(super) fn label(self) -> &'static str {
        match self {
            LaneMode::Dealt => "dealt in turn",
            LaneMode::Lanes => "by receive queue",
        }
    }
}

/// Where the part's roles run: the NVMe hosts on one CPU, the target's reactors on two
/// more (each with its receive queue's NAPI thread). On fewer than three CPUs the hosts
/// run beside a reactor.
pub(super) fn lanes_plan(machine: &CpuTopology) -> CpuPlan {
    CpuPlan::new(machine, None, &[Ask::own(Role::Generator, 1), Ask::own(Role::Lane, REACTORS)])
}

/// The part's network: a two-queue veth, each target-end queue's NAPI thread pinned to
/// its reactor's CPU.
pub(super) struct LanesNet {
    hosts: TwoHosts,
    pub(super) plan: CpuPlan,
    /// (queue, NAPI id, CPU) of each target-end receive queue.
    pinned: Vec<(u32, u32, usize)>,
    /// The target end's NAPI threads (its receive work, counted with the target).
    napi_threads: Vec<u32>,
}

/// One run of a mode: the hosts' merged report (the target's CPU per I/O, its NAPI
/// threads included, set from the first host's reading) and where the target placed
/// its connections.
#[derive(Debug, Clone, Serialize)]
pub(super) struct LanesRun {
    pub(super) perf: PerfReport,
    /// Connections the target accepted.
    pub(super) connections: u64,
    /// With lanes: where the target placed them (each reactor's NAPI ids and
    /// connections; dealt in turn, the target does not count them by reactor).
    pub(super) lanes: Option<TargetLanes>,
    /// With lanes: a reactor owning a queue whose NAPI thread runs on another CPU.
    pub(super) misaligned: Option<String>,
}

impl Measured for LanesRun {
    fn summary(&self) -> String {
        match &self.lanes {
            Some(l) => format!(
                "{}; {} of {} connections on their queue's reactor ({} per reactor)",
                self.perf.summary(),
                l.by_owner,
                self.connections,
                split(l)
            ),
            None => format!("{}; {} connections dealt in turn", self.perf.summary(), self.connections),
        }
    }

    fn figures(&self) -> Vec<(&'static str, Option<f64>)> {
        let mut f = self.perf.figures();
        f.push(("connections_on_owner", on_owner(self).ok()));
        f
    }
}

/// The share of a lanes run's connections the target placed on the reactor owning their
/// receive queue (whose NAPI thread runs on that reactor's CPU); degenerate when the run
/// did nothing, or placed by ownership a queue handled on another CPU.
pub(super) fn on_owner(r: &LanesRun) -> Measure {
    let l = r.lanes.as_ref().ok_or("the target did not report its lanes")?;
    if let Some(why) = &r.misaligned {
        return Err(why.clone());
    }
    positive(r.perf.ops as f64, "commands")?;
    let placed = l.by_owner + l.new_ids + l.no_napi;
    // Every host's admin and I/O connection must have been placed.
    if placed < 2 * AGENTS as u64 {
        return Err(format!("the target placed {placed} connections, the hosts opened at least {}", 2 * AGENTS));
    }
    Ok(l.by_owner as f64 / placed as f64)
}

/// A lanes run where a connection was not on its queue's reactor compares placement
/// with something else than lanes: why, if so.
fn not_as_lanes(r: &LanesRun) -> Result<(), String> {
    match r.lanes {
        None => Ok(()),
        Some(_) => match on_owner(r)? {
            v if v >= 1.0 => Ok(()),
            v => Err(format!("only {:.0}% of the connections were on their queue's reactor", v * 100.0)),
        },
    }
}

/// The target's CPU per I/O, its receive queues' NAPI threads included.
fn target_us_per_io(r: &LanesRun) -> Measure {
    not_as_lanes(r)?;
    positive(opt(r.perf.target_cpu_us_per_io, "target CPU per I/O")?, "target CPU per I/O")
}

fn p99(r: &LanesRun) -> Measure {
    not_as_lanes(r)?;
    lat(&r.perf, |s| s.p99, "p99")
}

impl NvmeBenchArgs {
    /// Whether the part can run: it builds its own veth (loopback has no receive queues
    /// to own; a testbed's NIC queues are not the lab's to pin), and the target needs a
    /// CPU for each of its two reactors.
    pub(super) fn lanes_here(&self) -> bool {
        self.lanes_left_out().is_none()
    }

    /// Why the part cannot run here, if so.
    fn lanes_left_out(&self) -> Option<String> {
        if self.path != PathKind::Veth || self.on.testbed.is_some() {
            return Some(
                "it runs on the lab's own veth only: loopback has no receive queues to own, and a testbed's NIC \
                 queues and their interrupts are not the lab's to place"
                    .into(),
            );
        }
        let cpus = reactor_cpus(&lanes_plan(&CpuTopology::read())).len();
        (cpus < REACTORS)
            .then(|| format!("the target's {REACTORS} reactors need a CPU each; this machine gives {cpus}"))
    }

    /// The part on a veth of its own, its rounds recorded by `runner`.
    pub(super) fn lanes_part(&self, runner: &mut Runner<'_>) -> Result<LanesDone> {
        let net = self.lanes_net()?;
        let runs = self.lanes_rounds(runner, &net)?;
        Ok(net.done(runs))
    }

    /// The part's veth and CPU plan.
    fn lanes_net(&self) -> Result<LanesNet> {
        let plan = lanes_plan(&CpuTopology::read());
        let host = plan.cpus(Role::Generator)[0];
        let cfg = LinkConfig { mtu: self.mtu, queues: REACTORS as u32, rx: RxTuning::threaded_napi() };
        let hosts = TwoHosts::create("nvme-lanes", cfg).context("the lanes part's veth")?;
        // A veth hands what its sender may segment (TSO) to the peer's backlog, past its
        // NAPI instances, and the sender's CPU does the peer's receive work: the target
        // would see no NAPI id on the hosts' connections, and each side's CPU would count
        // the other's work. Without TSO each end's receive work runs in its NAPI threads,
        // as between two machines with NICs.
        hosts.set_tx_tso(false).context("turning TSO off at the hosts' end")?;
        hosts.set_rx_tso(false).context("turning TSO off at the target's end")?;
        RxTuning::threaded_napi_on(host)
            .apply(&hosts.tx, &hosts.tx_if, hosts.tx_index)
            .context("the hosts' end's NAPI threads")?;
        let pinned = pin_napi_by_queue(&hosts.rx, hosts.rx_index, &reactor_cpus(&plan))
            .context("the target end's NAPI threads, one on each reactor's CPU")?;
        let ifindex = hosts.rx_index;
        let napi_threads = hosts
            .rx
            .run(move || -> Result<Vec<u32>> {
                let napis = netlane::topology::netdev::Netdev::open()?.napis(ifindex)?;
                Ok(napis.into_iter().filter_map(|n| n.pid).collect())
            })
            .map_err(anyhow::Error::from)
            .and_then(|r| r)
            .context("the target end's NAPI threads")?;
        Ok(LanesNet { hosts, plan, pinned, napi_threads })
    }

    /// Every mode's rounds on `net`, recorded by `runner`.
    fn lanes_rounds(&self, runner: &mut Runner<'_>, net: &LanesNet) -> Result<Vec<Vec<LanesRun>>> {
        runner.rounds(
            LANE_MODES.len(),
            |_| self.repeat,
            |runner, i, turn| {
                let mode = LANE_MODES[i];
                runner.measure(turn, &format!("{} {}", Part::Lanes.name(), mode.label()), |label| {
                    self.lanes_run(net, mode, label)
                })
            },
        )
    }

    /// One run: the target started for `mode`, the hosts' load, the target stopped and
    /// its placement read.
    fn lanes_run(&self, net: &LanesNet, mode: LaneMode, label: &str) -> Result<LanesRun> {
        let reactors = reactor_cpus(&net.plan);
        let listen = SocketAddr::new(net.hosts.rx_addr(false), netlane_nvme::DEFAULT_PORT);
        let mut more = vec!["--json".to_string(), "-".into()];
        if mode == LaneMode::Lanes {
            more.extend(["--lane-device".to_string(), net.hosts.rx_if.clone()]);
        }
        let spec = self.target_spec(listen, &reactors, &more).ready_on_stderr("listening on ", Duration::from_secs(10));
        let target = RoleProcess::start(&net.hosts.rx, &spec, None).with_context(|| format!("run {label}"))?;
        let addr = target.listening_on()?;
        let cpu = TargetCpu { pid: Some(target.pid().context("the target's process ID")?), threads: Vec::new() };
        let opts = self.lanes_opts(addr, &cpu, net.plan.cpus(Role::Generator)[0])?;
        // The first host reads the target's CPU (its process and its NAPI threads) over
        // the window, which the hosts share: they start on one word.
        let first = PerfOptions { target_threads: net.napi_threads.clone(), ..opts.clone() };
        let specs: Vec<(&dyn Host, RoleSpec)> = (0..AGENTS)
            .map(|i| {
                let o = if i == 0 { &first } else { &opts };
                (&net.hosts.tx as &dyn Host, perf_agent_spec(&format!("nvme perf host {}", i + 1), o))
            })
            .collect();
        let limit = opts.ramp + opts.duration + Duration::from_secs(60);
        let (parts, _) = start_together(&specs)
            .and_then(|roles| collect(roles, &vec![Host::name(&net.hosts.tx); AGENTS], limit))
            .with_context(|| format!("run {label}"))?;
        let mut perf = netlane_nvme::perf::merge(&opts, &parts).with_context(|| format!("run {label}"))?;
        let errors: u64 = perf.groups.iter().map(|g| g.errors + g.mismatches).sum();
        if errors > 0 {
            bail!("run {label}: {errors} commands failed");
        }
        // What one host read of a machine-wide figure (the target's process and NAPI
        // threads; the hosts' end's NAPI threads, which every host shares and reads)
        // covers all the hosts' commands over the shared window: as a figure per I/O, of
        // them all.
        let (r0, _) = &parts[0];
        let of_all = |v: Option<f64>| v.filter(|_| perf.ops > 0).map(|v| v * r0.ops as f64 / perf.ops as f64);
        perf.target_cpu_us_per_io = of_all(r0.target_cpu_us_per_io);
        perf.target_threads = r0.target_threads.clone();
        perf.host_napi_cpu_us_per_io = of_all(r0.host_napi_cpu_us_per_io);
        perf.host_napi_runs_per_io = of_all(r0.host_napi_runs_per_io);
        perf.host_napi_threads = r0.host_napi_threads.clone();
        let done = target.stop(Duration::from_secs(5)).with_context(|| format!("run {label}: stop the target"))?;
        #[derive(Deserialize)]
        struct Stats {
            connections: u64,
            lanes: Option<TargetLanes>,
        }
        #[derive(Deserialize)]
        struct NvmeTarget {
            stats: Stats,
        }
        let stats = done.json::<NvmeTarget>().context("read the target's final counters")?.stats;
        let lanes = stats.lanes;
        let misaligned = lanes.as_ref().and_then(|l| misaligned(l, &net.pinned));
        Ok(LanesRun { perf, connections: stats.connections, lanes, misaligned })
    }

    /// The options every host runs with: one I/O queue on `host_cpu`, QD [`QD`] 4 KiB
    /// random reads, direct send (as current Linux hosts).
    fn lanes_opts(&self, addr: SocketAddr, target: &TargetCpu, host_cpu: usize) -> Result<PerfOptions> {
        let g = JobGroup::parse(&format!("name=lanes,rw=randread,bs=4k,qd={QD},jobs=1,cpus={host_cpu}"))
            .map_err(anyhow::Error::msg)?;
        let base = self.base(addr, target, vec![g]);
        Ok(PerfOptions { direct_send: true, queue_cpus: CpuList::one(host_cpu), ..base })
    }

    /// The part's table, its notes and its checks, from what became of it: `None` when
    /// it did not run, else its runs or why it failed (the other parts' results stand).
    pub(super) fn lanes_section(&self, lanes: Option<&LanesOutcome>, out: &mut Sections) {
        if !self.parts.contains(&Part::Lanes) {
            return;
        }
        let done = match lanes {
            Some(Ok(done)) => done,
            Some(Err(why)) => {
                out.notes.push(format!("The lanes part failed: {why}."));
                out.checks.extend(lanes_specs().map(|s| s.invalid(format!("the lanes part failed: {why}"))));
                return;
            }
            None => {
                let why = self.lanes_left_out().unwrap_or_else(|| "it did not run".into());
                out.notes.push(format!("Left out: the lanes part ({why})."));
                out.checks.extend(lanes_specs().map(|s| s.skipped(format!("the lanes part was left out: {why}"))));
                return;
            }
        };
        let mut t = Table::new(
            "nvme-lanes",
            format!(
                "{AGENTS} NVMe hosts, each QD{QD} 4 KiB random read on its own connection, against a target with \
                 {REACTORS} reactors; medians of {} rounds",
                self.repeat
            ),
            vec![
                Column::new("mode", "placement", 0),
                Column::new("iops", "IOPS", 0),
                Column::new("p50_us", "p50 us", 1),
                Column::new("p99_us", "p99 us", 1),
                Column::new("target_cpu_us_per_io", "target CPU us/IO (+NAPI)", 2),
                Column::new("host_cpu_us_per_io", "host CPU us/IO (+NAPI)", 2),
                Column::new("on_owner_pct", "connections on their queue's reactor %", 0),
            ],
        );
        for m in LANE_MODES {
            let Some(rs) = done.find(m) else { continue };
            t.push(Row::new(vec![
                Value::text(m.label()),
                med(rs, |r| iops(&r.perf)),
                med(rs, |r| lat(&r.perf, |s| s.p50, "p50").map(|v| v / 1e3)),
                med(rs, |r| p99(r).map(|v| v / 1e3)),
                med(rs, target_us_per_io),
                med(rs, |r| host_us_per_io(&r.perf)),
                med(rs, |r| on_owner(r).map(|v| v * 100.0)),
            ]));
        }
        out.tables.push(t);
        let splits: Vec<String> =
            done.find(LaneMode::Lanes).unwrap_or_default().iter().filter_map(|r| r.lanes.as_ref().map(split)).collect();
        let pinned: Vec<String> =
            done.pinned.iter().map(|(q, id, cpu)| format!("queue {q} (NAPI {id}) on CPU {cpu}")).collect();
        out.notes.push(format!(
            "Lanes part: the target's reactors on CPUs {}, its receive queues' NAPI threads pinned one to each \
             ({}); the hosts on CPU {}, their end's NAPI threads beside them. A target is started for each \
             run; the hosts' transmit hash spreads their connections over the two queues, so a round may load \
             one reactor more than the other: with lanes, connections per reactor (admin and I/O alike), round \
             by round, {}. Dealt in turn, the target deals each host's admin connection and then its I/O \
             connection, so the I/O connections too may land more on one reactor than the other (the target \
             does not count them by reactor). Both ends send without TSO (a veth hands TSO segments to the \
             peer's backlog, past its NAPI instances: no connection would carry a NAPI id, and each side's CPU \
             would do the other's receive work). The plan: {}.",
            list(&reactor_cpus(&done.plan)),
            pinned.join(", "),
            list(done.plan.cpus(Role::Generator)),
            splits.join(", "),
            done.plan.describe()
        ));
        out.checks.extend(self.lanes_checks(done));
    }

    fn lanes_checks(&self, done: &LanesDone) -> Vec<Check> {
        let [placed, cpu, tail] = lanes_specs();
        let mut checks = vec![match done.find(LaneMode::Lanes) {
            Some(rs) => {
                placed.evaluate(rs.iter().map(on_owner).collect(), "connections on their queue's reactor, per round")
            }
            None => placed.skipped("the lanes mode did not run"),
        }];
        let plan = &done.plan;
        for (spec, of, what) in [
            (cpu, target_us_per_io as fn(&LanesRun) -> Measure, "lanes / dealt in turn target CPU per I/O, per round"),
            (tail, p99, "lanes / dealt in turn p99, per round"),
        ] {
            checks.push(match (done.find(LaneMode::Lanes), done.find(LaneMode::Dealt)) {
                _ if !plan.apart(Role::Lane, Role::Generator) => spec.not_shown(
                    plan.needs(&[Role::Lane, Role::Generator]),
                    plan.available(),
                    "the target's two reactors, each with its queue's NAPI thread, and the NVMe hosts apart",
                    &plan.describe(),
                ),
                (Some(a), Some(b)) => spec.evaluate(paired(a, b, of), what),
                _ => spec.skipped("needs the lanes and dealt-in-turn modes"),
            });
        }
        checks
    }
}

/// What became of the part when it was tried: its runs, or why it failed.
pub(super) type LanesOutcome = Result<LanesDone, String>;

/// What the part ran: each mode's rounds, and where.
pub(super) struct LanesDone {
    pub(super) runs: Vec<Vec<LanesRun>>,
    pub(super) plan: CpuPlan,
    pub(super) pinned: Vec<(u32, u32, usize)>,
}

impl LanesDone {
    /// The rounds of mode `m`, when it ran.
    pub(super) fn find(&self, m: LaneMode) -> Option<&[LanesRun]> {
        LANE_MODES.iter().position(|x| *x == m).and_then(|i| self.runs.get(i)).map(|v| &v[..])
    }
}

impl LanesNet {
    /// What ran on it.
    pub(super) fn done(self, runs: Vec<Vec<LanesRun>>) -> LanesDone {
        LanesDone { runs, plan: self.plan, pinned: self.pinned }
    }
}

/// The part's checks.
fn lanes_specs() -> [Spec; 3] {
    [
        Spec::at_least(
            "nvme.lanes-placed",
            "Lanes: the target serves every connection on the reactor owning its receive queue, whose NAPI thread \
             runs on that reactor's CPU",
            1.0,
            "of connections",
        ),
        Spec::below(
            "nvme.lanes-target-cpu",
            "Lanes: connections on the reactor owning their queue cost the target less CPU per I/O (its NAPI \
             threads included) than connections dealt in turn (talk: the NAPI-id alignment, 10-15%)",
            1.0,
            "x",
        ),
        Spec::below(
            "nvme.lanes-p99",
            "Lanes: connections on the reactor owning their queue lower p99 latency against connections dealt in \
             turn (talk: the tail is where it shows)",
            1.0,
            "x",
        ),
    ]
}

/// The reactors' CPUs in the order the target numbers its reactors (its CPU list is
/// sorted), which is the order the receive queues' NAPI threads are pinned in: queue i
/// on reactor i's CPU, as the target deals queue i to reactor i.
fn reactor_cpus(plan: &CpuPlan) -> Vec<usize> {
    CpuList::new(plan.cpus(Role::Lane).to_vec()).as_slice().to_vec()
}

/// A reactor owning a NAPI id whose thread was pinned to another CPU, said.
fn misaligned(l: &TargetLanes, pinned: &[(u32, u32, usize)]) -> Option<String> {
    l.reactors.iter().find_map(|r| {
        r.napi_ids.iter().find_map(|id| {
            let (q, _, cpu) = pinned.iter().find(|(_, n, _)| n == id)?;
            (*cpu != r.cpu).then(|| {
                format!("the reactor on CPU {} owns queue {q} (NAPI {id}), whose NAPI thread runs on CPU {cpu}", r.cpu)
            })
        })
    })
}

/// Each reactor's connections, `2+6`.
fn split(l: &TargetLanes) -> String {
    l.reactors.iter().map(|r| r.connections.to_string()).collect::<Vec<_>>().join("+")
}

fn list(cpus: &[usize]) -> String {
    cpus.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
}

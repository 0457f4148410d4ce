//! The scenarios: each one's options, plan, runs, target checks and report, in a folder
//! per scenario (`udp_pacing.rs` and `selftest.rs` are single files). `netlane bench
//! <name>` runs one with the options given;
//! `netlane lab` runs them all with the plans in [`lab_plan`].
//!
//! How every scenario measures:
//! - it runs its modes in rounds, each round every mode once, in an order that rotates
//!   from round to round ([`crate::stats::round_order`]);
//! - a ratio between two modes is formed per round, from two runs taken minutes apart at
//!   most, and a target check uses all of them ([`crate::verdict`]): met, within noise,
//!   missed, or invalid when an input was degenerate;
//! - tables show medians of the rounds with their spread; impossible, collapsed and
//!   noisy repeats are flagged, not averaged away.
//!
//! A new scenario is a module here with an options struct (clap `Args`), a type
//! implementing [`Scenario`], an entry in [`ScenarioName`] and a plan in [`lab_plan`].

pub(crate) mod cache;
pub mod kv;
pub mod lanes;
pub mod lb_pps;
pub mod net;
pub mod nvme;
pub mod rr;
pub mod selftest;
pub mod soak;
pub mod udp_bulk;
pub mod udp_pacing;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::ValueEnum;

use netlane_kv::load::search::GENERATOR_LAG_MAX;

use crate::machine::Monitor;
use crate::progress::{Progress, Reporter};
use netlane_report::{Results, ScenarioReport, Tally};

pub use net::{NetArgs, PathKind, Placement, RxNapi};

/// A scenario, configured and ready to run.
pub trait Scenario {
    /// Its short name (`udp-bulk`).
    fn name(&self) -> &'static str;
    /// Its resolved options (echoed as `key=value`, and as a typed object).
    fn options(&self) -> netlane_report::options::OptionList;
    /// Checks the options against this machine before anything is built.
    fn validate(&self) -> Result<()>;
    /// How many runs it will make (for progress and time estimates).
    fn runs(&self) -> usize;
    /// Builds its network, runs, and reports. Cleans up what it built, even on error.
    fn run(&self, progress: &dyn Progress) -> Result<ScenarioReport>;
}

/// The scenarios the lab knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ScenarioName {
    /// UDP bulk transfer in every mode (GSO, GRO, zerocopy, pacing) vs TCP and the kernel's sender.
    UdpBulk,
    /// Pacing quantum sweep at a bottleneck: loss vs sender CPU.
    UdpPacing,
    /// NVMe/TCP host and target: QD1 latency, QD32 IOPS per core, mixed-workload queue maps.
    Nvme,
    /// XDP load balancer: Mpps per core, hints off/on, 1 to 1M flows, vs an XDP_TX ceiling.
    LbPps,
    /// Datagram request/response: receive paths, TPACKET_V3 blocks, the wall, 8 KiB responses.
    Rr,
    /// Memcached-protocol cache: throughput within a tail-latency SLA, against memcached.
    Kv,
    /// Lanes: connections on the thread owning their receive queue, busy polling, vs plain workers and memcached -N.
    Lanes,
    /// Soak: each server under valid load beside hostile clients; memory, descriptors, tail latency, data after kill -9.
    Soak,
}

impl ScenarioName {
    /// Whether it runs on a testbed's machines (the others build their network on this
    /// one, for now).
    pub fn across_hosts(self) -> bool {
        matches!(
            self,
            ScenarioName::Kv
                | ScenarioName::Rr
                | ScenarioName::Nvme
                | ScenarioName::UdpBulk
                | ScenarioName::UdpPacing
                | ScenarioName::Lanes
                | ScenarioName::Soak
        )
    }

    /// Every scenario, in the lab's order.
    pub const ALL: [ScenarioName; 8] = [
        ScenarioName::UdpBulk,
        ScenarioName::UdpPacing,
        ScenarioName::Nvme,
        ScenarioName::LbPps,
        ScenarioName::Rr,
        ScenarioName::Kv,
        ScenarioName::Lanes,
        ScenarioName::Soak,
    ];
}

/// What the lab runs: the full plan or a short one.
#[derive(Debug, Clone, Default)]
pub struct LabProfile {
    /// Short runs (a smoke test).
    pub quick: bool,
    /// IPv6 where a scenario offers it.
    pub ipv6: bool,
    /// The kernel's `udpgso_bench_tx`.
    pub selftest: Option<PathBuf>,
    /// The testbed file of a lab across machines.
    pub testbed: Option<PathBuf>,
    /// Copy this netlane to testbed hosts that lack it.
    pub deploy: bool,
    /// The testbed once reached, shared by every scenario.
    pub reached: crate::testbed::Reached,
    /// Options changed from the plan: a scenario and `option=value`.
    pub set: Vec<(ScenarioName, String)>,
}

impl LabProfile {
    /// `o` with the options set for `name` changed: the options the plan gave other than
    /// their defaults, each set one replaced, parsed again as `netlane bench` parses them
    /// (so a value is checked as there, and what follows from it, such as the segments
    /// per send from the GSO size, follows again). Called before the testbed's fields,
    /// which the echo does not carry whole.
    fn tuned<T: clap::Args + Scenario>(&self, name: ScenarioName, o: T) -> Result<T> {
        let set: Vec<&str> = self.set.iter().filter(|(n, _)| *n == name).map(|(_, w)| w.as_str()).collect();
        if set.is_empty() {
            return Ok(o);
        }
        let key = |w: &str| w.split_once('=').map_or(w, |(k, _)| k).to_string();
        let keys: Vec<String> = set.iter().map(|w| key(w)).collect();
        let defaults = from_words::<T>(&[]).map(|d| d.options().echo()).unwrap_or_default();
        let words: Vec<String> = o
            .options()
            .echo()
            .into_iter()
            .filter(|w| !defaults.contains(w) && !keys.contains(&key(w)))
            .chain(set.iter().map(|w| w.to_string()))
            .map(|w| format!("--{w}"))
            .collect();
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        from_words(&words).map_err(|e| {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or_default().trim_start_matches("error: ").to_string();
            anyhow::anyhow!(
                "{}: {first}",
                set.iter().map(|w| format!("{}.{w}", value_name(&name))).collect::<Vec<_>>().join(" ")
            )
        })
    }

    /// A scenario's testbed options (sharing the lab's one connected testbed) and what
    /// the file says, when the lab runs on one.
    fn on_testbed(&self) -> Result<Option<(crate::testbed::TestbedArgs, crate::testbed::TestbedSpec)>> {
        self.testbed
            .as_ref()
            .map(|path| crate::testbed::TestbedArgs::for_lab(path, self.deploy, &self.reached))
            .transpose()
    }
}

/// What a scenario's report is built of, section by section: each section of a
/// scenario's `report.rs` adds its tables, charts, checks, flags and notes here.
#[derive(Debug, Default)]
pub(crate) struct Sections {
    pub(crate) tables: Vec<netlane_report::Table>,
    pub(crate) charts: Vec<netlane_report::Chart>,
    pub(crate) checks: Vec<netlane_report::Check>,
    pub(crate) flags: Vec<netlane_report::Flag>,
    pub(crate) notes: Vec<String>,
}

/// The heading of a scenario's report: what the sections are under.
pub(crate) struct Heading {
    pub(crate) title: String,
    pub(crate) description: String,
    pub(crate) headline: String,
}

impl Sections {
    /// The report of `scenario`: these sections under `heading`, with its runs and the
    /// CPUs its roles had.
    pub(crate) fn report(
        self,
        scenario: &dyn Scenario,
        heading: Heading,
        runs: Vec<netlane_report::RunRecord>,
        cpu_plan: Vec<netlane_report::RoleCpus>,
    ) -> ScenarioReport {
        let options = scenario.options();
        ScenarioReport {
            name: scenario.name().into(),
            title: heading.title,
            description: heading.description,
            headline: heading.headline,
            options: options.object(),
            echo: options.echo(),
            tables: self.tables,
            charts: self.charts,
            checks: self.checks,
            flags: self.flags,
            notes: self.notes,
            runs,
            cpu_plan,
        }
    }
}

/// How many more times a load run is made when the generator itself fell behind its
/// schedule in it.
const LAGGED_RUNS_AGAIN: u32 = 2;

/// Runs `measure` (one load run with whatever is read around it) again when the load
/// generator delayed more than [`GENERATOR_LAG_MAX`] of its own sends: such a run measured
/// the CPU the generator shares with the server, not the server. Up to
/// [`LAGGED_RUNS_AGAIN`] more times; the last run stands (and is judged invalid if it
/// lagged too). Returns the run and how many were discarded, each said on `progress`.
pub(crate) fn unless_generator_lagged<T>(
    progress: &dyn Progress,
    label: &str,
    mut measure: impl FnMut() -> Result<T>,
    load: impl Fn(&T) -> &netlane_kv::loadgen::LoadReport,
) -> Result<(T, u32)> {
    let mut discarded = 0;
    loop {
        let run = measure()?;
        // A closed loop has no schedule to keep.
        let lag = if load(&run).mode == "open" { load(&run).lag_share } else { 0.0 };
        if lag <= GENERATOR_LAG_MAX || discarded == LAGGED_RUNS_AGAIN {
            return Ok((run, discarded));
        }
        discarded += 1;
        progress.say(&format!(
            "{label}: the generator delayed {:.1}% of its sends itself; run again ({discarded} of {LAGGED_RUNS_AGAIN})",
            lag * 100.0
        ));
    }
}

/// The note for runs [`unless_generator_lagged`] made again, if any were.
pub(crate) fn discarded_note(discarded: u32) -> Option<String> {
    (discarded > 0).then(|| {
        format!(
            "{discarded} load run{} made again: the generator, on the same CPUs as the server, delayed more than \
             {:.0}% of its own sends in {} (the run measured the generator, not the server); the runs shown are the repeats.",
            if discarded == 1 { " was" } else { "s were" },
            GENERATOR_LAG_MAX * 100.0,
            if discarded == 1 { "it" } else { "each" },
        )
    })
}

/// The lab's plan for `name`.
pub fn lab_plan(name: ScenarioName, p: &LabProfile) -> Result<Box<dyn Scenario>> {
    let secs = |full: u64, quick_ms: u64| {
        if p.quick { Duration::from_millis(quick_ms) } else { Duration::from_secs(full) }
    };
    let s: Box<dyn Scenario> = match name {
        ScenarioName::UdpBulk => {
            let mut o = udp_bulk::UdpBulkArgs::defaults();
            o.net.ipv6 = p.ipv6;
            o.time = secs(2, 800);
            o.repeat = if p.quick { 2 } else { 3 };
            o.selftest = p.selftest.clone();
            if p.quick {
                // Two of the three paced rates go, and the many flows run at two counts.
                o.modes = udp_bulk::QUICK_MODES.to_vec();
                o.rates = vec![100_000_000];
                o.flows = vec![1, 1000];
            }
            let mut o = p.tuned(ScenarioName::UdpBulk, o)?;
            if let Some((on, spec)) = p.on_testbed()? {
                o.net.tx_cpu = spec.server.first_cpu().unwrap_or(o.net.tx_cpu);
                o.net.rx_cpu = spec.clients.first().and_then(|c| c.first_cpu()).or(o.net.rx_cpu);
                o.on = on;
            }
            Box::new(o)
        }
        ScenarioName::UdpPacing => {
            let mut o = udp_pacing::UdpPacingArgs::defaults();
            o.net.ipv6 = p.ipv6;
            o.time = secs(2, 1000);
            o.repeat = if p.quick { 1 } else { 3 };
            let mut o = p.tuned(ScenarioName::UdpPacing, o)?;
            if let Some((on, spec)) = p.on_testbed()? {
                o.net.tx_cpu = spec.server.first_cpu().unwrap_or(o.net.tx_cpu);
                o.net.rx_cpu = spec.clients.first().and_then(|c| c.first_cpu()).or(o.net.rx_cpu);
                o.on = on;
            }
            Box::new(o)
        }
        ScenarioName::Nvme => {
            let mut o = nvme::NvmeBenchArgs::defaults();
            o.time = secs(4, 1000);
            o.repeat = if p.quick { 1 } else { 3 };
            if p.quick {
                // The sweep's ends: the smallest request and the largest. The polling
                // part has a test of its own (netlane-nvme's busy_poll).
                o.caravan_sizes = vec![512, 128 << 10];
                o.parts.retain(|p| *p != nvme::Part::Polling);
            }
            let mut o = p.tuned(ScenarioName::Nvme, o)?;
            if let Some((on, spec)) = p.on_testbed()? {
                o.target_cpu = spec.server.first_cpu().unwrap_or(o.target_cpu);
                o.host_cpu = spec.clients.first().and_then(|c| c.first_cpu()).unwrap_or(o.host_cpu);
                o.on = on;
            }
            Box::new(o)
        }
        ScenarioName::LbPps => {
            let mut o = lb_pps::LbPpsArgs::defaults();
            if p.quick {
                // The talk's claims (tagged vs untagged, parsed vs not) stay; the RX hash
                // mode and the two-core runs go (the full lab has them).
                o.flows = vec![1, 10_000];
                o.time = Duration::from_millis(500);
                o.modes.retain(|m| m != "rx-hash");
                o.no_two_cores = true;
            }
            let o = p.tuned(ScenarioName::LbPps, o)?;
            Box::new(o)
        }
        _ => servers_plan(name, p)?,
    };
    s.validate().with_context(|| format!("scenario {}", s.name()))?;
    Ok(s)
}

/// The lab's plan for the servers' scenarios (rr, kv, lanes, soak).
fn servers_plan(name: ScenarioName, p: &LabProfile) -> Result<Box<dyn Scenario>> {
    let secs = |full: u64, quick_ms: u64| {
        if p.quick { Duration::from_millis(quick_ms) } else { Duration::from_secs(full) }
    };
    let s: Box<dyn Scenario> = match name {
        ScenarioName::Rr => {
            let mut o = rr::RrBenchArgs::defaults();
            o.time = secs(2, 500);
            o.repeat = if p.quick { 1 } else { 3 };
            if p.quick {
                o.parts = vec![rr::Part::Paths, rr::Part::Large];
            }
            let mut o = p.tuned(ScenarioName::Rr, o)?;
            if let Some((on, spec)) = p.on_testbed()? {
                o.server_cpu = spec.server.first_cpu().unwrap_or(o.server_cpu);
                o.on = on;
            }
            Box::new(o)
        }
        ScenarioName::Kv => {
            let mut o = kv::KvBenchArgs::defaults();
            o.repeat = if p.quick { 1 } else { 3 };
            if p.quick {
                o.parts = vec![kv::Part::Rates];
                o.rates = vec![10_000, 20_000];
                o.workload.keys = 20_000;
                o.time = Duration::from_millis(500);
            }
            let mut o = p.tuned(ScenarioName::Kv, o)?;
            if let Some((on, spec)) = p.on_testbed()? {
                o.server_cpu = spec.server.first_cpu().unwrap_or(o.server_cpu);
                o.on = on;
            }
            Box::new(o)
        }
        ScenarioName::Lanes => {
            let mut o = lanes::LanesBenchArgs::defaults();
            // Eight modes with a search each: two rounds take about 24 minutes.
            o.repeat = if p.quick { 1 } else { 2 };
            if p.quick {
                o.modes = vec![lanes::Mode::Plain, lanes::Mode::Napi];
                o.no_search = true;
                o.no_sweep = true;
                // Light enough that the generator, on the same two CPUs, keeps its
                // schedule while other work runs beside the lab.
                o.connections = vec![16];
                o.rates = vec![2_000];
                o.isolation_rate = 2_000;
                o.isolation_connections = 16;
                o.workload.keys = 10_000;
                o.time = Duration::from_secs(1);
            }
            let mut o = p.tuned(ScenarioName::Lanes, o)?;
            if let Some((on, _)) = p.on_testbed()? {
                // Left out on a testbed (said in its report), not a reason to refuse it.
                o.no_isolation = true;
                o.on = on;
            }
            Box::new(o)
        }
        ScenarioName::Soak => {
            let mut o = soak::SoakArgs::defaults();
            if p.quick {
                o.time = Duration::from_secs(5);
            }
            let mut o = p.tuned(ScenarioName::Soak, o)?;
            if let Some((on, _)) = p.on_testbed()? {
                // The balancer is left out there (said in its report).
                o.on = on;
            }
            Box::new(o)
        }
        other => anyhow::bail!("{} is not a server's scenario", value_name(&other)),
    };
    Ok(s)
}

/// Runs `list` one after another (first removing namespaces killed runs left), watching
/// the machine, and counts the checks. `each`
/// sees every report as soon as its scenario finishes.
pub fn run_all(
    list: &[&dyn Scenario],
    progress: &Reporter,
    mut each: impl FnMut(&ScenarioReport) -> Result<()>,
) -> Result<Results> {
    for s in list {
        s.validate().with_context(|| format!("scenario {}", s.name()))?;
    }
    // A run killed with SIGKILL could not remove its namespaces (its helper processes
    // die with it; the bind mounts in /run/netns stay): the next run does.
    match netlane::topology::registry::clean_stale() {
        Ok(c) if !c.namespaces.is_empty() => progress.println(&format!(
            "removed {} namespaces left by killed runs: {}{}",
            c.namespaces.len(),
            c.namespaces.join(" "),
            if c.processes.is_empty() {
                String::new()
            } else {
                let ended: Vec<String> = c.processes.iter().map(|(p, comm, _)| format!("{comm} ({p})")).collect();
                format!("; ended what still ran in them: {}", ended.join(", "))
            }
        )),
        Ok(_) => {}
        Err(e) => {
            progress.println(&format!("warning: could not look for stale namespaces: {}", netlane::error::chain(&e)))
        }
    }
    let monitor = Monitor::start(Duration::from_millis(500));
    for w in monitor.warnings() {
        progress.println(&format!("warning: {w}"));
    }
    progress.plan(list.iter().map(|s| s.runs()).sum());
    let mut scenarios = Vec::new();
    for s in list {
        progress.set_scope(s.name());
        let r = s.run(progress).with_context(|| format!("scenario {}", s.name()))?;
        each(&r)?;
        scenarios.push(r);
    }
    progress.clear();
    let summary = Tally::of(scenarios.iter().flat_map(|s| s.checks.iter()));
    Ok(Results { machine: monitor.finish(), summary, quick: false, scenarios })
}

/// Parses a scenario's options from command-line words, with its defaults (the same
/// defaults `netlane bench` shows in `--help`).
pub fn from_words<T: clap::Args>(words: &[&str]) -> Result<T, clap::Error> {
    #[derive(clap::Parser)]
    struct Wrap<U: clap::Args> {
        #[command(flatten)]
        inner: U,
    }
    let argv = std::iter::once("netlane").chain(words.iter().copied());
    <Wrap<T> as clap::Parser>::try_parse_from(argv).map(|w| w.inner)
}

/// The command-line name of a value (`napi-busy`): the string form of every mode and
/// part, from clap's own `ValueEnum`, never a hand copy.
pub(crate) fn value_name<T: ValueEnum>(v: &T) -> String {
    v.to_possible_value().map(|p| p.get_name().to_string()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Echoed options, each as `--key=value`, parse back to the same options.
    fn echo_reads_back<T: clap::Args + Scenario>(s: &T) {
        let echo = s.options().echo();
        let args: Vec<String> = echo.iter().map(|e| format!("--{e}")).collect();
        let words: Vec<&str> = args.iter().map(String::as_str).collect();
        let again: T = from_words(&words).unwrap_or_else(|e| panic!("{}: {echo:?} does not parse: {e}", s.name()));
        assert_eq!(again.options().echo(), echo, "{}", s.name());
    }

    /// A run is made again while the generator lagged in it, at most twice; a sound run
    /// or the last one stands, and the discarded ones are counted.
    #[test]
    fn a_run_the_generator_lagged_in_is_made_again_at_most_twice() {
        use crate::progress::Silent;
        let runs = |lags: &[f64]| {
            let mut left = lags.iter();
            let mut made = 0;
            let (r, discarded) = unless_generator_lagged(
                &Silent,
                "run",
                || {
                    made += 1;
                    Ok(cache::tests::load(2000.0, 300.0, *left.next().unwrap()))
                },
                |r| r,
            )
            .unwrap();
            (r.lag_share, discarded, made)
        };
        assert_eq!(runs(&[0.01]), (0.01, 0, 1));
        assert_eq!(runs(&[0.065, 0.02]), (0.02, 1, 2));
        assert_eq!(runs(&[0.065, 0.07, 0.08]), (0.08, 2, 3), "the third run stands, lagged or not");
        assert_eq!(discarded_note(0), None);
        assert!(discarded_note(2).unwrap().starts_with("2 load runs were made again"));
    }

    /// An option set for the lab replaces that option of its plan and leaves the others
    /// (the quick plan's) as they were; a bad one is refused with what was set.
    #[test]
    fn an_option_set_changes_that_option_of_the_plan_alone() {
        let profile = |set: &[&str]| LabProfile {
            quick: true,
            set: set.iter().map(|w| (ScenarioName::UdpBulk, w.to_string())).collect(),
            ..Default::default()
        };
        let plan = |p: &LabProfile| p.tuned(ScenarioName::UdpBulk, udp_bulk::UdpBulkArgs::defaults());
        let mut quick = udp_bulk::UdpBulkArgs::defaults();
        quick.time = Duration::from_millis(1000);
        let p = profile(&["segments=1", "modes=udp,gso"]);
        let o = p.tuned(ScenarioName::UdpBulk, quick.clone()).unwrap();
        assert_eq!((o.segments, o.time), (Some(1), Duration::from_millis(1000)));
        assert_eq!(o.modes.len(), 2);
        // What follows from a set option follows again: the segments per send from the
        // GSO size (not the plan's 46 for 1400 B), the NAPI thread from the receiver's CPU.
        let o = profile(&["gso-size=1000", "rx-cpu=0"]).tuned(ScenarioName::UdpBulk, quick).unwrap();
        assert_eq!(o.segments, None, "derived, not fixed at the plan's value");
        let echo = o.options().echo();
        assert!(!echo.contains(&"segments=46".to_string()), "{echo:?}");
        assert!(echo.contains(&"napi-cpu=0".to_string()) && echo.contains(&"time=1s".to_string()), "{echo:?}");
        // Other scenarios' options are not this one's.
        let kv = p.tuned(ScenarioName::Kv, kv::KvBenchArgs::defaults()).unwrap();
        assert_eq!(kv.options().echo(), kv::KvBenchArgs::defaults().options().echo());
        let e = plan(&profile(&["segments=lots"])).unwrap_err().to_string();
        assert!(e.starts_with("udp-bulk.segments=lots: invalid value 'lots'"), "{e}");
        let e = plan(&profile(&["no-such=1"])).unwrap_err().to_string();
        assert!(e.starts_with("udp-bulk.no-such=1: unexpected argument '--no-such'"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }

    #[test]
    fn every_scenarios_echo_reads_back() {
        let mut bulk = udp_bulk::UdpBulkArgs::defaults();
        echo_reads_back(&bulk);
        bulk.net.ipv6 = true;
        bulk.quantum = netlane::pace::Quantum::Fixed(25_760_000);
        bulk.segments = Some(20);
        echo_reads_back(&bulk);
        echo_reads_back(&udp_pacing::UdpPacingArgs::defaults());
        echo_reads_back(&nvme::NvmeBenchArgs::defaults());
        echo_reads_back(&soak::SoakArgs::defaults());
        echo_reads_back(&kv::KvBenchArgs::defaults());
        let mut pps = lb_pps::LbPpsArgs::defaults();
        echo_reads_back(&pps);
        pps.flows = vec![1, 10_000];
        pps.no_skb = true;
        pps.no_two_cores = true;
        echo_reads_back(&pps);
        let mut lanes = lanes::LanesBenchArgs::defaults();
        echo_reads_back(&lanes);
        lanes.no_search = true;
        lanes.no_isolation = true;
        lanes.napi_defer_hard_irqs = Some(2);
        lanes.gro_flush_timeout = Some(Duration::from_micros(200));
        lanes.irq_suspend_timeout = Some(Duration::from_millis(20));
        echo_reads_back(&lanes);
        let mut rr = rr::RrBenchArgs::defaults();
        echo_reads_back(&rr);
        rr.parts = vec![rr::Part::Blocks];
        rr.paths = vec![netlane_rr::server::PathKind::AfXdp];
        echo_reads_back(&rr);
    }
}

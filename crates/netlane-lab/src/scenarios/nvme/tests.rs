//! The nvme scenario's report and plan against described runs.

use netlane::metrics::{CpuTime, Summary};
use netlane_nvme::perf::{GroupReport, PerfReport};

use super::plan::Mode;
use super::*;
use netlane_report::{Outcome, ScenarioReport};

/// A run whose main group did `ops` reads in a second with these latencies.
fn perf(ops: u64, p50_ns: u64, p9999_ns: u64, host_cpu_s: f64) -> PerfReport {
    let lat = Summary {
        count: ops,
        p50: p50_ns,
        p90: p50_ns,
        p99: p9999_ns,
        p999: p9999_ns,
        p9999: p9999_ns,
        mean: p50_ns as f64,
        ..Summary::default()
    };
    let group = |name: &str| GroupReport {
        name: name.into(),
        rw: "randread".into(),
        bs_bytes: 4096,
        qd: 1,
        jobs: 1,
        ops,
        reads: ops,
        writes: 0,
        iops: ops as f64,
        mb_per_s: if name == "writer" && ops > 0 { 500.0 } else { 0.0 },
        read_lat_ns: if ops > 0 { lat } else { Summary::default() },
        write_lat_ns: Summary::default(),
        errors: 0,
        mismatches: 0,
    };
    PerfReport {
        groups: vec![group("readers"), group("writer")],
        seconds: 1.0,
        ops,
        iops: ops as f64,
        host_cpu: CpuTime { user_s: host_cpu_s, ..CpuTime::default() },
        host_cpu_us_per_io: None,
        host_switches_per_io: None,
        target_cpu_us_per_io: None,
        host_napi_threads: Vec::new(),
        host_napi_cpu_us_per_io: None,
        target_threads: Vec::new(),
        direct_sends: 0,
        job_sleeps_per_io: None,
        host_napi_runs_per_io: None,
        busy_polled_packets_per_io: None,
        knobs: Vec::new(),
        worker_sends: 0,
        send_calls: 0,
        cmds_per_send: None,
        worker_wakes_per_io: None,
        queues: Vec::new(),
        queue_failures: 0,
        verified: false,
    }
}

/// The defaults without the lanes part (which runs apart, tested below), and their modes.
fn setup() -> (NvmeBenchArgs, Vec<Mode>) {
    let mut a = NvmeBenchArgs::defaults();
    a.parts.retain(|p| *p != Part::Lanes);
    let target = super::plan::TargetCpu { pid: Some(1), threads: Vec::new() };
    let modes = a.modes("127.0.0.1:4420".parse().unwrap(), &target, a.target_cpu).unwrap();
    (a, modes)
}

/// Two good rounds per mode; the mode labelled `bad` gets `degenerate` in round 2.
fn all(modes: &[Mode], bad: &str, degenerate: PerfReport) -> Vec<Vec<PerfReport>> {
    modes
        .iter()
        .map(|m| {
            let good = match m.label.as_str() {
                "I/O worker" => perf(25_000, 38_000, 1_900_000, 0.5),
                "direct send" => perf(30_000, 32_000, 850_000, 0.5),
                "poll queue" => perf(48_000, 19_000, 900_000, 1.0),
                "send per command" => perf(90_000, 330_000, 2_300_000, 1.0),
                "batched" => perf(200_000, 160_000, 2_200_000, 0.8),
                "caravans" => perf(160_000, 170_000, 2_700_000, 0.8),
                "shared map" => perf(2_100, 7_400_000, 15_000_000, 1.0),
                "readers alone" => perf(40_000, 350_000, 1_500_000, 1.0),
                "QD1 aligned" => perf(30_000, 30_000, 900_000, 0.5),
                "QD1 crossed" => perf(27_000, 34_000, 900_000, 0.5),
                "QD32 aligned" => perf(230_000, 140_000, 900_000, 1.0),
                "QD32 crossed" => perf(180_000, 170_000, 900_000, 1.0),
                super::polling::INTERRUPTS => perf(30_000, 32_000, 850_000, 0.5),
                super::polling::BUSY => perf(31_000, 31_000, 850_000, 1.0),
                super::polling::BUSY_DEFERRED => perf(36_000, 25_000, 800_000, 1.0),
                super::polling::BUSY_COALESCED => perf(35_000, 27_000, 800_000, 1.0),
                l if l.starts_with("caravans ") => perf(200_000, 160_000, 2_200_000, 0.8),
                l if l.starts_with("batched ") => perf(200_000, 160_000, 2_200_000, 1.0),
                _ => perf(17_000, 600_000, 2_000_000, 1.0),
            };
            let mut good = good;
            good.worker_wakes_per_io = match m.label.as_str() {
                "batched" => Some(0.03),
                super::plan::WOKEN_EACH => Some(0.97),
                _ => None,
            };
            if m.part == Part::Polling && m.label.starts_with("busy polling") {
                good.busy_polled_packets_per_io = Some(3.0);
            }
            let second = if m.label == bad { degenerate.clone() } else { good.clone() };
            vec![good, second]
        })
        .collect()
}

fn outcome(r: &ScenarioReport, id: &str) -> (Outcome, String) {
    let c = r.checks.iter().find(|c| c.id == id).unwrap_or_else(|| panic!("no {id}"));
    (c.outcome, c.reason.clone())
}

#[test]
fn good_rounds_meet_the_targets_they_should() {
    let (a, modes) = setup();
    let r = a.report(&modes, &all(&modes, "none", perf(0, 0, 0, 0.0)), None, Vec::new());
    for c in &r.checks {
        assert_eq!(c.outcome, Outcome::Met, "{}: {:?} {}", c.id, c.measured, c.reason);
    }
    // 15 ms shared, 2 ms separate, 1.5 ms without a writer.
    let floor = r.notes.iter().find(|n| n.contains("readers alone")).expect("a note on the mixed floor");
    assert!(floor.contains("p99.99 1500 us"), "{floor}");
    assert!(floor.contains("is 10.0x (10.0..10.0)"), "{floor}");
    assert!(floor.contains("is 1.33x"), "{floor}");
}

#[test]
fn mixed_checks_are_invalid_when_the_shared_map_readers_did_nothing() {
    // Before: 0 IOPS with a shared map made "separate >= 2x shared" pass.
    let (a, modes) = setup();
    let r = a.report(&modes, &all(&modes, "shared map", perf(0, 0, 0, 1.0)), None, Vec::new());
    for id in ["nvme.mixed-read-iops", "nvme.mixed-read-p9999"] {
        let (o, why) = outcome(&r, id);
        assert_eq!(o, Outcome::Invalid, "{id}: {why}");
    }
}

#[test]
fn an_empty_histogram_or_no_cpu_time_is_invalid() {
    let (a, modes) = setup();
    // Separate maps with a p99.99 of 0 (nothing completed): the old check divided by it.
    let r = a.report(&modes, &all(&modes, "separate maps", perf(0, 0, 0, 1.0)), None, Vec::new());
    let (o, why) = outcome(&r, "nvme.mixed-read-p9999");
    assert_eq!(o, Outcome::Invalid);
    assert!(why.contains("empty latency histogram"), "{why}");
    let r = a.report(&modes, &all(&modes, "direct send", perf(0, 0, 0, 0.5)), None, Vec::new());
    assert_eq!(outcome(&r, "nvme.qd1-direct-send").0, Outcome::Invalid);
    assert_eq!(outcome(&r, "nvme.qd1-polling").0, Outcome::Invalid);
    let r = a.report(&modes, &all(&modes, "batched", perf(200_000, 160_000, 2_200_000, 0.0)), None, Vec::new());
    let (o, why) = outcome(&r, "nvme.qd32-batching");
    assert_eq!(o, Outcome::Invalid);
    assert!(why.contains("no time was measured"), "{why}");
}

#[test]
fn the_mixed_part_runs_five_rounds_and_the_sweep_says_where_caravans_won() {
    let (mut a, modes) = setup();
    a.repeat = 3;
    let per_round = modes.len();
    let mixed = modes.iter().filter(|m| m.part == Part::Mixed).count();
    assert_eq!(a.runs(), per_round * 3 + mixed * 2, "mixed modes run 5 rounds, the rest 3");
    a.repeat = 1;
    assert_eq!(a.runs(), per_round, "--repeat 1 runs everything once");
    assert_eq!(modes.iter().filter(|m| m.part == Part::Caravans).count(), 16);
    // Caravans at 0.8 s of CPU against batching's 1.0 for the same IOPS: a win in
    // every cell, each named.
    let r = a.report(&modes, &all(&modes, "none", perf(0, 0, 0, 0.0)), None, Vec::new());
    let note = r.notes.iter().find(|n| n.contains("Caravans beat")).expect("a note on the sweep");
    assert!(note.contains("512 x1 (1.25)") && note.contains("128K x4"), "{note}");
    // A degenerate crossed run makes the affinity check invalid, never met.
    let r = a.report(&modes, &all(&modes, "QD32 crossed", perf(0, 0, 0, 0.0)), None, Vec::new());
    assert_eq!(outcome(&r, "nvme.affinity-qd32").0, Outcome::Invalid);
}

#[test]
fn a_collapsed_repeat_is_flagged() {
    let (mut a, modes) = setup();
    a.repeat = 3;
    let mut rs = all(&modes, "none", perf(0, 0, 0, 0.0));
    let poll = modes.iter().position(|m| m.label == "poll queue").unwrap();
    rs[poll] =
        vec![perf(40_000, 19_000, 900_000, 1.0), perf(6, 19_000, 900_000, 1.0), perf(41_000, 19_000, 900_000, 1.0)];
    let r = a.report(&modes, &rs, None, Vec::new());
    assert!(
        r.flags.iter().any(|f| f.kind == netlane_report::FlagKind::Collapsed && f.subject == "qd1 poll queue"),
        "{:?}",
        r.flags
    );
}

#[test]
fn a_sweep_size_is_named_exactly() {
    assert_eq!(super::options::size_name(512), "512");
    assert_eq!(super::options::size_name(4096), "4K");
    assert_eq!(super::options::size_name(1536), "1536");
    assert_eq!(super::options::size_name(128 << 10), "128K");
}

#[test]
fn the_host_s_napi_threads_count_in_its_cpu_per_io_and_iops_per_core() {
    // 100,000 commands on 1 s of the process's CPU, and 0.5 s more in its NAPI thread.
    let mut r = perf(100_000, 1000, 5000, 1.0);
    let alone = super::checks::per_core(&r).unwrap();
    r.host_napi_threads = vec!["napi/tx0-8193 (4242)".into()];
    r.host_napi_cpu_us_per_io = Some(5.0);
    let with = super::checks::per_core(&r).unwrap();
    assert!((alone / with - 1.5).abs() < 1e-9, "{alone} / {with}: the NAPI thread's 0.5 s left out");
    assert!((super::checks::host_us_per_io(&r).unwrap() - 15.0).abs() < 1e-9);
    // Threads named but unread: invalid, not counted as nothing.
    r.host_napi_cpu_us_per_io = None;
    assert!(super::checks::per_core(&r).is_err());
}

#[test]
fn the_writer_s_loss_is_reported_with_the_target_s_cpu() {
    let (a, modes) = setup();
    let mut runs = all(&modes, "none", perf(0, 0, 0, 0.0));
    for (m, rs) in modes.iter().zip(runs.iter_mut()) {
        for r in rs.iter_mut() {
            // The target's one CPU full in both; the writer losing a third with separate maps.
            r.target_cpu_us_per_io = Some(1e6 / r.ops.max(1) as f64);
            if m.label == "separate maps" {
                r.groups[1].mb_per_s = 325.0;
            }
        }
    }
    let r = a.report(&modes, &runs, None, Vec::new());
    assert_eq!(outcome(&r, "nvme.mixed-writer").0, Outcome::Missed);
    let note = r.notes.iter().find(|n| n.starts_with("The writer with separate maps")).expect("the writer's note");
    assert!(note.contains("0.650x its MB/s") && note.contains("100% busy with a shared map"), "{note}");
    assert!(note.contains("CPU was full in both"), "{note}");
}

#[test]
fn the_wake_up_check_is_invalid_when_both_modes_woke_the_worker_alike() {
    let (a, modes) = setup();
    let mut alike = perf(200_000, 160_000, 2_200_000, 0.8);
    alike.worker_wakes_per_io = Some(0.97);
    let r = a.report(&modes, &all(&modes, "batched", alike), None, Vec::new());
    let (o, why) = outcome(&r, "nvme.qd32-wake-batch-end");
    assert_eq!(o, Outcome::Invalid, "{why}");
    assert!(why.contains("woke the worker alike"), "{why}");
}

#[test]
fn the_busy_polling_checks_are_invalid_when_busy_polling_took_nothing_in() {
    let (a, modes) = setup();
    // Faster, but with no packet taken in by polling: nothing of busy polling was shown.
    let unpolled = perf(40_000, 20_000, 800_000, 1.0);
    let r = a.report(&modes, &all(&modes, super::polling::BUSY_DEFERRED, unpolled), None, Vec::new());
    for id in ["nvme.busy-poll-qd1", "nvme.busy-poll-held-off"] {
        let (o, why) = outcome(&r, id);
        assert_eq!(o, Outcome::Invalid, "{id}: {why}");
        assert!(why.contains("did not run"), "{id}: {why}");
    }
    let t = r.tables.iter().find(|t| t.name == "nvme-polling").expect("the polling table");
    assert_eq!(t.rows.len(), super::polling::POLLING_MODES.len());
    // A kernel that refused a compared mode's deferral ran it without: nothing is shown.
    let mut runs = all(&modes, "none", perf(0, 0, 0, 0.0));
    let at = |label: &str| modes.iter().position(|m| m.label == label).unwrap();
    let refused = netlane::lanes::Knob::new_refused("napi 3", "defer-hard-irqs=2", "not supported");
    runs[at(super::polling::BUSY_DEFERRED)][1].knobs.push(refused);
    let r = a.report(&modes, &runs, None, Vec::new());
    for id in ["nvme.busy-poll-qd1", "nvme.busy-poll-held-off"] {
        let (o, why) = outcome(&r, id);
        assert_eq!(o, Outcome::Invalid, "{id}: {why}");
        assert!(why.contains("ran without what it asked for"), "{id}: {why}");
    }
    assert_eq!(outcome(&r, "nvme.busy-poll-coalesced").0, Outcome::Met, "a check of other modes stands");
    // Refused in a mode no check compares: its row stands, and a note says so.
    let mut runs = all(&modes, "none", perf(0, 0, 0, 0.0));
    let refused = netlane::lanes::Knob::new_refused("napi 3", "irq-suspend-timeout=20000000ns", "not supported");
    runs[at(super::polling::BUSY_SUSPENDED)][0].knobs.push(refused);
    let r = a.report(&modes, &runs, None, Vec::new());
    assert!(r.checks.iter().all(|c| c.outcome == Outcome::Met), "{:?}", r.checks);
    let note = r.notes.iter().find(|n| n.contains("ran without")).expect("a note on the refused setting");
    assert!(note.contains(super::polling::BUSY_SUSPENDED) && note.contains("irq-suspend-timeout"), "{note}");
}

#[test]
fn busy_polling_with_the_device_coalescing_is_not_shown_where_the_device_refuses_it() {
    // A veth has no coalescing: the run's knob says so (and a refused deferral beside it
    // does not make the check invalid: the mode cannot run here at all).
    let (a, modes) = setup();
    let mut runs = all(&modes, "none", perf(0, 0, 0, 0.0));
    let at = |label: &str| modes.iter().position(|m| m.label == label).unwrap();
    let refused = "ethtool -c tx0: Operation not supported (os error 95)";
    for r in &mut runs[at(super::polling::BUSY_COALESCED)] {
        r.knobs.push(netlane::lanes::Knob::new_refused("tx0 coalesce", "rx-usecs=100", refused));
    }
    runs[at(super::polling::BUSY)][0].knobs.push(netlane::lanes::Knob::new_refused("napi 3", "x=1", "no"));
    let r = a.report(&modes, &runs, None, Vec::new());
    let (o, why) = outcome(&r, "nvme.busy-poll-coalesced");
    assert_eq!(o, Outcome::NotShown, "{why}");
    assert!(why.contains("coalesces its interrupts") && why.contains("tx0 coalesce"), "{why}");
    assert!(why.contains("Operation not supported"), "{why}");
    // Its row is left out of the table (it ran as busy polling alone), and said.
    let t = r.tables.iter().find(|t| t.name == "nvme-polling").expect("the polling table");
    assert_eq!(t.rows.len(), super::polling::POLLING_MODES.len() - 1);
    let note = r.notes.iter().find(|n| n.starts_with("Not shown on this machine: busy polling, device coalescing"));
    assert!(note.is_some_and(|n| n.contains("Operation not supported")), "{:?}", r.notes);
    assert!(!r.notes.iter().any(|n| n.contains("ran without") && n.contains("coalesce")), "{:?}", r.notes);
}

#[test]
fn on_loopback_the_polling_part_is_left_out_and_said() {
    let a: NvmeBenchArgs = crate::scenarios::from_words(&["--path", "loopback"]).unwrap();
    let target = super::plan::TargetCpu::default();
    let modes = a.modes("127.0.0.1:4420".parse().unwrap(), &target, 1).unwrap();
    assert!(modes.iter().all(|m| m.part != Part::Polling));
    assert!(a.labels().iter().all(|(p, _)| *p != Part::Polling));
    let r = a.report(&modes, &all(&modes, "none", perf(0, 0, 0, 0.0)), None, Vec::new());
    assert!(r.notes.iter().any(|n| n.contains("Left out: the polling part")), "{:?}", r.notes);
}

/// A lanes-part run: `target_us` of target CPU per I/O, p99 `p99_ns`; with lanes, the
/// target's placement (`by_owner` of 8 connections on their owner, reactors on CPUs 1
/// and 2 owning NAPI 10 and 11).
fn lane_run(target_us: f64, p99_ns: u64, by_owner: Option<u64>) -> super::lanes::LanesRun {
    let mut perf = perf(40_000, 60_000, p99_ns, 1.0);
    perf.target_cpu_us_per_io = Some(target_us);
    let lanes = by_owner.map(|by_owner| netlane_nvme::target::TargetLanes {
        device: "rx0".into(),
        reactors: [(1, 10), (2, 11)]
            .map(|(cpu, id)| netlane_nvme::target::ReactorLane { cpu, napi_ids: vec![id], connections: 4 })
            .to_vec(),
        by_owner,
        new_ids: 0,
        no_napi: 8 - by_owner,
    });
    super::lanes::LanesRun { perf, connections: 8, lanes, misaligned: None }
}

fn lanes_done(
    cpus: usize,
    dealt: Vec<super::lanes::LanesRun>,
    lanes: Vec<super::lanes::LanesRun>,
) -> super::lanes::LanesDone {
    super::lanes::LanesDone {
        runs: vec![dealt, lanes],
        plan: super::lanes::lanes_plan(&netlane::cpus::machine::CpuTopology::uniform(1, cpus, 1)),
        pinned: vec![(0, 10, 1), (1, 11, 2)],
    }
}

#[test]
fn the_lanes_part_compares_only_where_the_target_and_hosts_have_cpus_apart() {
    let a: NvmeBenchArgs = crate::scenarios::from_words(&["--parts", "lanes"]).unwrap();
    let good = || lanes_done(3, vec![lane_run(20.0, 300_000, None)], vec![lane_run(16.0, 250_000, Some(8))]);
    let r = a.report(&[], &[], Some(&Ok(good())), Vec::new());
    assert_eq!(outcome(&r, "nvme.lanes-placed").0, Outcome::Met);
    assert_eq!(outcome(&r, "nvme.lanes-target-cpu").0, Outcome::Met);
    assert_eq!(outcome(&r, "nvme.lanes-p99").0, Outcome::Met);
    let t = r.tables.iter().find(|t| t.name == "nvme-lanes").expect("the lanes table");
    assert_eq!(t.rows.len(), 2);
    // On two CPUs the hosts run beside a reactor: placement is shown, the costs are not.
    let mut two = good();
    two.plan = super::lanes::lanes_plan(&netlane::cpus::machine::CpuTopology::uniform(1, 2, 1));
    let r = a.report(&[], &[], Some(&Ok(two)), Vec::new());
    assert_eq!(outcome(&r, "nvme.lanes-placed").0, Outcome::Met);
    for id in ["nvme.lanes-target-cpu", "nvme.lanes-p99"] {
        let (o, why) = outcome(&r, id);
        assert_eq!(o, Outcome::NotShown, "{why}");
        assert!(why.starts_with("needs 3 CPUs") && why.contains("gives 2"), "{why}");
    }
}

#[test]
fn a_lanes_run_that_placed_few_connections_or_owned_a_queue_on_another_cpu_is_not_met() {
    let a: NvmeBenchArgs = crate::scenarios::from_words(&["--parts", "lanes"]).unwrap();
    // One connection dealt in turn (it came through no NAPI instance): missed.
    let r = a.report(
        &[],
        &[],
        Some(&Ok(lanes_done(3, vec![lane_run(20.0, 1, None)], vec![lane_run(16.0, 1, Some(7))]))),
        Vec::new(),
    );
    assert_eq!(outcome(&r, "nvme.lanes-placed").0, Outcome::Missed);
    // Its costs are not lanes' costs.
    let (o, why) = outcome(&r, "nvme.lanes-target-cpu");
    assert_eq!(o, Outcome::Invalid, "{why}");
    assert!(why.contains("88% of the connections"), "{why}");
    // A reactor owning a queue whose NAPI thread runs elsewhere compares nothing.
    let mut off = lane_run(16.0, 1, Some(8));
    off.misaligned = Some("the reactor on CPU 1 owns queue 1 (NAPI 11), whose NAPI thread runs on CPU 2".into());
    let r = a.report(&[], &[], Some(&Ok(lanes_done(3, vec![lane_run(20.0, 1, None)], vec![off]))), Vec::new());
    for id in ["nvme.lanes-placed", "nvme.lanes-target-cpu", "nvme.lanes-p99"] {
        let (o, why) = outcome(&r, id);
        assert_eq!(o, Outcome::Invalid, "{id}: {why}");
        assert!(why.contains("whose NAPI thread runs on CPU 2"), "{id}: {why}");
    }
    // A target that placed fewer connections than the hosts opened did not see them all.
    let mut few = lane_run(16.0, 1, Some(3));
    few.lanes.as_mut().unwrap().no_napi = 0;
    let r = a.report(&[], &[], Some(&Ok(lanes_done(3, vec![lane_run(20.0, 1, None)], vec![few]))), Vec::new());
    let (o, why) = outcome(&r, "nvme.lanes-placed");
    assert_eq!(o, Outcome::Invalid, "{why}");
    assert!(why.contains("placed 3 connections"), "{why}");
}

#[test]
fn on_loopback_or_a_testbed_the_lanes_part_is_left_out_and_said() {
    let a: NvmeBenchArgs = crate::scenarios::from_words(&["--path", "loopback", "--parts", "qd1,lanes"]).unwrap();
    assert!(a.labels().iter().all(|(p, _)| *p != Part::Lanes));
    let target = super::plan::TargetCpu::default();
    let modes = a.modes("127.0.0.1:4420".parse().unwrap(), &target, 1).unwrap();
    let r = a.report(&modes, &all(&modes, "none", perf(0, 0, 0, 0.0)), None, Vec::new());
    assert!(r.notes.iter().any(|n| n.contains("Left out: the lanes part")), "{:?}", r.notes);
    let (o, why) = outcome(&r, "nvme.lanes-target-cpu");
    assert_eq!(o, Outcome::Skipped, "{why}");
}

#[test]
fn a_failed_lanes_part_is_said_and_the_other_parts_stand() {
    let (mut a, modes) = setup();
    a.parts.push(Part::Lanes);
    let failed = Err("run lanes by receive queue: the agent on nvme-lanes-tx failed".to_string());
    let r = a.report(&modes, &all(&modes, "none", perf(0, 0, 0, 0.0)), Some(&failed), Vec::new());
    for id in ["nvme.lanes-placed", "nvme.lanes-target-cpu", "nvme.lanes-p99"] {
        let (o, why) = outcome(&r, id);
        assert_eq!(o, Outcome::Invalid, "{id}: {why}");
        assert!(why.contains("the lanes part failed") && why.contains("agent"), "{why}");
    }
    assert!(r.notes.iter().any(|n| n.starts_with("The lanes part failed")), "{:?}", r.notes);
    assert_eq!(outcome(&r, "nvme.qd1-direct-send").0, Outcome::Met);
}

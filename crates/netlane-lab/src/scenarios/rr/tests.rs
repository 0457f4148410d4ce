//! The rr scenario's report and checks against described rounds, and its block geometry.

use super::*;

use netlane::metrics::cpu::SystemCpuDelta;
use netlane_report::Outcome;
use netlane_rr::clients::ClientsReport;
use netlane_rr::server::{RrCounters, ServerStats};

fn run(responses_per_s: f64, p50_ns: u64, busy_s: f64) -> RrRun {
    let responses = (responses_per_s * 2.0) as u64;
    RrRun {
        clients: ClientsReport {
            responses,
            responses_per_s,
            seconds: 2.0,
            latency_ns: netlane::metrics::Summary {
                count: responses,
                p50: p50_ns,
                p99: p50_ns * 2,
                p9999: p50_ns * 4,
                ..Default::default()
            },
            ..ClientsReport::default()
        },
        server: ServerStats {
            counters: RrCounters { responses, ..RrCounters::default() },
            seconds: 2.0,
            ..ServerStats::default()
        },
        server_cpu: SystemCpuDelta { busy_s, total_s: 2.0, cpus: 1, ..SystemCpuDelta::default() },
        agents: Vec::new(),
    }
}

/// `r` from a server that busy polled `napi_id`, taking `polled` datagrams that way.
fn busy(mut r: RrRun, polled: u64, napi_id: u32) -> RrRun {
    r.server.counters.frames = r.server.counters.responses;
    r.server.busy_poll = Some(netlane_rr::server::BusyPollReport {
        policy: "50,8".into(),
        rx_packets: Some(polled),
        napi_ids: vec![("queue 0".into(), Some(napi_id))],
        ..Default::default()
    });
    r
}

/// `r` from a server with two lanes (NAPI ids 4100 and 4101), busy polling; lane 1's
/// socket ended on `lane1_polled`.
fn lanes(r: RrRun, lane1_polled: u32) -> RrRun {
    let mut r = busy(r, 100_000, 4100);
    let lane = |i: usize, id: u32| netlane_rr::server::RrLane {
        lane: i,
        napi_ids: vec![id],
        frames: 1000,
        ..Default::default()
    };
    r.server.lanes = Some(netlane_rr::server::LanesReport {
        device: "rx0".into(),
        lanes: vec![lane(0, 4100), lane(1, 4101)],
        ..Default::default()
    });
    r.server.busy_poll.as_mut().unwrap().napi_ids =
        vec![("lane 0 service socket".into(), Some(4100)), ("lane 1 service socket".into(), Some(lane1_polled))];
    r
}

fn herd(mut r: RrRun, woken_in_herds: u64) -> RrRun {
    r.clients.wakeups = r.clients.responses / 2;
    r.clients.woken_sockets = r.clients.responses;
    r.clients.herd_woken_sockets = woken_in_herds;
    r
}

/// An AF_XDP run whose queue sockets delivered `frames` each.
fn queued(mut r: RrRun, frames: &[u64]) -> RrRun {
    r.server.xdp = Some(netlane_rr::server::XdpReport {
        queues: frames.len(),
        frames_per_queue: frames.to_vec(),
        ..Default::default()
    });
    r
}

/// `r` from a packet transmit ring that wrote every response as a frame, each leaving
/// its checksum to the device where `offload` (all of them: one frame each).
fn framed(mut r: RrRun, offload: bool) -> RrRun {
    let n = r.server.counters.responses;
    r.server.raw_tx = Some(netlane_rr::server::RawTxReport {
        datagrams: n,
        frames: n,
        checksum_offload: offload,
        checksum_offloaded: if offload { n } else { 0 },
        ..Default::default()
    });
    r
}

/// `r` served over TCP.
fn over_tcp(mut r: RrRun) -> RrRun {
    r.server.path = "tcp".into();
    r
}

fn report_with(bad: &str, degenerate: RrRun) -> ScenarioReport {
    report_rounds(bad, degenerate, false)
}

/// `bad` (a mode's label) measured `degenerate` in the second round, or in both.
fn report_rounds(bad: &str, degenerate: RrRun, both: bool) -> ScenarioReport {
    report_of(&args(), bad, degenerate, both)
}

/// The defaults, with the throughput comparison's clients on CPUs 2 and 3 (beside the
/// server's CPU 1), whatever this machine has.
fn args() -> RrBenchArgs {
    let mut a = RrBenchArgs::defaults();
    a.server_cpu = 1;
    a.client_cpus = Some("2-3".parse().unwrap());
    a
}

fn report_of(a: &RrBenchArgs, bad: &str, degenerate: RrRun, both: bool) -> ScenarioReport {
    let modes = a.modes("10.0.0.1:7070".parse().unwrap());
    let all: Vec<Vec<RrRun>> = modes
        .iter()
        .map(|m| {
            let good = match m.label.as_str() {
                "recvfrom" => run(40_000.0, 1_500_000, 1.9),
                "recvfrom, clients on 2 CPUs" => run(40_000.0, 1_500_000, 1.0),
                "tpacket-v2, clients on 2 CPUs" => run(80_000.0, 1_000_000, 1.0),
                l if l.starts_with("24 KiB, 64 clients") => run(60_000.0, 1_000_000, 1.3),
                l if l.starts_with("adaptive") => run(58_000.0, 1_000_000, 1.2),
                l if l.starts_with("48 KiB, 64 clients") => run(8_000.0, 8_000_000, 0.1),
                l if l.starts_with("8K whole") => run(34_000.0, 1_800_000, 1.8),
                l if l.starts_with("8K") => run(24_000.0, 2_700_000, 1.9),
                l if l.contains("lanes") => lanes(run(60_000.0, 800_000, 2.0), 4101),
                l if l.contains("busy polling") => busy(run(60_000.0, 800_000, 2.0), 100_000, 4100),
                "unpaced" => herd(run(20_000.0, 1_000_000, 0.5), 8_000),
                "paced" => herd(run(20_000.0, 1_800_000, 0.5), 100),
                "af-xdp, every queue" => queued(run(60_000.0, 1_000_000, 1.5), &[5_000, 4_000]),
                "packet, 1 KiB" => framed(run(60_000.0, 1_000_000, 1.5), true),
                "packet, 1 KiB, checksums summed here" => framed(run(60_000.0, 1_000_000, 1.5), false),
                // Jumbo frames gain UDP 1.42x, TCP 1.08x.
                "udp 8K, MTU 9000" => run(34_000.0, 1_800_000, 1.8),
                "udp 8K, MTU 1500" => run(24_000.0, 2_700_000, 1.9),
                "tcp 8K, MTU 9000" => over_tcp(run(26_000.0, 2_000_000, 1.8)),
                l if l.starts_with("tcp") => over_tcp(run(24_000.0, 2_200_000, 1.8)),
                _ => run(60_000.0, 1_000_000, 1.5),
            };
            let second = if m.label == bad { degenerate.clone() } else { good.clone() };
            let first = if both && m.label == bad { degenerate.clone() } else { good };
            vec![first, second]
        })
        .collect();
    a.report(&modes, &all, Vec::new())
}

fn outcome(r: &ScenarioReport, id: &str) -> Outcome {
    r.checks.iter().find(|c| c.id == id).unwrap_or_else(|| panic!("no {id}")).outcome
}

#[test]
fn good_rounds_meet_the_talks_shape() {
    let r = report_with("none", run(0.0, 0, 0.0));
    for c in &r.checks {
        assert_eq!(c.outcome, Outcome::Met, "{}: {:?} {}", c.id, c.measured, c.reason);
    }
    // The throughput comparison's clients on two CPUs beside the server's.
    let wide = r.notes.iter().find(|n| n.starts_with("With the clients on 2 CPUs")).expect("a note");
    assert!(wide.contains("2.00x the rate") && wide.contains("TPACKET_V2 the clients, recvfrom the clients"), "{wide}");
    assert!(r.headline.contains("TPACKET_V2 cost the server"), "{}", r.headline);
}

#[test]
fn the_checksum_offload_comparison_is_invalid_where_a_run_did_not_do_what_it_asked() {
    let id = "rr.tx-packet-checksum-offload-cost";
    // Half the datagrams left their checksum to the device in a run that asked for all.
    let mut half = framed(run(60_000.0, 1_000_000, 1.5), true);
    half.server.raw_tx.as_mut().unwrap().checksum_offloaded /= 2;
    assert_eq!(outcome(&report_with("packet, 1 KiB", half), id), Outcome::Invalid);
    // A run that asked to sum every checksum left some to the device.
    let mut some = framed(run(60_000.0, 1_000_000, 1.5), false);
    some.server.raw_tx.as_mut().unwrap().checksum_offloaded = 1;
    assert_eq!(outcome(&report_with("packet, 1 KiB, checksums summed here", some), id), Outcome::Invalid);
}

#[test]
fn the_report_says_where_no_fixed_block_could_meet_both_adaptive_targets() {
    // Every fixed block runs 25% idle but 24 KiB at 64 clients (35%, the best rate).
    let r = report_with("none", run(0.0, 0, 0.0));
    let note = r.notes.iter().find(|n| n.contains("No fixed block met both")).expect("a note");
    assert!(
        note.contains("128 clients, no think (0.00)")
            && note.contains("128 clients, think 3ms (0.00)")
            && !note.contains("64 clients"),
        "{note}"
    );
    let shape = r.notes.iter().find(|n| n.starts_with("no think: the block holding half")).expect("a note");
    assert!(shape.contains("64 clients 24 KiB 1.00x at 35% idle"), "{shape}");
    let price = r.notes.iter().find(|n| n.contains("Pacing's price")).expect("a note");
    assert!(price.contains("1.80x"), "{price}");
}

#[test]
fn a_run_that_answered_nothing_is_invalid_never_met() {
    // recvfrom answered nothing in round 2: the cost ratio against it is invalid.
    let r = report_with("recvfrom", run(0.0, 0, 0.0));
    assert_eq!(outcome(&r, "rr.tpacket-v2-cost"), Outcome::Invalid);
    // The half-burst block answered nothing: its idle share is not "100% idle".
    let r = report_with("24 KiB, 64 clients, no think", run(0.0, 0, 0.0));
    assert_eq!(outcome(&r, "rr.block-half-burst-idle"), Outcome::Invalid);
    assert_eq!(outcome(&r, "rr.block-half-burst-throughput"), Outcome::Invalid);
    // An adaptive run that answered nothing is neither fast nor idle.
    for (label, suffix) in [("adaptive, 64 clients, think 3ms", ""), ("adaptive, 64 clients, no think", "-no-think")] {
        let r = report_with(label, run(0.0, 0, 0.0));
        assert_eq!(outcome(&r, &format!("rr.adaptive-throughput{suffix}")), Outcome::Invalid, "{label}");
        assert_eq!(outcome(&r, &format!("rr.adaptive-idle{suffix}")), Outcome::Invalid, "{label}");
    }
    // A paced run that answered a fraction of the load is not a calm one; no herd to
    // spread without pacing is no evidence either.
    let r = report_with("paced", run(5_000.0, 1_000_000, 0.5));
    assert_eq!(outcome(&r, "rr.pace-herd"), Outcome::Invalid);
    let r = report_with("unpaced", run(20_000.0, 1_000_000, 0.5));
    assert_eq!(outcome(&r, "rr.pace-herd"), Outcome::Invalid);
    // No CPU time counted at all.
    let mut z = run(30_000.0, 1_000_000, 0.0);
    z.server_cpu.total_s = 0.0;
    let r = report_with("8K whole, MTU 9000", z);
    assert_eq!(outcome(&r, "rr.jumbo-throughput"), Outcome::Met);
    let r = report_with("recvfrom", {
        let mut z = run(30_000.0, 1_000_000, 0.0);
        z.server_cpu.total_s = 0.0;
        z
    });
    assert_eq!(outcome(&r, "rr.af-xdp-cost"), Outcome::Invalid);
    // A frame transmit run that sent half its responses through the socket does not
    // measure the frame path, however cheap it looks.
    let mut half = run(60_000.0, 1_000_000, 0.5);
    half.server.raw_tx =
        Some(netlane_rr::server::RawTxReport { datagrams: half.server.counters.responses / 2, ..Default::default() });
    let r = report_with("packet, 8 KiB", half);
    assert_eq!(outcome(&r, "rr.tx-packet-8k-cost"), Outcome::Invalid);
}

#[test]
fn the_adaptive_targets_hold_at_every_client_count_not_on_their_median() {
    // Three populations fine, 128 clients nearly saturated (10% idle) in both rounds:
    // a median over populations would read 40% idle; the worst reads 10%.
    let r = report_rounds("adaptive, 128 clients, think 3ms", run(58_000.0, 1_000_000, 1.8), true);
    assert_eq!(outcome(&r, "rr.adaptive-idle"), Outcome::Missed);
    assert_eq!(outcome(&r, "rr.adaptive-throughput"), Outcome::Met);
    let m = r.checks.iter().find(|c| c.id == "rr.adaptive-idle").and_then(|c| c.measured.clone()).unwrap();
    assert!((m.median - 10.0).abs() < 1e-6, "{m:?}");
    // Slow at one population: the throughput target is missed.
    let r = report_rounds("adaptive, 16 clients, think 3ms", run(30_000.0, 1_000_000, 1.2), true);
    assert_eq!(outcome(&r, "rr.adaptive-throughput"), Outcome::Missed);
    // Each think time is judged on its own.
    assert_eq!(outcome(&r, "rr.adaptive-throughput-no-think"), Outcome::Met);
}

#[test]
fn the_fixed_blocks_are_the_sizes_the_adaptive_ring_chooses_from() {
    let a = RrBenchArgs::defaults();
    let adaptive: Vec<usize> = netlane_rr::server::ADAPTIVE_BLOCKS.iter().map(|b| *b as usize).collect();
    assert_eq!(a.block_sizes, adaptive);
    assert_eq!(a.block_thinks, [std::time::Duration::ZERO, std::time::Duration::from_millis(3)]);
    // Half of 64 waiting clients' 512-byte requests: 32, which 24 KiB holds (38), 16 KiB not (25).
    assert_eq!(a.half_burst_block(64), Some(24 << 10));
    // Every think time runs every size and the adaptive ring at every client count.
    let labels = a.labels();
    let blocks = labels.iter().filter(|(p, _)| *p == Part::Blocks).count();
    assert_eq!(blocks, 2 * 4 * (10 + 1));
    for (words, why) in [
        (&["--block-thinks", "0s,1ms,3ms"][..], "at most one pause"),
        (&["--block-sizes", "6K"][..], "whole pages and 2 KiB frames"),
        (&["--block-sizes", "8K,8K"][..], "appears twice"),
    ] {
        let a: RrBenchArgs = crate::scenarios::from_words(words).unwrap();
        let e = a.check_arguments().unwrap_err().to_string();
        assert!(e.contains(why), "{words:?}: {e}");
    }
}

#[test]
fn tpacket_v2_s_rate_needs_clients_on_two_cpus() {
    let r = report_rounds("tpacket-v2, clients on 2 CPUs", run(60_000.0, 1_000_000, 1.0), true);
    let c = r.checks.iter().find(|c| c.id == "rr.tpacket-v2-throughput").unwrap();
    assert_eq!(c.outcome, Outcome::Missed, "1.5x: {}", c.reason);
    // One CPU given beside the server's: the comparison does not run, and says why (the
    // machine's own shortage is "not shown": needs 3 CPUs).
    let mut one = RrBenchArgs::defaults();
    one.server_cpu = 1;
    one.client_cpus = Some("0".parse().unwrap());
    assert!(!one.labels().iter().any(|(_, l)| l.contains("clients on")));
    let r = report_of(&one, "none", run(0.0, 0, 0.0), false);
    let c = r.checks.iter().find(|c| c.id == "rr.tpacket-v2-throughput").unwrap();
    assert_eq!(c.outcome, Outcome::Skipped, "{}", c.reason);
    assert!(c.reason.contains("(0) make 1 client thread(s): two are needed"), "{}", c.reason);
    // The server's own CPU is not the clients'.
    let mut bad = one.clone();
    bad.client_cpus = Some("0-1".parse().unwrap());
    assert!(bad.check_arguments().unwrap_err().to_string().contains("the server's CPU 1 is not the clients'"));
}

#[test]
fn every_queue_s_socket_must_serve_its_share() {
    let a = RrBenchArgs::defaults();
    assert!(a.parts.contains(&Part::Queues));
    let label = "af-xdp, every queue";
    let check = |r: RrRun| {
        let rep = report_with(label, r);
        rep.checks.iter().find(|c| c.id == "rr.queues-af-xdp-every-queue").unwrap().clone()
    };
    // 5000 and 4000: the least served has 89% of an even share.
    let c = check(queued(run(60_000.0, 1_000_000, 1.5), &[5_000, 4_000]));
    assert_eq!(c.outcome, Outcome::Met, "{}", c.reason);
    assert!((c.measured.unwrap().median - 8_000.0 / 90.0).abs() < 1e-6);
    // One queue's socket served nearly everything in round 2: a queue was not spread to.
    assert_eq!(check(queued(run(60_000.0, 1_000_000, 1.5), &[9_800, 200])).outcome, Outcome::WithinNoise);
    // A socket on one of the two queues only: the other queue served nothing.
    let c = check(queued(run(60_000.0, 1_000_000, 1.5), &[9_000]));
    assert_eq!((c.outcome, c.measured.unwrap().min), (Outcome::WithinNoise, 0.0), "{}", c.reason);
    // None that delivered, or more sockets than queues: nothing to judge.
    for frames in [&[0, 0][..], &[1, 1, 1][..]] {
        let c = check(queued(run(60_000.0, 1_000_000, 1.5), frames));
        assert_eq!(c.outcome, Outcome::Invalid, "{frames:?}: {}", c.reason);
    }
    // Too few clients for their flows to reach both queues: not judged.
    let mut few = args();
    few.clients = 8;
    let r = report_of(&few, "none", run(0.0, 0, 0.0), false);
    let c = r.checks.iter().find(|c| c.id == "rr.queues-af-xdp-every-queue").unwrap();
    assert_eq!(c.outcome, Outcome::Skipped, "{}", c.reason);
    // The queues part's runs are on two queues, the paths part's on one.
    let modes = a.modes("10.0.0.1:7070".parse().unwrap());
    let net = |part: Part, label: &str| modes.iter().find(|m| m.part == part && m.label == label).unwrap().net();
    assert_eq!(net(Part::Queues, label), (1500, 2));
    assert_eq!(net(Part::Paths, "af-xdp"), (1500, 1));
}

#[test]
fn a_block_holds_about_what_it_is_sized_for() {
    // 512-byte requests take 640 bytes each in a V3 block.
    assert_eq!(v3_request_footprint(512, false), 640);
    let (bytes, holds) = v3_block_for(32, 512, false);
    assert_eq!((bytes, holds), (24576, 38));
    for n in [8, 16, 32, 64, 128] {
        let (bytes, holds) = v3_block_for(n, 512, false);
        assert!(holds >= n && (bytes as usize).is_multiple_of(netlane_sys::packet::page_size()));
    }
}

#[test]
fn busy_polling_counts_only_where_it_polled_and_is_not_shown_without_a_napi_id() {
    let outcome = |r: &ScenarioReport, id: &str| r.checks.iter().find(|c| c.id == id).unwrap().clone();
    // Good rounds: 0.8 ms against 1 ms, both paths met.
    let r = report_with("none", run(0.0, 0, 0.0));
    assert_eq!(outcome(&r, "rr.busy-poll-recvmmsg-p50").outcome, Outcome::Met);
    assert_eq!(outcome(&r, "rr.busy-poll-af-xdp-p50").outcome, Outcome::Met);
    // A busy run that took nothing by polling proves nothing: invalid, never met.
    let r = report_with("recvmmsg busy polling", busy(run(60_000.0, 800_000, 2.0), 0, 4100));
    let c = outcome(&r, "rr.busy-poll-recvmmsg-p50");
    assert_eq!(c.outcome, Outcome::Invalid, "{}", c.reason);
    assert!(c.reason.contains("took 0.00%"), "{}", c.reason);
    // A socket without a NAPI id had nothing to poll: not shown here, and why.
    let r = report_with("af-xdp busy polling", busy(run(60_000.0, 800_000, 2.0), 0, 0));
    let c = outcome(&r, "rr.busy-poll-af-xdp-p50");
    assert_eq!(c.outcome, Outcome::NotShown, "{}", c.reason);
    assert!(c.reason.contains("NAPI ids were queue 0: 0") && c.reason.contains("veth"), "{}", c.reason);
    // The table shows the polled share.
    let t = r.tables.iter().find(|t| t.name == "rr-busy").expect("the busy table");
    assert_eq!(t.rows.len(), 7);
    // Deferred interrupts that the kernel refused leave the deferred check invalid.
    let mut refused = busy(run(60_000.0, 800_000, 2.0), 100_000, 4100);
    refused.server.napi = vec![netlane::lanes::Knob {
        name: "napi 4100".into(),
        wanted: "defer-hard-irqs=2".into(),
        status: netlane::lanes::KnobStatus::Refused { reason: "EPERM".into() },
    }];
    let r = report_with("recvmmsg busy polling, deferred", refused);
    let c = outcome(&r, "rr.busy-poll-deferred-recvmmsg-p50");
    assert_eq!(c.outcome, Outcome::Invalid, "{}", c.reason);
    assert_eq!(outcome(&r, "rr.busy-poll-recvmmsg-p50").outcome, Outcome::Met);
    // A lane whose socket ended on another lane's queue: half the lanes poll their own.
    let r = report_rounds("recvmmsg lanes busy polling", lanes(run(60_000.0, 800_000, 2.0), 4100), true);
    let c = outcome(&r, "rr.lanes-busy-poll-own-queue");
    assert_eq!((c.outcome, c.measured.map(|m| m.median)), (Outcome::Missed, Some(0.5)), "{}", c.reason);
}

#[test]
fn tcp_s_jumbo_gain_is_judged_against_udp_s_and_only_over_tcp() {
    let r = report_with("none", run(0.0, 0, 0.0));
    assert_eq!(outcome(&r, "rr.tcp-jumbo-gain-vs-udp"), Outcome::Met);
    assert!(r.tables.iter().any(|t| t.name == "rr-tcp-wall" && t.rows.len() == 8), "the wall over both transports");
    // A "TCP" run the server answered over UDP cannot stand for TCP.
    let r = report_rounds("tcp 8K, MTU 9000", run(26_000.0, 2_000_000, 1.8), true);
    assert_eq!(outcome(&r, "rr.tcp-jumbo-gain-vs-udp"), Outcome::Invalid);
    // TCP gaining as much as UDP misses.
    let r = report_rounds("tcp 8K, MTU 9000", over_tcp(run(40_000.0, 2_000_000, 1.8)), true);
    assert_eq!(outcome(&r, "rr.tcp-jumbo-gain-vs-udp"), Outcome::Missed);
    // Where jumbo frames gain UDP nothing, TCP's gain has nothing to be compared with.
    let r = report_rounds("udp 8K, MTU 9000", run(24_000.0, 2_700_000, 1.9), true);
    assert_eq!(outcome(&r, "rr.tcp-jumbo-gain-vs-udp"), Outcome::Invalid);
    // A TCP run whose connections were refused does not stand for TCP.
    let mut refused = over_tcp(run(26_000.0, 2_000_000, 1.8));
    refused.server.counters.connections_refused = 3;
    let r = report_rounds("tcp 8K, MTU 9000", refused, true);
    assert_eq!(outcome(&r, "rr.tcp-jumbo-gain-vs-udp"), Outcome::Invalid);
}

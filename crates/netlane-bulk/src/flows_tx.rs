//! The many-flow sender: flows served in turn from a few unconnected sockets, each send
//! one flow's train to its peer with its own UDP_SEGMENT, paced per flow or not at all
//! ([`crate::flows`] has the schedule).

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsFd;

use netlane::metrics::cpu::thread_cpu;
use netlane::pace::{PaceStats, Quantum};
use netlane::time::{monotonic_ns, sleep_until};
use netlane::udp::gso::GsoLimits;
use netlane::udp::{Batching, GsoMode, Sender, SenderConfig, UdpSocket};

use super::flows::{FlowPlan, FlowSchedule, Flows};
use super::payload::{fill_pattern, stamp, stamp_flow};
use super::{BulkError, PaceReport, PacerRan, TxReport, TxSpec, io_err};

/// A paced flow's send holds about this much of its rate when the quantum is `auto`.
const AUTO_FLOW_QUANTUM_NS: u64 = 1_000_000;

/// Each flow's plan: its datagram size from its peer's path MTU, its share of the rate.
pub(super) fn plans(spec: &TxSpec, flows: &Flows, ipv6: bool) -> Vec<FlowPlan> {
    let limits = GsoLimits::for_family(ipv6);
    let rate = spec.pacing.map(|p| p.rate as f64 / f64::from(flows.count.max(1)));
    let quantum = match spec.pacing.map(|p| p.quantum) {
        Some(Quantum::Fixed(ns)) => ns,
        _ => AUTO_FLOW_QUANTUM_NS,
    };
    (0..flows.count as usize)
        .map(|i| {
            let mtu = flows.mtus[i % flows.mtus.len()] as usize;
            let size = netlane::udp::max_payload_for_mtu(mtu, ipv6);
            let fit = if spec.gso == GsoMode::Off { 1 } else { limits.segments_per_send(size) };
            FlowPlan::new(size, rate, quantum, spec.segments_per_send.min(fit))
        })
        .collect()
}

/// Sends `flows` to `dst` for `spec.duration` (or `spec.limit_bytes`).
pub(super) fn send(spec: &TxSpec, flows: &Flows, dst: SocketAddr, run: u32) -> Result<TxReport, BulkError> {
    let ipv6 = dst.is_ipv6();
    let any: SocketAddr = if ipv6 { (Ipv6Addr::UNSPECIFIED, 0).into() } else { (Ipv4Addr::UNSPECIFIED, 0).into() };
    let mut senders = Vec::with_capacity(flows.sockets as usize);
    for _ in 0..flows.sockets {
        let sock = UdpSocket::bind(any).map_err(io_err(format!("bind a UDP socket for flows to {dst}")))?;
        if let Some(b) = spec.sndbuf {
            sock.set_send_buffer(b).map_err(io_err("set send buffer"))?;
        }
        if spec.gso != GsoMode::Off {
            netlane::sockopt::set_dont_fragment(sock.as_fd(), ipv6).map_err(io_err("set IP_PMTUDISC_DO"))?;
        }
        let cfg = SenderConfig {
            gso: spec.gso,
            batching: Batching::Single,
            zerocopy: false,
            limits: GsoLimits::for_family(ipv6),
            destination: Some(dst),
        };
        senders.push(Sender::new(sock, cfg));
    }
    let plans = plans(spec, flows, ipv6);
    // One buffer per datagram size, its datagrams' patterns laid out back to back.
    let mut bufs: Vec<(usize, Vec<u8>)> = Vec::new();
    for p in &plans {
        let need = p.send_bytes();
        match bufs.iter_mut().find(|(size, _)| *size == p.datagram_size) {
            Some((_, b)) if b.len() >= need => {}
            Some((size, b)) => {
                b.resize(need, 0);
                fill_pattern(b, *size);
            }
            None => {
                let mut b = vec![0u8; need];
                fill_pattern(&mut b, p.datagram_size);
                bufs.push((p.datagram_size, b));
            }
        }
    }
    let mut flow_seq = vec![0u64; plans.len()];
    let (mut seq, mut sends, mut sent_bytes) = (0u64, 0u64, 0u64);
    let limit = spec.limit_bytes.unwrap_or(u64::MAX);

    let cpu0 = thread_cpu();
    let t0 = monotonic_ns();
    let end_at = t0 + spec.duration.as_nanos() as u64;
    let mut schedule = FlowSchedule::new(&plans, t0);
    let mut now = t0;
    while let Some((flow, due)) = schedule.poll_next() {
        if due > now {
            if due >= end_at {
                break;
            }
            sleep_until(due);
            now = monotonic_ns();
        } else if sends % 64 == 0 {
            now = monotonic_ns();
        }
        if now >= end_at || sent_bytes >= limit {
            break;
        }
        let i = flow as usize;
        let plan = plans[i];
        let (_, buf) = bufs.iter_mut().find(|(size, _)| *size == plan.datagram_size).expect("a buffer per size");
        let train = &mut buf[..plan.send_bytes()];
        stamp(train, plan.datagram_size, run, seq, plan.segments);
        stamp_flow(train, plan.datagram_size, flow, flow_seq[i], plan.segments);
        let socket = i % senders.len();
        let r = senders[socket].send(train, plan.datagram_size, None)?;
        seq += r.datagrams;
        flow_seq[i] += r.datagrams;
        sent_bytes += r.bytes;
        sends += 1;
        schedule.handle_sent(flow, due, now);
    }
    let end = monotonic_ns();
    let seconds = (end - t0) as f64 / 1e9;
    let mut report = TxReport { seconds, cpu: thread_cpu() - cpu0, ..TxReport::default() };
    for s in &senders {
        let st = s.stats();
        report.datagrams += st.datagrams;
        report.bytes += st.bytes;
        report.syscalls += st.syscalls;
        report.gso_fallbacks += st.gso_fallbacks;
        report.gso_resent += st.gso_resent_datagrams;
    }
    report.path = describe(spec, flows, &plans);
    report.pacing = spec.pacing.map(|p| {
        let achieved = report.bytes as f64 / seconds;
        PaceReport {
            pacer: PacerRan::User,
            target_rate_bytes_per_s: p.rate,
            achieved_rate_bytes_per_s: achieved,
            accuracy: achieved / p.rate as f64,
            // No one release period: each flow has its own (the path lines say the first's).
            quantum_ns: 0,
            segments_per_release: plans.iter().map(|f| f.segments as f64).sum::<f64>() / plans.len().max(1) as f64,
            stats: PaceStats {
                releases: sends,
                segments: report.datagrams,
                catchups: schedule.restarted,
                forgiven_segments: 0,
            },
            ..PaceReport::default()
        }
    });
    Ok(report)
}

/// The path lines of a many-flow run.
fn describe(spec: &TxSpec, flows: &Flows, plans: &[FlowPlan]) -> Vec<String> {
    let mut sizes: Vec<usize> = plans.iter().map(|p| p.datagram_size).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let sizes: Vec<String> = sizes.iter().map(|s| format!("{s} B")).collect();
    let gso = match spec.gso {
        GsoMode::Off => "one sendmsg per datagram",
        GsoMode::Cmsg => "a UDP_SEGMENT cmsg per send",
        GsoMode::Sockopt => "UDP_SEGMENT by socket option",
    };
    let mut path = vec![format!(
        "flows: {} from {} unconnected sockets, in turn, {gso}; datagrams of {} (path MTUs {})",
        flows.count,
        flows.sockets,
        sizes.join(", "),
        flows.mtus.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
    )];
    match (spec.pacing, plans.first()) {
        (Some(p), Some(f)) => path.push(format!(
            "pacing: user-space, each flow at {:.0} B/s: {} datagram(s) every {}",
            p.rate as f64 / f64::from(flows.count.max(1)),
            f.segments,
            netlane::metrics::units::format_duration(std::time::Duration::from_nanos(f.period_ns))
        )),
        _ => path.push("unpaced: flows served in turn as fast as the sockets take them".into()),
    }
    path
}

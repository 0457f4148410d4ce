//! The UDP bulk sender: trains of datagrams through a [`Sender`], unpaced or paced,
//! copying or zerocopy.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use super::jobs::{ChosenPacer, TxClock};
use super::payload::{fill_pattern, stamp};
use super::{BulkError, PaceReport, PacerRan, Pacing, TxReport, TxSpec, io_err};
use netlane::memory::Ask;
use netlane::metrics::Hist;
use netlane::metrics::cpu::thread_cpu;
use netlane::pace::{self, PaceConfig, Pacer};
use netlane::time::{monotonic_ns, sleep_until};
use netlane::udp::gso::GsoLimits;
use netlane::udp::{Batching, GsoMode, SendError, Sender, SenderConfig, UdpSocket};
use netlane::zerocopy::{self, OtherRecords, Tracker, ZerocopyStats};

/// Buffers in flight with MSG_ZEROCOPY at most: each is one train, owned by the kernel
/// until its completion arrives (a payload span has more buffers, not more in flight).
const ZEROCOPY_POOL: usize = 64;
/// How long to wait for the last zerocopy completions at the end.
const ZEROCOPY_DRAIN_NS: u64 = 2_000_000_000;
/// Consecutive "port unreachable" answers tolerated before giving up.
const MAX_REFUSED: u64 = 1000;
/// After the last release time, how long the qdisc's timer is given before its errors
/// are read.
const TXTIME_SETTLE_NS: u64 = 2_000_000;
/// Sends fq may hold for an fq-rate sender at most: fq drops a flow's packets beyond its
/// `flow_limit` (100 by default), so the socket's send buffer is sized to block the
/// sender well before.
const FQ_RATE_SENDS_QUEUED: usize = 48;

/// Releases between reads of the error queue for txtime errors.
const TXTIME_REAP_RELEASES: u64 = 16;

/// SO_TXTIME release times: one train's time apart, never before a time already given
/// (etf drops those), and never less than `lead_ns` ahead of now.
#[derive(Debug, Clone, Copy)]
struct ReleaseTimes {
    cursor: u64,
    lead_ns: u64,
    /// The release times' clock minus CLOCK_MONOTONIC, nanoseconds.
    offset_ns: u64,
}

impl ReleaseTimes {
    fn on(clock: TxClock, lead_ns: u64) -> Result<ReleaseTimes, BulkError> {
        let offset_ns = match clock {
            TxClock::Monotonic => 0,
            TxClock::Tai => {
                let tai = nix::time::clock_gettime(nix::time::ClockId::CLOCK_TAI)
                    .map_err(|e| io_err("read CLOCK_TAI")(e.into()))?;
                let tai_ns = tai.tv_sec() as u64 * 1_000_000_000 + tai.tv_nsec() as u64;
                tai_ns.saturating_sub(monotonic_ns())
            }
        };
        Ok(ReleaseTimes { cursor: 0, lead_ns, offset_ns })
    }

    /// The release time of the next train, due at `deadline` (CLOCK_MONOTONIC) and
    /// taking `train_ns` at the rate, on the qdisc's clock.
    fn next(&mut self, deadline: u64, now: u64, train_ns: u64) -> u64 {
        self.cursor = self.cursor.max(deadline).max(now + self.lead_ns);
        let t = self.cursor;
        self.cursor += train_ns;
        t + self.offset_ns
    }

    /// When (CLOCK_MONOTONIC) the last release time given has passed.
    fn last_monotonic(&self) -> u64 {
        self.cursor
    }
}

struct State {
    sender: Sender<UdpSocket>,
    /// One send's worth each: the span the sends take in turn.
    bufs: Vec<Vec<u8>>,
    /// Buffers free to send from, oldest first: taken in turn, each is as far from
    /// the cache as the span makes it.
    free: VecDeque<usize>,
    tracker: Tracker<Option<usize>>,
    other_errqueue: OtherRecords,
    errqueue_calls: u64,
    sends_since_drain: u32,
    refused: u64,
    seq: u64,
    run: u32,
    datagram_size: usize,
}

impl State {
    /// Reads completions and returns finished buffers to the free list.
    fn reap(&mut self) -> io::Result<()> {
        self.errqueue_calls += 1;
        zerocopy::drain_errqueue(self.sender.io().as_fd(), &mut self.tracker, &mut self.other_errqueue)?;
        while let Some(token) = self.tracker.pop_completed() {
            if let Some(idx) = token {
                self.free.push_back(idx);
            }
        }
        Ok(())
    }

    /// Waits (poll for POLLERR) until a buffer is free and fewer than
    /// [`ZEROCOPY_POOL`] are in flight.
    fn acquire(&mut self) -> Result<usize, BulkError> {
        loop {
            let in_flight = self.bufs.len() - self.free.len();
            if in_flight < ZEROCOPY_POOL
                && let Some(idx) = self.free.pop_front()
            {
                return Ok(idx);
            }
            self.reap().map_err(io_err("read zerocopy completions"))?;
            if self.free.is_empty() || self.bufs.len() - self.free.len() >= ZEROCOPY_POOL {
                let fd = self.sender.io().as_fd();
                let mut fds = [PollFd::new(fd, PollFlags::empty())];
                self.errqueue_calls += 1;
                match poll(&mut fds, PollTimeout::from(100u16)) {
                    Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                    Err(e) => return Err(io_err("poll for zerocopy completions")(e.into())),
                }
            }
        }
    }

    /// Sends `n` datagrams as one train (GSO) or as the sender's fallback.
    fn send_train(&mut self, n: usize, txtime: Option<u64>) -> Result<(), BulkError> {
        // Copying sends take the buffers in turn too: the kernel is done with a buffer
        // when the send returns.
        let idx = self.acquire()?;
        let ds = self.datagram_size;
        let buf = &mut self.bufs[idx][..n * ds];
        stamp(buf, ds, self.run, self.seq, n);
        let report = loop {
            match self.sender.send(&self.bufs[idx][..n * ds], ds, txtime) {
                Ok(r) => break r,
                Err(SendError::Io(e)) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
                    // An ICMP port-unreachable from an earlier datagram; this send did
                    // not go out (the pending error failed it), so repeat it.
                    self.refused += 1;
                    if self.refused > MAX_REFUSED {
                        return Err(BulkError::Config("the receiver's port keeps refusing datagrams".into()));
                    }
                }
                Err(e) => return Err(e.into()),
            }
        };
        self.seq += n as u64;
        if report.zerocopy_sends > 0 {
            for _ in 1..report.zerocopy_sends {
                self.tracker.on_send(None);
            }
            self.tracker.on_send(Some(idx));
            self.sends_since_drain += 1;
            if self.sends_since_drain >= 16 {
                self.sends_since_drain = 0;
                self.reap().map_err(io_err("read zerocopy completions"))?;
            }
        } else {
            self.free.push_back(idx);
        }
        Ok(())
    }

    /// Sends as fast as it can until `end_at` or `limit` bytes; returns the seconds it took.
    fn send_flat(&mut self, limit: u64, per_send: usize, t0: u64, end_at: u64) -> Result<f64, BulkError> {
        // Read the clock about once per 64 datagrams: per datagram it would be a
        // measurable share of a plain sender's user-space work.
        let trains_per_check = (64 / per_send).max(1);
        'sending: while monotonic_ns() < end_at {
            for _ in 0..trains_per_check {
                if self.sender.stats().bytes >= limit {
                    break 'sending;
                }
                self.send_train(per_send, None)?;
            }
        }
        Ok((monotonic_ns() - t0) as f64 / 1e9)
    }

    /// Sends what the pacer releases until `end_at`, each release's trains stamped with
    /// release times on `clock` (from the lead given ahead of now) when the kernel paces;
    /// returns the seconds it took and how well it kept the rate.
    fn send_paced(
        &mut self,
        p: Pacing,
        per_send: usize,
        clock: Option<(TxClock, u64)>,
        t0: u64,
        end_at: u64,
    ) -> Result<(f64, PaceReport), BulkError> {
        let ds = self.datagram_size;
        let cfg = PaceConfig { quantum: p.quantum, ..PaceConfig::new(p.rate, ds, per_send) };
        let mut pacer = Pacer::new(cfg, t0).map_err(|e| BulkError::Config(e.to_string()))?;
        let mut lateness = Hist::new();
        // Time one train takes at the target rate, to spread trains of a release
        // with SO_TXTIME.
        let train_ns = cfg.send_time_ns();
        let mut times = clock.map(|(c, lead)| ReleaseTimes::on(c, lead)).transpose()?;
        while pacer.next_deadline() < end_at {
            let deadline = pacer.next_deadline();
            sleep_until(deadline);
            let now = monotonic_ns();
            let release = pacer.release(now);
            lateness.record(release.late_ns);
            for n in pace::sends(release.segments, per_send) {
                let t = times.as_mut().map(|t| t.next(release.deadline_ns, now, train_ns));
                self.send_train(n, t)?;
            }
            if times.is_some() && pacer.stats().releases % TXTIME_REAP_RELEASES == 0 {
                self.reap().map_err(io_err("read txtime errors"))?;
            }
        }
        // The schedule covers up to its next deadline; if sending fell behind, the
        // real end is later and the achieved rate says so.
        let end = monotonic_ns().max(pacer.next_deadline());
        let seconds = (end - t0) as f64 / 1e9;
        if let Some(t) = times {
            // The qdisc reports a dropped send when the send's time comes: wait for the
            // last, and a little for the qdisc's timer.
            sleep_until(t.last_monotonic() + TXTIME_SETTLE_NS);
            self.reap().map_err(io_err("read txtime errors"))?;
        }
        let achieved = self.sender.stats().bytes as f64 / seconds;
        let q = pacer.quantum_ns();
        let report = PaceReport {
            target_rate_bytes_per_s: p.rate,
            achieved_rate_bytes_per_s: achieved,
            accuracy: achieved / p.rate as f64,
            quantum_ns: q,
            segments_per_release: p.rate as f64 * q as f64 / 1e9 / ds as f64,
            lateness_ns: lateness.summary(),
            stats: pacer.stats(),
            txtime_missed: self.other_errqueue.txtime_missed,
            txtime_refused: self.other_errqueue.txtime_refused,
            ..PaceReport::default()
        };
        Ok((seconds, report))
    }

    /// Waits (a bounded time) for every zerocopy send to complete, and counts them.
    fn drain_zerocopy(&mut self) -> Result<ZerocopyStats, BulkError> {
        let give_up = monotonic_ns() + ZEROCOPY_DRAIN_NS;
        self.reap().map_err(io_err("read zerocopy completions"))?;
        while !self.tracker.all_completed() && monotonic_ns() < give_up {
            let fd = self.sender.io().as_fd();
            let mut fds = [PollFd::new(fd, PollFlags::empty())];
            let _ = poll(&mut fds, PollTimeout::from(50u16));
            self.reap().map_err(io_err("read zerocopy completions"))?;
        }
        let z = self.tracker.stats();
        if !self.tracker.all_completed() || z.unexpected > 0 {
            tracing::warn!(?z, "zerocopy completions do not match the sends");
        }
        Ok(z)
    }
}

/// Sends to `dst` for `spec.duration`.
pub(super) fn send(
    spec: &TxSpec,
    dst: SocketAddr,
    ipv6: bool,
    run: u32,
    pacer: Option<&ChosenPacer>,
) -> Result<TxReport, BulkError> {
    let sock = UdpSocket::connect_to(dst).map_err(io_err(format!("connect UDP socket to {dst}")))?;
    if let Some(b) = spec.sndbuf {
        sock.set_send_buffer(b).map_err(io_err("set send buffer"))?;
    }
    let mut path = Vec::new();
    if spec.gso != GsoMode::Off {
        // A segment above the path MTU must fail (EMSGSIZE), not be fragmented.
        netlane::sockopt::set_dont_fragment(sock.as_fd(), ipv6).map_err(io_err("set IP_PMTUDISC_DO"))?;
    }
    if spec.zerocopy {
        sock.enable_zerocopy().map_err(io_err("enable SO_ZEROCOPY"))?;
    }
    configure_pacer(&sock, spec, pacer, ipv6)?;
    let ds = spec.datagram_size;
    let per_send = spec.segments_per_send.max(1);
    let cfg = SenderConfig {
        gso: spec.gso,
        batching: spec.batching,
        zerocopy: spec.zerocopy,
        limits: GsoLimits::for_family(ipv6).with_max_segments(per_send),
        destination: None,
    };
    let send_bytes = per_send * ds;
    let pool = match spec.payload_span {
        Some(span) => {
            Ask::new().add("the sender's payload span", span as u64).check()?;
            (span / send_bytes).max(1)
        }
        None if spec.zerocopy => ZEROCOPY_POOL,
        None => 1,
    };
    let bufs: Vec<Vec<u8>> = (0..pool)
        .map(|_| {
            let mut b = vec![0u8; send_bytes];
            fill_pattern(&mut b, ds);
            b
        })
        .collect();
    let mut st = State {
        sender: Sender::new(sock, cfg),
        bufs,
        free: (0..pool).collect(),
        tracker: Tracker::new(),
        other_errqueue: OtherRecords::default(),
        errqueue_calls: 0,
        sends_since_drain: 0,
        refused: 0,
        seq: 0,
        run,
        datagram_size: ds,
    };

    // The sender's CPU counts from here: filling a span of many megabytes is set-up.
    let cpu0 = thread_cpu();
    let t0 = monotonic_ns();
    let end_at = t0 + spec.duration.as_nanos() as u64;
    let (seconds, pacing_report) = match spec.pacing {
        None => (st.send_flat(spec.limit_bytes.unwrap_or(u64::MAX), per_send, t0, end_at)?, None),
        Some(p) => {
            let chosen = pacer.ok_or_else(|| BulkError::Config("a paced sender needs a chosen pacer".into()))?;
            let (seconds, mut report) = match chosen.ran {
                PacerRan::FqRate => {
                    let seconds = st.send_flat(u64::MAX, per_send, t0, end_at)?;
                    let achieved = st.sender.stats().bytes as f64 / seconds;
                    let report = PaceReport {
                        target_rate_bytes_per_s: p.rate,
                        achieved_rate_bytes_per_s: achieved,
                        accuracy: achieved / p.rate as f64,
                        ..PaceReport::default()
                    };
                    (seconds, report)
                }
                PacerRan::User | PacerRan::Txtime => {
                    st.send_paced(p, per_send, chosen.clock.map(|c| (c, chosen.lead_ns)), t0, end_at)?
                }
            };
            path.extend(describe_pacer(chosen, report.quantum_ns));
            report.pacer = chosen.ran;
            report.qdisc = chosen.qdisc.clone();
            report.txtime_clock = chosen.clock.map(|c| c.name().to_string());
            (seconds, Some(report))
        }
    };
    let zc_stats = if spec.zerocopy { Some(st.drain_zerocopy()?) } else { None };

    let stats = st.sender.stats();
    path.insert(0, describe_path(spec, &st.sender));
    Ok(TxReport {
        datagrams: stats.datagrams,
        bytes: stats.bytes,
        syscalls: stats.syscalls + st.errqueue_calls,
        seconds,
        cpu: thread_cpu() - cpu0,
        path,
        gso_fallbacks: stats.gso_fallbacks,
        gso_resent: stats.gso_resent_datagrams,
        zerocopy_fallbacks: stats.zerocopy_fallbacks,
        zerocopy: zc_stats,
        refused: st.refused,
        pacing: pacing_report,
        kernel_drops: 0,
    })
}

/// The socket options a kernel pacer needs: SO_TXTIME on the qdisc's clock, or fq's
/// pacing rate and a send buffer small enough for fq's per-flow limit.
fn configure_pacer(sock: &UdpSocket, spec: &TxSpec, pacer: Option<&ChosenPacer>, ipv6: bool) -> Result<(), BulkError> {
    if let Some(c) = pacer.and_then(|c| c.clock) {
        let set = match c {
            TxClock::Monotonic => netlane::sockopt::set_txtime_monotonic(sock.as_fd()),
            TxClock::Tai => netlane::sockopt::set_txtime_tai(sock.as_fd()),
        };
        set.map_err(io_err("enable SO_TXTIME"))?;
    }
    if let (Some(p), Some(ChosenPacer { ran: PacerRan::FqRate, .. })) = (spec.pacing, pacer) {
        // fq counts a packet's bytes from its Ethernet header on.
        let overhead = 14 + if ipv6 { 40 } else { 20 } + 8;
        let wire = (p.rate as u128 * (spec.datagram_size + overhead) as u128 / spec.datagram_size as u128) as u64;
        netlane::sockopt::set_max_pacing_rate(sock.as_fd(), wire).map_err(io_err("set SO_MAX_PACING_RATE"))?;
        if spec.sndbuf.is_none() {
            let send = spec.segments_per_send.max(1) * spec.datagram_size + 1024;
            // The kernel doubles the size asked, and charges each send its buffer's
            // overhead besides its bytes. Less than this starves fq wherever the sender
            // wakes late (seen in an emulated guest at 0.65x the rate).
            sock.set_send_buffer(FQ_RATE_SENDS_QUEUED * send / 2).map_err(io_err("set send buffer"))?;
        }
    }
    Ok(())
}

/// What paced the sender, as the report's path lines say it.
fn describe_pacer(chosen: &ChosenPacer, quantum_ns: u64) -> Vec<String> {
    let quantum = netlane::metrics::units::format_duration(std::time::Duration::from_nanos(quantum_ns));
    let q = &chosen.qdisc;
    match (chosen.ran, &chosen.user_because) {
        (PacerRan::FqRate, _) => vec![format!("pacing: {q} at the socket's SO_MAX_PACING_RATE")],
        (PacerRan::Txtime, _) => vec![
            format!("pacing: SO_TXTIME release times, {q} holds each send until its time"),
            format!("pacing quantum: {quantum}"),
        ],
        (PacerRan::User, Some(why)) => {
            vec![format!("txtime: unsupported ({why}) -> user-space pacer"), format!("pacing quantum: {quantum}")]
        }
        (PacerRan::User, None) => vec!["pacing: user-space pacer".into(), format!("pacing quantum: {quantum}")],
    }
}

fn describe_path(spec: &TxSpec, sender: &Sender<UdpSocket>) -> String {
    let stats = sender.stats();
    let mut s = match spec.gso {
        GsoMode::Off => match spec.batching {
            Batching::Single => "udp: sendmsg per datagram".to_string(),
            Batching::Mmsg => format!("udp: sendmmsg x{}", spec.segments_per_send),
        },
        GsoMode::Cmsg => format!("gso: UDP_SEGMENT cmsg, {} x {} B", spec.segments_per_send, spec.datagram_size),
        GsoMode::Sockopt => format!("gso: UDP_SEGMENT sockopt, {} x {} B", spec.segments_per_send, spec.datagram_size),
    };
    if stats.gso_fallbacks > 0 {
        s.push_str(&format!(
            " -> GSO failed, fell back to individual datagrams ({} resent)",
            stats.gso_resent_datagrams
        ));
    }
    if let Some(span) = spec.payload_span {
        s.push_str(&format!("; payload from a {} span", netlane::memory::human(span as u64)));
    }
    if spec.zerocopy {
        if stats.zerocopy_fallbacks > 0 {
            s.push_str("; MSG_ZEROCOPY -> ENOBUFS, fell back to copy");
        } else {
            s.push_str("; MSG_ZEROCOPY");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_times_are_spread_never_go_back_and_never_lie_in_the_past() {
        let mut t = ReleaseTimes { cursor: 0, lead_ns: 500, offset_ns: 1_000_000 };
        // On time: one train's time apart from the deadline on, on the qdisc's clock.
        assert_eq!(t.next(10_000, 9_000, 100), 1_010_000);
        assert_eq!(t.next(10_000, 9_000, 100), 1_010_100);
        // A release due before the last time given starts after it (etf drops a time
        // before one it sent).
        assert_eq!(t.next(10_050, 9_100, 100), 1_010_200);
        // Woken late: never less than the lead ahead of now.
        assert_eq!(t.next(10_300, 20_000, 100), 1_020_500);
        assert_eq!(t.last_monotonic(), 20_600);
    }
}

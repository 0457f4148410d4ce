//! The UDP bulk sender: trains of datagrams through a [`Sender`], unpaced or paced,
//! copying or zerocopy.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use super::payload::{fill_pattern, stamp};
use super::{BulkError, PaceReport, Pacing, TxReport, TxSpec, Txtime, io_err};
use netlane::memory::Ask;
use netlane::metrics::Hist;
use netlane::metrics::cpu::thread_cpu;
use netlane::pace::{self, PaceConfig, Pacer};
use netlane::time::{monotonic_ns, sleep_until};
use netlane::udp::gso::GsoLimits;
use netlane::udp::{Batching, GsoMode, SendError, Sender, SenderConfig, UdpSocket};
use netlane::zerocopy::{self, Tracker, ZerocopyStats};

/// Buffers in flight with MSG_ZEROCOPY at most: each is one train, owned by the kernel
/// until its completion arrives (a payload span has more buffers, not more in flight).
const ZEROCOPY_POOL: usize = 64;
/// How long to wait for the last zerocopy completions at the end.
const ZEROCOPY_DRAIN_NS: u64 = 2_000_000_000;
/// Consecutive "port unreachable" answers tolerated before giving up.
const MAX_REFUSED: u64 = 1000;

struct State {
    sender: Sender<UdpSocket>,
    /// One send's worth each: the span the sends take in turn.
    bufs: Vec<Vec<u8>>,
    /// Buffers free to send from, oldest first: taken in turn, each is as far from
    /// the cache as the span makes it.
    free: VecDeque<usize>,
    tracker: Tracker<Option<usize>>,
    other_errqueue: u64,
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
    /// release times when the kernel paces (`use_txtime`); returns the seconds it took
    /// and how well it kept the rate.
    fn send_paced(
        &mut self,
        p: Pacing,
        per_send: usize,
        use_txtime: bool,
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
        while pacer.next_deadline() < end_at {
            let deadline = pacer.next_deadline();
            sleep_until(deadline);
            let now = monotonic_ns();
            let release = pacer.release(now);
            lateness.record(release.late_ns);
            for (i, n) in pace::sends(release.segments, per_send).enumerate() {
                let t = use_txtime.then(|| release.deadline_ns + i as u64 * train_ns);
                self.send_train(n, t)?;
            }
        }
        // The schedule covers up to its next deadline; if sending fell behind, the
        // real end is later and the achieved rate says so.
        let end = monotonic_ns().max(pacer.next_deadline());
        let seconds = (end - t0) as f64 / 1e9;
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
    txtime: &Txtime,
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
    let use_txtime = spec.pacing.is_some() && *txtime == Txtime::Kernel;
    if use_txtime {
        netlane::sockopt::set_txtime_monotonic(sock.as_fd()).map_err(io_err("enable SO_TXTIME"))?;
    }
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
        other_errqueue: 0,
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
            let (seconds, report) = st.send_paced(p, per_send, use_txtime, t0, end_at)?;
            path.push(match txtime {
                Txtime::Kernel => "pacing: SO_TXTIME release times (qdisc paces)".to_string(),
                Txtime::Unsupported(why) => format!("txtime: unsupported ({why}) -> user-space pacer"),
            });
            path.push(format!(
                "pacing quantum: {}",
                netlane::metrics::units::format_duration(std::time::Duration::from_nanos(report.quantum_ns))
            ));
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
    })
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

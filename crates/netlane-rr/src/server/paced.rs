//! Paced responses: instead of answering a batch of requests with a burst that wakes
//! every waiting client at once (the talk's "stampeding herd"), responses wait in a
//! bounded queue and leave on the `netlane::pace` schedule, a few per release, each
//! release one `sendmmsg` with a destination per response. A timerfd (nanosecond
//! deadlines, absolute on CLOCK_MONOTONIC) wakes the server for the next release.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

use netlane::pace::{PaceConfig, Pacer, Quantum};
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use nix::time::{ClockId as Clock, clock_gettime};
use serde::{Deserialize, Serialize};
use socket2::SockAddr;

/// How responses are paced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PaceOptions {
    /// Responses per second, server-wide.
    pub rate: u64,
    /// Time between releases.
    pub quantum: Duration,
    /// Most responses waiting; past it a response is dropped (the client asks again).
    pub queue: usize,
}

impl Default for PaceOptions {
    fn default() -> Self {
        PaceOptions { rate: 100_000, quantum: Duration::from_micros(100), queue: 4096 }
    }
}

/// Bounds of the pacing options.
pub const MAX_PACE_RATE: u64 = 10_000_000;
/// The largest response queue.
pub const MAX_PACE_QUEUE: usize = 65_536;

impl PaceOptions {
    /// Checks the options.
    pub fn check(&self) -> Result<(), String> {
        if !(1..=MAX_PACE_RATE).contains(&self.rate) {
            return Err(format!("pacing rate {}: 1..={MAX_PACE_RATE} responses per second", self.rate));
        }
        if !(Duration::from_micros(10)..=Duration::from_millis(100)).contains(&self.quantum) {
            return Err(format!("pacing quantum {:?}: 10 us to 100 ms", self.quantum));
        }
        if !(1..=MAX_PACE_QUEUE).contains(&self.queue) {
            return Err(format!("pacing queue {}: 1..={MAX_PACE_QUEUE} responses", self.queue));
        }
        Ok(())
    }
}

/// What pacing did.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PaceReport {
    /// Target responses per second.
    pub rate: u64,
    /// Microseconds between releases.
    pub quantum_us: f64,
    /// Releases that sent something.
    pub releases: u64,
    /// Responses sent.
    pub sent: u64,
    /// `sendmmsg` calls.
    pub sendmmsg_calls: u64,
    /// Most responses waiting at once.
    pub queue_max: usize,
    /// Responses dropped because the queue was full.
    pub queue_full_drops: u64,
    /// Responses the kernel refused to send (dropped).
    pub send_errors: u64,
    /// Mean microseconds a response waited in the queue.
    pub mean_wait_us: f64,
    /// Longest wait, microseconds.
    pub max_wait_us: f64,
}

struct Pending {
    to: SockAddr,
    len: usize,
    buf: Vec<u8>,
    queued_ns: u64,
}

/// The paced response queue.
pub(crate) struct Paced {
    pacer: Pacer,
    cfg: PaceConfig,
    opts: PaceOptions,
    queue: VecDeque<Pending>,
    free: Vec<Vec<u8>>,
    timer: TimerFd,
    armed_for: Option<u64>,
    waited_ns: u128,
    bytes_sent: u64,
    report: PaceReport,
}

fn now_ns() -> u64 {
    clock_gettime(Clock::CLOCK_MONOTONIC).map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64).unwrap_or(0)
}

impl Paced {
    pub(crate) fn new(opts: PaceOptions) -> io::Result<Paced> {
        opts.check().map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // A release carries one response at least: below that rate the quantum
        // stretches (the timer would otherwise fire every quantum with nothing to send).
        let quantum_ns = (opts.quantum.as_nanos() as u64).max(1_000_000_000u64.div_ceil(opts.rate));
        let opts = PaceOptions { quantum: Duration::from_nanos(quantum_ns), ..opts };
        let cfg = PaceConfig {
            rate: opts.rate,
            quantum: Quantum::Fixed(quantum_ns),
            segment_size: 1,
            segments_per_send: netlane_sys::msg::MAX_MMSG,
            // A late release sends at most one quantum's worth: making up more (tried:
            // 1 ms) sends the bursts pacing is there to avoid (measured: twice the
            // clients woken in herds). Idle time earns nothing either: the schedule
            // restarts when a response finds the queue empty (`push`).
            max_catchup_ns: quantum_ns,
        };
        let pacer = Pacer::new(cfg, now_ns()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let timer = TimerFd::new(ClockId::CLOCK_MONOTONIC, TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC)
            .map_err(io::Error::from)?;
        Ok(Paced {
            pacer,
            cfg,
            opts,
            queue: VecDeque::new(),
            free: Vec::new(),
            timer,
            armed_for: None,
            waited_ns: 0,
            bytes_sent: 0,
            report: PaceReport { rate: opts.rate, quantum_us: quantum_ns as f64 / 1e3, ..PaceReport::default() },
        })
    }

    /// The timer descriptor to wait on.
    pub(crate) fn timer_fd(&self) -> BorrowedFd<'_> {
        self.timer.as_fd()
    }

    /// Queues a response; false when the queue is full (dropped, counted).
    pub(crate) fn push(&mut self, data: &[u8], to: SocketAddr) -> bool {
        if self.queue.len() >= self.opts.queue {
            self.report.queue_full_drops += 1;
            return false;
        }
        let now = now_ns();
        if self.queue.is_empty() && now >= self.pacer.next_deadline() {
            // Nothing waited and the last release's quantum is over: no debt to make up,
            // so a burst after an idle spell gets one quantum's worth, not the catch-up.
            if let Ok(p) = Pacer::new(self.cfg, now) {
                self.pacer = p;
            }
        }
        let mut buf = self.free.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(data);
        self.queue.push_back(Pending { to: SockAddr::from(to), len: data.len(), buf, queued_ns: now });
        self.report.queue_max = self.report.queue_max.max(self.queue.len());
        true
    }

    /// Sends what the schedule allows now (what a full socket buffer refuses stays
    /// queued), and arms the timer for the next release while responses wait.
    pub(crate) fn release(&mut self, sock: &UdpSocket) -> io::Result<()> {
        // Consume a timer expiry, if any (non-blocking).
        let _ = self.timer.wait();
        self.armed_for = None;
        if self.queue.is_empty() {
            return Ok(());
        }
        let now = now_ns();
        if now >= self.pacer.next_deadline() {
            let allowed = self.pacer.release(now).segments as usize;
            if allowed > 0 {
                self.report.releases += 1;
                self.send_front(sock, allowed);
            }
        }
        self.arm()
    }

    /// Sends up to `count` responses from the front of the queue, a `sendmmsg` per 64,
    /// until the socket buffer is full; a response the kernel refuses is dropped
    /// (counted) so one bad destination cannot hold up the others. Returns how many
    /// left the queue.
    fn send_front(&mut self, sock: &UdpSocket, count: usize) -> usize {
        let mut left = count.min(self.queue.len());
        let mut done = 0;
        while left > 0 {
            let n = left.min(netlane_sys::msg::MAX_MMSG);
            let batch: Vec<(SockAddr, IoSlice<'_>)> =
                self.queue.iter().take(n).map(|p| (p.to.clone(), IoSlice::new(&p.buf[..p.len]))).collect();
            self.report.sendmmsg_calls += 1;
            let sent = match netlane_sys::msg::sendmmsg_each(sock.as_fd(), &batch, libc::MSG_DONTWAIT) {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    // The first response is the one the kernel refused.
                    tracing::debug!(error = %e, "paced send refused");
                    if let Some(p) = self.queue.pop_front() {
                        self.free.push(p.buf);
                    }
                    self.report.send_errors += 1;
                    left -= 1;
                    done += 1;
                    continue;
                }
            };
            let t = now_ns();
            for p in self.queue.drain(..sent.min(n)) {
                let w = t.saturating_sub(p.queued_ns);
                self.waited_ns += u128::from(w);
                self.report.max_wait_us = self.report.max_wait_us.max(w as f64 / 1e3);
                self.bytes_sent += p.len as u64;
                self.free.push(p.buf);
            }
            self.report.sent += sent as u64;
            done += sent;
            if sent < n {
                break;
            }
            left -= n;
        }
        done
    }

    fn arm(&mut self) -> io::Result<()> {
        if self.queue.is_empty() {
            return Ok(());
        }
        let at = self.pacer.next_deadline();
        if self.armed_for == Some(at) {
            return Ok(());
        }
        let ts = TimeSpec::new((at / 1_000_000_000) as i64, (at % 1_000_000_000) as i64);
        self.timer.set(Expiration::OneShot(ts), TimerSetTimeFlags::TFD_TIMER_ABSTIME).map_err(io::Error::from)?;
        self.armed_for = Some(at);
        Ok(())
    }

    /// Bytes of the responses sent.
    pub(crate) fn bytes_sent(&self) -> u64 {
        self.bytes_sent
    }

    /// At stop: sends everything still waiting, off the schedule (up to a second while
    /// the socket buffer is full); returns how many could not be sent.
    pub(crate) fn finish(&mut self, sock: &UdpSocket) -> usize {
        let deadline = std::time::Instant::now() + Duration::from_secs(1);
        while !self.queue.is_empty() && std::time::Instant::now() < deadline {
            if self.send_front(sock, self.queue.len()) == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        self.queue.len()
    }

    pub(crate) fn report(&self) -> PaceReport {
        let mut r = self.report.clone();
        if r.sent > 0 {
            r.mean_wait_us = self.waited_ns as f64 / r.sent as f64 / 1e3;
        }
        r
    }
}

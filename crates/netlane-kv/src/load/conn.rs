//! One connection's load: its schedule, the workload and the codec, for a driver that
//! owns the socket and the clock.
//!
//! The driver's loop, for each of its connections:
//! 1. wait until [`Connection::next_due`] or until the socket is readable;
//! 2. [`Connection::poll_transmit`] appends every request due by `now` to the output buffer; write
//!    it to the socket (what the socket does not take is written first next time: a
//!    request counts as sent when it is handed to the buffer);
//! 3. [`Connection::handle_input`] every read; on an error, or when the socket fails, close it,
//!    call [`Connection::handle_disconnect`] and reconnect: the schedule goes on, and requests
//!    that fell due meanwhile go out late on the new socket, measured from their schedule;
//! 4. at the window's end no request is due any more; keep receiving for a drain period
//!    at least as long as the SLA's latency (a request still unanswered then has missed
//!    the SLA anyway), then [`Connection::finish`].
//!
//! In open loop at most `max_in_flight` requests are outstanding (a bound on memory, and
//! on what a stalled server can make the generator queue): when it is reached
//! `next_due` is `None` until a reply frees a slot, and the requests that fell due go
//! out late, still measured from their schedule. Nothing is ever skipped.

use super::codec::{Codec, ProtocolError};
use super::rng::Rng;
use super::schedule::{Pacing, Schedule, ScheduleError};
use super::stats::Stats;
use super::workload::{Key, Workload};

/// What a connection runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConnConfig {
    /// Open loop at a rate, or closed loop at a depth.
    pub pacing: Pacing,
    /// The window's start, ns on the driver's clock.
    pub start_ns: u64,
    /// The window's end: nothing is scheduled at or after it.
    pub end_ns: u64,
    /// Most requests in flight (a closed loop also stops at its depth).
    pub max_in_flight: u32,
    /// A request sent more than this after its scheduled time counts as late.
    pub late_after_ns: u64,
    /// Requests scheduled before this time (ns) are sent and answered but not counted:
    /// the ramp that lets connections and caches settle. A ramp request still in flight
    /// at the end or lost with its connection counts as failed like any other.
    pub measure_from_ns: u64,
    /// The largest value a reply may carry (the server's item limit).
    pub max_value_len: u32,
}

/// One connection's requests.
#[derive(Debug)]
pub struct Connection {
    schedule: Schedule,
    workload: Workload,
    rng: Rng,
    codec: Codec,
    /// A get's keys, reused.
    keys: Vec<Key>,
    max_in_flight: usize,
    late_after_ns: u64,
    measure_from_ns: u64,
    /// When a slot last came free on a full connection: a request due before it could
    /// not go earlier, so its wait until then is the server's, not the generator's.
    slot_free_at: u64,
}

impl Connection {
    /// A connection drawing its schedule and its requests from `rng` (one stream per
    /// connection: [`Rng::stream`]).
    pub fn new(cfg: &ConnConfig, workload: Workload, mut rng: Rng) -> Result<Self, ScheduleError> {
        if cfg.max_in_flight == 0 {
            return Err(ScheduleError::InFlight);
        }
        // Its own stream, so the send times do not depend on what the requests drew.
        let schedule = Schedule::new(cfg.pacing, cfg.start_ns, cfg.end_ns, rng.fork())?;
        Ok(Connection {
            schedule,
            workload,
            rng,
            codec: Codec::new(cfg.max_value_len),
            keys: Vec::new(),
            max_in_flight: cfg.max_in_flight as usize,
            late_after_ns: cfg.late_after_ns,
            measure_from_ns: cfg.measure_from_ns,
            slot_free_at: 0,
        })
    }

    /// When the next request is due (possibly in the past: it is late), or `None` when
    /// none can go now (the window is over, or every slot is in flight).
    pub fn next_due(&self) -> Option<u64> {
        if self.codec.outstanding() >= self.max_in_flight {
            return None;
        }
        self.schedule.next_due()
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> usize {
        self.codec.outstanding()
    }

    /// Appends every request due by `now_ns` to `out`; returns how many.
    pub fn poll_transmit(&mut self, now_ns: u64, out: &mut Vec<u8>, stats: &mut Stats) -> u32 {
        let mut n = 0;
        while let Some(due) = self.next_due().filter(|&due| due <= now_ns) {
            self.schedule.take();
            // Open loop measures from the schedule; closed loop from the send.
            let origin = if self.schedule.is_open_loop() { due } else { now_ns };
            let request = self.workload.sample(&mut self.rng, &mut self.keys);
            self.codec.encode(origin, &request, out);
            if due >= self.measure_from_ns {
                let could_go = due.max(self.slot_free_at);
                stats.sent(
                    now_ns.saturating_sub(due) > self.late_after_ns,
                    now_ns.saturating_sub(could_go) > self.late_after_ns,
                );
            }
            n += 1;
        }
        n
    }

    /// Takes bytes read at `now_ns`; returns how many requests they completed. An error
    /// means the stream is out of step: close the socket and call
    /// [`Connection::handle_disconnect`] (the completions before it are recorded).
    pub fn handle_input(&mut self, now_ns: u64, bytes: &[u8], stats: &mut Stats) -> Result<u32, ProtocolError> {
        let mut n = 0;
        let was_full = self.codec.outstanding() >= self.max_in_flight;
        let schedule = &mut self.schedule;
        let from = self.measure_from_ns;
        let decoded = self.codec.decode(bytes, |c| {
            if c.token >= from {
                stats.replied(c.reply, now_ns.saturating_sub(c.token));
            }
            schedule.settled(now_ns);
            n += 1;
        });
        if was_full && n > 0 {
            self.slot_free_at = now_ns;
        }
        decoded?;
        Ok(n)
    }

    /// The socket failed or was closed at `now_ns`: every request in flight is lost.
    /// The connection is ready for a new socket; returns how many were lost.
    pub fn handle_disconnect(&mut self, now_ns: u64, stats: &mut Stats) -> usize {
        let n = self.codec.abandon();
        if n >= self.max_in_flight {
            self.slot_free_at = now_ns;
        }
        stats.lost(n as u64);
        for _ in 0..n {
            self.schedule.settled(now_ns);
        }
        n
    }

    /// Ends the run: requests in flight are unanswered, those never sent are counted.
    pub fn finish(mut self, stats: &mut Stats) {
        stats.unanswered(self.codec.abandon() as u64);
        stats.not_sent(self.schedule.drain());
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;
    use crate::load::schedule::{Arrivals, Process};
    use crate::load::stats::Sla;
    use crate::load::workload::{SizeDist, WorkloadSpec};

    const MS: u64 = 1_000_000;
    const US: u64 = 1_000;

    /// A memcached stand-in with one worker and a FIFO queue: each request is answered
    /// `service_ns` after max(its arrival, the previous answer); during `stall` the
    /// server does nothing (a GC pause, a page fault storm). Every get misses.
    struct FifoServer {
        service_ns: u64,
        stall: Option<(u64, u64)>,
        free_at: u64,
        input: Vec<u8>,
        replies: VecDeque<(u64, &'static [u8])>,
        served: u64,
    }

    impl FifoServer {
        fn new(service_ns: u64, stall: Option<(u64, u64)>) -> Self {
            FifoServer { service_ns, stall, free_at: 0, input: Vec::new(), replies: VecDeque::new(), served: 0 }
        }

        fn arrive(&mut self, now: u64, bytes: &[u8]) {
            self.input.extend_from_slice(bytes);
            while let Some((len, reply)) = request(&self.input) {
                self.input.drain(..len);
                let mut start = now.max(self.free_at);
                if let Some((from, to)) = self.stall
                    && start < to
                    && start + self.service_ns > from
                {
                    start = to;
                }
                self.free_at = start + self.service_ns;
                self.replies.push_back((self.free_at, reply));
                self.served += 1;
            }
        }
    }

    /// The length of the whole request at the start of `buf`, and its reply.
    fn request(buf: &[u8]) -> Option<(usize, &'static [u8])> {
        let eol = buf.windows(2).position(|w| w == b"\r\n")?;
        let line = &buf[..eol];
        if line.starts_with(b"get ") {
            return Some((eol + 2, b"END\r\n"));
        }
        assert!(line.starts_with(b"set "), "{}", String::from_utf8_lossy(line));
        let n: usize = std::str::from_utf8(line.rsplit(|&b| b == b' ').next()?).ok()?.parse().ok()?;
        let len = eol + 2 + n + 2;
        (buf.len() >= len).then_some((len, b"STORED\r\n"))
    }

    /// Runs `conn` against `server` in simulated time until nothing is left to do or
    /// `stop_at`, then finishes it. A request that fell due while the connection was full
    /// goes out when a reply frees a slot: at that time, not at its due time.
    fn simulate(mut conn: Connection, server: &mut FifoServer, stop_at: u64) -> Stats {
        let mut stats = Stats::new();
        let mut out = Vec::new();
        let mut now = 0;
        loop {
            let send_at = conn.next_due().map(|t| t.max(now)).filter(|&t| t < stop_at);
            let reply_at = server.replies.front().map(|r| r.0).filter(|&t| t < stop_at);
            match (send_at, reply_at) {
                (Some(s), r) if r.is_none_or(|r| s < r) => {
                    now = s;
                    conn.poll_transmit(now, &mut out, &mut stats);
                    server.arrive(now, &out);
                    out.clear();
                }
                (_, Some(r)) => {
                    now = r;
                    let (_, reply) = server.replies.pop_front().unwrap();
                    conn.handle_input(now, reply, &mut stats).unwrap();
                }
                _ => break,
            }
        }
        conn.finish(&mut stats);
        let c = stats.counts();
        assert_eq!(c.offered, c.settled(), "every request has one outcome: {c:?}");
        stats
    }

    fn workload() -> Workload {
        Workload::new(WorkloadSpec {
            key_size: SizeDist::Fixed(16),
            value_size: SizeDist::Fixed(64),
            ..WorkloadSpec::default()
        })
        .unwrap()
    }

    fn cfg(pacing: Pacing, window_ns: u64) -> ConnConfig {
        ConnConfig {
            pacing,
            start_ns: 0,
            end_ns: window_ns,
            max_in_flight: 100_000,
            late_after_ns: 10 * US,
            measure_from_ns: 0,
            max_value_len: 1 << 20,
        }
    }

    fn poisson(rate_per_s: f64) -> Pacing {
        Pacing::Open(Arrivals { process: Process::Poisson, rate_per_s })
    }

    fn conn(cfg: ConnConfig) -> Connection {
        Connection::new(&cfg, workload(), Rng::stream(7, 0)).unwrap()
    }

    #[test]
    fn open_loop_counts_a_stall_that_closed_loop_hides() {
        // 20 us of service, a 200 ms stall one second into a two-second run.
        let stall = Some((1000 * MS, 1200 * MS));
        // Open loop at 10k/s (20% busy): the ~2,000 requests scheduled during the stall
        // wait for it, and they are 10% of the run.
        let mut server = FifoServer::new(20 * US, stall);
        let open = simulate(conn(cfg(poisson(10_000.0), 2000 * MS)), &mut server, u64::MAX);
        assert!(open.latency_at(0.5).unwrap() < 100 * US, "p50 {:?}", open.latency_at(0.5));
        assert!(open.latency_at(0.99).unwrap() > 100 * MS, "p99 {:?}", open.latency_at(0.99));
        assert!(open.meets(&"p50=1ms".parse::<Sla>().unwrap()));
        assert!(!open.meets(&"p99=1ms".parse::<Sla>().unwrap()));
        // Closed loop, one request at a time: the stall holds up exactly one request,
        // and the ~90,000 others all see an idle server.
        let mut server = FifoServer::new(20 * US, stall);
        let closed = simulate(conn(cfg(Pacing::Closed { depth: 1 }, 2000 * MS)), &mut server, u64::MAX);
        assert!(closed.counts().completed > 80_000);
        let p9999 = closed.latency_at(0.9999).unwrap();
        assert!((20 * US..=20_100).contains(&p9999), "p99.99 {p9999}");
        assert!(closed.latency_at(1.0).unwrap() >= 200 * MS, "the one stalled request");
        assert!(closed.meets(&"p99.99=1ms".parse::<Sla>().unwrap()));
    }

    #[test]
    fn open_loop_latency_includes_queueing_that_closed_loop_hides() {
        // M/D/1 at 80% load: the mean wait alone is 2 service times (Pollaczek-Khinchine:
        // rho / (2 (1 - rho))), the tail many more.
        let mut server = FifoServer::new(20 * US, None);
        let open = simulate(conn(cfg(poisson(40_000.0), 1000 * MS)), &mut server, u64::MAX);
        assert!(open.latency_at(0.99).unwrap() > 100 * US, "p99 {:?}", open.latency_at(0.99));
        assert!(open.counts().completed > 39_000);
        // Closed loop never queues behind itself: every latency is the service time.
        let mut server = FifoServer::new(20 * US, None);
        let closed = simulate(conn(cfg(Pacing::Closed { depth: 1 }, 1000 * MS)), &mut server, u64::MAX);
        assert!(closed.latency_at(1.0).unwrap() <= 20_100);
    }

    #[test]
    fn late_sends_are_counted_and_measured_from_the_schedule() {
        // 100k/s offered to a server that does 50k/s, four requests in flight at most:
        // the generator falls behind and sends late, and latency keeps growing.
        let mut c = cfg(Pacing::Open(Arrivals { process: Process::Constant, rate_per_s: 100_000.0 }), 10 * MS);
        c.max_in_flight = 4;
        let mut server = FifoServer::new(20 * US, None);
        let stats = simulate(conn(c), &mut server, u64::MAX);
        let counts = stats.counts();
        assert_eq!((counts.offered, counts.sent, counts.completed), (1000, 1000, 1000));
        assert!(counts.sent_late > 900, "{counts:?}");
        // Every one went out as soon as a slot was free: the server's delay, not the
        // generator's.
        assert_eq!(counts.sent_lagged, 0, "{counts:?}");
        // The last request was due at 10 ms and answered at 20 ms.
        assert!(stats.latency_at(1.0).unwrap() > 9 * MS);
    }

    #[test]
    fn a_generator_that_wakes_late_lags_and_a_full_connection_does_not() {
        // One request a millisecond, one slot, a server that takes 5 ms each.
        let mut c = cfg(Pacing::Open(Arrivals { process: Process::Constant, rate_per_s: 1000.0 }), 20 * MS);
        c.max_in_flight = 1;
        let mut conn = conn(c);
        let (mut stats, mut out) = (Stats::new(), Vec::new());
        let mut server = FifoServer::new(5 * MS, None);
        // The first request goes out on time (the tolerance is 10 us).
        let first = conn.next_due().unwrap();
        assert_eq!(conn.poll_transmit(first, &mut out, &mut stats), 1);
        server.arrive(first, &out);
        // The second, due 1 ms after it, waits for the slot until the answer 5 ms later
        // and goes out at once: late, not lagged.
        let (t, reply) = server.replies.pop_front().unwrap();
        conn.handle_input(t, reply, &mut stats).unwrap();
        out.clear();
        assert_eq!(conn.poll_transmit(t, &mut out, &mut stats), 1);
        assert_eq!((stats.counts().sent_late, stats.counts().sent_lagged), (1, 0));
        server.arrive(t, &out);
        // The third could go when the next answer came, but the generator sends it
        // 200 us after that: lagged.
        let (t, reply) = server.replies.pop_front().unwrap();
        conn.handle_input(t, reply, &mut stats).unwrap();
        out.clear();
        assert_eq!(conn.poll_transmit(t + 200 * US, &mut out, &mut stats), 1);
        assert_eq!((stats.counts().sent_late, stats.counts().sent_lagged), (2, 1));
        assert!((stats.counts().lag_share() - 1.0 / 3.0).abs() < 1e-9);
    }

    #[test]
    fn the_end_of_a_run_counts_the_unanswered_and_the_unsent() {
        // Stopped at 5 ms of a 10 ms window, at a server twice too slow.
        let mut c = cfg(Pacing::Open(Arrivals { process: Process::Constant, rate_per_s: 100_000.0 }), 10 * MS);
        c.max_in_flight = 8;
        let mut server = FifoServer::new(20 * US, None);
        let stats = simulate(conn(c), &mut server, 5 * MS);
        let counts = stats.counts();
        assert_eq!(counts.offered, 1000);
        assert_eq!(counts.unanswered, 8);
        assert!(counts.not_sent > 400, "{counts:?}");
        assert_eq!(stats.latency_at(0.5), None, "most of the run has no answer");
    }

    #[test]
    fn a_protocol_error_loses_the_requests_in_flight_and_the_loop_goes_on() {
        let mut c = conn(cfg(Pacing::Closed { depth: 3 }, 10 * MS));
        let mut stats = Stats::new();
        let mut out = Vec::new();
        assert_eq!(c.poll_transmit(0, &mut out, &mut stats), 3);
        assert_eq!(c.next_due(), None);
        let mut server = FifoServer::new(US, None);
        server.arrive(0, &out);
        let (t, reply) = server.replies.pop_front().unwrap();
        assert_eq!(c.handle_input(t, reply, &mut stats), Ok(1));
        assert_eq!(c.next_due(), Some(t), "closed loop: the next request is due at once");
        assert!(c.handle_input(t + 1, b"garbage\r\n", &mut stats).is_err());
        assert_eq!(c.handle_disconnect(t + 1, &mut stats), 2);
        assert_eq!(stats.counts().lost, 2);
        // The slots come back: three requests may go on the new socket.
        out.clear();
        assert_eq!(c.poll_transmit(t + 2, &mut out, &mut stats), 3);
        assert_eq!(c.in_flight(), 3);
        c.finish(&mut stats);
        let counts = stats.counts();
        assert_eq!((counts.offered, counts.completed, counts.lost, counts.unanswered), (6, 1, 2, 3));
    }

    #[test]
    fn a_seed_gives_the_same_requests_at_the_same_times() {
        let run = || {
            let mut c = Connection::new(&cfg(poisson(1e6), MS), workload(), Rng::stream(3, 9)).unwrap();
            let (mut stats, mut out, mut times) = (Stats::new(), Vec::new(), Vec::new());
            while let Some(t) = c.next_due() {
                c.poll_transmit(t, &mut out, &mut stats);
                times.push(t);
            }
            (times, out)
        };
        let (a, b) = (run(), run());
        assert_eq!(a, b);
        assert!((900..1100).contains(&a.0.len()));
    }

    #[test]
    fn bad_configurations_are_refused() {
        let mut c = cfg(poisson(1.0), MS);
        c.max_in_flight = 0;
        assert_eq!(Connection::new(&c, workload(), Rng::new(0)).unwrap_err(), ScheduleError::InFlight);
        let c = cfg(poisson(0.0), MS);
        assert_eq!(Connection::new(&c, workload(), Rng::new(0)).unwrap_err(), ScheduleError::Rate(0.0));
    }
}

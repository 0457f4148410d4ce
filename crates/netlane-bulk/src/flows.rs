//! Many paced flows from a few sockets, the UDP content-delivery talk's server: every
//! flow (a client) has its own rate and its own datagram size (from its path MTU), and
//! the sender serves the flows in turn, each send one flow's train with its own
//! UDP_SEGMENT. Sans-IO: the schedule that says which flow sends next and when
//! ([`FlowSchedule`]), and the receiver's per-flow accounting ([`FlowTable`]); times are
//! passed in.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use netlane::metrics::{Hist, Summary};
use serde::Serialize;

use crate::payload::{parse_flow, parse_header};

/// The most flows a sender serves, or a receiver counts.
pub const MAX_FLOWS: u32 = 100_000;
/// The most sockets a many-flow sender opens.
pub const MAX_FLOW_SOCKETS: u32 = 64;
/// Datagrams one flow numbers at most (2^40: years at line rate); a higher index is not
/// a flow's.
pub const MAX_FLOW_INDEX: u64 = 1 << 40;
/// A flow more than this far behind its schedule starts again from now: the sender does
/// not send a backlog in a burst.
const MAX_BEHIND_NS: u64 = 50_000_000;

/// A many-flow sender's flows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Flows {
    /// How many flows (clients).
    pub count: u32,
    /// Unconnected sockets the flows are served from (flow i from socket i mod sockets).
    pub sockets: u32,
    /// The path MTUs of the flows' peers, given to the flows in turn: a flow's datagrams
    /// are as large as its path MTU allows (its GSO segment size).
    pub mtus: Vec<u32>,
}

/// How one flow sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowPlan {
    /// Payload bytes per datagram (its GSO segment size).
    pub datagram_size: usize,
    /// Datagrams per send.
    pub segments: usize,
    /// Time between its sends, nanoseconds (0: unpaced).
    pub period_ns: u64,
}

impl FlowPlan {
    /// A flow of `datagram_size`-byte datagrams at `rate` bytes/s (`None`: unpaced) whose
    /// sends hold at most `max_segments` datagrams and, paced, about `quantum_ns` of its
    /// rate.
    pub fn new(datagram_size: usize, rate: Option<f64>, quantum_ns: u64, max_segments: usize) -> FlowPlan {
        let max_segments = max_segments.max(1);
        let Some(rate) = rate.filter(|r| *r > 0.0) else {
            return FlowPlan { datagram_size, segments: max_segments, period_ns: 0 };
        };
        let fit = (rate * quantum_ns as f64 / 1e9 / datagram_size as f64).floor() as usize;
        let segments = fit.clamp(1, max_segments);
        let period_ns = ((segments * datagram_size) as f64 / rate * 1e9).round().max(1.0) as u64;
        FlowPlan { datagram_size, segments, period_ns }
    }

    /// Payload bytes per send.
    pub fn send_bytes(&self) -> usize {
        self.datagram_size * self.segments
    }
}

/// Which flow sends next, and when: paced flows by their deadlines (the earliest first,
/// the lower flow first among equals, so flows due together are served in turn);
/// unpaced flows one after another.
#[derive(Debug)]
pub struct FlowSchedule {
    due: BinaryHeap<Reverse<(u64, u32)>>,
    periods: Vec<u64>,
    next_unpaced: u32,
    /// Sends that came more than [`MAX_BEHIND_NS`] late, whose flows started again
    /// from the time they were sent.
    pub restarted: u64,
}

impl FlowSchedule {
    /// The schedule of flows with `plans`, from `t0`: paced flows' first sends are spread
    /// over their periods, so they do not all start at once.
    pub fn new(plans: &[FlowPlan], t0: u64) -> FlowSchedule {
        let n = plans.len().max(1) as u64;
        let due = plans
            .iter()
            .enumerate()
            .filter(|(_, p)| p.period_ns > 0)
            .map(|(i, p)| {
                let offset = (u128::from(p.period_ns) * i as u128 / u128::from(n)) as u64;
                Reverse((t0.saturating_add(offset), i as u32))
            })
            .collect();
        FlowSchedule { due, periods: plans.iter().map(|p| p.period_ns).collect(), next_unpaced: 0, restarted: 0 }
    }

    /// The next flow to send and when it is due (unpaced flows are due at once).
    pub fn poll_next(&mut self) -> Option<(u32, u64)> {
        if let Some(Reverse((due, flow))) = self.due.peek() {
            return Some((*flow, *due));
        }
        let n = self.periods.len() as u32;
        if n == 0 {
            return None;
        }
        let flow = self.next_unpaced;
        Some((flow, 0))
    }

    /// `flow`, due at `due`, was sent at `now`.
    pub fn handle_sent(&mut self, flow: u32, due: u64, now: u64) {
        let period = self.periods.get(flow as usize).copied().unwrap_or(0);
        if period == 0 {
            self.next_unpaced = (flow + 1) % self.periods.len().max(1) as u32;
            return;
        }
        if let Some(Reverse((d, f))) = self.due.peek()
            && (*d, *f) == (due, flow)
        {
            self.due.pop();
        }
        let mut next = due.saturating_add(period);
        if now > next + MAX_BEHIND_NS {
            self.restarted += 1;
            next = now;
        }
        self.due.push(Reverse((next, flow)));
    }
}

/// One flow as the receiver saw it.
#[derive(Debug, Clone, Copy, Default)]
struct FlowCount {
    datagrams: u64,
    bytes: u64,
    /// Highest index in the flow seen, plus one.
    high_water: u64,
    reordered: u64,
    window: u64,
    window_bytes: u64,
    max_window_bytes: u64,
}

/// What the receiver saw of each flow, summarised over the flows.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct FlowsReport {
    /// Flows the receiver was told to expect.
    pub expected: u32,
    /// Flows of which at least one datagram arrived.
    pub seen: u32,
    /// Datagrams of a flow beyond those expected, or without a flow header.
    pub unknown: u64,
    /// Each flow's payload bytes per second over the receiver's active period.
    pub rate_bytes_per_s: Summary,
    /// Each flow's loss, parts per million of the datagrams it numbered up to its
    /// highest (datagrams lost after a flow's last arrival are not seen).
    pub loss_ppm: Summary,
    /// Each flow's most payload bytes in one millisecond (its burst at the receiver).
    pub max_per_ms_bytes: Summary,
    /// Datagrams that arrived after a higher-numbered one of their flow.
    pub reordered: u64,
}

/// The receiver's per-flow accounting: a flow's number and its index in the flow from
/// each datagram's header. Memory is bounded by the flows expected.
#[derive(Debug)]
pub struct FlowTable {
    run: u32,
    flows: Vec<FlowCount>,
    unknown: u64,
    start: Option<u64>,
}

impl FlowTable {
    /// A table for `expected` flows (at most [`MAX_FLOWS`]) of run `run`.
    pub fn new(expected: u32, run: u32) -> FlowTable {
        let flows = vec![FlowCount::default(); expected.min(MAX_FLOWS) as usize];
        FlowTable { run, flows, unknown: 0, start: None }
    }

    /// A datagram arrived at `now` (nanoseconds): counted for its flow when it is one of
    /// the run's, else as unknown.
    pub fn handle_datagram(&mut self, d: &[u8], now: u64) {
        let Some((flow, index)) = parse_header(d, self.run).and_then(|_| parse_flow(d)) else {
            self.unknown += 1;
            return;
        };
        // An index no flow of a run reaches (a damaged or forged header): not counted,
        // so it cannot make every lower index look lost.
        if index >= MAX_FLOW_INDEX {
            self.unknown += 1;
            return;
        }
        let Some(f) = self.flows.get_mut(flow as usize) else {
            self.unknown += 1;
            return;
        };
        let window = (now - *self.start.get_or_insert(now)) / 1_000_000;
        if window != f.window {
            f.window = window;
            f.window_bytes = 0;
        }
        let len = d.len() as u64;
        f.window_bytes += len;
        f.max_window_bytes = f.max_window_bytes.max(f.window_bytes);
        f.datagrams += 1;
        f.bytes += len;
        if index.saturating_add(1) < f.high_water {
            f.reordered += 1;
        }
        f.high_water = f.high_water.max(index.saturating_add(1));
    }

    /// The summary over the flows, rates over `seconds`.
    pub fn report(&self, seconds: f64) -> FlowsReport {
        let (mut rate, mut loss, mut burst) = (Hist::new(), Hist::new(), Hist::new());
        let mut seen = 0;
        let mut reordered = 0;
        for f in self.flows.iter().filter(|f| f.datagrams > 0) {
            seen += 1;
            reordered += f.reordered;
            if seconds > 0.0 {
                rate.record((f.bytes as f64 / seconds) as u64);
            }
            let lost = f.high_water.saturating_sub(f.datagrams);
            loss.record((u128::from(lost) * 1_000_000 / u128::from(f.high_water.max(1))) as u64);
            burst.record(f.max_window_bytes);
        }
        FlowsReport {
            expected: self.flows.len() as u32,
            seen,
            unknown: self.unknown,
            rate_bytes_per_s: rate.summary(),
            loss_ppm: loss.summary(),
            max_per_ms_bytes: burst.summary(),
            reordered,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payload::{FLOW_HEADER_LEN, stamp, stamp_flow};

    #[test]
    fn a_flow_sends_a_quantum_of_its_rate_at_a_time_at_least_a_datagram() {
        // 100 MB/s of 1400-byte datagrams, 1 ms quanta: 71 fit, the GSO limit is 46.
        let fast = FlowPlan::new(1400, Some(100e6), 1_000_000, 46);
        assert_eq!((fast.segments, fast.period_ns), (46, 644_000));
        // 10 kB/s: one datagram every 140 ms.
        let slow = FlowPlan::new(1400, Some(10e3), 1_000_000, 46);
        assert_eq!((slow.segments, slow.period_ns), (1, 140_000_000));
        let unpaced = FlowPlan::new(1252, None, 1_000_000, 46);
        assert_eq!((unpaced.segments, unpaced.period_ns, unpaced.send_bytes()), (46, 0, 46 * 1252));
    }

    #[test]
    fn paced_flows_are_served_by_deadline_in_turn_and_a_late_flow_starts_again() {
        let plan = FlowPlan { datagram_size: 1000, segments: 1, period_ns: 100 };
        let mut s = FlowSchedule::new(&[plan; 4], 1_000);
        let mut order = Vec::new();
        for _ in 0..8 {
            let (flow, due) = s.poll_next().unwrap();
            order.push((flow, due));
            s.handle_sent(flow, due, due);
        }
        // Spread over the period at first, then each flow every 100 ns.
        assert_eq!(order, [(0, 1000), (1, 1025), (2, 1050), (3, 1075), (0, 1100), (1, 1125), (2, 1150), (3, 1175)]);
        let (flow, due) = s.poll_next().unwrap();
        s.handle_sent(flow, due, due + MAX_BEHIND_NS + 1_000);
        assert_eq!(s.restarted, 1);
        let unpaced = FlowPlan { period_ns: 0, ..plan };
        let mut u = FlowSchedule::new(&[unpaced; 3], 0);
        let turns: Vec<u32> = (0..4)
            .map(|_| {
                let (f, due) = u.poll_next().unwrap();
                u.handle_sent(f, due, 0);
                f
            })
            .collect();
        assert_eq!(turns, [0, 1, 2, 0]);
    }

    #[test]
    fn the_receiver_counts_each_flows_rate_loss_and_burst_within_its_bounds() {
        let mut t = FlowTable::new(2, 1);
        let mut d = vec![0u8; 100];
        let mut arrive = |t: &mut FlowTable, flow: u32, index: u64, now: u64| {
            stamp(&mut d, 100, 1, 0, 1);
            stamp_flow(&mut d, 100, flow, index, 1);
            t.handle_datagram(&d, now);
        };
        // Flow 0: indices 0, 1, 3 (2 lost), two in the first millisecond.
        arrive(&mut t, 0, 0, 0);
        arrive(&mut t, 0, 1, 500_000);
        arrive(&mut t, 0, 3, 2_000_000);
        // Flow 1: 0 after 1 (reordered); flow 7 is not expected.
        arrive(&mut t, 1, 1, 3_000_000);
        arrive(&mut t, 1, 0, 3_100_000);
        arrive(&mut t, 7, 0, 3_200_000);
        // An index no flow reaches, another run's datagram, a header cut short.
        arrive(&mut t, 1, u64::MAX, 3_250_000);
        stamp(&mut d, 100, 2, 0, 1);
        t.handle_datagram(&d, 3_260_000);
        t.handle_datagram(&d[..FLOW_HEADER_LEN - 1], 3_300_000);
        let r = t.report(1.0);
        assert_eq!((r.expected, r.seen, r.unknown, r.reordered), (2, 2, 4, 1));
        // Summaries are a histogram's: within a tenth of a percent.
        assert_eq!(r.loss_ppm.min, 0);
        assert!((249_750..=250_250).contains(&r.loss_ppm.max), "{:?}", r.loss_ppm);
        assert_eq!((r.rate_bytes_per_s.min, r.rate_bytes_per_s.max), (200, 300));
        assert_eq!(r.max_per_ms_bytes.max, 200);
    }
}

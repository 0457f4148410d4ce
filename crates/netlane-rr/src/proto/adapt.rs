//! Adaptive TPACKET_V3 block size: the talk's open idea ("sample the input rate and
//! adjust the block size dynamically"), built on what the kernel allows.
//!
//! A ring's geometry is fixed when it is created, so the server keeps several V3 rings
//! of different block sizes on the same interface and lets exactly one of them take the
//! service's traffic (they share a packet fanout group whose program hands each frame
//! to the ring chosen here). Every window this
//! chooser looks at what the active ring saw and picks the ring to use next. A bigger
//! block means fewer wake-ups per request (idle CPU) but requests wait for the block to
//! fill; whether that wait costs throughput depends on the load, so the chooser measures
//! it instead of guessing:
//!
//! - ceiling: the largest block that holds at most half the burst, the burst being the
//!   number of distinct clients heard from in a window (the talk: the best block is
//!   about half the burst, so the server works on one block while the kernel fills the
//!   next); a block's capacity is its size over the measured average frame footprint;
//! - climb: below the ceiling it tries the next bigger block, and keeps it while the
//!   request rate stays within [`TOLERANCE`] of the best rate measured on a smaller
//!   block; when it falls further it goes back to that block and waits before trying
//!   again (twice as long after every failed try). Under a closed loop a block that
//!   makes clients wait shows up as a lower rate at once; when clients think between
//!   requests the burst is smaller than the population and this is what finds it;
//! - starvation: when more than a tenth of the active ring's blocks were retired by the
//!   timer (they did not fill) it steps down at once;
//! - a population that changes by more than a quarter forgets the measured rates.
//!
//! The window after a switch is not measured (the old ring's last block is still being
//! retired and the clients settle on the new latency). Sans-IO: the driver reports
//! frames and block counts and applies the decision.

use std::collections::HashSet;
use std::net::SocketAddr;

/// Bytes of a V3 block's header (tpacket_block_desc, 8-aligned).
const BLOCK_HEADER: u32 = 48;
/// Most distinct sources counted per window (the estimate saturates there).
pub const MAX_SOURCES: usize = 4096;
/// A bigger block is kept while its rate is at least this close to the best smaller
/// block's.
pub const TOLERANCE: f64 = 0.05;
/// Windows to wait before trying a bigger block again after a failed try (doubling up
/// to [`MAX_HOLD`]).
const FIRST_HOLD: u32 = 4;
/// The longest wait between tries, in windows.
const MAX_HOLD: u32 = 64;

/// A frame's footprint in a block: the frame header and MAC offset (82 bytes for an
/// untagged Ethernet frame), the frame, aligned to 8.
pub fn footprint(frame_len: usize) -> u32 {
    ((82 + frame_len).div_ceil(8) * 8) as u32
}

/// What one window of the active ring saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowCounts {
    /// Blocks retired full.
    pub full: u64,
    /// Blocks retired by the timer.
    pub timed_out: u64,
}

/// Chooses among rings of ascending block sizes.
#[derive(Debug)]
pub struct BlockChooser {
    block_bytes: Vec<u32>,
    active: usize,
    window_ns: u64,
    window_start: Option<u64>,
    sources: HashSet<SocketAddr>,
    footprint_sum: u64,
    frames: u64,
    window_frames: u64,
    /// Requests this window (a fragmented request is several frames, one request).
    window_requests: u64,
    /// Requests per second measured on each ring for the current population.
    rates: Vec<Option<f64>>,
    population: u32,
    settling: bool,
    /// Windows until the next try of a bigger block, and the wait after the next failure.
    hold: u32,
    next_hold: u32,
    switches: u64,
}

impl BlockChooser {
    /// Rings of `block_bytes` (ascending), starting on the smallest, deciding every
    /// `window_ns`.
    pub fn new(block_bytes: Vec<u32>, window_ns: u64) -> Self {
        let n = block_bytes.len();
        BlockChooser {
            block_bytes,
            active: 0,
            window_ns: window_ns.max(1),
            window_start: None,
            sources: HashSet::new(),
            footprint_sum: 0,
            frames: 0,
            window_frames: 0,
            window_requests: 0,
            rates: vec![None; n],
            population: 0,
            settling: false,
            hold: 0,
            next_hold: FIRST_HOLD,
            switches: 0,
        }
    }

    /// The ring in use.
    pub fn active(&self) -> usize {
        self.active
    }

    /// Times the chooser switched rings.
    pub fn switches(&self) -> u64 {
        self.switches
    }

    /// Requests per second measured on each ring for the current population.
    pub fn rates(&self) -> &[Option<f64>] {
        &self.rates
    }

    /// How many frames of the current average footprint ring `i`'s block holds.
    pub fn capacity(&self, i: usize) -> u32 {
        let fp = self.footprint_sum.checked_div(self.frames).map_or(footprint(554), |v| v as u32);
        self.block_bytes.get(i).map_or(0, |b| b.saturating_sub(BLOCK_HEADER) / fp.max(1))
    }

    /// A frame of `frame_len` bytes for the service arrived: a whole request, or one
    /// fragment of one (each takes a frame of the ring).
    pub fn on_frame(&mut self, frame_len: usize) {
        self.footprint_sum += u64::from(footprint(frame_len));
        self.frames += 1;
        self.window_frames += 1;
    }

    /// A request from `src` was taken whole (after its frame, or its fragments' frames).
    pub fn on_request(&mut self, src: SocketAddr) {
        if self.sources.len() < MAX_SOURCES {
            self.sources.insert(src);
        }
        self.window_requests += 1;
    }

    /// Called regularly with the active ring's block counts since the last decision;
    /// at the end of a window returns the ring to switch to, if another. The caller
    /// resets its counts whenever this returns `Some` or a window ended (see
    /// [`BlockChooser::window_ended`]).
    pub fn tick(&mut self, now_ns: u64, active: WindowCounts) -> Option<usize> {
        let start = *self.window_start.get_or_insert(now_ns);
        let elapsed = now_ns.saturating_sub(start);
        if elapsed < self.window_ns {
            return None;
        }
        self.window_start = Some(now_ns);
        let burst = self.sources.len() as u32;
        self.sources.clear();
        let frames = std::mem::take(&mut self.window_frames);
        let requests = std::mem::take(&mut self.window_requests);
        if burst == 0 {
            // Idle: keep what we have.
            return None;
        }
        if burst.abs_diff(self.population) * 4 > self.population {
            self.rates.iter_mut().for_each(|r| *r = None);
            self.population = burst;
            self.hold = 0;
            self.next_hold = FIRST_HOLD;
        }
        if !std::mem::take(&mut self.settling) {
            let rate = requests as f64 * 1e9 / elapsed as f64;
            let r = &mut self.rates[self.active];
            *r = Some(r.map_or(rate, |old| (old + rate) / 2.0));
        }
        let blocks = active.full + active.timed_out;
        let starved = active.timed_out > 0 && active.timed_out * 10 > blocks;
        // The largest block holding at most half the burst's frames (the smallest if none
        // does): a burst of fragmented requests takes several frames each.
        let per_request = frames.checked_div(requests).unwrap_or(1).max(1);
        let half = u64::from(burst) * per_request / 2;
        let ceiling = (0..self.block_bytes.len()).rev().find(|&i| u64::from(self.capacity(i)) <= half).unwrap_or(0);
        let next = if starved || self.active > ceiling {
            self.back_off();
            ceiling.min(self.active.saturating_sub(1))
        } else if let Some(better) = self.better_below() {
            self.back_off();
            better
        } else if self.active < ceiling && self.hold == 0 && self.rates[self.active].is_some() {
            self.rates[self.active + 1] = None;
            self.active + 1
        } else {
            self.hold = self.hold.saturating_sub(1);
            self.active
        };
        if next == self.active {
            return None;
        }
        self.active = next;
        self.settling = true;
        self.switches += 1;
        Some(next)
    }

    /// A smaller ring whose measured rate the active one falls short of by more than the
    /// tolerance (the best such).
    fn better_below(&self) -> Option<usize> {
        let now = self.rates[self.active]?;
        let (i, best) = (0..self.active)
            .filter_map(|i| self.rates[i].map(|r| (i, r)))
            .fold(None, |m: Option<(usize, f64)>, x| if m.is_some_and(|m| m.1 >= x.1) { m } else { Some(x) })?;
        (now < best * (1.0 - TOLERANCE)).then_some(i)
    }

    fn back_off(&mut self) {
        self.hold = self.next_hold;
        self.next_hold = (self.next_hold * 2).min(MAX_HOLD);
    }

    /// Whether the last [`BlockChooser::tick`] closed a window (the caller then starts
    /// counting the active ring's blocks afresh).
    pub fn window_ended(&self, now_ns: u64) -> bool {
        self.window_start == Some(now_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RINGS: [u32; 6] = [4096, 8192, 16384, 32768, 65536, 131072];

    fn feed(c: &mut BlockChooser, clients: u16, frames_each: u32) {
        for _ in 0..frames_each {
            for k in 0..clients {
                c.on_frame(554);
                c.on_request(SocketAddr::from(([10, 0, 0, 1], 1000 + k)));
            }
        }
    }

    /// Windows of 1000 ns: `frames_each` frames from each of `clients` per window.
    fn window(c: &mut BlockChooser, t: u64, clients: u16, frames_each: u32, counts: WindowCounts) -> Option<usize> {
        feed(c, clients, frames_each);
        c.tick(t * 1000, counts)
    }

    const FULL: WindowCounts = WindowCounts { full: 20, timed_out: 0 };

    #[test]
    fn it_climbs_while_the_rate_holds_up_to_half_the_burst() {
        let mut c = BlockChooser::new(RINGS.to_vec(), 1000);
        assert_eq!(footprint(554), 640);
        assert_eq!((c.capacity(0), c.capacity(3), c.capacity(5)), (6, 51, 204));
        assert_eq!(c.tick(0, WindowCounts::default()), None, "the first tick opens a window");
        // 64 clients: half is 32; 16 KiB holds 25, 32 KiB 51: the ceiling is 16 KiB.
        assert_eq!(window(&mut c, 1, 64, 10, FULL), Some(1), "measured the smallest: try the next");
        assert_eq!(window(&mut c, 2, 64, 10, FULL), None, "settling");
        assert_eq!(window(&mut c, 3, 64, 10, FULL), Some(2), "as fast: try the next");
        assert_eq!(window(&mut c, 4, 64, 10, FULL), None, "settling");
        for t in 5..10 {
            assert_eq!(window(&mut c, t, 64, 10, FULL), None, "the ceiling: stays (window {t})");
        }
        // Twice the clients: the rates are forgotten and the ceiling is 32 KiB.
        assert_eq!(window(&mut c, 10, 128, 10, FULL), Some(3));
        assert_eq!(c.switches(), 3);
    }

    #[test]
    fn a_burst_of_fragmented_requests_is_measured_in_the_frames_it_takes() {
        let mut c = BlockChooser::new(RINGS.to_vec(), 1000);
        c.tick(0, WindowCounts::default());
        // 64 clients, each request three frames: half the burst is 96 frames, so the
        // ceiling is 32 KiB (51 frames; 64 KiB holds 102), not 16 KiB as for whole ones.
        let mut t = 1;
        let mut window3 = |c: &mut BlockChooser| {
            for _ in 0..10 {
                for k in 0..64u16 {
                    (0..3).for_each(|_| c.on_frame(554));
                    c.on_request(SocketAddr::from(([10, 0, 0, 1], 1000 + k)));
                }
            }
            t += 1;
            c.tick((t - 1) * 1000, FULL)
        };
        let moves: Vec<Option<usize>> = (0..10).map(|_| window3(&mut c)).collect();
        assert_eq!(moves.iter().flatten().copied().collect::<Vec<_>>(), vec![1, 2, 3], "{moves:?}");
        assert_eq!(c.active(), 3);
    }

    #[test]
    fn a_bigger_block_that_costs_rate_is_left_and_tried_again_later_and_later() {
        let mut c = BlockChooser::new(RINGS.to_vec(), 1000);
        c.tick(0, WindowCounts::default());
        assert_eq!(window(&mut c, 1, 128, 10, FULL), Some(1));
        assert_eq!(window(&mut c, 2, 128, 10, FULL), None);
        // The bigger block loses 20% of the rate (clients waiting for it to fill).
        assert_eq!(window(&mut c, 3, 128, 8, FULL), Some(0), "back");
        let mut t = 4;
        let mut tried_at = Vec::new();
        while tried_at.len() < 3 && t < 100 {
            if window(&mut c, t, 128, 10, FULL) == Some(1) {
                tried_at.push(t);
                assert_eq!(window(&mut c, t + 1, 128, 10, FULL), None, "settling");
                assert_eq!(window(&mut c, t + 2, 128, 8, FULL), Some(0), "still worse");
                t += 2;
            }
            t += 1;
        }
        // Waits of 4, 8, 16 windows (the settling window included) between tries.
        assert_eq!(tried_at, vec![8, 19, 38]);
        // Within the tolerance a bigger block is kept.
        let mut c = BlockChooser::new(RINGS.to_vec(), 1000);
        c.tick(0, WindowCounts::default());
        assert_eq!(window(&mut c, 1, 128, 100, FULL), Some(1));
        assert_eq!(window(&mut c, 2, 128, 100, FULL), None);
        assert_eq!(window(&mut c, 3, 128, 96, FULL), Some(2), "4% less: kept, and the next tried");
    }

    #[test]
    fn blocks_retired_by_the_timer_step_down_at_once() {
        let mut c = BlockChooser::new(RINGS.to_vec(), 1000);
        c.tick(0, WindowCounts::default());
        for t in 1..=6 {
            window(&mut c, t, 128, 4, FULL);
        }
        assert_eq!(c.active(), 3);
        // The same clients, but now most blocks time out (the rate fell): down one.
        assert_eq!(window(&mut c, 7, 128, 1, WindowCounts { full: 1, timed_out: 5 }), Some(2));
    }

    #[test]
    fn an_idle_window_changes_nothing_and_few_clients_get_the_smallest_block() {
        let mut c = BlockChooser::new(RINGS.to_vec(), 1000);
        c.tick(0, WindowCounts::default());
        assert_eq!(c.tick(1000, WindowCounts::default()), None);
        for t in 2..10 {
            assert_eq!(window(&mut c, t, 4, 10, WindowCounts { full: 0, timed_out: 3 }), None);
        }
        assert_eq!(c.active(), 0);
    }

    #[test]
    fn sources_are_bounded() {
        let mut c = BlockChooser::new(RINGS.to_vec(), 1000);
        for k in 0..10_000u32 {
            c.on_request(SocketAddr::from(([10, (k >> 16) as u8, (k >> 8) as u8, k as u8], 9)));
        }
        assert_eq!(c.sources.len(), MAX_SOURCES);
    }
}

//! Adaptive TPACKET_V3 block size: the talk's open idea ("sample the input rate and
//! adjust the block size dynamically"), built on what the kernel allows.
//!
//! A ring's geometry is fixed when it is created, so the server keeps several V3 rings
//! of different block sizes on the same interface and lets exactly one of them take the
//! service's traffic (the others carry a drop-everything filter). Every window this
//! chooser looks at what the active ring saw and picks the ring to use next:
//!
//! - the burst is the number of distinct clients heard from in the window (a closed-loop
//!   client has one request in flight); the block to use is the largest that holds at
//!   most half of it (the talk: the best block is about half the burst, so the server
//!   works on one block while the kernel fills the next);
//! - a block's capacity in requests is its size over the average footprint of a frame
//!   in a block, measured;
//! - when more than a tenth of the active ring's blocks were retired by the timer (they
//!   did not fill: the rate fell, or arrivals are not a closed loop), it steps down at
//!   once and holds off stepping up for a few windows.
//!
//! Sans-IO: the driver reports frames and block counts and applies the decision.

use std::collections::HashSet;
use std::net::SocketAddr;

/// Bytes of a V3 block's header (tpacket_block_desc, 8-aligned).
const BLOCK_HEADER: u32 = 48;
/// Most distinct sources counted per window (the estimate saturates there).
pub const MAX_SOURCES: usize = 4096;
/// Windows without stepping up after a step down.
const COOLDOWN: u32 = 4;

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
    cooldown: u32,
    switches: u64,
}

impl BlockChooser {
    /// Rings of `block_bytes` (ascending), starting on the smallest, deciding every
    /// `window_ns`.
    pub fn new(block_bytes: Vec<u32>, window_ns: u64) -> Self {
        BlockChooser {
            block_bytes,
            active: 0,
            window_ns: window_ns.max(1),
            window_start: None,
            sources: HashSet::new(),
            footprint_sum: 0,
            frames: 0,
            cooldown: 0,
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

    /// How many frames of the current average footprint ring `i`'s block holds.
    pub fn capacity(&self, i: usize) -> u32 {
        let fp = self.footprint_sum.checked_div(self.frames).map_or(footprint(554), |v| v as u32);
        self.block_bytes.get(i).map_or(0, |b| b.saturating_sub(BLOCK_HEADER) / fp.max(1))
    }

    /// A frame of `frame_len` bytes from `src` arrived.
    pub fn on_frame(&mut self, src: SocketAddr, frame_len: usize) {
        if self.sources.len() < MAX_SOURCES {
            self.sources.insert(src);
        }
        self.footprint_sum += u64::from(footprint(frame_len));
        self.frames += 1;
    }

    /// Called regularly with the active ring's block counts since the last decision;
    /// at the end of a window returns the ring to switch to, if another. The caller
    /// resets its counts whenever this returns `Some` or a window ended (see
    /// [`BlockChooser::window_ended`]).
    pub fn tick(&mut self, now_ns: u64, active: WindowCounts) -> Option<usize> {
        let start = *self.window_start.get_or_insert(now_ns);
        if now_ns.saturating_sub(start) < self.window_ns {
            return None;
        }
        self.window_start = Some(now_ns);
        let burst = self.sources.len() as u32;
        self.sources.clear();
        if burst == 0 {
            // Idle: keep what we have.
            return None;
        }
        let blocks = active.full + active.timed_out;
        let starved = active.timed_out > 0 && active.timed_out * 10 > blocks;
        // The largest block holding at most half the burst (the smallest if none does).
        let target = (0..self.block_bytes.len()).rev().find(|&i| self.capacity(i) <= burst / 2).unwrap_or(0);
        let next = if starved {
            self.cooldown = COOLDOWN;
            target.min(self.active.saturating_sub(1))
        } else if target > self.active && self.cooldown > 0 {
            self.cooldown -= 1;
            self.active
        } else {
            self.cooldown = self.cooldown.saturating_sub(1);
            target
        };
        if next == self.active {
            return None;
        }
        self.active = next;
        self.switches += 1;
        Some(next)
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
                c.on_frame(SocketAddr::from(([10, 0, 0, 1], 1000 + k)), 554);
            }
        }
    }

    #[test]
    fn it_settles_on_about_half_the_burst() {
        let mut c = BlockChooser::new(RINGS.to_vec(), 1000);
        assert_eq!(footprint(554), 640);
        assert_eq!((c.capacity(0), c.capacity(3), c.capacity(5)), (6, 51, 204));
        assert_eq!(c.tick(0, WindowCounts::default()), None, "the first tick opens a window");
        feed(&mut c, 64, 10);
        // 64 clients: half is 32; 16 KiB holds 25, 32 KiB 51: 16 KiB.
        assert_eq!(c.tick(1000, WindowCounts { full: 20, timed_out: 0 }), Some(2));
        feed(&mut c, 128, 10);
        assert_eq!(c.tick(2000, WindowCounts { full: 20, timed_out: 0 }), Some(3), "128 clients: 51 <= 64");
        feed(&mut c, 128, 10);
        assert_eq!(c.tick(3000, WindowCounts { full: 20, timed_out: 0 }), None, "stays");
        assert_eq!(c.switches(), 2);
    }

    #[test]
    fn blocks_retired_by_the_timer_step_down_at_once_and_hold_off() {
        let mut c = BlockChooser::new(RINGS.to_vec(), 1000);
        c.tick(0, WindowCounts::default());
        feed(&mut c, 128, 4);
        assert_eq!(c.tick(1000, WindowCounts { full: 10, timed_out: 0 }), Some(3));
        // The same clients, but now most blocks time out (the rate fell): down one.
        feed(&mut c, 128, 1);
        assert_eq!(c.tick(2000, WindowCounts { full: 1, timed_out: 5 }), Some(2));
        // Back to full blocks: not straight up again while cooling down.
        for t in 3..=6 {
            feed(&mut c, 128, 4);
            assert_eq!(c.tick(t * 1000, WindowCounts { full: 10, timed_out: 0 }), None, "window {t}");
        }
        feed(&mut c, 128, 4);
        assert_eq!(c.tick(7000, WindowCounts { full: 10, timed_out: 0 }), Some(3));
    }

    #[test]
    fn an_idle_window_changes_nothing_and_few_clients_get_the_smallest_block() {
        let mut c = BlockChooser::new(RINGS.to_vec(), 1000);
        c.tick(0, WindowCounts::default());
        assert_eq!(c.tick(1000, WindowCounts::default()), None);
        feed(&mut c, 4, 10);
        assert_eq!(c.tick(2000, WindowCounts { full: 0, timed_out: 3 }), None, "already the smallest");
        assert_eq!(c.active(), 0);
    }

    #[test]
    fn sources_are_bounded() {
        let mut c = BlockChooser::new(RINGS.to_vec(), 1000);
        for k in 0..10_000u32 {
            c.on_frame(SocketAddr::from(([10, (k >> 16) as u8, (k >> 8) as u8, k as u8], 9)), 100);
        }
        assert_eq!(c.sources.len(), MAX_SOURCES);
    }
}

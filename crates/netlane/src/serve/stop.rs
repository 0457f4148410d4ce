//! The stop signal of a server: set once, seen by every loop at once.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::eventfd::{EfdFlags, EventFd};

/// A server's stop signal; clones share it. Loops either test [`Stop::is_stopped`]
/// between steps or wait on [`Stop::as_fd`] beside their own descriptors: once stopped,
/// the descriptor stays readable (its count is never read back), so every wait on it
/// returns at once, level-triggered, in any number of loops.
#[derive(Debug, Clone)]
pub struct Stop(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    stopped: AtomicBool,
    wake: EventFd,
}

impl Stop {
    /// A signal not yet given.
    pub fn new() -> io::Result<Stop> {
        let wake = EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)?;
        Ok(Stop(Arc::new(Inner { stopped: AtomicBool::new(false), wake })))
    }

    /// Gives the signal: every loop waiting on it wakes. Giving it again changes nothing.
    pub fn stop(&self) {
        if !self.0.stopped.swap(true, Ordering::AcqRel) {
            // A write fails only when the count would overflow, which one write
            // cannot do; the flag is set whatever happens.
            let _ = self.0.wake.write(1);
        }
    }

    /// Whether the signal was given.
    pub fn is_stopped(&self) -> bool {
        self.0.stopped.load(Ordering::Acquire)
    }

    /// The flag alone, for loops that test it between steps and never sleep (load
    /// generators, clients); servers wait on [`Stop::as_fd`] instead. Set it only
    /// through [`Stop::stop`], which also wakes the waiters.
    pub fn flag(&self) -> &AtomicBool {
        &self.0.stopped
    }

    /// Sleeps up to `d` (at most about a minute: a caller that waits longer waits again),
    /// returning early when the signal is given; true when it was.
    pub fn wait(&self, d: Duration) -> bool {
        if self.is_stopped() {
            return true;
        }
        let ms = u16::try_from(d.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(self.as_fd(), PollFlags::POLLIN)];
        // EINTR or a spurious return only shortens the sleep: callers loop.
        let _ = poll(&mut fds, PollTimeout::from(ms));
        self.is_stopped()
    }
}

impl AsFd for Stop {
    /// Readable once the signal is given, and from then on.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.wake.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[test]
    fn a_stop_wakes_every_waiter_at_once() {
        let stop = Stop::new().unwrap();
        assert!(!stop.is_stopped());
        let t = Instant::now();
        assert!(!stop.wait(Duration::from_millis(20)), "no signal: the wait runs out");
        assert!(t.elapsed() >= Duration::from_millis(15));
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let s = stop.clone();
                std::thread::spawn(move || s.wait(Duration::from_secs(30)))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(20));
        let t = Instant::now();
        stop.stop();
        stop.stop();
        for w in waiters {
            assert!(w.join().unwrap());
        }
        assert!(t.elapsed() < Duration::from_secs(5), "the waiters woke on the signal, not their timeout");
        // The descriptor stays readable: a later poll on it returns at once.
        let mut fds = [PollFd::new(stop.as_fd(), PollFlags::POLLIN)];
        assert_eq!(poll(&mut fds, PollTimeout::ZERO).unwrap(), 1);
    }
}

//! Per-epoll busy-poll parameters (`EPIOCSPARAMS`/`EPIOCGPARAMS`, Linux 6.9,
//! include/uapi/linux/eventpoll.h).
//!
//! These replace the global `net.core.busy_poll` sysctl for one epoll instance: the
//! kernel's NAPI documentation recommends them, and they are what a "lane" worker uses.
//!
//! Also [`wait`]: `epoll_pwait2` (Linux 5.11), whose timeout is a `timespec`, for loops
//! whose deadlines are finer than `epoll_wait`'s milliseconds (a client thinking for
//! 200 us must not think for 1 ms).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Duration;

use nix::sys::epoll::{Epoll, EpollEvent};

use crate::cvt;

/// `struct epoll_params`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EpollParams {
    /// Microseconds to busy-poll before sleeping (0 = off).
    pub busy_poll_usecs: u32,
    /// Packets per poll (above 64 needs CAP_NET_ADMIN).
    pub busy_poll_budget: u16,
    /// 1 = prefer busy polling over softirq processing (SO_PREFER_BUSY_POLL semantics).
    pub prefer_busy_poll: u8,
    /// Must be zero.
    pub pad: u8,
}

/// `_IOW(0x8A, 0x01, struct epoll_params)`.
pub const EPIOCSPARAMS: libc::c_ulong = ioc(1, 0x8A, 0x01, std::mem::size_of::<EpollParams>());
/// `_IOR(0x8A, 0x02, struct epoll_params)`.
pub const EPIOCGPARAMS: libc::c_ulong = ioc(2, 0x8A, 0x02, std::mem::size_of::<EpollParams>());

/// The generic `_IOC` encoding (include/uapi/asm-generic/ioctl.h): dir 1 = write,
/// 2 = read.
const fn ioc(dir: u64, ty: u64, nr: u64, size: usize) -> libc::c_ulong {
    ((dir << 30) | ((size as u64) << 16) | (ty << 8) | nr) as libc::c_ulong
}

/// Sets busy-poll parameters on an epoll file descriptor.
pub fn set_params(epfd: BorrowedFd<'_>, params: &EpollParams) -> io::Result<()> {
    // SAFETY: EPIOCSPARAMS reads one `struct epoll_params` from the pointer, which is
    // a live, initialised, repr(C) value of exactly that layout (eventpoll.h).
    cvt(unsafe { libc::ioctl(epfd.as_raw_fd(), EPIOCSPARAMS as _, params as *const EpollParams) })?;
    Ok(())
}

/// Reads busy-poll parameters from an epoll file descriptor.
pub fn get_params(epfd: BorrowedFd<'_>) -> io::Result<EpollParams> {
    let mut params = EpollParams::default();
    // SAFETY: EPIOCGPARAMS writes one `struct epoll_params` to the pointer, which is a
    // live, exclusively borrowed repr(C) value of exactly that layout.
    cvt(unsafe { libc::ioctl(epfd.as_raw_fd(), EPIOCGPARAMS as _, &mut params as *mut EpollParams) })?;
    Ok(params)
}

/// Waits on `ep` for at most `timeout` (None: without limit), with nanosecond
/// precision; returns how many of `events` were filled.
pub fn wait(ep: &Epoll, events: &mut [EpollEvent], timeout: Option<Duration>) -> nix::Result<usize> {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let max = events.len().min(i32::MAX as usize) as libc::c_int;
    // SAFETY: nix declares `EpollEvent` `#[repr(transparent)]` over `libc::epoll_event`,
    // so the slice is `max` valid, exclusively borrowed `epoll_event`s for the kernel to
    // fill; the timespec (when given) lives on this frame for the call; a null sigmask
    // leaves the signal mask alone.
    let n = unsafe {
        libc::epoll_pwait2(
            ep.0.as_raw_fd(),
            events.as_mut_ptr().cast::<libc::epoll_event>(),
            max,
            ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec),
            std::ptr::null(),
        )
    };
    nix::errno::Errno::result(n).map(|n| n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_the_uapi_header() {
        assert_eq!(EPIOCSPARAMS, 0x4008_8a01);
        assert_eq!(EPIOCGPARAMS, 0x8008_8a02);
        assert_eq!(std::mem::size_of::<EpollParams>(), 8);
    }

    #[test]
    fn wait_honours_a_sub_millisecond_timeout_and_reports_ready_events() {
        use nix::sys::epoll::{EpollCreateFlags, EpollFlags};
        use std::os::fd::AsFd;
        let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).unwrap();
        let mut events = [EpollEvent::empty(); 4];
        assert_eq!(wait(&ep, &mut events, Some(Duration::from_micros(200))).unwrap(), 0);
        let (a, b) = std::os::unix::net::UnixDatagram::pair().unwrap();
        ep.add(b.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, 7)).unwrap();
        a.send(b"x").unwrap();
        assert_eq!(wait(&ep, &mut events, None).unwrap(), 1);
        assert_eq!(events[0].data(), 7);
    }
}

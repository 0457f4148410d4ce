//! Socket options by number, for the ones `socket2` does not wrap.
//!
//! Typed wrappers (UDP GSO/GRO, zerocopy, busy polling, NAPI id) live in
//! `netlane::sockopt`; this module only moves integers and structs across the boundary.

use std::io;
use std::mem;
use std::os::fd::{AsRawFd, BorrowedFd};

use crate::cvt;

/// `setsockopt(2)` with an `int` value.
pub fn set_int(fd: BorrowedFd<'_>, level: i32, name: i32, value: i32) -> io::Result<()> {
    set_raw(fd, level, name, &value)
}

/// `getsockopt(2)` of an `int` value.
pub fn get_int(fd: BorrowedFd<'_>, level: i32, name: i32) -> io::Result<i32> {
    let mut value: i32 = 0;
    let mut len = mem::size_of::<i32>() as libc::socklen_t;
    // SAFETY: `value` and `len` are live locals; getsockopt(2) writes at most `len`
    // bytes into `value` and updates `len`.
    cvt(unsafe { libc::getsockopt(fd.as_raw_fd(), level, name, (&mut value as *mut i32).cast(), &mut len) })?;
    Ok(value)
}

/// `setsockopt(2)` with a `u64` value (e.g. `SO_MAX_PACING_RATE`, which takes 64 bits
/// since Linux 4.20).
pub fn set_u64(fd: BorrowedFd<'_>, level: i32, name: i32, value: u64) -> io::Result<()> {
    set_raw(fd, level, name, &value)
}

/// `SO_TXTIME` with `struct sock_txtime { clockid_t clockid; __u32 flags; }`.
pub fn set_txtime(fd: BorrowedFd<'_>, clockid: libc::clockid_t, flags: u32) -> io::Result<()> {
    let cfg = libc::sock_txtime { clockid, flags };
    set_raw(fd, libc::SOL_SOCKET, libc::SO_TXTIME, &cfg)
}

/// Reads back `SO_TXTIME`: `(clockid, flags)`.
pub fn get_txtime(fd: BorrowedFd<'_>) -> io::Result<(libc::clockid_t, u32)> {
    let mut cfg = libc::sock_txtime { clockid: 0, flags: 0 };
    let mut len = mem::size_of::<libc::sock_txtime>() as libc::socklen_t;
    // SAFETY: `cfg` and `len` are live locals; the kernel writes at most `len` bytes.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_TXTIME,
            (&mut cfg as *mut libc::sock_txtime).cast(),
            &mut len,
        )
    })?;
    Ok((cfg.clockid, cfg.flags))
}

/// `getsockopt(2)` of a plain C struct `T`: fills `value` (which starts as a valid
/// `T`; the kernel may write fewer bytes than its size, e.g. an older layout).
pub(crate) fn get_raw<T: Copy>(fd: BorrowedFd<'_>, level: i32, name: i32, value: &mut T) -> io::Result<()> {
    let mut len = mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: `value` is a live, initialised `T` and `len` its size; getsockopt(2)
    // writes at most `len` bytes into it and updates `len`. Callers pick `T` to match
    // the option's kernel type, for which any bytes are a valid value.
    cvt(unsafe { libc::getsockopt(fd.as_raw_fd(), level, name, (value as *mut T).cast(), &mut len) })?;
    Ok(())
}

pub(crate) fn set_raw<T: Copy>(fd: BorrowedFd<'_>, level: i32, name: i32, value: &T) -> io::Result<()> {
    // SAFETY: `value` is a live, initialised `T` of the size passed; setsockopt(2) only
    // reads it. Callers pick `T` to match the option's kernel type.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            mem::size_of::<T>() as libc::socklen_t,
        )
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsFd;

    #[test]
    fn int_round_trip() {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        set_int(s.as_fd(), libc::SOL_SOCKET, libc::SO_PRIORITY, 3).unwrap();
        assert_eq!(get_int(s.as_fd(), libc::SOL_SOCKET, libc::SO_PRIORITY).unwrap(), 3);
    }

    #[test]
    fn txtime_round_trip() {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        set_txtime(s.as_fd(), libc::CLOCK_MONOTONIC, crate::consts::SOF_TXTIME_REPORT_ERRORS).unwrap();
        assert_eq!(get_txtime(s.as_fd()).unwrap(), (libc::CLOCK_MONOTONIC, crate::consts::SOF_TXTIME_REPORT_ERRORS));
    }

    #[test]
    fn unknown_option_is_an_error() {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(set_int(s.as_fd(), libc::SOL_UDP, 9999, 1).is_err());
    }
}

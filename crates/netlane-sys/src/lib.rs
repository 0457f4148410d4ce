//! netlane's only boundary to the kernel.
//!
//! Everything in netlane that needs `unsafe` lives in this crate, one module per
//! mechanism, in the style of mio's `sys/`:
//!
//! - [`bpf`]: the BPF programs under `bpf/` (compiled by the build script with clang,
//!   libbpf-rs skeletons generated from their BTF), loading and `BPF_PROG_RUN`;
//! - [`cmsg`]: control messages (ancillary data) encoded and decoded as plain bytes, so
//!   the parsers are safe code that cannot panic on any input;
//! - [`errqueue`]: `sock_extended_err` records from `MSG_ERRQUEUE` (zerocopy completion
//!   ranges, txtime errors);
//! - [`ethtool`]: a device's RSS indirection table and hash key (`SIOCETHTOOL`);
//! - [`msg`]: `sendmsg`/`recvmsg`/`sendmmsg`/`recvmmsg` over caller-owned buffers;
//! - [`sockopt`]: socket options the `libc`/`socket2` crates do not wrap (UDP GSO/GRO,
//!   zerocopy, txtime, busy polling, NAPI id);
//! - [`epoll`]: per-epoll busy-poll parameters (`EPIOCSPARAMS`, Linux 6.9);
//! - [`packet`]: PF_PACKET receive rings (TPACKET_V2 and V3) mapped from the kernel,
//!   with classic BPF socket filters;
//! - [`xsk`]: AF_XDP receive sockets (UMEM, fill/completion/RX rings, need-wakeup);
//! - [`process`]: entering a network namespace between fork and exec, and reaping a
//!   child with its resource usage.
//!
//! Every `unsafe` block carries a `// SAFETY:` comment naming the rule it relies on
//! (usually the man page of the call).
//!
//! # Minimum kernel version
//! The crate compiles against any Linux; individual features need: UDP GSO 4.18,
//! UDP GRO 5.0, MSG_ZEROCOPY for UDP 5.0, SO_TXTIME 4.19, SO_PREFER_BUSY_POLL 5.11,
//! EPIOCSPARAMS 6.9. Callers probe at run time (see `netlane::probe`).

#![deny(missing_docs)]

pub mod bpf;
pub mod cmsg;
pub mod consts;
pub mod epoll;
pub mod errqueue;
pub mod ethtool;
mod mapping;
pub mod msg;
pub mod packet;
pub mod process;
pub mod sockopt;
pub mod xsk;

use std::io;

/// Turns the C convention "-1 and errno" into an `io::Result`.
#[inline]
pub(crate) fn cvt<T: IsMinusOne>(res: T) -> io::Result<T> {
    if res.is_minus_one() { Err(io::Error::last_os_error()) } else { Ok(res) }
}

/// Integer return types of libc calls that signal failure with -1.
pub(crate) trait IsMinusOne: Copy {
    fn is_minus_one(self) -> bool;
}

impl IsMinusOne for libc::c_int {
    fn is_minus_one(self) -> bool {
        self == -1
    }
}

impl IsMinusOne for libc::ssize_t {
    fn is_minus_one(self) -> bool {
        self == -1
    }
}

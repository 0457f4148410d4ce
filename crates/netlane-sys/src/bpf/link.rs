//! Attaching programs to interfaces, as BPF links owned by RAII guards: dropping the
//! guard closes the link and the kernel detaches the program (also when the process
//! dies, since nothing is pinned). Plus the kernel's per-program run-time statistics.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// How an XDP program is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdpMode {
    /// In the driver (veth, real NICs).
    Native,
    /// In the generic (skb) path, after the stack allocated an skb.
    Generic,
}

impl XdpMode {
    /// "native" or "generic".
    pub fn name(self) -> &'static str {
        match self {
            XdpMode::Native => "native",
            XdpMode::Generic => "generic",
        }
    }
}

/// An XDP program attached to an interface (a BPF link); detached on drop.
#[derive(Debug)]
pub struct XdpLink {
    fd: OwnedFd,
    ifindex: u32,
    mode: XdpMode,
}

impl XdpLink {
    /// Attaches `prog` to interface `ifindex` (in the caller's network namespace) in
    /// `mode`.
    pub fn attach(prog: BorrowedFd<'_>, ifindex: u32, mode: XdpMode) -> io::Result<XdpLink> {
        let flags = match mode {
            XdpMode::Native => libbpf_sys::XDP_FLAGS_DRV_MODE,
            XdpMode::Generic => libbpf_sys::XDP_FLAGS_SKB_MODE,
        };
        let fd = link_create(prog, ifindex, libbpf_sys::BPF_XDP, flags)?;
        Ok(XdpLink { fd, ifindex, mode })
    }

    /// Native mode, or generic when the driver has no native XDP; says which it got.
    pub fn attach_native_or_generic(prog: BorrowedFd<'_>, ifindex: u32) -> io::Result<(XdpLink, Option<io::Error>)> {
        match XdpLink::attach(prog, ifindex, XdpMode::Native) {
            Ok(l) => Ok((l, None)),
            Err(native) => XdpLink::attach(prog, ifindex, XdpMode::Generic).map(|l| (l, Some(native))),
        }
    }

    /// The mode it is attached in.
    pub fn mode(&self) -> XdpMode {
        self.mode
    }

    /// The interface.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// Runs `prog` instead of the current program, atomically (BPF_LINK_UPDATE): the
    /// interface never goes without a program in between.
    pub fn replace_program(&self, prog: BorrowedFd<'_>) -> io::Result<()> {
        // SAFETY: both fds are valid for the duration of the call; a null options
        // pointer means no options; libbpf returns 0 or a negative errno.
        let rc = unsafe { libbpf_sys::bpf_link_update(self.fd.as_raw_fd(), prog.as_raw_fd(), std::ptr::null()) };
        if rc < 0 {
            return Err(io::Error::from_raw_os_error(-rc));
        }
        Ok(())
    }
}

impl AsFd for XdpLink {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A tc program attached with TCX (Linux 6.6) on an interface's egress or ingress;
/// detached on drop.
#[derive(Debug)]
pub struct TcxLink {
    _fd: OwnedFd,
}

impl TcxLink {
    /// Attaches `prog` (a `SEC("tc")` program) to egress of `ifindex` (in the caller's
    /// network namespace), after any programs already there.
    pub fn attach_egress(prog: BorrowedFd<'_>, ifindex: u32) -> io::Result<TcxLink> {
        Ok(TcxLink { _fd: link_create(prog, ifindex, libbpf_sys::BPF_TCX_EGRESS, 0)? })
    }

    /// Attaches `prog` (a `SEC("tc")` program) to ingress of `ifindex` (in the caller's
    /// network namespace), after any programs already there.
    pub fn attach_ingress(prog: BorrowedFd<'_>, ifindex: u32) -> io::Result<TcxLink> {
        Ok(TcxLink { _fd: link_create(prog, ifindex, libbpf_sys::BPF_TCX_INGRESS, 0)? })
    }
}

fn link_create(
    prog: BorrowedFd<'_>,
    ifindex: u32,
    attach_type: libbpf_sys::bpf_attach_type,
    flags: u32,
) -> io::Result<OwnedFd> {
    let target = i32::try_from(ifindex)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("interface index {ifindex} out of range")))?;
    // SAFETY: bpf_link_create_opts is a plain C struct for which all-zero is the
    // documented "no options" value; `sz` tells libbpf which fields exist.
    let mut opts: libbpf_sys::bpf_link_create_opts = unsafe { std::mem::zeroed() };
    opts.sz = std::mem::size_of::<libbpf_sys::bpf_link_create_opts>() as _;
    opts.flags = flags;
    // SAFETY: `prog` is a valid program fd for the duration of the call and `opts` a
    // valid, initialised options struct; libbpf returns a new fd or a negative errno.
    let fd = unsafe { libbpf_sys::bpf_link_create(prog.as_raw_fd(), target, attach_type, &opts) };
    if fd < 0 {
        return Err(io::Error::from_raw_os_error(-fd));
    }
    // SAFETY: a non-negative return is a new link fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Turns on the kernel's run-time statistics for all BPF programs (run count and
/// nanoseconds) for as long as the returned fd is open.
pub fn enable_run_time_stats() -> io::Result<OwnedFd> {
    // SAFETY: bpf_enable_stats takes a plain enum value and returns a new fd or a
    // negative errno.
    let fd = unsafe { libbpf_sys::bpf_enable_stats(libbpf_sys::BPF_STATS_RUN_TIME) };
    if fd < 0 {
        return Err(io::Error::from_raw_os_error(-fd));
    }
    // SAFETY: a non-negative return is a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A program's (run count, total run time in ns) so far, as the kernel counts them
/// while run-time statistics are enabled.
pub fn program_run_stats(prog: BorrowedFd<'_>) -> io::Result<(u64, u64)> {
    // SAFETY: bpf_prog_info is a plain C struct; all-zero asks for no arrays.
    let mut info: libbpf_sys::bpf_prog_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libbpf_sys::bpf_prog_info>() as u32;
    // SAFETY: `info` is valid for `len` bytes and outlives the call.
    let rc = unsafe { libbpf_sys::bpf_prog_get_info_by_fd(prog.as_raw_fd(), &mut info, &mut len) };
    if rc < 0 {
        return Err(io::Error::from_raw_os_error(-rc));
    }
    Ok((info.run_cnt, info.run_time_ns))
}

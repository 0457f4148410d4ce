//! Child processes: entering a network namespace or a cgroup between fork and exec, and reaping a
//! child together with its CPU usage.

use std::io;
use std::os::fd::RawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus};
use std::time::Duration;

use crate::cvt;

/// Makes `cmd`'s child call `setns(netns_fd, CLONE_NEWNET)` before it executes.
///
/// The descriptor must stay open in the parent until the child is spawned; it may be
/// close-on-exec (the call happens before exec).
pub fn enter_netns_before_exec(cmd: &mut Command, netns_fd: RawFd) {
    let hook = move || {
        // SAFETY: setns(2) is a single system call and async-signal-safe, as required
        // between fork and exec (CommandExt::pre_exec); it takes no pointers.
        cvt(unsafe { libc::setns(netns_fd, libc::CLONE_NEWNET) }).map(drop)
    };
    // SAFETY: the hook only makes a system call: no allocation, no locks, nothing that
    // could deadlock in the forked child (the pre_exec contract).
    unsafe {
        cmd.pre_exec(hook);
    }
}

/// Makes `cmd`'s child move itself into the cgroup whose `cgroup.procs` file is open
/// (for writing) as `procs_fd`, before it executes: everything the program does, its
/// first socket included, happens inside the cgroup.
///
/// The descriptor must stay open in the parent until the child is spawned.
pub fn enter_cgroup_before_exec(cmd: &mut Command, procs_fd: RawFd) {
    let hook = move || {
        // "0" names the writing process itself (cgroup-v2(7), cgroup.procs).
        let pid = b"0";
        // SAFETY: write(2) is a single async-signal-safe system call; `pid` is a live
        // static buffer of the length passed.
        let n = cvt(unsafe { libc::write(procs_fd, pid.as_ptr().cast(), pid.len()) as i32 })?;
        if n as usize != pid.len() {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    };
    // SAFETY: the hook only makes a system call: no allocation, no locks (the pre_exec
    // contract).
    unsafe {
        cmd.pre_exec(hook);
    }
}

/// Makes `cmd`'s child get SIGKILL when the thread that spawned it exits
/// (`PR_SET_PDEATHSIG`), so a helper process never outlives a benchmark that was
/// killed. Spawn from a thread that lives as long as the child should.
pub fn kill_with_parent(cmd: &mut Command) {
    let parent = std::process::id() as libc::pid_t;
    let hook = move || {
        // SAFETY: prctl(2) with PR_SET_PDEATHSIG takes a signal number, no pointers;
        // async-signal-safe as the pre_exec contract needs.
        cvt(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) })?;
        // The parent may have died before the call: then no signal will come.
        // SAFETY: getppid(2) takes no arguments and cannot fail.
        if unsafe { libc::getppid() } != parent {
            // (ESRCH: a raw error, no allocation after fork.)
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        Ok(())
    };
    // SAFETY: the hook only makes system calls: no allocation, no locks (the pre_exec
    // contract).
    unsafe {
        cmd.pre_exec(hook);
    }
}

/// CPU time a reaped child used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChildUsage {
    /// How it exited.
    pub status: ExitStatus,
    /// User CPU time.
    pub user: Duration,
    /// System CPU time.
    pub system: Duration,
    /// Voluntary context switches.
    pub voluntary_switches: u64,
    /// Involuntary context switches.
    pub involuntary_switches: u64,
}

/// Waits for `child` with `wait4(2)` and returns its exit status and resource usage.
/// The child is reaped: do not call `Child::wait` on it afterwards.
pub fn wait_with_usage(child: &mut Child) -> io::Result<ChildUsage> {
    let pid = child.id() as libc::pid_t;
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain data; all-zero is valid.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `status` and `usage` are live locals wait4(2) writes into.
        match cvt(unsafe { libc::wait4(pid, &mut status, 0, &mut usage) }) {
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000);
    Ok(ChildUsage {
        status: ExitStatus::from_raw(status),
        user: tv(usage.ru_utime),
        system: tv(usage.ru_stime),
        voluntary_switches: usage.ru_nvcsw.max(0) as u64,
        involuntary_switches: usage.ru_nivcsw.max(0) as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reaps_with_usage() {
        let mut child =
            Command::new("sh").arg("-c").arg("i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done").spawn().unwrap();
        let u = wait_with_usage(&mut child).unwrap();
        assert!(u.status.success());
        assert!(u.user + u.system > Duration::ZERO, "a busy loop used no CPU: {u:?}");
    }
}

//! Per-application policy: the cgroup socket program that gives every socket of an
//! application its priority and mark (`bpf/lanes/app_sock.bpf.c`), and the egress
//! classifier that maps a mark to the application's htb class
//! (`bpf/lanes/app_class.bpf.c`).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags};

use super::{TcxLink, app_class_skel, app_sock_skel, object_storage, percpu_sum, to_io};

/// Most applications the egress classifier holds (`MAX_APPS` in the C).
pub const APP_CLASS_MAX: usize = 4096;

/// The socket program of one application, loaded with its priority and mark.
pub struct AppSockPolicy {
    skel: app_sock_skel::AppSockSkel<'static>,
}

impl std::fmt::Debug for AppSockPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppSockPolicy").finish_non_exhaustive()
    }
}

/// The socket programs attached to a cgroup; detached on drop.
pub struct CgroupLink {
    _create: libbpf_rs::Link,
    _sockops: libbpf_rs::Link,
}

impl std::fmt::Debug for CgroupLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CgroupLink").finish_non_exhaustive()
    }
}

impl AppSockPolicy {
    /// Loads the program: sockets it sees get `priority` and `mark`.
    pub fn load(priority: u32, mark: u32) -> io::Result<AppSockPolicy> {
        let mut open = app_sock_skel::AppSockSkelBuilder::default().open(object_storage()).map_err(to_io)?;
        let ro = open.maps.rodata_data.as_deref_mut().ok_or_else(|| io::Error::other("app_sock has no .rodata"))?;
        ro.app_priority = priority;
        ro.app_mark = mark;
        Ok(AppSockPolicy { skel: open.load().map_err(to_io)? })
    }

    /// Attaches it to the cgroup (v2 directory) open as `cgroup`: every IPv4 and IPv6
    /// socket a process in it (or in a cgroup below it) creates from now on, and every
    /// TCP connection its listeners accept, gets the policy.
    pub fn attach(&self, cgroup: BorrowedFd<'_>) -> io::Result<CgroupLink> {
        let create = self.skel.progs.app_sock.attach_cgroup(cgroup.as_raw_fd()).map_err(to_io)?;
        let sockops = self.skel.progs.app_sockops.attach_cgroup(cgroup.as_raw_fd()).map_err(to_io)?;
        Ok(CgroupLink { _create: create, _sockops: sockops })
    }

    /// (sockets created with the policy, accepted connections given it) so far.
    pub fn sockets(&self) -> io::Result<(u64, u64)> {
        Ok((percpu_sum(&self.skel.maps.app_sock_stats, 0)?, percpu_sum(&self.skel.maps.app_sock_stats, 1)?))
    }
}

/// The egress classifier: packets whose mark is an application's go to its class.
pub struct AppClassifier {
    skel: app_class_skel::AppClassSkel<'static>,
}

impl std::fmt::Debug for AppClassifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppClassifier").finish_non_exhaustive()
    }
}

impl AppClassifier {
    /// Loads it with no applications: every packet passes untouched.
    pub fn load() -> io::Result<AppClassifier> {
        let open = app_class_skel::AppClassSkelBuilder::default().open(object_storage()).map_err(to_io)?;
        Ok(AppClassifier { skel: open.load().map_err(to_io)? })
    }

    /// Attaches it to egress of `ifindex` (in the caller's network namespace).
    pub fn attach_egress(&self, ifindex: u32) -> io::Result<TcxLink> {
        TcxLink::attach_egress(self.skel.progs.app_class.as_fd(), ifindex)
    }

    /// Packets marked `mark` go to class `classid` (major << 16 | minor).
    pub fn set(&self, mark: u32, classid: u32) -> io::Result<()> {
        self.skel.maps.app_classes.update(&mark.to_ne_bytes(), &classid.to_ne_bytes(), MapFlags::ANY).map_err(to_io)
    }

    /// Packets marked `mark` are left alone again.
    pub fn remove(&self, mark: u32) -> io::Result<()> {
        match self.skel.maps.app_classes.delete(&mark.to_ne_bytes()) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(to_io(e)),
        }
    }

    /// (packets put in an application's class, packets left alone).
    pub fn counts(&self) -> io::Result<(u64, u64)> {
        Ok((percpu_sum(&self.skel.maps.app_class_stats, 0)?, percpu_sum(&self.skel.maps.app_class_stats, 1)?))
    }
}

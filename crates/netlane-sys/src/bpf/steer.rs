//! Ingress steering into queue groups (`bpf/lanes/queue_steer.bpf.c`): the NIC's
//! classifier emulated on the wire side of a veth, rules {destination -> queue group}
//! applied by a TCX egress program that picks the transmit queue, and so the peer's
//! receive queue, of each new flow.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags};

use super::queue_steer_skel::types::{steer_group, steer_key};
use super::{TcxLink, object_storage, percpu_sum, queue_steer_skel, to_io};

/// Most rules the program holds (`MAX_STEER_RULES` in the C).
pub const STEER_MAX_RULES: usize = 1024;

/// TCP or UDP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SteerProto {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

/// The program, loaded (not yet attached).
pub struct QueueSteer {
    skel: queue_steer_skel::QueueSteerSkel<'static>,
}

impl std::fmt::Debug for QueueSteer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueSteer").finish_non_exhaustive()
    }
}

fn key(dst: SocketAddr, proto: SteerProto) -> steer_key {
    let mut k = steer_key::default();
    match dst.ip() {
        IpAddr::V4(a) => {
            k.family = 4;
            k.addr[0] = u32::from_ne_bytes(a.octets());
        }
        IpAddr::V6(a) => {
            k.family = 6;
            for (w, c) in k.addr.iter_mut().zip(a.octets().chunks_exact(4)) {
                *w = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
    }
    k.port = u16::from_ne_bytes(dst.port().to_be_bytes());
    k.proto = match proto {
        SteerProto::Tcp => 6,
        SteerProto::Udp => 17,
    };
    k
}

/// The skeleton's map key and value types, which are plain integers without padding.
trait Plain: Copy {}
impl Plain for steer_key {}
impl Plain for steer_group {}
const _: () = assert!(std::mem::size_of::<steer_key>() == 16 + 2 + 1 + 1);
const _: () = assert!(std::mem::size_of::<steer_group>() == 4 + 4);

/// The bytes of a map key or value.
fn bytes_of<T: Plain>(v: &T) -> &[u8] {
    // SAFETY: `T` is one of the skeleton's #[repr(C)] structs generated from the
    // program's BTF (the `Plain` impls above), made only of integers and integer arrays
    // with no padding (the size assertions above), so every byte is initialised; the
    // slice borrows `v` for its lifetime.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}

impl QueueSteer {
    /// Loads it with no rules: every packet passes untouched.
    pub fn load() -> io::Result<QueueSteer> {
        let open = queue_steer_skel::QueueSteerSkelBuilder::default().open(object_storage()).map_err(to_io)?;
        Ok(QueueSteer { skel: open.load().map_err(to_io)? })
    }

    /// Attaches it to egress of `ifindex` (in the caller's namespace): the end of a veth
    /// whose peer's receive queues are to be chosen. The device must have no XPS map
    /// (a veth has none unless one is set), or XPS picks the queue instead.
    pub fn attach_egress(&self, ifindex: u32) -> io::Result<TcxLink> {
        TcxLink::attach_egress(self.skel.progs.queue_steer.as_fd(), ifindex)
    }

    /// New flows to `dst` over `proto` go to queues `first .. first + count`.
    pub fn set(&self, dst: SocketAddr, proto: SteerProto, first: u32, count: u32) -> io::Result<()> {
        if count == 0 || first.checked_add(count).is_none_or(|end| end > u32::from(u16::MAX)) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("queue group {first}+{count} is empty or too large"),
            ));
        }
        let group = steer_group { first, count };
        self.skel.maps.steer_rules.update(bytes_of(&key(dst, proto)), bytes_of(&group), MapFlags::ANY).map_err(to_io)
    }

    /// New flows to `dst` are left to the kernel's choice again.
    pub fn remove(&self, dst: SocketAddr, proto: SteerProto) -> io::Result<()> {
        match self.skel.maps.steer_rules.delete(bytes_of(&key(dst, proto))) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(to_io(e)),
        }
    }

    /// (packets given a queue, packets left alone).
    pub fn counts(&self) -> io::Result<(u64, u64)> {
        Ok((percpu_sum(&self.skel.maps.steer_stats, 0)?, percpu_sum(&self.skel.maps.steer_stats, 1)?))
    }
}

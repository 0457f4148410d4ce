//! A veth's receive queue recorded as a NIC driver records it
//! (`bpf/lanes/rxq_record.bpf.c`), so that XPS by receive queue pairs queues on a veth.

use std::io;
use std::os::fd::AsFd;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};

use super::{TcxLink, object_storage, percpu_sum, rxq_record_skel, to_io};

/// The program, loaded (not yet attached).
pub struct RxQueueRecord {
    skel: rxq_record_skel::RxqRecordSkel<'static>,
}

impl std::fmt::Debug for RxQueueRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxQueueRecord").finish_non_exhaustive()
    }
}

impl RxQueueRecord {
    /// Loads it for a device with `rx_queues` receive queues.
    pub fn load(rx_queues: u32) -> io::Result<RxQueueRecord> {
        let mut open = rxq_record_skel::RxqRecordSkelBuilder::default().open(object_storage()).map_err(to_io)?;
        let ro = open.maps.rodata_data.as_deref_mut().ok_or_else(|| io::Error::other("rxq_record has no .rodata"))?;
        ro.rx_queues = rx_queues;
        Ok(RxQueueRecord { skel: open.load().map_err(to_io)? })
    }

    /// Attaches it to ingress of `ifindex` (in the caller's namespace): the veth end
    /// whose sockets reply.
    pub fn attach_ingress(&self, ifindex: u32) -> io::Result<TcxLink> {
        TcxLink::attach_ingress(self.skel.progs.rxq_record.as_fd(), ifindex)
    }

    /// (packets whose queue was recorded, packets left alone).
    pub fn counts(&self) -> io::Result<(u64, u64)> {
        Ok((percpu_sum(&self.skel.maps.rxq_stats, 0)?, percpu_sum(&self.skel.maps.rxq_stats, 1)?))
    }
}

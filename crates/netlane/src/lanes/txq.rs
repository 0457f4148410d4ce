//! Transmit alignment on a veth. XPS by receive queue (`xps_rxqs`) sends a socket's
//! packets by the transmit queue paired with the receive queue its packets arrive on,
//! as TCP recorded it from the driver. A veth driver records none, so on a veth the
//! recorded queue is the peer's transmit queue shifted by one (queue 0 reads as none,
//! and a socket that never got one keeps whatever its memory held, most often 0):
//! replies pile onto transmit queue 0. [`RecordedRxQueues`] records the queue on the
//! veth's ingress as a NIC driver does; `nic::set_mq` and `nic::tx_queue_packets` count
//! what leaves by each transmit queue.

use netlane_sys::bpf::{RxQueueRecord, TcxLink};

use crate::error::IoError;

/// The recording program on a veth end's ingress; detached on drop.
#[derive(Debug)]
pub struct RecordedRxQueues {
    prog: RxQueueRecord,
    _link: TcxLink,
}

impl RecordedRxQueues {
    /// Attaches it to ingress of `ifindex` (a veth end with `rx_queues` receive queues,
    /// in the calling thread's namespace).
    pub fn install(ifindex: u32, rx_queues: u32) -> Result<RecordedRxQueues, IoError> {
        let prog = RxQueueRecord::load(rx_queues).map_err(|e| IoError::new("load the receive queue recorder", e))?;
        let link = prog.attach_ingress(ifindex).map_err(|e| IoError::new("attach the receive queue recorder", e))?;
        Ok(RecordedRxQueues { prog, _link: link })
    }

    /// (packets whose queue was recorded, packets left alone).
    pub fn counts(&self) -> Result<(u64, u64), IoError> {
        self.prog.counts().map_err(|e| IoError::new("read the receive queue recorder's counters", e))
    }
}

//! The UDP receiver: one datagram per `recvmsg`, or `recvmmsg` batches; coalesced
//! `UDP_GRO` reads split back into the datagrams the sender sent.

use std::io;
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;

use netlane_sys::cmsg::find_gro_size;
use netlane_sys::msg::{MAX_MMSG, RecvBatch};
use serde::Serialize;

use super::gro;

/// How many datagrams one system call may return.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum RxBatching {
    /// One `recvmsg` per read.
    Single,
    /// `recvmmsg` with up to this many reads (1..=64) per call.
    Mmsg(usize),
}

/// Receiver configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiverConfig {
    /// Batching.
    pub batching: RxBatching,
    /// Bytes per read buffer: at least the largest datagram, or 65,535 for GRO reads.
    pub slot_len: usize,
    /// Record the source address of each read.
    pub want_source: bool,
}

impl ReceiverConfig {
    /// Buffers large enough for any datagram and any GRO read.
    pub const MAX_SLOT: usize = 65_536;

    /// A configuration for `batching` with room for any read.
    pub fn new(batching: RxBatching) -> Self {
        Self { batching, slot_len: Self::MAX_SLOT, want_source: false }
    }
}

/// One received datagram.
#[derive(Debug, Clone, Copy)]
pub struct Datagram<'a> {
    /// Its payload.
    pub data: &'a [u8],
    /// Where it came from (if requested).
    pub source: Option<SocketAddr>,
    /// The GRO stride of the read it came from (None: the read was this datagram only).
    pub stride: Option<u16>,
}

/// Counters over a receiver's life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RxStats {
    /// System calls made (including those that returned nothing).
    pub syscalls: u64,
    /// Reads returned by the kernel (a GRO read holds several datagrams).
    pub reads: u64,
    /// Datagrams delivered to the caller.
    pub datagrams: u64,
    /// Payload bytes delivered.
    pub bytes: u64,
    /// Reads that carried a `UDP_GRO` control message.
    pub gro_reads: u64,
    /// Datagrams inside GRO reads.
    pub gro_datagrams: u64,
    /// Reads truncated because the buffer was too small (their data is incomplete and
    /// is still delivered, so the caller's checks see it).
    pub truncated: u64,
}

/// Receives datagrams from a UDP socket.
#[derive(Debug)]
pub struct Receiver {
    batch: RecvBatch,
    cfg: ReceiverConfig,
    stats: RxStats,
}

impl Receiver {
    /// A receiver with buffers for `cfg`.
    pub fn new(cfg: ReceiverConfig) -> Self {
        let slots = match cfg.batching {
            RxBatching::Single => 1,
            RxBatching::Mmsg(n) => n.clamp(1, MAX_MMSG),
        };
        Self {
            // 64 bytes of control: room for UDP_GRO (24) plus a timestamp or two.
            batch: RecvBatch::new(slots, cfg.slot_len.max(1), 64, cfg.want_source),
            cfg,
            stats: RxStats::default(),
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> RxStats {
        self.stats
    }

    /// The configuration.
    pub fn config(&self) -> &ReceiverConfig {
        &self.cfg
    }

    /// Makes one receive system call on `fd` (blocking as the socket is configured;
    /// `recvmmsg` uses `MSG_WAITFORONE`) and hands every datagram to `on_datagram`.
    /// Returns the number of datagrams; errors such as `WouldBlock` (timeout) are
    /// returned after being counted.
    pub fn recv(&mut self, fd: BorrowedFd<'_>, mut on_datagram: impl FnMut(Datagram<'_>)) -> io::Result<usize> {
        self.stats.syscalls += 1;
        let reads = match self.cfg.batching {
            RxBatching::Single => self.batch.recv_one(fd, libc::MSG_TRUNC)?,
            RxBatching::Mmsg(_) => {
                let slots = self.batch.slots();
                self.batch.recv_many(fd, slots, libc::MSG_WAITFORONE | libc::MSG_TRUNC)?
            }
        };
        let mut delivered = 0;
        for i in 0..reads {
            let meta = self.batch.meta(i);
            if meta.received.truncated() {
                self.stats.truncated += 1;
                tracing::warn!(
                    len = meta.received.len,
                    buffer = self.batch.slot_len(),
                    "datagram truncated: receive buffer too small"
                );
            }
            let stride = find_gro_size(self.batch.control(i));
            let source = self.batch.source(i);
            let data = self.batch.data(i);
            let mut n = 0;
            for seg in gro::segments(data, stride) {
                on_datagram(Datagram { data: seg, source, stride });
                n += 1;
                self.stats.bytes += seg.len() as u64;
            }
            if stride.is_some() {
                self.stats.gro_reads += 1;
                self.stats.gro_datagrams += n;
            }
            self.stats.reads += 1;
            self.stats.datagrams += n;
            delivered += n as usize;
        }
        Ok(delivered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::udp::{Batching, GsoMode, Sender, SenderConfig, UdpSocket};
    use std::os::fd::AsFd;
    use std::time::Duration;

    fn loopback_pair(ipv6: bool) -> (UdpSocket, UdpSocket) {
        let any: SocketAddr = if ipv6 { "[::1]:0".parse().unwrap() } else { "127.0.0.1:0".parse().unwrap() };
        let rx = UdpSocket::bind(any).unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        rx.set_recv_buffer(4 << 20).unwrap();
        let tx = UdpSocket::connect_to(rx.local_addr().unwrap()).unwrap();
        (tx, rx)
    }

    /// GSO sends over loopback arrive as the exact datagrams, for both families and both
    /// receive batchings; the stride is absent (loopback does not coalesce for a socket
    /// without UDP_GRO).
    #[test]
    fn gso_over_loopback_arrives_as_individual_datagrams() {
        for ipv6 in [false, true] {
            for batching in [RxBatching::Single, RxBatching::Mmsg(16)] {
                let (tx, rx) = loopback_pair(ipv6);
                let buf: Vec<u8> = (0..(20 * 1000 + 123)).map(|i: usize| (i % 253) as u8).collect();
                let mut s = Sender::new(
                    tx,
                    SenderConfig { gso: GsoMode::Cmsg, batching: Batching::Single, ..SenderConfig::plain(ipv6) },
                );
                let r = s.send(&buf, 1000, None).unwrap();
                assert_eq!((r.datagrams, r.syscalls), (21, 1));
                let mut got = Vec::new();
                let mut rcv = Receiver::new(ReceiverConfig::new(batching));
                while got.len() < 21 {
                    rcv.recv(rx.as_fd(), |d| {
                        assert_eq!(d.stride, None);
                        got.push(d.data.to_vec());
                    })
                    .unwrap();
                }
                let want: Vec<Vec<u8>> = buf.chunks(1000).map(<[u8]>::to_vec).collect();
                assert_eq!(got, want, "ipv6={ipv6} {batching:?}");
            }
        }
    }

    /// On loopback a GSO send to a UDP_GRO socket is delivered unsegmented with the
    /// stride, and the receiver splits it back exactly.
    #[test]
    fn gro_socket_receives_the_train_and_splits_it() {
        for ipv6 in [false, true] {
            let (tx, rx) = loopback_pair(ipv6);
            rx.enable_gro().unwrap();
            let buf: Vec<u8> = (0..(10 * 1400 + 77)).map(|i: usize| (i % 241) as u8).collect();
            let mut s = Sender::new(tx, SenderConfig { gso: GsoMode::Cmsg, ..SenderConfig::plain(ipv6) });
            s.send(&buf, 1400, None).unwrap();
            let mut rcv = Receiver::new(ReceiverConfig::new(RxBatching::Mmsg(8)));
            let mut got = Vec::new();
            while got.len() < 11 {
                rcv.recv(rx.as_fd(), |d| got.push((d.stride, d.data.to_vec()))).unwrap();
            }
            let want: Vec<Vec<u8>> = buf.chunks(1400).map(<[u8]>::to_vec).collect();
            assert_eq!(got.iter().map(|g| g.1.clone()).collect::<Vec<_>>(), want);
            assert!(got.iter().all(|g| g.0 == Some(1400)), "every datagram came from a GRO read");
            assert_eq!(rcv.stats().gro_reads, 1);
            assert_eq!(rcv.stats().reads, 1);
            assert_eq!(rcv.stats().datagrams, 11);
        }
    }

    #[test]
    fn truncation_is_counted_and_data_still_delivered() {
        let (tx, rx) = loopback_pair(false);
        let mut s = Sender::new(tx, SenderConfig::plain(false));
        s.send(&[9u8; 500], 500, None).unwrap();
        let mut rcv = Receiver::new(ReceiverConfig { slot_len: 100, ..ReceiverConfig::new(RxBatching::Single) });
        let mut lens = Vec::new();
        rcv.recv(rx.as_fd(), |d| lens.push(d.data.len())).unwrap();
        assert_eq!(lens, vec![100]);
        assert_eq!(rcv.stats().truncated, 1);
    }

    #[test]
    fn timeout_is_would_block() {
        let (_tx, rx) = loopback_pair(false);
        rx.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let mut rcv = Receiver::new(ReceiverConfig::new(RxBatching::Mmsg(4)));
        let err = rcv.recv(rx.as_fd(), |_| {}).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        assert_eq!(rcv.stats().syscalls, 1);
    }
}

//! UDP GSO out, GRO and recvmmsg in, over loopback: a buffer sent as trains of equal
//! datagrams in as few system calls as the kernel allows, read back datagram by datagram.
//!
//! `cargo run -p netlane --example gso_loopback`

use std::error::Error;
use std::os::fd::AsFd;
use std::time::Duration;

use netlane::udp::{GsoMode, Receiver, ReceiverConfig, RxBatching, Sender, SenderConfig, UdpSocket};

fn main() -> Result<(), Box<dyn Error>> {
    // The receiver reads trains whole (UDP_GRO) and splits them; recvmmsg batches reads.
    let rx = UdpSocket::bind("127.0.0.1:0".parse()?)?;
    rx.enable_gro()?;
    rx.set_read_timeout(Some(Duration::from_millis(200)))?;
    // Room for the whole buffer even if GSO falls back to a hundred single datagrams.
    rx.set_recv_buffer(4 << 20)?;
    let tx = UdpSocket::connect_to(rx.local_addr()?)?;

    // GSO through a per-send UDP_SEGMENT control message; the sender falls back to plain
    // datagrams by itself (and says so in its stats) where the kernel refuses it.
    let mut sender = Sender::new(tx, SenderConfig { gso: GsoMode::Cmsg, ..SenderConfig::plain(false) });
    let segment = 1400;
    let buf: Vec<u8> = (0..segment * 100).map(|i| (i % 251) as u8).collect();
    let sent = sender.send(&buf, segment, None)?;

    let mut receiver = Receiver::new(ReceiverConfig::new(RxBatching::Mmsg(32)));
    let (mut datagrams, mut bytes, mut trains) = (0u64, 0usize, 0usize);
    while datagrams < sent.datagrams {
        let read = receiver.recv(rx.as_fd(), |d| {
            datagrams += 1;
            bytes += d.data.len();
            trains += usize::from(d.stride.is_some());
        });
        match read {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(e.into()),
        }
    }
    let (tx_stats, rx_stats) = (sender.stats(), receiver.stats());
    println!(
        "sent {} datagrams ({} bytes) in {} system calls, {} of them GSO sends",
        sent.datagrams, sent.bytes, tx_stats.syscalls, tx_stats.gso_sends
    );
    println!(
        "received {datagrams} datagrams ({bytes} bytes) in {} system calls, {trains} of them from GRO trains",
        rx_stats.syscalls
    );
    if datagrams != sent.datagrams || bytes != buf.len() {
        return Err(format!("lost on loopback: {datagrams} of {} datagrams", sent.datagrams).into());
    }
    Ok(())
}

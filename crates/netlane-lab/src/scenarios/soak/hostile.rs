//! The soak's hostile clients: what a black-box campaign tried against each server, as
//! loops that run until told to stop and count what they did.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// A small xorshift generator: hostile input needs variety, not quality.
pub(super) struct Noise(u64);

impl Noise {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// Random bytes, `min..min + spread` of them.
    fn bytes(&mut self, min: usize, spread: u64) -> Vec<u8> {
        let len = min + self.below(spread) as usize;
        (0..len).map(|_| self.next() as u8).collect()
    }
}

/// Hostile clients: `holders` keep up to `hold` connections open that started a
/// message and stalled (re-opening those the server closes); a churner connects, sends
/// one hostile message (`next`), reads a little and closes, again and again. Every
/// connection or message counts as one operation.
pub(super) fn hostile_tcp(
    addr: SocketAddr,
    hold: usize,
    stall: Vec<u8>,
    next: impl Fn(&mut Noise) -> Vec<u8> + Send + 'static,
    stop: Arc<AtomicBool>,
    ops: Arc<AtomicU64>,
) -> Vec<std::thread::JoinHandle<()>> {
    let (s1, o1) = (stop.clone(), ops.clone());
    let holder = std::thread::spawn(move || {
        let mut held: Vec<TcpStream> = Vec::new();
        while !s1.load(Ordering::Relaxed) {
            // A connection the server closed is let go (and replaced); one still open
            // (a read would block) or answered is held on to.
            held.retain(|c| {
                let mut b = [0u8; 512];
                match (&*c).read(&mut b) {
                    Ok(0) => false,
                    Ok(_) => true,
                    Err(e) => matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
                }
            });
            while held.len() < hold && !s1.load(Ordering::Relaxed) {
                let Ok(mut c) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else { break };
                let _ = c.set_read_timeout(Some(Duration::from_millis(1)));
                let _ = c.write_all(&stall);
                o1.fetch_add(1, Ordering::Relaxed);
                held.push(c);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    let churn = std::thread::spawn(move || {
        let mut noise = Noise(0x9e37_79b9_7f4a_7c15);
        while !stop.load(Ordering::Relaxed) {
            let Ok(mut c) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            };
            let _ = c.set_write_timeout(Some(Duration::from_millis(200)));
            let _ = c.set_read_timeout(Some(Duration::from_millis(20)));
            let _ = c.write_all(&next(&mut noise));
            let mut b = [0u8; 4096];
            let _ = c.read(&mut b);
            ops.fetch_add(1, Ordering::Relaxed);
        }
    });
    vec![holder, churn]
}

/// Hostile memcached-protocol input: junk, impossible lengths, a value over the item
/// limit, an over-long key, a binary header claiming a huge body, a value cut short.
pub(super) fn kv_garbage(n: &mut Noise) -> Vec<u8> {
    match n.below(6) {
        0 => n.bytes(1, 4096),
        1 => b"set k 0 0 4294967295\r\n".to_vec(),
        2 => {
            let mut v = b"set big 0 0 2000000\r\n".to_vec();
            v.resize(v.len() + 2_000_000, b'x');
            v.extend_from_slice(b"\r\n");
            v
        }
        3 => [b"get ".as_slice(), &[b'k'; 300], b"\r\n"].concat(),
        4 => {
            let mut v = vec![0x80, 0x01, 0x00, 0x03, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xf0];
            v.extend(n.bytes(12, 256));
            v
        }
        _ => b"set k 0 0 100\r\nab".to_vec(),
    }
}

/// Hostile NVMe/TCP input: junk, and junk after a valid admin-queue setup.
pub(super) fn nvme_garbage(n: &mut Noise) -> Vec<u8> {
    let junk = n.bytes(8, 512);
    if n.below(2) == 0 { junk } else { [netlane_nvme::proto::fuzzing::admin_prefix(false, false), junk].concat() }
}

/// Hostile datagrams: junk of any size, and well-formed requests for the largest
/// response from addresses that never proved they receive (the amplifier's input).
pub(super) fn hostile_udp(
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    ops: Arc<AtomicU64>,
) -> Vec<std::thread::JoinHandle<()>> {
    vec![std::thread::spawn(move || {
        let mut noise = Noise(0x2545_f491_4f6c_dd1d);
        let mut id = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let Ok(s) = UdpSocket::bind("127.0.0.1:0") else { break };
            for _ in 0..16 {
                let datagram = if noise.below(2) == 0 {
                    noise.bytes(0, 1473)
                } else {
                    id += 1;
                    let h = netlane_rr::proto::wire::Header::request(id, 0, 0, 65_000);
                    let mut b = vec![0u8; netlane_rr::proto::wire::HEADER_LEN];
                    match netlane_rr::proto::wire::encode(&h, &mut b) {
                        Ok(n) => b[..n].to_vec(),
                        Err(_) => continue,
                    }
                };
                let _ = s.send_to(&datagram, addr);
                ops.fetch_add(1, Ordering::Relaxed);
            }
            // About 20,000 datagrams a second: a flood that leaves the valid client CPU.
            std::thread::sleep(Duration::from_micros(800));
        }
    })]
}

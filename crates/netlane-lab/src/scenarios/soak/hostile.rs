//! The soak's hostile clients: what a black-box campaign tried against each server, as
//! loops that run until told to stop and count what they did.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, TcpStream, UdpSocket};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use netlane_kv::load::rng::Rng;

use super::SoakServer;

/// Hostile input's variety: the load generator's seeded generator, with byte strings.
pub(super) struct Noise(Rng);

impl Noise {
    fn new(seed: u64) -> Noise {
        Noise(Rng::new(seed))
    }

    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0.below(n)
    }

    /// Random bytes, `min..min + spread` of them.
    fn bytes(&mut self, min: usize, spread: u64) -> Vec<u8> {
        let mut v = vec![0u8; min + self.below(spread) as usize];
        self.0.fill(&mut v);
        v
    }
}

/// `server`'s hostile clients against `addr` (`hold` connections held open), until
/// `stop`, counting into `ops`: threads of the calling thread's namespace and CPUs.
pub(super) fn hostile_clients(
    server: SoakServer,
    addr: SocketAddr,
    hold: usize,
    stop: Arc<AtomicBool>,
    ops: Arc<AtomicU64>,
) -> Vec<std::thread::JoinHandle<()>> {
    match server {
        SoakServer::Kv => hostile_tcp(addr, hold, b"set k 0 0 100\r\nab".to_vec(), kv_garbage, stop, ops),
        SoakServer::Nvme => {
            let mut icreq = Vec::new();
            netlane_nvme::proto::pdu::TxConfig::ic_req(
                &mut icreq,
                &netlane_nvme::proto::pdu::IcReq { pfv: 0, hpda: 0, hdgst: false, ddgst: false, maxr2t: 3 },
            );
            hostile_tcp(addr, hold, icreq, nvme_garbage, stop, ops)
        }
        SoakServer::Rr => hostile_udp(addr, stop, ops),
        // Its hostile input is frames onto its own network (`balancer.rs`).
        SoakServer::Lb => Vec::new(),
    }
}

/// Runs `server`'s hostile clients against `addr` for `time` (`netlane hostile`): how
/// many operations they made. The balancer has none that run from afar.
pub fn run_hostile(server: SoakServer, addr: SocketAddr, hold: usize, time: Duration) -> anyhow::Result<u64> {
    if server == SoakServer::Lb {
        anyhow::bail!("the balancer's hostile input is frames onto a network of its own: not from another host");
    }
    let (stop, ops) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let threads = hostile_clients(server, addr, hold, stop.clone(), ops.clone());
    std::thread::sleep(time);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    Ok(ops.load(Ordering::Relaxed))
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
        let mut noise = Noise::new(0x9e37_79b9_7f4a_7c15);
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
        2 => [b"set big 0 0 2000000\r\n".as_slice(), &vec![b'x'; 2_000_000], b"\r\n"].concat(),
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
        let mut noise = Noise::new(0x2545_f491_4f6c_dd1d);
        let mut id = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let any: SocketAddr =
                if addr.is_ipv4() { (Ipv4Addr::UNSPECIFIED, 0).into() } else { (Ipv6Addr::UNSPECIFIED, 0).into() };
            let Ok(s) = UdpSocket::bind(any) else { break };
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
                // Only what left: a host that cannot reach the server counts nothing.
                if s.send_to(&datagram, addr).is_ok() {
                    ops.fetch_add(1, Ordering::Relaxed);
                }
            }
            // About 20,000 datagrams a second: a flood that leaves the valid client CPU.
            std::thread::sleep(Duration::from_micros(800));
        }
    })]
}

/// Frames that make a balancer work or choose: every crafted datagram shape to the VIP's
/// port, and worse: a fragment, IP options, an IPIP packet, a TCP segment to a UDP VIP,
/// a header cut short, an unknown EtherType, junk. Each sent from a random source (the
/// connection table fills with flows that never come back).
pub(super) fn balancer_frames(macs: ([u8; 6], [u8; 6]), vip: SocketAddrV4) -> Vec<Vec<u8>> {
    use netlane_rr::proto::crafted::{crafted, udp_frame};
    let src = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(10, 210, 1, 2), 40_000));
    let mut noise = Noise::new(0x5851_f42d_4c95_7f2d);
    let mut out: Vec<Vec<u8>> =
        crafted(macs, src, SocketAddr::V4(vip), &|_| noise_payload(64)).into_iter().map(|c| c.frame).collect();
    let base = udp_frame(macs, src, SocketAddr::V4(vip), &noise.bytes(64, 1));
    let edit = |f: fn(&mut Vec<u8>)| {
        let mut v = base.clone();
        f(&mut v);
        v
    };
    // IPv4 header from byte 14: flags/fragment offset at 20, protocol at 23.
    out.push(edit(|f| f[20] |= 0x20));
    out.push(edit(|f| f[21] = 0x10));
    out.push(edit(|f| {
        f[14] = 0x46;
        f.splice(34..34, [1, 1, 1, 0]);
    }));
    out.push(edit(|f| f[23] = 4));
    out.push(edit(|f| f[23] = 6));
    out.push(edit(|f| f.truncate(30)));
    out.push(edit(|f| f[12..14].copy_from_slice(&[0x88, 0xb5])));
    for _ in 0..4 {
        let mut junk = macs.1.to_vec();
        junk.extend_from_slice(&macs.0);
        junk.extend(noise.bytes(2, 1500));
        out.push(junk);
    }
    out
}

fn noise_payload(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 37) as u8).collect()
}

/// Sends [`balancer_frames`] through `tx` until `stop`, each with a random IPv4 source
/// address and port (written over the template's), about 20,000 a second.
pub(super) fn flood_frames(
    mut tx: netlane_sys::packet::PacketTx,
    frames: &[Vec<u8>],
    stop: &AtomicBool,
    ops: &AtomicU64,
) {
    let mut noise = Noise::new(0x2127_599b_f432_5c37);
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..16 {
            let f = &frames[noise.below(frames.len() as u64) as usize];
            let len = f.len().min(tx.max_frame());
            let r = noise.next();
            let pushed = tx.push(len, |slot| {
                slot.copy_from_slice(&f[..len]);
                // An IPv4 header in an untagged frame: a source of 10.210.0.0/16 and a
                // random source port.
                if len >= 38 && slot[12..14] == [0x08, 0x00] && slot[14] == 0x45 {
                    slot[28..30].copy_from_slice(&[10, 210]);
                    slot[30..32].copy_from_slice(&(r as u16).to_be_bytes());
                    slot[34..36].copy_from_slice(&((r >> 16) as u16 | 1024).to_be_bytes());
                }
            });
            if matches!(pushed, Ok(true)) {
                ops.fetch_add(1, Ordering::Relaxed);
            }
        }
        let _ = tx.flush();
        std::thread::sleep(Duration::from_micros(800));
    }
}

/// The balancer's configuration, edited again and again: a good edit (new weights) and
/// then a bad one of each kind in turn (a parse error, a VIP with no reals, a bad
/// address, a FIFO where the file was, a file over the size limit), each renamed into
/// place. Counts the edits; `good` is the text for given weights, its reals in
/// `[[vip.real]]` tables.
pub(super) fn edit_config(
    path: &Path,
    good: impl Fn(&[u32]) -> String,
    stop: &AtomicBool,
    ops: &AtomicU64,
    period: Duration,
) -> std::io::Result<()> {
    let next = path.with_extension("next");
    let mut noise = Noise::new(0x1405_7b7e_f767_814f);
    let (mut edits, mut bad) = (0u64, 0u64);
    while !stop.load(Ordering::Relaxed) {
        let weights: Vec<u32> = (0..2).map(|_| 1 + noise.below(4) as u32).collect();
        let _ = std::fs::remove_file(&next);
        edits += 1;
        let text = if edits % 2 == 1 {
            Some(good(&weights))
        } else {
            bad += 1;
            match bad % 5 {
                0 => Some(good(&weights).replace(" = ", " == ")),
                1 => Some(good(&weights).lines().take_while(|l| *l != "[[vip.real]]").collect::<Vec<_>>().join("\n")),
                2 => Some(good(&weights).replace("10.210.", "10.999.")),
                3 => {
                    nix::unistd::mkfifo(&next, nix::sys::stat::Mode::from_bits_truncate(0o600))
                        .map_err(std::io::Error::from)?;
                    None
                }
                _ => {
                    let f = std::fs::File::create(&next)?;
                    f.set_len(netlane_lb::proto::config::MAX_CONFIG_BYTES + 1)?;
                    None
                }
            }
        };
        if let Some(t) = text {
            std::fs::write(&next, t)?;
        }
        std::fs::rename(&next, path)?;
        ops.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(period);
    }
    Ok(())
}

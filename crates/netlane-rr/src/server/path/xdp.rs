//! The AF_XDP path: the sockets' sizes, a socket per receive queue behind the
//! `XskRedirect` steering program, and the queues and locked memory it is sized by.

use std::io;
use std::net::UdpSocket;
use std::os::fd::AsFd;

use netlane_sys::bpf::{XdpLink, XskDst, XskRedirect};
use netlane_sys::xsk::{Xsk, XskConfig, XskMode, XskStats};

use super::{RingSkips, RxPath, SLOT, service_of};
use crate::proto::packet::{AddrMatch, ServiceAddr};

/// AF_XDP sizes (per receive queue: each queue has its own socket and UMEM).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XdpOptions {
    /// Bytes per UMEM frame (2048 or 4096).
    pub frame_size: u32,
    /// UMEM frames per queue.
    pub frames: u32,
    /// RX and fill ring entries (a power of two).
    pub ring_size: u32,
    /// Try zero-copy first (falls back to copy mode when the driver refuses).
    pub zero_copy: bool,
    /// Keep half the UMEM frames of the first queue's socket for its TX ring (the
    /// server sets this for `--tx af-xdp`).
    pub transmit: bool,
}

impl Default for XdpOptions {
    fn default() -> Self {
        // 1 MiB of UMEM per queue: four queues fit an 8 MiB RLIMIT_MEMLOCK.
        XdpOptions { frame_size: 2048, frames: 512, ring_size: 512, zero_copy: true, transmit: false }
    }
}

impl XdpOptions {
    /// Checks the sizes, and that `queues` UMEMs fit the locked-memory limit `memlock`
    /// (bytes; None: unlimited).
    pub fn check(&self, queues: u32, memlock: Option<u64>) -> Result<XskConfig, String> {
        if !matches!(self.frame_size, 2048 | 4096) {
            return Err(format!("AF_XDP frame size {}: 2048 or 4096", self.frame_size));
        }
        if !self.ring_size.is_power_of_two() || !(64..=16_384).contains(&self.ring_size) {
            return Err(format!("AF_XDP ring size {}: a power of two, 64..=16384", self.ring_size));
        }
        if self.frames < self.ring_size {
            return Err(format!("{} UMEM frames cannot fill a {}-entry fill ring", self.frames, self.ring_size));
        }
        let cfg =
            XskConfig { frame_size: self.frame_size, frames: self.frames, ring_size: self.ring_size, tx_frames: 0 };
        if self.transmit && self.frames < 128 {
            return Err(format!("{} UMEM frames: transmitting needs 128 at least (half for each way)", self.frames));
        }
        let total = cfg.umem_bytes() as u64 * u64::from(queues);
        if let Some(limit) = memlock
            && total > limit
        {
            return Err(format!(
                "{queues} queues x {} frames x {} bytes = {total} bytes of UMEM, over the {limit}-byte locked-memory \
                 limit (RLIMIT_MEMLOCK): use fewer frames",
                self.frames, self.frame_size
            ));
        }
        Ok(cfg)
    }
}

/// The AF_XDP path's parts.
#[derive(Debug)]
pub struct XdpPath {
    pub(super) socks: Vec<Xsk>,
    // Declared after the sockets: the program detaches (link dropped) after the sockets
    // close, and before the program object goes.
    link: XdpLink,
    prog: XskRedirect,
    pub(super) want: ServiceAddr,
    pub(super) skips: RingSkips,
    pub(super) buf: Vec<u8>,
    /// Datagrams that came through the stack instead (fragments).
    pub via_stack: u64,
    /// Frames each queue's socket delivered, in queue order.
    pub(super) per_queue: Vec<u64>,
    ifindex: u32,
    /// Why the driver refused native XDP, when it did (the program runs generic).
    pub native_refused: Option<String>,
    /// Why the driver refused zero-copy sockets, when it did (they copy).
    pub zero_copy_refused: Option<String>,
}

impl XdpPath {
    /// "native" or "generic".
    pub fn xdp_mode(&self) -> &'static str {
        self.link.mode().name()
    }

    /// Whether the sockets are zero-copy.
    pub fn zero_copy(&self) -> bool {
        self.socks.iter().all(|s| s.mode() == XskMode::ZeroCopy)
    }

    /// Queues with a socket.
    pub fn queues(&self) -> usize {
        self.socks.len()
    }

    /// Frames each queue's socket delivered, in queue order.
    pub fn frames_per_queue(&self) -> &[u64] {
        &self.per_queue
    }

    /// The program's counts: redirected to a socket, passed to the stack.
    pub fn counts(&self) -> (u64, u64) {
        self.prog.counts().unwrap_or_default()
    }

    /// The first socket's transmit half (with [`XdpOptions::transmit`]), once.
    pub fn take_tx(&mut self) -> Option<netlane_sys::xsk::XskTx> {
        self.socks.first_mut().and_then(Xsk::take_tx)
    }

    /// The interface the sockets are bound to.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// The sockets' drop counters, summed.
    pub fn stats(&self) -> XskStats {
        let mut t = XskStats::default();
        for s in &self.socks {
            if let Ok(x) = s.stats() {
                t.rx_dropped += x.rx_dropped;
                t.rx_invalid_descs += x.rx_invalid_descs;
                t.rx_ring_full += x.rx_ring_full;
                t.rx_fill_ring_empty += x.rx_fill_ring_empty;
            }
        }
        t
    }
}

impl RxPath {
    /// The AF_XDP path on interface `iface` (index, name) for the service socket `sock`.
    pub(super) fn open_xdp(sock: &UdpSocket, xdp: &XdpOptions, iface: (u32, &str)) -> io::Result<RxPath> {
        let ifindex = iface.0;
        if ifindex == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "AF_XDP binds to one interface's queues: listen on an interface's address or name one",
            ));
        }
        let queues = rx_queues(ifindex, iface.1).min(netlane_sys::bpf::XSK_MAX_QUEUES);
        let cfg = xdp.check(queues, memlock_limit()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let want = service_of(sock)?;
        // Unicast frames for another MAC (promiscuous mode) are not the service's.
        let mac = netlane::topology::Rtnl::open()
            .and_then(|mut r| r.link_mac(ifindex).map_err(io::Error::other))
            .map_err(|e| io::Error::new(e.kind(), format!("the MAC of {}: {e}", iface.1)))?;
        let own_mac = <[u8; 6]>::try_from(mac.as_slice()).ok();
        let prog = XskRedirect::load(want.port, xsk_dst(want.v4), xsk_dst(want.v6), own_mac)?;
        let mut socks = Vec::new();
        let mut zero_copy_refused = None;
        for q in 0..queues {
            // The first queue's socket also transmits: half its frames for TX.
            // (At most the completion ring's size: the kernel needs a completion slot
            // per frame in flight.)
            let tx_frames = (cfg.frames / 2).min(cfg.ring_size);
            let cfg = if q == 0 && xdp.transmit { XskConfig { tx_frames, ..cfg } } else { cfg };
            let mut open = || {
                if xdp.zero_copy {
                    Xsk::open(ifindex, q, cfg, XskMode::ZeroCopy).or_else(|e| {
                        zero_copy_refused.get_or_insert_with(|| e.to_string());
                        Xsk::open(ifindex, q, cfg, XskMode::Copy)
                    })
                } else {
                    Xsk::open(ifindex, q, cfg, XskMode::Copy)
                }
            };
            // A socket just closed on this queue is released by the kernel a
            // moment later (after an RCU grace period): EBUSY for a while.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
            let s = loop {
                match open() {
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) && std::time::Instant::now() < deadline => {
                        std::thread::sleep(std::time::Duration::from_millis(50));
                    }
                    r => break r,
                }
            };
            let s = s.map_err(|e| {
                let why =
                    if e.raw_os_error() == Some(libc::EBUSY) { " (another AF_XDP socket is bound to it)" } else { "" };
                io::Error::new(e.kind(), format!("AF_XDP socket on queue {q} of {}{why}: {e}", iface.1))
            })?;
            prog.register(q, s.as_fd())?;
            socks.push(s);
        }
        let (link, native_refused) = XdpLink::attach_native_or_generic(prog.prog_fd(), ifindex)
            .map_err(|e| io::Error::new(e.kind(), format!("attach the steering program to {}: {e}", iface.1)))?;
        Ok(RxPath::Xdp(Box::new(XdpPath {
            per_queue: vec![0; socks.len()],
            socks,
            link,
            prog,
            want,
            skips: RingSkips::default(),
            buf: vec![0; SLOT],
            via_stack: 0,
            ifindex,
            native_refused: native_refused.map(|e| e.to_string()),
            zero_copy_refused,
        })))
    }
}

/// Receive queues of interface `ifindex` (`name`): as the kernel's netdev netlink family
/// lists them, which answers for this process's network namespace (sysfs shows the
/// namespace of whoever mounted it); from sysfs where the family cannot list queues
/// (before Linux 6.8), which is right only in the namespace sysfs was mounted in; 1
/// when neither says.
pub fn rx_queues(ifindex: u32, name: &str) -> u32 {
    use netlane::topology::netdev::{Netdev, QueueKind};
    let listed = Netdev::open()
        .and_then(|mut n| n.queues(ifindex))
        .ok()
        .map(|qs| qs.iter().filter(|q| q.kind == QueueKind::Rx).count() as u32)
        .filter(|n| *n > 0);
    listed
        .unwrap_or_else(|| {
            std::fs::read_dir(format!("/sys/class/net/{name}/queues"))
                .map(|d| d.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("rx-")).count() as u32)
                .unwrap_or(1)
        })
        .max(1)
}

/// The locked-memory limit in bytes (None: unlimited).
pub fn memlock_limit() -> Option<u64> {
    let (soft, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_MEMLOCK).ok()?;
    (soft != nix::sys::resource::RLIM_INFINITY).then_some(soft)
}

/// The steering program's form of an [`AddrMatch`] (the sans-IO core does not know the
/// BPF crate's types).
fn xsk_dst<A>(m: AddrMatch<A>) -> XskDst<A> {
    match m {
        AddrMatch::No => XskDst::No,
        AddrMatch::Any => XskDst::Any,
        AddrMatch::Only(a) => XskDst::Only(a),
    }
}

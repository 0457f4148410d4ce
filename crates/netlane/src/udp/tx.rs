//! The UDP sender: GSO (per-call cmsg or socket option), sendmmsg, MSG_ZEROCOPY, txtime,
//! with latched fallbacks that lose nothing.

use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::os::fd::AsFd;

use netlane_sys::cmsg::CmsgBuf;
use netlane_sys::msg::MAX_MMSG;
use serde::Serialize;
use socket2::SockAddr;

use super::UdpSocket;
use super::gso::GsoLimits;

/// The system calls a [`Sender`] makes: the seam tests use to inject kernel failures
/// (EIO from a device without checksum offload, ENOBUFS from the optmem limit).
pub trait TxSyscalls {
    /// `sendmsg(2)` of one buffer (a datagram, or a GSO train).
    fn sendmsg(&mut self, dst: Option<&SockAddr>, iov: &[IoSlice<'_>], control: &[u8], flags: i32)
    -> io::Result<usize>;
    /// `sendmmsg(2)` of up to 64 datagrams; returns how many were sent.
    fn sendmmsg(
        &mut self,
        dst: Option<&SockAddr>,
        datagrams: &[IoSlice<'_>],
        control: &[u8],
        flags: i32,
    ) -> io::Result<usize>;
    /// `send(2)` of one buffer to the connected peer, without control data. The default
    /// goes through [`TxSyscalls::sendmsg`]; real sockets use the cheaper call.
    fn send(&mut self, buf: &[u8], flags: i32) -> io::Result<usize> {
        self.sendmsg(None, &[IoSlice::new(buf)], &[], flags)
    }
    /// Sets the socket's default `UDP_SEGMENT` (0 clears it).
    fn set_udp_segment(&mut self, gso_size: u16) -> io::Result<()>;
}

impl TxSyscalls for UdpSocket {
    fn sendmsg(
        &mut self,
        dst: Option<&SockAddr>,
        iov: &[IoSlice<'_>],
        control: &[u8],
        flags: i32,
    ) -> io::Result<usize> {
        netlane_sys::msg::sendmsg(self.as_fd(), dst, iov, control, flags)
    }

    fn sendmmsg(
        &mut self,
        dst: Option<&SockAddr>,
        datagrams: &[IoSlice<'_>],
        control: &[u8],
        flags: i32,
    ) -> io::Result<usize> {
        netlane_sys::msg::sendmmsg(self.as_fd(), dst, datagrams, control, flags)
    }

    fn send(&mut self, buf: &[u8], flags: i32) -> io::Result<usize> {
        netlane_sys::msg::send(self.as_fd(), buf, flags)
    }

    fn set_udp_segment(&mut self, gso_size: u16) -> io::Result<()> {
        crate::sockopt::set_udp_segment(self.as_fd(), gso_size)
    }
}

impl<T: TxSyscalls + ?Sized> TxSyscalls for &mut T {
    fn sendmsg(
        &mut self,
        dst: Option<&SockAddr>,
        iov: &[IoSlice<'_>],
        control: &[u8],
        flags: i32,
    ) -> io::Result<usize> {
        (**self).sendmsg(dst, iov, control, flags)
    }

    fn sendmmsg(
        &mut self,
        dst: Option<&SockAddr>,
        datagrams: &[IoSlice<'_>],
        control: &[u8],
        flags: i32,
    ) -> io::Result<usize> {
        (**self).sendmmsg(dst, datagrams, control, flags)
    }

    fn send(&mut self, buf: &[u8], flags: i32) -> io::Result<usize> {
        (**self).send(buf, flags)
    }

    fn set_udp_segment(&mut self, gso_size: u16) -> io::Result<()> {
        (**self).set_udp_segment(gso_size)
    }
}

/// How the sender asks for segmentation offload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub enum GsoMode {
    /// No GSO: one datagram per message.
    Off,
    /// A `UDP_SEGMENT` control message on each send (works on unconnected sockets with
    /// a different size per destination).
    Cmsg,
    /// The `UDP_SEGMENT` socket option, set once (changed only when the size changes).
    Sockopt,
}

/// How datagrams are sent when GSO is off (or has fallen back).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub enum Batching {
    /// One `sendmsg` per datagram.
    Single,
    /// `sendmmsg` with up to 64 datagrams per call.
    Mmsg,
}

impl GsoMode {
    /// Every mode, by the name [`GsoMode::name`] gives.
    pub const ALL: [GsoMode; 3] = [GsoMode::Off, GsoMode::Cmsg, GsoMode::Sockopt];

    /// `off`, `cmsg` or `sockopt`.
    pub fn name(self) -> &'static str {
        match self {
            GsoMode::Off => "off",
            GsoMode::Cmsg => "cmsg",
            GsoMode::Sockopt => "sockopt",
        }
    }
}

impl std::fmt::Display for GsoMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for GsoMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        GsoMode::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("GSO mode {s:?}: expected off, cmsg or sockopt"))
    }
}

impl Batching {
    /// `single` or `mmsg`.
    pub fn name(self) -> &'static str {
        match self {
            Batching::Single => "single",
            Batching::Mmsg => "mmsg",
        }
    }
}

impl std::fmt::Display for Batching {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Batching {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [Batching::Single, Batching::Mmsg]
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("batching {s:?}: expected single or mmsg"))
    }
}

/// Sender configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SenderConfig {
    /// Segmentation offload.
    pub gso: GsoMode,
    /// Batching without GSO.
    pub batching: Batching,
    /// Send with `MSG_ZEROCOPY` (the socket must have `SO_ZEROCOPY`).
    pub zerocopy: bool,
    /// GSO size limits.
    pub limits: GsoLimits,
    /// Destination for an unconnected socket (None: the connected peer).
    pub destination: Option<SocketAddr>,
}

impl SenderConfig {
    /// Plain datagrams, one `sendmsg` each, to the connected peer.
    pub fn plain(ipv6: bool) -> Self {
        Self {
            gso: GsoMode::Off,
            batching: Batching::Single,
            zerocopy: false,
            limits: GsoLimits::for_family(ipv6),
            destination: None,
        }
    }
}

/// What one [`Sender::send`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendReport {
    /// Datagrams the kernel accepted.
    pub datagrams: u64,
    /// Bytes of payload accepted.
    pub bytes: u64,
    /// System calls made.
    pub syscalls: u64,
    /// Messages sent with `MSG_ZEROCOPY`: each took one value of the socket's zerocopy
    /// counter and will be reported on the error queue (register them with a
    /// [`crate::zerocopy::Tracker`] in order).
    pub zerocopy_sends: u64,
}

impl SendReport {
    fn add(&mut self, other: SendReport) {
        self.datagrams += other.datagrams;
        self.bytes += other.bytes;
        self.syscalls += other.syscalls;
        self.zerocopy_sends += other.zerocopy_sends;
    }
}

/// Counters over a sender's life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TxStats {
    /// Datagrams accepted by the kernel.
    pub datagrams: u64,
    /// Payload bytes accepted.
    pub bytes: u64,
    /// System calls made (including failed ones and option changes).
    pub syscalls: u64,
    /// GSO sends that succeeded.
    pub gso_sends: u64,
    /// Times GSO was latched off after EIO/EINVAL (0 or 1).
    pub gso_fallbacks: u64,
    /// Datagrams re-sent individually after a failed GSO send.
    pub gso_resent_datagrams: u64,
    /// Messages sent with MSG_ZEROCOPY.
    pub zerocopy_sends: u64,
    /// Times zerocopy was latched off after ENOBUFS (0 or 1).
    pub zerocopy_fallbacks: u64,
}

/// A send that failed for a reason the sender cannot work around.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// EMSGSIZE: a datagram is larger than the path MTU allows.
    #[error("datagram of {size} bytes does not fit the path MTU (EMSGSIZE); use a smaller segment size")]
    TooBig {
        /// The datagram (segment) size.
        size: usize,
    },
    /// A segment size the kernel cannot express.
    #[error("segment size {0} is out of range 1..=65535")]
    BadSegmentSize(usize),
    /// Any other error from the kernel.
    #[error("send failed")]
    Io(#[from] io::Error),
}

impl SendError {
    /// The underlying OS error code, if any.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            SendError::Io(e) => e.raw_os_error(),
            SendError::TooBig { .. } => Some(libc::EMSGSIZE),
            SendError::BadSegmentSize(_) => None,
        }
    }
}

/// Sends buffers as trains of equal-sized datagrams through the cheapest path left.
///
/// Fallbacks are latched per sender (i.e. per socket), as quinn-udp and s2n-quic do:
/// - EIO or EINVAL on a GSO send turns GSO off and the same train is sent again as
///   individual datagrams (sendmmsg or sendmsg per [`Batching`]);
/// - ENOBUFS on a `MSG_ZEROCOPY` send turns zerocopy off and the same call is repeated
///   as a copying send.
///
/// Both are counted in [`TxStats`] and visible through [`Sender::gso_active`] and
/// [`Sender::zerocopy_active`].
///
/// ```
/// use netlane::udp::{GsoMode, Sender, SenderConfig, UdpSocket};
///
/// let rx = UdpSocket::bind("127.0.0.1:0".parse()?)?;
/// let tx = UdpSocket::connect_to(rx.local_addr()?)?;
/// let mut sender = Sender::new(tx, SenderConfig { gso: GsoMode::Cmsg, ..SenderConfig::plain(false) });
/// // 10 datagrams of 1,000 bytes: one GSO send where the kernel has it.
/// let sent = sender.send(&[7u8; 10_000], 1_000, None)?;
/// assert_eq!((sent.datagrams, sent.bytes), (10, 10_000));
/// assert!(sender.stats().syscalls <= 10);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// `examples/gso_loopback.rs` reads them back with GRO and recvmmsg.
#[derive(Debug)]
pub struct Sender<T> {
    io: T,
    cfg: SenderConfig,
    dst: Option<SockAddr>,
    gso_on: bool,
    zc_on: bool,
    /// Current socket-default `UDP_SEGMENT` in sockopt mode.
    sockopt_gso: u16,
    control: CmsgBuf<64>,
    stats: TxStats,
}

impl<T: TxSyscalls> Sender<T> {
    /// A sender over `io` (usually a [`UdpSocket`], or a test double).
    pub fn new(io: T, cfg: SenderConfig) -> Self {
        Self {
            io,
            dst: cfg.destination.map(SockAddr::from),
            gso_on: cfg.gso != GsoMode::Off,
            zc_on: cfg.zerocopy,
            sockopt_gso: 0,
            cfg,
            control: CmsgBuf::new(),
            stats: TxStats::default(),
        }
    }

    /// Whether GSO is still in use (false if configured off or latched off).
    pub fn gso_active(&self) -> bool {
        self.gso_on
    }

    /// Whether MSG_ZEROCOPY is still in use.
    pub fn zerocopy_active(&self) -> bool {
        self.zc_on
    }

    /// The configuration.
    pub fn config(&self) -> &SenderConfig {
        &self.cfg
    }

    /// Counters so far.
    pub fn stats(&self) -> TxStats {
        self.stats
    }

    /// The underlying syscall provider.
    pub fn io(&self) -> &T {
        &self.io
    }

    /// Mutable access to the underlying syscall provider.
    pub fn io_mut(&mut self) -> &mut T {
        &mut self.io
    }

    /// Sends `buf` cut into datagrams of `segment_size` bytes (the last may be
    /// shorter), with an optional SO_TXTIME release time for all of them.
    ///
    /// With GSO on, every run of up to `limits.segments_per_send(segment_size)`
    /// segments is one system call. Returns what was sent; on error, datagrams before
    /// the failing call were sent (the report is lost with the error, so callers
    /// treat an error as fatal for the run).
    pub fn send(&mut self, buf: &[u8], segment_size: usize, txtime: Option<u64>) -> Result<SendReport, SendError> {
        if segment_size == 0 || segment_size > usize::from(u16::MAX) {
            return Err(SendError::BadSegmentSize(segment_size));
        }
        if buf.len() <= segment_size && txtime.is_none() && self.dst.is_none() && !self.zc_on {
            return self.send_plain(buf, segment_size);
        }
        let calls_before = self.stats.syscalls;
        let mut report = self.send_trains(buf, segment_size, txtime)?;
        report.syscalls = self.stats.syscalls - calls_before;
        Ok(report)
    }

    /// One datagram to the connected peer with nothing attached: the per-datagram
    /// sender's hot path, one `send(2)` and the counters.
    #[inline]
    fn send_plain(&mut self, datagram: &[u8], segment_size: usize) -> Result<SendReport, SendError> {
        loop {
            self.stats.syscalls += 1;
            match self.io.send(datagram, 0) {
                Ok(n) => {
                    self.stats.datagrams += 1;
                    self.stats.bytes += n as u64;
                    return Ok(SendReport { datagrams: 1, bytes: n as u64, syscalls: 1, zerocopy_sends: 0 });
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(classify(e, segment_size)),
            }
        }
    }

    fn send_trains(&mut self, buf: &[u8], segment_size: usize, txtime: Option<u64>) -> Result<SendReport, SendError> {
        let mut report = SendReport::default();
        if buf.len() <= segment_size {
            report.add(self.send_one(buf, txtime, segment_size)?);
            return Ok(report);
        }
        if !self.gso_on {
            report.add(self.send_split(buf, segment_size, txtime)?);
            return Ok(report);
        }
        let per_send = self.cfg.limits.segments_per_send(segment_size) * segment_size;
        for train in buf.chunks(per_send) {
            if !self.gso_on || train.len() <= segment_size {
                // GSO was latched off by an earlier train of this call, or only one
                // segment is left: no GSO cmsg for a single segment.
                let r = if self.gso_on {
                    self.send_one(train, txtime, segment_size)?
                } else {
                    self.send_split(train, segment_size, txtime)?
                };
                report.add(r);
                continue;
            }
            match self.send_gso(train, segment_size as u16, txtime) {
                Ok(r) => report.add(r),
                Err(e) if matches!(e.raw_os_error(), Some(libc::EIO) | Some(libc::EINVAL)) => {
                    self.latch_gso_off(&e);
                    let r = self.send_split(train, segment_size, txtime)?;
                    self.stats.gso_resent_datagrams += r.datagrams;
                    report.add(r);
                }
                Err(e) => return Err(classify(e, segment_size)),
            }
        }
        Ok(report)
    }

    fn latch_gso_off(&mut self, cause: &io::Error) {
        tracing::warn!(error = %cause, "UDP GSO send failed; GSO disabled for this socket, resending as individual datagrams");
        self.gso_on = false;
        self.stats.gso_fallbacks += 1;
        if self.cfg.gso == GsoMode::Sockopt && self.sockopt_gso != 0 {
            self.stats.syscalls += 1;
            if self.io.set_udp_segment(0).is_ok() {
                self.sockopt_gso = 0;
            }
        }
    }

    fn build_control(&mut self, gso: Option<u16>, txtime: Option<u64>) {
        self.control.clear();
        // 64 bytes hold both messages (24 + 24); pushes cannot fail.
        if let Some(size) = gso {
            let _ = self.control.push_udp_segment(size);
        }
        if let Some(t) = txtime {
            let _ = self.control.push_txtime(t);
        }
    }

    /// One GSO system call. Errors are returned raw (not counted) for the caller to
    /// classify.
    fn send_gso(&mut self, train: &[u8], segment_size: u16, txtime: Option<u64>) -> io::Result<SendReport> {
        let cmsg_gso = match self.cfg.gso {
            GsoMode::Sockopt => {
                if self.sockopt_gso != segment_size {
                    self.stats.syscalls += 1;
                    self.io.set_udp_segment(segment_size)?;
                    self.sockopt_gso = segment_size;
                }
                None
            }
            _ => Some(segment_size),
        };
        self.build_control(cmsg_gso, txtime);
        let (n, zc) = self
            .call_with_zc_fallback(|io, dst, control, flags| io.sendmsg(dst, &[IoSlice::new(train)], control, flags))?;
        let datagrams = n.div_ceil(usize::from(segment_size)) as u64;
        self.stats.gso_sends += 1;
        Ok(self.account(datagrams, n as u64, zc as u64))
    }

    /// One datagram, one `sendmsg`.
    fn send_one(&mut self, datagram: &[u8], txtime: Option<u64>, segment_size: usize) -> Result<SendReport, SendError> {
        // In sockopt mode a datagram no longer than the socket's gso_size is not
        // segmented, so no per-call override is needed.
        self.build_control(None, txtime);
        let (n, zc) = self
            .call_with_zc_fallback(|io, dst, control, flags| {
                if dst.is_none() && control.is_empty() {
                    // Connected and nothing to say: send(2) skips the msghdr.
                    io.send(datagram, flags)
                } else {
                    io.sendmsg(dst, &[IoSlice::new(datagram)], control, flags)
                }
            })
            .map_err(|e| classify(e, segment_size))?;
        Ok(self.account(1, n as u64, zc as u64))
    }

    /// Individual datagrams of `segment_size` bytes: sendmmsg batches or one sendmsg
    /// each.
    fn send_split(&mut self, buf: &[u8], segment_size: usize, txtime: Option<u64>) -> Result<SendReport, SendError> {
        let mut report = SendReport::default();
        match self.cfg.batching {
            Batching::Single => {
                for d in buf.chunks(segment_size) {
                    report.add(self.send_one(d, txtime, segment_size)?);
                }
            }
            Batching::Mmsg => {
                self.build_control(None, txtime);
                let mut iov: [IoSlice<'_>; MAX_MMSG] = [IoSlice::new(&[]); MAX_MMSG];
                let mut chunks = buf.chunks(segment_size).peekable();
                while chunks.peek().is_some() {
                    let mut n = 0;
                    while n < MAX_MMSG {
                        match chunks.next() {
                            Some(c) => {
                                iov[n] = IoSlice::new(c);
                                n += 1;
                            }
                            None => break,
                        }
                    }
                    let mut done = 0;
                    while done < n {
                        let batch = &iov[done..n];
                        let (sent, zc) = self
                            .call_with_zc_fallback(|io, dst, control, flags| io.sendmmsg(dst, batch, control, flags))
                            .map_err(|e| classify(e, segment_size))?;
                        let bytes: usize = batch[..sent].iter().map(|s| s.len()).sum();
                        report.add(self.account(sent as u64, bytes as u64, if zc { sent as u64 } else { 0 }));
                        done += sent;
                    }
                }
            }
        }
        Ok(report)
    }

    /// Makes one system call with MSG_ZEROCOPY if still enabled; on ENOBUFS latches
    /// zerocopy off and repeats the call as a copying send. Returns the call's result
    /// and whether zerocopy was used. Counts every system call made, failed or not.
    fn call_with_zc_fallback(
        &mut self,
        mut call: impl FnMut(&mut T, Option<&SockAddr>, &[u8], i32) -> io::Result<usize>,
    ) -> io::Result<(usize, bool)> {
        loop {
            let zc = self.zc_on;
            let flags = if zc { libc::MSG_ZEROCOPY } else { 0 };
            self.stats.syscalls += 1;
            match call(&mut self.io, self.dst.as_ref(), self.control.as_bytes(), flags) {
                Ok(n) => return Ok((n, zc)),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if zc && e.raw_os_error() == Some(libc::ENOBUFS) => {
                    tracing::warn!(
                        "MSG_ZEROCOPY send failed with ENOBUFS (optmem or locked-memory limit); falling back to copying sends"
                    );
                    self.zc_on = false;
                    self.stats.zerocopy_fallbacks += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn account(&mut self, datagrams: u64, bytes: u64, zerocopy_sends: u64) -> SendReport {
        self.stats.datagrams += datagrams;
        self.stats.bytes += bytes;
        self.stats.zerocopy_sends += zerocopy_sends;
        // System calls are counted in the stats as they happen; `send` derives the
        // report's count from them.
        SendReport { datagrams, bytes, syscalls: 0, zerocopy_sends }
    }
}

fn classify(e: io::Error, segment_size: usize) -> SendError {
    if e.raw_os_error() == Some(libc::EMSGSIZE) { SendError::TooBig { size: segment_size } } else { SendError::Io(e) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake kernel: records every datagram that would reach the wire, and fails
    /// chosen calls.
    #[derive(Default)]
    struct FakeKernel {
        wire: Vec<Vec<u8>>,
        calls: Vec<&'static str>,
        fail_gso_with: Option<i32>,
        fail_zerocopy_with: Option<i32>,
        sockopt_gso: u16,
        mmsg_max: Option<usize>,
    }

    fn gso_of(control: &[u8]) -> Option<u16> {
        netlane_sys::cmsg::CmsgIter::new(control).flatten().find_map(|m| match netlane_sys::cmsg::Cmsg::decode(m) {
            netlane_sys::cmsg::Cmsg::UdpSegment(s) => Some(s),
            _ => None,
        })
    }

    impl TxSyscalls for FakeKernel {
        fn sendmsg(
            &mut self,
            _dst: Option<&SockAddr>,
            iov: &[IoSlice<'_>],
            control: &[u8],
            flags: i32,
        ) -> io::Result<usize> {
            self.calls.push("sendmsg");
            let data: Vec<u8> = iov.iter().flat_map(|s| s.iter().copied()).collect();
            if flags & libc::MSG_ZEROCOPY != 0
                && let Some(errno) = self.fail_zerocopy_with
            {
                return Err(io::Error::from_raw_os_error(errno));
            }
            let gso = gso_of(control).or((self.sockopt_gso != 0).then_some(self.sockopt_gso));
            match gso {
                Some(size) if data.len() > usize::from(size) => {
                    if let Some(errno) = self.fail_gso_with {
                        return Err(io::Error::from_raw_os_error(errno));
                    }
                    for seg in data.chunks(usize::from(size)) {
                        self.wire.push(seg.to_vec());
                    }
                }
                _ => self.wire.push(data.clone()),
            }
            Ok(data.len())
        }

        fn sendmmsg(
            &mut self,
            _dst: Option<&SockAddr>,
            datagrams: &[IoSlice<'_>],
            _control: &[u8],
            flags: i32,
        ) -> io::Result<usize> {
            self.calls.push("sendmmsg");
            if flags & libc::MSG_ZEROCOPY != 0
                && let Some(errno) = self.fail_zerocopy_with
            {
                return Err(io::Error::from_raw_os_error(errno));
            }
            let n = self.mmsg_max.unwrap_or(usize::MAX).min(datagrams.len());
            for d in &datagrams[..n] {
                self.wire.push(d.to_vec());
            }
            Ok(n)
        }

        fn set_udp_segment(&mut self, gso_size: u16) -> io::Result<()> {
            self.calls.push("setsockopt");
            self.sockopt_gso = gso_size;
            Ok(())
        }
    }

    fn payload(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    fn cfg(gso: GsoMode, batching: Batching) -> SenderConfig {
        SenderConfig { gso, batching, ..SenderConfig::plain(false) }
    }

    fn expected(buf: &[u8], seg: usize) -> Vec<Vec<u8>> {
        buf.chunks(seg).map(<[u8]>::to_vec).collect()
    }

    #[test]
    fn gso_cmsg_sends_trains_up_to_the_limit() {
        let buf = payload(100 * 1400 + 300);
        let mut s = Sender::new(FakeKernel::default(), cfg(GsoMode::Cmsg, Batching::Single));
        let r = s.send(&buf, 1400, None).unwrap();
        assert_eq!(r.datagrams, 101);
        assert_eq!(r.syscalls, 3); // 46 + 46 + 9 segments (the last one short)
        assert_eq!(s.io().wire, expected(&buf, 1400));
        assert_eq!(s.stats().gso_sends, 3);
    }

    #[test]
    fn single_segment_goes_without_gso_cmsg() {
        let mut s = Sender::new(FakeKernel::default(), cfg(GsoMode::Cmsg, Batching::Single));
        s.send(&payload(1400), 1400, None).unwrap();
        assert_eq!(s.stats().gso_sends, 0);
        // A buffer whose last train is one segment: that train also goes without GSO.
        let buf = payload(46 * 1400 + 10);
        s.send(&buf, 1400, None).unwrap();
        assert_eq!(s.stats().gso_sends, 1);
        assert_eq!(s.io().wire.len(), 1 + 47);
    }

    #[test]
    fn gso_sockopt_sets_the_option_once() {
        let buf = payload(10 * 1200);
        let mut s = Sender::new(FakeKernel::default(), cfg(GsoMode::Sockopt, Batching::Single));
        s.send(&buf, 1200, None).unwrap();
        s.send(&buf, 1200, None).unwrap();
        assert_eq!(s.io().calls, vec!["setsockopt", "sendmsg", "sendmsg"]);
        assert_eq!(s.io().wire.len(), 20);
        assert_eq!(s.stats().syscalls, 3);
    }

    #[test]
    fn gso_eio_latches_off_and_resends_everything() {
        for errno in [libc::EIO, libc::EINVAL] {
            for batching in [Batching::Single, Batching::Mmsg] {
                for mode in [GsoMode::Cmsg, GsoMode::Sockopt] {
                    let buf = payload(100 * 1400 + 5);
                    let kernel = FakeKernel { fail_gso_with: Some(errno), ..Default::default() };
                    let mut s = Sender::new(kernel, cfg(mode, batching));
                    let r = s.send(&buf, 1400, None).unwrap();
                    assert!(!s.gso_active());
                    assert_eq!(r.datagrams, 101);
                    assert_eq!(s.io().wire, expected(&buf, 1400), "nothing lost or reordered");
                    let st = s.stats();
                    assert_eq!(st.gso_fallbacks, 1);
                    assert_eq!(st.gso_resent_datagrams, 46, "only the failed train is resent");
                    assert_eq!(st.gso_sends, 0);
                    // Later sends go straight to the fallback path.
                    let before = s.io().wire.len();
                    s.send(&buf, 1400, None).unwrap();
                    assert_eq!(s.io().wire.len() - before, 101);
                    assert_eq!(s.stats().gso_fallbacks, 1);
                    if mode == GsoMode::Sockopt {
                        assert_eq!(s.io().sockopt_gso, 0, "the socket default is cleared");
                    }
                }
            }
        }
    }

    #[test]
    fn other_gso_errors_are_reported() {
        let kernel = FakeKernel { fail_gso_with: Some(libc::EMSGSIZE), ..Default::default() };
        let mut s = Sender::new(kernel, cfg(GsoMode::Cmsg, Batching::Single));
        let err = s.send(&payload(3000), 1400, None).unwrap_err();
        assert!(matches!(err, SendError::TooBig { size: 1400 }), "{err}");
        assert!(s.gso_active(), "EMSGSIZE is the caller's mistake, not a missing feature");
        let kernel = FakeKernel { fail_gso_with: Some(libc::EPERM), ..Default::default() };
        let mut s = Sender::new(kernel, cfg(GsoMode::Cmsg, Batching::Single));
        assert!(matches!(s.send(&payload(3000), 1400, None), Err(SendError::Io(_))));
    }

    #[test]
    fn sendmmsg_batches_and_handles_partial_sends() {
        let buf = payload(150 * 100);
        let kernel = FakeKernel { mmsg_max: Some(50), ..Default::default() };
        let mut s = Sender::new(kernel, cfg(GsoMode::Off, Batching::Mmsg));
        let r = s.send(&buf, 100, None).unwrap();
        assert_eq!(r.datagrams, 150);
        // 64 offered -> 50 sent, 14 more; then 64 -> 50 + 14; then 22.
        assert_eq!(r.syscalls, 5);
        assert_eq!(s.io().wire, expected(&buf, 100));
        let full = FakeKernel::default();
        let mut s = Sender::new(full, cfg(GsoMode::Off, Batching::Mmsg));
        let r = s.send(&payload(128 * 100), 100, None).unwrap();
        assert_eq!(r.syscalls, 2, "1/batch syscalls per datagram");
    }

    #[test]
    fn zerocopy_enobufs_falls_back_to_copy() {
        let buf = payload(10 * 1400);
        let kernel = FakeKernel { fail_zerocopy_with: Some(libc::ENOBUFS), ..Default::default() };
        let mut s = Sender::new(kernel, SenderConfig { zerocopy: true, ..cfg(GsoMode::Cmsg, Batching::Single) });
        let r = s.send(&buf, 1400, None).unwrap();
        assert_eq!(r.datagrams, 10);
        assert_eq!(r.zerocopy_sends, 0);
        assert!(!s.zerocopy_active());
        assert_eq!(s.stats().zerocopy_fallbacks, 1);
        assert_eq!(s.io().wire, expected(&buf, 1400));
        assert_eq!(s.stats().syscalls, 2, "failed zerocopy call + copying retry");
    }

    #[test]
    fn zerocopy_sends_are_reported_per_message() {
        let mut s =
            Sender::new(FakeKernel::default(), SenderConfig { zerocopy: true, ..cfg(GsoMode::Off, Batching::Mmsg) });
        let r = s.send(&payload(10 * 100), 100, None).unwrap();
        assert_eq!(r.zerocopy_sends, 10, "every message of a sendmmsg takes a counter value");
        let mut s =
            Sender::new(FakeKernel::default(), SenderConfig { zerocopy: true, ..cfg(GsoMode::Cmsg, Batching::Single) });
        let r = s.send(&payload(10 * 100), 100, None).unwrap();
        assert_eq!(r.zerocopy_sends, 1);
    }

    #[test]
    fn txtime_rides_with_gso() {
        #[derive(Default)]
        struct Capture(Vec<Vec<u8>>);
        impl TxSyscalls for Capture {
            fn sendmsg(
                &mut self,
                _: Option<&SockAddr>,
                iov: &[IoSlice<'_>],
                control: &[u8],
                _: i32,
            ) -> io::Result<usize> {
                self.0.push(control.to_vec());
                Ok(iov.iter().map(|s| s.len()).sum())
            }
            fn sendmmsg(&mut self, _: Option<&SockAddr>, d: &[IoSlice<'_>], _: &[u8], _: i32) -> io::Result<usize> {
                Ok(d.len())
            }
            fn set_udp_segment(&mut self, _: u16) -> io::Result<()> {
                Ok(())
            }
        }
        let mut s = Sender::new(Capture::default(), cfg(GsoMode::Cmsg, Batching::Single));
        s.send(&payload(2800), 1400, Some(77)).unwrap();
        let msgs: Vec<_> = netlane_sys::cmsg::CmsgIter::new(&s.io().0[0])
            .map(|m| netlane_sys::cmsg::Cmsg::decode(m.unwrap()))
            .collect();
        assert_eq!(msgs, vec![netlane_sys::cmsg::Cmsg::UdpSegment(1400), netlane_sys::cmsg::Cmsg::TxTime(77)]);
    }

    #[test]
    fn bad_segment_sizes() {
        let mut s = Sender::new(FakeKernel::default(), cfg(GsoMode::Cmsg, Batching::Single));
        assert!(matches!(s.send(&[1], 0, None), Err(SendError::BadSegmentSize(0))));
        assert!(matches!(s.send(&[1], 70_000, None), Err(SendError::BadSegmentSize(70_000))));
    }
}

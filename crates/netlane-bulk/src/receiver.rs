//! The bulk receiver (UDP datagrams or a TCP stream), with integrity checks and a
//! per-millisecond burstiness meter.

use std::io::{self, Read};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::flows::FlowTable;
use super::payload::{Checker, Verify, stream_byte};
use super::{BulkError, RxReport, RxSpec, Transport, io_err};
use netlane::metrics::Hist;
use netlane::metrics::cpu::thread_cpu;
use netlane::time::monotonic_ns;
use netlane::udp::{Receiver, ReceiverConfig, UdpSocket};

/// Idle time after the sender finished that ends the receiver.
const QUIET_NS: u64 = 150_000_000;
/// Longest the receiver drains after the sender finished.
const MAX_DRAIN_NS: u64 = 3_000_000_000;
/// Width of a burstiness window.
const WINDOW_NS: u64 = 1_000_000;

/// Bytes per fixed time window, recorded into a histogram (including empty windows,
/// up to a limit, so gaps count as zero-byte windows).
#[derive(Debug)]
pub(super) struct BurstMeter {
    start: Option<u64>,
    window: u64,
    bytes: u64,
    hist: Hist,
}

impl BurstMeter {
    pub(super) fn new() -> Self {
        Self { start: None, window: 0, bytes: 0, hist: Hist::new() }
    }

    pub(super) fn add(&mut self, now_ns: u64, bytes: u64) {
        let start = *self.start.get_or_insert(now_ns);
        let w = (now_ns - start) / WINDOW_NS;
        if w > self.window {
            self.hist.record(self.bytes);
            // Empty windows in between (bounded, in case of a long stall).
            for _ in 0..(w - self.window - 1).min(10_000) {
                self.hist.record(0);
            }
            self.window = w;
            self.bytes = 0;
        }
        self.bytes += bytes;
    }

    /// Summary over the complete windows seen (the last, partial one is left out).
    pub(super) fn summary(&self) -> netlane::metrics::Summary {
        self.hist.summary()
    }
}

/// A bound receiving socket, created before the sender starts.
#[derive(Debug)]
pub(super) enum RxSocket {
    Udp(UdpSocket),
    Tcp(TcpListener),
}

impl RxSocket {
    pub(super) fn bind(addr: SocketAddr, spec: &RxSpec) -> Result<Self, BulkError> {
        match spec.transport {
            Transport::Udp => {
                let s = UdpSocket::bind(addr).map_err(io_err(format!("bind UDP {addr}")))?;
                s.set_recv_buffer(spec.rcvbuf).map_err(io_err("set receive buffer"))?;
                if spec.gro {
                    s.enable_gro().map_err(io_err("enable UDP_GRO"))?;
                }
                s.set_read_timeout(Some(Duration::from_millis(20))).map_err(io_err("set read timeout"))?;
                Ok(RxSocket::Udp(s))
            }
            Transport::Tcp => {
                let l = TcpListener::bind(addr).map_err(io_err(format!("listen on TCP {addr}")))?;
                l.set_nonblocking(true).map_err(io_err("set listener non-blocking"))?;
                Ok(RxSocket::Tcp(l))
            }
        }
    }

    pub(super) fn port(&self) -> u16 {
        match self {
            RxSocket::Udp(s) => s.local_addr().map(|a| a.port()).unwrap_or(0),
            RxSocket::Tcp(l) => l.local_addr().map(|a| a.port()).unwrap_or(0),
        }
    }

    /// Receives until the sender is done and the socket has gone quiet.
    pub(super) fn receive(
        self,
        spec: &RxSpec,
        run: u32,
        datagram_size: usize,
        sender_done: &AtomicBool,
    ) -> Result<RxReport, BulkError> {
        match self {
            RxSocket::Udp(s) => receive_udp(s, spec, run, datagram_size, sender_done),
            RxSocket::Tcp(l) => receive_tcp(l, spec, sender_done),
        }
    }
}

/// When data arrived, how it was spread over time, and when to stop receiving: after
/// the sender is done and nothing arrived for a while.
struct Activity {
    first: Option<u64>,
    last: u64,
    done_seen: Option<u64>,
    meter: BurstMeter,
}

impl Activity {
    fn new() -> Self {
        Self { first: None, last: 0, done_seen: None, meter: BurstMeter::new() }
    }

    /// `bytes` arrived now.
    fn data(&mut self, bytes: u64) {
        let now = monotonic_ns();
        self.first.get_or_insert(now);
        self.last = now;
        self.meter.add(now, bytes);
    }

    fn should_stop(&mut self, sender_done: &AtomicBool) -> bool {
        if !sender_done.load(Ordering::Acquire) {
            return false;
        }
        let now = monotonic_ns();
        let since = *self.done_seen.get_or_insert(now);
        now.saturating_sub(self.last.max(since)) > QUIET_NS || now - since > MAX_DRAIN_NS
    }

    /// Seconds from the first to the last arrival.
    fn seconds(&self) -> f64 {
        self.first.map_or(0.0, |f| (self.last - f) as f64 / 1e9)
    }
}

fn receive_udp(
    sock: UdpSocket,
    spec: &RxSpec,
    run: u32,
    datagram_size: usize,
    sender_done: &AtomicBool,
) -> Result<RxReport, BulkError> {
    let cpu0 = thread_cpu();
    let slot_len = if spec.gro { ReceiverConfig::MAX_SLOT } else { spec.max_datagram.max(datagram_size) };
    let mut rcv = Receiver::new(ReceiverConfig { slot_len, ..ReceiverConfig::new(spec.batching) });
    let mut checker = Checker::new(run, spec.verify, datagram_size);
    let mut flows = (spec.flows > 0).then(|| FlowTable::new(spec.flows, run));
    if flows.is_some() {
        // Each flow's datagrams are as large as its path MTU allows.
        checker = Checker::new(run, spec.verify, spec.max_datagram).with_flows();
    }
    let mut activity = Activity::new();
    loop {
        let before = rcv.stats().bytes;
        // One clock reading per read call, after it returned.
        let mut now = None;
        let seen = rcv.recv(sock.as_fd(), |d| {
            checker.check(d.data);
            if let Some(t) = flows.as_mut() {
                t.handle_datagram(d.data, *now.get_or_insert_with(monotonic_ns));
            }
        });
        match seen {
            Ok(n) if n > 0 => activity.data(rcv.stats().bytes - before),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
            Err(e) => return Err(io_err("receive")(e)),
        }
        if activity.should_stop(sender_done) {
            break;
        }
    }
    let st = rcv.stats();
    Ok(RxReport {
        datagrams: st.datagrams,
        bytes: st.bytes,
        syscalls: st.syscalls,
        reads: st.reads,
        gro_reads: st.gro_reads,
        seconds: activity.seconds(),
        cpu: thread_cpu() - cpu0,
        integrity: checker.integrity,
        truncated: st.truncated,
        napi_id: netlane::sockopt::incoming_napi_id(sock.as_fd()).unwrap_or(0),
        per_ms_bytes: activity.meter.summary(),
        kernel_drops: 0,
        flows: flows.map(|t| t.report(activity.seconds())),
    })
}

fn receive_tcp(listener: TcpListener, spec: &RxSpec, sender_done: &AtomicBool) -> Result<RxReport, BulkError> {
    let cpu0 = thread_cpu();
    let mut activity = Activity::new();
    // Accept without blocking forever: the sender may have failed before connecting.
    let mut stream = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if activity.should_stop(sender_done) {
                    return Ok(RxReport { cpu: thread_cpu() - cpu0, ..RxReport::default() });
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(io_err("accept")(e)),
        }
    };
    stream.set_nonblocking(false).map_err(io_err("set stream blocking"))?;
    stream.set_read_timeout(Some(Duration::from_millis(20))).map_err(io_err("set read timeout"))?;
    let mut buf = vec![0u8; 256 * 1024];
    let (mut bytes, mut reads, mut syscalls, mut corrupt) = (0u64, 0u64, 0u64, 0u64);
    loop {
        syscalls += 1;
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if spec.verify == Verify::Full {
                    corrupt +=
                        buf[..n].iter().enumerate().filter(|(i, b)| **b != stream_byte(bytes + *i as u64)).count()
                            as u64;
                }
                bytes += n as u64;
                reads += 1;
                activity.data(n as u64);
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
            Err(e) => return Err(io_err("receive TCP")(e)),
        }
        if activity.should_stop(sender_done) {
            break;
        }
    }
    Ok(RxReport {
        datagrams: reads,
        bytes,
        syscalls,
        reads,
        seconds: activity.seconds(),
        cpu: thread_cpu() - cpu0,
        integrity: super::Integrity { unique: reads, corrupt, ..Default::default() },
        napi_id: netlane::sockopt::incoming_napi_id(stream.as_fd()).unwrap_or(0),
        per_ms_bytes: activity.meter.summary(),
        ..RxReport::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_meter_counts_empty_windows() {
        let mut m = BurstMeter::new();
        m.add(0, 100);
        m.add(500_000, 100); // same window
        m.add(3_000_000, 50); // windows 1 and 2 were empty
        m.add(4_000_000, 1);
        let s = m.summary();
        assert_eq!(s.count, 4); // 200, 0, 0, 50
        assert_eq!(s.max, 200);
        assert_eq!(s.min, 0);
    }
}

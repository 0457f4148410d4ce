//! The TCP bulk sender: the baseline UDP is measured against (TCP hands the kernel
//! 64 KB at a time and lets TSO/GSO split late, which is what UDP GSO imitates).

use std::io::{self, IoSlice};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::time::Duration;

use super::payload::stream_byte;
use super::{BulkError, TxReport, TxSpec, io_err};
use netlane::metrics::cpu::thread_cpu;
use netlane::time::monotonic_ns;
use netlane::zerocopy::{self, Tracker};

/// Sends a TCP stream to `dst` for `spec.duration`.
pub(super) fn send(spec: &TxSpec, dst: SocketAddr) -> Result<TxReport, BulkError> {
    let cpu0 = thread_cpu();
    let stream =
        TcpStream::connect_timeout(&dst, Duration::from_secs(5)).map_err(io_err(format!("connect TCP to {dst}")))?;
    if let Some(b) = spec.sndbuf {
        netlane::sockopt::set_send_buffer(stream.as_fd(), b).map_err(io_err("set send buffer"))?;
    }
    let mut zc = spec.zerocopy;
    if zc {
        netlane::sockopt::set_zerocopy(stream.as_fd(), true).map_err(io_err("enable SO_ZEROCOPY"))?;
    }
    // A pattern buffer one period longer than a write, so a write starting at any
    // stream offset is a slice of it. It is never modified, so zerocopy sends need no
    // buffer pool: the pinned pages keep their content.
    let write = spec.tcp_write;
    let buf: Vec<u8> = (0..(write + 251) as u64).map(stream_byte).collect();
    let mut tracker: Tracker<()> = Tracker::new();
    let mut other = zerocopy::OtherRecords::default();
    let (mut syscalls, mut calls, mut sent, mut zc_fallbacks) = (0u64, 0u64, 0u64, 0u64);
    let t0 = monotonic_ns();
    let end_at = t0 + spec.duration.as_nanos() as u64;
    while monotonic_ns() < end_at {
        let off = (sent % 251) as usize;
        let flags = if zc { libc::MSG_ZEROCOPY } else { 0 };
        syscalls += 1;
        match netlane_sys::msg::sendmsg(stream.as_fd(), None, &[IoSlice::new(&buf[off..off + write])], &[], flags) {
            Ok(n) => {
                sent += n as u64;
                calls += 1;
                if zc {
                    tracker.on_send(());
                    if calls.is_multiple_of(16) {
                        syscalls += 1;
                        zerocopy::drain_errqueue(stream.as_fd(), &mut tracker, &mut other)
                            .map_err(io_err("read zerocopy completions"))?;
                        while tracker.pop_completed().is_some() {}
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if zc && e.raw_os_error() == Some(libc::ENOBUFS) => {
                tracing::warn!("TCP MSG_ZEROCOPY send failed with ENOBUFS; falling back to copying sends");
                zc = false;
                zc_fallbacks += 1;
            }
            Err(e) => return Err(io_err("TCP send")(e)),
        }
    }
    let seconds = (monotonic_ns() - t0) as f64 / 1e9;
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut zc_stats = None;
    if spec.zerocopy {
        let give_up = monotonic_ns() + 2_000_000_000;
        loop {
            syscalls += 1;
            zerocopy::drain_errqueue(stream.as_fd(), &mut tracker, &mut other)
                .map_err(io_err("read zerocopy completions"))?;
            while tracker.pop_completed().is_some() {}
            if tracker.all_completed() || monotonic_ns() > give_up {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        zc_stats = Some(tracker.stats());
    }
    let mut path = vec![format!("tcp: send {} KiB per call", write / 1024)];
    if spec.zerocopy {
        path[0].push_str(if zc_fallbacks > 0 {
            "; MSG_ZEROCOPY -> ENOBUFS, fell back to copy"
        } else {
            "; MSG_ZEROCOPY"
        });
    }
    Ok(TxReport {
        datagrams: calls,
        bytes: sent,
        syscalls,
        seconds,
        cpu: thread_cpu() - cpu0,
        path,
        zerocopy_fallbacks: zc_fallbacks,
        zerocopy: zc_stats,
        ..TxReport::default()
    })
}

//! Socket plumbing shared by the target and host drivers: a receive buffer that keeps a
//! partial PDU, and sends with the batching flags.

use std::io::{self, Read};
use std::net::TcpStream;

/// Receive buffer: bytes in `buf[start..end]`, compacted when the tail runs out.
#[derive(Debug)]
pub(crate) struct RxBuf {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl RxBuf {
    pub(crate) fn new(cap: usize) -> RxBuf {
        RxBuf { buf: vec![0; cap], start: 0, end: 0 }
    }

    pub(crate) fn data(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    pub(crate) fn consume(&mut self, n: usize) {
        self.start = (self.start + n).min(self.end);
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Reads once from `sock` (which may be non-blocking), making room for at least
    /// `need` buffered bytes (a whole PDU whose header said so). Returns the bytes read;
    /// 0 means the peer closed.
    pub(crate) fn read_from(&mut self, mut sock: &TcpStream, need: usize) -> io::Result<usize> {
        let have = self.end - self.start;
        let want_cap = need.max(have + 4096);
        if self.buf.len() - self.start < want_cap || self.end == self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            self.start = 0;
            self.end = have;
            if self.buf.len() < want_cap {
                self.buf.resize(want_cap.next_power_of_two(), 0);
            }
        }
        let n = sock.read(&mut self.buf[self.end..])?;
        self.end += n;
        Ok(n)
    }
}

/// How a send relates to the rest of its batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Batch {
    /// More PDUs of this batch follow: `MSG_MORE` lets TCP hold a partial segment.
    More,
    /// The last PDU of a batch: `MSG_EOR` closes the record so TCP sends it now and does
    /// not merge later data into the same skb.
    Last,
}

/// One non-blocking send of `buf`; returns the bytes the kernel took (0 with
/// `WouldBlock` mapped to `Ok(0)`).
pub(crate) fn send(sock: &TcpStream, buf: &[u8], batch: Batch) -> io::Result<usize> {
    let flags = libc::MSG_DONTWAIT
        | libc::MSG_NOSIGNAL
        | match batch {
            Batch::More => libc::MSG_MORE,
            Batch::Last => libc::MSG_EOR,
        };
    match socket2::SockRef::from(sock).send_with_flags(buf, flags) {
        Ok(n) => Ok(n),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
        Err(e) => Err(e),
    }
}

/// Sends all of `buf`, blocking in `poll` while the socket buffer is full.
pub(crate) fn send_all(sock: &TcpStream, mut buf: &[u8]) -> io::Result<()> {
    use std::os::fd::AsFd;
    while !buf.is_empty() {
        let n = send(sock, buf, Batch::Last)?;
        if n == 0 {
            let mut fds = [nix::poll::PollFd::new(sock.as_fd(), nix::poll::PollFlags::POLLOUT)];
            nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(1000u16)).map_err(io::Error::from)?;
        }
        buf = &buf[n..];
    }
    Ok(())
}

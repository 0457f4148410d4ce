//! Responses through the service's own UDP socket: one datagram, or a GSO send of
//! segments with a latched fallback to one send per segment, waiting for room in a full
//! send buffer instead of dropping.

use super::*;

/// Sends responses through the service's UDP socket: one datagram with `sendto`,
/// segments with GSO (`UDP_SEGMENT`, up to 64 per call), falling back to one `sendto`
/// per segment when the kernel refuses GSO.
pub(super) struct Tx<'a> {
    sock: &'a UdpSocket,
    gso: bool,
    pub(super) syscalls: u64,
    pub(super) gso_sends: u64,
}

impl<'a> Tx<'a> {
    pub(super) fn new(sock: &'a UdpSocket) -> Self {
        Tx { sock, gso: true, syscalls: 0, gso_sends: 0 }
    }

    pub(super) fn send(&mut self, data: &[u8], segment_len: usize, to: SocketAddr) -> io::Result<()> {
        if data.len() <= segment_len {
            return self.send_one(data, to);
        }
        if self.gso {
            let dst = SockAddr::from(to);
            let mut sent = 0;
            for batch in data.chunks(segment_len * UDP_MAX_SEGMENTS) {
                if batch.len() <= segment_len {
                    self.send_one(batch, to)?;
                    sent += batch.len();
                    continue;
                }
                let mut cmsg = CmsgBuf::<32>::new();
                cmsg.push_udp_segment(segment_len as u16).map_err(|_| io::Error::other("control buffer full"))?;
                match self.retry(|s| {
                    netlane_sys::msg::sendmsg(s.as_fd(), Some(&dst), &[IoSlice::new(batch)], cmsg.as_bytes(), 0)
                }) {
                    Ok(_) => {
                        self.gso_sends += 1;
                        sent += batch.len();
                    }
                    // EIO (no checksum offload), EINVAL/EMSGSIZE: send the rest one by one
                    // from now on.
                    Err(e)
                        if sent == 0 && matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL | libc::EMSGSIZE)) =>
                    {
                        tracing::warn!(error = %e, "GSO refused; sending segments one by one");
                        self.gso = false;
                        break;
                    }
                    Err(e) => return Err(e),
                }
            }
            if self.gso {
                return Ok(());
            }
        }
        for seg in data.chunks(segment_len) {
            self.send_one(seg, to)?;
        }
        Ok(())
    }

    fn send_one(&mut self, data: &[u8], to: SocketAddr) -> io::Result<()> {
        self.retry(|s| s.send_to(data, to)).map(|_| ())
    }

    /// Runs a send; while the socket buffer is full waits for room (up to a second in
    /// all), so a burst of responses is slowed, not dropped.
    fn retry(&mut self, mut f: impl FnMut(&UdpSocket) -> io::Result<usize>) -> io::Result<usize> {
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            self.syscalls += 1;
            match f(self.sock) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                    let mut fds = [nix::poll::PollFd::new(self.sock.as_fd(), nix::poll::PollFlags::POLLOUT)];
                    let _ = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(10u8));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                r => return r,
            }
        }
    }
}

//! One worker, one lane: an epoll instance, the connections placed on it, its UDP
//! socket, and (with [`Steer::Reuseport`]) its own listener in the group.
//!
//! Sockets are registered once, edge-triggered, for input and output. The worker
//! remembers per connection whether the socket may have more to read (set by an
//! `EPOLLIN` edge, cleared by a short read or `EAGAIN`) and whether it can take more
//! output (cleared by a short write, set by an `EPOLLOUT` edge).
//!
//! A connection leaves a lane only whole: its socket is taken out of this epoll and
//! posted, with its protocol state (unparsed input, unsent output), to the lane that
//! takes it, which registers it and drives it at once. Nothing buffered is lost, and
//! the bytes that arrive meanwhile wait in the socket.
//!
//! Here: a connection's entry, the worker's loop, its mail, and a connection driven;
//! `listen.rs` the lane's own listener, `rehome.rs` connections leaving the lane,
//! `datagram.rs` the UDP socket, `close.rs` how connections end (idle, lingering, at
//! stop).

mod close;
mod datagram;
mod listen;
mod rehome;

use std::collections::VecDeque;
use std::io::ErrorKind;
use std::net::{TcpListener, UdpSocket};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use netlane::lanes::{BusyPoll, LaneId};
use netlane::serve::{AcceptBackoff, Admitted, Stop};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};

/// Reads one connection's turn makes at most (each up to its read buffer's space,
/// 16 KiB): about 256 KiB of requests before the worker's other connections, its
/// datagrams and its stop get a look.
const READS_PER_TURN: u32 = 16;

use super::Mail;
use super::host::{Shared, WorkerHost};
use super::stream::Stream;
use crate::proto::{Conn, Counters, Ctx, Limits, Turn, udp};
use close::linger;

const WAKE: u64 = u64::MAX;
const UDP: u64 = u64::MAX - 1;
const LISTEN: u64 = u64::MAX - 2;
/// The server's stop signal.
const STOP: u64 = u64::MAX - 3;
/// Largest reply a UDP request may produce; a request whose reply would be larger is
/// answered with an error instead.
const UDP_REPLY_MAX: usize = 1 << 20;

#[derive(Debug)]
struct Entry {
    stream: Stream,
    conn: Conn,
    /// The socket may hold unread bytes.
    can_read: bool,
    /// The socket can take output.
    can_write: bool,
    /// The peer shut its side: close once the output is out.
    peer_done: bool,
    /// In the ready queue (a yielded turn).
    queued: bool,
    /// Closing: since when (ms). The output goes out, then the sending side is shut and
    /// input is read and dropped until the peer closes (or a second passes), so that a
    /// final error line is not destroyed by the reset that closing a socket with unread
    /// input sends.
    lingering_since: Option<u64>,
    /// The sending side was shut.
    shut: bool,
    last_active_ms: u64,
    /// The NAPI instance its packets arrive through (0: none known).
    napi_id: u32,
    /// Its place under the connection limit: freed when the entry is dropped.
    _admitted: Admitted,
}

/// A connection on its way to another lane.
#[derive(Debug)]
pub(crate) struct Moving {
    entry: Entry,
}

impl Moving {
    /// The NAPI instance its packets arrive through.
    pub(crate) fn napi_id(&self) -> u32 {
        self.entry.napi_id
    }
}

#[derive(Debug)]
pub(crate) struct Worker {
    id: LaneId,
    shared: Arc<Shared>,
    stop: Stop,
    /// This lane's listener in the reuseport group.
    listener: Option<TcpListener>,
    /// After a failed accept, how long the listener rests (out of its epoll interest, so
    /// that a queued connection does not wake the loop over and over).
    backoff: AcceptBackoff,
    listener_rests_until: Option<Instant>,
    busy: Option<BusyPoll>,
    /// Retired: every connection given away; the loop ends.
    retired: bool,
    limits: Limits,
    idle_timeout: Option<Duration>,
    udp: Option<UdpSocket>,
    udp_pending: bool,
    epoll: Epoll,
    conns: Vec<Option<Entry>>,
    free: Vec<usize>,
    ready: VecDeque<usize>,
    counters: Counters,
    udp_conn: Conn,
    udp_in: Vec<u8>,
    udp_out: Vec<u8>,
}

impl Worker {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: LaneId,
        shared: Arc<Shared>,
        stop: Stop,
        limits: Limits,
        idle_timeout: Option<Duration>,
        udp: Option<UdpSocket>,
        listener: Option<TcpListener>,
        busy: Option<BusyPoll>,
    ) -> std::io::Result<Worker> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        epoll.add(shared.mailbox(id).wake.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, WAKE))?;
        epoll.add(stop.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, STOP))?;
        if let Some(u) = &udp {
            epoll.add(u.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN | EpollFlags::EPOLLET, UDP))?;
        }
        if let Some(l) = &listener {
            l.set_nonblocking(true)?;
            epoll.add(l.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, LISTEN))?;
        }
        if let Some(bp) = &busy {
            let k = netlane::lanes::busy::apply_epoll(epoll.0.as_fd(), bp);
            if !k.applied() {
                tracing::warn!(lane = id, knob = %k, "busy polling refused");
            }
            shared.lanes.knob(Some(id), k);
        }
        let item_max = shared.store.item_max();
        // A UDP request is one datagram: its connection never needs more than that.
        let udp_limits = Limits { output_pause: UDP_REPLY_MAX, ..limits };
        Ok(Worker {
            id,
            shared,
            stop,
            listener,
            backoff: AcceptBackoff::new(),
            listener_rests_until: None,
            busy,
            retired: false,
            limits,
            idle_timeout,
            udp_pending: udp.is_some(),
            udp,
            epoll,
            conns: Vec::new(),
            free: Vec::new(),
            ready: VecDeque::new(),
            counters: Counters::default(),
            udp_conn: Conn::new(udp_limits, item_max),
            udp_in: vec![0; 65536],
            udp_out: Vec::with_capacity(udp::UDP_MAX_PAYLOAD),
        })
    }

    pub fn run(mut self) {
        let mut events = vec![EpollEvent::empty(); 256];
        let mut last_idle_check = 0;
        loop {
            if self.stop.is_stopped() {
                break;
            }
            let busy = !self.ready.is_empty() || self.udp_pending;
            let timeout = if busy {
                EpollTimeout::ZERO
            } else {
                let rest =
                    self.listener_rests_until.map_or(200, |t| t.saturating_duration_since(Instant::now()).as_millis());
                EpollTimeout::from(rest.min(200) as u16)
            };
            let n = match self.epoll.wait(&mut events, timeout) {
                Ok(n) => {
                    self.wake_listener();
                    n
                }
                Err(nix::Error::EINTR) => 0,
                Err(e) => {
                    tracing::error!(worker = self.id, error = %e, "epoll_wait failed; worker stops");
                    break;
                }
            };
            for ev in &events[..n] {
                match ev.data() {
                    WAKE => self.take_mail(),
                    // The loop's top sees it.
                    STOP => {}
                    UDP => self.udp_pending = true,
                    LISTEN => {
                        // Level-triggered: what a batch leaves wakes the next wait.
                        self.accept_own();
                    }
                    t => {
                        let f = ev.events();
                        if let Some(Some(e)) = self.conns.get_mut(t as usize) {
                            if f.intersects(
                                EpollFlags::EPOLLIN
                                    | EpollFlags::EPOLLRDHUP
                                    | EpollFlags::EPOLLHUP
                                    | EpollFlags::EPOLLERR,
                            ) {
                                e.can_read = true;
                            }
                            if f.intersects(EpollFlags::EPOLLOUT | EpollFlags::EPOLLHUP | EpollFlags::EPOLLERR) {
                                e.can_write = true;
                            }
                        }
                        self.drive(t as usize);
                    }
                }
                if self.retired {
                    break;
                }
            }
            if self.retired {
                self.shared.workers[self.id].publish(&self.counters);
                return;
            }
            if self.udp_pending {
                self.serve_udp();
            }
            for _ in 0..self.ready.len() {
                let Some(i) = self.ready.pop_front() else { break };
                if let Some(Some(e)) = self.conns.get_mut(i) {
                    e.queued = false;
                }
                self.drive(i);
            }
            let now = self.shared.now_ms();
            if now >= last_idle_check + 1000 {
                last_idle_check = now;
                self.kick_idle(now);
            }
            self.shared.workers[self.id].publish(&self.counters);
        }
        self.shutdown();
    }

    fn take_mail(&mut self) {
        let mut retire = false;
        for mail in self.shared.mailbox(self.id).take() {
            match mail {
                Mail::Conn { stream, napi_id, admitted } => {
                    let now = self.shared.now_ms();
                    let conn = Conn::new(self.limits, self.shared.store.item_max())
                        .with_budget(self.shared.conn_memory.clone());
                    let e = Entry {
                        stream,
                        conn,
                        can_read: true,
                        can_write: true,
                        peer_done: false,
                        queued: false,
                        lingering_since: None,
                        shut: false,
                        last_active_ms: now,
                        napi_id,
                        _admitted: admitted,
                    };
                    self.register(e);
                }
                Mail::Moved(m) => {
                    let mut e = m.entry;
                    // It may have become readable or writable while it moved: look.
                    e.can_read = true;
                    e.can_write = true;
                    e.queued = false;
                    self.shared.lanes.counters[self.id].moved_in.fetch_add(1, Ordering::Relaxed);
                    self.register(e);
                }
                Mail::Rehome => self.rehome(false),
                // After the rest of the batch: connections posted before the lane left
                // the map are registered first, then given away with the others.
                Mail::Retire => retire = true,
            }
        }
        if retire {
            self.rehome(true);
            self.retired = true;
        }
    }

    /// Registers a connection with this lane's epoll and drives it once.
    fn register(&mut self, e: Entry) {
        let idx = self.free.pop().unwrap_or_else(|| {
            self.conns.push(None);
            self.conns.len() - 1
        });
        let flags = EpollFlags::EPOLLIN | EpollFlags::EPOLLOUT | EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLET;
        if let Err(err) = self.epoll.add(e.stream.as_fd(), EpollEvent::new(flags, idx as u64)) {
            tracing::warn!(error = %err, "epoll add failed; connection dropped");
            self.free.push(idx);
            self.shared.lanes.map().closed(self.id);
            return;
        }
        if let Some(bp) = &self.busy
            && netlane::lanes::busy::apply_socket(e.stream.as_fd(), bp).is_err()
        {
            self.shared.lanes.counters[self.id].busy_poll_refused.fetch_add(1, Ordering::Relaxed);
        }
        self.conns[idx] = Some(e);
        self.drive(idx);
    }

    /// Reads, runs and writes for connection `idx` until it would block or yields, or
    /// its turn's reads are spent (then it waits in the ready queue like a yielded turn:
    /// a peer whose socket never empties must not keep the worker from its other
    /// connections and its stop).
    fn drive(&mut self, idx: usize) {
        let clock = self.shared.clock();
        let host = WorkerHost { shared: &self.shared, worker: self.id };
        let Some(Some(e)) = self.conns.get_mut(idx) else { return };
        if e.lingering_since.is_some() {
            if linger(e, &mut self.counters) {
                self.close(idx);
            }
            return;
        }
        let mut ctx = Ctx {
            store: &self.shared.store,
            clock,
            host: &host,
            counters: &mut self.counters,
            settings: &self.shared.settings.proto,
        };
        let mut reads_left = READS_PER_TURN;
        let close = loop {
            if e.can_read && !e.peer_done {
                if reads_left == 0 {
                    if !e.queued {
                        e.queued = true;
                        self.ready.push_back(idx);
                    }
                    break false;
                }
                reads_left -= 1;
                let space = e.conn.read_space();
                let len = space.len();
                if len > 0 {
                    match e.stream.read(space) {
                        Ok(0) => {
                            e.peer_done = true;
                            e.can_read = false;
                        }
                        Ok(n) => {
                            e.conn.filled(n);
                            ctx.counters.bytes_read += n as u64;
                            e.last_active_ms = clock.now_ms;
                            // A short read drained the socket: the next bytes bring an edge.
                            e.can_read = n == len;
                        }
                        Err(err) if err.kind() == ErrorKind::WouldBlock => e.can_read = false,
                        Err(err) if err.kind() == ErrorKind::Interrupted => continue,
                        Err(_) => break true,
                    }
                }
            }
            let turn = e.conn.process(&mut ctx);
            if !flush(e, ctx.counters) {
                break true;
            }
            let drained = e.conn.unsent() == 0;
            match turn {
                Turn::Close => {
                    if e.peer_done {
                        break true;
                    }
                    e.lingering_since = Some(clock.now_ms);
                    break linger(e, ctx.counters);
                }
                Turn::NeedRead if e.peer_done => {
                    if drained {
                        break true;
                    }
                    break false;
                }
                Turn::NeedRead => {
                    if !e.can_read {
                        break false;
                    }
                }
                Turn::Blocked => {
                    if !drained {
                        break false;
                    }
                }
                Turn::Yield => {
                    if !e.queued {
                        e.queued = true;
                        self.ready.push_back(idx);
                    }
                    break false;
                }
            }
        };
        if close {
            self.close(idx);
        }
    }
}

/// Writes what the connection has pending; false on a broken connection.
fn flush(e: &mut Entry, c: &mut Counters) -> bool {
    while e.can_write && e.conn.unsent() > 0 {
        let mut slices = [std::io::IoSlice::new(&[]); 16];
        let n = e.conn.poll_output(&mut slices);
        let len: usize = slices[..n].iter().map(|s| s.len()).sum();
        match e.stream.write_vectored(&slices[..n]) {
            Ok(written) => {
                e.conn.handle_written(written);
                c.bytes_written += written as u64;
                if written < len {
                    e.can_write = false;
                }
            }
            Err(err) if err.kind() == ErrorKind::WouldBlock => e.can_write = false,
            Err(err) if err.kind() == ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    true
}

//! The TCP comparator's server (RDS over TCP's way): the datagram server's answers to
//! requests that come as messages over one TCP connection per client, on one thread and
//! one epoll. Bounded: the connections (more are closed as they come, and counted), and
//! per connection the bytes read ahead (a largest request and a read, [`Framer`]) and
//! the answer not yet written (one answer: a connection whose answer the socket will not
//! take is not read until it has).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

use super::event_loop::LIVE_EVERY;
use super::*;
use crate::proto::stream::{FrameError, Framer};

/// How requests and responses travel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// A datagram each (segmented responses several).
    #[default]
    Udp,
    /// Messages over one TCP connection per client, header after header.
    Tcp,
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Transport::Udp => "udp",
            Transport::Tcp => "tcp",
        })
    }
}

impl std::str::FromStr for Transport {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "udp" => Ok(Transport::Udp),
            "tcp" => Ok(Transport::Tcp),
            _ => Err(format!("{s:?}: expected udp or tcp")),
        }
    }
}

/// The most connections a TCP server takes at once.
pub const MAX_CONNECTIONS: usize = 65_536;

/// The listening socket's token; a connection's is its slot.
const LISTENER: u64 = u64::MAX;
/// The stop signal's token.
const STOP_TOKEN: u64 = u64::MAX - 1;

/// One client's connection.
struct Conn {
    stream: TcpStream,
    framer: Framer,
    /// The answer being written, and how much of it is.
    out: Vec<u8>,
    written: usize,
    /// Whether the loop waits for room to write (not for requests).
    waits_to_write: bool,
    /// Whether its epoll interest is room to write (else requests).
    watched_for_room: bool,
}

/// What serving a connection for a while left it as.
enum Served {
    /// Waiting for the socket: requests to read, or room to write.
    Blocked,
    /// Its turn ran out with work left (whole requests read, a stream still coming).
    MoreWork,
    /// Done: closed by the client, broken, or not a stream of messages.
    Closed,
}

/// Reads, answers and writes one connection may do before the others get their turn:
/// a peer that pipelines requests as fast as it reads answers never makes a read
/// block, and would otherwise keep the loop (and its stop) to itself.
const TURN: u32 = 64;

/// File descriptors the server holds besides its connections (listener, epoll, the
/// stop signal, standard streams, a log).
const OTHER_FDS: u64 = 64;

/// The most a connection holds: a largest request read ahead, a largest answer.
pub(super) fn connection_bytes(cfg: &ServerConfig) -> usize {
    Framer::most(wire::MAX_DATAGRAM) + cfg.responder.max_reply_bytes()
}

/// Raises this process's open-file limit to what `max_connections` need, within its
/// hard limit; an error when even that is too low.
fn ensure_descriptors(max_connections: usize) -> Result<(), ServerError> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let need = max_connections as u64 + OTHER_FDS;
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(|e| io_err("read RLIMIT_NOFILE")(e.into()))?;
    if soft >= need {
        return Ok(());
    }
    if hard < need {
        return Err(ServerError::Tcp(format!(
            "{max_connections} connections need {need} file descriptors; this process may open {hard} \
             (RLIMIT_NOFILE's hard limit)"
        )));
    }
    setrlimit(Resource::RLIMIT_NOFILE, need, hard).map_err(|e| io_err("raise RLIMIT_NOFILE")(e.into()))
}

/// Serves TCP until `stop` is given (or the configured duration passes).
pub(super) fn serve(
    cfg: &ServerConfig,
    stop: &Stop,
    live: &SharedRrCounters,
    on_ready: impl FnOnce(SocketAddr),
) -> Result<ServerStats, ServerError> {
    netlane::cpus::pin(cfg.cpu);
    ensure_descriptors(cfg.max_connections)?;
    let listener = TcpListener::bind(cfg.listen).map_err(io_err(format!("bind TCP {}", cfg.listen)))?;
    listener.set_nonblocking(true).map_err(io_err("set the listener non-blocking"))?;
    let addr = listener.local_addr().map_err(io_err("read the listening address"))?;
    let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(|e| io_err("epoll")(e.into()))?;
    let add = |fd: std::os::fd::BorrowedFd<'_>, token| {
        ep.add(fd, EpollEvent::new(EpollFlags::EPOLLIN, token)).map_err(|e| io_err("epoll add")(e.into()))
    };
    add(listener.as_fd(), LISTENER)?;
    add(stop.as_fd(), STOP_TOKEN)?;
    let mut st = ServerStats { path: "tcp".into(), listen: addr.to_string(), tx: "tcp".into(), ..Default::default() };
    let mut conns = Conns { slots: Vec::new(), free: Vec::new(), open: 0, listening: true };
    let mut scratch = vec![0u8; cfg.responder.max_reply_bytes().max(wire::HEADER_LEN)];
    on_ready(addr);
    let started = Instant::now();
    let cpu0 = thread_cpu();
    let mut events = vec![EpollEvent::empty(); 256];
    let mut told = (RrCounters::default(), Instant::now());
    // Connections whose turn ran out with work left: served again before the next wait,
    // which then does not sleep.
    let (mut more, mut turn) = (Vec::new(), Vec::new());
    while !stop.is_stopped() && cfg.duration.is_none_or(|d| started.elapsed() < d) {
        st.counters.polls += 1;
        if told.1.elapsed() >= LIVE_EVERY {
            live.add(&st.counters.minus(&told.0));
            told = (st.counters, Instant::now());
        }
        let wait_ms: u16 = if more.is_empty() { 100 } else { 0 };
        let n = match ep.wait(&mut events, EpollTimeout::from(wait_ms)) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => 0,
            Err(e) => return Err(io_err("epoll wait")(e.into())),
        };
        if n > 0 {
            st.counters.wakeups += 1;
        }
        turn.clear();
        turn.append(&mut more);
        for ev in &events[..n] {
            match ev.data() {
                STOP_TOKEN => {}
                LISTENER => conns.accept(cfg, &listener, &ep, &mut st),
                slot => turn.push(slot as usize),
            }
        }
        for &i in &turn {
            if conns.serve(cfg, i, &ep, &listener, &mut scratch, &mut st) && !more.contains(&i) {
                more.push(i);
            }
        }
    }
    live.add(&st.counters.minus(&told.0));
    let seconds = started.elapsed().as_secs_f64();
    st.seconds = seconds;
    st.cpu_s = thread_cpu().total_s() - cpu0.total_s();
    st.busy = if seconds > 0.0 { (st.cpu_s / seconds).min(1.0) } else { 0.0 };
    st.derive_ratios();
    Ok(st)
}

/// The connections, by slot (a connection's epoll token), and whether the listener is
/// watched (not while descriptors ran out).
struct Conns {
    slots: Vec<Option<Conn>>,
    /// Slots a closed connection left, taken first.
    free: Vec<usize>,
    open: usize,
    listening: bool,
}

impl Conns {
    /// Takes every connection waiting; those beyond the limit are closed at once. Out
    /// of descriptors, the listener is not watched until a connection closes (it would
    /// be ready again at once, forever).
    fn accept(&mut self, cfg: &ServerConfig, listener: &TcpListener, ep: &Epoll, st: &mut ServerStats) {
        loop {
            let stream = match listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    tracing::debug!(error = %e, "accept failed; not accepting until a connection closes");
                    st.counters.recv_errors += 1;
                    self.listening = ep.delete(listener.as_fd()).is_err();
                    return;
                }
            };
            if self.open >= cfg.max_connections {
                st.counters.connections_refused += 1;
                continue;
            }
            if stream.set_nonblocking(true).is_err() || stream.set_nodelay(true).is_err() {
                st.counters.recv_errors += 1;
                continue;
            }
            let slot = self.free.last().copied().unwrap_or(self.slots.len());
            if ep.add(stream.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, slot as u64)).is_err() {
                st.counters.recv_errors += 1;
                continue;
            }
            let conn = Conn {
                stream,
                framer: Framer::new(wire::MAX_DATAGRAM),
                out: Vec::new(),
                written: 0,
                waits_to_write: false,
                watched_for_room: false,
            };
            if slot == self.slots.len() {
                self.slots.push(Some(conn));
            } else {
                self.free.pop();
                self.slots[slot] = Some(conn);
            }
            self.open += 1;
            st.counters.connections += 1;
        }
    }

    /// Serves the connection in slot `i` for a turn; true when it has work left.
    fn serve(
        &mut self,
        cfg: &ServerConfig,
        i: usize,
        ep: &Epoll,
        listener: &TcpListener,
        scratch: &mut [u8],
        st: &mut ServerStats,
    ) -> bool {
        let Some(conn) = self.slots.get_mut(i).and_then(Option::as_mut) else { return false };
        let served = serve_conn(cfg, conn, scratch, st);
        let keep = match served {
            Served::Closed => false,
            _ => {
                // The interest changes only when what the connection waits for does.
                let want_room = conn.waits_to_write;
                if want_room != conn.watched_for_room {
                    let want = if want_room { EpollFlags::EPOLLOUT } else { EpollFlags::EPOLLIN };
                    conn.watched_for_room = want_room;
                    ep.modify(conn.stream.as_fd(), &mut EpollEvent::new(want, i as u64)).is_ok()
                } else {
                    true
                }
            }
        };
        if keep {
            return matches!(served, Served::MoreWork);
        }
        let _ = ep.delete(conn.stream.as_fd());
        self.slots[i] = None;
        self.free.push(i);
        self.open -= 1;
        if !self.listening {
            self.listening = ep.add(listener.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, LISTENER)).is_ok();
        }
        false
    }
}

/// Writes what the connection owes, then answers its whole requests one answer at a
/// time, for at most [`TURN`] steps.
fn serve_conn(cfg: &ServerConfig, conn: &mut Conn, scratch: &mut [u8], st: &mut ServerStats) -> Served {
    for _ in 0..TURN {
        match flush(conn, st) {
            Ok(true) => conn.waits_to_write = false,
            Ok(false) => {
                conn.waits_to_write = true;
                return Served::Blocked;
            }
            Err(e) if gone(&e) => return Served::Closed,
            Err(e) => {
                tracing::debug!(error = %e, "send failed");
                st.counters.send_errors += 1;
                return Served::Closed;
            }
        }
        match conn.framer.poll_message() {
            Ok(Some(request)) => {
                st.counters.frames += 1;
                answer(cfg, request, scratch, &mut conn.out, st);
                continue;
            }
            Ok(None) => {}
            Err(e @ (FrameError::NotAHeader { .. } | FrameError::TooLong { .. })) => {
                tracing::debug!(error = %e, "not a stream of requests: closed");
                st.counters.refused_malformed += 1;
                return Served::Closed;
            }
        }
        st.counters.recv_syscalls += 1;
        match conn.stream.read(conn.framer.read_space()) {
            Ok(0) => return Served::Closed,
            Ok(n) => conn.framer.filled(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Served::Blocked,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if gone(&e) => return Served::Closed,
            Err(e) => {
                tracing::debug!(error = %e, "receive failed");
                st.counters.recv_errors += 1;
                return Served::Closed;
            }
        }
    }
    Served::MoreWork
}

/// A client that closed its connection, with answers unread or still coming: a close,
/// not an error.
fn gone(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe)
}

/// Writes the answer owed; true once it is all written.
fn flush(conn: &mut Conn, st: &mut ServerStats) -> io::Result<bool> {
    while conn.written < conn.out.len() {
        st.counters.send_syscalls += 1;
        match conn.stream.write(&conn.out[conn.written..]) {
            Ok(n) => conn.written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    conn.out.clear();
    conn.written = 0;
    Ok(true)
}

/// The answer to one request, appended to `out`: the response, or a refusal naming the
/// limit. No cookies: the connection's handshake verified its source.
fn answer(cfg: &ServerConfig, request: &[u8], scratch: &mut [u8], out: &mut Vec<u8>, st: &mut ServerStats) {
    if cfg.responder.echo {
        out.extend_from_slice(request);
        st.counters.responses += 1;
        st.counters.datagrams_sent += 1;
        st.counters.bytes_sent += request.len() as u64;
        return;
    }
    let h = match wire::decode(request) {
        Ok((h, _)) if h.kind == Kind::Request => h,
        Ok(_) => {
            st.counters.refused_not_request += 1;
            return;
        }
        Err(_) => {
            st.counters.refused_malformed += 1;
            return;
        }
    };
    if h.response_len > cfg.responder.max_response {
        st.counters.refused_too_large += 1;
        if let Ok(n) = wire::encode(&Header::refused(&h, cfg.responder.max_response), scratch) {
            out.extend_from_slice(&scratch[..n]);
            st.counters.datagrams_sent += 1;
            st.counters.bytes_sent += n as u64;
        }
        return;
    }
    match respond_to(&cfg.responder, &h, scratch) {
        Ok(reply) => {
            out.extend_from_slice(&scratch[..reply.len]);
            st.counters.responses += 1;
            st.counters.datagrams_sent += reply.segments as u64;
            st.counters.bytes_sent += reply.len as u64;
        }
        Err(_) => st.counters.send_errors += 1,
    }
}

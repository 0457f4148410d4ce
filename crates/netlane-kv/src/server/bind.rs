//! The sockets a server serves on, bound at start: the TCP listener (or one per lane in
//! a reuseport group), the Unix socket, the UDP group; the reuseport selectors that
//! steer the groups, and the sysctls the server sets for as long as it runs.

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};

use netlane::lanes::{LaneMap, ReuseportSteering};

use super::{ServerConfig, ServerError, Steer, io_err, stream};

/// What a server binds at start.
pub(super) struct Sockets {
    /// TCP: one listener, or one per lane in a reuseport group (in lane order).
    pub listeners: Vec<TcpListener>,
    pub tcp_addr: Option<SocketAddr>,
    pub unix: Option<stream::UnixSocket>,
    /// UDP: one socket per lane in a `SO_REUSEPORT` group.
    pub udp: Vec<UdpSocket>,
    pub udp_addr: Option<SocketAddr>,
}

impl Sockets {
    /// Binds what `cfg` serves: TCP, the Unix socket, UDP.
    pub(super) fn bind(cfg: &ServerConfig) -> Result<Sockets, ServerError> {
        let reuseport = cfg.steer == Steer::Reuseport;
        // TCP: one listener, or one per lane in a reuseport group (in lane order).
        let mut listeners: Vec<TcpListener> = Vec::new();
        let mut tcp_addr = None;
        if cfg.tcp {
            let first = bind_tcp(cfg.listen, cfg.backlog, reuseport)?;
            let addr = first.local_addr().map_err(io_err("local address"))?;
            listeners.push(first);
            if reuseport {
                for _ in 1..cfg.threads {
                    listeners.push(bind_tcp(addr, cfg.backlog, true)?);
                }
            }
            tcp_addr = Some(addr);
        }
        let unix = cfg
            .unix
            .as_ref()
            .map(|u| {
                stream::UnixSocket::bind(&u.path, u.mask, cfg.backlog)
                    .map_err(io_err(format!("bind Unix socket {}", u.path.display())))
            })
            .transpose()?;
        let udp = match cfg.udp_port {
            None => Vec::new(),
            Some(port) => bind_udp_group(SocketAddr::new(cfg.listen.ip(), port), cfg.threads)?,
        };
        let udp_addr = udp.first().map(|s| s.local_addr()).transpose().map_err(io_err("UDP local address"))?;
        Ok(Sockets { listeners, tcp_addr, unix, udp, udp_addr })
    }

    /// With reuseport steering, the selectors of the TCP group and (if UDP is served)
    /// the UDP group, each with the lanes at start joined and `map` written.
    pub(super) fn selectors(
        &self,
        cfg: &ServerConfig,
        map: &LaneMap,
    ) -> Result<(Option<ReuseportSteering>, Option<ReuseportSteering>), ServerError> {
        if cfg.steer != Steer::Reuseport {
            return Ok((None, None));
        }
        let tcp = selector(
            self.listeners[0].as_fd(),
            cfg.threads,
            map,
            [
                "load the reuseport selector (needs root)",
                "attach the reuseport selector",
                "write the reuseport selector's map",
            ],
        )?;
        // The UDP group gets a selector of its own (its sockets joined in lane order too).
        let udp = match self.udp.first() {
            None => None,
            Some(first) => Some(selector(
                first.as_fd(),
                cfg.threads,
                map,
                [
                    "load the UDP reuseport selector",
                    "attach the UDP reuseport selector",
                    "write the UDP reuseport selector's map",
                ],
            )?),
        };
        Ok((Some(tcp), udp))
    }
}

/// A reuseport selector attached to the group whose first socket is `first`, with its
/// `lanes` sockets joined in lane order and `map` written; `what` names the three steps
/// in errors (load, attach, write the map).
fn selector(
    first: BorrowedFd<'_>,
    lanes: usize,
    map: &LaneMap,
    what: [&str; 3],
) -> Result<ReuseportSteering, ServerError> {
    let [load, attach, write] = what;
    let mut st = ReuseportSteering::load().map_err(io_err(load))?;
    st.attach(first).map_err(io_err(attach))?;
    for lane in 0..lanes {
        st.joined(lane);
    }
    st.sync(map).map_err(io_err(write))?;
    Ok(st)
}

/// Writes a sysctl of the calling thread's network namespace (under /proc/sys/net) and
/// reads it back.
/// Sets a sysctl for as long as the server runs (restored when it stops, and by
/// `netlane clean` after a kill), reported as a knob.
pub(super) fn set_sysctl(path: &str, value: &str) -> (netlane::lanes::Knob, Option<netlane::installed::Sysctl>) {
    let name = path.trim_start_matches("/proc/sys/").replace('/', ".");
    match netlane::installed::Sysctl::set(path, value) {
        Ok(guard) => {
            let now = guard.read().unwrap_or_default();
            (netlane::lanes::Knob::new_applied(name, value, now), Some(guard))
        }
        Err(e) => (netlane::lanes::Knob::new_refused(name, value, e), None),
    }
}

pub(super) fn bind_tcp(addr: SocketAddr, backlog: i32, reuseport: bool) -> Result<TcpListener, ServerError> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None).map_err(io_err("TCP socket"))?;
    s.set_reuse_address(true).map_err(io_err("SO_REUSEADDR"))?;
    if reuseport {
        s.set_reuse_port(true).map_err(io_err("SO_REUSEPORT"))?;
    }
    s.bind(&addr.into()).map_err(io_err(format!("bind TCP {addr}")))?;
    s.listen(backlog).map_err(io_err(format!("listen on {addr}")))?;
    s.set_nonblocking(true).map_err(io_err("non-blocking listener"))?;
    Ok(s.into())
}

/// One UDP socket per worker in a `SO_REUSEPORT` group on `addr` (port 0: the first
/// socket's port for all).
fn bind_udp_group(addr: SocketAddr, n: usize) -> Result<Vec<UdpSocket>, ServerError> {
    use socket2::{Domain, Socket, Type};
    let mut out: Vec<UdpSocket> = Vec::new();
    let mut addr = addr;
    for _ in 0..n {
        let s = Socket::new(Domain::for_address(addr), Type::DGRAM, None).map_err(io_err("UDP socket"))?;
        s.set_reuse_port(true).map_err(io_err("SO_REUSEPORT"))?;
        s.bind(&addr.into()).map_err(io_err(format!("bind UDP {addr}")))?;
        s.set_nonblocking(true).map_err(io_err("non-blocking UDP"))?;
        let u: UdpSocket = s.into();
        if addr.port() == 0 {
            addr = u.local_addr().map_err(io_err("UDP local address"))?;
        }
        out.push(u);
    }
    Ok(out)
}

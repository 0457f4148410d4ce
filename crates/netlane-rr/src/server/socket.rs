//! The service's UDP socket: bound with the options every path needs, and the interface
//! its address is on (the frame paths read and write that device).

use super::*;

/// The interface a ring path reads: the one named, or the one that has the listen
/// address (every interface when it is unspecified).
pub(super) fn interface(cfg: &ServerConfig) -> Result<(u32, Option<String>), ServerError> {
    let name = match &cfg.iface {
        Some(n) => n.clone(),
        None if cfg.listen.ip().is_unspecified() => return Ok((0, Some("all".into()))),
        None => {
            let want = cfg.listen.ip();
            let addrs = nix::ifaddrs::getifaddrs().map_err(|e| io_err("getifaddrs")(e.into()))?;
            let found = addrs.into_iter().find(|a| {
                a.address.as_ref().is_some_and(|s| {
                    s.as_sockaddr_in().map(|v| std::net::IpAddr::V4(v.ip())) == Some(want)
                        || s.as_sockaddr_in6().map(|v| std::net::IpAddr::V6(v.ip())) == Some(want)
                })
            });
            match found {
                Some(a) => a.interface_name,
                None => {
                    return Err(ServerError::Interface(format!(
                        "no interface has {want}: name one for the {} path",
                        cfg.path
                    )));
                }
            }
        }
    };
    let index = nix::net::if_::if_nametoindex(name.as_str())
        .map_err(|e| ServerError::Interface(format!("interface {name}: {}", netlane::error::chain(&e))))?;
    Ok((index, Some(name)))
}

pub(super) fn bind(cfg: &ServerConfig, addr: SocketAddr, reuseport: bool) -> Result<UdpSocket, ServerError> {
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM.cloexec(), Some(Protocol::UDP))
        .map_err(io_err("UDP socket"))?;
    if addr.is_ipv6() {
        s.set_only_v6(true).map_err(io_err("IPV6_V6ONLY"))?;
    }
    if reuseport {
        s.set_reuse_port(true).map_err(io_err("SO_REUSEPORT"))?;
    }
    // Buffers are best effort (capped by net.core.*mem_max); the stats show drops.
    let _ = s.set_recv_buffer_size(cfg.recv_buffer);
    let _ = s.set_send_buffer_size(cfg.send_buffer);
    s.bind(&SockAddr::from(addr)).map_err(io_err(format!("bind {addr}")))?;
    s.set_nonblocking(true).map_err(io_err("O_NONBLOCK"))?;
    Ok(s.into())
}

//! memcached's command-line options that are not plain values: the ones netlane refuses
//! (with the reason), `-p`/`-U`/`-a`/`-B` values, `-o`'s extended options, `-u`, and the
//! port file memcached writes for its test suite.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;

/// memcached's options that netlane refuses, each with the reason.
#[derive(Debug, Args)]
pub struct Unsupported {
    #[arg(short = 'd', hide = true)]
    daemon: bool,
    #[arg(short = 'P', hide = true)]
    pidfile: Option<String>,
    #[arg(short = 'r', hide = true)]
    coredumps: bool,
    #[arg(short = 'k', hide = true)]
    lock_memory: bool,
    #[arg(short = 'L', hide = true)]
    large_pages: bool,
    #[arg(short = 'D', hide = true)]
    delimiter: Option<String>,
    #[arg(short = 'S', hide = true)]
    auth: bool,
    #[arg(short = 'Y', hide = true)]
    auth_file: Option<String>,
    #[arg(short = 'e', hide = true)]
    memory_file: Option<String>,
    #[arg(short = 'Z', hide = true)]
    tls: bool,
    #[arg(short = 'N', hide = true)]
    napi_ids: Option<String>,
}

impl Unsupported {
    /// The first option given that netlane does not have, with why.
    pub(super) fn check(&self) -> Result<()> {
        let why = [
            (self.daemon, "-d: netlane does not daemonize; run it under a service manager"),
            (self.pidfile.is_some(), "-P: there is no daemon mode to write a PID file for"),
            (self.coredumps, "-r: set the core file limit with ulimit -c"),
            (self.lock_memory, "-k: locking memory is not supported"),
            (self.large_pages, "-L: large pages are not supported"),
            (self.delimiter.is_some(), "-D: per-prefix stats are not supported"),
            (self.auth, "-S: authentication is not supported"),
            (self.auth_file.is_some(), "-Y: authentication is not supported"),
            (self.memory_file.is_some(), "-e: a restartable memory file is not supported"),
            (self.tls, "-Z: TLS is not supported"),
            (self.napi_ids.is_some(), "-N: use --lanes and --steer acceptor (NAPI-id placement)"),
        ];
        match why.iter().find(|(given, _)| *given) {
            Some((_, why)) => bail!("{why}"),
            None => Ok(()),
        }
    }
}

/// memcached's `-p`/`-U`: -1 (a free port) up to 65535.
pub(super) fn port_arg(s: &str) -> Result<i32, String> {
    match s.parse::<i32>() {
        Ok(p) if (-1..=65535).contains(&p) => Ok(p),
        _ => Err(format!("{s}: a port 0..=65535, or -1 for a free one")),
    }
}

pub(super) fn octal_mask(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s, 8).ok().filter(|m| *m <= 0o777).ok_or_else(|| format!("{s}: an octal mode, 0..=777"))
}

pub(super) fn protocol_arg(s: &str) -> Result<netlane_kv::proto::Protocol, String> {
    use netlane_kv::proto::Protocol;
    match s {
        "auto" => Ok(Protocol::Auto),
        "ascii" => Ok(Protocol::Ascii),
        "binary" => Ok(Protocol::Binary),
        _ => Err(format!("{s}: ascii, binary or auto")),
    }
}

/// What memcached's `-o` options ask of netlane.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct Extended {
    pub(super) idle_timeout: Option<Duration>,
    pub(super) slab_chunk_max: Option<u64>,
    /// Bytes; `Some(u64::MAX)` for memcached's 0 (no limit).
    pub(super) read_buf_mem_limit: Option<u64>,
    /// memcached tuning with no counterpart here.
    pub(super) no_effect: Vec<String>,
}

/// memcached's extended options that tune its own slab allocator, LRU, hashing and
/// privileges: none has a counterpart in netlane's store, so they are accepted (a
/// memcached command line runs as it is) and reported as having no effect.
const NO_EFFECT: &[&str] = &[
    "maxconns_fast",
    "hashpower",
    "tail_repair_time",
    "hash_algorithm",
    "lru_crawler",
    "lru_crawler_sleep",
    "lru_crawler_tocrawl",
    "lru_maintainer",
    "hot_lru_pct",
    "warm_lru_pct",
    "hot_max_factor",
    "warm_max_factor",
    "temporary_ttl",
    "watcher_logbuf_size",
    "worker_logbuf_size",
    "track_sizes",
    "hashexpand",
    "modern",
    "slab_reassign",
    "slab_automove",
    "slab_automove_ratio",
    "slab_automove_window",
    "slab_automove_freeratio",
    "inline_ascii_response",
    "lru_segmented",
    "expirezero_does_not_evict",
    "relaxed_privileges",
    "drop_privileges",
    "sock_cookie_id",
];

pub(super) fn extended(list: &[String]) -> Result<Extended> {
    let mut e = Extended::default();
    for opt in list.iter().filter(|o| !o.is_empty()) {
        let (name, value) = opt.split_once('=').map_or((opt.as_str(), None), |(n, v)| (n, Some(v)));
        let number = || -> Result<u64> {
            value.and_then(|v| v.parse::<u64>().ok()).with_context(|| format!("-o {opt}: {name} takes a number"))
        };
        match name {
            "idle_timeout" => {
                let secs = number()?;
                e.idle_timeout = (secs > 0).then(|| Duration::from_secs(secs));
            }
            "slab_chunk_max" => e.slab_chunk_max = Some(number()? << 10),
            "read_buf_mem_limit" => {
                let mb = number()?;
                e.read_buf_mem_limit = Some(if mb == 0 { u64::MAX } else { mb.saturating_mul(1 << 20) });
            }
            n if n.starts_with("ext_") || n.starts_with("ssl_") || n.starts_with("proxy") => {
                bail!("-o {opt}: not supported (netlane has no external storage, TLS or proxy)")
            }
            n if NO_EFFECT.contains(&n.strip_prefix("no_").unwrap_or(n)) => e.no_effect.push(opt.clone()),
            _ => bail!("-o {opt}: illegal suboption"),
        }
    }
    Ok(e)
}

/// memcached's `-u`: when running as root, become `user` (its group, and only that
/// group) once the sockets are open. As anyone else, nothing changes.
pub(super) fn drop_privileges(user: &str) -> Result<()> {
    use nix::unistd::{Uid, User, setgid, setgroups, setuid};
    if !Uid::effective().is_root() {
        return Ok(());
    }
    let u = User::from_name(user).with_context(|| format!("-u {user}: reading the user database"))?;
    let u = u.with_context(|| format!("-u {user}: no such user"))?;
    if u.uid.is_root() {
        return Ok(());
    }
    setgroups(&[u.gid]).with_context(|| format!("-u {user}: setgroups"))?;
    setgid(u.gid).with_context(|| format!("-u {user}: setgid"))?;
    setuid(u.uid).with_context(|| format!("-u {user}: setuid"))?;
    Ok(())
}

/// memcached's `MEMCACHED_PORT_FILENAME`: the ports served, as `TCP INET: <port>` lines,
/// written to `<file>.lck` and then renamed to `file` (so a reader never sees half).
pub(super) fn write_port_file(file: &std::path::Path, tcp: Option<SocketAddr>, udp: Option<SocketAddr>) -> Result<()> {
    let mut text = String::new();
    for (kind, addr) in [("TCP", tcp), ("UDP", udp)] {
        if let Some(a) = addr {
            text.push_str(&format!("{kind} {}: {}\n", if a.is_ipv4() { "INET" } else { "INET6" }, a.port()));
        }
    }
    let mut lck = file.as_os_str().to_owned();
    lck.push(".lck");
    std::fs::write(&lck, text).with_context(|| format!("writing {}", std::path::Path::new(&lck).display()))?;
    std::fs::rename(&lck, file).with_context(|| format!("renaming to {}", file.display()))
}

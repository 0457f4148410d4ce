//! Busy polling for a lane: the lane's epoll instance polls its NAPI instances itself
//! for a while before it sleeps (`EPIOCSPARAMS`, Linux 6.9: per epoll, instead of the
//! global `net.core.busy_poll` sysctl), and its sockets pledge that they will
//! (`SO_PREFER_BUSY_POLL`, 5.11), so that softirq processing yields to the lane under
//! load. Every knob is reported as applied, with the value read back, or refused, with
//! the kernel's reason: a caller never has to guess what ran.

use std::fmt;
use std::os::fd::BorrowedFd;
use std::str::FromStr;

use serde::Serialize;

/// A lane's busy-poll policy: `USECS[,BUDGET[,prefer]]` on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BusyPoll {
    /// How long one `epoll_wait` polls before sleeping, us.
    pub usecs: u32,
    /// Packets per poll (above 64 needs CAP_NET_ADMIN).
    pub budget: u16,
    /// Prefer busy polling over softirq processing (the sockets pledge it too).
    pub prefer: bool,
}

/// The kernel's default busy-poll budget (`BUSY_POLL_BUDGET`).
pub const DEFAULT_BUDGET: u16 = 8;
/// The longest poll accepted, us (the kernel takes up to `u32::MAX`; a lane polling
/// for more than a tenth of a second is a mistake).
pub const MAX_USECS: u32 = 100_000;

impl FromStr for BusyPoll {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| format!("busy poll {s:?}: {why} (expected USECS[,BUDGET[,prefer]], like 50,8,prefer)");
        let mut parts = s.split(',');
        let usecs: u32 = parts
            .next()
            .and_then(|u| u.trim().parse().ok())
            .filter(|u| (1..=MAX_USECS).contains(u))
            .ok_or_else(|| bad(&format!("microseconds must be 1..={MAX_USECS}")))?;
        let budget = match parts.next() {
            None => DEFAULT_BUDGET,
            Some(b) => b
                .trim()
                .parse::<u16>()
                .ok()
                .filter(|b| (1..=1024).contains(b))
                .ok_or_else(|| bad("budget must be 1..=1024"))?,
        };
        let prefer = match parts.next().map(str::trim) {
            None => false,
            Some("prefer") => true,
            Some(other) => return Err(bad(&format!("{other:?} is not \"prefer\""))),
        };
        if parts.next().is_some() {
            return Err(bad("too many fields"));
        }
        Ok(BusyPoll { usecs, budget, prefer })
    }
}

impl fmt::Display for BusyPoll {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{},{}", self.usecs, self.budget)?;
        if self.prefer {
            f.write_str(",prefer")?;
        }
        Ok(())
    }
}

/// How a knob fared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum KnobStatus {
    /// Written; `now` is what reading it back gave.
    Applied {
        /// The value read back.
        now: String,
    },
    /// The kernel refused it.
    Refused {
        /// Why.
        reason: String,
    },
}

/// One knob and how it fared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Knob {
    /// What it is (`EPIOCSPARAMS`, `SO_PREFER_BUSY_POLL`, `napi 258 defer-hard-irqs`...).
    pub name: String,
    /// The value asked for.
    pub wanted: String,
    /// What happened.
    #[serde(flatten)]
    pub status: KnobStatus,
}

impl Knob {
    /// Whether it took.
    pub fn applied(&self) -> bool {
        matches!(self.status, KnobStatus::Applied { .. })
    }

    /// A knob that took, reading back `now`.
    pub fn new_applied(name: impl Into<String>, wanted: impl Into<String>, now: impl Into<String>) -> Knob {
        Knob::applied_as(name, wanted, now)
    }

    /// A knob the kernel refused, and why.
    pub fn new_refused(name: impl Into<String>, wanted: impl Into<String>, reason: impl fmt::Display) -> Knob {
        Knob::refused(name, wanted, reason)
    }

    pub(crate) fn applied_as(name: impl Into<String>, wanted: impl Into<String>, now: impl Into<String>) -> Knob {
        Knob { name: name.into(), wanted: wanted.into(), status: KnobStatus::Applied { now: now.into() } }
    }

    pub(crate) fn refused(name: impl Into<String>, wanted: impl Into<String>, reason: impl fmt::Display) -> Knob {
        Knob { name: name.into(), wanted: wanted.into(), status: KnobStatus::Refused { reason: reason.to_string() } }
    }
}

impl fmt::Display for Knob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.status {
            KnobStatus::Applied { now } => write!(f, "{} = {} (applied, reads {now})", self.name, self.wanted),
            KnobStatus::Refused { reason } => write!(f, "{} = {} (refused: {reason})", self.name, self.wanted),
        }
    }
}

/// Sets `bp` on an epoll instance and reads it back (`EPIOCSPARAMS`/`EPIOCGPARAMS`).
pub fn apply_epoll(epfd: BorrowedFd<'_>, bp: &BusyPoll) -> Knob {
    let want = netlane_sys::epoll::EpollParams {
        busy_poll_usecs: bp.usecs,
        busy_poll_budget: bp.budget,
        prefer_busy_poll: u8::from(bp.prefer),
        pad: 0,
    };
    let name = "EPIOCSPARAMS";
    if let Err(e) = netlane_sys::epoll::set_params(epfd, &want) {
        let why = match e.raw_os_error() {
            Some(libc::ENOTTY) | Some(libc::EINVAL) if want.busy_poll_budget <= 64 => {
                format!("{e} (per-epoll busy polling needs Linux 6.9)")
            }
            Some(libc::EPERM) => format!("{e} (a budget above 64 needs CAP_NET_ADMIN)"),
            _ => e.to_string(),
        };
        return Knob::refused(name, bp.to_string(), why);
    }
    match netlane_sys::epoll::get_params(epfd) {
        Ok(p) if p == want => Knob::applied_as(name, bp.to_string(), bp.to_string()),
        Ok(p) => Knob::refused(
            name,
            bp.to_string(),
            format!(
                "reads back {},{}{}",
                p.busy_poll_usecs,
                p.busy_poll_budget,
                if p.prefer_busy_poll != 0 { ",prefer" } else { "" }
            ),
        ),
        Err(e) => Knob::refused(name, bp.to_string(), format!("set, but EPIOCGPARAMS failed: {e}")),
    }
}

/// Sets `bp` on a socket that its reader drives by busy polling (an AF_XDP socket, or a
/// UDP socket read without epoll's own polling): `SO_BUSY_POLL` (how long a receive call
/// on it polls) and, with `prefer`, `SO_PREFER_BUSY_POLL`, each read back; and
/// `SO_BUSY_POLL_BUDGET` when it is not the kernel's default, which Linux takes but has no
/// getsockopt for. `what` names the socket in each knob (`queue 0`). Raising the budget
/// and preferring busy polling need CAP_NET_ADMIN.
pub fn apply_socket_knobs(fd: BorrowedFd<'_>, bp: &BusyPoll, what: &str) -> Vec<Knob> {
    use netlane_sys::sockopt::get_int;
    let refused = |name: String, wanted: String, e: std::io::Error, eperm: &str| {
        let why = match e.raw_os_error() {
            Some(libc::EPERM) => format!("{e} ({eperm})"),
            Some(libc::ENOPROTOOPT) => format!("{e} (a kernel built without busy polling)"),
            _ => e.to_string(),
        };
        Knob::refused(name, wanted, why)
    };
    let read_back = |name: &str, opt, wanted: String, set: std::io::Result<()>, eperm: &str| {
        let name = format!("{what} {name}");
        match set.and_then(|()| get_int(fd, libc::SOL_SOCKET, opt).map(|v| v.to_string())) {
            Ok(now) if now == wanted => Knob::applied_as(name, wanted, now),
            Ok(now) => Knob::refused(name, wanted, format!("reads back {now}")),
            Err(e) => refused(name, wanted, e, eperm),
        }
    };
    let mut knobs = vec![read_back(
        "SO_BUSY_POLL",
        libc::SO_BUSY_POLL,
        bp.usecs.to_string(),
        crate::sockopt::set_busy_poll(fd, bp.usecs),
        "older kernels need CAP_NET_ADMIN to raise it",
    )];
    if bp.budget != DEFAULT_BUDGET {
        let name = format!("{what} SO_BUSY_POLL_BUDGET");
        knobs.push(match crate::sockopt::set_busy_poll_budget(fd, bp.budget) {
            Ok(()) => Knob::applied_as(name, bp.budget.to_string(), "set (Linux cannot read it back)"),
            Err(e) => refused(name, bp.budget.to_string(), e, "a budget above the default needs CAP_NET_ADMIN"),
        });
    }
    if bp.prefer {
        knobs.push(read_back(
            "SO_PREFER_BUSY_POLL",
            libc::SO_PREFER_BUSY_POLL,
            "1".into(),
            crate::sockopt::set_prefer_busy_poll(fd, true),
            "needs CAP_NET_ADMIN",
        ));
    }
    knobs
}

/// `BusyPollRxPackets` from a `net/netstat` text (its `TcpExt:` header and values lines).
fn netstat_busy_poll(text: &str) -> Option<u64> {
    let mut ext = text.lines().filter_map(|l| l.strip_prefix("TcpExt: "));
    let (names, values) = (ext.next()?, ext.next()?);
    let at = names.split_whitespace().position(|n| n == "BusyPollRxPackets")?;
    values.split_whitespace().nth(at)?.parse().ok()
}

/// Packets the kernel's NAPI instances handed over while a reader busy polled them, in
/// the calling thread's network namespace (`BusyPollRxPackets` of its `net/netstat`;
/// `None` when it cannot be read).
pub fn busy_poll_rx_packets() -> Option<u64> {
    // The thread's own view: /proc/net is the process's, whose first thread may be in
    // another namespace.
    netstat_busy_poll(&std::fs::read_to_string("/proc/thread-self/net/netstat").ok()?)
}

/// Sets `SO_PREFER_BUSY_POLL` (and `SO_BUSY_POLL_BUDGET`) on a socket of a lane with
/// `bp`. Per socket, so failures are counted by the caller rather than reported one by
/// one.
pub fn apply_socket(fd: BorrowedFd<'_>, bp: &BusyPoll) -> std::io::Result<()> {
    if bp.prefer {
        crate::sockopt::set_prefer_busy_poll(fd, true)?;
    }
    crate::sockopt::set_busy_poll_budget(fd, bp.budget)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busy_poll_count_is_read_from_its_column() {
        let text = "TcpExt: SyncookiesSent BusyPollRxPackets TCPAutoCorking\nTcpExt: 1 42 3\n\
                    IpExt: InNoRoutes BusyPollRxPackets\nIpExt: 7 9\n";
        assert_eq!(netstat_busy_poll(text), Some(42));
        assert_eq!(netstat_busy_poll("TcpExt: A B\nTcpExt: 1 2\n"), None);
        // This kernel has the counter (every kernel with busy polling, 3.11 on).
        assert!(busy_poll_rx_packets().is_some());
    }

    #[test]
    fn policies_parse_and_print_back() {
        let p: BusyPoll = "50".parse().unwrap();
        assert_eq!(p, BusyPoll { usecs: 50, budget: DEFAULT_BUDGET, prefer: false });
        let p: BusyPoll = "20,64,prefer".parse().unwrap();
        assert_eq!(p, BusyPoll { usecs: 20, budget: 64, prefer: true });
        for s in ["50,8", "20,64,prefer", "1,1"] {
            assert_eq!(s.parse::<BusyPoll>().unwrap().to_string(), s);
        }
    }

    #[test]
    fn bad_policies_say_what_is_wrong() {
        for (s, why) in [
            ("0", "microseconds"),
            ("x", "microseconds"),
            ("100001", "microseconds"),
            ("50,0", "budget"),
            ("50,2000", "budget"),
            ("50,8,fast", "\"fast\""),
            ("50,8,prefer,1", "too many"),
        ] {
            let e = s.parse::<BusyPoll>().unwrap_err();
            assert!(e.contains(why), "{s}: {e}");
        }
    }

    #[test]
    fn an_epoll_instance_takes_the_policy_and_reads_it_back() {
        let ep = nix::sys::epoll::Epoll::new(nix::sys::epoll::EpollCreateFlags::EPOLL_CLOEXEC).unwrap();
        let bp: BusyPoll = "25,16,prefer".parse().unwrap();
        let k = apply_epoll(std::os::fd::AsFd::as_fd(&ep.0), &bp);
        // This kernel (6.18) has EPIOCSPARAMS; an unprivileged budget of 16 is allowed.
        assert!(k.applied(), "{k}");
        assert_eq!(k.status, KnobStatus::Applied { now: "25,16,prefer".into() });
    }
}

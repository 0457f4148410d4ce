//! What a contender runs (the XDP_TX ceiling or a balancer) and reading its counters:
//! packets handled, fast-path hits, hint and connection-table hits, from the programs'
//! own per-CPU counters.

use std::os::fd::BorrowedFd;

use netlane_lb::{Lb, LbError, LbStats};
use netlane_sys::bpf::{HintMode, XdpTx};

use super::WarmUp;
use super::kernel;

/// Packets the balancer has handled: every packet ends in exactly one of these outcomes.
pub(super) fn packets_of(st: &LbStats) -> u64 {
    use netlane_sys::bpf::GlobalStat as G;
    [
        G::Tx,
        G::PassNonIp,
        G::PassNonVip,
        G::DropMalformed,
        G::DropIpOptions,
        G::DropFragment,
        G::DropNoReal,
        G::DropEncap,
        G::IcmpEcho,
        G::DropUnsupported,
    ]
    .iter()
    .map(|g| st.global.get(g.name()).copied().unwrap_or(0))
    .sum()
}

/// Packets that took the fast path so far (connection-table or hint hits).
pub(super) fn fast_path(st: &LbStats) -> u64 {
    st.global.get("conn_hit").copied().unwrap_or(0) + st.global.get("hint_hit").copied().unwrap_or(0)
}

/// What a contender runs.
pub(super) enum Program {
    XdpTx(XdpTx),
    /// The balancer (detached between turns), its counters before the turns, and how
    /// its warm-up went.
    Balancer(Box<Lb>, LbStats, WarmUp),
}

/// The counter of a balancer's hints that did what its mode is there for: every hint
/// used, or for destination tags that skip the transport header, those that did (a
/// variant that always fell back to the checked path must not pass as itself).
pub(super) fn hint_counter(hint: HintMode) -> &'static str {
    if hint == HintMode::DestTagDirect { "hint_direct" } else { "hint_hit" }
}

impl Program {
    /// A balancer's hint hits ([`hint_counter`]), connection-table hits and packets so
    /// far.
    pub(super) fn counts(&self) -> Result<Option<[u64; 3]>, LbError> {
        match self {
            Program::XdpTx(_) => Ok(None),
            Program::Balancer(lb, ..) => {
                let st = lb.stats()?;
                let get = |k: &str| st.global.get(k).copied().unwrap_or(0);
                Ok(Some([get(hint_counter(lb.options().hint)), get("conn_hit"), packets_of(&st)]))
            }
        }
    }

    /// Packets the program has handled so far, from its own per-CPU counters (they
    /// count with run-time statistics off).
    pub(super) fn packets(&self) -> Result<u64, LbError> {
        match self {
            Program::XdpTx(p) => p.stats().map(|(tx, drop)| tx + drop).map_err(kernel("read xdp_tx's counters")),
            Program::Balancer(lb, ..) => Ok(packets_of(&lb.stats()?)),
        }
    }

    pub(super) fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Program::XdpTx(p) => p.program_fd(),
            Program::Balancer(lb, ..) => lb.balancer().program_fd(),
        }
    }
}

//! Where a bulk run's two ends run: loopback, the two namespaces of a veth pair, or two
//! hosts of a testbed; and the machines' CPU around a run.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlane::metrics::{SystemCpu, SystemCpuDelta};
use netlane::topology::{Netns, TwoHosts};

use super::{BulkError, io_err};
use crate::host::{Host, ThisMachine};

/// Where the two ends run.
#[derive(Clone, Copy)]
pub enum Endpoints<'a> {
    /// Both on loopback in the current namespace (no root needed).
    Loopback,
    /// Sender in `hosts.tx`, receiver in `hosts.rx`, across their veth pair.
    Veth(&'a TwoHosts),
    /// Sender on `tx`, receiver on `rx` at `rx_addr` (a testbed's machines): each end a
    /// process, the machine CPU both hosts' together (once when they are one machine).
    Hosts {
        /// The sender's host.
        tx: &'a dyn Host,
        /// The receiver's host.
        rx: &'a dyn Host,
        /// The receiver's address.
        rx_addr: IpAddr,
        /// The path's MTU, when known.
        mtu: Option<u32>,
        /// The two hosts are one machine (their CPU is counted once).
        one_machine: bool,
    },
}

impl std::fmt::Debug for Endpoints<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoints::Loopback => f.write_str("Loopback"),
            Endpoints::Veth(h) => f.debug_tuple("Veth").field(h).finish(),
            Endpoints::Hosts { tx, rx, rx_addr, mtu, one_machine } => f
                .debug_struct("Hosts")
                .field("tx", &tx.name())
                .field("rx", &rx.name())
                .field("rx_addr", rx_addr)
                .field("mtu", mtu)
                .field("one_machine", one_machine)
                .finish(),
        }
    }
}

impl Endpoints<'_> {
    /// The namespaces of this machine the ends' threads run in (none: this one's own);
    /// another machine's ends are processes only.
    pub(super) fn namespaces(&self) -> Result<(Option<&Netns>, Option<&Netns>), BulkError> {
        match self {
            Endpoints::Loopback => Ok((None, None)),
            Endpoints::Veth(h) => Ok((Some(&h.tx), Some(&h.rx))),
            Endpoints::Hosts { .. } => {
                Err(BulkError::Config("on other machines each end runs as a process, not a thread".into()))
            }
        }
    }

    pub(super) fn tx_host(&self) -> &dyn Host {
        match self {
            Endpoints::Loopback => &ThisMachine,
            Endpoints::Veth(h) => &h.tx,
            Endpoints::Hosts { tx, .. } => *tx,
        }
    }

    pub(super) fn rx_host(&self) -> &dyn Host {
        match self {
            Endpoints::Loopback => &ThisMachine,
            Endpoints::Veth(h) => &h.rx,
            Endpoints::Hosts { rx, .. } => *rx,
        }
    }

    /// The receiver's address.
    pub fn rx_addr(&self, ipv6: bool) -> IpAddr {
        match self {
            Endpoints::Loopback if ipv6 => Ipv6Addr::LOCALHOST.into(),
            Endpoints::Loopback => Ipv4Addr::LOCALHOST.into(),
            Endpoints::Veth(h) => h.rx_addr(ipv6),
            Endpoints::Hosts { rx_addr, .. } => *rx_addr,
        }
    }

    /// The path's MTU, when known.
    pub(super) fn mtu(&self) -> Option<u32> {
        match self {
            Endpoints::Veth(h) => Some(h.config.mtu),
            Endpoints::Hosts { mtu, .. } => *mtu,
            Endpoints::Loopback => None,
        }
    }

    /// Whether `a` and `b` are one machine (namespaces of it, as in tests): the same
    /// boot id.
    pub fn one_machine(a: &dyn Host, b: &dyn Host) -> bool {
        let boot = |h: &dyn Host| h.read_file("/proc/sys/kernel/random/boot_id").ok();
        boot(a).is_some_and(|id| Some(id) == boot(b))
    }

    /// The machines' CPU counters now: this machine's, or both hosts' (once when they
    /// are one machine).
    pub(super) fn machine_cpu(&self) -> Result<Vec<SystemCpu>, BulkError> {
        let Endpoints::Hosts { tx, rx, one_machine, .. } = self else {
            return Ok(vec![SystemCpu::read().map_err(io_err("read /proc/stat"))?]);
        };
        let hosts: &[&dyn Host] = if *one_machine { &[*tx] } else { &[*tx, *rx] };
        hosts
            .iter()
            .map(|h| {
                let text = h.read_file("/proc/stat").map_err(|e| BulkError::Config(format!("{e:#}")))?;
                SystemCpu::parse(&text)
                    .map(|c| crate::host::stamped(*h, c))
                    .ok_or_else(|| BulkError::Config(format!("/proc/stat on {} is not as expected", h.name())))
            })
            .collect()
    }
}

impl Endpoints<'_> {
    /// The counters of the receiver's CPU `cpu` now (on the receiver's host), where the
    /// receiver is pinned to one.
    pub(super) fn receiving_cpu(&self, cpu: Option<usize>) -> Result<Option<SystemCpu>, BulkError> {
        let Some(cpu) = cpu else { return Ok(None) };
        let h = self.rx_host();
        let text = h.read_file("/proc/stat").map_err(|e| BulkError::Config(format!("{e:#}")))?;
        SystemCpu::parse_cpu(&text, cpu)
            .map(|c| Some(crate::host::stamped(h, c)))
            .ok_or_else(|| BulkError::Config(format!("/proc/stat on {} has no cpu{cpu} line", h.name())))
    }
}

/// The machines' CPU from `before` to `after` ([`Endpoints::machine_cpu`]), summed.
pub(super) fn machine_delta(before: &[SystemCpu], after: &[SystemCpu]) -> SystemCpuDelta {
    before.iter().zip(after).map(|(a, b)| a.delta(b)).fold(SystemCpuDelta::default(), |t, d| t.plus(&d))
}

//! The NIC's part of the hints, and the interfaces it works on: a [`Classifier`] marks a
//! flow's packets with its tag (a NIC's flow steering table; on veth, [`TcClassifier`],
//! a TCX egress program on the link into the balancer), and the interface lookups the
//! driver and the command line share.

use std::io;

use netlane::topology::{Rtnl, run_in_named};
use netlane_sys::bpf::{FlowKey, FlowTagger, TcxLink};

use crate::driver::{LbError, kernel};

/// Turns a flow into marked packets: the NIC's flow steering table.
pub trait Classifier {
    /// Marks `flow`'s packets with `hint` from now on.
    fn install(&mut self, flow: &FlowKey, hint: u32) -> io::Result<()>;
    /// Stops marking `flow`'s packets.
    fn remove(&mut self, flow: &FlowKey) -> io::Result<()>;
}

/// The classifier emulated on veth: a TCX egress program on the interface that sends to
/// the balancer sets the packet hash, which veth passes to XDP as the RX hash.
#[derive(Debug)]
pub struct TcClassifier {
    tagger: FlowTagger,
    _link: TcxLink,
}

impl TcClassifier {
    /// Loads the program with room for `max_rules` rules and attaches it to egress of
    /// `iface`, in namespace `netns` (a name under /run/netns) or the caller's.
    pub fn attach(netns: Option<&str>, iface: &str, max_rules: u32) -> Result<TcClassifier, LbError> {
        let tagger = FlowTagger::load(max_rules).map_err(kernel("load the flow classifier program"))?;
        let attach = || -> Result<TcxLink, LbError> {
            let ifindex = if_index(iface)?;
            tagger.attach_egress(ifindex).map_err(kernel(format!("attach the flow classifier to {iface} egress (TCX)")))
        };
        let link = match netns {
            Some(ns) => run_in_named(ns, attach)??,
            None => attach()?,
        };
        Ok(TcClassifier { tagger, _link: link })
    }

    /// (packets tagged, packets seen) by the program.
    pub fn counters(&self) -> io::Result<(u64, u64)> {
        self.tagger.stats()
    }
}

impl Classifier for TcClassifier {
    fn install(&mut self, flow: &FlowKey, hint: u32) -> io::Result<()> {
        self.tagger.set_rule(flow, hint)
    }

    fn remove(&mut self, flow: &FlowKey) -> io::Result<()> {
        self.tagger.remove_rule(flow)
    }
}

/// The interface index of `name` in the calling thread's namespace.
pub fn if_index(name: &str) -> Result<u32, LbError> {
    let mut r = Rtnl::open().map_err(kernel("open rtnetlink"))?;
    r.link_index(name).map_err(|e| LbError::Topology(e.into()))
}

/// The MAC address of `name` in the calling thread's namespace.
pub fn if_mac(name: &str) -> Result<[u8; 6], LbError> {
    let mut r = Rtnl::open().map_err(kernel("open rtnetlink"))?;
    let i = r.link_index(name).map_err(|e| LbError::Topology(e.into()))?;
    let mac = r.link_mac(i).map_err(|e| LbError::Topology(e.into()))?;
    mac.try_into().map_err(|_| LbError::Invalid(format!("{name} has no Ethernet address")))
}

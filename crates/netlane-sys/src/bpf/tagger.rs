//! The NIC flow classifier, emulated on veth (`bpf/lb/flow_tagger.bpf.c`): rules
//! {flow -> tag} that a TCX egress program applies by setting the packet hash, which
//! the balancer's device-bound build reads as the RX hash.

use std::io;
use std::os::fd::AsFd;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags};

use super::{FlowKey, TcxLink, flow_tagger_skel, object_storage, percpu_sum, to_io};

/// The classifier program, loaded (not yet attached).
pub struct FlowTagger {
    skel: flow_tagger_skel::FlowTaggerSkel<'static>,
}

impl std::fmt::Debug for FlowTagger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlowTagger").finish_non_exhaustive()
    }
}

impl FlowTagger {
    /// Loads the program with room for `max_rules` rules.
    pub fn load(max_rules: u32) -> io::Result<FlowTagger> {
        if max_rules == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "the classifier needs room for at least one rule"));
        }
        let mut open = flow_tagger_skel::FlowTaggerSkelBuilder::default().open(object_storage()).map_err(to_io)?;
        open.maps.tag_rules.set_max_entries(max_rules).map_err(to_io)?;
        Ok(FlowTagger { skel: open.load().map_err(to_io)? })
    }

    /// Attaches it to egress of interface `ifindex` (in the caller's namespace).
    pub fn attach_egress(&self, ifindex: u32) -> io::Result<TcxLink> {
        TcxLink::attach_egress(self.skel.progs.flow_tagger.as_fd(), ifindex)
    }

    /// Adds or replaces the rule for `flow`.
    pub fn set_rule(&self, flow: &FlowKey, tag: u32) -> io::Result<()> {
        self.skel.maps.tag_rules.update(&flow.to_bytes(), &tag.to_ne_bytes(), MapFlags::ANY).map_err(to_io)
    }

    /// Removes the rule for `flow`, if any.
    pub fn remove_rule(&self, flow: &FlowKey) -> io::Result<()> {
        match self.skel.maps.tag_rules.delete(&flow.to_bytes()) {
            Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(()),
            r => r.map_err(to_io),
        }
    }

    /// (packets tagged, packets seen) so far.
    pub fn stats(&self) -> io::Result<(u64, u64)> {
        let m = &self.skel.maps.tagger_stats;
        Ok((percpu_sum(m, 0)?, percpu_sum(m, 1)?))
    }
}

//! Queue groups: an application's traffic (its destination address and port) steered
//! into the receive queues its lanes own, the talk's flower `hw_tc` rule. With a NIC the
//! rule lives in the NIC; with a veth the receive queue of a packet is the transmit
//! queue it left the other end by, so the rule is a TCX program on that end
//! (`bpf/lanes/queue_steer.bpf.c`) that picks each new flow's queue in its group by the
//! flow's hash. Installed in the calling thread's namespace; detached on drop.

use std::net::SocketAddr;

use netlane_sys::bpf::{QueueSteer, STEER_MAX_RULES, TcxLink};

pub use netlane_sys::bpf::SteerProto;

use super::apps::AppError;

/// One rule: flows to `dst` over `proto` land on queues `first .. first + count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupRule {
    /// The application's address and port.
    pub dst: SocketAddr,
    /// TCP or UDP.
    pub proto: SteerProto,
    /// First queue of the group.
    pub first: u32,
    /// Queues in the group.
    pub count: u32,
}

/// The steering program attached to the wire side of a device, with its rules.
#[derive(Debug)]
pub struct QueueGroups {
    steer: QueueSteer,
    queues: u32,
    rules: Vec<GroupRule>,
    _link: TcxLink,
}

impl QueueGroups {
    /// Attaches the program to egress of `ifindex` (the end facing the server, in the
    /// calling thread's namespace), whose peer has `queues` receive queues.
    pub fn install(ifindex: u32, queues: u32) -> Result<QueueGroups, AppError> {
        if queues == 0 {
            return Err(AppError::Invalid("a device without receive queues has no queue groups".into()));
        }
        let io = |what: &'static str| move |source| AppError::Io(crate::error::IoError::new(what, source));
        let steer = QueueSteer::load().map_err(io("load the queue steering program"))?;
        let link = steer.attach_egress(ifindex).map_err(io("attach the queue steering program"))?;
        Ok(QueueGroups { steer, queues, rules: Vec::new(), _link: link })
    }

    /// Adds (or replaces) a rule; the group must lie within the device's queues.
    pub fn add(&mut self, rule: GroupRule) -> Result<(), AppError> {
        let end = rule.first.checked_add(rule.count);
        if rule.count == 0 || end.is_none_or(|e| e > self.queues) {
            return Err(AppError::Invalid(format!(
                "queue group {}..{} for {}: the device has queues 0..{}",
                rule.first,
                rule.first.saturating_add(rule.count),
                rule.dst,
                self.queues
            )));
        }
        let replaces = self.rules.iter().position(|r| r.dst == rule.dst && r.proto == rule.proto);
        if replaces.is_none() && self.rules.len() >= STEER_MAX_RULES {
            return Err(AppError::Invalid(format!("at most {STEER_MAX_RULES} queue group rules")));
        }
        self.steer.set(rule.dst, rule.proto, rule.first, rule.count).map_err(|source| {
            AppError::Io(crate::error::IoError::new(format!("add the queue group rule for {}", rule.dst), source))
        })?;
        match replaces {
            Some(i) => self.rules[i] = rule,
            None => self.rules.push(rule),
        }
        Ok(())
    }

    /// Removes the rule for `dst` (new flows go where the kernel's hash sends them).
    pub fn remove(&mut self, dst: SocketAddr, proto: SteerProto) -> Result<(), AppError> {
        self.steer
            .remove(dst, proto)
            .map_err(|source| AppError::Io(crate::error::IoError::new(format!("remove the rule for {dst}"), source)))?;
        self.rules.retain(|r| !(r.dst == dst && r.proto == proto));
        Ok(())
    }

    /// The rules.
    pub fn rules(&self) -> &[GroupRule] {
        &self.rules
    }

    /// (packets given a queue, packets left alone).
    pub fn counts(&self) -> Result<(u64, u64), AppError> {
        self.steer
            .counts()
            .map_err(|source| AppError::Io(crate::error::IoError::new("read the steering counters", source)))
    }
}

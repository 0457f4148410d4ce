//! The driver: loads the data plane (`crates/netlane-sys/bpf/lb/balancer.bpf.c`),
//! attaches it, applies configurations live, turns new-flow events into classifier
//! tags, and reports statistics as JSON and in Prometheus text format.
//!
//! The decisions live in sans-IO code: `crate::proto::plane` says which map writes a
//! configuration change needs and in which order; this module only carries them out.
//!
//! # Hints
//! With [`HintMode::RxHash`] the data plane keeps a per-CPU flow cache indexed by the
//! packet's RX hash. With the tag modes it reports every new flow; the driver gives the
//! flow a tag and asks a [`Classifier`] (the NIC's flow steering; on veth the TCX
//! emulation in [`TcClassifier`]) to mark that flow's packets with it. Tags are only
//! hints: the data plane checks each against the packet and the VIP's live reals.
use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::AsFd;
use std::time::Duration;

use crate::proto::config::{Config, ConfigError, VipChange};
use crate::proto::plane::{ControlPlane, Op, PlanError, TagTable, Update};
use netlane_sys::bpf::{Balancer, BalancerOptions, BalancerSizes, DataPlaneConfig, FlowEvents, RealWrite, TAG_VALUES};
pub use netlane_sys::bpf::{Decap, FlowEvent, FlowKey, HintMode, XdpLink, XdpMode};

pub use crate::stats::{LbStats, RealStats, TagStats, VipStats, render_prometheus};

use netlane::serve::Stop;
use netlane::topology::TopologyError;

pub use crate::classifier::{Classifier, TcClassifier, if_index, if_mac};

/// Why the balancer could not start or change.
#[derive(Debug, thiserror::Error)]
pub enum LbError {
    /// The configuration is invalid.
    #[error("configuration")]
    Config(#[from] ConfigError),
    /// The configuration cannot be applied to the running data plane.
    #[error("configuration")]
    Plan(#[from] PlanError),
    /// Bad options.
    #[error("{0}")]
    Invalid(String),
    /// A kernel operation failed.
    #[error(transparent)]
    Kernel(#[from] netlane::error::IoError),
    /// A file (the configuration) could not be read.
    #[error(transparent)]
    File(#[from] netlane::files::ReadTextError),
    /// A namespace or interface problem.
    #[error(transparent)]
    Topology(#[from] TopologyError),
    /// The maps and the control plane's view need more memory than the machine has.
    #[error(transparent)]
    Memory(#[from] netlane::memory::MemoryError),
    /// This process lacks the capabilities loading and attaching the programs take.
    #[error(transparent)]
    Lacking(#[from] netlane::caps::Lacking),
}

/// Memory `lb run` takes per configured real at its peak: an edit being parsed beside
/// the running configuration, the plans' maps (the loop's and the watcher's), a
/// statistics page being written while the last one is served (`docs/results.md` has
/// the measurement).
pub const CONTROL_BYTES_PER_REAL: u64 = 4096;

pub(crate) fn kernel(what: impl Into<String>) -> impl FnOnce(io::Error) -> LbError {
    LbError::kernel(what)
}

impl LbError {
    /// Wraps a kernel error with what was being done (for `map_err`).
    pub fn kernel(what: impl Into<String>) -> impl FnOnce(io::Error) -> LbError {
        let what = what.into();
        move |source| LbError::Kernel(netlane::error::IoError::new(what, source))
    }
}

/// Where hints come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HintSource {
    /// The NIC's RX hash through the metadata kfunc (device-bound build, native only).
    Kfunc,
    /// 4 bytes of XDP metadata in front of the frame (plain build; what a generator
    /// or an earlier program writes).
    Metadata,
}

/// How to run the balancer.
#[derive(Debug, Clone)]
pub struct LbOptions {
    /// Interface to attach to, in the calling thread's network namespace (a
    /// device-bound program is bound to the interface of that name there).
    pub iface: String,
    /// Next hop towards the reals.
    pub gw_mac: [u8; 6],
    /// Outer IPv4 source base (low 16 bits vary by flow).
    pub src4: Ipv4Addr,
    /// Outer IPv6 source base (last 32 bits vary by flow).
    pub src6: Ipv6Addr,
    /// What hints are used for.
    pub hint: HintMode,
    /// Where they come from.
    pub hint_source: HintSource,
    /// Attach in generic mode even if native works.
    pub force_generic: bool,
    /// VIPs the data plane has room for.
    pub max_vips: u32,
    /// Reals the data plane has room for.
    pub max_reals: u32,
    /// Per-flow tags (and classifier rules) at most.
    pub max_tags: u32,
    /// Slots of each CPU's rx-hash flow cache (a power of two).
    pub hint_cache: u32,
    /// Bytes of the new-flow event ring (a power of two): events for this many bytes /
    /// 64 new flows can wait to be read.
    pub event_ring_bytes: u32,
}

impl LbOptions {
    /// Defaults for `iface` and next hop `gw_mac`.
    pub fn new(iface: &str, gw_mac: [u8; 6]) -> LbOptions {
        LbOptions {
            iface: iface.to_string(),
            gw_mac,
            src4: Ipv4Addr::new(172, 16, 0, 0),
            src6: Ipv6Addr::new(0xfd00, 0x4c42, 0, 0, 0, 0, 0, 0),
            hint: HintMode::Off,
            hint_source: HintSource::Kfunc,
            force_generic: false,
            max_vips: 64,
            max_reals: 1024,
            max_tags: 65536,
            hint_cache: 65536,
            event_ring_bytes: 1 << 20,
        }
    }
}

/// A running balancer: detached and unloaded on drop.
pub struct Lb {
    // Field order is drop order: the attachment goes first.
    link: Option<XdpLink>,
    mode: XdpMode,
    classifier: Option<Box<dyn Classifier>>,
    // The new-flow event reader (tag modes), built once; before the balancer.
    events: Option<FlowEvents>,
    pub(crate) balancer: Balancer,
    pub(crate) plane: ControlPlane,
    // Writes of configurations that failed part way, to do again (with what they change).
    pending: Vec<Op>,
    pending_changes: Vec<VipChange>,
    // Reals cleared by writes done, whose tags go once the update is complete.
    cleared: std::collections::HashSet<u32>,
    pub(crate) tags: TagTable<FlowKey>,
    tagged_real: HashMap<FlowKey, u32>,
    pub(crate) tag_stats: TagStats,
    pub(crate) opts: LbOptions,
    native_error: Option<String>,
}

impl std::fmt::Debug for Lb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lb")
            .field("opts", &self.opts)
            .field("mode", &self.mode)
            .field("attached", &self.link.is_some())
            .finish_non_exhaustive()
    }
}

/// The data plane's map sizes for `config`.
fn sizes(config: &Config, opts: &LbOptions) -> BalancerSizes {
    let reals: usize = config.vips.iter().map(|v| v.reals.len()).sum();
    // Room for a reload's new reals beside the old ones.
    let max_reals = opts.max_reals.max(reals as u32 * 2);
    let mut sizes = BalancerSizes::new(opts.max_vips, max_reals, config.ring_size, config.conn_entries);
    sizes.flow_tags = opts.max_tags;
    sizes.hint_cache = opts.hint_cache;
    sizes.event_ring_bytes = opts.event_ring_bytes;
    sizes
}

/// The memory a balancer for `config` takes: its maps (allocated whole when loaded)
/// and the control plane for as many reals as a configuration may grow to.
pub fn memory_ask(config: &Config, opts: &LbOptions) -> Result<netlane::memory::Ask, LbError> {
    let reals: usize = config.vips.iter().map(|v| v.reals.len()).sum();
    let room = (reals as u64).max(u64::from(opts.max_reals.min(crate::proto::config::MAX_REALS_TOTAL)));
    let maps = sizes(config, opts).kernel_bytes().map_err(kernel("count the CPUs"))?;
    Ok(maps
        .into_iter()
        .fold(netlane::memory::Ask::new(), |ask, (what, bytes)| ask.add(format!("{what} map"), bytes))
        .add(format!("control plane for {room} reals"), room * CONTROL_BYTES_PER_REAL))
}

/// The next hop's MAC and the outer source addresses must be ones a packet can carry.
fn check_addresses(opts: &LbOptions) -> Result<(), LbError> {
    let m = opts.gw_mac;
    if m == [0; 6] || m[0] & 1 == 1 {
        return Err(LbError::Invalid(format!(
            "gateway MAC {}: a next hop is one unicast station (not zero, broadcast or multicast)",
            m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
        )));
    }
    let s4 = opts.src4;
    if s4.is_unspecified() || s4.is_loopback() || s4.is_multicast() || s4.is_broadcast() {
        return Err(LbError::Invalid(format!(
            "outer IPv4 source {s4}: must be a unicast address the reals can answer"
        )));
    }
    let s6 = opts.src6;
    if s6.is_unspecified() || s6.is_loopback() || s6.is_multicast() {
        return Err(LbError::Invalid(format!(
            "outer IPv6 source {s6}: must be a unicast address the reals can answer"
        )));
    }
    Ok(())
}

impl Lb {
    /// Loads the data plane sized for `config`, applies it and attaches to the
    /// interface: native mode, else generic (see [`Lb::native_error`]).
    pub fn start(config: &Config, opts: LbOptions) -> Result<Lb, LbError> {
        config.validate()?;
        if opts.max_tags == 0 || opts.max_tags > TAG_VALUES {
            return Err(LbError::Invalid(format!("max tags must be 1..={TAG_VALUES}, not {}", opts.max_tags)));
        }
        check_addresses(&opts)?;
        use netlane::caps::Cap;
        netlane::caps::require("the XDP load balancer", &[Cap::Bpf, Cap::NetAdmin])?;
        let reals: usize = config.vips.iter().map(|v| v.reals.len()).sum();
        if (opts.max_vips as usize) < config.vips.len() || (opts.max_reals as usize) < reals {
            return Err(LbError::Invalid(format!(
                "the configuration has {} VIPs and {reals} reals; room for {} and {} (`max_vips`, `max_reals`) is too little",
                config.vips.len(),
                opts.max_vips,
                opts.max_reals
            )));
        }
        let slots = u64::from(opts.max_vips) * u64::from(config.ring_size);
        if slots > crate::proto::config::MAX_RING_SLOTS {
            return Err(LbError::Invalid(format!(
                "`max_vips` {} x ring_size {} = {slots} ring slots ({} MiB); at most {}: lower `max_vips` or ring_size",
                opts.max_vips,
                config.ring_size,
                (slots * 4) >> 20,
                crate::proto::config::MAX_RING_SLOTS
            )));
        }
        let (ifindex, own_mac) = (if_index(&opts.iface)?, if_mac(&opts.iface)?);
        let bound = opts.hint != HintMode::Off && opts.hint_source == HintSource::Kfunc;
        if bound && opts.force_generic {
            return Err(LbError::Invalid(
                "RX-hash hints from the NIC need a device-bound program, which only attaches in native mode".into(),
            ));
        }
        let sizes = sizes(config, &opts);
        let (max_vips, max_reals) = (sizes.max_vips, sizes.max_reals);
        memory_ask(config, &opts)?.check()?;
        let balancer =
            Balancer::load(&BalancerOptions { sizes, hint: opts.hint, bind_ifindex: bound.then_some(ifindex) })
                .map_err(kernel(if bound {
                    format!("load the device-bound balancer for {}", opts.iface)
                } else {
                    "load the balancer".to_string()
                }))?;
        balancer
            .set_config(&DataPlaneConfig {
                gw_mac: opts.gw_mac,
                own_mac,
                src4: opts.src4,
                src6: opts.src6,
                max_new_conns_per_cpu: config.max_new_conns_per_cpu,
                udp_timeout_ms: config.udp_timeout_s.saturating_mul(1000),
            })
            .map_err(kernel("write the data plane's configuration"))?;
        let mut plane = ControlPlane::new(max_vips, max_reals);
        let update = plane.apply(config)?;
        execute(&balancer, &update.ops).1?;
        let events = match opts.hint {
            h if h.tags() => Some(balancer.events().map_err(kernel("open the new-flow event ring"))?),
            _ => None,
        };
        let prog = balancer.program_fd();
        let iface = &opts.iface;
        let (link, native_error) = if opts.force_generic {
            let l = XdpLink::attach(prog, ifindex, XdpMode::Generic);
            (l.map_err(kernel(format!("attach to {iface} (generic)")))?, None)
        } else if bound {
            let l = XdpLink::attach(prog, ifindex, XdpMode::Native);
            (l.map_err(kernel(format!("attach to {iface} (native; device-bound programs cannot be generic)")))?, None)
        } else {
            let (l, e) = XdpLink::attach_native_or_generic(prog, ifindex)
                .map_err(kernel(format!("attach to {iface} (native, then generic)")))?;
            (l, e.map(|e| e.to_string()))
        };
        Ok(Lb {
            mode: link.mode(),
            link: Some(link),
            classifier: None,
            events,
            balancer,
            plane,
            pending: Vec::new(),
            pending_changes: Vec::new(),
            cleared: std::collections::HashSet::new(),
            tags: TagTable::new(opts.max_tags),
            tagged_real: HashMap::new(),
            tag_stats: TagStats::default(),
            opts,
            native_error,
        })
    }

    /// Gives the balancer a classifier to install tags with (tag modes).
    pub fn set_classifier(&mut self, c: Box<dyn Classifier>) {
        self.classifier = Some(c);
    }

    /// The attach mode it got.
    pub fn mode(&self) -> XdpMode {
        self.mode
    }

    /// Detaches the program from the interface and keeps the data plane loaded with
    /// its state (connections, caches, tags): something else may run it now (see
    /// [`Balancer::program_fd`]), as the pps benchmark does to take turns.
    pub fn detach(&mut self) {
        self.link = None;
    }

    /// Why native mode failed, when it fell back to generic.
    pub fn native_error(&self) -> Option<&str> {
        self.native_error.as_deref()
    }

    /// The options it runs with.
    pub fn options(&self) -> &LbOptions {
        &self.opts
    }

    /// The loaded data plane.
    pub fn balancer(&self) -> &Balancer {
        &self.balancer
    }

    /// Applies a new configuration without a restart; returns what changed per VIP.
    /// Connections keep their real unless it was removed. If writing the data plane
    /// fails part way, the writes are kept and done again by [`Lb::retry`].
    pub fn apply(&mut self, config: &Config) -> Result<Vec<VipChange>, LbError> {
        config.validate()?;
        let (update, next) = self.plane.plan(config)?;
        self.commit(update, next)
    }

    /// The control plane's view of the data plane, to plan the next configuration from
    /// (on another thread: [`ControlPlane::plan`] then [`Lb::commit`]).
    pub fn plane(&self) -> &ControlPlane {
        &self.plane
    }

    /// Carries out an update planned from this balancer's view ([`Lb::plane`]), which
    /// `next` replaces. The writes of an earlier update that failed come first: every
    /// write sets a whole value, so doing one again is harmless.
    pub fn commit(&mut self, update: Update, next: ControlPlane) -> Result<Vec<VipChange>, LbError> {
        self.plane = next;
        self.pending.extend(update.ops);
        self.pending_changes.extend(update.changes);
        self.flush()
    }

    /// Whether writes of a configuration are still to be done (an earlier write failed).
    pub fn unwritten(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Tries the writes of a configuration again after a failure; returns what the
    /// configuration changed once they are all done.
    pub fn retry(&mut self) -> Result<Vec<VipChange>, LbError> {
        self.flush()
    }

    fn flush(&mut self) -> Result<Vec<VipChange>, LbError> {
        // Writes that were done stay done: a retry resumes at the one that failed, so
        // the order (reals before rings, rings before clears) holds across retries.
        let (done, result) = execute(&self.balancer, &self.pending);
        self.cleared.extend(self.pending.drain(..done).filter_map(|o| match o {
            Op::ClearReal { index, .. } => Some(index),
            _ => None,
        }));
        result?;
        if !self.cleared.is_empty() {
            let cleared = std::mem::take(&mut self.cleared);
            let gone = self.tags.release_where(|k| self.tagged_real.get(k).is_some_and(|r| cleared.contains(r)));
            for (_, flow) in gone {
                self.tagged_real.remove(&flow);
                self.tag_stats.released += 1;
                if let Some(c) = self.classifier.as_mut() {
                    c.remove(&flow).map_err(kernel("remove a classifier rule"))?;
                }
            }
        }
        Ok(std::mem::take(&mut self.pending_changes))
    }

    /// Waits up to `timeout` for new-flow events and tags those flows (tag modes);
    /// returns how many events it handled.
    pub fn service_events(&mut self, timeout: Duration) -> Result<usize, LbError> {
        let Some(reader) = self.events.as_mut() else {
            std::thread::sleep(timeout);
            return Ok(0);
        };
        let events = reader.poll(timeout).map_err(kernel("read new-flow events"))?;
        self.tag_flows(&events)
    }

    /// [`Lb::service_events`] that ends its wait at once when `stop` is given.
    pub fn service_events_until(&mut self, timeout: Duration, stop: &Stop) -> Result<usize, LbError> {
        let Some(reader) = self.events.as_mut() else {
            stop.wait(timeout);
            return Ok(0);
        };
        let events = reader.poll_or_wake(timeout, stop.as_fd()).map_err(kernel("read new-flow events"))?;
        self.tag_flows(&events)
    }

    fn tag_flows(&mut self, events: &[FlowEvent]) -> Result<usize, LbError> {
        for e in events {
            self.tag_flow(e)?;
        }
        Ok(events.len())
    }

    /// Tags one new flow: a tag id (per-flow) or its real (per-destination).
    pub fn tag_flow(&mut self, e: &FlowEvent) -> Result<(), LbError> {
        // An event read after its real was removed (or its index reused): tagging it
        // would move the flow, or pin it to a real that is gone.
        if self.plane.real_generation(e.real) != Some(e.generation) {
            self.tag_stats.stale_events += 1;
            return Ok(());
        }
        let Some((id, evicted)) = self.tags.assign(e.flow) else { return Ok(()) };
        if let Some(old) = evicted {
            self.tagged_real.remove(&old);
            self.tag_stats.evicted += 1;
            if let Some(c) = self.classifier.as_mut() {
                c.remove(&old).map_err(kernel("remove a classifier rule"))?;
            }
        }
        let hint = if self.opts.hint.names_real() {
            self.balancer.tag_key().dest_tag(e.real)
        } else {
            self.balancer.set_flow_tag(id, e).map_err(kernel("install a flow tag"))?;
            self.balancer.tag_key().flow_tag(id)
        };
        self.tagged_real.insert(e.flow, e.real);
        self.tag_stats.installed += 1;
        if let Some(c) = self.classifier.as_mut() {
            c.install(&e.flow, hint).map_err(kernel("install a classifier rule"))?;
        }
        Ok(())
    }

    /// A snapshot of every counter.
    pub fn stats(&self) -> Result<LbStats, LbError> {
        crate::stats::collect(self)
    }
}

/// Carries out the plan's operations on the data plane, in order; a run of real
/// writes is one batch update (half a million reals in a few system calls). Returns how
/// many operations are done (a batch counts once it is written whole) and the error
/// that stopped it, if one did.
fn execute(b: &Balancer, ops: &[Op]) -> (usize, Result<(), LbError>) {
    let mut reals: Vec<RealWrite> = Vec::new();
    // Operations before `done` are written; a pending batch starts there.
    let mut done = 0;
    for (i, op) in ops.iter().enumerate() {
        let write = match *op {
            Op::SetReal { index, address, vip, generation } => Some(RealWrite::Set { index, address, vip, generation }),
            Op::ClearReal { index, generation } => Some(RealWrite::Clear { index, generation }),
            _ => None,
        };
        if let Some(w) = write {
            reals.push(w);
            continue;
        }
        if !reals.is_empty() {
            if let Err(e) = b.write_reals(&reals) {
                return (done, Err(kernel(format!("write {} reals", reals.len()))(e)));
            }
            reals.clear();
        }
        done = i;
        let r = match op {
            Op::SetVip { address, port, proto, index, no_lru } => b.set_vip(*address, *port, *proto, *index, *no_lru),
            Op::RemoveVip { address, port, proto } => b.remove_vip(*address, *port, *proto),
            Op::SetRing { vip, ring } => b.set_ring(*vip, ring),
            Op::PatchRing { vip, slots } => b.patch_ring(*vip, slots),
            Op::VipAddress { address, present } => b.set_vip_address(*address, *present),
            Op::SetReal { .. } | Op::ClearReal { .. } => Ok(()),
        };
        if let Err(e) = r {
            return (done, Err(kernel(format!("update the data plane ({})", op_name(op)))(e)));
        }
        done = i + 1;
    }
    if !reals.is_empty()
        && let Err(e) = b.write_reals(&reals)
    {
        return (done, Err(kernel(format!("write {} reals", reals.len()))(e)));
    }
    (ops.len(), Ok(()))
}

/// An operation in a few words (a ring's slots are not worth quoting).
fn op_name(op: &Op) -> String {
    match op {
        Op::SetVip { address, port, index, .. } => format!("publish VIP {address}:{port} at index {index}"),
        Op::RemoveVip { address, port, .. } => format!("remove VIP {address}:{port}"),
        Op::SetRing { vip, ring } => format!("write ring {vip}, {} slots", ring.len()),
        Op::PatchRing { vip, slots } => format!("write {} slots of ring {vip}", slots.len()),
        Op::VipAddress { address, present } => format!("mark {address} as a VIP address: {present}"),
        Op::SetReal { index, .. } | Op::ClearReal { index, .. } => format!("write real {index}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlane::memory::{Available, Limit};

    #[test]
    fn the_memory_asked_counts_the_maps_and_the_reals_a_configuration_may_grow_to() {
        let config = Config::parse(
            "conn_entries = 16777216\n[[vip]]\naddress = \"10.100.0.1\"\nproto = \"udp\"\n\
             [[vip.real]]\naddress = \"10.1.0.1\"\n",
        )
        .unwrap();
        let mut opts = LbOptions::new("lo", [2, 0, 0, 0, 0, 1]);
        let small = memory_ask(&config, &opts).unwrap().total();
        // 2^24 connection entries of a 40-byte key and value, with the kernel's share.
        assert!(small > 1 << 30, "{small}");
        let e = memory_ask(&config, &opts)
            .unwrap()
            .check_against(&Available { bytes: 1 << 30, limit: Limit::MemAvailable })
            .unwrap_err()
            .to_string();
        assert!(e.contains("connection table map: 2.0 GiB") && e.contains("(MemAvailable)"), "{e}");
        opts.max_reals = 1 << 19;
        let room = memory_ask(&config, &opts).unwrap().total() - small;
        assert!(room >= ((1 << 19) - 1024) * CONTROL_BYTES_PER_REAL, "{room}");
    }
}

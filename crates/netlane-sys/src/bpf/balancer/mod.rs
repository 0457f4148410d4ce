//! The load balancer's loader and map access (`bpf/lb/balancer.bpf.c`); the data
//! layout it shares with the C side is in [`layout`].
//!
//! Two builds of one program: the plain build reads hints from the XDP metadata area
//! and can be test-run; the device-bound build reads the NIC's RX hash through the
//! metadata kfunc and must be bound to its interface at load time. Both have the same
//! maps, which this module reaches through map handles so one `Balancer` serves both.

use std::collections::VecDeque;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, MapHandle};

use super::{balancer_bound_skel, balancer_skel, object_storage, percpu_sum, to_io};

mod layout;

pub use layout::*;
use layout::{BPF_F_XDP_DEV_BOUND_ONLY, addr_words, pod_bytes, pod_read};

/// The loaded object: plain or device-bound build (same maps, same program name).
enum Skel {
    Plain(Box<balancer_skel::BalancerSkel<'static>>),
    Bound(Box<balancer_bound_skel::BalancerBoundSkel<'static>>),
}

/// Handles on the object's maps (shared by both builds).
struct Maps {
    vip_map: MapHandle,
    vip_keys: MapHandle,
    vip_addrs: MapHandle,
    ring_map: MapHandle,
    reals: MapHandle,
    lb_cfg: MapHandle,
    global_stats: MapHandle,
    vip_stats: MapHandle,
    real_stats: MapHandle,
    flow_tags: MapHandle,
    flow_events: MapHandle,
}

/// Opens one build's skeleton, sizes its maps, sets its constants, loads it and takes
/// handles on its maps.
macro_rules! load_build {
    ($builder:expr, $opts:expr, $key:expr) => {{
        let opts: &BalancerOptions = $opts;
        let key: TagKey = $key;
        let s = &opts.sizes;
        let mut open = $builder.open(object_storage()).map_err(to_io)?;
        let m = &mut open.maps;
        m.vip_map.set_max_entries(s.max_vips).map_err(to_io)?;
        m.vip_keys.set_max_entries(s.max_vips).map_err(to_io)?;
        m.vip_addrs.set_max_entries(s.max_vips).map_err(to_io)?;
        m.vip_stats.set_max_entries(s.max_vips).map_err(to_io)?;
        m.ring_map.set_max_entries(s.max_vips * s.ring_size).map_err(to_io)?;
        m.reals.set_max_entries(s.max_reals).map_err(to_io)?;
        m.real_stats.set_max_entries(s.max_reals).map_err(to_io)?;
        m.conn_table.set_max_entries(s.conn_entries).map_err(to_io)?;
        m.flow_tags.set_max_entries(s.flow_tags).map_err(to_io)?;
        let cpus = libbpf_rs::num_possible_cpus().map_err(to_io)? as u32;
        let cache_entries = s.hint_cache.checked_mul(cpus).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} hint-cache slots x {cpus} CPUs overflows", s.hint_cache),
            )
        })?;
        m.hint_cache.set_max_entries(cache_entries).map_err(to_io)?;
        m.flow_events.set_max_entries(s.event_ring_bytes).map_err(to_io)?;
        let ro = m.rodata_data.as_deref_mut().ok_or_else(|| io::Error::other("balancer object has no .rodata"))?;
        ro.ring_size = s.ring_size;
        ro.hint_mode = opts.hint.code();
        ro.tag_direct = u32::from(opts.hint == HintMode::DestTagDirect);
        ro.hint_cache_mask = s.hint_cache - 1;
        ro.hint_cache_cpus = cpus;
        ro.flow_tag_count = s.flow_tags;
        ro.tag_key = key.raw();
        if let Some(ifindex) = opts.bind_ifindex {
            open.progs.balancer.set_ifindex(ifindex);
            open.progs.balancer.set_flags(BPF_F_XDP_DEV_BOUND_ONLY);
        }
        let skel = open.load().map_err(to_io)?;
        let maps = Maps {
            vip_map: MapHandle::try_from(&skel.maps.vip_map).map_err(to_io)?,
            vip_keys: MapHandle::try_from(&skel.maps.vip_keys).map_err(to_io)?,
            vip_addrs: MapHandle::try_from(&skel.maps.vip_addrs).map_err(to_io)?,
            ring_map: MapHandle::try_from(&skel.maps.ring_map).map_err(to_io)?,
            reals: MapHandle::try_from(&skel.maps.reals).map_err(to_io)?,
            lb_cfg: MapHandle::try_from(&skel.maps.lb_cfg).map_err(to_io)?,
            global_stats: MapHandle::try_from(&skel.maps.global_stats).map_err(to_io)?,
            vip_stats: MapHandle::try_from(&skel.maps.vip_stats).map_err(to_io)?,
            real_stats: MapHandle::try_from(&skel.maps.real_stats).map_err(to_io)?,
            flow_tags: MapHandle::try_from(&skel.maps.flow_tags).map_err(to_io)?,
            flow_events: MapHandle::try_from(&skel.maps.flow_events).map_err(to_io)?,
        };
        (Box::new(skel), maps)
    }};
}

/// The balancer program, loaded, with its maps.
pub struct Balancer {
    skel: Skel,
    maps: Maps,
    opts: BalancerOptions,
    tag_key: TagKey,
}

impl std::fmt::Debug for Balancer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Balancer").field("opts", &self.opts).finish_non_exhaustive()
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

impl Balancer {
    /// Opens the build `opts` asks for, sizes its maps, sets its constants and loads
    /// it; every ring slot starts empty.
    pub fn load(opts: &BalancerOptions) -> io::Result<Balancer> {
        opts.sizes.check()?;
        Self::load_build(opts).map_err(|e| explain_load_error(e, opts))
    }

    fn load_build(opts: &BalancerOptions) -> io::Result<Balancer> {
        let tag_key = TagKey::random()?;
        let (skel, maps) = match opts.bind_ifindex {
            None => {
                let (s, m) = load_build!(balancer_skel::BalancerSkelBuilder::default(), opts, tag_key);
                (Skel::Plain(s), m)
            }
            Some(_) => {
                let (s, m) = load_build!(balancer_bound_skel::BalancerBoundSkelBuilder::default(), opts, tag_key);
                (Skel::Bound(s), m)
            }
        };
        // The ring map starts zeroed, which is empty (slots hold index + 1): no VIP's
        // ring needs writing before it is used.
        Ok(Balancer { skel, maps, opts: *opts, tag_key })
    }

    /// The key this balancer's tags are checked with (random at each load): what the
    /// classifier's tag values are computed from.
    pub fn tag_key(&self) -> TagKey {
        self.tag_key
    }

    /// The program, for test runs (the plain build only: the kernel refuses to
    /// test-run device-bound programs).
    pub fn program(&self) -> io::Result<&libbpf_rs::ProgramMut<'static>> {
        match &self.skel {
            Skel::Plain(s) => Ok(&s.progs.balancer),
            Skel::Bound(_) => Err(invalid("a device-bound program cannot be test-run".into())),
        }
    }

    /// The program's fd (to attach it).
    pub fn program_fd(&self) -> BorrowedFd<'_> {
        match &self.skel {
            Skel::Plain(s) => s.progs.balancer.as_fd(),
            Skel::Bound(s) => s.progs.balancer.as_fd(),
        }
    }

    /// How it was loaded.
    pub fn options(&self) -> BalancerOptions {
        self.opts
    }

    /// Sets the outer addresses and limits.
    pub fn set_config(&self, c: &DataPlaneConfig) -> io::Result<()> {
        let cfg = balancer_skel::types::lb_config {
            gw_mac: c.gw_mac,
            own_mac: c.own_mac,
            src4: addr_words(c.src4.into()).0[0],
            src6: addr_words(c.src6.into()).0,
            max_new_conns: c.max_new_conns_per_cpu,
            udp_timeout_ms: c.udp_timeout_ms,
        };
        self.maps.lb_cfg.update(&0u32.to_ne_bytes(), pod_bytes(&cfg), MapFlags::ANY).map_err(to_io)
    }

    fn vip_key(addr: IpAddr, port: u16, proto: u8) -> balancer_skel::types::vip_key {
        let (w, family) = addr_words(addr);
        balancer_skel::types::vip_key { addr: w, port: u16::from_ne_bytes(port.to_be_bytes()), proto, family }
    }

    /// Adds or updates a VIP (port 0 = any port) using ring `index`; `no_lru` makes
    /// it stateless (pure consistent hashing).
    pub fn set_vip(&self, addr: IpAddr, port: u16, proto: u8, index: u32, no_lru: bool) -> io::Result<()> {
        if index >= self.opts.sizes.max_vips {
            return Err(invalid(format!("VIP index {index} >= {}", self.opts.sizes.max_vips)));
        }
        let key = Self::vip_key(addr, port, proto);
        let meta = balancer_skel::types::vip_meta { index, flags: u32::from(no_lru) };
        // Published first, then its key by index: the fast destination-tag check must
        // never know a VIP that a lookup does not find yet (its reals are written
        // before it).
        self.maps.vip_map.update(pod_bytes(&key), pod_bytes(&meta), MapFlags::ANY).map_err(to_io)?;
        self.maps.vip_keys.update(&index.to_ne_bytes(), pod_bytes(&key), MapFlags::ANY).map_err(to_io)
    }

    /// Marks `addr` as a VIP address (answered to ICMP echo) or not. The control plane
    /// keeps it set while any VIP uses the address.
    pub fn set_vip_address(&self, addr: IpAddr, present: bool) -> io::Result<()> {
        let (w, family) = addr_words(addr);
        let key = balancer_skel::types::vip_addr { addr: w, family, pad: [0; 3] };
        if present {
            self.maps.vip_addrs.update(pod_bytes(&key), &1u32.to_ne_bytes(), MapFlags::ANY).map_err(to_io)
        } else {
            delete_if_present(&self.maps.vip_addrs, pod_bytes(&key))
        }
    }

    /// Removes a VIP.
    pub fn remove_vip(&self, addr: IpAddr, port: u16, proto: u8) -> io::Result<()> {
        let key = Self::vip_key(addr, port, proto);
        let found = self.maps.vip_map.lookup(pod_bytes(&key), MapFlags::ANY).map_err(to_io)?;
        if let Some(meta) = found.as_deref().and_then(pod_read::<balancer_skel::types::vip_meta>) {
            let index = meta.index;
            let none = balancer_skel::types::vip_key::default();
            self.maps.vip_keys.update(&index.to_ne_bytes(), pod_bytes(&none), MapFlags::ANY).map_err(to_io)?;
        }
        delete_if_present(&self.maps.vip_map, pod_bytes(&key))
    }

    /// Writes VIP `index`'s ring (`ring_size` real indexes, `u32::MAX` = none) in one
    /// batch update.
    pub fn set_ring(&self, index: u32, ring: &[u32]) -> io::Result<()> {
        let size = self.opts.sizes.ring_size;
        if ring.len() != size as usize {
            return Err(invalid(format!("ring of {} slots for VIP index {index} (want {size})", ring.len())));
        }
        let slots: Vec<(u32, u32)> = (0..size).zip(ring.iter().copied()).collect();
        self.patch_ring(index, &slots)
    }

    /// Writes some of VIP `index`'s ring slots, `(slot, real index)` with `u32::MAX` =
    /// none, in one batch update: a change of one real's weight moves a few slots of a
    /// ring of hundreds of thousands.
    pub fn patch_ring(&self, index: u32, slots: &[(u32, u32)]) -> io::Result<()> {
        let size = self.opts.sizes.ring_size;
        if index >= self.opts.sizes.max_vips {
            return Err(invalid(format!("VIP index {index} >= {}", self.opts.sizes.max_vips)));
        }
        if let Some((slot, _)) = slots.iter().find(|(s, _)| *s >= size) {
            return Err(invalid(format!("ring slot {slot} >= the ring size, {size}")));
        }
        if let Some((_, bad)) = slots.iter().find(|&&(_, r)| r != u32::MAX && r >= self.opts.sizes.max_reals) {
            return Err(invalid(format!("ring slot names real {bad}, >= {}", self.opts.sizes.max_reals)));
        }
        if slots.is_empty() {
            return Ok(());
        }
        let base = index * size;
        let keys: Vec<u8> = slots.iter().flat_map(|(i, _)| (base + i).to_ne_bytes()).collect();
        // In the map a slot holds the real's index + 1, and 0 is empty (as the map starts).
        let values: Vec<u8> =
            slots.iter().flat_map(|&(_, r)| if r == u32::MAX { 0u32 } else { r + 1 }.to_ne_bytes()).collect();
        self.maps.ring_map.update_batch(&keys, &values, slots.len() as u32, MapFlags::ANY, MapFlags::ANY).map_err(to_io)
    }

    /// Writes many reals in one batch update, in order (a later write of one index
    /// wins): what [`Balancer::set_real`] and [`Balancer::clear_real`] do one by one.
    pub fn write_reals(&self, writes: &[RealWrite]) -> io::Result<()> {
        let mut keys = Vec::with_capacity(writes.len() * 4);
        let mut values = Vec::with_capacity(writes.len() * std::mem::size_of::<balancer_skel::types::real_def>());
        for w in writes {
            let (index, real) = match *w {
                RealWrite::Set { index, address, vip, generation } => {
                    let (addr, family) = addr_words(address);
                    (index, balancer_skel::types::real_def { addr, family, pad: [0; 3], vip, generation })
                }
                RealWrite::Clear { index, generation } => (
                    index,
                    balancer_skel::types::real_def { addr: [0; 4], family: 0, pad: [0; 3], vip: u32::MAX, generation },
                ),
            };
            self.check_real(index)?;
            keys.extend_from_slice(&index.to_ne_bytes());
            values.extend_from_slice(pod_bytes(&real));
        }
        if writes.is_empty() {
            return Ok(());
        }
        self.maps.reals.update_batch(&keys, &values, writes.len() as u32, MapFlags::ANY, MapFlags::ANY).map_err(to_io)
    }

    fn check_real(&self, index: u32) -> io::Result<()> {
        if index >= self.opts.sizes.max_reals {
            return Err(invalid(format!("real index {index} >= {}", self.opts.sizes.max_reals)));
        }
        Ok(())
    }

    /// Sets real `index`: its address, the VIP it serves and its generation (which
    /// must change whenever the index is given to another real or VIP).
    pub fn set_real(&self, index: u32, addr: IpAddr, vip: u32, generation: u32) -> io::Result<()> {
        self.write_reals(&[RealWrite::Set { index, address: addr, vip, generation }])
    }

    /// Removes real `index`: nothing is sent to it any more, and state naming it (the
    /// connection table, flow cache, tags) goes stale. `generation` must differ from the
    /// generation it had.
    pub fn clear_real(&self, index: u32, generation: u32) -> io::Result<()> {
        self.write_reals(&[RealWrite::Clear { index, generation }])
    }

    /// Installs per-flow tag `id` for the flow (and real) of `event`.
    pub fn set_flow_tag(&self, id: u32, event: &FlowEvent) -> io::Result<()> {
        if id >= self.opts.sizes.flow_tags {
            return Err(invalid(format!("tag id {id} >= {}", self.opts.sizes.flow_tags)));
        }
        self.maps.flow_tags.update(&id.to_ne_bytes(), &event.entry_bytes(), MapFlags::ANY).map_err(to_io)
    }

    /// Installs many per-flow tags in one batch update.
    pub fn set_flow_tags(&self, tags: &[(u32, FlowEvent)]) -> io::Result<()> {
        if tags.is_empty() {
            return Ok(());
        }
        if let Some((id, _)) = tags.iter().find(|(id, _)| *id >= self.opts.sizes.flow_tags) {
            return Err(invalid(format!("tag id {id} >= {}", self.opts.sizes.flow_tags)));
        }
        let keys: Vec<u8> = tags.iter().flat_map(|(id, _)| id.to_ne_bytes()).collect();
        let values: Vec<u8> = tags.iter().flat_map(|(_, e)| e.entry_bytes()).collect();
        self.maps.flow_tags.update_batch(&keys, &values, tags.len() as u32, MapFlags::ANY, MapFlags::ANY).map_err(to_io)
    }

    /// The global counters, summed over CPUs, in [`GlobalStat::ALL`] order. Hint hits
    /// include [`GlobalStat::HintDirect`]: the data plane counts a packet once, under
    /// the one or the other.
    pub fn global_stats(&self) -> io::Result<Vec<u64>> {
        let map = &self.maps.global_stats;
        let mut v = (0..map.max_entries()).map(|i| percpu_sum(map, i)).collect::<io::Result<Vec<u64>>>()?;
        let (hit, direct) = (GlobalStat::HintHit.index(), GlobalStat::HintDirect.index());
        if let Some(&d) = v.get(direct)
            && let Some(h) = v.get_mut(hit)
        {
            *h += d;
        }
        Ok(v)
    }

    /// Every VIP's forwarded packets and bytes (indexed by VIP index), summed over
    /// CPUs, in a few batch reads.
    pub fn vip_counters(&self) -> io::Result<Vec<Counter>> {
        Self::counters(&self.maps.vip_stats, self.opts.sizes.max_vips)
    }

    /// Reals `0..upto`'s forwarded packets and bytes, summed over CPUs, in a few batch
    /// reads (one lookup per real takes seconds for half a million).
    pub fn real_counters(&self, upto: u32) -> io::Result<Vec<Counter>> {
        Self::counters(&self.maps.real_stats, upto.min(self.opts.sizes.max_reals))
    }

    fn counters(map: &MapHandle, entries: u32) -> io::Result<Vec<Counter>> {
        let cpus = libbpf_rs::num_possible_cpus().map_err(to_io)?;
        let raw = super::percpu_array_values(map, entries)?;
        let word =
            |v: &[u8], i: usize| v.get(i..i + 8).map_or(0, |b| u64::from_ne_bytes(b.try_into().unwrap_or([0; 8])));
        let per_cpu = (map.value_size() as usize).next_multiple_of(8);
        Ok(raw
            .chunks_exact(per_cpu * cpus)
            .map(|entry| {
                entry.chunks_exact(per_cpu).fold(Counter::default(), |c, v| Counter {
                    packets: c.packets + word(v, 0),
                    bytes: c.bytes + word(v, 8),
                })
            })
            .collect())
    }

    /// A reader of the new-flow events (tag modes). Build it once and keep it: it maps
    /// the ring and registers it with an epoll instance. It owns what it needs (the
    /// mapping keeps the map alive), so it may outlive this handle and move between
    /// threads.
    pub fn events(&self) -> io::Result<FlowEvents> {
        let queue: Arc<Mutex<VecDeque<FlowEvent>>> = Arc::default();
        let bad: Arc<AtomicU64> = Arc::default();
        let (q, b) = (queue.clone(), bad.clone());
        let mut builder = libbpf_rs::RingBufferBuilder::new();
        builder
            .add(&self.maps.flow_events, move |rec: &[u8]| {
                match FlowEvent::from_bytes(rec) {
                    Some(e) => q.lock().unwrap_or_else(PoisonError::into_inner).push_back(e),
                    None => {
                        b.fetch_add(1, Ordering::Relaxed);
                    }
                }
                0
            })
            .map_err(to_io)?;
        Ok(FlowEvents { ring: builder.build().map_err(to_io)?, queue, malformed: bad })
    }
}

/// A load failure in the words of what the user controls: the map sizes (memory) or
/// the device (RX metadata for the device-bound build). libbpf's own lines go to
/// `tracing` (target `libbpf`).
fn explain_load_error(e: io::Error, opts: &BalancerOptions) -> io::Error {
    let s = &opts.sizes;
    let why = match e.kind() {
        io::ErrorKind::OutOfMemory => format!(
            "the kernel could not allocate the data plane's maps ({e}): the connection table alone is \
             conn_entries {} x about 100 bytes = {} MiB, the rings {} x {} slots x 4 bytes = {} MiB; \
             lower conn_entries, ring_size or --max-vips",
            s.conn_entries,
            (u64::from(s.conn_entries) * 100) >> 20,
            s.max_vips,
            s.ring_size,
            (u64::from(s.max_vips) * u64::from(s.ring_size) * 4) >> 20
        ),
        io::ErrorKind::Unsupported | io::ErrorKind::InvalidInput if opts.bind_ifindex.is_some() => format!(
            "the device-bound build did not load ({e}): the interface's driver gives XDP programs no RX \
             metadata (the rx-hash kfunc; veth, virtio_net, mlx5, ice and others do); take hints from the \
             metadata area instead (--hint-source metadata)"
        ),
        io::ErrorKind::PermissionDenied => {
            format!("{e}: loading BPF programs needs root (CAP_BPF and CAP_NET_ADMIN)")
        }
        _ => return e,
    };
    io::Error::new(e.kind(), why)
}

fn delete_if_present(map: &MapHandle, key: &[u8]) -> io::Result<()> {
    match map.delete(key) {
        Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(()),
        r => r.map_err(to_io),
    }
}

/// Most new-flow events one [`FlowEvents::drain`] takes from the ring.
pub const MAX_EVENTS_PER_CALL: usize = 4096;

/// New-flow events from the data plane's ring buffer.
pub struct FlowEvents {
    ring: libbpf_rs::RingBuffer<'static>,
    queue: Arc<Mutex<VecDeque<FlowEvent>>>,
    malformed: Arc<AtomicU64>,
}

impl std::fmt::Debug for FlowEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlowEvents").field("queued", &self.queued().len()).finish_non_exhaustive()
    }
}

impl FlowEvents {
    fn queued(&self) -> std::sync::MutexGuard<'_, VecDeque<FlowEvent>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits up to `timeout` for events and returns all that are ready.
    pub fn poll(&mut self, timeout: Duration) -> io::Result<Vec<FlowEvent>> {
        self.ring.poll(timeout).map_err(to_io)?;
        Ok(self.queued().drain(..).collect())
    }

    /// Waits up to `timeout` for events or until `wake` is readable (a stop signal's
    /// descriptor: the wait ends at once), and returns the events that are ready, at
    /// most `MAX_EVENTS_PER_CALL`.
    pub fn poll_or_wake(&mut self, timeout: Duration, wake: BorrowedFd<'_>) -> io::Result<Vec<FlowEvent>> {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        // SAFETY: the ring buffer owns its epoll descriptor and closes it only when it is
        // dropped; `self.ring` outlives this borrow, which ends with this call.
        let ring = unsafe { BorrowedFd::borrow_raw(self.ring.epoll_fd()) };
        let mut fds = [PollFd::new(ring, PollFlags::POLLIN), PollFd::new(wake, PollFlags::POLLIN)];
        let ms = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
        match poll(&mut fds, ms) {
            // An interrupted wait only ends early: the caller loops.
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
        self.drain()
    }

    /// Returns the events that are ready without waiting, at most
    /// `MAX_EVENTS_PER_CALL`: the rest stay in the ring for the next call, so a flood
    /// of new flows (the data plane refills the ring while it is read) cannot hold the
    /// caller's loop, and with it a stop, statistics or an edit.
    pub fn drain(&mut self) -> io::Result<Vec<FlowEvent>> {
        let n = self.ring.consume_raw_n(MAX_EVENTS_PER_CALL);
        if n < 0 {
            return Err(io::Error::from_raw_os_error(-n));
        }
        Ok(self.queued().drain(..).collect())
    }

    /// Records too short to be events (never expected; counted, not fatal).
    pub fn malformed(&self) -> u64 {
        self.malformed.load(Ordering::Relaxed)
    }
}

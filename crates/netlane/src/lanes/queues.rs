//! What the kernel says about a device's receive queues: which NAPI instance serves
//! each (netdev netlink `queue-get`), which CPU runs each NAPI instance (its kernel
//! thread's affinity when NAPI is threaded, its interrupt's otherwise), and the per-NAPI
//! settings a lane may change (`napi-set`, with the per-device sysfs knobs as the
//! fallback on kernels or devices without it).

use std::collections::BTreeMap;

use serde::Serialize;

use super::busy::Knob;
use crate::installed::{Change, Held, Place};
use crate::topology::TopologyError;
use crate::topology::netdev::{Napi, NapiSettings, Netdev, QueueKind};

/// One receive queue and what serves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RxQueue {
    /// Queue index.
    pub queue: u32,
    /// The NAPI instance serving it.
    pub napi_id: u32,
    /// The CPU that instance runs on, when it is pinned to one.
    pub cpu: Option<usize>,
    /// Its kernel thread, when NAPI is threaded.
    pub thread: Option<u32>,
}

/// A device's receive queues.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceQueues {
    /// Interface index.
    pub ifindex: u32,
    /// Receive queues with a NAPI instance, by index.
    pub rx: Vec<RxQueue>,
    /// Receive queues without one (the device is down, or has no NAPI on them).
    pub rx_without_napi: Vec<u32>,
    /// Every NAPI instance, with its settings.
    pub napis: Vec<Napi>,
    /// The device does not say which NAPI instance serves which queue (veth does not):
    /// its instances were matched to its queues in id order.
    pub napi_by_order: bool,
}

impl DeviceQueues {
    /// The NAPI ids in queue order (each once), as [`super::LaneMap::learn`] takes them.
    pub fn napi_ids(&self) -> Vec<u32> {
        let mut out: Vec<u32> = Vec::new();
        for q in &self.rx {
            if !out.contains(&q.napi_id) {
                out.push(q.napi_id);
            }
        }
        out
    }
}

/// Why a device cannot carry lanes.
#[derive(Debug, thiserror::Error)]
pub enum LaneDeviceError {
    /// No interface by that name in this namespace.
    #[error("{dev}: no such interface here")]
    NoDevice {
        /// The name asked for.
        dev: String,
        /// What the kernel said.
        #[source]
        source: nix::Error,
    },
    /// Its queues could not be read.
    #[error("{dev}: read its queues")]
    Queues {
        /// The device.
        dev: String,
        /// Why not.
        #[source]
        source: TopologyError,
    },
    /// No receive queue has a NAPI instance: no NAPI id to place a connection by.
    #[error("{dev}: no receive queue has a NAPI instance (is it up, with NAPI enabled?)")]
    NoNapi {
        /// The device.
        dev: String,
    },
}

/// The queues of device `dev` (in the calling thread's namespace) that lanes are placed
/// on: refused when it has no receive queue with a NAPI instance.
pub fn lane_device(dev: &str) -> Result<DeviceQueues, LaneDeviceError> {
    let ifindex = nix::net::if_::if_nametoindex(dev)
        .map_err(|source| LaneDeviceError::NoDevice { dev: dev.to_string(), source })?;
    let q = discover(ifindex).map_err(|source| LaneDeviceError::Queues { dev: dev.to_string(), source })?;
    if q.rx.is_empty() {
        return Err(LaneDeviceError::NoNapi { dev: dev.to_string() });
    }
    Ok(q)
}

/// Reads interface `ifindex`'s queues in the calling thread's namespace.
pub fn discover(ifindex: u32) -> Result<DeviceQueues, TopologyError> {
    let mut nd = Netdev::open()?;
    let queues = nd.queues(ifindex)?;
    let napis = nd.napis(ifindex)?;
    let by_id: BTreeMap<u32, &Napi> = napis.iter().map(|n| (n.id, n)).collect();
    let rx_queues: Vec<u32> = queues.iter().filter(|q| q.kind == QueueKind::Rx).map(|q| q.id).collect();
    let linked: BTreeMap<u32, u32> = queues
        .iter()
        .filter(|q| q.kind == QueueKind::Rx)
        .filter_map(|q| q.napi_id.filter(|&id| id != 0).map(|id| (q.id, id)))
        .collect();
    // Drivers that do not link their queues to NAPI instances (veth is one) report
    // queues without ids; a driver adds one NAPI instance per receive queue, in queue
    // order, and ids grow as they are added: take them in id order then.
    let by_order = linked.is_empty() && !napis.is_empty() && napis.len() == rx_queues.len();
    let mut ids_in_order: Vec<u32> = napis.iter().map(|n| n.id).collect();
    ids_in_order.sort_unstable();
    let (mut rx, mut rx_without_napi) = (Vec::new(), Vec::new());
    for (k, &queue) in rx_queues.iter().enumerate() {
        let napi_id = if by_order { Some(ids_in_order[k]) } else { linked.get(&queue).copied() };
        match napi_id {
            Some(napi_id) => {
                let n = by_id.get(&napi_id);
                let thread = n.and_then(|n| n.pid);
                let cpu = thread.and_then(thread_cpu).or_else(|| n.and_then(|n| n.irq).and_then(irq_cpu));
                rx.push(RxQueue { queue, napi_id, cpu, thread });
            }
            None => rx_without_napi.push(queue),
        }
    }
    Ok(DeviceQueues { ifindex, rx, rx_without_napi, napis, napi_by_order: by_order })
}

/// The one CPU a thread may run on, if it is pinned to one.
fn thread_cpu(pid: u32) -> Option<usize> {
    let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(pid as i32)).ok()?;
    let cpus: Vec<usize> = (0..nix::sched::CpuSet::count()).filter(|&c| set.is_set(c).unwrap_or(false)).collect();
    (cpus.len() == 1).then(|| cpus[0])
}

/// The one CPU an interrupt is delivered to, if it is pinned to one.
fn irq_cpu(irq: u32) -> Option<usize> {
    let text = std::fs::read_to_string(format!("/proc/irq/{irq}/smp_affinity_list")).ok()?;
    let list: crate::cpus::CpuList = text.trim().parse().ok()?;
    (list.len() == 1).then(|| list.as_slice()[0])
}

/// Knobs as applied or refused, and the changes held meanwhile: dropping them puts
/// back what was there before (a SIGKILL leaves their records to `netlane clean`).
#[derive(Debug, Default)]
pub struct Applied {
    /// Every knob, applied or refused.
    pub knobs: Vec<Knob>,
    /// What was changed, held until dropped.
    pub held: Vec<Held>,
}

impl Applied {
    /// Adds `other`'s knobs and changes to these.
    pub fn extend(&mut self, other: Applied) {
        self.knobs.extend(other.knobs);
        self.held.extend(other.held);
    }
}

/// Writes `settings` to each NAPI instance in `napi_ids` with `napi-set`; where the
/// kernel refuses, falls back to the device's sysfs knobs (`napi_defer_hard_irqs`,
/// `gro_flush_timeout`: every NAPI instance of the device at once; there is no sysfs
/// knob for IRQ suspension). Every knob comes back as applied or refused; what was
/// changed is held (recorded, and put back when dropped).
pub fn apply_napi_settings(dev: &str, ifindex: u32, napi_ids: &[u32], settings: &NapiSettings) -> Applied {
    let mut out = Vec::new();
    let mut held = Vec::new();
    if settings.is_empty() {
        return Applied::default();
    }
    let describe = |s: &NapiSettings| {
        let mut v = Vec::new();
        if let Some(d) = s.defer_hard_irqs {
            v.push(format!("defer-hard-irqs={d}"));
        }
        if let Some(t) = s.gro_flush_timeout_ns {
            v.push(format!("gro-flush-timeout={t}ns"));
        }
        if let Some(t) = s.irq_suspend_timeout_ns {
            v.push(format!("irq-suspend-timeout={t}ns"));
        }
        v.join(",")
    };
    let mut nd = match Netdev::open() {
        Ok(nd) => Some(nd),
        Err(e) => {
            out.push(Knob::refused("netdev netlink", "napi-set", crate::error::chain(&e)));
            None
        }
    };
    let mut refused = false;
    let before: Vec<Napi> = nd.as_mut().and_then(|n| n.napis(ifindex).ok()).unwrap_or_default();
    for &id in napi_ids {
        let name = format!("napi {id}");
        let Some(n) = nd.as_mut() else {
            refused = true;
            break;
        };
        let was = before.iter().find(|x| x.id == id).map(|x| NapiSettings {
            defer_hard_irqs: x.defer_hard_irqs,
            gro_flush_timeout_ns: x.gro_flush_timeout_ns,
            irq_suspend_timeout_ns: x.irq_suspend_timeout_ns,
        });
        let set = |n: &mut Netdev| n.napi_set(id, settings).map_err(std::io::Error::other);
        let result = match (was, Place::here()) {
            (Some(was), Ok(place)) => {
                let change =
                    Change::Napi { place, ifindex, ifname: dev.to_string(), id, before: was, value: *settings };
                Held::make(change, || set(n)).map(|h| held.push(h))
            }
            // Not listed (so nothing to put back), or the namespace unknown: set, unheld.
            _ => set(n),
        };
        match result {
            Ok(()) => {
                // Read back what the kernel now reports for it.
                let now = n
                    .napis(ifindex)
                    .ok()
                    .and_then(|all| all.into_iter().find(|x| x.id == id))
                    .map(|x| {
                        describe(&NapiSettings {
                            defer_hard_irqs: settings.defer_hard_irqs.and(x.defer_hard_irqs),
                            gro_flush_timeout_ns: settings.gro_flush_timeout_ns.and(x.gro_flush_timeout_ns),
                            irq_suspend_timeout_ns: settings.irq_suspend_timeout_ns.and(x.irq_suspend_timeout_ns),
                        })
                    })
                    .unwrap_or_else(|| "not listed".into());
                out.push(Knob::applied_as(name, describe(settings), now));
            }
            Err(e) => {
                refused = true;
                out.push(Knob::refused(name, describe(settings), crate::error::chain(&e)));
            }
        }
    }
    if refused {
        for (knob, value) in [
            ("napi_defer_hard_irqs", settings.defer_hard_irqs.map(u64::from)),
            ("gro_flush_timeout", settings.gro_flush_timeout_ns),
        ] {
            let Some(v) = value else { continue };
            let path = format!("/sys/class/net/{dev}/{knob}");
            let name = format!("{dev} {knob} (sysfs, every NAPI instance of the device)");
            match crate::installed::hold_device_file(&path, &v.to_string()) {
                Ok(h) => {
                    held.push(h);
                    let now = std::fs::read_to_string(&path).map(|s| s.trim().to_string()).unwrap_or_default();
                    out.push(Knob::applied_as(name, v.to_string(), now));
                }
                Err(e) => out.push(Knob::refused(name, v.to_string(), e)),
            }
        }
    }
    Applied { knobs: out, held }
}

/// Transmit alignment: maps transmit queue `i` of `dev` to receive queue `i` (`xps_rxqs`),
/// so that a socket whose packets arrive on receive queue `i` transmits on queue `i` and
/// its transmit completions come back on the queue pair its lane already serves. One knob
/// per transmit queue, applied (read back) or refused (a device without XPS, or fewer
/// receive than transmit queues); each map written is held (put back when dropped).
pub fn apply_xps_rxqs(dev: &str, rx_queues: usize) -> Applied {
    let mut out = Vec::new();
    let mut held = Vec::new();
    let dir = format!("/sys/class/net/{dev}/queues");
    let tx = crate::nic::tx_queues(dev);
    if tx.is_empty() {
        out.push(Knob::refused(format!("{dev} xps_rxqs"), "tx-i -> rx-i", format!("no transmit queues under {dir}")));
    }
    for i in tx {
        let name = format!("{dev} tx-{i} xps_rxqs");
        if i >= rx_queues {
            out.push(Knob::refused(name, "-", format!("no receive queue {i} to pair with")));
            continue;
        }
        // A hexadecimal bitmap of receive queues, in 32-bit words separated by commas.
        let mask = crate::nic::one_bit_mask(i);
        let path = format!("{dir}/tx-{i}/xps_rxqs");
        match crate::installed::hold_device_file(&path, &mask) {
            Ok(h) => {
                held.push(h);
                let now = std::fs::read_to_string(&path).map(|s| s.trim().to_string()).unwrap_or_default();
                out.push(Knob::applied_as(name, mask, now));
            }
            Err(e) => out.push(Knob::refused(name, mask, e)),
        }
    }
    Applied { knobs: out, held }
}

/// Whether the kernel lets interface `ifindex`'s first NAPI instance (in this namespace)
/// be polled by its thread without sleeping: set, read back, and put back as it was.
/// What the kernel said, either way.
pub fn try_threaded_busy_poll(ifindex: u32) -> Result<String, String> {
    use crate::topology::netdev::NapiThreaded;
    let mut nd = Netdev::open().map_err(|e| format!("netdev netlink: {}", crate::error::chain(&e)))?;
    let napis = nd.napis(ifindex).map_err(|e| crate::error::chain(&e).to_string())?;
    let n = napis.first().ok_or("the device has no NAPI instance")?;
    let was = n.threaded.ok_or("napi-get does not say how an instance is polled (needs Linux 6.17+)")?;
    nd.napi_set_threaded(n.id, NapiThreaded::BusyPoll)
        .map_err(|e| format!("napi-set threaded=busy-poll refused: {}", crate::error::chain(&e)))?;
    let now = nd.napis(ifindex).ok().and_then(|v| v.into_iter().find(|x| x.id == n.id)).and_then(|x| x.threaded);
    let back = nd.napi_set_threaded(n.id, was);
    match (now, back) {
        (Some(NapiThreaded::BusyPoll), Ok(())) => {
            Ok("a NAPI instance's thread set to busy poll, read back, put back".into())
        }
        (now, Ok(())) => Err(format!("napi-set threaded=busy-poll was taken but reads back as {now:?}")),
        (_, Err(e)) => Err(format!("set, but could not be put back: {}", crate::error::chain(&e))),
    }
}

/// The NAPI threads (PID, and the kernel's name for the thread) of the interface this
/// namespace's routes send packets for `dst` through: where the receive work of that
/// traffic runs when NAPI is threaded. All of the interface's, so on a multi-queue NIC
/// also those of queues that carry other traffic. Empty when the interface has none
/// (softirq NAPI, or no NAPI, as loopback).
pub fn napi_threads_towards(dst: std::net::IpAddr) -> Result<Vec<(u32, String)>, String> {
    let mut r = crate::topology::Rtnl::open().map_err(|e| format!("rtnetlink: {e}"))?;
    let Some(ifindex) = r.output_interface(dst).map_err(|e| crate::error::chain(&e).to_string())? else {
        return Ok(Vec::new());
    };
    let dev = r.link_name(ifindex).map_err(|e| crate::error::chain(&e).to_string())?;
    let mut nd = Netdev::open().map_err(|e| format!("netdev netlink: {}", crate::error::chain(&e)))?;
    let napis = nd.napis(ifindex).map_err(|e| crate::error::chain(&e).to_string())?;
    Ok(napis.into_iter().filter_map(|n| Some((n.pid?, format!("napi/{dev}-{}", n.id)))).collect())
}

/// Writes `settings` to every NAPI instance of the interface this namespace's routes send
/// packets for `dst` through (as [`apply_napi_settings`], the sysfs fallback on this
/// namespace's own `/sys`): the interrupt moderation of the traffic coming back from
/// `dst`. Returns the interface's name and what was applied, held until dropped. An
/// interface without NAPI (loopback) is an error: there is nothing to moderate.
pub fn apply_napi_settings_towards(dst: std::net::IpAddr, settings: NapiSettings) -> Result<(String, Applied), String> {
    let (ifindex, dev) = device_towards(dst)?;
    let mut nd = Netdev::open().map_err(|e| format!("netdev netlink: {}", crate::error::chain(&e)))?;
    let ids: Vec<u32> =
        nd.napis(ifindex).map_err(|e| crate::error::chain(&e).to_string())?.into_iter().map(|n| n.id).collect();
    if ids.is_empty() {
        return Err(format!("{dev} has no NAPI instance (no interrupts to moderate)"));
    }
    let here = crate::topology::NetnsHandle::current().map_err(|e| crate::error::chain(&e).to_string())?;
    let d = dev.clone();
    let applied = here
        .with_sysfs(move || apply_napi_settings(&d, ifindex, &ids, &settings))
        .map_err(|e| crate::error::chain(&e).to_string())?;
    Ok((dev, applied))
}

/// Sets the device's own interrupt coalescing (`rx-usecs`, `adaptive-rx`...: ethtool
/// `-C`) on the interface this namespace's routes send packets for `dst` through, held
/// until dropped. The setting comes back as one knob, applied (read back) or refused with
/// the kernel's reason (a veth has no coalescing to set); only a route that cannot be
/// found is an error.
pub fn apply_coalescing_towards(
    dst: std::net::IpAddr,
    values: &crate::topology::ethtool::Values,
) -> Result<(String, Applied), String> {
    let (_, dev) = device_towards(dst)?;
    let (outcome, held) = crate::nic::set_group(&dev, crate::topology::ethtool::Group::Coalesce, values);
    let name = format!("{dev} coalesce");
    let wanted = crate::installed::values_words(values, values);
    let knob = match (outcome.applied, outcome.refused) {
        (Some(now), _) => Knob::new_applied(name, wanted, now),
        (None, why) => Knob::new_refused(name, wanted, why.unwrap_or_else(|| "not tried".into())),
    };
    Ok((dev, Applied { knobs: vec![knob], held: held.into_iter().collect() }))
}

/// The interface (index, name) this namespace's routes send packets for `dst` through.
fn device_towards(dst: std::net::IpAddr) -> Result<(u32, String), String> {
    let mut r = crate::topology::Rtnl::open().map_err(|e| format!("rtnetlink: {e}"))?;
    let ifindex = r
        .output_interface(dst)
        .map_err(|e| crate::error::chain(&e).to_string())?
        .ok_or_else(|| format!("no route to {dst}"))?;
    let dev = r.link_name(ifindex).map_err(|e| crate::error::chain(&e).to_string())?;
    Ok((ifindex, dev))
}

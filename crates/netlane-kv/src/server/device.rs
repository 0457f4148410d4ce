//! The lanes at start: the lane map, with the receive queues of the lane device (if
//! there is one) dealt out to the lanes in order, the CPU of each lane's first queue, and
//! the NAPI and XPS knobs written to the device's queues.

use std::collections::BTreeMap;

use netlane::installed::Held;
use netlane::lanes::{Knob, LaneId, LaneMap};
use netlane::topology::NetnsHandle;

use super::{ServerConfig, ServerError};

/// The lanes a server starts with.
pub(super) struct StartLanes {
    pub map: LaneMap,
    /// The CPU of the first queue each lane owns (with a lane device).
    pub queue_cpus: BTreeMap<LaneId, usize>,
    /// The device's knobs set at start, applied or refused.
    pub knobs: Vec<Knob>,
    /// Per-NAPI settings and XPS maps it changed, put back when the server is dropped.
    pub device_changes: Vec<Held>,
}

impl StartLanes {
    /// The lane map for `cfg.threads` lanes, and with `cfg.lane_device` its queues dealt
    /// out and its knobs set.
    pub(super) fn new(cfg: &ServerConfig) -> Result<StartLanes, ServerError> {
        // The lane map: the device's queues dealt out in order, if there is a device.
        let mut map = LaneMap::new(cfg.threads).map_err(|e| ServerError::Config(e.to_string()))?;
        let mut queue_cpus = BTreeMap::new();
        let mut knobs = Vec::new();
        let mut device_changes = Vec::new();
        if let Some(dev) = &cfg.lane_device {
            let q = netlane::lanes::queues::lane_device(dev).map_err(ServerError::LaneDevice)?;
            let ifindex = q.ifindex;
            map.learn(&q.napi_ids());
            for rq in &q.rx {
                if let (Some(lane), Some(cpu)) = (map.owner(rq.napi_id), rq.cpu) {
                    queue_cpus.entry(lane).or_insert(cpu);
                }
            }
            // The sysfs fallbacks and XPS need the namespace's own /sys (and root).
            let here = NetnsHandle::current().map_err(|e| ServerError::Config(e.to_string()))?;
            let wanted = !cfg.napi.is_empty() || cfg.xps_rxqs;
            let (napi, xps, rx_count) = (cfg.napi, cfg.xps_rxqs, q.rx.len() + q.rx_without_napi.len());
            let ids = q.napi_ids();
            let dev2 = dev.clone();
            knobs = if !wanted {
                Vec::new()
            } else {
                let applied = here
                    .with_sysfs(move || {
                        let mut a = netlane::lanes::queues::apply_napi_settings(&dev2, ifindex, &ids, &napi);
                        if xps {
                            a.extend(netlane::lanes::queues::apply_xps_rxqs(&dev2, rx_count));
                        }
                        a
                    })
                    .map_err(|source| ServerError::LaneKnobs { dev: dev.clone(), source })?;
                device_changes = applied.held;
                applied.knobs
            };
        }
        Ok(StartLanes { map, queue_cpus, knobs, device_changes })
    }
}

//! Per-NAPI settings for the device the server reads: deferred interrupts, the GRO
//! flush timeout, IRQ suspension. With them a busy-polling server runs its queue's NAPI
//! instance alone: while the device holds off its interrupts nothing schedules the
//! instance's thread, which would otherwise own the instance and leave the server's
//! poll nothing to do until it runs.

use netlane::installed::Held;
use netlane::lanes::Knob;
use netlane::topology::NetnsHandle;

use super::*;

/// The settings as applied to every NAPI instance of the server's device, each knob
/// applied (read back) or refused; what they changed is put back when the guards drop.
pub(super) fn apply(cfg: &ServerConfig) -> Result<(Vec<Knob>, Vec<Held>), ServerError> {
    if cfg.napi.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let dev = match &cfg.lane_device {
        Some(d) => d.clone(),
        None => match interface(cfg)? {
            (_, Some(name)) if name != "all" => name,
            _ => {
                return Err(ServerError::Interface("per-NAPI settings need one device: name it (`iface`)".to_string()));
            }
        },
    };
    let q = netlane::lanes::queues::lane_device(&dev).map_err(ServerError::LaneDevice)?;
    let (ids, ifindex, napi) = (q.napi_ids(), q.ifindex, cfg.napi);
    // The sysfs fallbacks need the namespace's own /sys.
    let here = NetnsHandle::current().map_err(|source| ServerError::Napi { dev: dev.clone(), source })?;
    let d = dev.clone();
    let applied = here
        .with_sysfs(move || netlane::lanes::queues::apply_napi_settings(&d, ifindex, &ids, &napi))
        .map_err(|source| ServerError::Napi { dev, source })?;
    Ok((applied.knobs, applied.held))
}

//! The rfs mode's kernel settings: receive flow steering on the server's device for one
//! round, put back when the round ends.

use anyhow::{Context, Result, bail};
use netlane::installed::{Held, Sysctl};
use netlane::topology::ethtool::Ethtool;
use netlane::topology::{NetnsHandle, TwoHosts};

/// RFS as set for a round, and what was read back.
pub(crate) struct RfsHeld {
    _table: Sysctl,
    _queues: Vec<Held>,
    /// The settings as read back, and whether the device would steer in hardware.
    pub(crate) said: String,
}

/// Sets the global flow table to `flows` entries and shares them out as the rx
/// namespace's device's per-queue tables. An error when any of it is refused: a round
/// named rfs must have run with RFS.
pub(crate) fn hold(h: &TwoHosts, flows: u32) -> Result<RfsHeld> {
    // The global table exists only in the initial network namespace, where the lab runs.
    let table = Sysctl::set("/proc/sys/net/core/rps_sock_flow_entries", &flows.to_string())
        .context("set net.core.rps_sock_flow_entries")?;
    let table_now = table.read().context("read net.core.rps_sock_flow_entries back")?;
    let dev = h.rx_if.clone();
    let here = h.rx.run(NetnsHandle::current)??;
    let d = dev.clone();
    let (outcomes, held, ntuple) = here
        .with_sysfs(move || -> Result<_, String> {
            let files = netlane::nic::rfs_flow_counts(&d, flows)?;
            let (mut outcomes, mut held) = (Vec::new(), Vec::new());
            for f in &files {
                let (o, h) = netlane::nic::set_file(&d, f);
                outcomes.push(o);
                held.extend(h);
            }
            // aRFS: the driver's flow steering into the queue of the CPU that reads the flow,
            // when the device has ntuple filters and they are on.
            let ntuple = Ethtool::open()
                .and_then(|mut e| e.active_features(&d))
                .map(|f| f.get("rx-ntuple-filter").copied().unwrap_or(false))
                .map_err(|e| netlane::error::chain(&e).to_string());
            Ok((outcomes, held, ntuple))
        })?
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("RFS on {dev}"))?;
    if let Some(o) = outcomes.iter().find(|o| o.refused.is_some()) {
        bail!("{}: refused: {}", o.asked, o.refused.as_deref().unwrap_or_default());
    }
    let queues: Vec<String> =
        outcomes.iter().map(|o| format!("{} (read back {})", o.asked, o.applied.as_deref().unwrap_or("?"))).collect();
    let hardware = match ntuple {
        Ok(true) => format!("aRFS possible: {dev} has ntuple filters on"),
        Ok(false) => format!("no aRFS: {dev} has no ntuple filters on (RFS steers in software, by IPI)"),
        Err(why) => format!("aRFS unknown: {dev}'s features could not be read: {why}"),
    };
    let said = format!("net.core.rps_sock_flow_entries {table_now}; {}; {hardware}", queues.join(", "));
    Ok(RfsHeld { _table: table, _queues: held, said })
}

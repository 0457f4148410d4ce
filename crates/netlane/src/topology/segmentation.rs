//! Where a host's large sends are cut into packets the wire can carry, switched per run.
//!
//! A veth end takes TCP's and UDP GSO's large packets whole and hands them to its peer
//! uncut: nothing is ever segmented, which is what a NIC with TSO and UDP segmentation
//! offload saves the host, and more. The baselines the content-delivery talk measured
//! against need the other cases too: segmentation in software just before the device
//! (the kernel's GSO, for a NIC without those offloads) and, for TCP, none at all.

use super::{Netns, TopologyError, tso_features};

/// Where a host's large sends are cut into packets the size of the path's MTU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segmentation {
    /// The device takes them whole (a veth end's default; like a NIC with TSO and UDP
    /// segmentation offload, except that veth never cuts them at all).
    Device,
    /// In software, just before the device: the kernel's GSO, as for a NIC without
    /// TSO or UDP segmentation offload.
    Software,
    /// Nowhere: the device's `gso_max_segs` is 1, so TCP builds one segment per packet
    /// (Linux's TCP always uses GSO otherwise). A UDP GSO send is still accepted and
    /// cut in software, as with [`Segmentation::Software`].
    None,
}

impl Segmentation {
    /// A short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Segmentation::Device => "device",
            Segmentation::Software => "software",
            Segmentation::None => "none",
        }
    }
}

/// The features a device must have off for segmentation in software: every TCP
/// segmentation offload and UDP's.
fn offloads(on: bool) -> Vec<(&'static str, bool)> {
    let mut f = tso_features(on).to_vec();
    f.push(("tx-udp-segmentation", on));
    f
}

/// A [`Segmentation`] in force on one device until dropped; dropping it restores the
/// offload features and `gso_max_segs` it found.
#[must_use = "the device's segmentation is restored when this is dropped"]
#[derive(Debug)]
pub struct SegmentationGuard<'a> {
    ns: &'a Netns,
    dev: String,
    index: u32,
    features: Vec<(&'static str, bool)>,
    gso_max_segs: Option<u32>,
}

impl<'a> SegmentationGuard<'a> {
    /// Puts `s` in force on device `dev` (interface index `index`) in `ns`, and checks
    /// that the kernel took it. [`Segmentation::Device`] changes nothing and checks that
    /// the device takes large sends whole (an earlier guard's failed restore would
    /// leave it cutting them).
    pub fn apply(ns: &'a Netns, dev: &str, index: u32, s: Segmentation) -> Result<Self, TopologyError> {
        let mut guard = SegmentationGuard { ns, dev: dev.to_string(), index, features: Vec::new(), gso_max_segs: None };
        let active = ns.with_ethtool(|e| e.active_features(dev))?;
        if s == Segmentation::Device {
            let off: Vec<&str> = ["tx-udp-segmentation", "tx-tcp-segmentation"]
                .into_iter()
                .filter(|name| !active.get(*name).copied().unwrap_or(false))
                .collect();
            let segs = ns.with_rtnl(|r| r.link_gso_max_segs(index))?;
            if !off.is_empty() || segs < 2 {
                return Err(TopologyError::Invalid(format!(
                    "{dev} does not take large sends whole (an earlier run's offloads not put back?): {} off, \
                     gso_max_segs {segs}",
                    if off.is_empty() { "nothing".to_string() } else { off.join(" and ") }
                )));
            }
            return Ok(guard);
        }
        guard.features =
            offloads(false).into_iter().map(|(name, _)| (name, active.get(name).copied().unwrap_or(false))).collect();
        ns.with_ethtool(|e| e.set_features(dev, &offloads(false)))?;
        let now = ns.with_ethtool(|e| e.active_features(dev))?;
        if let Some(on) = offloads(false).iter().find(|(name, _)| now.get(*name).copied().unwrap_or(false)) {
            return Err(TopologyError::Unsupported(format!("{dev}: {} stays on after turning it off", on.0)));
        }
        if s == Segmentation::None {
            let was = ns.with_rtnl(|r| r.link_gso_max_segs(index))?;
            ns.with_rtnl(|r| r.set_gso_max_segs(index, 1))?;
            guard.gso_max_segs = Some(was);
            let now = ns.with_rtnl(|r| r.link_gso_max_segs(index))?;
            if now != 1 {
                return Err(TopologyError::Unsupported(format!("{dev}: gso_max_segs reads {now} after setting 1")));
            }
        }
        Ok(guard)
    }
}

impl Drop for SegmentationGuard<'_> {
    fn drop(&mut self) {
        if let Some(segs) = self.gso_max_segs
            && let Err(e) = self.ns.with_rtnl(|r| r.set_gso_max_segs(self.index, segs))
        {
            tracing::warn!(dev = %self.dev, error = %e, "restoring gso_max_segs failed");
        }
        if !self.features.is_empty()
            && let Err(e) = self.ns.with_ethtool(|e| e.set_features(&self.dev, &self.features))
        {
            tracing::warn!(dev = %self.dev, error = %e, "restoring the segmentation offloads failed");
        }
    }
}

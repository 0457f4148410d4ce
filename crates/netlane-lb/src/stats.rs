//! The balancer's counters: collected from the per-CPU maps, as JSON (serde) and in
//! the Prometheus text exposition format.

use std::collections::BTreeMap;

use serde::Serialize;

use netlane::metrics::CounterSet;
use netlane::metrics::prom::{Exposition, Kind};

use crate::driver::{Lb, LbError, kernel};
use netlane_sys::bpf::GlobalStat;

netlane::counters! {
    /// Per-flow tag bookkeeping.
    #[derive(Serialize, schemars::JsonSchema)]
    pub struct TagStats, shared SharedTagStats {
        /// Tags installed.
        installed,
        /// Tags taken back because the table was full.
        evicted,
        /// Tags taken back because their real was removed.
        released,
        /// New-flow events not tagged: their real was removed or reused since (the event
        /// names a generation the real no longer has).
        stale_events,
    }
}

/// One real's counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct RealStats {
    /// Its address.
    pub address: String,
    /// Its weight.
    pub weight: u32,
    /// Packets forwarded to it.
    pub packets: u64,
    /// Bytes forwarded to it.
    pub bytes: u64,
}

/// One VIP's counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct VipStats {
    /// `address:port/proto`.
    pub vip: String,
    /// Packets forwarded.
    pub packets: u64,
    /// Bytes forwarded.
    pub bytes: u64,
    /// Its reals.
    pub reals: Vec<RealStats>,
}

/// Everything the balancer counts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct LbStats {
    /// Interface.
    pub iface: String,
    /// "native" or "generic".
    pub attach_mode: String,
    /// Hint mode.
    pub hints: String,
    /// Global counters by name (drops by reason, connection-table hits and misses,
    /// hint hits, events).
    pub global: BTreeMap<String, u64>,
    /// Per VIP and real.
    pub vips: Vec<VipStats>,
    /// Tags.
    pub tags: TagStats,
    /// Tags in use now.
    pub tags_in_use: usize,
}

pub(super) fn collect(lb: &Lb) -> Result<LbStats, LbError> {
    let b = &lb.balancer;
    let raw = b.global_stats().map_err(kernel("read the global counters"))?;
    let global =
        GlobalStat::ALL.iter().map(|s| (s.name().to_string(), raw.get(s.index()).copied().unwrap_or(0))).collect();
    let mut vips = Vec::new();
    if let Some(cfg) = lb.plane.current() {
        let indexed: Vec<_> = cfg.vips.iter().filter_map(|v| Some((v, lb.plane.indexes(v)?))).collect();
        let upto = indexed.iter().flat_map(|(_, (_, reals))| reals.values()).max().map_or(0, |m| m + 1);
        let vip_counters = b.vip_counters().map_err(kernel("read VIP counters"))?;
        let real_counters = b.real_counters(upto).map_err(kernel("read real counters"))?;
        for (v, (vi, reals)) in indexed {
            let c = vip_counters.get(vi as usize).copied().unwrap_or_default();
            let rs = v
                .reals
                .iter()
                .filter_map(|r| {
                    let rc = real_counters.get(*reals.get(&r.address)? as usize).copied().unwrap_or_default();
                    Some(RealStats {
                        address: r.address.to_string(),
                        weight: r.weight,
                        packets: rc.packets,
                        bytes: rc.bytes,
                    })
                })
                .collect();
            vips.push(VipStats { vip: v.name(), packets: c.packets, bytes: c.bytes, reals: rs });
        }
    }
    Ok(LbStats {
        iface: lb.opts.iface.clone(),
        attach_mode: lb.mode().name().to_string(),
        hints: lb.opts.hint.name().to_string(),
        global,
        vips,
        tags: lb.tag_stats,
        tags_in_use: lb.tags.len(),
    })
}

/// The counters in the Prometheus text exposition format (version 0.0.4).
pub fn render_prometheus(s: &LbStats) -> String {
    let mut o = Exposition::new();
    let iface = s.iface.as_str();
    o.family("netlane_lb_info", "The balancer's attachment.", Kind::Gauge).sample(
        "netlane_lb_info",
        &[("iface", iface), ("attach_mode", &s.attach_mode), ("hints", &s.hints)],
        1,
    );
    let packets = "netlane_lb_packets_total";
    o.family(packets, "Packets by outcome (drops by reason, table hits, hints).", Kind::Counter);
    for (k, v) in &s.global {
        o.sample(packets, &[("iface", iface), ("counter", k)], v);
    }
    for (metric, help, get) in [
        (
            "netlane_lb_vip_packets_total",
            "Packets forwarded per VIP.",
            (|v: &VipStats| v.packets) as fn(&VipStats) -> u64,
        ),
        ("netlane_lb_vip_bytes_total", "Bytes forwarded per VIP.", |v: &VipStats| v.bytes),
    ] {
        o.family(metric, help, Kind::Counter);
        for v in &s.vips {
            o.sample(metric, &[("iface", iface), ("vip", &v.vip)], get(v));
        }
    }
    for (metric, help, get) in [
        (
            "netlane_lb_real_packets_total",
            "Packets forwarded per real.",
            (|r: &RealStats| r.packets) as fn(&RealStats) -> u64,
        ),
        ("netlane_lb_real_bytes_total", "Bytes forwarded per real.", |r: &RealStats| r.bytes),
    ] {
        o.family(metric, help, Kind::Counter);
        for v in &s.vips {
            for r in &v.reals {
                o.sample(metric, &[("iface", iface), ("vip", &v.vip), ("real", &r.address)], get(r));
            }
        }
    }
    let tags = "netlane_lb_tags_total";
    o.family(tags, "Per-flow tags by event.", Kind::Counter);
    s.tags.each(&mut |k, _, v| {
        o.sample(tags, &[("iface", iface), ("event", k)], v);
    });
    o.family("netlane_lb_tags_in_use", "Tags held now.", Kind::Gauge).sample(
        "netlane_lb_tags_in_use",
        &[("iface", iface)],
        s.tags_in_use,
    );
    o.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_text_has_help_type_and_escaped_labels() {
        let s = LbStats {
            iface: "eth\"0".into(),
            attach_mode: "native".into(),
            hints: "off".into(),
            global: [("tx".to_string(), 5u64)].into_iter().collect(),
            vips: vec![VipStats {
                vip: "10.0.0.1:80/tcp".into(),
                packets: 3,
                bytes: 300,
                reals: vec![RealStats { address: "10.1.0.1".into(), weight: 2, packets: 3, bytes: 300 }],
            }],
            tags: TagStats::default(),
            tags_in_use: 0,
        };
        let t = render_prometheus(&s);
        assert!(t.contains("netlane_lb_packets_total{iface=\"eth\\\"0\",counter=\"tx\"} 5\n"), "{t}");
        assert!(t.contains(
            "netlane_lb_real_bytes_total{iface=\"eth\\\"0\",vip=\"10.0.0.1:80/tcp\",real=\"10.1.0.1\"} 300\n"
        ));
        // Every sample's metric has a TYPE line before it.
        for line in t.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split('{').next().unwrap();
            assert!(t.contains(&format!("# TYPE {name} ")), "no TYPE for {name}");
        }
    }
}

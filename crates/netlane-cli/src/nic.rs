//! `netlane nic show`: a network device as the lab would use it.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use netlane::nic::{NicView, Readout};

use crate::out::{self, OutputArgs};

/// Network devices.
#[derive(Debug, Subcommand)]
pub enum NicCmd {
    /// What the lab would use of a device: its queues, each NAPI instance with its
    /// interrupt and thread and their CPUs, threaded NAPI, channels, ring sizes,
    /// interrupt coalescing, the offloads fast paths depend on, what its driver does for
    /// XDP (native XDP, AF_XDP zero-copy, receive metadata) and its XPS maps. Read only.
    Show(ShowArgs),
}

/// `netlane nic show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The device (in this network namespace).
    pub dev: String,
    #[command(flatten)]
    pub out: OutputArgs,
}

/// Runs a `nic` command.
pub fn run(cmd: NicCmd) -> Result<u8> {
    match cmd {
        NicCmd::Show(a) => show(&a).map(|()| 0),
    }
}

fn show(a: &ShowArgs) -> Result<()> {
    a.out.validate()?;
    let v = netlane::nic::show(&a.dev).with_context(|| format!("read device {}", a.dev))?;
    if !a.out.json_to_stdout() {
        out::print(&lines(&v).join("\n"));
        out::println("");
    }
    a.out.write_json(&netlane_report::document("nic-show", v))
}

fn readout<T>(r: &Readout<T>, show: impl Fn(&T) -> String) -> String {
    match (&r.value, &r.unavailable) {
        (Some(v), _) => show(v),
        (None, Some(why)) => format!("unavailable: {why}"),
        (None, None) => "unavailable".into(),
    }
}

fn lines(v: &NicView) -> Vec<String> {
    let mut l = vec![format!(
        "{} (index {}, driver {}): {} receive and {} transmit queues, threaded NAPI {}",
        v.ifname,
        v.ifindex,
        v.driver.as_deref().unwrap_or("none: a virtual device"),
        v.rx_queues,
        v.tx_queues,
        v.threaded_napi.map_or("unknown", |t| if t { "on" } else { "off" })
    )];
    for n in &v.napis {
        l.push(format!(
            "  NAPI {}: IRQ {} on CPUs {}, thread {} on CPUs {}",
            n.id,
            n.irq.map_or("none".into(), |i| i.to_string()),
            n.irq_cpus.as_deref().unwrap_or("-"),
            n.thread.map_or("none".into(), |t| t.to_string()),
            n.thread_cpus.as_deref().unwrap_or("-")
        ));
    }
    for (group, r) in &v.groups {
        let values = |m: &netlane::topology::ethtool::Values| {
            m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
        };
        l.push(format!("  {group}: {}", readout(r, values)));
    }
    l.push(format!(
        "  offloads on: {}",
        if v.features_on.is_empty() { "none".into() } else { v.features_on.join(", ") }
    ));
    l.push(format!(
        "  XDP: {}",
        readout(&v.xdp, |x| format!(
            "native {}; receive metadata {}{}",
            if x.actions.is_empty() { "not supported (generic only)".into() } else { x.actions.join(", ") },
            if x.rx_metadata.is_empty() { "none".into() } else { x.rx_metadata.join(", ") },
            x.zc_max_segs.map_or(String::new(), |s| format!("; zero-copy frames of up to {s} fragments"))
        ))
    ));
    if !v.xps_cpus.is_empty() {
        let maps: Vec<String> = v.xps_cpus.iter().map(|(q, m)| format!("tx-{q}={m}")).collect();
        l.push(format!("  XPS CPU masks: {}", maps.join(" ")));
    }
    l
}

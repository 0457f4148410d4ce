//! `netlane nic show`: a network device as the lab would use it.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use netlane::cpus::CpuList;
use netlane::nic::{NicView, Readout};
use netlane::topology::ethtool::{Group, Values};

use crate::out::{self, OutputArgs};

/// Network devices.
#[derive(Debug, Subcommand)]
pub enum NicCmd {
    /// What the lab would use of a device: its queues, each NAPI instance with its
    /// interrupt and thread and their CPUs, threaded NAPI, channels, ring sizes,
    /// interrupt coalescing, the offloads fast paths depend on, what its driver does for
    /// XDP (native XDP, AF_XDP zero-copy, receive metadata) and its XPS maps. Read only.
    Show(ShowArgs),
    /// Which settings a device takes: applies each (channels, ring sizes, coalescing,
    /// an interrupt's CPUs), says what it reads back or the kernel's reason for refusing
    /// it, then puts everything back and shows that it is as it was. Needs root.
    Try(TryArgs),
}

/// `netlane nic try`.
#[derive(Debug, Args)]
pub struct TryArgs {
    /// The device (in this network namespace).
    pub dev: String,
    /// A setting: GROUP.NAME=VALUE, GROUP one of channels (rx, tx, other, combined), rings
    /// (rx, rx-mini, rx-jumbo, tx) or coalesce (rx-usecs, rx-frames, tx-usecs, tx-frames,
    /// adaptive-rx, adaptive-tx: on or off). Repeat for more.
    #[arg(long = "set", value_name = "GROUP.NAME=VALUE", value_parser = parse_setting)]
    pub set: Vec<(Group, String, u32)>,
    /// An interrupt's CPUs: IRQ=CPUS (a CPU list). Repeat for more.
    #[arg(long = "irq", value_name = "IRQ=CPUS", value_parser = parse_irq)]
    pub irq: Vec<(u32, CpuList)>,
    #[command(flatten)]
    pub out: OutputArgs,
}

fn parse_setting(s: &str) -> Result<(Group, String, u32), String> {
    let (key, value) = s.split_once('=').ok_or_else(|| format!("{s:?}: expected GROUP.NAME=VALUE"))?;
    let (group, name) = key.split_once('.').ok_or_else(|| format!("{key:?}: expected GROUP.NAME"))?;
    let group = Group::ALL
        .into_iter()
        .find(|g| g.name() == group)
        .ok_or_else(|| format!("{group:?}: not a group (channels, rings or coalesce)"))?;
    if !group.can_set(name) {
        return Err(format!("{name:?} is not a setting of {group} (it has {})", group.settable()));
    }
    let value = match value {
        "on" => 1,
        "off" => 0,
        v => v.parse::<u32>().map_err(|_| format!("{v:?}: a number (or on, off)"))?,
    };
    if name.starts_with("adaptive-") && value > 1 {
        return Err(format!("{name} {value}: on or off (1 or 0)"));
    }
    Ok((group, name.to_string(), value))
}

fn parse_irq(s: &str) -> Result<(u32, CpuList), String> {
    let (irq, cpus) = s.split_once('=').ok_or_else(|| format!("{s:?}: expected IRQ=CPUS"))?;
    let irq = irq.parse::<u32>().map_err(|_| format!("{irq:?}: not an interrupt number"))?;
    Ok((irq, netlane::cpus::parse_online(cpus)?))
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
        NicCmd::Try(a) => try_settings(&a),
    }
}

/// Exits 1 when something was not put back (its record stays for `netlane clean`).
fn try_settings(a: &TryArgs) -> Result<u8> {
    a.out.validate()?;
    if a.set.is_empty() && a.irq.is_empty() {
        anyhow::bail!("nothing to try: give --set or --irq");
    }
    let mut groups: Vec<(Group, Values)> = Vec::new();
    for (g, name, v) in &a.set {
        match groups.iter_mut().find(|(have, _)| have == g) {
            Some((_, values)) => {
                values.insert(name.clone(), *v);
            }
            None => groups.push((*g, Values::from([(name.clone(), *v)]))),
        }
    }
    let tried = netlane::nic::try_settings(&a.dev, &groups, &a.irq);
    if !a.out.json_to_stdout() {
        for o in &tried.outcomes {
            out::println(&o.to_string());
        }
        for p in &tried.put_back {
            out::println(&format!(
                "{}: {} {}",
                p.what,
                if p.restored() { "put back to" } else { "NOT put back: reads" },
                if p.restored() { p.before.clone() } else { format!("{} (was {})", p.now, p.before) }
            ));
        }
    }
    let failed = tried.put_back.iter().filter(|p| !p.restored()).count();
    a.out.write_json(&netlane_report::document("nic-try", tried))?;
    if failed > 0 {
        anyhow::bail!("{failed} settings were not put back (netlane clean tries again)");
    }
    Ok(0)
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
    if let Some(why) = &v.napis_unavailable {
        l.push(format!("  NAPI instances: unavailable: {why}"));
    }
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

//! `netlane nic show`: a network device as the lab would use it.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use netlane::cpus::CpuList;
use netlane::nic::{Bottleneck, FileSetting, NicView, PacingQdisc, Readout, RssSetting, RssTable, Settings};
use netlane::topology::ethtool::{Group, Values};
use netlane_report::options::parse_positive_duration;

use crate::out::{self, OutputArgs};

/// Network devices.
#[derive(Debug, Subcommand)]
pub enum NicCmd {
    /// What the lab would use of a device: its queues, each NAPI instance with its
    /// interrupt and thread and their CPUs, threaded NAPI, channels, ring sizes,
    /// interrupt coalescing, the offloads fast paths depend on, what its driver does for
    /// XDP (native XDP, AF_XDP zero-copy, receive metadata), its XPS maps, its RSS
    /// indirection table and hash key, and its root qdisc. Read only.
    Show(ShowArgs),
    /// Which settings a device takes: applies each (channels, ring sizes, coalescing,
    /// an interrupt's CPUs, threaded NAPI, XPS, RSS, a bottleneck), says what it reads back or the kernel's reason for refusing
    /// it, then puts everything back and shows that it is as it was. Needs root.
    Try(TryArgs),
    /// Applies settings as `try` does and holds them until SIGINT or SIGTERM (the lab
    /// holds a testbed server's NIC settings so, under `netlane role`, whose session's
    /// end stops it), then puts everything back and shows that it is as it was. Needs
    /// root.
    Hold(HoldArgs),
}

/// `netlane nic hold`.
#[derive(Debug, Args)]
pub struct HoldArgs {
    /// The settings, as `try` takes them.
    #[command(flatten)]
    pub settings: TryArgs,
    /// Every interrupt of the device on these CPUs, one CPU each in turn (a CPU list;
    /// wrapping): its NAPI instances' interrupts, or its MSI vectors where the kernel
    /// does not say which NAPI instance has which.
    #[arg(long, value_name = "CPUS", value_parser = netlane::cpus::parse_online)]
    pub irqs: Option<CpuList>,
}

/// `netlane nic try`.
#[derive(Debug, Args)]
pub struct TryArgs {
    /// The device (in this network namespace).
    pub dev: String,
    /// A setting: GROUP.NAME=VALUE, GROUP one of channels (rx, tx, other, combined), rings
    /// (rx, rx-mini, rx-jumbo, tx) or coalesce (rx-usecs, rx-frames, tx-usecs, tx-frames,
    /// adaptive-rx, adaptive-tx: on or off). Repeat for more.
    #[arg(long = "set", value_name = "GROUP.NAME=VALUE", value_parser = Group::parse_setting)]
    pub set: Vec<(Group, String, u32)>,
    /// An interrupt's CPUs: IRQ=CPUS (a CPU list). Repeat for more.
    #[arg(long = "irq", value_name = "IRQ=CPUS", value_parser = parse_irq)]
    pub irq: Vec<(u32, CpuList)>,
    /// NAPI polled by kernel threads (on) or in softirq context (off).
    #[arg(long, value_name = "on|off", value_parser = parse_on_off)]
    pub threaded: Option<bool>,
    /// XPS by CPU: transmit queue i taken by the i-th CPU of this list (in turn, wrapping).
    #[arg(long, value_name = "CPUS", value_parser = netlane::cpus::parse_online, conflicts_with = "xps_rxqs")]
    pub xps: Option<CpuList>,
    /// XPS by receive queue (symmetric queues): transmit queue i taken by sockets whose
    /// packets arrive on receive queue i.
    #[arg(long)]
    pub xps_rxqs: bool,
    /// A token-bucket bottleneck as the device's root qdisc: RATE,BURST,QUEUE (a byte
    /// rate, bytes of bucket, bytes of queue beyond which packets are dropped; e.g.
    /// 25MB/s,16K,32K). Removed again afterwards (the device's default qdisc returns).
    #[arg(long, value_name = "RATE,BURST,QUEUE", value_parser = parse_tbf)]
    pub tbf: Option<Bottleneck>,
    /// A pacing qdisc as the device's root qdisc: fq (SO_TXTIME release times on
    /// CLOCK_MONOTONIC, and SO_MAX_PACING_RATE per socket) or etf[:DELTA] (release times
    /// on CLOCK_TAI, each packet dequeued DELTA before its time, 1ms unless given). etf
    /// drops every packet without such a time: ARP, TCP (ssh too), any unpaced sender;
    /// use it on a device only release-timed traffic leaves by. With --tbf it goes under
    /// the bottleneck. Removed again afterwards.
    #[arg(long, value_name = "fq|etf[:DELTA]", value_parser = parse_pacing_qdisc)]
    pub qdisc: Option<PacingQdisc>,
    /// RSS: the indirection table spread evenly over the first N receive queues (as
    /// `ethtool -X DEV equal N`).
    #[arg(long, value_name = "N", conflicts_with = "rss_weights")]
    pub rss_equal: Option<u32>,
    /// RSS: receive queue i given a share of the indirection table in proportion to
    /// the i-th weight (as `ethtool -X DEV weight W0 W1 ...`), e.g. 1,1,0,2.
    #[arg(long, value_name = "W0,W1,...", value_delimiter = ',')]
    pub rss_weights: Option<Vec<u32>>,
    /// RSS: the hash key, its bytes in hexadecimal (6d:5a:56:..., as `ethtool -x` shows
    /// it), of the device's key size.
    #[arg(long, value_name = "HEX", value_parser = parse_rss_key)]
    pub rss_key: Option<RssKey>,
    #[command(flatten)]
    pub out: OutputArgs,
}

impl TryArgs {
    /// What these arguments ask of the device, interrupts besides `irqs` included.
    fn settings(&self, irqs: Vec<(u32, CpuList)>) -> Result<Settings> {
        let mut files = Vec::new();
        if let Some(on) = self.threaded {
            files.push(FileSetting::threaded_napi(on));
        }
        if let Some(cpus) = &self.xps {
            files.extend(netlane::nic::xps_cpus(&self.dev, cpus).map_err(anyhow::Error::msg).context("--xps")?);
        }
        if self.xps_rxqs {
            files.extend(netlane::nic::xps_rxqs(&self.dev).map_err(anyhow::Error::msg).context("--xps-rxqs")?);
        }
        let table = match (self.rss_equal, &self.rss_weights) {
            (Some(n), _) => Some(RssTable::Equal(n)),
            (None, Some(w)) => Some(RssTable::Weights(w.clone())),
            (None, None) => None,
        };
        let rss = (table.is_some() || self.rss_key.is_some())
            .then(|| RssSetting { table, key: self.rss_key.clone().map(|k| k.0) });
        Ok(Settings { groups: groups(&self.set), irqs, files, bottleneck: self.tbf, pacing_qdisc: self.qdisc, rss })
    }
}

/// An RSS hash key's bytes (one value to clap, not a list of bytes).
#[derive(Debug, Clone)]
pub struct RssKey(Vec<u8>);

fn parse_rss_key(s: &str) -> Result<RssKey, String> {
    netlane::nic::parse_key(s).map(RssKey)
}

fn parse_pacing_qdisc(s: &str) -> Result<PacingQdisc, String> {
    let (kind, delta) = s.split_once(':').map_or((s, None), |(k, d)| (k, Some(d)));
    match (kind, delta) {
        ("fq", None) => Ok(PacingQdisc::Fq),
        ("fq", Some(_)) => Err("fq takes no DELTA (only etf does)".into()),
        ("etf", d) => {
            let delta = d.map_or(Ok(std::time::Duration::from_millis(1)), parse_positive_duration)?;
            let delta_ns = u32::try_from(delta.as_nanos())
                .ok()
                .filter(|ns| *ns <= i32::MAX as u32)
                .ok_or_else(|| format!("etf delta {}: at most about 2.1s", d.unwrap_or_default()))?;
            Ok(PacingQdisc::Etf { delta_ns })
        }
        _ => Err(format!("{s:?}: expected fq, etf or etf:DELTA")),
    }
}

fn parse_tbf(s: &str) -> Result<Bottleneck, String> {
    let parts: Vec<&str> = s.split(',').collect();
    let [rate, burst, queue] = parts[..] else {
        return Err(format!("{s:?}: expected RATE,BURST,QUEUE"));
    };
    let bytes = |what: &str, v: &str| {
        let n = netlane_report::options::parse_size(v)?;
        u32::try_from(n).ok().filter(|n| *n > 0).ok_or_else(|| format!("{what} {v}: 1 byte to 4 GiB"))
    };
    let rate = netlane_report::options::parse_rate(rate)?;
    if rate == 0 {
        return Err("a bottleneck of 0 B/s sends nothing".into());
    }
    Ok(Bottleneck { rate, burst: bytes("burst", burst)?, limit: bytes("queue", queue)? })
}

fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("{s:?}: expected on or off")),
    }
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
        NicCmd::Hold(a) => hold(&a),
    }
}

/// The settings of `set`, one entry per group.
fn groups(set: &[(Group, String, u32)]) -> Vec<(Group, Values)> {
    let mut groups: Vec<(Group, Values)> = Vec::new();
    for (g, name, v) in set {
        match groups.iter_mut().find(|(have, _)| have == g) {
            Some((_, values)) => {
                values.insert(name.clone(), *v);
            }
            None => groups.push((*g, Values::from([(name.clone(), *v)]))),
        }
    }
    groups
}

/// Exits 1 when something was not put back (its record stays for `netlane clean`).
fn try_settings(a: &TryArgs) -> Result<u8> {
    a.out.validate()?;
    let settings = a.settings(a.irq.clone())?;
    if settings.is_empty() {
        anyhow::bail!(
            "nothing to try: give --set, --irq, --threaded, --xps, --xps-rxqs, --tbf, --qdisc or an --rss option"
        );
    }
    let tried = netlane::nic::try_settings(&a.dev, &settings);
    report_tried(&a.out, "nic-try", tried)
}

/// Holds until stopped; exits 1 when something was not put back.
fn hold(a: &HoldArgs) -> Result<u8> {
    let s = &a.settings;
    s.out.validate()?;
    let mut irqs = s.irq.clone();
    if let Some(cpus) = &a.irqs {
        // Each interrupt once, and not one --irq already places.
        let mut of_device = device_irqs(&s.dev)?;
        of_device.sort_unstable();
        of_device.dedup();
        of_device.retain(|irq| !s.irq.iter().any(|(given, _)| given == irq));
        irqs.extend(
            of_device
                .into_iter()
                .enumerate()
                .filter_map(|(i, irq)| cpus.nth_wrapping(i).map(|c| (irq, CpuList::one(c)))),
        );
    }
    let settings = s.settings(irqs)?;
    if settings.is_empty() {
        anyhow::bail!(
            "nothing to hold: give --set, --irq, --irqs, --threaded, --xps, --xps-rxqs, --tbf, --qdisc or an --rss option"
        );
    }
    let holding = netlane::nic::hold_settings(&s.dev, &settings);
    for o in &holding.outcomes {
        eprintln!("{o}");
    }
    let refused = holding.outcomes.iter().filter(|o| o.refused.is_some()).count();
    let applied = holding.outcomes.len() - refused;
    eprintln!("holding {applied} settings of {} ({refused} refused) until SIGINT or SIGTERM", s.dev);
    while !crate::signals::STOP.wait(std::time::Duration::from_secs(3600)) {}
    report_tried(&s.out, "nic-hold", holding.put_back())
}

/// The interrupts of `dev`: its NAPI instances' (netdev netlink), or where the kernel
/// does not say (before Linux 6.8), its PCI device's MSI vectors.
fn device_irqs(dev: &str) -> Result<Vec<u32>> {
    let v = netlane::nic::show(dev).with_context(|| format!("read device {dev}"))?;
    let napi: Vec<u32> = v.napis.iter().filter_map(|n| n.irq).collect();
    if !napi.is_empty() {
        return Ok(napi);
    }
    // The device's own, or its parent's: a virtio device's vectors are its PCI
    // transport's.
    let mut msi: Vec<u32> = ["device/msi_irqs", "device/../msi_irqs"]
        .iter()
        .find_map(|d| std::fs::read_dir(format!("/sys/class/net/{dev}/{d}")).ok())
        .map(|entries| entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default();
    msi.sort_unstable();
    if msi.is_empty() {
        anyhow::bail!(
            "--irqs: {dev} has no interrupts to move ({})",
            v.napis_unavailable.as_deref().unwrap_or("no NAPI instance has one, and it has no MSI vectors")
        );
    }
    Ok(msi)
}

/// Prints what was tried and put back, writes it as `kind`; exits 1 when something was
/// not put back.
fn report_tried(out: &OutputArgs, kind: &str, tried: netlane::nic::Tried) -> Result<u8> {
    let a = out;
    if !a.json_to_stdout() {
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
    a.write_json(&netlane_report::document(kind, tried))?;
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
        let knob = |v: Option<u64>| v.map_or("?".into(), |v| v.to_string());
        l.push(format!(
            "  NAPI {}: IRQ {} on CPUs {}, thread {} on CPUs {}; defer-hard-irqs {}, gro-flush-timeout {} ns, \
             irq-suspend-timeout {} ns",
            n.id,
            n.irq.map_or("none".into(), |i| i.to_string()),
            n.irq_cpus.as_deref().unwrap_or("-"),
            n.thread.map_or("none".into(), |t| t.to_string()),
            n.thread_cpus.as_deref().unwrap_or("-"),
            knob(n.defer_hard_irqs.map(u64::from)),
            knob(n.gro_flush_timeout_ns),
            knob(n.irq_suspend_timeout_ns)
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
    l.push(format!("  RSS: {}", readout(&v.rss, |r| r.to_string())));
    l.push(format!(
        "  root qdisc: {}",
        readout(&v.root_qdisc, |q| format!(
            "{} ({} packets, {} bytes sent, {} dropped, {} times over its limit)",
            q.kind, q.stats.packets, q.stats.bytes, q.stats.drops, q.stats.overlimits
        ))
    ));
    l
}

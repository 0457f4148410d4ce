//! `netlane lb`: run the XDP load balancer on an interface, check a configuration, or
//! decapsulate on a real. Arguments in, `netlane_lb::server` calls, output.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::documents::{LbCheck, LbRun};
use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use netlane_lb::server::{self, Event, ServeOptions};
use netlane_lb::{HintMode, HintSource, LbOptions, LbStats};
use netlane_report::options::parse_positive_duration;
use netlane_report::{Column, Row, Table, Value, terminal};

use crate::out::{self, OutputArgs};
use crate::signals::STOP;

#[derive(Debug, Subcommand)]
pub enum LbCmd {
    /// Run the balancer on an interface until SIGINT/SIGTERM (or --time); then print the
    /// last counters and exit 0. The configuration file is re-read whenever it changes:
    /// reals are added, removed and reweighted live.
    Run(Box<RunArgs>),
    /// Validate a configuration and show each VIP's ring shares.
    Check(CheckArgs),
    /// On a real: strip the balancer's IPIP / IPv6 outer header in XDP (for kernels
    /// without the ipip/ip6_tunnel modules) until SIGINT/SIGTERM or --time. The VIP must
    /// be an address of the real (on lo) and the real must answer from it (direct return).
    Decap(DecapArgs),
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The TOML configuration.
    config: PathBuf,
    #[command(flatten)]
    out: OutputArgs,
}

#[derive(Debug, Args)]
pub struct DecapArgs {
    /// Interface the encapsulated packets arrive on.
    #[arg(long)]
    iface: String,
    /// Attach in generic (skb) mode instead of native.
    #[arg(long)]
    generic: bool,
    /// Stop after this long.
    #[arg(short = 't', long, value_parser = parse_positive_duration)]
    time: Option<Duration>,
}

fn parse_hints(s: &str) -> Result<HintMode, String> {
    HintMode::from_name(s).ok_or_else(|| format!("{s:?}: use one of {}", HintMode::names()))
}

fn parse_source(s: &str) -> Result<HintSource, String> {
    match s {
        "kfunc" => Ok(HintSource::Kfunc),
        "metadata" => Ok(HintSource::Metadata),
        _ => Err(format!("{s:?}: use kfunc or metadata")),
    }
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The TOML configuration (VIPs, reals, weights, flags).
    #[arg(long)]
    config: PathBuf,
    /// Interface to attach to (in this process's network namespace).
    #[arg(long)]
    iface: String,
    /// MAC address of the next hop towards the reals (aa:bb:cc:dd:ee:ff).
    #[arg(long, conflicts_with = "gateway")]
    gateway_mac: Option<String>,
    /// IPv4 address of the next hop; its MAC is taken from the ARP table.
    #[arg(long)]
    gateway: Option<Ipv4Addr>,
    /// Outer IPv4 source base (its low 16 bits vary by flow, for the reals' RSS).
    #[arg(long, default_value = "172.16.0.0")]
    src4: Ipv4Addr,
    /// Outer IPv6 source base (its last 32 bits vary by flow).
    #[arg(long, default_value = "fd00:4c42::")]
    src6: Ipv6Addr,
    /// Hints: off, rx-hash (per-CPU flow cache), flow-tag, dest-tag, or dest-tag-direct
    /// (destination tags that skip the transport header: the classifier must match
    /// the VIP's port).
    #[arg(long, default_value = "off", value_parser = parse_hints)]
    hints: HintMode,
    /// Where hints come from: kfunc (the NIC's RX hash; device-bound, native only) or
    /// metadata (4 bytes of XDP metadata before the frame).
    #[arg(long, default_value = "kfunc", value_parser = parse_source)]
    hint_source: HintSource,
    /// Attach in generic (skb) mode instead of native.
    #[arg(long)]
    generic: bool,
    /// Tag modes: the interface whose egress classifies flows (the NIC classifier,
    /// emulated with a TCX program on the side that sends to the balancer).
    #[arg(long)]
    classifier_iface: Option<String>,
    /// Network namespace (under /run/netns) of --classifier-iface.
    #[arg(long, requires = "classifier_iface")]
    classifier_netns: Option<String>,
    /// Per-flow tags (and classifier rules) at most.
    #[arg(long, default_value_t = 65536)]
    max_tags: u32,
    /// Room for VIPs (the maps are sized once).
    #[arg(long, default_value_t = 64)]
    max_vips: u32,
    /// Room for reals, across VIPs.
    #[arg(long, default_value_t = 1024)]
    max_reals: u32,
    /// Between statistics lines (and file updates).
    #[arg(long, default_value = "5s", value_parser = stats_interval)]
    stats_interval: Duration,
    /// Write the statistics as JSON here (every interval and at exit).
    #[arg(long)]
    stats_json: Option<PathBuf>,
    /// Write the statistics in Prometheus text format here (textfile collector).
    #[arg(long)]
    prometheus: Option<PathBuf>,
    /// Serve /metrics (Prometheus) and /stats (JSON) over HTTP on this loopback address.
    #[arg(long)]
    metrics_addr: Option<SocketAddr>,
    /// Stop after this long.
    #[arg(short = 't', long, value_parser = parse_positive_duration)]
    time: Option<Duration>,
    /// Print the last counters as JSON to FILE, or to stdout with `-` (then everything
    /// else goes to stderr).
    #[arg(long, value_name = "FILE|-", num_args = 0..=1, default_missing_value = "-")]
    json: Option<PathBuf>,
}

/// A statistics interval: positive, at most a day.
fn stats_interval(s: &str) -> Result<Duration, String> {
    let d = parse_positive_duration(s)?;
    if d > Duration::from_secs(86_400) {
        return Err(format!("{s}: at most a day"));
    }
    Ok(d)
}

fn parse_mac(s: &str) -> Result<[u8; 6]> {
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        bail!("MAC address {s:?} is not six hex bytes separated by ':'");
    }
    let mut mac = [0u8; 6];
    for (m, p) in mac.iter_mut().zip(parts) {
        *m = u8::from_str_radix(p, 16).with_context(|| format!("MAC address {s:?}: {p:?} is not a hex byte"))?;
    }
    Ok(mac)
}

/// The MAC of `ip` from this namespace's ARP table.
fn arp_mac(ip: Ipv4Addr) -> Result<[u8; 6]> {
    let table = std::fs::read_to_string("/proc/net/arp").context("read /proc/net/arp")?;
    for line in table.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() >= 4 && f[0].parse::<Ipv4Addr>().ok() == Some(ip) && f[3] != "00:00:00:00:00:00" {
            return parse_mac(f[3]);
        }
    }
    bail!("no ARP entry for gateway {ip}: ping it first, or give --gateway-mac")
}

impl RunArgs {
    fn options(&self) -> Result<ServeOptions> {
        if self.hints.tags() && self.classifier_iface.is_none() && self.hint_source == HintSource::Kfunc {
            bail!("--hints {}: give --classifier-iface (the interface whose egress marks flows)", self.hints.name());
        }
        let gw_mac = match (&self.gateway_mac, self.gateway) {
            (Some(m), _) => parse_mac(m)?,
            (None, Some(ip)) => arp_mac(ip)?,
            (None, None) => bail!("give --gateway-mac or --gateway (the next hop towards the reals)"),
        };
        let mut o = LbOptions::new(&self.iface, gw_mac);
        o.src4 = self.src4;
        o.src6 = self.src6;
        o.hint = self.hints;
        o.hint_source = self.hint_source;
        o.force_generic = self.generic;
        o.max_tags = self.max_tags;
        o.max_vips = self.max_vips;
        o.max_reals = self.max_reals;
        Ok(ServeOptions {
            config: self.config.clone(),
            lb: o,
            classifier: self.classifier_iface.clone().map(|i| (i, self.classifier_netns.clone(), self.max_tags)),
            stats_interval: self.stats_interval,
            stats_json: self.stats_json.clone(),
            prometheus: self.prometheus.clone(),
            metrics_addr: self.metrics_addr,
            time: self.time,
        })
    }
}

fn stats_line(s: &LbStats, secs: f64) -> String {
    let g = |k: &str| s.global.get(k).copied().unwrap_or(0);
    format!(
        "[{secs:>7.1}s] tx {} pass {} drop {} conn hit/miss {}/{} hints hit/miss/stale {}/{}/{} tags {}",
        g("tx"),
        g("pass_non_ip") + g("pass_non_vip"),
        g("drop_malformed") + g("drop_ip_options") + g("drop_fragment") + g("drop_no_real") + g("drop_encap"),
        g("conn_hit"),
        g("conn_miss"),
        g("hint_hit"),
        g("hint_miss"),
        g("hint_stale"),
        s.tags_in_use
    )
}

/// Prints an event: results (the statistics lines) on stdout unless JSON goes there,
/// what the server is doing on stderr.
fn show(e: Event<'_>, quiet: bool, iface: &str) {
    let say = |line: String| {
        if quiet { eprintln!("{line}") } else { out::println(&line) }
    };
    match e {
        Event::Starting(what) => eprintln!("netlane lb: {what}"),
        Event::Attached { mode, native_error } => say(format!(
            "netlane lb: attached to {iface} in {} mode{}",
            mode.name(),
            native_error.map(|e| format!(" (native failed: {e})")).unwrap_or_default()
        )),
        Event::Config(c) => {
            for v in &c.vips {
                say(format!("  {} -> {} reals", v.name(), v.reals.len()));
            }
        }
        Event::Metrics(a) => say(format!("netlane lb: metrics on http://{a}/metrics and /stats")),
        Event::Stats(s, secs) => say(stats_line(s, secs)),
        Event::Applied(changes) => {
            say("netlane lb: applied the changed configuration".into());
            if changes.is_empty() {
                say("  no change".into());
            }
            for c in changes {
                let list = |v: &[IpAddr]| v.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
                say(format!(
                    "  {}: +[{}] -[{}] reweighted [{}]; {} ring slots moved",
                    c.vip,
                    list(&c.added),
                    list(&c.removed),
                    list(&c.reweighted),
                    c.slots_moved
                ));
            }
        }
        Event::Kept(why) => eprintln!("netlane lb: kept the running configuration: {why}"),
        Event::Trouble { what, held_back } => eprintln!(
            "netlane lb: {what} (still forwarding{})",
            if held_back > 0 { format!("; {held_back} more failures since the last shown") } else { String::new() }
        ),
    }
}

fn run_lb(a: &RunArgs) -> Result<()> {
    let out = OutputArgs { json: a.json.clone(), csv: None };
    out.validate()?;
    let mut opts = a.options()?;
    server::check(&opts)?;
    let quiet = out.json_to_stdout();
    let start = Instant::now();
    let mode = Arc::new(Mutex::new(String::new()));
    // The supervisor owns the time: the balancer serves until it is stopped.
    let time = opts.time.take();
    let server = server::Server::start(opts, {
        let (mode, iface) = (mode.clone(), a.iface.clone());
        move |e| {
            if let (Event::Attached { mode: m, .. }, Ok(mut mode)) = (&e, mode.lock()) {
                *mode = m.name().to_string();
            }
            show(e, quiet, &iface)
        }
    })?;
    let (_, stats) = netlane::serve::supervise(server, &STOP, time);
    let stats = stats?;
    let mode = mode.lock().map(|m| m.clone()).unwrap_or_default();
    let secs = start.elapsed().as_secs_f64();
    let line = format!("netlane lb: detached from {} after {secs:.1} s", a.iface);
    if quiet {
        eprintln!("{line}")
    } else {
        out::println(&line)
    }
    out.write_json(&netlane_report::document("lb-run", LbRun { seconds: secs, stats: Some(stats), mode }))
}

fn check(a: &CheckArgs) -> Result<()> {
    a.out.validate()?;
    let config = netlane_lb::server::read_config(&a.config)?;
    let vips = config.shares()?;
    let mut t = Table::new(
        "lb-check",
        format!("{}: valid; {} ring slots per VIP", a.config.display(), config.ring_size),
        vec![
            Column::new("vip", "VIP", 0),
            Column::new("real", "real", 0),
            Column::new("weight", "weight", 0),
            Column::new("slots", "slots", 0),
            Column::new("share_pct", "share %", 2),
        ],
    );
    for v in &vips {
        let name = if v.no_lru { format!("{} (no LRU)", v.vip) } else { v.vip.clone() };
        for r in &v.reals {
            t.push(Row::new(vec![
                Value::text(&name),
                Value::text(r.address.to_string()),
                Value::Int(u64::from(r.weight)),
                Value::Int(r.slots as u64),
                Value::num(r.share_pct),
            ]));
        }
    }
    let doc = netlane_report::document(
        "lb-check",
        LbCheck {
            config: a.config.display().to_string(),
            ring_size: config.ring_size,
            conn_entries: config.conn_entries,
            vips,
        },
    );
    if !a.out.json_to_stdout() {
        out::print(&terminal::table(&t));
    }
    // A real with weight but no slot gets no new flows: say so.
    for v in &doc.body.vips {
        for r in v.reals.iter().filter(|r| r.slots == 0 && r.weight > 0) {
            eprintln!(
                "warning: VIP {}: real {} (weight {}) gets no ring slot and so no new flows; raise its weight or ring_size",
                v.vip, r.address, r.weight
            );
        }
    }
    a.out.write_json(&doc)?;
    a.out.write_tables(&doc.provenance.run_id, &[t])
}

fn decap(a: &DecapArgs) -> Result<()> {
    let mode = server::decap(&a.iface, a.generic, &STOP, a.time, &mut |e| match e {
        Event::Attached { mode, native_error: Some(why) } => {
            eprintln!("netlane lb: native XDP failed on {} ({why}); attached in {} mode", a.iface, mode.name())
        }
        Event::Starting(what) => eprintln!("netlane lb: {what}"),
        _ => {}
    })?;
    out::println(&format!("netlane lb: decapsulated on {} ({} mode) until stopped; detached", a.iface, mode.name()));
    Ok(())
}

/// Runs `netlane lb ...`.
pub fn run(cmd: LbCmd) -> Result<()> {
    match cmd {
        LbCmd::Run(a) => run_lb(&a),
        LbCmd::Check(a) => check(&a),
        LbCmd::Decap(a) => decap(&a),
    }
}

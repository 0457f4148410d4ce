//! `netlane lb`: run the XDP load balancer on an interface, or check a configuration.

use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use netlane_lb::proto::config::{Config, VipChange};
use netlane_lb::proto::maglev;
use netlane_lb::{HintMode, HintSource, Lb, LbOptions, TcClassifier, render_prometheus};

/// Set by the Ctrl-C handler while `netlane lb run` is running: stop cleanly.
pub static STOP: AtomicBool = AtomicBool::new(false);

#[derive(Debug, Subcommand)]
pub enum LbCmd {
    /// Run the balancer on an interface until Ctrl-C (or --duration). The configuration
    /// file is re-read whenever it changes: reals are added, removed and reweighted live.
    Run(Box<RunArgs>),
    /// Validate a configuration and show each VIP's ring shares.
    Check {
        /// The TOML configuration.
        config: PathBuf,
    },
    /// On a real: strip the balancer's IPIP / IPv6 outer header in XDP (for kernels
    /// without the ipip/ip6_tunnel modules) until Ctrl-C or --duration. The VIP must be
    /// an address of the real (on lo) and the real must answer from it (direct return).
    Decap {
        /// Interface the encapsulated packets arrive on.
        #[arg(long)]
        iface: String,
        /// Attach in generic (skb) mode instead of native.
        #[arg(long)]
        generic: bool,
        /// Stop after this many seconds.
        #[arg(long)]
        duration: Option<u64>,
    },
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
    /// Hints: off, rx-hash (per-CPU flow cache), flow-tag or dest-tag.
    #[arg(long, default_value = "off")]
    hints: String,
    /// Where hints come from: kfunc (the NIC's RX hash; device-bound, native only) or
    /// metadata (4 bytes of XDP metadata before the frame).
    #[arg(long, default_value = "kfunc")]
    hint_source: String,
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
    /// Seconds between statistics lines (and file updates).
    #[arg(long, default_value_t = 5.0)]
    stats_interval: f64,
    /// Write the statistics as JSON here (every interval and at exit).
    #[arg(long)]
    stats_json: Option<PathBuf>,
    /// Write the statistics in Prometheus text format here (textfile collector).
    #[arg(long)]
    prometheus: Option<PathBuf>,
    /// Serve /metrics (Prometheus) and /stats (JSON) over HTTP on this loopback address.
    #[arg(long)]
    metrics_addr: Option<SocketAddr>,
    /// Stop after this many seconds.
    #[arg(long)]
    duration: Option<f64>,
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

fn read_config(path: &Path) -> Result<Config> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    Config::parse(&text).with_context(|| format!("{}", path.display()))
}

fn mtime(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

fn print_changes(changes: &[VipChange]) {
    if changes.is_empty() {
        println!("  no change");
    }
    for c in changes {
        let list = |v: &[IpAddr]| v.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
        println!(
            "  {}: +[{}] -[{}] reweighted [{}]; {} ring slots moved",
            c.vip,
            list(&c.added),
            list(&c.removed),
            list(&c.reweighted),
            c.slots_moved
        );
    }
}

impl RunArgs {
    fn options(&self) -> Result<LbOptions> {
        let hint = HintMode::from_name(&self.hints)
            .with_context(|| format!("--hints {:?}: use off, rx-hash, flow-tag or dest-tag", self.hints))?;
        let hint_source = match self.hint_source.as_str() {
            "kfunc" => HintSource::Kfunc,
            "metadata" => HintSource::Metadata,
            s => bail!("--hint-source {s:?}: use kfunc or metadata"),
        };
        if !(self.stats_interval.is_finite() && self.stats_interval >= 0.1) {
            bail!("--stats-interval must be at least 0.1 s");
        }
        if let Some(d) = self.duration
            && !(d.is_finite() && d > 0.0)
        {
            bail!("--duration must be a positive number of seconds");
        }
        if let Some(a) = self.metrics_addr
            && !a.ip().is_loopback()
        {
            bail!("--metrics-addr {a}: serve metrics on a loopback address only");
        }
        if matches!(hint, HintMode::FlowTag | HintMode::DestTag)
            && self.classifier_iface.is_none()
            && hint_source == HintSource::Kfunc
        {
            bail!("--hints {}: give --classifier-iface (the interface whose egress marks flows)", hint.name());
        }
        let gw_mac = match (&self.gateway_mac, self.gateway) {
            (Some(m), _) => parse_mac(m)?,
            (None, Some(ip)) => arp_mac(ip)?,
            (None, None) => bail!("give --gateway-mac or --gateway (the next hop towards the reals)"),
        };
        let mut o = LbOptions::new(&self.iface, gw_mac);
        o.src4 = self.src4;
        o.src6 = self.src6;
        o.hint = hint;
        o.hint_source = hint_source;
        o.force_generic = self.generic;
        o.max_tags = self.max_tags;
        o.max_vips = self.max_vips;
        o.max_reals = self.max_reals;
        Ok(o)
    }
}

/// Serves the latest rendered statistics on `addr`: /metrics and /stats.
fn serve_metrics(addr: SocketAddr, latest: Arc<Mutex<(String, String)>>) -> Result<()> {
    let listener = TcpListener::bind(addr).with_context(|| format!("bind --metrics-addr {addr}"))?;
    std::thread::Builder::new().name("lb-metrics".into()).spawn(move || {
        for conn in listener.incoming().flatten() {
            let mut conn = conn;
            let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
            let mut req = [0u8; 1024];
            let n = conn.read(&mut req).unwrap_or(0);
            let line = String::from_utf8_lossy(&req[..n]);
            let path = line.split_whitespace().nth(1).unwrap_or("/");
            let (prom, json) = latest.lock().map(|g| g.clone()).unwrap_or_default();
            let (status, ctype, body) = match path {
                "/metrics" => ("200 OK", "text/plain; version=0.0.4", prom),
                "/stats" => ("200 OK", "application/json", json),
                _ => ("404 Not Found", "text/plain", "try /metrics or /stats\n".to_string()),
            };
            let _ = write!(
                conn,
                "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    })?;
    Ok(())
}

fn write_atomically(path: &Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).with_context(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("rename to {}", path.display()))
}

fn run_lb(a: &RunArgs) -> Result<()> {
    let opts = a.options()?;
    let mut config = read_config(&a.config)?;
    let mut seen = mtime(&a.config);
    let mut lb = Lb::start(&config, opts).context("start the balancer")?;
    println!(
        "netlane lb: attached to {} in {} mode{}; hints {}",
        a.iface,
        lb.mode().name(),
        lb.native_error().map(|e| format!(" (native failed: {e})")).unwrap_or_default(),
        lb.options().hint.name()
    );
    if let Some(ci) = &a.classifier_iface {
        let c = TcClassifier::attach(a.classifier_netns.as_deref(), ci, a.max_tags).context("attach the classifier")?;
        println!(
            "netlane lb: flow classifier on {}{} egress (TCX)",
            ci,
            a.classifier_netns.as_ref().map(|n| format!(" in {n}")).unwrap_or_default()
        );
        lb.set_classifier(Box::new(c));
    }
    for v in &config.vips {
        println!("  {} -> {} reals", v.name(), v.reals.len());
    }
    let latest = Arc::new(Mutex::new((String::new(), String::new())));
    if let Some(addr) = a.metrics_addr {
        serve_metrics(addr, latest.clone())?;
        println!("netlane lb: metrics on http://{addr}/metrics and /stats");
    }
    let start = Instant::now();
    let interval = Duration::from_secs_f64(a.stats_interval);
    let mut next_stats = start;
    let publish = |lb: &Lb, print: bool| -> Result<()> {
        let s = lb.stats()?;
        let json = serde_json::to_string_pretty(&s)?;
        let prom = render_prometheus(&s);
        if let Some(p) = &a.stats_json {
            write_atomically(p, &json)?;
        }
        if let Some(p) = &a.prometheus {
            write_atomically(p, &prom)?;
        }
        if print {
            let g = |k: &str| s.global.get(k).copied().unwrap_or(0);
            println!(
                "[{:>7.1}s] tx {} pass {} drop {} conn hit/miss {}/{} hints hit/miss/stale {}/{}/{} tags {}",
                start.elapsed().as_secs_f64(),
                g("tx"),
                g("pass_non_ip") + g("pass_non_vip"),
                g("drop_malformed") + g("drop_ip_options") + g("drop_fragment") + g("drop_no_real") + g("drop_encap"),
                g("conn_hit"),
                g("conn_miss"),
                g("hint_hit"),
                g("hint_miss"),
                g("hint_stale"),
                s.tags_in_use
            );
        }
        if let Ok(mut l) = latest.lock() {
            *l = (prom, json);
        }
        Ok(())
    };
    while !STOP.load(Ordering::Relaxed) {
        if a.duration.is_some_and(|d| start.elapsed().as_secs_f64() >= d) {
            break;
        }
        lb.service_events(Duration::from_millis(100))?;
        let now = mtime(&a.config);
        if now != seen {
            seen = now;
            match read_config(&a.config) {
                Ok(new) if new == config => {}
                Ok(new) => match lb.apply(&new) {
                    Ok(changes) => {
                        println!("netlane lb: applied {}", a.config.display());
                        print_changes(&changes);
                        config = new;
                    }
                    Err(e) => eprintln!("netlane lb: kept the running configuration: {e}"),
                },
                Err(e) => eprintln!("netlane lb: kept the running configuration: {e:#}"),
            }
        }
        if Instant::now() >= next_stats {
            publish(&lb, true)?;
            next_stats += interval;
        }
    }
    publish(&lb, true)?;
    println!("netlane lb: detached from {}", a.iface);
    Ok(())
}

fn check(path: &Path) -> Result<()> {
    let config = read_config(path)?;
    println!("{}: valid; ring {} slots per VIP", path.display(), config.ring_size);
    for v in &config.vips {
        let b = v.backends();
        let ring = maglev::build(&b, config.ring_size)?;
        let shares = maglev::shares(&ring, b.len());
        println!("  {}{}", v.name(), if v.no_lru { " (no LRU)" } else { "" });
        for (r, n) in v.reals.iter().zip(shares) {
            println!(
                "    {:<40} weight {:>4}  {:>6} slots ({:.2}%)",
                r.address.to_string(),
                r.weight,
                n,
                100.0 * n as f64 / f64::from(config.ring_size)
            );
        }
    }
    Ok(())
}

pub fn run(cmd: &LbCmd) -> Result<()> {
    match cmd {
        LbCmd::Run(a) => run_lb(a),
        LbCmd::Check { config } => check(config),
        LbCmd::Decap { iface, generic, duration } => decap(iface, *generic, *duration),
    }
}

fn decap(iface: &str, generic: bool, duration: Option<u64>) -> Result<()> {
    use netlane_lb::{Decap, XdpLink, XdpMode};
    if duration == Some(0) {
        bail!("--duration must be at least 1 second");
    }
    let ifindex = netlane_lb::if_index(iface)?;
    let prog = Decap::load().context("load the decapsulation program (root needed)")?;
    let link = if generic {
        XdpLink::attach(prog.program_fd(), ifindex, XdpMode::Generic)
            .with_context(|| format!("attach to {iface} (generic)"))?
    } else {
        let (l, native) = XdpLink::attach_native_or_generic(prog.program_fd(), ifindex)
            .with_context(|| format!("attach to {iface} (native, then generic)"))?;
        if let Some(e) = native {
            println!("native XDP failed on {iface} ({e}); attached in generic mode");
        }
        l
    };
    println!("decapsulating on {iface} ({} mode); Ctrl-C to stop", link.mode().name());
    let start = Instant::now();
    while !STOP.load(Ordering::Relaxed) && duration.is_none_or(|d| start.elapsed() < Duration::from_secs(d)) {
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(link);
    println!("detached from {iface}");
    Ok(())
}

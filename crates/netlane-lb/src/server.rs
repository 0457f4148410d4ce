//! `netlane lb run` and `netlane lb decap` as library calls: load, attach, serve until
//! told to stop, detach. The caller (the command line) sets the stop flag from its
//! signal handler and prints the [`Event`]s; nothing here prints.
//!
//! While serving, the configuration file is re-read whenever it changes (reals added,
//! removed and reweighted live; a bad file keeps the running configuration), new-flow
//! events become classifier tags, and statistics are published every interval: to
//! files (JSON and Prometheus text, written atomically) and over HTTP on a loopback
//! address (`/metrics`, `/stats`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use netlane::metrics::prom::{Handler, MetricsServer, TEXT_FORMAT, check_metrics_addr};
use netlane::ratelimit::RateLimit;

use crate::proto::config::{Config, MAX_CONFIG_BYTES, VipChange};
use crate::{Decap, Lb, LbError, LbOptions, LbStats, TcClassifier, XdpLink, XdpMode, if_index, render_prometheus};

/// What serving does.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The TOML configuration file (re-read when it changes).
    pub config: PathBuf,
    /// How to load and attach.
    pub lb: LbOptions,
    /// Tag modes: the interface whose egress classifies flows, its namespace (a name
    /// under /run/netns), and the most rules it holds.
    pub classifier: Option<(String, Option<String>, u32)>,
    /// Between statistics publications.
    pub stats_interval: Duration,
    /// Write statistics as JSON here.
    pub stats_json: Option<PathBuf>,
    /// Write statistics in Prometheus text format here.
    pub prometheus: Option<PathBuf>,
    /// Serve `/metrics` and `/stats` here (loopback only).
    pub metrics_addr: Option<SocketAddr>,
    /// Stop after this long.
    pub time: Option<Duration>,
}

/// What happens while serving, for the caller to show.
#[derive(Debug)]
pub enum Event<'a> {
    /// A step of starting up.
    Starting(&'a str),
    /// Attached: in which mode, and why native failed if it did.
    Attached {
        /// Native, generic or offloaded.
        mode: XdpMode,
        /// Why native mode failed (then generic was used).
        native_error: Option<&'a str>,
    },
    /// The configuration in force.
    Config(&'a Config),
    /// Metrics are served at this address.
    Metrics(SocketAddr),
    /// Periodic statistics, seconds since the start.
    Stats(&'a LbStats, f64),
    /// A changed configuration file was applied.
    Applied(&'a [VipChange]),
    /// A changed configuration file could not be applied: the running one stays.
    Kept(String),
    /// Servicing events or publishing statistics failed; the balancer keeps forwarding
    /// and tries again. Shown at most once per 10 s: `held_back` failures since the last
    /// one shown were not.
    Trouble {
        /// What failed.
        what: String,
        /// Failures not shown since the last one that was.
        held_back: u64,
    },
}

/// Reads the configuration (errors name the file): a regular file only (opened without blocking, so a FIFO or
/// device put in its place cannot stall the control loop), of at most
/// [`MAX_CONFIG_BYTES`].
pub fn read_config(path: &Path) -> Result<Config, LbError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(LbError::kernel(format!("open {}", path.display())))?;
    let meta = file.metadata().map_err(LbError::kernel(format!("stat {}", path.display())))?;
    if !meta.is_file() {
        return Err(LbError::Invalid(format!("{} is not a regular file", path.display())));
    }
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(LbError::Invalid(format!(
            "{} has {} bytes; a configuration may have at most {MAX_CONFIG_BYTES}",
            path.display(),
            meta.len()
        )));
    }
    let mut text = String::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(LbError::kernel(format!("read {}", path.display())))?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(LbError::Invalid(format!("{} grew past {MAX_CONFIG_BYTES} bytes", path.display())));
    }
    Config::parse(&text).map_err(|e| LbError::Invalid(format!("{}: {e}", path.display())))
}

fn mtime(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

fn write_atomically(path: &Path, text: &str) -> Result<(), LbError> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).map_err(LbError::kernel(format!("write {}", tmp.display())))?;
    std::fs::rename(&tmp, path).map_err(LbError::kernel(format!("rename to {}", path.display())))
}

/// Checks what can be checked before loading anything: the metrics address is
/// loopback, the configuration parses, the output files' directories exist.
pub fn check(opts: &ServeOptions) -> Result<Config, LbError> {
    if let Some(a) = opts.metrics_addr {
        check_metrics_addr(a).map_err(LbError::Invalid)?;
    }
    if opts.stats_interval < Duration::from_millis(100) {
        return Err(LbError::Invalid("--stats-interval must be at least 100ms".into()));
    }
    for p in [&opts.stats_json, &opts.prometheus].into_iter().flatten() {
        let dir = p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        if !dir.is_dir() {
            return Err(LbError::Invalid(format!("{}: directory {} does not exist", p.display(), dir.display())));
        }
    }
    read_config(&opts.config)
}

/// Loads and attaches the balancer, serves until `stop` is set or the time is up, and
/// detaches. Returns the last statistics.
pub fn serve(opts: &ServeOptions, stop: &AtomicBool, on: &mut dyn FnMut(Event<'_>)) -> Result<LbStats, LbError> {
    let mut config = check(opts)?;
    let mut seen = mtime(&opts.config);
    let latest = Arc::new(Mutex::new((String::new(), String::new())));
    // Bound before loading anything, so a busy port fails fast.
    let metrics = match opts.metrics_addr {
        Some(a) => {
            let pages = latest.clone();
            let handler: Arc<Handler> = Arc::new(move |path: &str| {
                let (prom, json) = pages.lock().map(|g| g.clone()).unwrap_or_default();
                match path {
                    "/metrics" => Some((TEXT_FORMAT, prom)),
                    "/stats" => Some(("application/json", json)),
                    _ => None,
                }
            });
            let server = MetricsServer::start(a, "lb-metrics", handler)
                .map_err(LbError::kernel(format!("bind --metrics-addr {a}")))?;
            Some(server)
        }
        None => None,
    };
    on(Event::Starting(&format!("loading the data plane and attaching to {}", opts.lb.iface)));
    let mut lb = Lb::start(&config, opts.lb.clone())?;
    on(Event::Attached { mode: lb.mode(), native_error: lb.native_error() });
    if let Some((iface, netns, max_rules)) = &opts.classifier {
        on(Event::Starting(&format!("attaching the flow classifier to {iface} egress (TCX)")));
        lb.set_classifier(Box::new(TcClassifier::attach(netns.as_deref(), iface, *max_rules)?));
    }
    on(Event::Config(&config));
    if let Some(m) = &metrics {
        on(Event::Metrics(m.local_addr()));
    }
    let start = Instant::now();
    let mut next_stats = start;
    // Statistics are read first (the data plane's maps), then written out; a failed
    // write (a full disk, a removed directory) loses that interval's file, nothing else.
    let publish = |lb: &Lb, on: &mut dyn FnMut(Event<'_>), failed: &mut Vec<String>| -> Result<LbStats, LbError> {
        let s = lb.stats()?;
        let json = serde_json::to_string_pretty(&s).map_err(|e| LbError::Invalid(format!("encode statistics: {e}")))?;
        let prom = render_prometheus(&s);
        if let Some(p) = &opts.stats_json
            && let Err(e) = write_atomically(p, &json)
        {
            failed.push(e.to_string());
        }
        if let Some(p) = &opts.prometheus
            && let Err(e) = write_atomically(p, &prom)
        {
            failed.push(e.to_string());
        }
        if let Ok(mut l) = latest.lock() {
            *l = (prom, json);
        }
        on(Event::Stats(&s, start.elapsed().as_secs_f64()));
        Ok(s)
    };
    let mut limit = RateLimit::new(Duration::from_secs(10));
    let mut trouble = |what: String, on: &mut dyn FnMut(Event<'_>)| {
        if let Some(held_back) = limit.allow(Instant::now()) {
            on(Event::Trouble { what, held_back });
        }
    };
    let mut failed = Vec::new();
    while !stop.load(Ordering::Relaxed) && opts.time.is_none_or(|t| start.elapsed() < t) {
        // The data plane forwards whatever happens here: a failure is counted, shown
        // (rate-limited) and tried again, never a reason to detach.
        if let Err(e) = lb.service_events(Duration::from_millis(100)) {
            trouble(format!("servicing new-flow events: {e}"), on);
            std::thread::sleep(Duration::from_millis(100));
        }
        let now = mtime(&opts.config);
        if now != seen {
            seen = now;
            match read_config(&opts.config) {
                Ok(new) if new == config => {}
                Ok(new) => match lb.apply(&new) {
                    Ok(changes) => {
                        on(Event::Applied(&changes));
                        config = new;
                    }
                    Err(e) => on(Event::Kept(e.to_string())),
                },
                Err(e) => on(Event::Kept(e.to_string())),
            }
        }
        if Instant::now() >= next_stats {
            if let Err(e) = publish(&lb, on, &mut failed) {
                failed.push(format!("reading statistics: {e}"));
            }
            for f in failed.drain(..) {
                trouble(f, on);
            }
            next_stats += opts.stats_interval;
        }
    }
    let last = publish(&lb, on, &mut failed)?;
    for f in failed.drain(..) {
        // The last word: shown whatever the rate limit says.
        on(Event::Trouble { what: f, held_back: 0 });
    }
    drop(lb);
    Ok(last)
}

/// Attaches the reals' decapsulation program to `iface` (native, falling back to
/// generic unless `generic`), waits until `stop` is set or the time is up, detaches.
/// Returns the mode it ran in.
pub fn decap(
    iface: &str,
    generic: bool,
    stop: &AtomicBool,
    time: Option<Duration>,
    on: &mut dyn FnMut(Event<'_>),
) -> Result<XdpMode, LbError> {
    let ifindex = if_index(iface)?;
    on(Event::Starting(&format!("loading the decapsulation program and attaching to {iface}")));
    let prog = Decap::load().map_err(LbError::kernel("load the decapsulation program (root needed)"))?;
    let link = if generic {
        XdpLink::attach(prog.program_fd(), ifindex, XdpMode::Generic)
            .map_err(LbError::kernel(format!("attach to {iface} (generic)")))?
    } else {
        let (l, native) = XdpLink::attach_native_or_generic(prog.program_fd(), ifindex)
            .map_err(LbError::kernel(format!("attach to {iface} (native, then generic)")))?;
        let why = native.map(|e| e.to_string());
        on(Event::Attached { mode: l.mode(), native_error: why.as_deref() });
        l
    };
    let mode = link.mode();
    let start = Instant::now();
    while !stop.load(Ordering::Relaxed) && time.is_none_or(|t| start.elapsed() < t) {
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(link);
    Ok(mode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_is_a_bounded_regular_file() {
        let dir = std::env::temp_dir().join(format!("netlane-lb-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A FIFO with no writer: opening it must not block.
        let fifo = dir.join("fifo.toml");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let started = Instant::now();
        let e = read_config(&fifo).unwrap_err().to_string();
        assert!(e.ends_with("fifo.toml is not a regular file"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(1));
        let big = dir.join("big.toml");
        std::fs::File::create(&big).unwrap().set_len(MAX_CONFIG_BYTES + 1).unwrap();
        let e = read_config(&big).unwrap_err().to_string();
        assert!(e.contains("a configuration may have at most 67108864"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

//! `netlane lb run` and `netlane lb decap` as library calls: load, attach, serve until
//! told to stop, detach. The caller (the command line) gives the stop signal from its
//! signal handler and prints the [`Event`]s; nothing here prints.
//!
//! While serving, the configuration file is re-read whenever it changes (reals added,
//! removed and reweighted live; a bad file keeps the running configuration), new-flow
//! events become classifier tags, and statistics are published every interval: to
//! files (JSON and Prometheus text, written atomically) and over HTTP on a loopback
//! address (`/metrics`, `/stats`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use netlane::metrics::prom::{Handler, MetricsServer, TEXT_FORMAT, check_metrics_addr};
use netlane::ratelimit::RateLimit;
use netlane::serve::Stop;

use crate::proto::config::{Config, MAX_CONFIG_BYTES, VipChange};
use crate::proto::plane::{ControlPlane, Update};
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
    let text = netlane::files::read_text(path, MAX_CONFIG_BYTES)?;
    Config::parse(&text).map_err(|e| LbError::Invalid(format!("{}: {e}", path.display())))
}

/// What tells a changed file: its modification time, size and inode (a file renamed
/// into place may keep the old one's time).
fn stamp(path: &Path) -> Option<(SystemTime, u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len(), m.ino()))
}

/// What the configuration watcher hands the control loop.
enum Reload {
    /// A changed file and the update it needs, planned from the balancer's view.
    Planned(Box<(Update, ControlPlane)>),
    /// A changed file that cannot be applied: the running configuration stays.
    Kept(String),
}

/// Watches the configuration file on a thread of its own: reading, parsing and
/// planning a big configuration (half a million reals: seconds) must not hold up the
/// control loop, which keeps tagging new flows and publishing statistics. Its view of
/// the data plane (`plane`) moves on with every plan it sends, since the loop commits
/// each one. It ends when `stop` is set or the loop is gone; nobody waits for it, so
/// a file being parsed does not delay a stop.
fn watch_config(
    path: PathBuf,
    mut seen: Option<(SystemTime, u64, u64)>,
    mut config: Config,
    mut plane: ControlPlane,
    stop: Stop,
) -> Result<Receiver<Reload>, LbError> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let watch = move || {
        while !stop.wait(Duration::from_millis(100)) {
            let now = stamp(&path);
            if now == seen {
                continue;
            }
            seen = now;
            let reload = match read_config(&path) {
                Ok(new) if new == config => continue,
                Ok(new) => match plane.plan(&new) {
                    Ok((update, next)) => {
                        let planned = Reload::Planned(Box::new((update, next.clone())));
                        plane = next;
                        config = new;
                        planned
                    }
                    Err(e) => Reload::Kept(LbError::from(e).to_string()),
                },
                Err(e) => Reload::Kept(e.to_string()),
            };
            if tx.send(reload).is_err() {
                return;
            }
        }
    };
    std::thread::Builder::new()
        .name("lb-config".into())
        .spawn(watch)
        .map_err(LbError::kernel("start the configuration watcher thread"))?;
    Ok(rx)
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
        check_metrics_addr(a).map_err(|e| LbError::Invalid(format!("`metrics_addr` {a}: {e}")))?;
    }
    if opts.stats_interval < Duration::from_millis(100) {
        return Err(LbError::Invalid("`stats_interval` must be at least 100ms".into()));
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
pub fn serve(opts: &ServeOptions, stop: &Stop, on: &mut dyn FnMut(Event<'_>)) -> Result<LbStats, LbError> {
    serve_then(opts, stop, on, &mut || {})
}

/// A balancer serving on a thread of its own (in the namespace of the thread that
/// started it): [`Server::start`] returns once it is attached, or with why it could not
/// be; [`Server::stop`] detaches it and returns its last statistics. Dropped, it is
/// stopped and detached too.
#[derive(Debug)]
pub struct Server {
    stop: Stop,
    thread: Option<std::thread::JoinHandle<Result<LbStats, LbError>>>,
    /// Whether the control loop failed: cleared when it ends well (its time up), so a
    /// panic counts as a failure.
    failed: Arc<std::sync::atomic::AtomicBool>,
}

impl Server {
    /// Loads and attaches the balancer as `opts` says and serves until stopped (or its
    /// time is up); `on` sees every [`Event`], on the server's thread.
    pub fn start(opts: ServeOptions, mut on: impl FnMut(Event<'_>) + Send + 'static) -> Result<Server, LbError> {
        let stop = Stop::new().map_err(LbError::kernel("create the balancer's stop signal"))?;
        let failed = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("lb-control".into())
            .spawn({
                let (stop, failed) = (stop.clone(), failed.clone());
                move || {
                    let r = serve_then(&opts, &stop, &mut on, &mut || {
                        let _ = ready_tx.send(());
                    });
                    failed.store(r.is_err(), std::sync::atomic::Ordering::Release);
                    r
                }
            })
            .map_err(LbError::kernel("start the balancer's control thread"))?;
        match ready.recv() {
            Ok(()) => Ok(Server { stop, thread: Some(thread), failed }),
            // It ended before it was attached: its error says why.
            Err(_) => match join(thread) {
                Err(e) => Err(e),
                Ok(_) => Err(LbError::Invalid("the balancer ended before it was attached".into())),
            },
        }
    }

    /// Detaches the balancer and returns its last statistics.
    pub fn stop(mut self) -> Result<LbStats, LbError> {
        self.stop.stop();
        self.finish()
    }

    /// Waits until it ends by itself (its time is up, or it failed).
    pub fn wait(mut self) -> Result<LbStats, LbError> {
        self.finish()
    }

    fn finish(&mut self) -> Result<LbStats, LbError> {
        match self.thread.take() {
            Some(t) => join(t),
            None => Err(LbError::Invalid("the balancer was already stopped".into())),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.stop.stop();
            let _ = self.finish();
        }
    }
}

impl netlane::serve::Running for Server {
    type Final = Result<LbStats, LbError>;

    fn poll_ended(&self) -> Option<netlane::serve::Ended> {
        use netlane::serve::Ended;
        let t = self.thread.as_ref()?;
        t.is_finished().then(|| {
            if self.failed.load(std::sync::atomic::Ordering::Acquire) {
                Ended::Failed("the balancer's control loop failed".into())
            } else {
                Ended::Asked("its time was up".into())
            }
        })
    }

    fn stop(self) -> Self::Final {
        Server::stop(self)
    }
}

fn join(thread: std::thread::JoinHandle<Result<LbStats, LbError>>) -> Result<LbStats, LbError> {
    thread.join().unwrap_or_else(|_| Err(LbError::Invalid("the balancer's control thread panicked".into())))
}

/// [`serve`], calling `ready` once the balancer is attached and its configuration shown.
fn serve_then(
    opts: &ServeOptions,
    stop: &Stop,
    on: &mut dyn FnMut(Event<'_>),
    ready: &mut dyn FnMut(),
) -> Result<LbStats, LbError> {
    // Taken before the file is read: an edit made while the data plane loads is seen.
    let seen = stamp(&opts.config);
    let config = check(opts)?;
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
                .map_err(LbError::kernel(format!("bind `metrics_addr` {a}")))?;
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
    ready();
    let start = Instant::now();
    let mut next_stats = start;
    let mut publisher = Publisher::start(opts, latest)?;
    let mut limit = RateLimit::new(Duration::from_secs(10));
    let mut trouble = |what: String, on: &mut dyn FnMut(Event<'_>)| {
        if let Some(held_back) = limit.allow(Instant::now()) {
            on(Event::Trouble { what, held_back });
        }
    };
    let watcher_stop = Stop::new().map_err(LbError::kernel("create the watcher's stop signal"))?;
    let reloads = watch_config(opts.config.clone(), seen, config.clone(), lb.plane().clone(), watcher_stop.clone())?;
    let _stop_watcher = StopOnDrop(watcher_stop);
    let mut last_try = Instant::now();
    let mut watcher_gone = false;
    while !stop.is_stopped() && opts.time.is_none_or(|t| start.elapsed() < t) {
        // The data plane forwards whatever happens here: a failure is counted, shown
        // (rate-limited) and tried again, never a reason to detach.
        if let Err(e) = lb.service_events_until(Duration::from_millis(100), stop) {
            trouble(format!("servicing new-flow events: {}", netlane::error::chain(&e)), on);
            stop.wait(Duration::from_millis(100));
        }
        let written = match reloads.try_recv() {
            Ok(Reload::Planned(planned)) => {
                let (update, next) = *planned;
                last_try = Instant::now();
                Some(lb.commit(update, next))
            }
            Ok(Reload::Kept(why)) => {
                on(Event::Kept(why));
                None
            }
            Err(std::sync::mpsc::TryRecvError::Disconnected) if !watcher_gone => {
                watcher_gone = true;
                on(Event::Kept("the configuration watcher stopped: changes to the file are no longer applied".into()));
                None
            }
            Err(_) if lb.unwritten() && last_try.elapsed() >= Duration::from_secs(1) => {
                last_try = Instant::now();
                Some(lb.retry())
            }
            Err(_) => None,
        };
        match written {
            Some(Ok(changes)) => on(Event::Applied(&changes)),
            Some(Err(e)) => trouble(
                format!(
                    "writing the new configuration to the data plane (tried again every second): {}",
                    netlane::error::chain(&e)
                ),
                on,
            ),
            None => {}
        }
        if Instant::now() >= next_stats {
            match lb.stats() {
                Ok(s) => {
                    on(Event::Stats(&s, start.elapsed().as_secs_f64()));
                    publisher.offer(s);
                }
                Err(e) => trouble(format!("reading statistics: {}", netlane::error::chain(&e)), on),
            }
            for f in publisher.failures() {
                trouble(f, on);
            }
            next_stats += opts.stats_interval;
        }
    }
    let last = lb.stats()?;
    on(Event::Stats(&last, start.elapsed().as_secs_f64()));
    drop(lb);
    for f in publisher.finish(last.clone()) {
        // The last word: shown whatever the rate limit says.
        on(Event::Trouble { what: f, held_back: 0 });
    }
    Ok(last)
}

/// Writes statistics out on a thread of its own: for half a million reals one
/// publication is 150 MB of JSON and Prometheus text, a second of a CPU that the
/// control loop spends on new flows instead. Each interval's snapshot is offered; one
/// offered while the last is still being written is skipped (and said so), so a slow
/// disk never queues snapshots up. A failed write (a full disk, a removed directory)
/// loses that interval's file, nothing else.
struct Publisher {
    tx: Option<std::sync::mpsc::SyncSender<LbStats>>,
    failures: Receiver<String>,
    thread: Option<std::thread::JoinHandle<()>>,
    skipped: u64,
}

impl Publisher {
    fn start(opts: &ServeOptions, latest: Arc<Mutex<(String, String)>>) -> Result<Publisher, LbError> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<LbStats>(0);
        let (failed, failures) = std::sync::mpsc::channel();
        let (json_file, prom_file) = (opts.stats_json.clone(), opts.prometheus.clone());
        let served = opts.metrics_addr.is_some();
        let write = move || {
            for s in rx {
                let json = (served || json_file.is_some()).then(|| serde_json::to_string_pretty(&s));
                let json = match json.transpose() {
                    Ok(j) => j.unwrap_or_default(),
                    Err(e) => {
                        let _ = failed.send(format!("encode statistics: {e}"));
                        continue;
                    }
                };
                let prom = if served || prom_file.is_some() { render_prometheus(&s) } else { String::new() };
                for (file, text) in [(&json_file, &json), (&prom_file, &prom)] {
                    if let Some(p) = file
                        && let Err(e) = write_atomically(p, text)
                    {
                        let _ = failed.send(e.to_string());
                    }
                }
                if served && let Ok(mut l) = latest.lock() {
                    *l = (prom, json);
                }
            }
        };
        let thread = std::thread::Builder::new()
            .name("lb-publish".into())
            .spawn(write)
            .map_err(LbError::kernel("start the statistics writer thread"))?;
        Ok(Publisher { tx: Some(tx), failures, thread: Some(thread), skipped: 0 })
    }

    /// Hands a snapshot over unless the last one is still being written.
    fn offer(&mut self, s: LbStats) {
        if let Some(tx) = &self.tx
            && let Err(std::sync::mpsc::TrySendError::Full(_)) = tx.try_send(s)
        {
            self.skipped += 1;
        }
    }

    /// Failed writes and skipped intervals since the last call.
    fn failures(&mut self) -> Vec<String> {
        let mut out: Vec<String> = self.failures.try_iter().collect();
        if self.skipped > 0 {
            out.push(format!(
                "statistics of {} interval(s) were not written: the previous ones still were being written \
                 (a slow disk, or an interval short for the configuration's size)",
                std::mem::take(&mut self.skipped)
            ));
        }
        out
    }

    /// Writes the last snapshot, waits for every write, and returns what failed.
    fn finish(mut self, last: LbStats) -> Vec<String> {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(last);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.failures()
    }
}

/// Stops the watcher when dropped: on every way out of `serve`.
struct StopOnDrop(Stop);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// Attaches the reals' decapsulation program to `iface` (native, falling back to
/// generic unless `generic`), waits until `stop` is set or the time is up, detaches.
/// Returns the mode it ran in.
pub fn decap(
    iface: &str,
    generic: bool,
    stop: &Stop,
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
    // The wait ends at the stop or when the time is up (a wait is at most about a
    // minute, so without a time it is taken again).
    let left = |t: Duration| t.saturating_sub(start.elapsed());
    while !stop.wait(time.map_or(Duration::MAX, left)) && time.is_none_or(|t| start.elapsed() < t) {}
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
        assert!(e.contains("has 67108865 bytes or more; at most 67108864 are read"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

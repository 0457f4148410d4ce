//! The server's shared state, what `stats` reports, and the Prometheus rendering.

use std::sync::atomic::{AtomicI64, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use netlane::metrics::CounterSet;
use netlane::metrics::prom::{Exposition, Kind};
use netlane::serve::ConnLimit;
use serde::Serialize;

use crate::proto::parse::StatsKind;
use crate::proto::reply::StatsWriter;
use crate::proto::{self, Clock, ConnMemory, Counters, Host, Limits, SharedCounters, exec};
use crate::store::{Store, StoreStats};

use super::Mailbox;
use super::lanes::{Lanes, LanesView};

/// The settings `stats settings` reports.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    /// TCP port.
    pub tcp_port: u16,
    /// UDP port (0: off).
    pub udp_port: u16,
    /// Worker threads.
    pub threads: usize,
    /// Connection limit.
    pub max_conns: usize,
    /// Largest value.
    pub item_size_max: usize,
    /// Memory limit.
    pub maxbytes: u64,
    /// Idle timeout, s (0: none).
    pub idle_timeout_s: u64,
    /// Per-connection bounds.
    #[serde(skip)]
    pub limits: Limits,
    /// Store shards.
    pub shards: usize,
    /// What clients may do.
    #[serde(skip)]
    pub proto: proto::Settings,
    /// The Unix socket served, if any.
    pub unix_socket: Option<std::path::PathBuf>,
    /// Its access mask.
    pub unix_mask: u32,
    /// The listen backlog.
    pub backlog: i32,
    /// The size classes' growth factor and smallest space (reported only).
    pub growth_factor: f64,
    /// The smallest class's space for key, value and flags.
    pub chunk_size: u64,
}

/// Connection-level counters of the workers (the limit counts admissions).
#[derive(Debug, Default)]
pub(crate) struct ConnCounters {
    pub idle_kicks: AtomicU64,
    pub udp_requests: AtomicU64,
}

/// Everything the threads share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub store: Store,
    pub settings: Settings,
    /// Protocol counters by lane (a lane that left keeps its slot: its counts stay).
    pub workers: Vec<SharedCounters>,
    pub conns: ConnCounters,
    /// The connection limit (`max_conns`): every open connection holds a place.
    pub limit: ConnLimit,
    /// Memory connections hold beyond their base buffers, and its limit.
    pub conn_memory: Arc<ConnMemory>,
    pub lanes: Lanes,
    /// Mailboxes by lane.
    mailboxes: Vec<Arc<Mailbox>>,
    started: Instant,
    verbosity: AtomicU32,
    /// `stats reset` subtracts this from what workers published.
    baseline: Mutex<Counters>,
    /// How far `debugtime` moved the clock, seconds.
    clock_offset_s: AtomicI64,
    /// A client asked for a shutdown: 1 now, 2 graceful.
    shutdown: AtomicU8,
}

/// A snapshot of every counter.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct ServerStats {
    /// Seconds since start.
    pub uptime_s: f64,
    /// Connections open now.
    pub curr_connections: u64,
    /// Connections accepted.
    pub total_connections: u64,
    /// Connections refused at the limit.
    pub rejected_connections: u64,
    /// Connections closed for idleness.
    pub idle_kicks: u64,
    /// Connections the acceptor could not take (descriptor limits, socket options).
    pub accept_errors: u64,
    /// UDP requests answered.
    pub udp_requests: u64,
    /// Protocol counters summed over workers.
    #[serde(flatten)]
    pub protocol: CountersView,
    /// The lanes: placement, NAPI ids, knobs.
    pub lanes: LanesView,
    /// The store's counters.
    #[serde(flatten)]
    pub store: StoreView,
}

/// [`Counters`] for serialization, by memcached's names.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct CountersView(pub std::collections::BTreeMap<String, u64>);

/// [`StoreStats`] for serialization.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct StoreView {
    /// Items now.
    pub curr_items: u64,
    /// Bytes now.
    pub bytes: u64,
    /// Items stored.
    pub total_items: u64,
    /// Live items evicted.
    pub evictions: u64,
    /// Expired/flushed items removed.
    pub reclaimed: u64,
    /// Bytes of items replaced or evicted while replies still send them.
    pub replaced_in_flight: u64,
}

impl Shared {
    pub fn new(
        store: Store,
        settings: Settings,
        lane_slots: usize,
        lanes: Lanes,
        mailboxes: Vec<Arc<Mailbox>>,
        conn_memory: Arc<ConnMemory>,
    ) -> Shared {
        Shared {
            store,
            workers: (0..lane_slots).map(|_| SharedCounters::default()).collect(),
            conns: ConnCounters::default(),
            limit: ConnLimit::new(settings.max_conns as u64),
            settings,
            conn_memory,
            lanes,
            mailboxes,
            started: Instant::now(),
            verbosity: AtomicU32::new(0),
            baseline: Mutex::new(Counters::default()),
            clock_offset_s: AtomicI64::new(0),
            shutdown: AtomicU8::new(0),
        }
    }

    /// Whether a client asked for a shutdown, and if so whether a graceful one.
    pub fn shutdown_requested(&self) -> Option<bool> {
        match self.shutdown.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n == 2),
        }
    }

    /// How many lanes the server can have over its life.
    pub fn lane_slots(&self) -> usize {
        self.mailboxes.len()
    }

    /// Lane `lane`'s mailbox.
    pub fn mailbox(&self, lane: usize) -> &Mailbox {
        &self.mailboxes[lane]
    }

    /// The protocol clock now.
    pub fn clock(&self) -> Clock {
        let now_ms = self.started.elapsed().as_millis() as u64;
        // The epoch is read from the wall clock each time, not once at the start: a
        // client's absolute expiry time is its wall clock's, and a system clock stepped
        // since the start (NTP, a VM resumed) moves both alike.
        let wall_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let clock = Clock { now_ms, epoch_ms: wall_ms.saturating_sub(now_ms) };
        clock.advanced(self.clock_offset_s.load(Ordering::Relaxed))
    }

    /// The store's time now, milliseconds (the protocol clock's `now_ms`, without
    /// reading the wall clock).
    pub fn now_ms(&self) -> u64 {
        let clock = Clock { now_ms: self.started.elapsed().as_millis() as u64, epoch_ms: 0 };
        clock.advanced(self.clock_offset_s.load(Ordering::Relaxed)).now_ms
    }

    /// Sum of the published counters, with `own` in place of worker `me`'s.
    fn counters(&self, own: Option<(usize, &Counters)>) -> Counters {
        let mut t = Counters::default();
        for (i, w) in self.workers.iter().enumerate() {
            match own {
                Some((me, c)) if me == i => t.add(c),
                _ => t.add(&w.load()),
            }
        }
        let base = self.baseline.lock().map(|b| *b).unwrap_or_default();
        t.minus(&base)
    }

    pub fn snapshot(&self) -> ServerStats {
        let c = self.counters(None);
        let mut m = std::collections::BTreeMap::new();
        c.each(&mut |name, _, v| {
            m.insert(name.to_string(), v);
        });
        let s = self.store.stats();
        let admissions = self.limit.counts();
        ServerStats {
            uptime_s: self.started.elapsed().as_secs_f64(),
            curr_connections: self.limit.open(),
            total_connections: admissions.admitted,
            rejected_connections: admissions.refused,
            idle_kicks: self.conns.idle_kicks.load(Ordering::Relaxed),
            accept_errors: admissions.accept_errors,
            udp_requests: self.conns.udp_requests.load(Ordering::Relaxed),
            protocol: CountersView(m),
            lanes: self.lanes.view(),
            store: StoreView {
                curr_items: s.curr_items,
                bytes: s.bytes,
                total_items: s.total_items,
                evictions: s.evictions,
                reclaimed: s.reclaimed,
                replaced_in_flight: s.replaced_in_flight,
            },
        }
    }

    fn general(&self, w: &mut StatsWriter<'_>, c: &Counters, s: &StoreStats, clock: Clock) {
        let ru = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF).ok();
        let tv = |t: nix::sys::time::TimeVal| format!("{}.{:06}", t.tv_sec(), t.tv_usec());
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let admissions = self.limit.counts();
        w.num("pid", u64::from(std::process::id()))
            .num("uptime", clock.now_ms / 1000)
            .num("time", clock.unix_secs())
            .text("version", self.version())
            .num("pointer_size", usize::BITS.into())
            .text("rusage_user", &ru.map_or("0.0".into(), |r| tv(r.user_time())))
            .text("rusage_system", &ru.map_or("0.0".into(), |r| tv(r.system_time())))
            .num("max_connections", self.settings.max_conns as u64)
            .num("curr_connections", self.limit.open())
            .num("total_connections", admissions.admitted)
            .num("rejected_connections", admissions.refused)
            .num("connection_structures", self.limit.open());
        c.each(&mut |name, _, v| {
            w.num(name, v);
        });
        // The server never stops listening (connections over the limit are refused one
        // by one), and eviction never skips an item a reply still sends (it stays
        // charged instead): memcached's counters of those are 0 here by construction.
        w.num("limit_maxbytes", self.store.memory())
            .num("accepting_conns", 1)
            .num("listen_disabled_num", 0)
            .num("time_in_listen_disabled_us", 0)
            .num("lrutail_reflocked", 0)
            .num("threads", self.settings.threads as u64)
            .num("idle_kicks", n(&self.conns.idle_kicks))
            .num("accept_errors", admissions.accept_errors)
            .num("bytes", s.bytes)
            .num("curr_items", s.curr_items)
            .num("total_items", s.total_items)
            .num("expired_unfetched", s.expired_unfetched)
            .num("evicted_unfetched", s.evicted_unfetched)
            .num("evictions", s.evictions)
            .num("reclaimed", s.reclaimed)
            .num("crawler_reclaimed", s.reaped)
            .num("read_buf_bytes", self.conn_memory.used())
            .num("read_buf_oom", self.conn_memory.refused_values())
            .num("response_obj_oom", self.conn_memory.paused_replies())
            .num("replaced_in_flight_bytes", s.replaced_in_flight);
    }

    fn settings_stats(&self, w: &mut StatsWriter<'_>) {
        let st = &self.settings;
        let yes = |b: bool| if b { "yes" } else { "no" };
        let p = &st.proto;
        w.num("maxbytes", self.store.memory())
            .num("maxconns", st.max_conns as u64)
            .num("tcpport", st.tcp_port.into())
            .num("udpport", st.udp_port.into())
            .num("verbosity", self.verbosity.load(Ordering::Relaxed).into())
            .text("evictions", if self.store.evictions_enabled() { "on" } else { "off" })
            .text("domain_socket", &st.unix_socket.as_ref().map_or("NULL".into(), |p| p.display().to_string()))
            .text("umask", &format!("{:o}", st.unix_mask))
            .text("shutdown_command", yes(p.allowed.shutdown))
            .text("auth_enabled_sasl", "no")
            .text("auth_enabled_ascii", "no")
            .text("growth_factor", &format!("{:.2}", st.growth_factor))
            .num("chunk_size", st.chunk_size)
            .num("num_threads", st.threads as u64)
            .num("reqs_per_event", st.limits.commands_per_turn as u64)
            .text("cas_enabled", yes(self.store.cas_enabled()))
            .num("tcp_backlog", st.backlog.max(0) as u64)
            .text(
                "binding_protocol",
                match p.protocol {
                    proto::Protocol::Auto => "auto-negotiate",
                    proto::Protocol::Ascii => "ascii",
                    proto::Protocol::Binary => "binary",
                },
            )
            .num("item_size_max", st.item_size_max as u64)
            .num("idle_timeout", st.idle_timeout_s)
            .text("flush_enabled", yes(p.flush))
            .text("dump_enabled", yes(p.dump))
            .num("read_buf_mem_limit", self.conn_memory.limit())
            .num("read_buf_size", st.limits.read_chunk as u64)
            .num("max_line", st.limits.max_line as u64)
            .num("output_pause", st.limits.output_pause as u64)
            .num("store_shards", st.shards as u64)
            .text("eviction_policy", "clock");
    }

    pub fn prometheus(&self) -> String {
        let c = self.counters(None);
        let s = self.store.stats();
        let mut e = Exposition::new();
        e.counters("netlane_kv", &c);
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let gauges: [(&str, &str, u64); 4] = [
            ("netlane_kv_curr_connections", "Connections open now.", self.limit.open()),
            ("netlane_kv_curr_items", "Items held now.", s.curr_items),
            ("netlane_kv_bytes", "Bytes held now (key + value + overhead).", s.bytes),
            ("netlane_kv_limit_maxbytes", "The memory limit.", self.store.memory()),
        ];
        for (name, help, v) in gauges {
            e.family(name, help, Kind::Gauge).sample(name, &[], v);
        }
        let admissions = self.limit.counts();
        let counters: [(&str, &str, u64); 8] = [
            ("netlane_kv_total_connections_total", "Connections accepted.", admissions.admitted),
            ("netlane_kv_rejected_connections_total", "Connections refused at the limit.", admissions.refused),
            ("netlane_kv_idle_kicks_total", "Connections closed for idleness.", n(&self.conns.idle_kicks)),
            ("netlane_kv_accept_errors_total", "Connections the acceptor could not take.", admissions.accept_errors),
            ("netlane_kv_total_items_total", "Items ever stored.", s.total_items),
            ("netlane_kv_evictions_total", "Live items evicted for room.", s.evictions),
            ("netlane_kv_reclaimed_total", "Expired or flushed items removed.", s.reclaimed),
            ("netlane_kv_udp_requests_total", "UDP requests answered.", n(&self.conns.udp_requests)),
        ];
        for (name, help, v) in counters {
            e.family(name, help, Kind::Counter).sample(name, &[], v);
        }
        let view = self.lanes.view();
        e.family("netlane_kv_lane_connections", "Connections on each lane now.", Kind::Gauge);
        for l in &view.lanes {
            e.sample("netlane_kv_lane_connections", &[("lane", &l.lane.to_string())], l.connections);
        }
        e.family(
            "netlane_kv_lane_placed_total",
            "Connections placed on each lane, by why: owner (their NAPI id's), new-id, no-napi, round-robin.",
            Kind::Counter,
        );
        for l in &view.lanes {
            let lane = l.lane.to_string();
            for (why, v) in
                [("owner", l.by_owner), ("new-id", l.new_id), ("no-napi", l.no_napi), ("round-robin", l.round_robin)]
            {
                e.sample("netlane_kv_lane_placed_total", &[("lane", &lane), ("why", why)], v);
            }
        }
        e.finish()
    }
}

/// The [`Host`] one worker runs commands with.
#[derive(Debug)]
pub(crate) struct WorkerHost<'a> {
    pub shared: &'a Shared,
    pub worker: usize,
}

impl Shared {
    fn version(&self) -> &str {
        concat!("1.6.18-netlane-", env!("CARGO_PKG_VERSION"))
    }
}

impl Host for WorkerHost<'_> {
    fn version(&self) -> &str {
        self.shared.version()
    }

    fn stats(&self, kind: StatsKind, store: &Store, own: &Counters, clock: Clock, out: &mut Vec<u8>) {
        let sh = self.shared;
        if kind == StatsKind::Reset {
            let total = sh.counters(Some((self.worker, own)));
            if let Ok(mut b) = sh.baseline.lock() {
                b.add(&total);
            }
            store.reset_stats();
            out.extend_from_slice(b"RESET\r\n");
            return;
        }
        let mut w = StatsWriter::new(out);
        match kind {
            StatsKind::General => {
                let c = sh.counters(Some((self.worker, own)));
                sh.general(&mut w, &c, &store.stats(), clock);
            }
            StatsKind::Settings => sh.settings_stats(&mut w),
            StatsKind::Items | StatsKind::Slabs | StatsKind::Sizes => {
                exec::store_class_stats(kind, store, clock, &mut w)
            }
            StatsKind::CacheDump { class, limit } => {
                exec::cachedump(class, limit, store, clock, out);
                return;
            }
            StatsKind::Conns | StatsKind::Reset | StatsKind::Detail { .. } => {}
        }
        w.end();
    }

    fn verbosity(&self, level: u32) {
        self.shared.verbosity.store(level, Ordering::Relaxed);
    }

    fn shutdown(&self, graceful: bool) {
        self.shared.shutdown.store(if graceful { 2 } else { 1 }, Ordering::Relaxed);
    }

    fn advance_clock(&self, secs: i64) {
        self.shared.clock_offset_s.fetch_add(secs, Ordering::Relaxed);
    }

    fn may_grow(&self, bytes: u64) -> bool {
        netlane::memory::Ask::new().add("the cache's growth", bytes).check().is_ok()
    }
}

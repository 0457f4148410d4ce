//! The server's lanes: which worker owns which receive queue, how a connection reaches
//! it, and what each lane has done. The map itself is `netlane::lanes::LaneMap`; this
//! is its use by the cache server.
//!
//! - [`Steer::RoundRobin`]: no alignment, each new connection to the next worker;
//! - [`Steer::Acceptor`]: the acceptor reads the connection's `SO_INCOMING_NAPI_ID` and
//!   hands it to the lane owning that id (memcached's `-N`, without its reset of every
//!   binding when ids outnumber threads);
//! - [`Steer::Reuseport`]: no acceptor: one listener per lane in an `SO_REUSEPORT`
//!   group whose BPF selector (`netlane_sys::bpf::ReuseportNapi`) gives each SYN to
//!   the listener of the lane owning its NAPI id; a connection the selector could not
//!   place (an id it did not know yet) is handed over by the lane that accepted it, and
//!   its id is taught to the selector.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use netlane::lanes::{Knob, LaneId, LaneMap, ReuseportSteering, Why};
use serde::{Deserialize, Serialize};

/// How a new connection finds its lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Steer {
    /// Each new connection to the next lane (plain epoll workers: no alignment).
    #[default]
    RoundRobin,
    /// The acceptor hands each connection to the lane owning its NAPI id.
    Acceptor,
    /// One listener per lane; a BPF SO_REUSEPORT selector picks by NAPI id.
    Reuseport,
}

impl FromStr for Steer {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "round-robin" | "none" => Ok(Steer::RoundRobin),
            "acceptor" | "napi" => Ok(Steer::Acceptor),
            "reuseport" => Ok(Steer::Reuseport),
            _ => Err(format!("steering {s:?}: expected round-robin, acceptor or reuseport")),
        }
    }
}

impl fmt::Display for Steer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Steer::RoundRobin => "round-robin",
            Steer::Acceptor => "acceptor",
            Steer::Reuseport => "reuseport",
        })
    }
}

/// One lane's counters.
#[derive(Debug, Default)]
pub(crate) struct LaneCounters {
    /// Placed on the lane owning their NAPI id.
    pub by_owner: AtomicU64,
    /// Brought a NAPI id the map did not know.
    pub new_id: AtomicU64,
    /// NAPI id 0 (or none known): placed by load.
    pub no_napi: AtomicU64,
    /// Placed round robin.
    pub round_robin: AtomicU64,
    /// Accepted by this lane's listener but owned by another: handed over.
    pub handed_over: AtomicU64,
    /// Moved here from another lane (a lane added or removed).
    pub moved_in: AtomicU64,
    /// Moved away.
    pub moved_out: AtomicU64,
    /// Sockets that refused the busy-poll options.
    pub busy_poll_refused: AtomicU64,
}

impl LaneCounters {
    pub fn placed(&self, why: Option<Why>) {
        let c = match why {
            Some(Why::Owner) => &self.by_owner,
            Some(Why::NewId) => &self.new_id,
            Some(Why::NoNapi) => &self.no_napi,
            None => &self.round_robin,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// The lanes' shared state.
#[derive(Debug)]
pub(crate) struct Lanes {
    pub steer: Steer,
    pub map: Mutex<LaneMap>,
    pub counters: Vec<LaneCounters>,
    /// What each lane's CPU is (pinned), by lane.
    pub cpus: Mutex<BTreeMap<LaneId, usize>>,
    /// Knobs applied at start and per lane (busy polling, NAPI settings).
    pub knobs: Mutex<Vec<(Option<LaneId>, Knob)>>,
    /// The TCP listeners' selector ([`Steer::Reuseport`]).
    steering: Mutex<Option<ReuseportSteering>>,
    /// The UDP sockets' selector ([`Steer::Reuseport`] with UDP).
    udp_steering: Mutex<Option<ReuseportSteering>>,
}

impl Lanes {
    pub fn new(
        steer: Steer,
        map: LaneMap,
        max_lanes: usize,
        steering: Option<ReuseportSteering>,
        udp_steering: Option<ReuseportSteering>,
    ) -> Lanes {
        Lanes {
            steer,
            map: Mutex::new(map),
            counters: (0..max_lanes).map(|_| LaneCounters::default()).collect(),
            cpus: Mutex::new(BTreeMap::new()),
            knobs: Mutex::new(Vec::new()),
            steering: Mutex::new(steering),
            udp_steering: Mutex::new(udp_steering),
        }
    }

    pub fn map(&self) -> std::sync::MutexGuard<'_, LaneMap> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `lane`'s listener joined the TCP group (last); the selector learns it. (Lock
    /// order everywhere: the map, then a selector.)
    pub fn joined_tcp(&self, lane: LaneId) {
        let map = self.map();
        if let Some(st) = self.steering.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            st.joined(lane);
            if let Err(e) = st.sync(&map) {
                tracing::warn!(error = %e, "could not update the reuseport selector");
            }
        }
    }

    /// A connection brought NAPI id(s) the selectors did not know: teach them the map.
    pub fn resync(&self) {
        let map = self.map();
        for st in [&self.steering, &self.udp_steering] {
            if let Some(st) = st.lock().unwrap_or_else(|p| p.into_inner()).as_mut()
                && let Err(e) = st.sync(&map)
            {
                tracing::warn!(error = %e, "could not update a reuseport selector");
            }
        }
    }

    /// `lane`'s sockets left their reuseport groups: the last of each group took its
    /// index; the selectors learn the new order.
    pub fn left(&self, lane: LaneId) {
        let map = self.map();
        for st in [&self.steering, &self.udp_steering] {
            if let Some(st) = st.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
                st.left(lane);
                if let Err(e) = st.sync(&map) {
                    tracing::warn!(error = %e, "could not update a reuseport selector");
                }
            }
        }
    }

    /// (packets the selectors steered by NAPI id, packets left to the kernel's hash),
    /// TCP and UDP together.
    pub fn selector_counts(&self) -> Option<(u64, u64)> {
        let mut total: Option<(u64, u64)> = None;
        for st in [&self.steering, &self.udp_steering] {
            if let Some(st) = st.lock().unwrap_or_else(|p| p.into_inner()).as_ref()
                && let Ok((a, b)) = st.counts()
            {
                let t = total.get_or_insert((0, 0));
                t.0 += a;
                t.1 += b;
            }
        }
        total
    }

    pub fn knob(&self, lane: Option<LaneId>, k: Knob) {
        self.knobs.lock().unwrap_or_else(|p| p.into_inner()).push((lane, k));
    }

    pub fn view(&self) -> LanesView {
        let map = self.map();
        let cpus = self.cpus.lock().map(|c| c.clone()).unwrap_or_default();
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let lanes = map
            .lanes()
            .map(|(id, share)| {
                let c = &self.counters[id];
                LaneView {
                    lane: id,
                    cpu: cpus.get(&id).copied(),
                    napi_ids: share.napi_ids.iter().copied().collect(),
                    connections: share.connections,
                    by_owner: n(&c.by_owner),
                    new_id: n(&c.new_id),
                    no_napi: n(&c.no_napi),
                    round_robin: n(&c.round_robin),
                    handed_over: n(&c.handed_over),
                    moved_in: n(&c.moved_in),
                    moved_out: n(&c.moved_out),
                    busy_poll_refused: n(&c.busy_poll_refused),
                }
            })
            .collect();
        let knobs = self
            .knobs
            .lock()
            .map(|k| {
                k.iter()
                    .map(|(lane, k)| KnobView {
                        lane: *lane,
                        name: k.name.clone(),
                        wanted: k.wanted.clone(),
                        applied: k.applied(),
                        detail: match &k.status {
                            netlane::lanes::KnobStatus::Applied { now } => now.clone(),
                            netlane::lanes::KnobStatus::Refused { reason } => reason.clone(),
                        },
                    })
                    .collect()
            })
            .unwrap_or_default();
        drop(map);
        let (steered_by_napi, steered_by_hash) = self.selector_counts().unwrap_or((0, 0));
        LanesView { steer: self.steer, lanes, knobs, steered_by_napi, steered_by_hash }
    }
}

/// What the lanes did, for `stats` and the final counters.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LanesView {
    /// How connections find their lane.
    pub steer: Steer,
    /// Each lane that exists now.
    pub lanes: Vec<LaneView>,
    /// Every knob applied or refused.
    pub knobs: Vec<KnobView>,
    /// SYNs and datagrams the reuseport selector gave to a lane by NAPI id.
    pub steered_by_napi: u64,
    /// SYNs and datagrams it left to the kernel's hash (NAPI id unknown or 0).
    pub steered_by_hash: u64,
}

/// One lane.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LaneView {
    /// Its number.
    pub lane: usize,
    /// The CPU its worker is pinned to.
    pub cpu: Option<usize>,
    /// The NAPI ids (receive queues) it owns.
    pub napi_ids: Vec<u32>,
    /// Connections on it now.
    pub connections: u64,
    /// Connections placed on it as their NAPI id's owner.
    pub by_owner: u64,
    /// Connections that brought an id new to the map (now its).
    pub new_id: u64,
    /// Connections with NAPI id 0, placed by load.
    pub no_napi: u64,
    /// Connections placed round robin.
    pub round_robin: u64,
    /// Connections its listener took that belonged to another lane.
    pub handed_over: u64,
    /// Connections moved in when lanes changed.
    pub moved_in: u64,
    /// Connections moved out when lanes changed.
    pub moved_out: u64,
    /// Sockets that refused the busy-poll options.
    pub busy_poll_refused: u64,
}

/// One knob.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct KnobView {
    /// The lane it is for (none: the whole server or device).
    pub lane: Option<usize>,
    /// What it is.
    pub name: String,
    /// The value asked for.
    pub wanted: String,
    /// Whether it took.
    pub applied: bool,
    /// The value read back, or why it was refused.
    pub detail: String,
}

//! The controller (target) side: a subsystem shared by every connection, and one
//! [`TargetQueue`] state machine per TCP connection.
//!
//! A queue is driven by bytes: [`TargetQueue::handle_input`] consumes whole PDUs from the
//! front of the receive buffer and appends the replies to an output buffer the driver
//! sends ([`TargetQueue::poll_output`] / [`TargetQueue::handle_written`]). Time is an
//! argument (`now_ns`, any monotonic origin), used only for the keep-alive timer.
//!
//! Invariants:
//! - nothing in here blocks or panics on network input; a protocol violation appends a
//!   C2H termination request and moves the queue to closed, after which no input is
//!   processed;
//! - data reaches the namespace only after every byte of the command arrived with a good
//!   digest and inside the command's range; a failed command writes nothing;
//! - the controller registry lock is taken only on Connect, queue teardown and keep-alive
//!   expiry, never on the I/O path.
//!
//! This module holds the subsystem and its controller registry; the queue state machine
//! is in `queue.rs`, its R2T/H2CData and C2HData transfers in `transfer.rs`, its
//! counters in `stats.rs`, the admin and Fabrics commands in `admin.rs`, the discovery
//! controller in `discovery.rs`, the NVM I/O commands in `io.rs`, and the storage
//! requests they emit (and the per-queue data budget) in `storage.rs`.

mod admin;
mod discovery;
mod io;
mod queue;
mod stats;
mod storage;
mod transfer;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use crate::proto::fabrics;
use crate::proto::identify::NamespaceInfo;
use crate::proto::namespace::Namespace;

pub use queue::{CloseReason, TargetQueue};
pub use stats::{LATENCY_BUCKETS, LatencyHist, QueueStats};
pub use storage::{ALL_NAMESPACES, StorageOp, StorageRequest};

/// Subsystem-wide settings.
#[derive(Debug, Clone)]
pub struct TargetConfig {
    /// Subsystem NQN hosts must connect to.
    pub nqn: String,
    /// Serial number reported by Identify.
    pub serial: String,
    /// Model reported by Identify.
    pub model: String,
    /// Largest transfer: 4 KiB << mdts bytes.
    pub mdts: u8,
    /// Largest H2CData payload accepted (MAXH2CDATA), bytes.
    pub maxh2cdata: u32,
    /// In-capsule data accepted on I/O queues, bytes.
    pub in_capsule: u32,
    /// In-capsule data accepted on the admin queue, bytes (Connect needs 1024).
    pub admin_in_capsule: u32,
    /// Most I/O queues per controller.
    pub max_io_queues: u16,
    /// Maximum queue entries supported, 0's based (CAP.MQES).
    pub mqes: u16,
    /// Largest C2HData payload sent; longer reads are split.
    pub c2h_max: u32,
    /// Largest R2T; longer writes take several.
    pub r2t_max: u32,
    /// Use the C2HData SUCCESS flag instead of a response capsule when the host disabled
    /// SQ flow control. Some hosts have broken on it; this turns it off.
    pub c2h_success: bool,
    /// Keep-alive granularity reported (KAS), 100 ms units.
    pub kas: u16,
    /// Data a queue may hold for its commands (read data not yet sent, write buffers),
    /// bytes; at least one largest transfer is always allowed.
    pub queue_budget: u32,
    /// A connection must complete ICReq and Connect within this, ms.
    pub setup_timeout_ms: u32,
    /// The addresses the discovery log lists, one port each (the listening addresses,
    /// or what the hosts must use when they differ). An unspecified IP (0.0.0.0) is
    /// reported as the address the host reached, as nvmet does.
    pub ports: Vec<SocketAddr>,
}

impl Default for TargetConfig {
    fn default() -> Self {
        TargetConfig {
            nqn: "nqn.2026-11.io.netlane:target".into(),
            serial: "netlane0001".into(),
            model: "netlane user-space NVMe/TCP".into(),
            mdts: 9,
            maxh2cdata: 128 * 1024,
            in_capsule: 8192,
            admin_in_capsule: 8192,
            max_io_queues: 64,
            mqes: 127,
            c2h_max: 128 * 1024,
            r2t_max: 4 * 1024 * 1024,
            c2h_success: true,
            kas: 1,
            queue_budget: 4 << 20,
            setup_timeout_ms: 10_000,
            ports: Vec::new(),
        }
    }
}

impl TargetConfig {
    /// Checks the settings a user can get wrong. Everything a host's traffic can make
    /// the target allocate is bounded here.
    pub fn validate(&self) -> Result<(), String> {
        if self.nqn.is_empty() || self.nqn.len() > 223 {
            return Err(format!("subsystem NQN must be 1..=223 bytes, got {}", self.nqn.len()));
        }
        if self.nqn == crate::proto::identify::disc::NQN {
            return Err("the subsystem NQN cannot be the discovery NQN".into());
        }
        if !(4096..=MAX_H2C_DATA).contains(&self.maxh2cdata) || !self.maxh2cdata.is_multiple_of(4) {
            return Err(format!("maxh2cdata {} must be 4096..={MAX_H2C_DATA} and a multiple of 4", self.maxh2cdata));
        }
        if self.in_capsule > MAX_IN_CAPSULE || !self.in_capsule.is_multiple_of(16) {
            return Err(format!(
                "in-capsule data {} must be 0..={MAX_IN_CAPSULE} and a multiple of 16",
                self.in_capsule
            ));
        }
        if !(fabrics::CONNECT_DATA_LEN as u32..=MAX_ADMIN_IN_CAPSULE).contains(&self.admin_in_capsule) {
            return Err(format!(
                "admin in-capsule data {} must hold the 1024-byte Connect data and be at most {MAX_ADMIN_IN_CAPSULE}",
                self.admin_in_capsule
            ));
        }
        if self.queue_budget > MAX_QUEUE_BUDGET {
            return Err(format!("queue budget {} must be at most {MAX_QUEUE_BUDGET}", self.queue_budget));
        }
        if !(100..=600_000).contains(&self.setup_timeout_ms) {
            return Err(format!("setup timeout {} ms must be 100..=600000", self.setup_timeout_ms));
        }
        if self.c2h_max == 0 || self.r2t_max == 0 {
            return Err("c2h_max and r2t_max must be non-zero".into());
        }
        if self.mqes == 0 || self.max_io_queues == 0 {
            return Err("queue size and count must be non-zero".into());
        }
        if self.mdts == 0 || self.mdts > 12 {
            return Err(format!("mdts {} must be 1..=12 (8 KiB..16 MiB)", self.mdts));
        }
        Ok(())
    }

    /// The largest transfer, bytes (4 KiB << MDTS).
    pub fn max_transfer(&self) -> u64 {
        4096u64 << self.mdts
    }
}

/// Upper bound of MAXH2CDATA: what nvmet-tcp offers (drivers/nvme/target/tcp.c,
/// NVMET_TCP_MAXH2CDATA). One H2CData PDU is buffered whole, so this bounds it.
pub const MAX_H2C_DATA: u32 = 4 << 20;
/// Upper bound of in-capsule data on I/O queues (one capsule is buffered whole).
pub const MAX_IN_CAPSULE: u32 = 1 << 20;
/// Upper bound of in-capsule data on the admin queue (Connect needs 1024).
pub const MAX_ADMIN_IN_CAPSULE: u32 = 8192;
/// Upper bound of the per-queue data budget.
pub const MAX_QUEUE_BUDGET: u32 = 256 << 20;

netlane_counters::counters! {
    /// The subsystem's counters (what the SMART log reports).
    #[cfg_attr(feature = "drivers", derive(serde::Serialize, schemars::JsonSchema))]
    pub struct SubsystemCounters, shared SharedSubsystemCounters {
        /// Read commands completed.
        read_cmds,
        /// Write commands completed.
        write_cmds,
        /// Flush commands accepted.
        flush_cmds,
        /// 512-byte units read.
        sectors_read,
        /// 512-byte units written.
        sectors_written,
        /// Connections terminated for a protocol violation.
        terminations,
        /// Data digest errors seen.
        data_digest_errors,
        /// Controllers removed because their keep-alive timer expired.
        keepalive_expiries,
        /// Storage operations that failed (each failed its command).
        storage_failures,
    }
}

/// What a subsystem counts for the SMART log and reports.
#[derive(Debug, Default)]
pub struct SubsystemStats {
    /// The counters.
    pub counts: SharedSubsystemCounters,
    /// The last failed storage operation, for the driver's log (which summarises rather
    /// than writes a line per failure).
    pub last_storage_failure: Mutex<String>,
}

impl SubsystemStats {
    /// Counts a failed storage operation.
    pub(super) fn storage_failed(&self, cid: u16, what: &str, e: &std::io::Error) {
        self.counts.storage_failures.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut last) = self.last_storage_failure.lock() {
            *last = format!("{what} (command {cid}): {e}");
        }
    }
}

/// One controller: the admin queue and its I/O queues, possibly on several connections
/// and threads.
#[derive(Debug)]
pub struct Controller {
    /// Controller ID.
    pub cntlid: u16,
    /// Host NQN that created it; I/O queues must come from the same host.
    pub hostnqn: String,
    /// Keep-alive timeout in ms (0 = none).
    pub kato_ms: u32,
    /// A discovery controller (the discovery log, no namespaces or I/O queues).
    pub discovery: bool,
    pub(super) cc: AtomicU32,
    pub(super) csts: AtomicU32,
    pub(super) io_queues: AtomicU16,
    pub(super) aen_config: AtomicU32,
    pub(super) alive: AtomicBool,
    pub(super) connected: Mutex<Vec<bool>>,
}

impl Controller {
    /// Whether the controller still exists (false after keep-alive expiry or when its
    /// admin queue went away).
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }
    pub(super) fn ready(&self) -> bool {
        self.csts.load(Ordering::Acquire) & fabrics::CSTS_RDY != 0
    }
}

/// A subsystem: its namespaces and live controllers.
#[derive(Debug)]
pub struct Subsystem {
    /// Settings.
    pub config: TargetConfig,
    pub(super) namespaces: Vec<Arc<dyn Namespace>>,
    pub(super) controllers: Mutex<HashMap<u16, Arc<Controller>>>,
    /// The addresses the server listens on (the discovery log's default ports).
    pub(super) listening: Mutex<Vec<SocketAddr>>,
    pub(super) next_cntlid: Mutex<u16>,
    /// Counters.
    pub stats: SubsystemStats,
}

impl Subsystem {
    /// A subsystem serving `namespaces` as NSIDs 1, 2, ...
    pub fn new(config: TargetConfig, namespaces: Vec<Arc<dyn Namespace>>) -> Result<Arc<Subsystem>, String> {
        config.validate()?;
        if namespaces.is_empty() {
            return Err("a subsystem needs at least one namespace".into());
        }
        for (i, ns) in namespaces.iter().enumerate() {
            if u64::from(ns.block_size()) > config.max_transfer() {
                return Err(format!("namespace {} block size exceeds the maximum transfer", i + 1));
            }
        }
        Ok(Arc::new(Subsystem {
            config,
            namespaces,
            controllers: Mutex::new(HashMap::new()),
            listening: Mutex::new(Vec::new()),
            next_cntlid: Mutex::new(1),
            stats: SubsystemStats::default(),
        }))
    }

    /// Records where the server listens: the discovery log lists these ports unless the
    /// configuration names others ([`TargetConfig::ports`]).
    pub fn set_listening(&self, addrs: &[SocketAddr]) {
        if let Ok(mut l) = self.listening.lock() {
            *l = addrs.to_vec();
        }
    }

    /// The ports the discovery log lists.
    pub(super) fn discovery_ports(&self) -> Vec<SocketAddr> {
        if !self.config.ports.is_empty() {
            return self.config.ports.clone();
        }
        self.listening.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Its namespaces, NSID 1 first.
    pub fn namespaces(&self) -> &[Arc<dyn Namespace>] {
        &self.namespaces
    }

    /// Number of live controllers.
    pub fn controller_count(&self) -> usize {
        self.controllers.lock().map(|c| c.len()).unwrap_or(0)
    }

    /// Namespace `nsid` (1-based).
    pub fn namespace(&self, nsid: u32) -> Option<&Arc<dyn Namespace>> {
        (nsid as usize).checked_sub(1).and_then(|i| self.namespaces.get(i))
    }

    pub(super) fn nsinfo(&self, nsid: u32, ns: &dyn Namespace) -> NamespaceInfo {
        let mut nguid = [0u8; 16];
        let tag = crate::proto::digest::crc32c(self.config.nqn.as_bytes());
        nguid[..4].copy_from_slice(&tag.to_be_bytes());
        nguid[12..].copy_from_slice(&nsid.to_be_bytes());
        // Shared: every controller of the subsystem sees the same namespaces (CMIC 0x3).
        NamespaceInfo { blocks: ns.blocks(), block_size: ns.block_size(), nguid, shared: true }
    }

    pub(super) fn create_controller(&self, hostnqn: &str, kato_ms: u32, discovery: bool) -> Option<Arc<Controller>> {
        let mut ctrls = self.controllers.lock().ok()?;
        let mut next = self.next_cntlid.lock().ok()?;
        // CNTLIDs 1..=0xffef are valid for dynamic controllers.
        for _ in 0..0xffef {
            let id = *next;
            *next = if id >= 0xffef { 1 } else { id + 1 };
            if let std::collections::hash_map::Entry::Vacant(e) = ctrls.entry(id) {
                let c = Arc::new(Controller {
                    cntlid: id,
                    hostnqn: hostnqn.to_string(),
                    kato_ms,
                    discovery,
                    cc: AtomicU32::new(0),
                    csts: AtomicU32::new(0),
                    io_queues: AtomicU16::new(if discovery { 0 } else { self.config.max_io_queues }),
                    aen_config: AtomicU32::new(0),
                    alive: AtomicBool::new(true),
                    connected: Mutex::new(vec![false; usize::from(self.config.max_io_queues) + 1]),
                });
                c.connected.lock().ok()?[0] = true;
                e.insert(c.clone());
                return Some(c);
            }
        }
        None
    }

    pub(super) fn find_controller(&self, cntlid: u16) -> Option<Arc<Controller>> {
        self.controllers.lock().ok()?.get(&cntlid).cloned()
    }

    pub(super) fn remove_controller(&self, c: &Controller) {
        c.alive.store(false, Ordering::Release);
        if let Ok(mut ctrls) = self.controllers.lock() {
            ctrls.remove(&c.cntlid);
        }
    }
}

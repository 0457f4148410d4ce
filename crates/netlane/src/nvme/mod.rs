//! NVMe/TCP in user space: the drivers around the sans-IO core in `netlane-nvme`.
//!
//! - [`store`]: namespaces backed by memory or a file (`mem:256M`, `file:/path:1G`);
//! - [`target`]: the target server: an acceptor, one reactor thread per CPU owning its
//!   connections (no locks on the I/O path), completions batched per reactor round and
//!   sent with `MSG_MORE` until the last send of the round, optional busy polling;
//! - [`host`]: connecting to a target: the admin queue (Connect, enable, Identify,
//!   number of queues, keep-alive) and I/O queue connections;
//! - [`perf`]: the fio-like load generator with queue maps (default/read/poll), direct
//!   send, batching and i10-style caravans, reporting HDR latency percentiles and CPU
//!   per I/O.

pub mod host;
pub mod perf;
pub mod store;
pub mod target;
mod wire;

pub use netlane_nvme as proto;

/// The NVMe/TCP well-known port.
pub const DEFAULT_PORT: u16 = 4420;

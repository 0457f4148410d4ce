//! NVMe/TCP in user space: a target server, a host, and a fio-like load generator,
//! wire-compatible with the Linux kernel's host and target.
//!
//! Two layers:
//!
//! - [`proto`]: the sans-IO protocol core (PDUs with digests, commands, Fabrics,
//!   Identify and log pages, the controller and host queue state machines). No
//!   sockets, threads, clocks or files; fuzzed (`fuzz/`) and tested back to back in
//!   memory;
//! - the drivers around it, which own sockets and threads:
//!   - [`store`]: namespaces backed by memory or a file (`mem:256M`, `file:/path:1G`);
//!   - [`target`]: the target server: an acceptor, one reactor thread per CPU owning its
//!     connections (no locks on the I/O path), completions batched per reactor round
//!     and sent with `MSG_MORE` until the last send of the round, optional busy polling;
//!   - [`host`]: connecting to a target: the admin queue (Connect, enable, Identify,
//!     number of queues, keep-alive) and I/O queue connections;
//!   - [`perf`]: the fio-like load generator with queue maps (default/read/poll), direct
//!     send, batching and i10-style caravans, reporting HDR latency percentiles and CPU
//!     per I/O.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

#[cfg(feature = "drivers")]
pub mod host;
#[cfg(feature = "drivers")]
pub mod perf;
pub mod proto;
#[cfg(feature = "drivers")]
pub mod store;
#[cfg(feature = "drivers")]
pub mod target;
#[cfg(feature = "drivers")]
mod wire;

/// The NVMe/TCP well-known port.
pub const DEFAULT_PORT: u16 = 4420;

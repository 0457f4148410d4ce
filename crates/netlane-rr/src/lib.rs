//! Datagram request/response IPC (the fourth system): a stateless UDP service whose
//! requests can arrive through five receive paths, and the closed-loop client
//! population that measures it.
//!
//! - [`proto`]: the sans-IO core: the message format with its payload check, the
//!   server's answer to a request, one client's state (matching, reassembly,
//!   retransmission). No sockets, clocks or threads; fuzzed.
//! - `server`: the server on a receive path (`recvfrom`, `recvmmsg`, ...).
//! - `clients`: the client population (closed or open loop, echo mode for any UDP echo
//!   server).
#![forbid(unsafe_code)]

pub mod proto;

#[cfg(feature = "drivers")]
pub mod clients;
#[cfg(feature = "drivers")]
pub mod server;

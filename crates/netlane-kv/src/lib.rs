//! A memcached-protocol cache (the fifth system's application) and the open-loop load
//! generator that measures any memcached-protocol server.
//!
//! - [`proto`]: the sans-IO core: the text and meta protocols parsed and answered
//!   against a [`store::Store`], one connection's byte stream in and out (pipelining,
//!   partial reads, bounded buffers), memcached's UDP frame header. No sockets, clocks
//!   or threads; fuzzed.
//! - [`store`]: the cache itself: sharded, CLOCK eviction under a memory limit, lazy and
//!   active expiry, CAS. Time is an argument.
//! - [`load`]: the load generator's sans-IO parts: the arrival schedule, the workload's
//!   distributions, the client-side codec.
//! - `server` and `loadgen`: the drivers (epoll workers, client threads).
#![forbid(unsafe_code)]

pub mod load;
pub mod proto;
pub mod store;

#[cfg(feature = "drivers")]
pub mod server;

#[cfg(feature = "drivers")]
pub mod loadgen;

//! The load generator's sans-IO core: an open-loop memcached load generator in the
//! manner of mutilate and Lancet, measuring the throughput a server sustains within a
//! tail-latency SLA without coordinated omission. No sockets, clocks, threads or files:
//! the driver passes in the time and the bytes.
//!
//! - [`schedule`]: when requests go out (Poisson, constant or ETC arrivals, split over
//!   connections; or a closed loop, to show what it hides);
//! - [`workload`]: what they ask (the key space, Zipf or uniform popularity, fixed,
//!   uniform or ETC key and value sizes, the get/set mix, multi-gets, the warm-up);
//! - [`codec`]: the text protocol's client side (requests out, replies matched in order);
//! - [`conn`]: one connection: the three joined, the driver's unit of work;
//! - [`stats`]: counters and latency histogram, mergeable; the SLA;
//! - [`search`]: the bisection over offered rates, each answer confirmed;
//! - [`rng`]: the seeded generator everything draws from.
//!
//! Invariants:
//! - **The schedule is fixed before the run.** A connection's send times depend on the
//!   arrival process and its seed only, never on replies; latency is measured from the
//!   scheduled time, so a request delayed by a slow server, a full connection or a late
//!   generator carries that delay in its latency. A late send is counted, never
//!   forgiven, and nothing scheduled is skipped.
//! - **Nothing unanswered improves a percentile.** Every offered request ends completed,
//!   failed (error line, lost with its connection), unanswered or unsent; percentiles rank
//!   all of them, the ones without a good answer above every latency.
//! - **Replies match requests in order.** The text protocol has no ids; the codec's FIFO
//!   of requests in flight is the connection's only record of them, and anything that
//!   breaks the order is a protocol error that ends the connection.
//! - **Bounded memory.** The decoder keeps at most one line ([`codec::MAX_LINE`]) and
//!   never stores values; a connection has at most its configured requests in flight.
//! - **Reproducible.** One seed gives the same send times and requests; key names and
//!   key and value sizes depend on the key's index alone.
//! - **Nothing here panics on what the network sends.**

pub mod codec;
pub mod conn;
pub mod rng;
pub mod schedule;
pub mod search;
pub mod stats;
pub mod workload;

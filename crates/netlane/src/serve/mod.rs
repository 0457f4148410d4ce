//! What every netlane server is built of, so that each server's own crate holds only
//! what is its own.
//!
//! - [`Stop`]: the stop signal. A flag every loop can read, and an eventfd every loop
//!   registers with its epoll (or `poll`) set: stopping makes the eventfd readable for
//!   good, so each loop wakes at once, instead of noticing a flag after its poll timeout
//!   (tokio's driver wakes its loop through a registered waker the same way);
//! - [`AcceptBackoff`]: what an acceptor does when `accept` fails (out of descriptors or
//!   memory): waits 10 ms, doubling to 1 s, logged at a limited rate;
//! - [`ConnLimit`]: at most so many connections open at once, each holding an
//!   [`Admitted`] token that frees its place when the connection is dropped, and the
//!   counts of admitted, refused and failed connections ([`ConnCounts`]);
//! - [`supervise`]: a server running on threads of its own ([`Running`]) watched until a
//!   stop, its time, or its own end ([`Ended`]: a failed thread, a client's shutdown),
//!   then stopped with its final counters.

mod accept;
mod limit;
mod stop;
mod supervise;

pub use accept::AcceptBackoff;
pub use limit::{Admitted, ConnCounts, ConnLimit, SharedConnCounts};
pub use stop::Stop;
pub use supervise::{CHECK_EVERY, Ended, Outcome, Running, supervise, supervise_ticking};

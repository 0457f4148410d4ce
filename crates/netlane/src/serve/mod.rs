//! What every netlane server is built of, so that each server's own crate holds only
//! what is its own.
//!
//! - [`Stop`]: the stop signal. A flag every loop can read, and an eventfd every loop
//!   registers with its epoll (or `poll`) set: stopping makes the eventfd readable for
//!   good, so each loop wakes at once, instead of noticing a flag after its poll timeout
//!   (tokio's driver wakes its loop through a registered waker the same way);
//! - [`AcceptBackoff`]: what an acceptor does when `accept` fails (out of descriptors or
//!   memory): waits 10 ms, doubling to 1 s, logged at a limited rate.

mod accept;
mod stop;

pub use accept::AcceptBackoff;
pub use stop::Stop;

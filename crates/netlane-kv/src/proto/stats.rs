//! The protocol's counters, named as memcached names them in `stats`.
//!
//! A worker counts into a plain [`Counters`] (no atomics on the hot path) and publishes
//! it to its [`SharedCounters`] (single writer: relaxed stores, no read-modify-write)
//! after each turn of its event loop; `stats` and the metrics endpoint sum the
//! published copies.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($($(#[doc = $doc:literal])* $name:ident,)*) => {
        /// Per-worker protocol counters (memcached's names).
        #[derive(Debug, Default, Clone, PartialEq, Eq)]
        pub struct Counters {
            $($(#[doc = $doc])* pub $name: u64,)*
        }

        /// A worker's published counters.
        #[derive(Debug, Default)]
        pub struct SharedCounters {
            $($name: AtomicU64,)*
        }

        impl Counters {
            /// Adds `o` into `self`.
            pub fn add(&mut self, o: &Counters) {
                $(self.$name += o.$name;)*
            }

            /// `self - o`, field by field, floored at 0.
            pub fn minus(&self, o: &Counters) -> Counters {
                Counters { $($name: self.$name.saturating_sub(o.$name),)* }
            }

            /// Each counter with its memcached name and its help text.
            pub fn each(&self, mut f: impl FnMut(&'static str, &'static str, u64)) {
                $(f(stringify!($name), concat!($($doc),*).trim(), self.$name);)*
            }
        }

        impl SharedCounters {
            /// Publishes the worker's counters (the worker is the only writer).
            pub fn publish(&self, c: &Counters) {
                $(self.$name.store(c.$name, Ordering::Relaxed);)*
            }

            /// A copy of what was last published.
            pub fn load(&self) -> Counters {
                Counters { $($name: self.$name.load(Ordering::Relaxed),)* }
            }
        }
    };
}

counters! {
    /// Keys asked for by get, gets, gat, gats and mg without T.
    cmd_get,
    /// Storage commands (set, add, replace, append, prepend, cas, ms).
    cmd_set,
    /// flush_all commands.
    cmd_flush,
    /// Touch commands (touch, gat, gats, mg with T).
    cmd_touch,
    /// Meta commands.
    cmd_meta,
    /// Keys found by a get.
    get_hits,
    /// Keys not found by a get.
    get_misses,
    /// Keys a get found expired.
    get_expired,
    /// Keys a get found flushed.
    get_flushed,
    /// Deletes of missing keys.
    delete_misses,
    /// Deletes that removed an item.
    delete_hits,
    /// incr of missing keys.
    incr_misses,
    /// incr that changed an item.
    incr_hits,
    /// decr of missing keys.
    decr_misses,
    /// decr that changed an item.
    decr_hits,
    /// cas on missing keys.
    cas_misses,
    /// cas that stored.
    cas_hits,
    /// cas refused for a changed item.
    cas_badval,
    /// Touches of present keys.
    touch_hits,
    /// Touches of missing keys.
    touch_misses,
    /// Values refused as larger than the item size limit.
    store_too_large,
    /// Values refused for lack of memory.
    store_no_memory,
    /// Bytes read from clients.
    bytes_read,
    /// Bytes written to clients.
    bytes_written,
    /// Commands answered with ERROR or CLIENT_ERROR (malformed input).
    client_errors,
    /// Connections closed for a line longer than the limit.
    lines_too_long,
    /// Turns a connection gave up so others could run (memcached's conn_yields).
    conn_yields,
    /// UDP requests dropped (multi-datagram, no request after the header).
    udp_dropped,
    /// UDP replies over the reply limit, answered with an error instead.
    udp_replies_cut,
}

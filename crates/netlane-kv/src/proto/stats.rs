//! The protocol's counters, named as memcached names them in `stats`.
//!
//! A worker counts into a plain [`Counters`] (no atomics on the hot path) and publishes
//! it to its [`SharedCounters`] (single writer: relaxed stores, no read-modify-write)
//! after each turn of its event loop; `stats` and the metrics endpoint sum the
//! published copies.

netlane_counters::counters! {
    /// Per-worker protocol counters (memcached's names).
    pub struct Counters, shared SharedCounters {
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
}

//! One cached item.

use std::sync::Arc;

/// An expiry time that never comes.
pub const NEVER: u64 = u64::MAX;

/// Bytes charged per item beyond its key and value's allocation: the item itself in
/// its shard's slot vector (64 bytes) and its entry in the hash table (a 4-byte index
/// and a control byte at a load of up to 7/8).
pub const ITEM_OVERHEAD: usize = 72;

/// Bytes an item with this key and value length is charged: [`ITEM_OVERHEAD`] and the
/// allocation holding key and value (behind the 16 bytes of its reference counts) as
/// glibc's malloc sizes it (the request and an 8-byte header, rounded up to 16 bytes,
/// at least 32).
pub fn accounted(key_len: usize, value_len: usize) -> u64 {
    let chunk = (key_len + value_len + 16 + 8).div_ceil(16).max(2) * 16;
    (chunk + ITEM_OVERHEAD) as u64
}

/// A key, its value and what memcached keeps beside them.
///
/// The key, value and size are fixed once stored (a new value is a new store through
/// [`super::Slot::store`]); the metadata can change in place.
#[derive(Debug)]
pub struct Item {
    /// The key and then the value, in one allocation: a lookup that compares the key
    /// has the value's first bytes in cache too. Shared with replies that send the value
    /// by reference.
    pub(crate) data: Arc<[u8]>,
    pub(crate) key_len: u8,
    pub(crate) hash: u64,
    pub(crate) flags: u32,
    /// Expiry deadline (ms on the caller's clock), [`NEVER`] for none.
    pub(crate) exp: u64,
    /// The client-visible CAS value.
    pub(crate) cas: u64,
    /// Internal store order (flush_all compares it); never set by a client.
    pub(crate) seq: u64,
    /// Last access (ms).
    pub(crate) last_access: u64,
    /// Touched since the CLOCK hand last passed.
    pub(crate) referenced: bool,
    /// Fetched at least once.
    pub(crate) fetched: bool,
    /// Marked stale by a meta delete with `I`.
    pub(crate) stale: bool,
    /// A client was told it won the right to recache it (meta `W`).
    pub(crate) win_sent: bool,
    /// Its key was sent in base64 (meta `b`): meta replies return it that way.
    pub(crate) key_binary: bool,
    /// The size class memcached would keep it in ([`super::Classes`]).
    pub(crate) class: u8,
}

impl Item {
    /// The key.
    pub fn key(&self) -> &[u8] {
        &self.data[..usize::from(self.key_len)]
    }

    /// The value.
    pub fn value(&self) -> &[u8] {
        &self.data[usize::from(self.key_len)..]
    }

    /// The allocation holding key and value, and where the value is in it: for a reply
    /// that sends the value by reference.
    pub fn shared_value(&self) -> (&Arc<[u8]>, std::ops::Range<usize>) {
        (&self.data, usize::from(self.key_len)..self.data.len())
    }

    /// The client flags.
    pub fn flags(&self) -> u32 {
        self.flags
    }

    /// Expiry deadline in ms, [`NEVER`] for none.
    pub fn exp(&self) -> u64 {
        self.exp
    }

    /// The CAS value.
    pub fn cas(&self) -> u64 {
        self.cas
    }

    /// Last access time, ms.
    pub fn last_access(&self) -> u64 {
        self.last_access
    }

    /// Fetched before.
    pub fn fetched(&self) -> bool {
        self.fetched
    }

    /// Marked stale (meta delete `I`).
    pub fn stale(&self) -> bool {
        self.stale
    }

    /// A recache win was handed out (meta `W` was sent).
    pub fn win_sent(&self) -> bool {
        self.win_sent
    }

    /// Its key was stored in base64 (meta `b`).
    pub fn key_binary(&self) -> bool {
        self.key_binary
    }

    /// Marks its key as sent in base64.
    pub fn set_key_binary(&mut self, binary: bool) {
        self.key_binary = binary;
    }

    /// The size class it is reported in.
    pub fn class(&self) -> u32 {
        u32::from(self.class)
    }

    /// Its size in memcached's layout ([`super::Classes::item_size`]; a store without CAS
    /// values keeps 0 in every item).
    pub fn requested(&self) -> u64 {
        super::Classes::item_size(usize::from(self.key_len), self.value().len(), self.flags, self.cas != 0)
    }

    /// Bytes charged for it.
    pub fn accounted(&self) -> u64 {
        accounted(usize::from(self.key_len), self.data.len() - usize::from(self.key_len))
    }

    /// Sets the client flags.
    pub fn set_flags(&mut self, flags: u32) {
        self.flags = flags;
    }

    /// Sets the expiry deadline (ms, [`NEVER`] for none).
    pub fn set_exp(&mut self, exp: u64) {
        self.exp = exp;
    }

    /// Marks it stale or fresh.
    pub fn set_stale(&mut self, stale: bool) {
        self.stale = stale;
    }

    /// Records that a recache win was (or was not) handed out.
    pub fn set_win_sent(&mut self, sent: bool) {
        self.win_sent = sent;
    }

    /// Whether it is gone at `now` given the flush mark.
    pub(crate) fn dead(&self, now: u64, flushed_through: u64) -> Option<super::Gone> {
        if self.seq <= flushed_through {
            Some(super::Gone::Flushed)
        } else if self.exp <= now {
            Some(super::Gone::Expired)
        } else {
            None
        }
    }
}

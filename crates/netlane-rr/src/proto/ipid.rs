//! The IP identification of the datagrams the server frames itself, counted per
//! destination as the kernel counts its own (`ip_idents` in net/ipv4/route.c): a fixed
//! table of counters, a datagram taking the next value of the counter its source,
//! destination and protocol hash to under a key chosen per run.
//!
//! One counter for every destination wraps IPv4's 16 bits after 65,536 datagrams to all
//! clients together: at 40,000 responses a second, every 1.6 s. A client still holding
//! fragments of a datagram from then (Linux keeps them for 30 s) may join them to a new
//! datagram that has the same identification: a misassembly, which the UDP checksum
//! misses once in 65,536 and the message's own checksum and payload pattern do not.
//! With a counter per destination an identification comes back at a destination only
//! after 65,536 datagrams to it (and to the few destinations that share its counter).
//! The table's size is fixed: however many clients there are, it does not grow.
//!
//! Sans-IO: the key comes from the caller.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;

/// Counters in the table (the kernel sizes its own from memory; a server's clients are
/// fewer).
pub const COUNTERS: usize = 2048;

/// IP identifications, per destination.
#[derive(Debug, Clone)]
pub struct IpIds {
    key: u64,
    counters: Box<[u32]>,
}

impl IpIds {
    /// A table keyed by `key`: which counter a destination takes, and where each
    /// counter starts, follow from it (so two runs' identifications differ).
    pub fn new(key: u64) -> IpIds {
        let counters = (0..COUNTERS).map(|i| keyed(key, &i) as u32).collect();
        IpIds { key, counters }
    }

    /// The identification of the next datagram from `src` to `dst` of protocol `proto`
    /// (IPv4 uses its low 16 bits, IPv6's fragment header all 32).
    pub fn next(&mut self, src: IpAddr, dst: IpAddr, proto: u8) -> u32 {
        let c = &mut self.counters[self.counter(src, dst, proto)];
        *c = c.wrapping_add(1);
        *c
    }

    /// The counter datagrams from `src` to `dst` of protocol `proto` take.
    pub fn counter(&self, src: IpAddr, dst: IpAddr, proto: u8) -> usize {
        (keyed(self.key, &(src, dst, proto)) % COUNTERS as u64) as usize
    }
}

/// SipHash of `key` and `v` together.
fn keyed(key: u64, v: &impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    v.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    const UDP: u8 = 17;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn each_destination_counts_on_its_own() {
        let mut ids = IpIds::new(7);
        let (src, a) = (ip("10.0.0.1"), ip("10.0.0.2"));
        // A destination that does not share a's counter.
        let b = (3..=254)
            .map(|i| ip(&format!("10.0.0.{i}")))
            .find(|b| ids.counter(src, *b, UDP) != ids.counter(src, a, UDP));
        let b = b.unwrap();
        let first = ids.next(src, a, UDP);
        for _ in 0..1000 {
            ids.next(src, b, UDP);
        }
        assert_eq!(ids.next(src, a, UDP), first.wrapping_add(1), "a's identifications go on from where they were");
    }

    #[test]
    fn an_identification_comes_back_at_a_destination_only_after_65536_datagrams_to_it() {
        let mut ids = IpIds::new(42);
        let (src, dst) = (ip("10.0.0.1"), ip("10.0.0.9"));
        let v4: Vec<u16> = (0..=65_536).map(|_| ids.next(src, dst, UDP) as u16).collect();
        let mut seen = std::collections::HashSet::new();
        assert!(v4[..65_536].iter().all(|id| seen.insert(*id)), "65,536 distinct identifications");
        assert_eq!(v4[65_536], v4[0], "the 65,537th repeats the first");
    }

    #[test]
    fn the_key_decides_where_counters_start_and_which_a_destination_takes() {
        let (src, dst) = (ip("fd00::1"), ip("fd00::2"));
        let (mut a, mut b) = (IpIds::new(1), IpIds::new(2));
        assert_ne!(a.next(src, dst, UDP), b.next(src, dst, UDP));
        let spread: std::collections::HashSet<usize> =
            (0..64).map(|i| a.counter(src, ip(&format!("fd00::{:x}", i + 2)), UDP)).collect();
        assert!(spread.len() > 48, "64 destinations over {} counters", spread.len());
    }
}

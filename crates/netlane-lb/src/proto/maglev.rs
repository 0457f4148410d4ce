//! Weighted Maglev consistent hashing (Eisenbud et al., NSDI 2016, section 3.4), with
//! weights honoured over the whole fill.
//!
//! Each backend has a permutation of the `M` ring slots, `offset + j * skip (mod M)`,
//! from two hashes of its identity (`M` prime, so every `skip` in `1..M` visits every
//! slot). Backends take turns claiming their next free slot until all are taken. Weights
//! set how many turns a backend gets: every round each backend earns its weight in
//! credit and takes one turn per `max_weight` of credit. Katran's "v1" applied weights
//! only in a first pass and then gave every backend one turn per round, so weights
//! {1, 2, 4} came out equal; here the shares follow the weights on the whole ring
//! (tested to within 1% on a 65537-slot ring).
//!
//! The fill is deterministic: it depends only on the backends' identities and weights
//! (turns go in identity order), so the same set gives the same ring in any process, and
//! adding or removing one backend moves about `M / N` slots (reported by [`moved`]).

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// A ring slot's owner: an index into the backend list given to [`build`].
pub type Slot = u32;

/// No backend (a ring built from an empty or all-zero-weight set).
pub const EMPTY: Slot = u32::MAX;

/// Smallest ring size accepted.
pub const MIN_RING: u32 = 7;

/// Largest ring (a prime, four times Katran's 65,537): building a ring costs time in
/// proportion to its size, and every VIP's ring is a map of this many slots.
pub const MAX_RING: u32 = 262_139;

/// A backend as the ring sees it: a stable identity and a weight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    /// Identity bytes (e.g. the real's address); equal identities are the same backend.
    pub key: Vec<u8>,
    /// Relative weight; 0 takes the backend out of the ring.
    pub weight: u32,
}

/// Why a ring cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    /// The size is not a prime at least [`MIN_RING`].
    #[error("ring size {0} must be a prime of at least 7 (e.g. 65537)")]
    NotPrime(u32),
    /// More backends with weight than slots.
    #[error("{backends} backends cannot share a ring of {size} slots")]
    TooManyBackends {
        /// Backends with a weight.
        backends: usize,
        /// Ring size.
        size: u32,
    },
    /// Two backends share an identity.
    #[error("backend {0} appears twice")]
    Duplicate(usize),
}

/// Whether `n` is prime (trial division; ring sizes are small).
pub fn is_prime(n: u32) -> bool {
    if n < 2 {
        return false;
    }
    if n.is_multiple_of(2) {
        return n == 2;
    }
    let mut d = 3u32;
    while u64::from(d) * u64::from(d) <= u64::from(n) {
        if n.is_multiple_of(d) {
            return false;
        }
        d += 2;
    }
    true
}

fn permutation(key: &[u8], size: u32) -> (u64, u64) {
    let m = u64::from(size);
    let offset = xxh3_64_with_seed(key, 0x6d61_676c_6576_3031) % m;
    let skip = xxh3_64_with_seed(key, 0x6d61_676c_6576_3032) % (m - 1) + 1;
    (offset, skip)
}

/// Fills a ring of `size` slots (a prime) from `backends`; slot values index into
/// `backends`. Backends of weight 0 get no slots; with none left, every slot is
/// [`EMPTY`].
pub fn build(backends: &[Backend], size: u32) -> Result<Vec<Slot>, RingError> {
    if size < MIN_RING || !is_prime(size) {
        return Err(RingError::NotPrime(size));
    }
    let mut seen = std::collections::HashSet::with_capacity(backends.len());
    for (i, b) in backends.iter().enumerate() {
        if !seen.insert(b.key.as_slice()) {
            return Err(RingError::Duplicate(i));
        }
    }
    // Turns go in the order of the backends' identities, so the ring does not depend on
    // the order the backends were listed in.
    let mut live: Vec<usize> = (0..backends.len()).filter(|&i| backends[i].weight > 0).collect();
    live.sort_by(|&a, &b| backends[a].key.cmp(&backends[b].key));
    if live.len() > size as usize {
        return Err(RingError::TooManyBackends { backends: live.len(), size });
    }
    let mut ring = vec![EMPTY; size as usize];
    if live.is_empty() {
        return Ok(ring);
    }
    let m = u64::from(size);
    let perms: Vec<(u64, u64)> = live.iter().map(|&i| permutation(&backends[i].key, size)).collect();
    let mut next = vec![0u64; live.len()];
    let max_weight = live.iter().map(|&i| u64::from(backends[i].weight)).max().unwrap_or(1);
    let mut credit = vec![0u64; live.len()];
    let mut filled = 0u64;
    while filled < m {
        for (k, &i) in live.iter().enumerate() {
            credit[k] += u64::from(backends[i].weight);
            while credit[k] >= max_weight && filled < m {
                credit[k] -= max_weight;
                let (offset, skip) = perms[k];
                // The permutation visits every slot once in M steps; a free one exists
                // while filled < M.
                loop {
                    let c = ((offset + next[k] * skip) % m) as usize;
                    next[k] += 1;
                    if ring[c] == EMPTY {
                        ring[c] = i as Slot;
                        filled += 1;
                        break;
                    }
                }
            }
            if filled == m {
                break;
            }
        }
    }
    Ok(ring)
}

/// Slots whose backend changed between two rings of one size, comparing identities
/// (`old_keys[slot]` vs `new_keys[slot]`), so reordering the backend list moves nothing.
pub fn moved(old: &[Slot], old_backends: &[Backend], new: &[Slot], new_backends: &[Backend]) -> usize {
    (0..old.len().max(new.len())).filter(|&s| owner(old, old_backends, s) != owner(new, new_backends, s)).count()
}

fn owner<'a>(ring: &[Slot], backends: &'a [Backend], slot: usize) -> Option<&'a [u8]> {
    ring.get(slot).and_then(|&b| backends.get(b as usize)).map(|b| b.key.as_slice())
}

/// Slots per backend, indexed like `backends`.
pub fn shares(ring: &[Slot], backends: usize) -> Vec<usize> {
    let mut v = vec![0; backends];
    for &s in ring {
        if let Some(c) = v.get_mut(s as usize) {
            *c += 1;
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn backends(weights: &[u32]) -> Vec<Backend> {
        weights
            .iter()
            .enumerate()
            .map(|(i, &w)| Backend { key: format!("10.0.0.{i}").into_bytes(), weight: w })
            .collect()
    }

    #[test]
    fn primes_and_bad_sizes() {
        assert!(is_prime(65537) && is_prime(7) && is_prime(2) && !is_prime(65536) && !is_prime(1) && !is_prime(0));
        assert_eq!(build(&backends(&[1]), 65536), Err(RingError::NotPrime(65536)));
        assert_eq!(build(&backends(&[1]), 5), Err(RingError::NotPrime(5)));
        let mut dup = backends(&[1, 1]);
        dup[1].key = dup[0].key.clone();
        assert_eq!(build(&dup, 7), Err(RingError::Duplicate(1)));
        assert!(matches!(build(&backends(&[1; 8]), 7), Err(RingError::TooManyBackends { .. })));
        assert!(build(&backends(&[0, 0]), 7).unwrap().iter().all(|&s| s == EMPTY));
    }

    #[test]
    fn weights_1_2_4_give_1_2_4_shares() {
        // Katran's v1 gave equal shares here; v2 gives 9362/18725/37450.
        let b = backends(&[1, 2, 4]);
        let ring = build(&b, 65537).unwrap();
        let s = shares(&ring, 3);
        assert_eq!(s.iter().sum::<usize>(), 65537);
        for (i, w) in [1.0, 2.0, 4.0].iter().enumerate() {
            let want = 65537.0 * w / 7.0;
            assert!((s[i] as f64 - want).abs() / want < 0.01, "backend {i}: {} slots, want {want:.0}", s[i]);
        }
    }

    #[test]
    fn the_ring_does_not_depend_on_backend_order() {
        let b = backends(&[3, 1, 2, 5]);
        let mut r = b.clone();
        r.reverse();
        let (x, y) = (build(&b, 251).unwrap(), build(&r, 251).unwrap());
        assert_eq!(moved(&x, &b, &y, &r), 0);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        #[test]
        fn shares_follow_weights_within_1_percent(weights in proptest::collection::vec(1u32..=10, 2..12)) {
            let b = backends(&weights);
            let ring = build(&b, 65537).unwrap();
            let s = shares(&ring, b.len());
            let total: f64 = weights.iter().map(|&w| f64::from(w)).sum();
            for (i, &w) in weights.iter().enumerate() {
                let want = 65537.0 * f64::from(w) / total;
                // 1% of the backend's share, or one slot in a round for tiny shares.
                prop_assert!((s[i] as f64 - want).abs() <= (want * 0.01).max(2.0),
                    "backend {} weight {}: {} slots, want {:.0}", i, w, s[i], want);
            }
        }

        #[test]
        fn adding_or_removing_one_backend_moves_little(weights in proptest::collection::vec(1u32..=4, 3..20), pick: usize) {
            let b = backends(&weights);
            let ring = build(&b, 65537).unwrap();
            // Remove one: its own slots must move; others should mostly stay.
            let gone = pick % b.len();
            let mut fewer = b.clone();
            fewer.remove(gone);
            let after = build(&fewer, 65537).unwrap();
            let own = shares(&ring, b.len())[gone];
            let m = moved(&ring, &b, &after, &fewer);
            prop_assert!(m >= own, "all of the removed backend's {} slots move (moved {})", own, m);
            // Maglev's disruption bound in practice: a few percent of the ring beyond the
            // removed backend's own share.
            prop_assert!(m <= own + 65537 * 4 / 100, "moved {} for a backend owning {}", m, own);
            // Add one back: symmetric.
            let back = build(&b, 65537).unwrap();
            prop_assert_eq!(moved(&after, &fewer, &back, &b), m);
        }
    }
}

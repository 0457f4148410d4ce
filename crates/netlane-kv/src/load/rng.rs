//! A small seeded generator: xoshiro256** (Blackman and Vigna, "Scrambled linear
//! pseudorandom number generators", 2021), its state filled by SplitMix64 from a 64-bit
//! seed as the authors recommend.
//!
//! Not cryptographic; fast (a few instructions per draw), with a 2^256 - 1 period and
//! good equidistribution, which is what sampling arrivals and keys needs. The same seed
//! gives the same sequence on every platform: runs are reproducible.

/// SplitMix64's output function (Steele, Lea and Flood, "Fast splittable pseudorandom
/// number generators", 2014): a bijective 64-bit mix. Also the hash that derives
/// per-key sizes from a key's index.
pub(super) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// SplitMix64's increment (the golden ratio in 64-bit fixed point).
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// A point strictly inside (0, 1) from the top 52 bits of `x`, at the middle of its step:
/// never 0 (logarithms and negative powers of it stay finite) and never 1 (the largest,
/// 1 - 2^-53, is exact in an `f64`; with 53 bits it would round up to 1).
pub(super) fn open_unit_from(x: u64) -> f64 {
    ((x >> 12) as f64 + 0.5) * (1.0 / (1u64 << 52) as f64)
}

/// xoshiro256**.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// The generator for `seed`.
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(GOLDEN);
            mix64(x)
        };
        // SplitMix64 never yields four zero words in a row, so the state is never the
        // all-zero one xoshiro cannot leave.
        Rng { s: [next(), next(), next(), next()] }
    }

    /// The generator for stream `stream` of `seed` (one per connection, say): streams of
    /// one seed are seeded from distinct mixes, so they do not share a sequence.
    pub fn stream(seed: u64, stream: u64) -> Self {
        Rng::new(mix64(seed) ^ mix64(stream.wrapping_mul(GOLDEN).wrapping_add(1)))
    }

    /// A child generator seeded from this one's next output, for a part that must draw
    /// independently of the others (the schedule apart from the workload, say).
    pub fn fork(&mut self) -> Rng {
        Rng::new(self.next_u64())
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let out = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        out
    }

    /// Fills `out` with random bytes, eight from each draw.
    pub fn fill(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }

    /// Uniform on [0, 1), in steps of 2^-53.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform on the open interval (0, 1): safe under `ln` and negative powers.
    pub fn open_unit(&mut self) -> f64 {
        open_unit_from(self.next_u64())
    }

    /// Uniform on `0..n`, without modulo bias (Lemire, "Fast random integer generation in
    /// an interval", 2019). `n == 0` yields 0.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let mut m = u128::from(self.next_u64()) * u128::from(n);
        if (m as u64) < n {
            // Reject the low products that would make some outputs more likely.
            let threshold = n.wrapping_neg() % n;
            while (m as u64) < threshold {
                m = u128::from(self.next_u64()) * u128::from(n);
            }
        }
        (m >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_takes_eight_bytes_from_each_draw_and_part_of_the_last() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        let mut out = [0u8; 11];
        a.fill(&mut out);
        let (x, y) = (b.next_u64().to_le_bytes(), b.next_u64().to_le_bytes());
        assert_eq!(out[..8], x);
        assert_eq!(out[8..], y[..3]);
        // Nothing more was drawn than the two.
        assert_eq!(a.next_u64(), b.next_u64());
    }

    #[test]
    fn xoshiro256starstar_matches_the_reference_sequence() {
        // The reference implementation's output from state {1, 2, 3, 4} (the vector
        // rand_xoshiro checks against).
        let mut r = Rng { s: [1, 2, 3, 4] };
        let expected: [u64; 10] = [
            11520,
            0,
            1509978240,
            1215971899390074240,
            1216172134540287360,
            607988272756665600,
            16172922978634559625,
            8476171486693032832,
            10595114339597558777,
            2904607092377533576,
        ];
        for e in expected {
            assert_eq!(r.next_u64(), e);
        }
    }

    #[test]
    fn a_seed_gives_one_sequence_and_streams_differ() {
        let a: Vec<u64> = (0..8)
            .map({
                let mut r = Rng::new(42);
                move |_| r.next_u64()
            })
            .collect();
        let mut b = Rng::new(42);
        assert!(a.iter().all(|&x| x == b.next_u64()));
        let mut s0 = Rng::stream(42, 0);
        let mut s1 = Rng::stream(42, 1);
        assert_ne!(s0.next_u64(), s1.next_u64());
        // A seed of zero is fine (SplitMix64 fills the state).
        assert_ne!(Rng::new(0).next_u64(), 0);
    }

    #[test]
    fn units_stay_in_their_intervals() {
        assert_eq!(open_unit_from(0), 2f64.powi(-53));
        assert_eq!(open_unit_from(u64::MAX), 1.0 - 2f64.powi(-53));
        let mut r = Rng::new(7);
        for _ in 0..10_000 {
            let u = r.unit();
            assert!((0.0..1.0).contains(&u));
            let o = r.open_unit();
            assert!(o > 0.0 && o < 1.0);
        }
    }

    #[test]
    fn below_is_in_range_and_unbiased() {
        let mut r = Rng::new(3);
        assert_eq!(r.below(0), 0);
        assert_eq!(r.below(1), 0);
        // Six faces, 600k throws: each within 1.5% of 100k (over 5 standard deviations).
        let mut counts = [0u32; 6];
        for _ in 0..600_000 {
            counts[r.below(6) as usize] += 1;
        }
        for c in counts {
            assert!((98_500..=101_500).contains(&c), "{counts:?}");
        }
        // An n that makes the rejection step matter.
        let n = (1u64 << 63) + 1;
        assert!((0..1000).all(|_| r.below(n) < n));
    }
}

//! What is asked: the key space, which keys, what sizes, gets or sets.
//!
//! Invariants:
//! - Key `i` is `key:` and `i` in decimal, zero-padded to the key's length: the same
//!   bytes in every run and every process. Keys are at least as long as the
//!   largest index needs (`key:` and its digits) and at most [`KEY_MAX`] bytes; a
//!   sampled length below that floor is raised to it (as mutilate does), a fixed or
//!   uniform size whose lower bound is below it is refused.
//! - A key's length and its value's length are functions of the key's index alone (a hash
//!   of the index through the size distribution's inverse CDF), not of the seed or the
//!   run: the warm-up's set and every later set of a key write the same size, and two
//!   load generators agree. Values are clamped to `1..=item_max`.
//! - Popularity rank `r` (1 the most popular) is key index `r - 1`.
//!
//! The ETC sizes are Facebook's memcached "ETC" pool as measured by Atikoglu et al.,
//! "Workload analysis of a large-scale key-value store" (SIGMETRICS 2012), in the form
//! mutilate's `fb_key` and `fb_value` generators give them:
//! - keys: generalized extreme value, location 30.7984, scale 8.20449, shape 0.078688;
//! - values: mutilate's table of the measured probabilities of 0..=14 bytes (together
//!   0.44154), then the paper's generalized Pareto fit (scale 214.476, shape 0.348238)
//!   as the tail, located at 15 bytes where the table ends.
//!
//! mutilate's source builds its Pareto generators with two arguments where the
//! constructor takes (location, scale, shape), so the tail it actually draws has location
//! 214.476, scale 0.348238 and shape 1 (an infinite mean); we follow the paper's fit,
//! which is what `fb_value` was meant to be.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

use super::codec::Request;
use super::rng::{Rng, mix64, open_unit_from};

/// The longest key memcached accepts (`KEY_MAX_LENGTH`).
pub const KEY_MAX: usize = 250;
/// The most keys in a key space: ranks stay exact in an `f64`, and indexes fit 13 digits.
pub const MAX_KEYS: u64 = 1 << 40;
/// The most keys in one multi-get.
pub const MAX_MULTIGET: u32 = 1024;
/// The largest item limit accepted (memcached's own bound for `-I`).
pub const MAX_ITEM: u32 = 1 << 30;
/// The largest Zipf exponent accepted (at 10 the top key already takes 99.9% of
/// requests).
pub const MAX_ZIPF: f64 = 10.0;

const KEY_PREFIX: &[u8] = b"key:";
/// Salts that make a key's length and its value's length independent draws.
const KEY_SALT: u64 = 0x6b65_795f_6c65_6e00;
const VALUE_SALT: u64 = 0x7661_6c75_655f_6c00;

/// fb_key: generalized extreme value (location, scale, shape).
const ETC_KEY: (f64, f64, f64) = (30.7984, 8.20449, 0.078688);
/// fb_value's head: P(value is `i` bytes) for `i` in 0..=14.
const ETC_VALUE_HEAD: [f64; 15] = [
    0.00536, 0.00047, 0.17820, 0.09239, 0.00018, 0.02740, 0.00065, 0.00606, 0.00023, 0.00837, 0.00837, 0.08989,
    0.00092, 0.00326, 0.01980,
];
/// fb_value's tail: generalized Pareto (location, scale, shape).
const ETC_VALUE_TAIL: (f64, f64, f64) = (15.0, 214.476, 0.348238);

/// Which keys are asked for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KeyDist {
    /// Every key equally often.
    Uniform,
    /// Zipf: rank `r` asked for in proportion to `r^-s` (`s` around 0.99 for web caches).
    Zipf {
        /// The exponent, in `(0, MAX_ZIPF]`.
        s: f64,
    },
}

/// How long keys or values are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeDist {
    /// Always this many bytes.
    Fixed(u32),
    /// Uniform over `min..=max` bytes.
    Uniform {
        /// Shortest.
        min: u32,
        /// Longest.
        max: u32,
    },
    /// Facebook's ETC pool: fb_key for keys, fb_value for values (see the module docs).
    Etc,
}

/// A workload as given on the command line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WorkloadSpec {
    /// Keys in the key space.
    pub keys: u64,
    /// Which keys are asked for.
    pub key_dist: KeyDist,
    /// Key lengths.
    pub key_size: SizeDist,
    /// Value lengths.
    pub value_size: SizeDist,
    /// Fraction of requests that are gets; the rest are sets.
    pub get_ratio: f64,
    /// Keys per get.
    pub multiget: u32,
    /// The server's item size limit (memcached's `-I`): values are clamped to it.
    pub item_max: u32,
}

impl Default for WorkloadSpec {
    /// mutilate's sizes (30-byte keys, 200-byte values) over 100,000 keys, 90% gets.
    fn default() -> Self {
        WorkloadSpec {
            keys: 100_000,
            key_dist: KeyDist::Uniform,
            key_size: SizeDist::Fixed(30),
            value_size: SizeDist::Fixed(200),
            get_ratio: 0.9,
            multiget: 1,
            item_max: 1 << 20,
        }
    }
}

/// A command-line value that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{what} {input:?}: {problem}")]
pub struct ParseError {
    /// What was being parsed.
    pub what: &'static str,
    /// The whole input.
    pub input: String,
    /// What is wrong with it, naming the bad part.
    pub problem: String,
}

/// A workload that cannot be generated.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum WorkloadError {
    /// No keys, or more than [`MAX_KEYS`].
    #[error("{0} keys: must be 1..={MAX_KEYS}")]
    Keys(u64),
    /// Not a fraction.
    #[error("get ratio {0}: must be within 0..=1")]
    GetRatio(f64),
    /// No keys per get, or more than [`MAX_MULTIGET`].
    #[error("multi-get of {0} keys: must be 1..={MAX_MULTIGET}")]
    Multiget(u32),
    /// An item limit outside `1..=MAX_ITEM`.
    #[error("item size limit {0} bytes: must be 1..={MAX_ITEM}")]
    ItemMax(u32),
    /// Key sizes that cannot name every key, or longer than memcached allows.
    #[error("key size {dist}: {keys} keys need keys of {shortest}..={KEY_MAX} bytes")]
    KeySize {
        /// The sizes asked for.
        dist: SizeDist,
        /// Keys in the key space.
        keys: u64,
        /// The shortest key that names them all.
        shortest: u32,
    },
    /// Value sizes outside `1..=item_max`.
    #[error("value size {dist}: must be within 1..={item_max} bytes")]
    ValueSize {
        /// The sizes asked for.
        dist: SizeDist,
        /// The item size limit.
        item_max: u32,
    },
    /// A Zipf exponent outside `(0, MAX_ZIPF]`.
    #[error("Zipf exponent {0}: must be above 0 and at most {MAX_ZIPF}")]
    Zipf(f64),
}

fn valid_zipf(s: f64) -> bool {
    s > 0.0 && s <= MAX_ZIPF
}

impl FromStr for KeyDist {
    type Err = ParseError;

    /// `uniform` or `zipf:S`.
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = |problem: String| ParseError { what: "key distribution", input: input.to_owned(), problem };
        match input.split_once(':') {
            None if input == "uniform" => Ok(KeyDist::Uniform),
            Some(("zipf", s)) => {
                let s: f64 = s.parse().map_err(|_| err(format!("exponent {s:?} is not a number")))?;
                if valid_zipf(s) {
                    Ok(KeyDist::Zipf { s })
                } else {
                    Err(err(format!("exponent {s} must be above 0 and at most {MAX_ZIPF}")))
                }
            }
            _ => Err(err("expected uniform or zipf:EXPONENT (zipf:0.99, say)".into())),
        }
    }
}

impl fmt::Display for KeyDist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyDist::Uniform => f.write_str("uniform"),
            KeyDist::Zipf { s } => write!(f, "zipf:{s}"),
        }
    }
}

impl FromStr for SizeDist {
    type Err = ParseError;

    /// `N`, `uniform:MIN,MAX` or `etc` (bytes).
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = |problem: String| ParseError { what: "size", input: input.to_owned(), problem };
        let bytes = |s: &str| s.parse::<u32>().map_err(|_| err(format!("{s:?} is not a size in bytes")));
        if input == "etc" {
            return Ok(SizeDist::Etc);
        }
        if let Some(range) = input.strip_prefix("uniform:") {
            let Some((min, max)) = range.split_once(',') else {
                return Err(err("expected uniform:MIN,MAX".into()));
            };
            let (min, max) = (bytes(min)?, bytes(max)?);
            if min > max {
                return Err(err(format!("minimum {min} is above maximum {max}")));
            }
            return Ok(SizeDist::Uniform { min, max });
        }
        if input.bytes().all(|b| b.is_ascii_digit()) && !input.is_empty() {
            return bytes(input).map(SizeDist::Fixed);
        }
        Err(err("expected a size in bytes, uniform:MIN,MAX or etc".into()))
    }
}

impl fmt::Display for SizeDist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SizeDist::Fixed(n) => write!(f, "{n}"),
            SizeDist::Uniform { min, max } => write!(f, "uniform:{min},{max}"),
            SizeDist::Etc => f.write_str("etc"),
        }
    }
}

/// One key: its index and its length; its bytes are written on demand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    index: u64,
    len: u8,
}

impl Key {
    /// The key's index in the key space.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// The key's length in bytes.
    pub fn byte_len(&self) -> usize {
        usize::from(self.len)
    }

    /// Appends the key's bytes.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(KEY_PREFIX);
        push_decimal(out, self.index, self.byte_len() - KEY_PREFIX.len());
    }
}

/// Appends `v` in decimal, left-padded with zeros to `width` digits.
pub(super) fn push_decimal(out: &mut Vec<u8>, v: u64, width: usize) {
    let digits = v.checked_ilog10().map_or(1, |d| d as usize + 1);
    out.resize(out.len() + width.saturating_sub(digits), b'0');
    crate::proto::reply::push_u64(out, v);
}

fn digits(v: u64) -> u32 {
    v.checked_ilog10().unwrap_or(0) + 1
}

/// A size distribution resolved for keys or values, with its clamp.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    dist: Shape,
    lo: u32,
    hi: u32,
    salt: u64,
}

#[derive(Debug, Clone, Copy)]
enum Shape {
    Fixed(u32),
    Uniform { min: u32, max: u32 },
    EtcKey,
    EtcValue,
}

impl Sizes {
    /// The size for key `index`: a function of the index alone.
    fn of(&self, index: u64) -> u32 {
        let hash = mix64(index ^ self.salt);
        let x = match self.dist {
            Shape::Fixed(n) => return n,
            // The high half of hash * span: below span, without the rounding a float
            // product could add.
            Shape::Uniform { min, max } => {
                let span = u128::from(max - min) + 1;
                return min + ((u128::from(hash) * span) >> 64) as u32;
            }
            Shape::EtcKey => gev_quantile(ETC_KEY, open_unit_from(hash)),
            Shape::EtcValue => etc_value_quantile(open_unit_from(hash)),
        };
        // Infinite draws (the tails' far ends) clamp to the top; NaN cannot come from a
        // unit strictly inside (0, 1), but would clamp to the bottom.
        if x.is_nan() { self.lo } else { x.round().clamp(f64::from(self.lo), f64::from(self.hi)) as u32 }
    }
}

/// The generalized extreme value distribution's inverse CDF (mutilate's `GEV`).
fn gev_quantile((loc, scale, shape): (f64, f64, f64), u: f64) -> f64 {
    loc + scale * ((-u.ln()).powf(-shape) - 1.0) / shape
}

/// The generalized Pareto distribution's inverse CDF (mutilate's `GPareto`).
fn gpareto_quantile((loc, scale, shape): (f64, f64, f64), u: f64) -> f64 {
    loc + scale * ((1.0 - u).powf(-shape) - 1.0) / shape
}

/// fb_value's inverse CDF: the measured head, then the Pareto tail.
fn etc_value_quantile(u: f64) -> f64 {
    let mut cum = 0.0;
    for (bytes, p) in ETC_VALUE_HEAD.iter().enumerate() {
        cum += p;
        if u < cum {
            return bytes as f64;
        }
    }
    // Rescale the rest of the unit interval onto the tail.
    gpareto_quantile(ETC_VALUE_TAIL, (u - cum) / (1.0 - cum))
}

/// Zipf ranks by rejection-inversion (Hörmann and Derflinger, "Rejection-inversion to
/// generate variates from monotone discrete distributions", 1996), as in Apache Commons
/// RNG's `RejectionInversionZipfSampler`: constant time and memory per draw for any
/// number of keys, exact for every exponent above 0.
#[derive(Debug, Clone, Copy)]
struct Zipf {
    n: f64,
    s: f64,
    h_integral_x1: f64,
    h_integral_n: f64,
    threshold: f64,
}

impl Zipf {
    fn new(n: u64, s: f64) -> Self {
        let h_integral_x1 = h_integral(1.5, s) - 1.0;
        let h_integral_n = h_integral(n as f64 + 0.5, s);
        let threshold = 2.0 - h_integral_inverse(h_integral(2.5, s) - h(2.0, s), s);
        Zipf { n: n as f64, s, h_integral_x1, h_integral_n, threshold }
    }

    /// A rank in `1..=n`, rank `k` with probability proportional to `k^-s`.
    fn rank(&self, rng: &mut Rng) -> u64 {
        loop {
            // Uniform on (h_integral_x1, h_integral_n]: the area under the hat function.
            let u = self.h_integral_n + rng.unit() * (self.h_integral_x1 - self.h_integral_n);
            let x = h_integral_inverse(u, self.s);
            let k = (x + 0.5).floor().clamp(1.0, self.n);
            // Accept at once when the hat and the histogram agree around k (almost
            // always), otherwise when u falls under k's bar.
            if k - x <= self.threshold || u >= h_integral(k + 0.5, self.s) - h(k, self.s) {
                return k as u64;
            }
        }
    }
}

/// The hat function `x^-s`.
fn h(x: f64, s: f64) -> f64 {
    (-s * x.ln()).exp()
}

/// `∫ x^-s dx`, written to stay accurate near `s = 1`.
fn h_integral(x: f64, s: f64) -> f64 {
    let log_x = x.ln();
    helper2((1.0 - s) * log_x) * log_x
}

fn h_integral_inverse(x: f64, s: f64) -> f64 {
    // Rounding can push t below -1, where ln(1 + t) is undefined.
    let t = (x * (1.0 - s)).max(-1.0);
    (helper1(t) * x).exp()
}

/// `ln(1 + x) / x`, continuous at 0.
fn helper1(x: f64) -> f64 {
    if x.abs() > 1e-8 { x.ln_1p() / x } else { 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x)) }
}

/// `(e^x - 1) / x`, continuous at 0.
fn helper2(x: f64) -> f64 {
    if x.abs() > 1e-8 { x.exp_m1() / x } else { 1.0 + x * 0.5 * (1.0 + x / 3.0 * (1.0 + 0.25 * x)) }
}

#[derive(Debug, Clone, Copy)]
enum Popularity {
    Uniform,
    Zipf(Zipf),
}

/// A validated workload: names keys and draws requests.
#[derive(Debug, Clone)]
pub struct Workload {
    spec: WorkloadSpec,
    key_sizes: Sizes,
    value_sizes: Sizes,
    popularity: Popularity,
}

impl Workload {
    /// Checks `spec` and prepares its samplers.
    pub fn new(spec: WorkloadSpec) -> Result<Self, WorkloadError> {
        if !(1..=MAX_KEYS).contains(&spec.keys) {
            return Err(WorkloadError::Keys(spec.keys));
        }
        if !(0.0..=1.0).contains(&spec.get_ratio) {
            return Err(WorkloadError::GetRatio(spec.get_ratio));
        }
        if !(1..=MAX_MULTIGET).contains(&spec.multiget) {
            return Err(WorkloadError::Multiget(spec.multiget));
        }
        if !(1..=MAX_ITEM).contains(&spec.item_max) {
            return Err(WorkloadError::ItemMax(spec.item_max));
        }
        let shortest = KEY_PREFIX.len() as u32 + digits(spec.keys - 1);
        let key_max = KEY_MAX as u32;
        let key_sizes = resolve(spec.key_size, shortest, key_max, Shape::EtcKey, KEY_SALT)
            .ok_or(WorkloadError::KeySize { dist: spec.key_size, keys: spec.keys, shortest })?;
        let value_sizes = resolve(spec.value_size, 1, spec.item_max, Shape::EtcValue, VALUE_SALT)
            .ok_or(WorkloadError::ValueSize { dist: spec.value_size, item_max: spec.item_max })?;
        let popularity = match spec.key_dist {
            KeyDist::Uniform => Popularity::Uniform,
            KeyDist::Zipf { s } if valid_zipf(s) => Popularity::Zipf(Zipf::new(spec.keys, s)),
            KeyDist::Zipf { s } => return Err(WorkloadError::Zipf(s)),
        };
        Ok(Workload { spec, key_sizes, value_sizes, popularity })
    }

    /// The workload as given.
    pub fn spec(&self) -> &WorkloadSpec {
        &self.spec
    }

    /// Key `index` (below `spec().keys`).
    pub fn key(&self, index: u64) -> Key {
        // At most KEY_MAX (250): fits a byte.
        Key { index, len: self.key_sizes.of(index) as u8 }
    }

    /// The length of key `index`'s value: the same for every set of that key.
    pub fn value_len(&self, index: u64) -> u32 {
        self.value_sizes.of(index)
    }

    /// Draws the next request; a get's keys go into `keys` (cleared first, reused so the
    /// steady state allocates nothing).
    pub fn sample<'k>(&self, rng: &mut Rng, keys: &'k mut Vec<Key>) -> Request<'k> {
        keys.clear();
        if rng.unit() < self.spec.get_ratio {
            for _ in 0..self.spec.multiget {
                let index = self.pick(rng);
                keys.push(self.key(index));
            }
            Request::Get { keys }
        } else {
            let index = self.pick(rng);
            Request::Set { key: self.key(index), value_len: self.value_len(index) }
        }
    }

    /// Every key once, in index order, as the set that loads it.
    pub fn warmup(&self) -> impl Iterator<Item = Request<'static>> + '_ {
        (0..self.spec.keys).map(|index| Request::Set { key: self.key(index), value_len: self.value_len(index) })
    }

    fn pick(&self, rng: &mut Rng) -> u64 {
        match &self.popularity {
            Popularity::Uniform => rng.below(self.spec.keys),
            Popularity::Zipf(z) => z.rank(rng) - 1,
        }
    }
}

/// A size distribution clamped to `lo..=hi`, or `None` when its lower bound is below `lo`
/// or its upper bound above `hi` (ETC is clamped instead: it has no bounds).
fn resolve(dist: SizeDist, lo: u32, hi: u32, etc: Shape, salt: u64) -> Option<Sizes> {
    let in_bounds = |min: u32, max: u32| lo <= min && min <= max && max <= hi;
    let dist = match dist {
        SizeDist::Fixed(n) if in_bounds(n, n) => Shape::Fixed(n),
        SizeDist::Uniform { min, max } if in_bounds(min, max) => Shape::Uniform { min, max },
        SizeDist::Etc => etc,
        _ => return None,
    };
    Some(Sizes { dist, lo, hi, salt })
}

#[cfg(test)]
mod tests;

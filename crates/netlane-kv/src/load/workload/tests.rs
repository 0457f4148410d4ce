//! The workload's tests: key names and sizes, the get/set mix and multi-gets, the ETC
//! distributions' means, Zipf against theory, and specs parsed, printed and refused.

use proptest::prelude::*;

use super::*;
use crate::load::rng::Rng;

fn workload(f: impl FnOnce(&mut WorkloadSpec)) -> Workload {
    let mut spec = WorkloadSpec::default();
    f(&mut spec);
    Workload::new(spec).unwrap()
}

fn key_bytes(k: Key) -> Vec<u8> {
    let mut v = Vec::new();
    k.write_to(&mut v);
    v
}

/// Composite Simpson's rule over `[a, b]` with `n` (even) intervals.
fn simpson(f: impl Fn(f64) -> f64, a: f64, b: f64, n: usize) -> f64 {
    let h = (b - a) / n as f64;
    let inner: f64 = (1..n).map(|i| f(a + i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 }).sum();
    (f(a) + inner + f(b)) * h / 3.0
}

#[test]
fn keys_are_named_deterministically_and_padded() {
    let w = workload(|s| s.key_size = SizeDist::Fixed(12));
    assert_eq!(key_bytes(w.key(0)), b"key:00000000");
    assert_eq!(key_bytes(w.key(99_999)), b"key:00099999");
    // The shortest that names 100,000 keys: "key:" and 5 digits.
    let w = workload(|s| s.key_size = SizeDist::Fixed(9));
    assert_eq!(key_bytes(w.key(12_345)), b"key:12345");
    let err = Workload::new(WorkloadSpec { key_size: SizeDist::Fixed(8), ..WorkloadSpec::default() });
    assert_eq!(err.unwrap_err().to_string(), "key size 8: 100000 keys need keys of 9..=250 bytes");
    // Uniform key sizes stay in range and each key keeps its size.
    let w = workload(|s| s.key_size = SizeDist::Uniform { min: 10, max: 60 });
    let lens: Vec<usize> = (0..10_000).map(|i| w.key(i).byte_len()).collect();
    assert!(lens.iter().all(|l| (10..=60).contains(l)));
    assert!(lens.contains(&10) && lens.contains(&60));
    assert_eq!(lens[77], w.key(77).byte_len());
    assert_eq!(key_bytes(w.key(77)).len(), lens[77]);
}

#[test]
fn value_sizes_are_a_function_of_the_key() {
    let w = workload(|s| s.value_size = SizeDist::Uniform { min: 10, max: 1000 });
    let again = workload(|s| s.value_size = SizeDist::Uniform { min: 10, max: 1000 });
    let warm: Vec<(u64, u32)> = w
        .warmup()
        .map(|r| match r {
            Request::Set { key, value_len } => (key.index(), value_len),
            Request::Get { .. } => unreachable!("the warm-up only sets"),
        })
        .collect();
    assert_eq!(warm.len(), 100_000);
    assert!(warm.iter().enumerate().all(|(i, &(k, _))| k == i as u64));
    assert!(warm.iter().all(|&(k, v)| v == again.value_len(k) && (10..=1000).contains(&v)));
    // Sampled sets of a key write what the warm-up wrote.
    let w = workload(|s| {
        s.get_ratio = 0.0;
        s.value_size = SizeDist::Etc;
    });
    let mut rng = Rng::new(1);
    let mut keys = Vec::new();
    for _ in 0..1000 {
        let Request::Set { key, value_len } = w.sample(&mut rng, &mut keys) else { panic!("get at ratio 0") };
        assert_eq!(value_len, w.value_len(key.index()));
    }
}

#[test]
fn the_mix_and_multigets_follow_the_spec() {
    let w = workload(|s| {
        s.get_ratio = 0.75;
        s.multiget = 4;
    });
    let mut rng = Rng::new(2);
    let mut keys = Vec::new();
    let mut gets = 0;
    for _ in 0..100_000 {
        match w.sample(&mut rng, &mut keys) {
            Request::Get { keys } => {
                assert_eq!(keys.len(), 4);
                assert!(keys.iter().all(|k| k.index() < 100_000));
                gets += 1;
            }
            Request::Set { key, .. } => assert!(key.index() < 100_000),
        }
    }
    assert!((gets as f64 / 100_000.0 - 0.75).abs() < 0.01, "{gets}");
    let all_gets = workload(|s| s.get_ratio = 1.0);
    assert!((0..1000).all(|_| matches!(all_gets.sample(&mut rng, &mut keys), Request::Get { .. })));
}

#[test]
fn etc_values_have_the_clamped_distributions_mean() {
    let item_max = 1u32 << 20;
    let w = workload(|s| {
        s.keys = 200_000;
        s.value_size = SizeDist::Etc;
        s.item_max = item_max;
    });
    let sizes: Vec<u32> = (0..200_000).map(|i| w.value_len(i)).collect();
    assert!(sizes.iter().all(|&v| (1..=item_max).contains(&v)));
    // The head: 2-byte values are 17.8% of them.
    let twos = sizes.iter().filter(|&&v| v == 2).count() as f64 / 200_000.0;
    assert!((twos - 0.1782).abs() < 0.005, "{twos}");
    // Theory, from the CDF (not the inverse the sampler uses): the head's sizes
    // (0 raised to 1), plus the tail's weight times E[min(X, item_max)] = 15 + the
    // integral of the survival function from 15 to item_max, integrated over
    // ln(x - 14) where it is smooth.
    let head: f64 = ETC_VALUE_HEAD.iter().enumerate().map(|(b, p)| p * (b.max(1) as f64)).sum();
    let weight = 1.0 - ETC_VALUE_HEAD.iter().sum::<f64>();
    let (loc, scale, shape) = ETC_VALUE_TAIL;
    let survival = |x: f64| (1.0 + shape * (x - loc) / scale).powf(-1.0 / shape);
    let integral = simpson(|y| survival(14.0 + y.exp()) * y.exp(), 0.0, (f64::from(item_max) - 14.0).ln(), 20_000);
    let theory = head + weight * (loc + integral);
    let mean = sizes.iter().map(|&v| f64::from(v)).sum::<f64>() / sizes.len() as f64;
    // The tail is heavy (sd ~ 600 bytes): 200k keys put the mean within ~0.5%.
    assert!((mean / theory - 1.0).abs() < 0.02, "mean {mean}, theory {theory}");
    assert!((150.0..250.0).contains(&theory), "{theory}");
}

#[test]
fn etc_keys_have_the_clamped_distributions_mean() {
    let w = workload(|s| {
        s.keys = 200_000;
        s.key_size = SizeDist::Etc;
    });
    let lens: Vec<usize> = (0..200_000).map(|i| w.key(i).byte_len()).collect();
    let shortest = 4 + 6;
    assert!(lens.iter().all(|l| (shortest..=KEY_MAX).contains(l)));
    // E[clamp(X, a, b)] = a + the integral of the survival function over [a, b].
    let (loc, scale, shape) = ETC_KEY;
    let survival = |x: f64| 1.0 - (-(1.0 + shape * (x - loc) / scale).powf(-1.0 / shape)).exp();
    let theory = shortest as f64 + simpson(survival, shortest as f64, KEY_MAX as f64, 20_000);
    let mean = lens.iter().sum::<usize>() as f64 / lens.len() as f64;
    assert!((mean / theory - 1.0).abs() < 0.01, "mean {mean}, theory {theory}");
    assert!((30.0..40.0).contains(&theory), "{theory}");
}

fn zipf_matches_theory(n: u64, s: f64, seed: u64) -> Result<(), String> {
    const SAMPLES: usize = 100_000;
    let z = Zipf::new(n, s);
    let mut rng = Rng::new(seed);
    let mut top = [0u64; 5];
    for _ in 0..SAMPLES {
        let k = z.rank(&mut rng);
        if !(1..=n).contains(&k) {
            return Err(format!("rank {k} outside 1..={n}"));
        }
        if k <= 5 {
            top[k as usize - 1] += 1;
        }
    }
    let norm: f64 = (1..=n).map(|k| (k as f64).powf(-s)).sum();
    for (i, &count) in top.iter().enumerate().take(n.min(5) as usize) {
        let p = ((i + 1) as f64).powf(-s) / norm;
        let got = count as f64 / SAMPLES as f64;
        // Five standard deviations of a binomial proportion.
        let tolerance = 5.0 * (p * (1.0 - p) / SAMPLES as f64).sqrt() + 1e-4;
        if (got - p).abs() > tolerance {
            return Err(format!("n {n} s {s}: rank {} drawn {got}, theory {p}", i + 1));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn zipf_top_ranks_match_theory(n in 1u64..50_000, s in 0.05f64..3.0, seed: u64) {
        zipf_matches_theory(n, s, seed).map_err(TestCaseError::fail)?;
    }
}

#[test]
fn zipf_is_right_at_the_usual_and_the_extreme_exponents() {
    for (n, s) in [(100_000, 0.99), (100_000, 1.0), (1000, 1.01), (1000, MAX_ZIPF), (1, 0.99), (2, 0.5)] {
        zipf_matches_theory(n, s, 11).unwrap();
    }
}

#[test]
fn zipf_workloads_ask_for_low_indexes_most() {
    let w = workload(|s| {
        s.keys = 1000;
        s.key_dist = KeyDist::Zipf { s: 0.99 };
    });
    let mut rng = Rng::new(5);
    let mut keys = Vec::new();
    let mut zero = 0;
    for _ in 0..10_000 {
        if let Request::Get { keys } = w.sample(&mut rng, &mut keys) {
            zero += keys.iter().filter(|k| k.index() == 0).count();
        }
    }
    // Rank 1 of 1000 at s = 0.99 takes about 13%; of 90% gets, about 1,200.
    assert!((900..1500).contains(&zero), "{zero}");
}

#[test]
fn specs_parse_and_print_back() {
    for s in ["uniform", "zipf:0.99", "zipf:1.5"] {
        assert_eq!(s.parse::<KeyDist>().unwrap().to_string(), s);
    }
    for s in ["30", "uniform:10,60", "etc"] {
        assert_eq!(s.parse::<SizeDist>().unwrap().to_string(), s);
    }
    assert_eq!("uniform:5,5".parse::<SizeDist>().unwrap(), SizeDist::Uniform { min: 5, max: 5 });
}

#[test]
fn bad_specs_name_the_bad_part() {
    let key = |s: &str| s.parse::<KeyDist>().unwrap_err().to_string();
    let size = |s: &str| s.parse::<SizeDist>().unwrap_err().to_string();
    assert_eq!(key("zipf:abc"), "key distribution \"zipf:abc\": exponent \"abc\" is not a number");
    assert_eq!(key("zipf:-1"), "key distribution \"zipf:-1\": exponent -1 must be above 0 and at most 10");
    assert_eq!(key("zipf:NaN"), "key distribution \"zipf:NaN\": exponent NaN must be above 0 and at most 10");
    assert!(key("zipf").contains("expected uniform or zipf:EXPONENT"));
    assert!(key("pareto:1").contains("expected uniform or zipf:EXPONENT"));
    assert_eq!(size("uniform:10"), "size \"uniform:10\": expected uniform:MIN,MAX");
    assert_eq!(size("uniform:10,x"), "size \"uniform:10,x\": \"x\" is not a size in bytes");
    assert_eq!(size("uniform:60,10"), "size \"uniform:60,10\": minimum 60 is above maximum 10");
    assert_eq!(size("99999999999"), "size \"99999999999\": \"99999999999\" is not a size in bytes");
    assert!(size("-3").contains("expected a size in bytes, uniform:MIN,MAX or etc"));
    assert!(size("").contains("expected a size in bytes"));
}

#[test]
fn bad_workloads_are_refused() {
    let bad = |f: fn(&mut WorkloadSpec)| {
        let mut spec = WorkloadSpec::default();
        f(&mut spec);
        Workload::new(spec).unwrap_err()
    };
    assert_eq!(bad(|s| s.keys = 0), WorkloadError::Keys(0));
    assert_eq!(bad(|s| s.keys = MAX_KEYS + 1), WorkloadError::Keys(MAX_KEYS + 1));
    assert_eq!(bad(|s| s.get_ratio = 1.5), WorkloadError::GetRatio(1.5));
    assert!(matches!(bad(|s| s.get_ratio = f64::NAN), WorkloadError::GetRatio(_)));
    assert_eq!(bad(|s| s.multiget = 0), WorkloadError::Multiget(0));
    assert_eq!(bad(|s| s.item_max = 0), WorkloadError::ItemMax(0));
    assert!(matches!(bad(|s| s.key_size = SizeDist::Fixed(251)), WorkloadError::KeySize { .. }));
    assert!(matches!(bad(|s| s.key_size = SizeDist::Uniform { min: 3, max: 40 }), WorkloadError::KeySize { .. }));
    assert!(matches!(bad(|s| s.value_size = SizeDist::Fixed(0)), WorkloadError::ValueSize { .. }));
    assert_eq!(
        bad(|s| s.value_size = SizeDist::Uniform { min: 1, max: 2 << 20 }).to_string(),
        "value size uniform:1,2097152: must be within 1..=1048576 bytes"
    );
    assert_eq!(bad(|s| s.key_dist = KeyDist::Zipf { s: 0.0 }), WorkloadError::Zipf(0.0));
    // The largest key space still has room for its keys.
    let w = workload(|s| {
        s.keys = MAX_KEYS;
        s.key_size = SizeDist::Etc;
    });
    assert_eq!(key_bytes(w.key(MAX_KEYS - 1)).len(), w.key(MAX_KEYS - 1).byte_len());
}

#[test]
fn decimals_pad() {
    let mut v = Vec::new();
    push_decimal(&mut v, 0, 0);
    push_decimal(&mut v, 42, 5);
    push_decimal(&mut v, u64::MAX, 3);
    assert_eq!(v, b"00004218446744073709551615");
}

//! Histograms as another process sends them: HdrHistogram's standard serialized form
//! (V2) in base64, checked before anything is allocated.

use base64::Engine as _;
use hdrhistogram::Histogram;
use hdrhistogram::serialization::Serializer as _;
use thiserror::Error;

/// The bounds a histogram from another process must have to be taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Lowest discernible value.
    pub lowest: u64,
    /// Highest trackable value.
    pub highest: u64,
    /// Significant digits.
    pub digits: u8,
}

/// The most base64 a histogram may have (a full hour's range at 3 digits is tens of
/// KiB).
pub const MAX_ENCODED: usize = 1 << 20;

/// HdrHistogram's V2 cookie (0x1c849303, with the word size bits the Rust and Java
/// implementations set).
const V2_COOKIE: u64 = 0x1c84_9313;

/// A V2 histogram's header: cookie, payload length, normalizing offset, digits, lowest
/// and highest trackable values, integer-to-double ratio.
pub const V2_HEADER: usize = 40;

/// `h` in HdrHistogram's V2 serialized form, base64: what another process merges
/// exactly, and HdrHistogram's own tools read.
pub fn encode(h: &Histogram<u64>) -> String {
    let mut bytes = Vec::new();
    // Into a Vec, of a histogram within its own bounds: nothing can fail.
    let _ = hdrhistogram::serialization::V2Serializer::new().serialize(h, &mut bytes);
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The histogram [`encode`] wrote, taken only when it is at most [`MAX_ENCODED`] bytes
/// and a V2 histogram of `bounds` whose payload is as long as its header says.
pub fn decode(text: &str, bounds: Bounds) -> Result<Histogram<u64>, HistWireError> {
    if text.len() > MAX_ENCODED {
        return Err(HistWireError::TooLarge(text.len()));
    }
    let bytes = base64::engine::general_purpose::STANDARD.decode(text).map_err(|_| HistWireError::Base64)?;
    let field = |at: usize, n: usize| bytes.get(at..at + n).map(|b| b.iter().fold(0u64, |v, &x| v << 8 | u64::from(x)));
    let header = (field(0, 4), field(4, 4), field(12, 4), field(16, 8), field(24, 8));
    let want = (Some(V2_COOKIE), Some(u64::from(bounds.digits)), Some(bounds.lowest), Some(bounds.highest));
    let (cookie, Some(payload), digits, lowest, highest) = header else {
        return Err(HistWireError::NotOurs(bounds));
    };
    if (cookie, digits, lowest, highest) != want || bytes.len().checked_sub(V2_HEADER) != Some(payload as usize) {
        return Err(HistWireError::NotOurs(bounds));
    }
    hdrhistogram::serialization::Deserializer::new()
        .deserialize(&mut bytes.as_slice())
        .map_err(|e| HistWireError::Histogram(format!("{e:?}")))
}

/// A histogram from another process that cannot be taken.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HistWireError {
    /// Over [`MAX_ENCODED`].
    #[error("a histogram of {0} bytes: at most 1 MiB is taken")]
    TooLarge(usize),
    /// Not base64.
    #[error("the histogram is not base64")]
    Base64,
    /// Not a V2 histogram of the bounds asked for.
    #[error("the histogram is not a V2 HdrHistogram of {}..{} at {} significant digits", .0.lowest, .0.highest, .0.digits)]
    NotOurs(Bounds),
    /// The payload did not decode.
    #[error("the histogram does not decode: {0}")]
    Histogram(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: Bounds = Bounds { lowest: 1, highest: 60_000_000_000, digits: 3 };

    #[test]
    fn a_histogram_crosses_exactly_and_what_is_not_one_of_ours_is_refused() {
        let mut h = Histogram::<u64>::new_with_bounds(B.lowest, B.highest, B.digits).unwrap();
        for i in 1..=5_000u64 {
            h.record(i * 997 % 3_000_000).unwrap();
        }
        let text = encode(&h);
        assert_eq!(decode(&text, B).unwrap(), h);
        assert_eq!(decode("not base64!", B).unwrap_err(), HistWireError::Base64);
        assert_eq!(decode(&"A".repeat(MAX_ENCODED + 4), B).unwrap_err(), HistWireError::TooLarge(MAX_ENCODED + 4));
        let other = encode(&Histogram::<u64>::new_with_bounds(1, 1_000, 2).unwrap());
        assert_eq!(decode(&other, B).unwrap_err(), HistWireError::NotOurs(B));
        // A header that claims more payload than it carries is refused before any allocation.
        let mut raw = base64::engine::general_purpose::STANDARD.decode(&text).unwrap();
        raw[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
        let lying = base64::engine::general_purpose::STANDARD.encode(&raw);
        assert_eq!(decode(&lying, B).unwrap_err(), HistWireError::NotOurs(B));
        raw.truncate(V2_HEADER - 1);
        let short = base64::engine::general_purpose::STANDARD.encode(&raw);
        assert_eq!(decode(&short, B).unwrap_err(), HistWireError::NotOurs(B));
    }
}

//! The tokenizer and the numbers: a line split into memcached's tokens ([`Tokens`]),
//! and each number read as memcached's `strtol` family reads it ([`Num`]).

/// Most tokens memcached looks at on one line (`MAX_TOKENS` less its terminal entry).
pub const MAX_TOKENS: usize = 23;

/// The first [`MAX_TOKENS`] space-separated tokens of a line, and whether more follow.
#[derive(Debug, Clone, Copy)]
pub struct Tokens<'a> {
    tokens: [&'a [u8]; MAX_TOKENS],
    n: usize,
    /// More tokens follow the last one kept.
    pub(super) more: bool,
}

impl<'a> Tokens<'a> {
    /// Splits `line` as memcached's `tokenize_command` does.
    pub fn new(line: &'a [u8]) -> Self {
        let mut t = Tokens { tokens: [&[]; MAX_TOKENS], n: 0, more: false };
        for tok in line.split(|&b| b == b' ').filter(|t| !t.is_empty()) {
            if t.n == MAX_TOKENS {
                t.more = true;
                break;
            }
            t.tokens[t.n] = tok;
            t.n += 1;
        }
        t
    }

    /// The tokens kept.
    pub fn as_slice(&self) -> &[&'a [u8]] {
        &self.tokens[..self.n]
    }

    /// memcached's `ntokens`: the tokens kept plus its terminal entry.
    pub(super) fn ntokens(&self) -> usize {
        self.n + 1
    }

    pub(super) fn get(&self, i: usize) -> &'a [u8] {
        if i < self.n { self.tokens[i] } else { &[] }
    }

    /// Whether the last token kept is `noreply` (memcached's `set_noreply_maybe`).
    pub(super) fn noreply(&self) -> bool {
        self.n > 0 && self.tokens[self.n - 1] == b"noreply"
    }
}

/// memcached's number parsing (`safe_strtol`, `safe_strtoul`, `safe_strtoull`): leading
/// white space, an optional sign, decimal digits, then the end of the token or white
/// space (anything after that is ignored, as `strtol` stops there).
///
/// One difference, on purpose: a number that does not fit the field is refused;
/// memcached reads it into a 64-bit `long` and then truncates it to the field's 32
/// bits (a length of 4294967296 becomes 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Num {
    pub(super) negative: bool,
    pub(super) magnitude: u64,
}

fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

impl Num {
    /// Parses `t`; `None` where memcached's parse fails (no digits, junk after them,
    /// or out of 64-bit range).
    pub fn parse(t: &[u8]) -> Option<Num> {
        let mut i = t.iter().position(|&b| !is_c_space(b))?;
        let mut negative = false;
        match t[i] {
            b'-' => {
                negative = true;
                i += 1;
            }
            b'+' => i += 1,
            _ => {}
        }
        let digits = t[i..].iter().take_while(|b| b.is_ascii_digit()).count();
        if digits == 0 {
            return None;
        }
        let end = i + digits;
        if end < t.len() && !is_c_space(t[end]) {
            return None;
        }
        let mut magnitude: u64 = 0;
        for &d in &t[i..end] {
            magnitude = magnitude.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
        }
        Some(Num { negative, magnitude })
    }

    /// As a signed 32-bit number (`safe_strtol`).
    pub fn i32(self) -> Option<i32> {
        if self.negative {
            0i64.checked_sub(i64::try_from(self.magnitude).ok()?).and_then(|v| i32::try_from(v).ok())
        } else {
            i32::try_from(self.magnitude).ok()
        }
    }

    /// As an unsigned 32-bit number (`safe_strtoul`: a minus sign only on zero).
    pub fn u32(self) -> Option<u32> {
        if self.negative && self.magnitude != 0 {
            return None;
        }
        u32::try_from(self.magnitude).ok()
    }

    /// As an unsigned 64-bit number (`safe_strtoull`).
    pub fn u64(self) -> Option<u64> {
        if self.negative && self.magnitude != 0 {
            return None;
        }
        Some(self.magnitude)
    }
}

pub(super) fn i32_arg(t: &[u8]) -> Option<i32> {
    Num::parse(t)?.i32()
}

pub(super) fn u32_arg(t: &[u8]) -> Option<u32> {
    Num::parse(t)?.u32()
}

pub(super) fn u64_arg(t: &[u8]) -> Option<u64> {
    Num::parse(t)?.u64()
}

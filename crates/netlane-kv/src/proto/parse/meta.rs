//! The meta commands' lines (mg, ms, md, ma, me, mn): the key, plain or base64
//! ([`MetaKey`]), and the flags after it, read as memcached's `_meta_flag_preparse`
//! reads them ([`MetaFlags`]).

use base64::Engine as _;

use super::tokens::{Tokens, i32_arg, u32_arg, u64_arg};
use super::{BAD_FORMAT, BAD_TOKEN, Command, ParseError, UNKNOWN, err};
use crate::store::KEY_MAX;

/// A meta command's key: as sent, or decoded from base64 (flag `b`).
#[derive(Debug, Clone, Copy)]
pub struct MetaKey<'a> {
    /// The token as sent.
    pub token: &'a [u8],
    decoded: [u8; KEY_MAX],
    decoded_len: Option<u8>,
}

impl MetaKey<'_> {
    /// The key to look up.
    pub fn bytes(&self) -> &[u8] {
        match self.decoded_len {
            Some(n) => &self.decoded[..usize::from(n)],
            None => self.token,
        }
    }

    /// Sent in base64.
    pub fn binary(&self) -> bool {
        self.decoded_len.is_some()
    }
}

/// The most tokens a meta command may have, command and key included, less one
/// (memcached's `MFLAG_MAX_OPT_LENGTH` compared with its `ntokens`).
pub const META_MAX_TOKENS: usize = 19;
/// Longest opaque token, its `O` included.
pub const OPAQUE_MAX: usize = 32;

/// A meta command's flags, parsed as memcached's `_meta_flag_preparse` does. The flag
/// tokens themselves stay in [`MetaFlags::tokens`]: the reply walks them in the order
/// they were sent.
#[derive(Debug, Clone, Copy)]
pub struct MetaFlags<'a> {
    tokens: [&'a [u8]; META_MAX_TOKENS],
    count: usize,
    /// `b`: the key is base64.
    pub base64: bool,
    /// `C`: compare this CAS value.
    pub compare_cas: Option<u64>,
    /// `F`: client flags to store.
    pub client_flags: u32,
    /// `I`: invalidate (mark stale) instead of removing.
    pub invalidate: bool,
    /// `q`: hide the nominal reply.
    pub quiet: bool,
    /// `u`: do not bump the item.
    pub no_bump: bool,
    /// `v`: return the value.
    pub value: bool,
    /// `N`: vivify on miss with this TTL.
    pub vivify: Option<i32>,
    /// `R`: win the recache if the remaining TTL is below this.
    pub recache: Option<i32>,
    /// `T`: new TTL.
    pub ttl: Option<i32>,
    /// `M`: mode character.
    pub mode: Option<u8>,
    /// `J`: initial value for ma's vivify.
    pub initial: u64,
    /// `D`: ma's delta.
    pub delta: Option<u64>,
}

impl<'a> MetaFlags<'a> {
    /// The flag tokens in the order they were sent.
    pub fn tokens(&self) -> &[&'a [u8]] {
        &self.tokens[..self.count]
    }

    /// The opaque token (`O...`), if sent, and whether it is too long.
    pub fn opaque(&self) -> Option<&'a [u8]> {
        self.tokens().iter().copied().find(|t| t.first() == Some(&b'O'))
    }

    /// Whether any `O` token is longer than memcached allows.
    pub fn opaque_too_long(&self) -> bool {
        self.opaque().is_some_and(|t| t.len() > OPAQUE_MAX)
    }
}

pub(super) fn meta<'a>(name: &[u8], t: &Tokens<'a>) -> Result<Command<'a>, ParseError> {
    let n = t.ntokens();
    if name == b"mn" {
        return Ok(Command::MetaNoop);
    }
    if n < 3 {
        // "me" alone is a bad format; the others want more tokens.
        return Err(if name == b"me" { BAD_FORMAT } else { UNKNOWN });
    }
    let token = t.get(1);
    if token.len() > KEY_MAX {
        return Err(BAD_FORMAT);
    }
    if name == b"me" {
        let binary = n >= 4 && t.get(2) == b"b";
        let mk = meta_key(token, binary).map_err(|_| BAD_FORMAT)?;
        return Ok(Command::MetaDebug(mk));
    }
    let too_long = if name == b"mg" {
        err("CLIENT_ERROR options flags are too long")
    } else {
        err("CLIENT_ERROR options flags too long")
    };
    if name == b"ms" {
        if n == 3 {
            return Err(BAD_FORMAT);
        }
        if n > META_MAX_TOKENS + 1 || t.more {
            return Err(too_long);
        }
        let len = i32_arg(t.get(2)).filter(|&l| (0..=i32::MAX - 2).contains(&l)).ok_or(BAD_FORMAT)? as usize;
        let swallow = Some(len + 2);
        let flags = meta_flags(&t.as_slice()[3..]).map_err(|e| e.swallowing(swallow))?;
        let mk = meta_key(token, flags.base64).map_err(|e| e.swallowing(swallow))?;
        if flags.opaque_too_long() {
            return Err(err("CLIENT_ERROR opaque token too long").swallowing(swallow));
        }
        let mode = flags.mode.unwrap_or(b'S');
        if !matches!(mode, b'E' | b'A' | b'P' | b'R' | b'S') {
            return Err(err("CLIENT_ERROR invalid mode for ms M token").swallowing(swallow));
        }
        return Ok(Command::MetaSet(mk, len, flags));
    }
    if n > META_MAX_TOKENS + 1 || t.more {
        return Err(too_long);
    }
    // md and ma name no particular flag.
    let generic = |e: ParseError| if name == b"mg" { e } else { err("CLIENT_ERROR invalid or duplicate flag") };
    let flags = meta_flags(&t.as_slice()[2..]).map_err(generic)?;
    let mk = meta_key(token, flags.base64).map_err(generic)?;
    if flags.opaque_too_long() {
        return Err(err("CLIENT_ERROR opaque token too long"));
    }
    Ok(match name {
        b"mg" => Command::MetaGet(mk, flags),
        b"md" => Command::MetaDelete(mk, flags),
        _ => {
            if !matches!(flags.mode, None | Some(b'I' | b'+' | b'D' | b'-')) {
                return Err(err("CLIENT_ERROR invalid mode for ma M token"));
            }
            Command::MetaArith(mk, flags)
        }
    })
}

fn meta_key(token: &[u8], base64: bool) -> Result<MetaKey<'_>, ParseError> {
    let mut mk = MetaKey { token, decoded: [0; KEY_MAX], decoded_len: None };
    if base64 {
        // The token is at most 250 bytes, so its decoded form fits.
        let n = base64::engine::general_purpose::STANDARD
            .decode_slice(token, &mut mk.decoded)
            .map_err(|_| err("CLIENT_ERROR error decoding key"))?;
        if n == 0 {
            return Err(err("CLIENT_ERROR error decoding key"));
        }
        mk.decoded_len = Some(n as u8);
    }
    Ok(mk)
}

/// The flags after a meta command's key (and ms's length), as memcached's
/// `_meta_flag_preparse`: a repeated flag or one memcached does not know ends the
/// parse; a bad argument is remembered (the last one named wins) and the parse goes on.
fn meta_flags<'a>(tokens: &[&'a [u8]]) -> Result<MetaFlags<'a>, ParseError> {
    let mut f = MetaFlags {
        tokens: [&[]; META_MAX_TOKENS],
        count: 0,
        base64: false,
        compare_cas: None,
        client_flags: 0,
        invalidate: false,
        quiet: false,
        no_bump: false,
        value: false,
        vivify: None,
        recache: None,
        ttl: None,
        mode: None,
        initial: 0,
        delta: None,
    };
    let mut seen = [false; 128];
    let mut error: Option<ParseError> = None;
    for &tok in tokens {
        let c = tok[0];
        if c >= 127 || seen[usize::from(c)] {
            return Err(err("CLIENT_ERROR duplicate flag"));
        }
        seen[usize::from(c)] = true;
        if f.count < META_MAX_TOKENS {
            f.tokens[f.count] = tok;
            f.count += 1;
        }
        let arg = &tok[1..];
        let failed = match c {
            b'b' => {
                f.base64 = true;
                None
            }
            b'N' => i32_arg(arg).map(|v| f.vivify = Some(v)).err_with(BAD_TOKEN),
            b'T' => i32_arg(arg).map(|v| f.ttl = Some(v)).err_with(BAD_TOKEN),
            b'R' => i32_arg(arg).map(|v| f.recache = Some(v)).err_with(BAD_TOKEN),
            b'l' | b'O' | b'P' | b'L' | b'k' | b's' | b't' | b'c' | b'f' | b'h' => None,
            b'v' => {
                f.value = true;
                None
            }
            b'u' => {
                f.no_bump = true;
                None
            }
            b'q' => {
                f.quiet = true;
                None
            }
            // A bad F keeps the message an earlier flag set, else the generic one.
            b'F' => u32_arg(arg).map(|v| f.client_flags = v).err_with(error.unwrap_or(BAD_FORMAT)),
            b'C' => u64_arg(arg).map(|v| f.compare_cas = Some(v)).err_with(BAD_TOKEN),
            b'M' => match arg {
                [m] => {
                    f.mode = Some(*m);
                    None
                }
                _ => Some(err("CLIENT_ERROR incorrect length for M token")),
            },
            b'J' => u64_arg(arg).map(|v| f.initial = v).err_with(err("CLIENT_ERROR invalid numeric initial value")),
            b'D' => u64_arg(arg).map(|v| f.delta = Some(v)).err_with(err("CLIENT_ERROR invalid numeric delta value")),
            b'I' => {
                f.invalidate = true;
                None
            }
            _ => return Err(err("CLIENT_ERROR invalid flag")),
        };
        if failed.is_some() {
            error = failed;
        }
    }
    match error {
        Some(e) => Err(e),
        None => Ok(f),
    }
}

/// `Some(e)` when a flag's argument did not parse.
trait ErrWith {
    fn err_with(self, e: ParseError) -> Option<ParseError>;
}

impl ErrWith for Option<()> {
    fn err_with(self, e: ParseError) -> Option<ParseError> {
        if self.is_some() { None } else { Some(e) }
    }
}

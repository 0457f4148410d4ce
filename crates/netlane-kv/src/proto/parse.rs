//! One command line (without its `\r\n`) into a [`Command`] that borrows from it.
//!
//! Tokens are separated by spaces, as memcached splits them. Nothing here allocates or
//! panics; every malformed line maps to the error line memcached sends for it.

use base64::Engine as _;

use crate::store::KEY_MAX;

/// Storage command kinds (the text commands and ms's `M` modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreMode {
    /// Store unconditionally.
    Set,
    /// Store only if absent.
    Add,
    /// Store only if present.
    Replace,
    /// Add after the present value.
    Append,
    /// Add before the present value.
    Prepend,
    /// Store if the CAS value still matches.
    Cas,
}

/// `stats` arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatsKind {
    /// `stats`.
    General,
    /// `stats settings`.
    Settings,
    /// `stats items`.
    Items,
    /// `stats slabs`.
    Slabs,
    /// `stats conns`.
    Conns,
    /// `stats reset`.
    Reset,
    /// `stats cachedump <class> <limit>`: keys of a class (this store has one: 1), at
    /// most `limit` (0: as many as fit in 2 MB).
    CacheDump {
        /// The class asked for.
        class: u32,
        /// Most keys.
        limit: u32,
    },
}

/// The space-separated tokens left on a line.
#[derive(Debug, Clone, Copy)]
pub struct Tokens<'a> {
    rest: &'a [u8],
}

impl<'a> Tokens<'a> {
    /// The tokens of `line`.
    pub fn new(line: &'a [u8]) -> Self {
        Tokens { rest: line }
    }
}

impl<'a> Iterator for Tokens<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let start = self.rest.iter().position(|&b| b != b' ')?;
        let rest = &self.rest[start..];
        let end = rest.iter().position(|&b| b == b' ').unwrap_or(rest.len());
        self.rest = &rest[end..];
        Some(&rest[..end])
    }
}

/// A meta command's key: as sent, or decoded from base64 (flag `b`).
#[derive(Debug, Clone, Copy)]
pub struct MetaKey<'a> {
    /// The token as sent (returned by the `k` flag).
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

/// Most flag tokens a meta command may carry (memcached's `MFLAG_MAX_OPT_LENGTH`).
pub const META_MAX_FLAGS: usize = 20;
/// Longest opaque token.
pub const OPAQUE_MAX: usize = 32;

/// A meta command's flags. Returned flags are written in the order they were sent,
/// which [`MetaFlags::order`] keeps.
#[derive(Debug, Clone, Copy, Default)]
pub struct MetaFlags<'a> {
    order: [u8; META_MAX_FLAGS],
    count: usize,
    /// `b`: the key is base64.
    pub base64: bool,
    /// `C`: compare this CAS value.
    pub compare_cas: Option<u64>,
    /// `E`: use this as the new CAS value.
    pub new_cas: Option<u64>,
    /// `F`: client flags to store.
    pub client_flags: Option<u32>,
    /// `I`: invalidate (mark stale) instead of failing/removing.
    pub invalidate: bool,
    /// `O`: opaque token to echo.
    pub opaque: Option<&'a [u8]>,
    /// `q`: hide the nominal reply.
    pub quiet: bool,
    /// `u`: do not bump the item.
    pub no_bump: bool,
    /// `v`: return the value.
    pub value: bool,
    /// `x`: remove the value, keep the item.
    pub remove_value: bool,
    /// `N`: vivify on miss with this TTL.
    pub vivify: Option<i64>,
    /// `R`: win the recache if the remaining TTL is below this.
    pub recache: Option<i64>,
    /// `T`: new TTL.
    pub ttl: Option<i64>,
    /// `M`: mode character.
    pub mode: Option<u8>,
    /// `J`: initial value for ma's vivify.
    pub initial: Option<u64>,
    /// `D`: ma's delta.
    pub delta: Option<u64>,
}

impl MetaFlags<'_> {
    /// The flag characters in the order they were sent.
    pub fn order(&self) -> &[u8] {
        &self.order[..self.count]
    }

    /// Whether flag `c` was sent.
    pub fn has(&self, c: u8) -> bool {
        self.order().contains(&c)
    }
}

/// A parsed command line.
#[derive(Debug, Clone, Copy)]
pub enum Command<'a> {
    /// get, gets, gat, gats: the keys, whether to return CAS values, and gat's new TTL.
    Get {
        /// The keys (at least one).
        keys: Tokens<'a>,
        /// gets/gats.
        cas: bool,
        /// gat/gats: the new expiry.
        touch: Option<i64>,
    },
    /// set, add, replace, append, prepend, cas: a data block of `len` bytes follows.
    Store {
        /// Which.
        mode: StoreMode,
        /// The key.
        key: &'a [u8],
        /// Client flags.
        flags: u32,
        /// Expiry as sent.
        exptime: i64,
        /// Data block length.
        len: usize,
        /// cas's unique value.
        cas: u64,
        /// No reply wanted.
        noreply: bool,
    },
    /// delete.
    Delete {
        /// The key.
        key: &'a [u8],
        /// No reply wanted.
        noreply: bool,
    },
    /// incr or decr.
    Arith {
        /// incr (else decr).
        incr: bool,
        /// The key.
        key: &'a [u8],
        /// The amount.
        delta: u64,
        /// No reply wanted.
        noreply: bool,
    },
    /// touch.
    Touch {
        /// The key.
        key: &'a [u8],
        /// The new expiry.
        exptime: i64,
        /// No reply wanted.
        noreply: bool,
    },
    /// flush_all with its delay in seconds.
    FlushAll {
        /// Seconds until it takes effect (0: now).
        delay: i64,
        /// No reply wanted.
        noreply: bool,
    },
    /// stats.
    Stats(StatsKind),
    /// version.
    Version,
    /// verbosity.
    Verbosity {
        /// The level (`None`: not a number).
        level: Option<u32>,
        /// No reply wanted.
        noreply: bool,
    },
    /// quit.
    Quit,
    /// mn.
    MetaNoop,
    /// mg.
    MetaGet(MetaKey<'a>, MetaFlags<'a>),
    /// ms: a data block of `len` bytes follows.
    MetaSet(MetaKey<'a>, usize, MetaFlags<'a>),
    /// md.
    MetaDelete(MetaKey<'a>, MetaFlags<'a>),
    /// ma.
    MetaArith(MetaKey<'a>, MetaFlags<'a>),
    /// me (meta debug).
    MetaDebug(MetaKey<'a>),
}

/// A line that is not a valid command, as the error line memcached answers it with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParseError {
    /// The reply line (without CRLF).
    pub reply: &'static str,
    /// A storage command whose data block length was readable: skip that many bytes
    /// (data and CRLF), so the data is not read as commands.
    pub swallow: Option<usize>,
}

const fn err(reply: &'static str) -> ParseError {
    ParseError { reply, swallow: None }
}

/// `ERROR`: not a command.
pub const UNKNOWN: ParseError = err("ERROR");
/// The generic malformed-line error.
pub const BAD_FORMAT: ParseError = err("CLIENT_ERROR bad command line format");
const BAD_TOKEN: ParseError = err("CLIENT_ERROR bad token in command line format");

fn num<T: std::str::FromStr>(t: &[u8]) -> Option<T> {
    // Digits (and a leading minus for signed types) only: from_str accepts a '+'.
    if t.first() == Some(&b'+') {
        return None;
    }
    std::str::from_utf8(t).ok()?.parse().ok()
}

fn key(t: Option<&[u8]>) -> Result<&[u8], ParseError> {
    match t {
        Some(k) if k.len() <= KEY_MAX => Ok(k),
        _ => Err(BAD_FORMAT),
    }
}

/// Whether the last token is `noreply`; returns the count of tokens before it.
fn noreply(tokens: &[&[u8]]) -> (usize, bool) {
    match tokens.last() {
        Some(&t) if t == b"noreply" => (tokens.len() - 1, true),
        _ => (tokens.len(), false),
    }
}

/// Collects up to `N` tokens; `None` if there are more.
fn take<'a, const N: usize>(t: &mut Tokens<'a>) -> Option<([&'a [u8]; N], usize)> {
    let mut out: [&[u8]; N] = [&[]; N];
    let mut n = 0;
    for tok in t.by_ref() {
        if n == N {
            return None;
        }
        out[n] = tok;
        n += 1;
    }
    Some((out, n))
}

/// Parses one command line (without `\r\n`).
pub fn parse(line: &[u8]) -> Result<Command<'_>, ParseError> {
    let mut t = Tokens::new(line);
    let Some(name) = t.next() else { return Err(UNKNOWN) };
    match name {
        b"get" | b"gets" => {
            if t.clone().next().is_none() {
                return Err(UNKNOWN);
            }
            Ok(Command::Get { keys: t, cas: name == b"gets", touch: None })
        }
        b"gat" | b"gats" => {
            let exp = t.next().ok_or(UNKNOWN)?;
            let exptime = num::<i64>(exp).ok_or(err("CLIENT_ERROR invalid exptime argument"))?;
            if t.clone().next().is_none() {
                return Err(UNKNOWN);
            }
            Ok(Command::Get { keys: t, cas: name == b"gats", touch: Some(exptime) })
        }
        b"set" | b"add" | b"replace" | b"append" | b"prepend" | b"cas" => storage(name, &mut t),
        b"delete" => {
            let (a, n) = take::<4>(&mut t).ok_or(BAD_FORMAT)?;
            let (n, nr) = noreply(&a[..n]);
            let k = key((n >= 1).then(|| a[0]))?;
            // memcached accepts a legacy hold time of 0 and nothing else.
            match n {
                1 => Ok(Command::Delete { key: k, noreply: nr }),
                2 if a[1] == b"0" => Ok(Command::Delete { key: k, noreply: nr }),
                _ => Err(err("CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]")),
            }
        }
        b"incr" | b"decr" => {
            let (a, n) = take::<3>(&mut t).ok_or(BAD_FORMAT)?;
            let (n, nr) = noreply(&a[..n]);
            if n != 2 {
                return Err(UNKNOWN);
            }
            let k = key(Some(a[0]))?;
            let delta = num::<u64>(a[1]).ok_or(err("CLIENT_ERROR invalid numeric delta argument"))?;
            Ok(Command::Arith { incr: name == b"incr", key: k, delta, noreply: nr })
        }
        b"touch" => {
            let (a, n) = take::<3>(&mut t).ok_or(BAD_FORMAT)?;
            let (n, nr) = noreply(&a[..n]);
            if n != 2 {
                return Err(UNKNOWN);
            }
            let k = key(Some(a[0]))?;
            let exptime = num::<i64>(a[1]).ok_or(err("CLIENT_ERROR invalid exptime argument"))?;
            Ok(Command::Touch { key: k, exptime, noreply: nr })
        }
        b"flush_all" => {
            let (a, n) = take::<2>(&mut t).ok_or(BAD_FORMAT)?;
            let (n, nr) = noreply(&a[..n]);
            let delay = match n {
                0 => 0,
                // A negative delay flushes now, as in memcached.
                1 => num::<i64>(a[0]).ok_or(err("CLIENT_ERROR invalid exptime argument"))?.max(0),
                _ => return Err(BAD_FORMAT),
            };
            Ok(Command::FlushAll { delay, noreply: nr })
        }
        b"stats" => {
            let (a, n) = take::<4>(&mut t).ok_or(UNKNOWN)?;
            let kind = match &a[..n] {
                [] => StatsKind::General,
                [b"settings"] => StatsKind::Settings,
                [b"items"] => StatsKind::Items,
                [b"slabs"] => StatsKind::Slabs,
                [b"conns"] => StatsKind::Conns,
                [b"reset"] => StatsKind::Reset,
                [b"cachedump", class, limit] => StatsKind::CacheDump {
                    class: num::<u32>(class).ok_or(BAD_FORMAT)?,
                    limit: num::<u32>(limit).ok_or(BAD_FORMAT)?,
                },
                [b"cachedump", ..] => return Err(BAD_FORMAT),
                _ => return Err(UNKNOWN),
            };
            Ok(Command::Stats(kind))
        }
        b"version" => Ok(Command::Version),
        b"quit" => Ok(Command::Quit),
        b"verbosity" => {
            // As memcached: a level is required (else ERROR), extra tokens are ignored, and
            // a level that is not a number is an error that noreply silences.
            let first = t.next().ok_or(UNKNOWN)?;
            let last = t.last().unwrap_or(first);
            Ok(Command::Verbosity { level: num::<u32>(first), noreply: last == b"noreply" })
        }
        b"mn" => Ok(Command::MetaNoop),
        b"mg" | b"md" | b"ma" | b"me" => {
            let k = t.next().ok_or(BAD_FORMAT)?;
            let flags = meta_flags(&mut t)?;
            let mk = meta_key(k, flags.base64)?;
            Ok(match name {
                b"mg" => Command::MetaGet(mk, flags),
                b"md" => Command::MetaDelete(mk, flags),
                b"ma" => Command::MetaArith(mk, flags),
                _ => Command::MetaDebug(mk),
            })
        }
        b"ms" => {
            let k = t.next().ok_or(BAD_FORMAT)?;
            let len = t.next().and_then(num::<usize>).ok_or(err("CLIENT_ERROR bad data chunk"))?;
            let swallow = |e: ParseError| ParseError { swallow: len.checked_add(2), ..e };
            let flags = meta_flags(&mut t).map_err(swallow)?;
            let mk = meta_key(k, flags.base64).map_err(swallow)?;
            Ok(Command::MetaSet(mk, len, flags))
        }
        _ => Err(UNKNOWN),
    }
}

fn storage<'a>(name: &[u8], t: &mut Tokens<'a>) -> Result<Command<'a>, ParseError> {
    let mode = match name {
        b"set" => StoreMode::Set,
        b"add" => StoreMode::Add,
        b"replace" => StoreMode::Replace,
        b"append" => StoreMode::Append,
        b"prepend" => StoreMode::Prepend,
        _ => StoreMode::Cas,
    };
    let (a, n) = take::<6>(t).ok_or(BAD_FORMAT)?;
    let (n, nr) = noreply(&a[..n]);
    let want = if mode == StoreMode::Cas { 5 } else { 4 };
    if n != want {
        return Err(UNKNOWN);
    }
    let len = num::<usize>(a[3]).ok_or(BAD_FORMAT)?;
    // From here the data block's length is known: errors skip it.
    let e = |reply| ParseError { reply, swallow: len.checked_add(2) };
    let k = key(Some(a[0])).map_err(|_| e(BAD_FORMAT.reply))?;
    let flags = num::<u32>(a[1]).ok_or(e(BAD_FORMAT.reply))?;
    let exptime = num::<i64>(a[2]).ok_or(e(BAD_FORMAT.reply))?;
    let cas = if mode == StoreMode::Cas { num::<u64>(a[4]).ok_or(e(BAD_FORMAT.reply))? } else { 0 };
    Ok(Command::Store { mode, key: k, flags, exptime, len, cas, noreply: nr })
}

fn meta_key(token: &[u8], base64: bool) -> Result<MetaKey<'_>, ParseError> {
    let mut mk = MetaKey { token, decoded: [0; KEY_MAX], decoded_len: None };
    if base64 {
        // Base64 of a 250-byte key is at most 336 bytes; decoding checks the output fits.
        let n = base64::engine::general_purpose::STANDARD
            .decode_slice(token, &mut mk.decoded)
            .map_err(|_| err("CLIENT_ERROR error decoding key"))?;
        if n == 0 {
            return Err(err("CLIENT_ERROR error decoding key"));
        }
        mk.decoded_len = Some(n as u8);
    } else if token.len() > KEY_MAX {
        return Err(BAD_FORMAT);
    }
    Ok(mk)
}

fn meta_flags<'a>(t: &mut Tokens<'a>) -> Result<MetaFlags<'a>, ParseError> {
    let mut f = MetaFlags::default();
    for tok in t {
        let (&c, arg) = tok.split_first().ok_or(BAD_FORMAT)?;
        if f.count == META_MAX_FLAGS {
            return Err(err("CLIENT_ERROR options flags are too long"));
        }
        if !c.is_ascii() || f.has(c) {
            return Err(err("CLIENT_ERROR duplicate flag"));
        }
        f.order[f.count] = c;
        f.count += 1;
        let ttl = |a: &[u8]| num::<i32>(a).map(i64::from).ok_or(BAD_TOKEN);
        match c {
            b'b' => f.base64 = true,
            b'N' => f.vivify = Some(ttl(arg)?),
            b'T' => f.ttl = Some(ttl(arg)?),
            b'R' => f.recache = Some(ttl(arg)?),
            b'O' => {
                if arg.len() > OPAQUE_MAX {
                    return Err(err("CLIENT_ERROR opaque token too long"));
                }
                f.opaque = Some(arg);
            }
            b'P' | b'L' | b'k' | b's' | b't' | b'c' | b'f' | b'h' | b'l' => {}
            b'v' => f.value = true,
            b'u' => f.no_bump = true,
            b'q' => f.quiet = true,
            b'x' => f.remove_value = true,
            b'I' => f.invalidate = true,
            b'F' => f.client_flags = Some(num::<u32>(arg).ok_or(BAD_TOKEN)?),
            b'C' => f.compare_cas = Some(num::<u64>(arg).ok_or(BAD_TOKEN)?),
            b'E' => f.new_cas = Some(num::<u64>(arg).ok_or(BAD_TOKEN)?),
            b'M' => f.mode = Some(*arg.first().ok_or(BAD_TOKEN)?),
            b'J' => f.initial = Some(num::<u64>(arg).ok_or(err("CLIENT_ERROR invalid numeric initial value"))?),
            b'D' => f.delta = Some(num::<u64>(arg).ok_or(err("CLIENT_ERROR invalid numeric delta value"))?),
            _ => return Err(err("CLIENT_ERROR invalid flag")),
        }
    }
    Ok(f)
}

/// Whether an unfinished line may grow to the multi-get limit instead of the line limit
/// (memcached lets only get and gets lines be long).
pub fn is_long_line_command(start: &[u8]) -> bool {
    let s = &start[..start.len().min(8)];
    s.starts_with(b"get ") || s.starts_with(b"gets ") || s.starts_with(b"gat ") || s.starts_with(b"gats ")
}

//! One text or meta command line (without its `\r\n`) into a [`Command`] that borrows
//! from it, with memcached 1.6.18's rules (`proto_text.c`):
//!
//! - the line ends at its first NUL byte; tokens are separated by spaces (only spaces),
//!   and at most 23 are looked at (`MAX_TOKENS`), so a line with more takes the
//!   token-count error of its command;
//! - each command checks its token count first (`ERROR`), then reads `noreply` from
//!   its last token, then its arguments: an error found after `noreply` was read is
//!   not sent ([`ParseError::silent`]), as memcached's `out_string` drops it;
//! - numbers are C's `strtol` family as memcached calls them ([`Num`]).
//!
//! Get commands are not parsed here: their keys may run past any line limit, so the
//! connection reads them as they arrive ([`get_head`] parses the command and, for
//! gat, the expiry).
//!
//! Nothing here allocates or panics; every malformed line maps to the reply memcached
//! sends for it.

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
    /// `stats sizes`.
    Sizes,
    /// `stats conns`.
    Conns,
    /// `stats detail on|off|dump`: per-key-prefix stats, which are not kept here (on and
    /// off are accepted, a dump is empty).
    Detail {
        /// `dump` (else on or off).
        dump: bool,
    },
    /// `stats reset`.
    Reset,
    /// `stats cachedump <class> <limit>`: keys of a size class, at most `limit` (0: as
    /// many as fit in 2 MB).
    CacheDump {
        /// The class asked for.
        class: u32,
        /// Most keys.
        limit: u32,
    },
}

/// Most tokens memcached looks at on one line (`MAX_TOKENS` less its terminal entry).
pub const MAX_TOKENS: usize = 23;

/// The first [`MAX_TOKENS`] space-separated tokens of a line, and whether more follow.
#[derive(Debug, Clone, Copy)]
pub struct Tokens<'a> {
    tokens: [&'a [u8]; MAX_TOKENS],
    n: usize,
    /// More tokens follow the last one kept.
    more: bool,
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
    fn ntokens(&self) -> usize {
        self.n + 1
    }

    fn get(&self, i: usize) -> &'a [u8] {
        if i < self.n { self.tokens[i] } else { &[] }
    }

    /// Whether the last token kept is `noreply` (memcached's `set_noreply_maybe`).
    fn noreply(&self) -> bool {
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
    negative: bool,
    magnitude: u64,
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

fn i32_arg(t: &[u8]) -> Option<i32> {
    Num::parse(t)?.i32()
}

fn u32_arg(t: &[u8]) -> Option<u32> {
    Num::parse(t)?.u32()
}

fn u64_arg(t: &[u8]) -> Option<u64> {
    Num::parse(t)?.u64()
}

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

/// A parsed command line (every command but the gets, see [`get_head`]).
#[derive(Debug, Clone, Copy)]
pub enum Command<'a> {
    /// set, add, replace, append, prepend, cas: a data block of `len` bytes follows.
    Store {
        /// Which.
        mode: StoreMode,
        /// The key.
        key: &'a [u8],
        /// Client flags.
        flags: u32,
        /// Expiry as sent.
        exptime: i32,
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
        exptime: i32,
        /// No reply wanted.
        noreply: bool,
    },
    /// flush_all: its time argument as sent (0: now).
    FlushAll {
        /// Seconds, or a Unix time, until it takes effect (0 or negative: now).
        exptime: i32,
        /// No reply wanted.
        noreply: bool,
    },
    /// stats.
    Stats(StatsKind),
    /// version.
    Version,
    /// verbosity.
    Verbosity {
        /// The level.
        level: u32,
        /// No reply wanted.
        noreply: bool,
    },
    /// quit.
    Quit,
    /// shutdown [graceful].
    Shutdown {
        /// `shutdown graceful`.
        graceful: bool,
    },
    /// `slabs automove <0|1|2>`: accepted (this store has no slab pages to move).
    SlabsAutomove {
        /// No reply wanted.
        noreply: bool,
    },
    /// `cache_memlimit <megabytes>`.
    CacheMemlimit {
        /// The new limit, MiB.
        megabytes: u32,
        /// No reply wanted.
        noreply: bool,
    },
    /// `debugtime <seconds>` (memcached-debug's clock control; refused unless the
    /// server enables it).
    DebugTime(i64),
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

/// A line that is not a valid command, as memcached answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParseError {
    /// The reply line (without CRLF); empty with `close`.
    pub reply: &'static str,
    /// A storage command whose data block length was readable: skip that many bytes
    /// (data and CRLF), so the data is not read as commands.
    pub swallow: Option<usize>,
    /// The command asked for no reply (`noreply`) before the error was found: the
    /// reply is not sent, as memcached does.
    pub silent: bool,
    /// Close the connection without a reply (an HTTP request line).
    pub close: bool,
}

const fn err(reply: &'static str) -> ParseError {
    ParseError { reply, swallow: None, silent: false, close: false }
}

impl ParseError {
    fn silent_if(self, noreply: bool) -> ParseError {
        ParseError { silent: noreply, ..self }
    }

    fn swallowing(self, n: Option<usize>) -> ParseError {
        ParseError { swallow: n, ..self }
    }
}

/// `ERROR`: not a command, or the wrong number of tokens.
pub const UNKNOWN: ParseError = err("ERROR");
/// The generic malformed-line error.
pub const BAD_FORMAT: ParseError = err("CLIENT_ERROR bad command line format");
const BAD_TOKEN: ParseError = err("CLIENT_ERROR bad token in command line format");
const BAD_EXPTIME: ParseError = err("CLIENT_ERROR invalid exptime argument");
/// An HTTP request line on the memcached port: close at once (memcached's defence
/// against cross-protocol requests from browsers).
const HTTP: ParseError = ParseError { reply: "", swallow: None, silent: false, close: true };

/// What the server lets a client do beyond the common commands (memcached's options).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allowed {
    /// `shutdown` (`-A`).
    pub shutdown: bool,
    /// `debugtime` (memcached-debug's builds).
    pub debug_time: bool,
}

/// The head of a get command: which one, gat's expiry, and where the keys start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetHead {
    /// gets/gats: return CAS values.
    pub cas: bool,
    /// gat/gats: the new expiry.
    pub touch: Option<i32>,
    /// Offset of the first byte after the command (and gat's expiry) in the line.
    pub keys_at: usize,
}

/// Whether `line` (the start of a line, maybe without its end) is a get command, and
/// if so its head. `Err` for a gat whose expiry is not a number. `Ok(None)`: not a
/// get, or not enough of it yet to tell (`complete` false and no space after the
/// command or gat's expiry).
pub fn get_head(line: &[u8], complete: bool) -> Result<Option<GetHead>, ParseError> {
    let line = if complete { &line[..memchr::memchr(0, line).unwrap_or(line.len())] } else { line };
    let mut pos = 0;
    let word = |pos: &mut usize| -> Option<&[u8]> {
        let start = *pos + line[*pos..].iter().position(|&b| b != b' ')?;
        let len = line[start..].iter().position(|&b| b == b' ');
        if len.is_none() && !complete {
            return None;
        }
        let end = start + len.unwrap_or(line.len() - start);
        *pos = end;
        Some(&line[start..end])
    };
    let Some(name) = word(&mut pos) else { return Ok(None) };
    let (cas, touch) = match name {
        b"get" | b"bget" => (false, false),
        b"gets" => (true, false),
        b"gat" => (false, true),
        b"gats" => (true, true),
        _ => return Ok(None),
    };
    let exptime = if touch {
        let Some(e) = word(&mut pos) else {
            // "gat" alone (complete) has too few tokens; else wait for more.
            return if complete { Err(UNKNOWN) } else { Ok(None) };
        };
        Some(i32_arg(e).ok_or(BAD_EXPTIME)?)
    } else {
        None
    };
    // get, gets and bget want at least one key (memcached's token count); a gat with
    // no keys answers END.
    if complete && !touch && !line[pos..].iter().any(|&b| b != b' ') {
        return Err(UNKNOWN);
    }
    Ok(Some(GetHead { cas, touch: exptime, keys_at: pos }))
}

/// Parses one command line (without `\r\n`), get commands excepted.
pub fn parse(line: &[u8], allowed: Allowed) -> Result<Command<'_>, ParseError> {
    // memcached tokenizes a C string: a NUL byte ends the line.
    let line = &line[..memchr::memchr(0, line).unwrap_or(line.len())];
    let t = Tokens::new(line);
    let n = t.ntokens();
    let name = t.get(0);
    if name.len() < 2 {
        return Err(UNKNOWN);
    }
    let want = |ok: bool| if ok { Ok(()) } else { Err(UNKNOWN) };
    match name {
        b"mg" | b"ms" | b"md" | b"ma" | b"me" | b"mn" => meta(name, &t),
        b"set" | b"add" | b"replace" | b"append" | b"prepend" => {
            want(n == 6 || n == 7)?;
            storage(name, &t)
        }
        b"cas" => {
            want(n == 7 || n == 8)?;
            storage(name, &t)
        }
        b"incr" | b"decr" => {
            want(n == 4 || n == 5)?;
            let nr = t.noreply();
            let key = key_arg(t.get(1)).map_err(|e| e.silent_if(nr))?;
            let delta = u64_arg(t.get(2)).ok_or(err("CLIENT_ERROR invalid numeric delta argument").silent_if(nr))?;
            Ok(Command::Arith { incr: name == b"incr", key, delta, noreply: nr })
        }
        b"delete" => {
            want((3..=5).contains(&n))?;
            let mut nr = false;
            if n > 3 {
                // memcached takes a legacy hold time of 0 and nothing else.
                let hold_is_zero = t.get(2) == b"0";
                nr = t.noreply();
                let valid = (n == 4 && (hold_is_zero || nr)) || (n == 5 && hold_is_zero && nr);
                if !valid {
                    return Err(
                        err("CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]").silent_if(nr)
                    );
                }
            }
            let key = key_arg(t.get(1)).map_err(|e| e.silent_if(nr))?;
            Ok(Command::Delete { key, noreply: nr })
        }
        b"touch" => {
            want(n == 4 || n == 5)?;
            let nr = t.noreply();
            let key = key_arg(t.get(1)).map_err(|e| e.silent_if(nr))?;
            let exptime = i32_arg(t.get(2)).ok_or(BAD_EXPTIME.silent_if(nr))?;
            Ok(Command::Touch { key, exptime, noreply: nr })
        }
        b"flush_all" => {
            want((2..=4).contains(&n))?;
            let nr = t.noreply();
            let exptime =
                if n != if nr { 3 } else { 2 } { i32_arg(t.get(1)).ok_or(BAD_EXPTIME.silent_if(nr))? } else { 0 };
            Ok(Command::FlushAll { exptime, noreply: nr })
        }
        b"stats" => stats(&t),
        b"version" => Ok(Command::Version),
        b"quit" => Ok(Command::Quit),
        b"verbosity" => {
            want(n == 3 || n == 4)?;
            let nr = t.noreply();
            let level = u32_arg(t.get(1)).ok_or(BAD_FORMAT.silent_if(nr))?;
            Ok(Command::Verbosity { level, noreply: nr })
        }
        b"shutdown" if allowed.shutdown => match (n, t.get(1)) {
            (2, _) => Ok(Command::Shutdown { graceful: false }),
            (3, b"graceful") => Ok(Command::Shutdown { graceful: true }),
            _ => Err(err("CLIENT_ERROR invalid shutdown mode")),
        },
        b"shutdown" => Err(err("ERROR: shutdown not enabled")),
        b"slabs" => slabs(&t),
        b"cache_memlimit" => {
            want(n == 3 || n == 4)?;
            let nr = t.noreply();
            let megabytes = u32_arg(t.get(1)).ok_or(UNKNOWN.silent_if(nr))?;
            Ok(Command::CacheMemlimit { megabytes, noreply: nr })
        }
        b"debugtime" if allowed.debug_time => {
            want(n >= 2)?;
            // memcached-debug: `p` and `r` pause and resume its clock; not kept here.
            let delta = Num::parse(t.get(1)).and_then(|v| {
                let m = i64::try_from(v.magnitude).ok()?;
                Some(if v.negative { -m } else { m })
            });
            delta.map(Command::DebugTime).ok_or(UNKNOWN)
        }
        _ => {
            // Unknown: an HTTP request line closes the connection (memcached looks at
            // the last token it kept).
            if t.as_slice().last().is_some_and(|l| l.starts_with(b"HTTP/")) { Err(HTTP) } else { Err(UNKNOWN) }
        }
    }
}

fn key_arg(k: &[u8]) -> Result<&[u8], ParseError> {
    if k.len() > KEY_MAX { Err(BAD_FORMAT) } else { Ok(k) }
}

fn storage<'a>(name: &[u8], t: &Tokens<'a>) -> Result<Command<'a>, ParseError> {
    let mode = match name {
        b"set" => StoreMode::Set,
        b"add" => StoreMode::Add,
        b"replace" => StoreMode::Replace,
        b"append" => StoreMode::Append,
        b"prepend" => StoreMode::Prepend,
        _ => StoreMode::Cas,
    };
    let nr = t.noreply();
    // memcached checks the length's range after the other fields; when it is
    // readable, a refused line skips its data block here (see the module docs of
    // `proto` for why).
    let len = i32_arg(t.get(4)).filter(|&l| (0..=i32::MAX - 2).contains(&l)).map(|l| l as usize);
    let e = |reply: ParseError| reply.silent_if(nr).swallowing(len.map(|l| l + 2));
    let key = key_arg(t.get(1)).map_err(e)?;
    let flags = u32_arg(t.get(2)).ok_or(e(BAD_FORMAT))?;
    let exptime = i32_arg(t.get(3)).ok_or(e(BAD_FORMAT))?;
    let Some(len) = len else { return Err(BAD_FORMAT.silent_if(nr)) };
    let cas = if mode == StoreMode::Cas { u64_arg(t.get(5)).ok_or(e(BAD_FORMAT))? } else { 0 };
    Ok(Command::Store { mode, key, flags, exptime, len, cas, noreply: nr })
}

fn stats<'a>(t: &Tokens<'a>) -> Result<Command<'a>, ParseError> {
    let kind = match t.as_slice() {
        [_] => StatsKind::General,
        [_, b"reset", ..] => StatsKind::Reset,
        [_, b"settings", ..] => StatsKind::Settings,
        [_, b"items", ..] => StatsKind::Items,
        [_, b"slabs", ..] => StatsKind::Slabs,
        [_, b"sizes", ..] => StatsKind::Sizes,
        [_, b"conns", ..] => StatsKind::Conns,
        [_, b"detail", b"on" | b"off"] => StatsKind::Detail { dump: false },
        [_, b"detail", b"dump"] => StatsKind::Detail { dump: true },
        [_, b"detail", ..] => return Err(err("CLIENT_ERROR usage: stats detail on|off|dump")),
        [_, b"cachedump", class, limit, ..] => {
            StatsKind::CacheDump { class: u32_arg(class).ok_or(BAD_FORMAT)?, limit: u32_arg(limit).ok_or(BAD_FORMAT)? }
        }
        [_, b"cachedump", ..] => return Err(err("CLIENT_ERROR bad command line")),
        _ => return Err(UNKNOWN),
    };
    Ok(Command::Stats(kind))
}

fn slabs<'a>(t: &Tokens<'a>) -> Result<Command<'a>, ParseError> {
    let n = t.ntokens();
    match t.get(1) {
        b"reassign" if n == 5 => Err(err("CLIENT_ERROR slab reassignment disabled")),
        b"automove" if n >= 4 => {
            let nr = t.noreply();
            if t.get(2) == b"ratio" {
                return if n >= 5 && Num::parse(t.get(3)).is_some() {
                    Ok(Command::SlabsAutomove { noreply: nr })
                } else {
                    Err(UNKNOWN.silent_if(nr))
                };
            }
            match u32_arg(t.get(2)) {
                None => Err(BAD_FORMAT.silent_if(nr)),
                Some(0..=2) => Ok(Command::SlabsAutomove { noreply: nr }),
                Some(_) => Err(UNKNOWN.silent_if(nr)),
            }
        }
        _ => Err(UNKNOWN),
    }
}

fn meta<'a>(name: &[u8], t: &Tokens<'a>) -> Result<Command<'a>, ParseError> {
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

/// Whether a line that has no end yet may grow past the line limit: only a get
/// command's may (its keys are read as they arrive). memcached allows up to 100
/// leading spaces before it.
pub fn is_get_line(start: &[u8]) -> bool {
    let skip = start.iter().take(101).take_while(|&&b| b == b' ').count();
    if skip > 100 {
        return false;
    }
    let s = &start[skip..];
    [&b"get "[..], b"gets ", b"gat ", b"gats ", b"bget "].iter().any(|p| s.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: Allowed = Allowed { shutdown: true, debug_time: true };

    #[test]
    fn numbers_read_as_memcacheds_strtol() {
        let n = |s: &str| Num::parse(s.as_bytes());
        assert_eq!(n("+3").and_then(Num::i32), Some(3));
        assert_eq!(n("007").and_then(Num::u32), Some(7));
        assert_eq!(n("\t5").and_then(Num::u32), Some(5));
        assert_eq!(n("5\tjunk").and_then(Num::u32), Some(5));
        assert_eq!(n("-0").and_then(Num::u64), Some(0));
        assert_eq!(n("-1").and_then(Num::u64), None);
        assert_eq!(n("-1").and_then(Num::i32), Some(-1));
        assert_eq!(n("2147483648").and_then(Num::i32), None);
        assert_eq!(n("-2147483648").and_then(Num::i32), Some(i32::MIN));
        assert_eq!(n("4294967296").and_then(Num::u32), None);
        assert_eq!(n("18446744073709551616"), None);
        assert_eq!(n("5x"), None);
        assert_eq!(n(""), None);
        assert_eq!(n("-"), None);
    }

    #[test]
    fn token_counts_and_noreply_as_memcached() {
        // A sixth token that is not noreply is ignored.
        assert!(matches!(parse(b"set k 0 0 1 foo", ALL), Ok(Command::Store { noreply: false, .. })));
        assert_eq!(parse(b"set k 0 0", ALL).unwrap_err(), UNKNOWN);
        // Errors after noreply was read are silent.
        let e = parse(b"incr k x noreply", ALL).unwrap_err();
        assert!(e.silent);
        let e = parse(b"delete k 10 noreply", ALL).unwrap_err();
        assert!(e.silent && e.reply.starts_with("CLIENT_ERROR bad command line format."));
        assert!(matches!(parse(b"delete k 0 noreply", ALL), Ok(Command::Delete { noreply: true, .. })));
        assert!(matches!(parse(b"delete k noreply", ALL), Ok(Command::Delete { noreply: true, .. })));
        // Lengths memcached refuses, and no data block is read for them.
        for l in ["-1", "4294967295", "2147483647", "2147483646"] {
            let e = parse(format!("set k 0 0 {l}").as_bytes(), ALL).unwrap_err();
            assert_eq!((e.reply, e.swallow), (BAD_FORMAT.reply, None), "{l}");
        }
        assert!(matches!(parse(b"set k 0 0 2147483645", ALL), Ok(Command::Store { len: 2147483645, .. })));
        assert!(matches!(parse(b"set k 0 0 +3", ALL), Ok(Command::Store { len: 3, .. })));
        // A NUL byte ends the line.
        assert_eq!(parse(b"set k\0 0 0 1", ALL).unwrap_err(), UNKNOWN);
    }

    #[test]
    fn memcached_internals_have_no_counterpart() {
        for l in ["lru_crawler metadump all", "lru mode flat", "watch", "extstore free_memchunks 0 0"] {
            assert_eq!(parse(l.as_bytes(), ALL).unwrap_err(), UNKNOWN, "{l}");
        }
        assert_eq!(parse(b"slabs reassign 1 2", ALL).unwrap_err().reply, "CLIENT_ERROR slab reassignment disabled");
        let no = Allowed { shutdown: false, debug_time: false };
        assert_eq!(parse(b"debugtime 1", no).unwrap_err(), UNKNOWN);
        assert_eq!(parse(b"shutdown", no).unwrap_err().reply, "ERROR: shutdown not enabled");
    }

    #[test]
    fn http_request_lines_close() {
        for l in ["GET / HTTP/1.0", "PUT /asdf/asd/fasdfasdf/sadf HTTP/1.1", "DELETE HTTP/1.1", "POST / HTTP/1.1"] {
            assert!(parse(l.as_bytes(), ALL).unwrap_err().close, "{l}");
        }
        assert!(!parse(b"bogus", ALL).unwrap_err().close);
    }

    #[test]
    fn get_heads_and_long_lines() {
        assert_eq!(get_head(b"get a b", true), Ok(Some(GetHead { cas: false, touch: None, keys_at: 3 })));
        assert_eq!(get_head(b"gats 10 a", true), Ok(Some(GetHead { cas: true, touch: Some(10), keys_at: 7 })));
        assert_eq!(get_head(b"gat x a", true), Err(BAD_EXPTIME));
        assert_eq!(get_head(b"gat", true), Err(UNKNOWN));
        assert_eq!(get_head(b"get  ", true), Err(UNKNOWN));
        assert_eq!(get_head(b"get\0 a", true), Err(UNKNOWN));
        assert!(get_head(b"gat 10", true).unwrap().is_some());
        assert_eq!(get_head(b"gat 1", false), Ok(None));
        assert_eq!(get_head(b"set a", true), Ok(None));
        assert!(is_get_line(b"  get a"));
        assert!(!is_get_line(b"set a"));
    }

    #[test]
    fn meta_flags_as_memcached() {
        let e = |l: &str| parse(l.as_bytes(), ALL).unwrap_err().reply;
        assert_eq!(e("mg k x"), "CLIENT_ERROR invalid flag");
        assert_eq!(e("mg k v v"), "CLIENT_ERROR duplicate flag");
        assert_eq!(e("md k x"), "CLIENT_ERROR invalid or duplicate flag");
        assert_eq!(e("ms k 1 MEE"), "CLIENT_ERROR incorrect length for M token");
        assert_eq!(parse(b"ms k 1 x", ALL).unwrap_err().swallow, Some(3));
        assert_eq!(e("ms"), "ERROR");
        assert_eq!(e("ms k"), "CLIENT_ERROR bad command line format");
        assert_eq!(e("mg k O123456789012345678901234567890123"), "CLIENT_ERROR opaque token too long");
        let many = format!("mg k {}", (b'a'..=b'z').map(|c| (c as char).to_string()).collect::<Vec<_>>().join(" "));
        assert_eq!(e(&many), "CLIENT_ERROR options flags are too long");
    }
}

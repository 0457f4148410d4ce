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
//!
//! This file holds the commands and their errors, and the text commands' lines; the
//! tokenizer and numbers are in `tokens.rs`, the meta commands' keys and flags in
//! `meta.rs`, get heads in `get.rs`.

mod get;
mod meta;
mod tokens;

pub use get::{GetHead, get_head, is_get_line};
pub use meta::{META_MAX_TOKENS, MetaFlags, MetaKey, OPAQUE_MAX};
pub use tokens::{MAX_TOKENS, Num, Tokens};

use crate::store::KEY_MAX;
use tokens::{i32_arg, u32_arg, u64_arg};

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
    /// `shutdown [graceful]`.
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
        b"mg" | b"ms" | b"md" | b"ma" | b"me" | b"mn" => meta::meta(name, &t),
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

#[cfg(test)]
mod tests;

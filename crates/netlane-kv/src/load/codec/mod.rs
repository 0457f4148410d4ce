//! The client side of memcached's text protocol (memcached's `doc/protocol.txt`):
//! requests out, replies matched to them.
//!
//! The text protocol has no request ids: a connection's replies come in the order of its
//! requests. So the codec keeps the requests in flight in a FIFO, each with the driver's
//! token, and every reply completes the one at its head:
//! - a get is answered by zero or more `VALUE <key> <flags> <bytes> [<cas>]` blocks, each
//!   followed by `<bytes>` of data and CRLF, then `END`; requested keys without a block
//!   are misses (a key asked for twice is answered twice);
//! - a set by `STORED`, `NOT_STORED`, `EXISTS` or `NOT_FOUND`;
//! - either by `ERROR`, `CLIENT_ERROR <message>` or `SERVER_ERROR <message>`, which
//!   completes it as failed.
//!
//! The decoder takes the byte stream in chunks split anywhere. It never panics, and its
//! memory is bounded whatever arrives: it keeps at most one partial line of
//! [`MAX_LINE`] bytes, and skips value data by counting (a value's bytes are never
//! stored, so a value may be as large as the configured limit). Anything else, a reply
//! nothing was asked for, a reply of the wrong kind, a line too long, a value larger than
//! the limit, data not followed by CRLF, is a [`ProtocolError`]: the stream is no longer
//! in step with the requests, so the driver closes the connection and counts every
//! request still in flight ([`Codec::abandon`]) as failed.

use std::collections::VecDeque;

use thiserror::Error;

use super::workload::{Key, push_decimal};

/// The longest reply line (CRLF included) the decoder buffers.
pub const MAX_LINE: usize = 8192;

/// How much of a bad line an error quotes.
const QUOTE: usize = 64;

/// A request to encode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request<'a> {
    /// `get <key>*`: one or more keys.
    Get {
        /// The keys, in order.
        keys: &'a [Key],
    },
    /// `set <key> 0 0 <bytes>`, with a deterministic filler as the value.
    Set {
        /// The key.
        key: Key,
        /// Value bytes.
        value_len: u32,
    },
}

/// The reply that completed a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// A get's `END`.
    Get {
        /// `VALUE` blocks.
        hits: u32,
        /// Keys asked for without one.
        misses: u32,
    },
    /// A set's outcome.
    Set(SetReply),
    /// An error line.
    Error(ReplyError),
}

/// What a set was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetReply {
    /// `STORED`.
    Stored,
    /// `NOT_STORED`.
    NotStored,
    /// `EXISTS`.
    Exists,
    /// `NOT_FOUND`.
    NotFound,
}

/// An error line in place of a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyError {
    /// `ERROR`: the server did not know the command.
    Error,
    /// `CLIENT_ERROR`: the request was malformed.
    Client,
    /// `SERVER_ERROR`: the server failed (out of memory, say).
    Server,
}

/// A request answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The token the request was encoded with.
    pub token: u64,
    /// Its reply.
    pub reply: Reply,
}

/// The reply stream is out of step with the requests: close the connection.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProtocolError {
    /// A line with no request in flight.
    #[error("reply {line:?} with no request in flight")]
    Unsolicited {
        /// The line's start.
        line: String,
    },
    /// A line that does not answer the request at the head of the queue.
    #[error("reply {line:?} to a {request}")]
    Unexpected {
        /// `get` or `set`.
        request: &'static str,
        /// The line's start.
        line: String,
    },
    /// A `VALUE` line that does not parse.
    #[error("malformed VALUE line {line:?}")]
    BadValue {
        /// The line's start.
        line: String,
    },
    /// A value larger than the limit.
    #[error("VALUE of {declared} bytes: larger than the {limit}-byte limit")]
    ValueTooLarge {
        /// Bytes the line declared.
        declared: u64,
        /// The limit.
        limit: u32,
    },
    /// More `VALUE` blocks than keys asked for.
    #[error("more VALUE blocks than the {keys} keys asked for")]
    TooManyValues {
        /// Keys asked for.
        keys: u32,
    },
    /// A line ended by a bare LF.
    #[error("reply line {line:?} not ended by CRLF")]
    BareNewline {
        /// The line's start.
        line: String,
    },
    /// A line longer than [`MAX_LINE`].
    #[error("reply line longer than {MAX_LINE} bytes")]
    LineTooLong,
    /// Value data not followed by CRLF.
    #[error("value data not followed by CRLF")]
    DataNotTerminated,
}

#[derive(Debug, Clone, Copy)]
enum Expect {
    Get { keys: u32, hits: u32 },
    Set,
}

impl Expect {
    fn name(&self) -> &'static str {
        match self {
            Expect::Get { .. } => "get",
            Expect::Set => "set",
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    token: u64,
    expect: Expect,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading a line.
    Line,
    /// Skipping value data: bytes left, its CRLF included.
    Data { left: u64 },
}

/// One connection's request FIFO and reply decoder.
#[derive(Debug)]
pub struct Codec {
    queue: VecDeque<Pending>,
    /// A line begun in an earlier chunk.
    line: Vec<u8>,
    state: State,
    max_value_len: u32,
    failed: Option<ProtocolError>,
}

/// The filler every value is made of: printable, so captures read easily.
static FILLER: [u8; 1024] = {
    let mut b = [0u8; 1024];
    let mut i = 0;
    while i < b.len() {
        b[i] = b'a' + (i % 26) as u8;
        i += 1;
    }
    b
};

fn quote(line: &[u8]) -> String {
    String::from_utf8_lossy(&line[..line.len().min(QUOTE)]).into_owned()
}

/// A decimal number of ASCII digits, or `None` (empty, a non-digit, overflow).
fn parse_decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    s.iter().try_fold(0u64, |n, &b| {
        let d = b.checked_sub(b'0').filter(|d| *d < 10)?;
        n.checked_mul(10)?.checked_add(u64::from(d))
    })
}

impl Codec {
    /// A codec refusing values larger than `max_value_len` bytes (the server's item
    /// limit).
    pub fn new(max_value_len: u32) -> Self {
        Codec { queue: VecDeque::new(), line: Vec::new(), state: State::Line, max_value_len, failed: None }
    }

    /// Requests in flight.
    pub fn outstanding(&self) -> usize {
        self.queue.len()
    }

    /// Appends `request` to `out` and queues its reply under `token`.
    pub fn encode(&mut self, token: u64, request: &Request<'_>, out: &mut Vec<u8>) {
        let expect = match *request {
            Request::Get { keys } => {
                out.extend_from_slice(b"get");
                for k in keys {
                    out.push(b' ');
                    k.write_to(out);
                }
                out.extend_from_slice(b"\r\n");
                Expect::Get { keys: u32::try_from(keys.len()).unwrap_or(u32::MAX), hits: 0 }
            }
            Request::Set { key, value_len } => {
                out.extend_from_slice(b"set ");
                key.write_to(out);
                out.extend_from_slice(b" 0 0 ");
                push_decimal(out, u64::from(value_len), 0);
                out.extend_from_slice(b"\r\n");
                let mut left = value_len as usize;
                while left > 0 {
                    let n = left.min(FILLER.len());
                    out.extend_from_slice(&FILLER[..n]);
                    left -= n;
                }
                out.extend_from_slice(b"\r\n");
                Expect::Set
            }
        };
        self.queue.push_back(Pending { token, expect });
    }

    /// Decodes `input`, the next bytes of the stream, calling `done` for every request it
    /// completes, in request order. After an error the codec refuses everything until
    /// [`Codec::abandon`].
    pub fn decode(&mut self, mut input: &[u8], mut done: impl FnMut(Completion)) -> Result<(), ProtocolError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let r = loop {
            if input.is_empty() {
                break Ok(());
            }
            match self.state {
                State::Data { left } if left > 2 => {
                    let skip = (left - 2).min(input.len() as u64);
                    input = &input[skip as usize..];
                    self.state = State::Data { left: left - skip };
                }
                State::Data { left } => {
                    // The data's CRLF.
                    let want = if left == 2 { b'\r' } else { b'\n' };
                    if input[0] != want {
                        break Err(ProtocolError::DataNotTerminated);
                    }
                    input = &input[1..];
                    self.state = if left == 2 { State::Data { left: 1 } } else { State::Line };
                }
                State::Line => {
                    let Some(end) = memchr::memchr(b'\n', input) else {
                        if self.line.len() + input.len() > MAX_LINE {
                            break Err(ProtocolError::LineTooLong);
                        }
                        self.line.extend_from_slice(input);
                        break Ok(());
                    };
                    let (head, rest) = input.split_at(end + 1);
                    input = rest;
                    if self.line.len() + head.len() > MAX_LINE {
                        break Err(ProtocolError::LineTooLong);
                    }
                    let r = if self.line.is_empty() {
                        // The whole line is in this chunk: parse it in place.
                        self.on_line(head, &mut done)
                    } else {
                        let mut line = std::mem::take(&mut self.line);
                        line.extend_from_slice(head);
                        let r = self.on_line(&line, &mut done);
                        line.clear();
                        self.line = line;
                        r
                    };
                    if let Err(e) = r {
                        break Err(e);
                    }
                }
            }
        };
        if let Err(e) = &r {
            self.failed = Some(e.clone());
        }
        r
    }

    /// Forgets every request in flight and any partial reply (the connection closed);
    /// returns how many requests were in flight. The codec is then ready for a new
    /// connection.
    pub fn abandon(&mut self) -> usize {
        let n = self.queue.len();
        self.queue.clear();
        self.line.clear();
        self.state = State::Line;
        self.failed = None;
        n
    }

    /// One whole line, LF included.
    fn on_line(&mut self, line: &[u8], done: &mut impl FnMut(Completion)) -> Result<(), ProtocolError> {
        let Some(text) = line.strip_suffix(b"\r\n") else {
            return Err(ProtocolError::BareNewline { line: quote(line) });
        };
        let Some(head) = self.queue.front_mut() else {
            return Err(ProtocolError::Unsolicited { line: quote(text) });
        };
        let unexpected = |expect: Expect| ProtocolError::Unexpected { request: expect.name(), line: quote(text) };
        let reply = match (text, &mut head.expect) {
            (b"END", Expect::Get { keys, hits }) => Reply::Get { hits: *hits, misses: *keys - *hits },
            (b"STORED", Expect::Set) => Reply::Set(SetReply::Stored),
            (b"NOT_STORED", Expect::Set) => Reply::Set(SetReply::NotStored),
            (b"EXISTS", Expect::Set) => Reply::Set(SetReply::Exists),
            (b"NOT_FOUND", Expect::Set) => Reply::Set(SetReply::NotFound),
            (b"ERROR", _) => Reply::Error(ReplyError::Error),
            _ if is_error(text, b"CLIENT_ERROR") => Reply::Error(ReplyError::Client),
            _ if is_error(text, b"SERVER_ERROR") => Reply::Error(ReplyError::Server),
            (_, Expect::Get { keys, hits }) if text.starts_with(b"VALUE ") => {
                let declared = value_bytes(text).ok_or_else(|| ProtocolError::BadValue { line: quote(text) })?;
                if declared > u64::from(self.max_value_len) {
                    return Err(ProtocolError::ValueTooLarge { declared, limit: self.max_value_len });
                }
                if *hits == *keys {
                    return Err(ProtocolError::TooManyValues { keys: *keys });
                }
                *hits += 1;
                self.state = State::Data { left: declared + 2 };
                return Ok(());
            }
            (_, expect) => return Err(unexpected(*expect)),
        };
        if let Some(p) = self.queue.pop_front() {
            done(Completion { token: p.token, reply });
        }
        Ok(())
    }
}

/// `ERROR_KIND` alone or followed by a space and a message.
fn is_error(text: &[u8], kind: &[u8]) -> bool {
    text.strip_prefix(kind).is_some_and(|rest| rest.is_empty() || rest[0] == b' ')
}

/// The data length of `VALUE <key> <flags> <bytes> [<cas unique>]`.
fn value_bytes(text: &[u8]) -> Option<u64> {
    let mut fields = text.split(|&b| b == b' ');
    let (_value, key, flags, bytes) = (fields.next()?, fields.next()?, fields.next()?, fields.next()?);
    let cas = fields.next();
    if fields.next().is_some() || key.is_empty() || key.len() > super::workload::KEY_MAX {
        return None;
    }
    parse_decimal(flags).filter(|f| u32::try_from(*f).is_ok())?;
    if let Some(cas) = cas {
        parse_decimal(cas)?;
    }
    parse_decimal(bytes)
}

#[cfg(test)]
mod tests;

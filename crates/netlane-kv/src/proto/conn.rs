//! One client connection's byte stream: bytes in, commands run, replies out.
//!
//! The driver reads into [`Conn::read_space`], reports it with [`Conn::filled`], calls
//! [`Conn::process`], and writes [`Conn::output`] (reporting with [`Conn::written`]).
//!
//! # Bounds (a client controls none of them)
//! - The input buffer holds at most one command line ([`Limits::max_line`], or
//!   [`Limits::max_get_line`] for get lines) plus one data block (the item size limit +
//!   2). A longer line is answered `CLIENT_ERROR line too long` and the connection
//!   closes; a data block over the item limit is answered and skipped as it arrives,
//!   never buffered.
//! - Commands stop being read while the unsent output is over
//!   [`Limits::output_pause`]; a multi-get pauses between keys at that point and resumes
//!   once the client has read. So the output never holds more than the limit plus one
//!   value block.
//! - At most [`Limits::commands_per_turn`] commands run per call, so one pipelining
//!   client cannot starve the others on its worker.
//! - Buffers that grew for a large value shrink back when they empty.

use memchr::memchr;

use super::exec::{self, Ctx, GetProgress};
use super::parse::{self, Command, ParseError};
use super::reply::line;

/// Per-connection bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest command line other than get (memcached: 2048).
    pub max_line: usize,
    /// Longest get/gets/gat/gats line (many keys).
    pub max_get_line: usize,
    /// Stop running commands while this much output is unsent.
    pub output_pause: usize,
    /// Commands run per [`Conn::process`] call.
    pub commands_per_turn: usize,
    /// Free input space offered per read.
    pub read_chunk: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_line: 2048,
            max_get_line: 64 << 10,
            output_pause: 256 << 10,
            commands_per_turn: 64,
            read_chunk: 16 << 10,
        }
    }
}

/// What the driver should do after [`Conn::process`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Everything buffered was run: write the output, then read more.
    NeedRead,
    /// Output is over the pause limit: write it, and call `process` again once it has
    /// drained (do not read meanwhile).
    Blocked,
    /// The turn's command budget ran out with input left: write, and call again after
    /// the other connections had their turn.
    Yield,
    /// Write what is pending (best effort), then close.
    Close,
}

/// The smallest buffers a connection keeps.
const BASE_CAPACITY: usize = 16 << 10;

/// One connection's protocol state.
#[derive(Debug)]
pub struct Conn {
    input: Vec<u8>,
    /// Unconsumed input is `input[start..end]`.
    start: usize,
    end: usize,
    /// Bytes of the current command still to arrive before it can run.
    need: usize,
    /// Bytes of a refused data block still to skip.
    swallow: usize,
    /// A paused multi-get: the key index to continue with.
    resume_get: Option<usize>,
    output: Vec<u8>,
    sent: usize,
    closing: bool,
    limits: Limits,
    item_max: usize,
}

impl Conn {
    /// A connection with these bounds, for values of up to `item_max` bytes.
    pub fn new(limits: Limits, item_max: usize) -> Conn {
        Conn {
            input: Vec::new(),
            start: 0,
            end: 0,
            need: 0,
            swallow: 0,
            resume_get: None,
            output: Vec::new(),
            sent: 0,
            closing: false,
            limits,
            item_max,
        }
    }

    /// Most input ever buffered: a get line, or a line and a whole data block.
    fn input_bound(&self) -> usize {
        self.limits.max_get_line.max(self.limits.max_line + self.item_max + 2)
    }

    /// Free space to read into (empty when nothing should be read now: the output is
    /// paused or the connection is closing).
    pub fn read_space(&mut self) -> &mut [u8] {
        if self.closing || self.resume_get.is_some() || self.unsent() > self.limits.output_pause {
            return &mut [];
        }
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            if self.input.len() > BASE_CAPACITY {
                self.input.truncate(BASE_CAPACITY);
                self.input.shrink_to(BASE_CAPACITY);
            }
        }
        let want = self.need.max(self.end - self.start + self.limits.read_chunk).min(self.input_bound());
        if self.input.len() - self.start < want && self.start > 0 {
            self.input.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.input.len() < want {
            self.input.resize(want, 0);
        }
        let end = self.end;
        &mut self.input[end..]
    }

    /// `n` bytes were read into [`Conn::read_space`].
    pub fn filled(&mut self, n: usize) {
        self.end = (self.end + n).min(self.input.len());
    }

    /// Copies `data` in (UDP, tests); returns how much fitted.
    pub fn feed(&mut self, data: &[u8]) -> usize {
        let mut done = 0;
        while done < data.len() {
            let space = self.read_space();
            if space.is_empty() {
                break;
            }
            let n = space.len().min(data.len() - done);
            space[..n].copy_from_slice(&data[done..done + n]);
            self.filled(n);
            done += n;
        }
        done
    }

    /// Forgets all state and buffered bytes, keeping the buffers (UDP reuses one
    /// connection per worker).
    pub fn reset(&mut self) {
        self.start = 0;
        self.end = 0;
        self.need = 0;
        self.swallow = 0;
        self.resume_get = None;
        self.output.clear();
        self.sent = 0;
        self.closing = false;
    }

    /// Unsent output.
    pub fn output(&self) -> &[u8] {
        &self.output[self.sent..]
    }

    /// `n` bytes of [`Conn::output`] were sent.
    pub fn written(&mut self, n: usize) {
        self.sent = (self.sent + n).min(self.output.len());
        if self.sent == self.output.len() {
            self.sent = 0;
            self.output.clear();
            if self.output.capacity() > 4 * self.limits.output_pause.max(BASE_CAPACITY) {
                self.output.shrink_to(BASE_CAPACITY);
            }
        }
    }

    fn unsent(&self) -> usize {
        self.output.len() - self.sent
    }

    /// Buffer memory held (capacities).
    pub fn memory(&self) -> usize {
        self.input.capacity() + self.output.capacity()
    }

    /// Whether the connection is done (after its output is written).
    pub fn closing(&self) -> bool {
        self.closing
    }

    /// Whether input is waiting to be run (a yielded or paused turn).
    pub fn has_work(&self) -> bool {
        self.resume_get.is_some() || (self.start < self.end && self.need <= self.end - self.start)
    }

    fn error(&mut self, ctx: &mut Ctx<'_>, e: ParseError) {
        ctx.counters.client_errors += 1;
        line(&mut self.output, e.reply.as_bytes());
    }

    /// Runs the buffered commands.
    pub fn process(&mut self, ctx: &mut Ctx<'_>) -> Turn {
        let mut ran = 0;
        loop {
            if self.closing {
                return Turn::Close;
            }
            if self.swallow > 0 {
                let n = self.swallow.min(self.end - self.start);
                self.start += n;
                self.swallow -= n;
                if self.swallow > 0 {
                    return Turn::NeedRead;
                }
            }
            if self.unsent() > self.limits.output_pause {
                return Turn::Blocked;
            }
            if ran == self.limits.commands_per_turn {
                if self.has_work() {
                    ctx.counters.conn_yields += 1;
                    return Turn::Yield;
                }
                return Turn::NeedRead;
            }
            let avail = &self.input[self.start..self.end];
            let Some(nl) = memchr(b'\n', avail) else {
                let limit =
                    if parse::is_long_line_command(avail) { self.limits.max_get_line } else { self.limits.max_line };
                if avail.len() > limit {
                    return self.line_too_long(ctx);
                }
                self.need = avail.len() + 1;
                return Turn::NeedRead;
            };
            let line_end = if nl > 0 && avail[nl - 1] == b'\r' { nl - 1 } else { nl };
            let limit =
                if parse::is_long_line_command(avail) { self.limits.max_get_line } else { self.limits.max_line };
            if nl > limit {
                return self.line_too_long(ctx);
            }
            self.need = 0;
            ran += 1;
            // The line is re-borrowed from the buffer each time; parsing is cheap and
            // borrows nothing that outlives this iteration.
            let (start, end) = (self.start, self.end);
            let input = std::mem::take(&mut self.input);
            let line_bytes = &input[start..start + line_end];
            let consumed = nl + 1;
            let step = self.step(ctx, line_bytes, &input[start + consumed..end]);
            self.input = input;
            match step {
                Step::Done(extra) => self.start += consumed + extra,
                Step::Wait(total) => {
                    self.need = consumed + total;
                    return Turn::NeedRead;
                }
                Step::Paused(i) => {
                    self.resume_get = Some(i);
                    return Turn::Blocked;
                }
                Step::Quit => {
                    self.closing = true;
                    return Turn::Close;
                }
            }
        }
    }

    fn line_too_long(&mut self, ctx: &mut Ctx<'_>) -> Turn {
        ctx.counters.lines_too_long += 1;
        line(&mut self.output, b"CLIENT_ERROR line too long");
        self.closing = true;
        self.start = self.end;
        Turn::Close
    }

    /// Runs one command whose line is `line`; `rest` is the input after its newline.
    fn step(&mut self, ctx: &mut Ctx<'_>, line_bytes: &[u8], rest: &[u8]) -> Step {
        let cmd = match parse::parse(line_bytes) {
            Ok(c) => c,
            Err(e) => {
                self.error(ctx, e);
                return self.skip(e.swallow, rest);
            }
        };
        match cmd {
            Command::Get { keys, cas, touch } => {
                let skip = self.resume_get.take().unwrap_or(0);
                let pause_at = self.sent + self.limits.output_pause;
                let mark = self.output.len();
                match exec::get(ctx, keys, cas, touch, skip, &mut self.output, pause_at) {
                    Ok(GetProgress::Done) => Step::Done(0),
                    Ok(GetProgress::Paused(i)) => Step::Paused(i),
                    Err(e) => {
                        self.output.truncate(mark);
                        self.error(ctx, e);
                        Step::Done(0)
                    }
                }
            }
            Command::Store { len, noreply, mode, key, flags, exptime, cas } => {
                if len > self.item_max {
                    ctx.counters.cmd_set += 1;
                    ctx.counters.store_too_large += 1;
                    if !noreply {
                        line(&mut self.output, b"SERVER_ERROR object too large for cache");
                    }
                    return self.skip(len.checked_add(2), rest);
                }
                let Some(data) = data_block(rest, len) else { return Step::Wait(len + 2) };
                let Ok(data) = data else {
                    ctx.counters.client_errors += 1;
                    line(&mut self.output, b"CLIENT_ERROR bad data chunk");
                    return Step::Done(len + 2);
                };
                let reply = exec::store(ctx, mode, key, flags, exptime, cas, data);
                if !noreply {
                    line(&mut self.output, reply);
                }
                Step::Done(len + 2)
            }
            Command::MetaSet(key, len, flags) => {
                if len > self.item_max {
                    ctx.counters.cmd_meta += 1;
                    ctx.counters.store_too_large += 1;
                    line(&mut self.output, b"SERVER_ERROR object too large for cache");
                    return self.skip(len.checked_add(2), rest);
                }
                let Some(data) = data_block(rest, len) else { return Step::Wait(len + 2) };
                let Ok(data) = data else {
                    ctx.counters.client_errors += 1;
                    line(&mut self.output, b"CLIENT_ERROR bad data chunk");
                    return Step::Done(len + 2);
                };
                exec::meta_set(ctx, &key, &flags, data, &mut self.output);
                Step::Done(len + 2)
            }
            Command::Quit => Step::Quit,
            other => {
                let mark = self.output.len();
                if !exec::simple(ctx, other, &mut self.output) {
                    self.output.truncate(mark);
                }
                Step::Done(0)
            }
        }
    }

    /// Skips a refused data block: what is buffered now, the rest as it arrives.
    fn skip(&mut self, swallow: Option<usize>, rest: &[u8]) -> Step {
        let Some(n) = swallow else { return Step::Done(0) };
        let now = n.min(rest.len());
        self.swallow = n - now;
        Step::Done(now)
    }
}

/// A data block of `len` bytes and its CRLF at the start of `rest`: `None` until it has
/// all arrived; `Err` if it does not end in CRLF.
fn data_block(rest: &[u8], len: usize) -> Option<Result<&[u8], ()>> {
    let total = len.checked_add(2)?;
    if rest.len() < total {
        return None;
    }
    if &rest[len..total] != b"\r\n" {
        return Some(Err(()));
    }
    Some(Ok(&rest[..len]))
}

enum Step {
    /// Ran; consume the line and this many more bytes.
    Done(usize),
    /// Needs this many bytes after the line before it can run.
    Wait(usize),
    /// A multi-get paused at this key.
    Paused(usize),
    /// quit.
    Quit,
}

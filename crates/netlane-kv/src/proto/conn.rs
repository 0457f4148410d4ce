//! One client connection's byte stream: bytes in, commands run, replies out.
//!
//! The driver reads into [`Conn::read_space`], reports it with [`Conn::filled`], calls
//! [`Conn::process`], and writes [`Conn::poll_output`] (reporting with [`Conn::handle_written`]).
//!
//! # Bounds (a client controls none of them)
//! - The input buffer holds at most one command line ([`Limits::max_line`]) plus one
//!   data block (the item size limit + 2). A longer line is answered
//!   `CLIENT_ERROR line too long` and the connection closes; a data block over the item
//!   limit is answered and skipped as it arrives, never buffered.
//! - A get line may be any length, as in memcached: its keys are answered as they
//!   arrive, and only the key being read is buffered.
//! - Commands stop being read while the unsent output is over
//!   [`Limits::output_pause`]; a multi-get pauses between keys at that point and resumes
//!   once the client has read. So the output never holds more than the limit plus one
//!   value block.
//! - At most [`Limits::commands_per_turn`] commands run per call, so one pipelining
//!   client cannot starve the others on its worker.
//! - Buffers that grew for a large value shrink back when they empty.

use std::sync::Arc;

use memchr::memchr;

use super::binary::{self, Check};
use super::budget::ConnMemory;
use super::exec::{self, After, Ctx, Protocol};
use super::out::Out;
use super::parse::{self, Command, GetHead, ParseError};
use super::reply::line;
use crate::store::{KEY_MAX, StoreError};

/// Per-connection bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest command line other than get, CRLF not counted (memcached: 2048).
    pub max_line: usize,
    /// Stop running commands while this much output is unsent.
    pub output_pause: usize,
    /// Commands run per [`Conn::process`] call.
    pub commands_per_turn: usize,
    /// Free input space offered per read.
    pub read_chunk: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_line: 2048, output_pause: 256 << 10, commands_per_turn: 64, read_chunk: 16 << 10 }
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

/// A get command being answered, its keys read from the input as they come.
#[derive(Debug, Clone, Copy)]
struct GetRun {
    cas: bool,
    /// gat's new deadline.
    touch: Option<u64>,
    /// The line had not all arrived when the get began: keys are checked one by one
    /// (a complete line is checked whole first, as memcached does).
    streaming: bool,
}

/// The protocol a connection speaks, told by its first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wire {
    Text,
    Binary,
}

/// One connection's protocol state.
#[derive(Debug)]
pub struct Conn {
    /// Unknown until the first byte arrives.
    wire: Option<Wire>,
    input: Vec<u8>,
    /// Unconsumed input is `input[start..end]`.
    start: usize,
    end: usize,
    /// Bytes of input (from `start`) needed before the current command can go on.
    need: usize,
    /// Bytes of a refused data block still to skip.
    swallow: usize,
    /// The rest of the current line is dropped (up to its newline).
    skip_line: bool,
    /// A get being answered.
    get: Option<GetRun>,
    output: Out,
    closing: bool,
    limits: Limits,
    item_max: usize,
    /// The server's budget for connection memory, and what this connection holds of it.
    budget: Option<Arc<ConnMemory>>,
    charged: u64,
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(b) = &self.budget {
            b.give(self.charged);
        }
    }
}

/// How far a get got.
enum GetStep {
    /// The line ended: END written.
    Done,
    /// The output reached the pause limit.
    Paused,
    /// The next key has not all arrived.
    NeedInput,
}

impl Conn {
    /// A connection with these bounds, for values of up to `item_max` bytes.
    pub fn new(limits: Limits, item_max: usize) -> Conn {
        Conn {
            wire: None,
            input: Vec::new(),
            start: 0,
            end: 0,
            need: 0,
            swallow: 0,
            skip_line: false,
            get: None,
            output: Out::new(),
            closing: false,
            limits,
            item_max,
            budget: None,
            charged: 0,
        }
    }

    /// Its buffers beyond the base ones are charged to `budget`.
    pub fn with_budget(mut self, budget: Arc<ConnMemory>) -> Conn {
        self.budget = Some(budget);
        self
    }

    /// Input buffered without a charge: a line, its CR and LF, and a read's worth.
    fn free_input(&self) -> usize {
        BASE_CAPACITY.max(self.limits.max_line + 2 + self.limits.read_chunk)
    }

    /// Sets this connection's charge for an input buffer of `input` bytes and its output
    /// buffer as it is; false, and nothing changed, when the budget cannot cover it.
    fn charge_for(&mut self, input: usize) -> bool {
        let Some(b) = &self.budget else { return true };
        let want = (input.saturating_sub(self.free_input()) + self.output.len().saturating_sub(BASE_CAPACITY)) as u64;
        if want > self.charged {
            if !b.take(want - self.charged) {
                return false;
            }
        } else {
            b.give(self.charged - want);
        }
        self.charged = want;
        true
    }

    /// Most input ever buffered: a line and a whole data block, or a binary packet's
    /// header, extras, key and value.
    fn input_bound(&self) -> usize {
        (self.limits.max_line + 2).max(binary::HEADER + 255 + KEY_MAX) + self.item_max + 2
    }

    /// Free space to read into (empty when nothing should be read now: the output is
    /// paused or the connection is closing).
    pub fn read_space(&mut self) -> &mut [u8] {
        if self.closing || self.unsent() > self.limits.output_pause {
            return &mut [];
        }
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            if self.input.len() > BASE_CAPACITY {
                self.input.truncate(BASE_CAPACITY);
                self.input.shrink_to(BASE_CAPACITY);
                self.charge_for(BASE_CAPACITY);
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
    pub fn handle_input(&mut self, data: &[u8]) -> usize {
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
        self.wire = None;
        self.start = 0;
        self.end = 0;
        self.need = 0;
        self.swallow = 0;
        self.skip_line = false;
        self.get = None;
        self.output.clear();
        self.closing = false;
    }

    /// Fills `dst` with the unsent output's first slices, to write in order; returns how
    /// many.
    pub fn poll_output<'a>(&'a self, dst: &mut [std::io::IoSlice<'a>]) -> usize {
        self.output.slices(dst)
    }

    /// The unsent output copied out (UDP datagrams, tests).
    pub fn poll_output_vec(&self) -> Vec<u8> {
        self.output.to_vec()
    }

    /// `n` bytes of the output were sent.
    pub fn handle_written(&mut self, n: usize) {
        self.output.written(n);
        if self.output.unsent() == 0 && self.output.capacity() > 4 * self.limits.output_pause.max(BASE_CAPACITY) {
            self.output.shrink(BASE_CAPACITY);
        }
        if self.charged > 0 {
            self.charge_for(self.input.len());
        }
    }

    /// Bytes of output not yet sent.
    pub fn unsent(&self) -> usize {
        self.output.unsent()
    }

    /// Buffer memory held (capacities; values sent by reference belong to the store).
    pub fn memory(&self) -> usize {
        self.input.capacity() + self.output.capacity()
    }

    /// Whether the connection is done (after its output is written).
    pub fn closing(&self) -> bool {
        self.closing
    }

    /// Drops the unsent output and queues `reply` instead (UDP: a reply that cannot be
    /// sent whole).
    pub fn replace_output(&mut self, reply: &[u8]) {
        self.output.clear();
        self.output.extend_from_slice(reply);
    }

    /// Whether input is waiting to be run (a yielded or paused turn).
    pub fn has_work(&self) -> bool {
        self.start < self.end && self.need <= self.end - self.start
    }

    fn reply_error(&mut self, ctx: &mut Ctx<'_>, e: ParseError) {
        ctx.counters.client_errors += 1;
        if !e.silent {
            line(&mut self.output, e.reply.as_bytes());
        }
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
            if self.skip_line {
                match memchr(b'\n', &self.input[self.start..self.end]) {
                    Some(nl) => {
                        self.start += nl + 1;
                        self.skip_line = false;
                    }
                    None => {
                        self.start = self.end;
                        return Turn::NeedRead;
                    }
                }
            }
            if self.unsent() > self.limits.output_pause || !self.output_charged() {
                return Turn::Blocked;
            }
            if let Some(run) = self.get {
                match self.run_get(ctx, run) {
                    GetStep::Done => self.get = None,
                    GetStep::Paused => return Turn::Blocked,
                    GetStep::NeedInput => return Turn::NeedRead,
                }
                continue;
            }
            if ran == self.limits.commands_per_turn {
                if self.has_work() {
                    ctx.counters.conn_yields += 1;
                    return Turn::Yield;
                }
                return Turn::NeedRead;
            }
            let avail = &self.input[self.start..self.end];
            if avail.is_empty() {
                self.need = 0;
                return Turn::NeedRead;
            }
            let wire = match self.wire {
                Some(w) => w,
                None => {
                    // memcached's negotiation: a binary request starts with 0x80.
                    let binary = avail[0] == binary::REQUEST;
                    let w = match ctx.settings.protocol {
                        Protocol::Auto if binary => Wire::Binary,
                        Protocol::Auto | Protocol::Ascii => Wire::Text,
                        Protocol::Binary => Wire::Binary,
                    };
                    self.wire = Some(w);
                    w
                }
            };
            if wire == Wire::Binary {
                match self.binary_step(ctx) {
                    Some(turn) => return turn,
                    None => {
                        ran += 1;
                        continue;
                    }
                }
            }
            let avail = &self.input[self.start..self.end];
            let Some(nl) = memchr(b'\n', avail) else {
                if avail.len() > self.limits.max_line && parse::is_get_line(avail) {
                    // A get line longer than any line limit: answer its keys as they come.
                    match parse::get_head(avail, false) {
                        Ok(Some(head)) => {
                            ran += 1;
                            self.begin_get(ctx, head, true);
                            continue;
                        }
                        Ok(None) => {}
                        Err(e) => {
                            self.reply_error(ctx, e);
                            self.skip_line = true;
                            continue;
                        }
                    }
                }
                // The line and its CR may be up to max_line + 1 bytes before the LF.
                if avail.len() > self.limits.max_line + 1 {
                    return self.line_too_long(ctx);
                }
                self.need = avail.len() + 1;
                return Turn::NeedRead;
            };
            let line_end = if nl > 0 && avail[nl - 1] == b'\r' { nl - 1 } else { nl };
            self.need = 0;
            ran += 1;
            match parse::get_head(&avail[..line_end], true) {
                Ok(Some(head)) => {
                    // The whole line is here: refuse it whole if a key is too long.
                    let keys = &avail[head.keys_at..line_end];
                    let keys = &keys[..memchr(0, keys).unwrap_or(keys.len())];
                    if keys.split(|&b| b == b' ').any(|k| k.len() > KEY_MAX) {
                        self.start += nl + 1;
                        self.reply_error(ctx, parse::BAD_FORMAT);
                        continue;
                    }
                    self.begin_get(ctx, head, false);
                    continue;
                }
                Ok(None) => {}
                Err(e) => {
                    self.start += nl + 1;
                    self.reply_error(ctx, e);
                    continue;
                }
            }
            if line_end > self.limits.max_line {
                return self.line_too_long(ctx);
            }
            // The line is re-borrowed from the buffer each time; parsing is cheap and
            // borrows nothing that outlives this iteration.
            let (start, end) = (self.start, self.end);
            let input = std::mem::take(&mut self.input);
            let consumed = nl + 1;
            let step = self.step(ctx, &input[start..start + line_end], consumed, &input[start + consumed..end]);
            self.input = input;
            match step {
                Step::Done(extra) => self.start += consumed + extra,
                Step::Wait(total) => {
                    self.need = consumed + total;
                    return Turn::NeedRead;
                }
                Step::Close => {
                    self.start += consumed;
                    self.closing = true;
                    return Turn::Close;
                }
            }
        }
    }

    /// One binary packet: run it if it has arrived (`None`: go on), or say what the
    /// driver should do. The value of a storage command is buffered whole (it is at
    /// most the item size limit); any other body past the key is skipped as it comes.
    fn binary_step(&mut self, ctx: &mut Ctx<'_>) -> Option<Turn> {
        let avail = &self.input[self.start..self.end];
        let Some(h) = binary::Header::parse(avail) else {
            self.need = binary::HEADER;
            return Some(Turn::NeedRead);
        };
        let head = binary::HEADER + usize::from(h.extlen) + usize::from(h.keylen);
        let storage = h.is_storage();
        match binary::check(&h, self.item_max) {
            Check::Close => {
                self.closing = true;
                Some(Turn::Close)
            }
            Check::Fatal(s) => {
                binary::refuse(ctx, &h, None, Check::Fatal(s), &mut self.output);
                self.closing = true;
                Some(Turn::Close)
            }
            Check::Refuse(s) => {
                binary::refuse(ctx, &h, None, Check::Refuse(s), &mut self.output);
                self.start += binary::HEADER;
                self.swallow = h.bodylen as usize;
                self.need = 0;
                None
            }
            c @ (Check::TooLarge | Check::NoMemory) => {
                if avail.len() < head {
                    self.need = head;
                    return Some(Turn::NeedRead);
                }
                let key_at = self.start + binary::HEADER + usize::from(h.extlen);
                let (start, input) = (self.start, std::mem::take(&mut self.input));
                binary::refuse(ctx, &h, Some(&input[key_at..start + head]), c, &mut self.output);
                self.input = input;
                self.start += head;
                self.swallow = h.value_len();
                self.need = 0;
                None
            }
            Check::Run => {
                let wanted = if storage { binary::HEADER + h.bodylen as usize } else { head };
                let have = avail.len();
                if have < wanted {
                    if storage && have >= head && !self.room_for_value(wanted) {
                        // No memory for the value: refused as memcached refuses it.
                        let key_at = self.start + binary::HEADER + usize::from(h.extlen);
                        let (start, input) = (self.start, std::mem::take(&mut self.input));
                        binary::refuse(ctx, &h, Some(&input[key_at..start + head]), Check::NoMemory, &mut self.output);
                        self.input = input;
                        self.start += head;
                        self.swallow = h.value_len();
                        self.need = 0;
                        return None;
                    }
                    // A value's room is charged once its key has arrived.
                    self.need = if storage && have < head { head } else { wanted };
                    return Some(Turn::NeedRead);
                }
                self.need = 0;
                let (start, input) = (self.start, std::mem::take(&mut self.input));
                let after = binary::run(ctx, &h, &input[start + binary::HEADER..start + wanted], &mut self.output);
                self.input = input;
                self.start += wanted;
                if !storage {
                    self.swallow = h.value_len();
                }
                if after == After::Close {
                    self.closing = true;
                    return Some(Turn::Close);
                }
                None
            }
        }
    }

    /// Whether the output buffer beyond its base is charged to the budget (charging it
    /// now if it can): a connection whose replies cannot get memory stops until its
    /// client has read.
    fn output_charged(&mut self) -> bool {
        if self.output.len() <= BASE_CAPACITY || self.charge_for(self.input.len()) {
            return true;
        }
        if let Some(b) = &self.budget {
            b.paused_reply();
        }
        false
    }

    /// Makes room for a value: the input buffer will hold `bytes` from the current
    /// command's start. False when the budget cannot cover it.
    fn room_for_value(&mut self, bytes: usize) -> bool {
        let want = bytes.min(self.input_bound());
        if self.charge_for(want.max(self.input.len())) {
            return true;
        }
        if let Some(b) = &self.budget {
            b.refused_value();
        }
        false
    }

    fn line_too_long(&mut self, ctx: &mut Ctx<'_>) -> Turn {
        ctx.counters.lines_too_long += 1;
        line(&mut self.output, b"CLIENT_ERROR line too long");
        self.closing = true;
        self.start = self.end;
        Turn::Close
    }

    /// Starts answering a get whose head is at `start`.
    fn begin_get(&mut self, ctx: &Ctx<'_>, head: GetHead, streaming: bool) {
        self.start += head.keys_at;
        let touch = head.touch.map(|t| ctx.clock.deadline(i64::from(t)));
        self.get = Some(GetRun { cas: head.cas, touch, streaming });
    }

    /// Answers the keys of a get that have arrived, up to the end of its line or the
    /// output pause.
    fn run_get(&mut self, ctx: &mut Ctx<'_>, run: GetRun) -> GetStep {
        loop {
            if self.unsent() > self.limits.output_pause {
                return GetStep::Paused;
            }
            let avail = &self.input[self.start..self.end];
            let spaces = avail.iter().take_while(|&&b| b == b' ').count();
            self.start += spaces;
            let avail = &avail[spaces..];
            match avail {
                [] | [b'\r'] => {
                    self.need = avail.len() + 1;
                    return GetStep::NeedInput;
                }
                [b'\n', ..] | [b'\r', b'\n', ..] => {
                    self.start += if avail[0] == b'\n' { 1 } else { 2 };
                    self.output.extend_from_slice(b"END\r\n");
                    return GetStep::Done;
                }
                // memcached reads a line as a C string: a NUL byte ends its keys.
                [0, ..] => {
                    self.output.extend_from_slice(b"END\r\n");
                    self.skip_line = true;
                    return GetStep::Done;
                }
                _ => {}
            }
            // The key ends at a space, a NUL, a LF, or a CR that a LF follows.
            let mut end = None;
            for (i, &b) in avail.iter().enumerate() {
                match b {
                    b' ' | b'\n' | 0 => {
                        end = Some(i);
                        break;
                    }
                    b'\r' if avail.get(i + 1) == Some(&b'\n') => {
                        end = Some(i);
                        break;
                    }
                    b'\r' if i + 1 == avail.len() => break,
                    _ => {}
                }
            }
            let Some(end) = end.filter(|&e| e <= KEY_MAX) else {
                if avail.len() > KEY_MAX {
                    // Only a streamed line gets here (a whole line was checked first):
                    // what was answered stays answered; the rest of the line is dropped.
                    debug_assert!(run.streaming);
                    self.reply_error(ctx, parse::BAD_FORMAT);
                    self.skip_line = true;
                    return GetStep::Done;
                }
                self.need = avail.len() + 1;
                return GetStep::NeedInput;
            };
            let (start, stop) = (self.start, self.start + end);
            let input = std::mem::take(&mut self.input);
            exec::get_key(ctx, &input[start..stop], run.cas, run.touch, &mut self.output);
            self.input = input;
            self.start = stop;
        }
    }

    /// Runs one command whose line is `line`; `rest` is the input after its newline,
    /// `head` the line's length with its newline.
    fn step(&mut self, ctx: &mut Ctx<'_>, line_bytes: &[u8], head: usize, rest: &[u8]) -> Step {
        let allowed = ctx.settings.allowed;
        let cmd = match parse::parse(line_bytes, allowed) {
            Ok(c) => c,
            Err(e) if e.close => return Step::Close,
            Err(e) => {
                self.reply_error(ctx, e);
                return self.skip(e.swallow, rest);
            }
        };
        match cmd {
            Command::Store { len, noreply, mode, key, flags, exptime, cas } => {
                if len > self.item_max {
                    // Refused before its data arrives: a set also drops the key's value.
                    let reply = exec::refuse_store(ctx, key, mode == parse::StoreMode::Set, StoreError::TooLarge);
                    if !noreply {
                        line(&mut self.output, reply);
                    }
                    return self.skip(len.checked_add(2), rest);
                }
                let Some(data) = data_block(rest, len) else {
                    if !self.room_for_value(head + len + 2) {
                        // No memory for the value: refused as memcached refuses it.
                        let reply =
                            exec::refuse_store(ctx, key, mode == parse::StoreMode::Set, StoreError::OutOfMemory);
                        if !noreply {
                            line(&mut self.output, reply);
                        }
                        return self.skip(len.checked_add(2), rest);
                    }
                    return Step::Wait(len + 2);
                };
                let reply = match data {
                    Ok(data) => exec::store(ctx, mode, key, flags, exptime, cas, data),
                    Err(()) => {
                        ctx.counters.client_errors += 1;
                        b"CLIENT_ERROR bad data chunk"
                    }
                };
                if !noreply {
                    line(&mut self.output, reply);
                }
                Step::Done(len + 2)
            }
            Command::MetaSet(key, len, flags) => {
                if len > self.item_max {
                    ctx.counters.cmd_meta += 1;
                    let reply = exec::refuse_store(ctx, key.bytes(), true, StoreError::TooLarge);
                    line(&mut self.output, reply);
                    return self.skip(len.checked_add(2), rest);
                }
                let Some(data) = data_block(rest, len) else {
                    if !self.room_for_value(head + len + 2) {
                        ctx.counters.cmd_meta += 1;
                        let reply = exec::refuse_store(ctx, key.bytes(), true, StoreError::OutOfMemory);
                        line(&mut self.output, reply);
                        return self.skip(len.checked_add(2), rest);
                    }
                    return Step::Wait(len + 2);
                };
                match data {
                    Ok(data) => {
                        let mark = self.output.mark();
                        if super::meta::set(ctx, &key, &flags, data, &mut self.output) {
                            self.output.truncate(mark);
                        }
                    }
                    // ms always reports a bad data block, q or not.
                    Err(()) => {
                        ctx.counters.client_errors += 1;
                        line(&mut self.output, b"CLIENT_ERROR bad data chunk");
                    }
                }
                Step::Done(len + 2)
            }
            other => match exec::simple(ctx, other, &mut self.output) {
                After::Continue => Step::Done(0),
                After::Close => Step::Close,
            },
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
    /// Close once the replies so far are out (quit, shutdown, an HTTP request line).
    Close,
}

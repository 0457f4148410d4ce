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
//!
//! This file holds the connection's buffers, their bounds and the loop that runs its
//! commands; text lines and their data blocks are in `text.rs`, get commands answered
//! key by key in `get.rs`, binary packets in `packet.rs`.

mod get;
mod packet;
mod text;

use std::sync::Arc;

use memchr::memchr;

use super::binary;
use super::budget::ConnMemory;
use super::exec::{Ctx, Protocol};
use super::out::Out;
use super::parse::ParseError;
use super::reply::line;
use crate::store::KEY_MAX;
use get::{GetRun, GetStep};

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
            if let Some(turn) = self.drop_refused() {
                return turn;
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
            let Some(&first) = self.input[self.start..self.end].first() else {
                self.need = 0;
                return Turn::NeedRead;
            };
            let progress = match self.wire(ctx, first) {
                Wire::Binary => self.binary_step(ctx),
                Wire::Text => self.text_step(ctx),
            };
            match progress {
                Progress::Ran => ran += 1,
                Progress::Skipped => {}
                Progress::Stop(turn) => return turn,
            }
        }
    }

    /// Drops what an earlier command refused, as far as it has arrived: the rest of a
    /// data block or packet body, then the rest of a line. `Some(NeedRead)` while more
    /// of it is still to come.
    fn drop_refused(&mut self) -> Option<Turn> {
        if self.swallow > 0 {
            let n = self.swallow.min(self.end - self.start);
            self.start += n;
            self.swallow -= n;
            if self.swallow > 0 {
                return Some(Turn::NeedRead);
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
                    return Some(Turn::NeedRead);
                }
            }
        }
        None
    }

    /// The protocol the connection speaks, told by `first`, its first byte, and kept.
    fn wire(&mut self, ctx: &Ctx<'_>, first: u8) -> Wire {
        match self.wire {
            Some(w) => w,
            None => {
                // memcached's negotiation: a binary request starts with 0x80.
                let binary = first == binary::REQUEST;
                let w = match ctx.settings.protocol {
                    Protocol::Auto if binary => Wire::Binary,
                    Protocol::Auto | Protocol::Ascii => Wire::Text,
                    Protocol::Binary => Wire::Binary,
                };
                self.wire = Some(w);
                w
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
}

/// What one step of [`Conn::process`]'s loop did.
enum Progress {
    /// A command ran (or was refused): it counts against the turn's budget.
    Ran,
    /// Input was dropped without a command to count (a streamed get line refused).
    Skipped,
    /// The turn ends: the driver does this.
    Stop(Turn),
}

//! Text (and meta) command lines on a connection: a line run once it has arrived, a
//! get line begun as soon as its head is known, a storage command's data block waited
//! for, and a refused one skipped as it arrives.

use memchr::memchr;

use super::{Conn, Progress, Turn};
use crate::proto::exec::{self, After, Ctx};
use crate::proto::parse::{self, Command};
use crate::proto::reply::line;
use crate::store::{KEY_MAX, StoreError};

impl Conn {
    /// One text command: run it if its line has arrived, or begin a get, or say what the
    /// driver should do.
    pub(super) fn text_step(&mut self, ctx: &mut Ctx<'_>) -> Progress {
        let avail = &self.input[self.start..self.end];
        let Some(nl) = memchr(b'\n', avail) else {
            return self.partial_line(ctx);
        };
        let line_end = if nl > 0 && avail[nl - 1] == b'\r' { nl - 1 } else { nl };
        self.need = 0;
        match parse::get_head(&avail[..line_end], true) {
            Ok(Some(head)) => {
                // The whole line is here: refuse it whole if a key is too long.
                let keys = &avail[head.keys_at..line_end];
                let keys = &keys[..memchr(0, keys).unwrap_or(keys.len())];
                if keys.split(|&b| b == b' ').any(|k| k.len() > KEY_MAX) {
                    self.start += nl + 1;
                    self.reply_error(ctx, parse::BAD_FORMAT);
                    return Progress::Ran;
                }
                self.begin_get(ctx, head, false);
                return Progress::Ran;
            }
            Ok(None) => {}
            Err(e) => {
                self.start += nl + 1;
                self.reply_error(ctx, e);
                return Progress::Ran;
            }
        }
        if line_end > self.limits.max_line {
            return Progress::Stop(self.line_too_long(ctx));
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
                return Progress::Stop(Turn::NeedRead);
            }
            Step::Close => {
                self.start += consumed;
                self.closing = true;
                return Progress::Stop(Turn::Close);
            }
        }
        Progress::Ran
    }

    /// A line whose newline has not arrived: a get line past the line limit is begun
    /// (its keys are answered as they come); any other line waits for the rest, up to
    /// the limit.
    fn partial_line(&mut self, ctx: &mut Ctx<'_>) -> Progress {
        let avail = &self.input[self.start..self.end];
        if avail.len() > self.limits.max_line && parse::is_get_line(avail) {
            // A get line longer than any line limit: answer its keys as they come.
            match parse::get_head(avail, false) {
                Ok(Some(head)) => {
                    self.begin_get(ctx, head, true);
                    return Progress::Ran;
                }
                Ok(None) => {}
                Err(e) => {
                    self.reply_error(ctx, e);
                    self.skip_line = true;
                    return Progress::Skipped;
                }
            }
        }
        // The line and its CR may be up to max_line + 1 bytes before the LF.
        if avail.len() > self.limits.max_line + 1 {
            return Progress::Stop(self.line_too_long(ctx));
        }
        self.need = avail.len() + 1;
        Progress::Stop(Turn::NeedRead)
    }

    fn line_too_long(&mut self, ctx: &mut Ctx<'_>) -> Turn {
        ctx.counters.lines_too_long += 1;
        line(&mut self.output, b"CLIENT_ERROR line too long");
        self.closing = true;
        self.start = self.end;
        Turn::Close
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
                        if crate::proto::meta::set(ctx, &key, &flags, data, &mut self.output) {
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

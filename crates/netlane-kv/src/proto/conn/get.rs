//! A get command answered key by key: its keys are read from the input as they arrive,
//! so a get line may be any length, and the answer pauses between keys while the output
//! is over its limit.

use super::Conn;
use crate::proto::exec::{self, Ctx};
use crate::proto::parse::{self, GetHead};
use crate::store::KEY_MAX;

/// A get command being answered, its keys read from the input as they come.
#[derive(Debug, Clone, Copy)]
pub(super) struct GetRun {
    cas: bool,
    /// gat's new deadline.
    touch: Option<u64>,
    /// The line had not all arrived when the get began: keys are checked one by one
    /// (a complete line is checked whole first, as memcached does).
    streaming: bool,
}

/// How far a get got.
pub(super) enum GetStep {
    /// The line ended: END written.
    Done,
    /// The output reached the pause limit.
    Paused,
    /// The next key has not all arrived.
    NeedInput,
}

impl Conn {
    /// Starts answering a get whose head is at `start`.
    pub(super) fn begin_get(&mut self, ctx: &Ctx<'_>, head: GetHead, streaming: bool) {
        self.start += head.keys_at;
        let touch = head.touch.map(|t| ctx.clock.deadline(i64::from(t)));
        self.get = Some(GetRun { cas: head.cas, touch, streaming });
    }

    /// Answers the keys of a get that have arrived, up to the end of its line or the
    /// output pause.
    pub(super) fn run_get(&mut self, ctx: &mut Ctx<'_>, run: GetRun) -> GetStep {
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
}

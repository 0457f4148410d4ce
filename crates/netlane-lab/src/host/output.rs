//! A role's output: its pipes read to their end on threads of their own, in bounded
//! lines, the ready line picked out, a supervisor's sample lines taken out.

use std::io::{BufRead, BufReader, Read};
use std::sync::mpsc;
use std::time::Duration;

use super::process::LineHook;
use super::sample::{RoleSample, Samples};

/// Where a reader sends the ready line: the first line, or (`scan`) the first line that
/// begins with `prefix`.
pub(super) struct First {
    pub(super) tx: mpsc::Sender<String>,
    pub(super) prefix: String,
}

/// Reads `r` to its end on a thread of its own (so the process never blocks on a full
/// pipe): the ready line to `first` when given (with `scan`, the lines before it are
/// output too), every other line to `hook`; the lines after the ready line come through
/// the returned channel at the end (the last [`KEPT_BYTES`] of them); with `samples`, a
/// supervisor's sample lines go there instead.
pub(super) fn read_lines(
    r: impl Read + Send + 'static,
    first: Option<First>,
    scan: bool,
    hook: Option<LineHook>,
    samples: Option<Samples>,
) -> mpsc::Receiver<Vec<String>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = bounded_lines(r);
        let mut before = std::collections::VecDeque::new();
        let mut before_bytes = 0usize;
        if let Some(first) = first {
            let line = if scan {
                // Lines before the ready line (warnings) are output like any other;
                // the last one stands for the ready line a process that ended never wrote.
                let found = lines.by_ref().find(|l| {
                    let ready = l.starts_with(first.prefix.as_str());
                    if !ready {
                        before_bytes += l.len() + 1;
                        before.push_back(l.clone());
                        while before_bytes > KEPT_BYTES {
                            before_bytes -= before.pop_front().map_or(0, |d: String| d.len() + 1);
                        }
                    }
                    ready
                });
                found.or_else(|| before.back().cloned())
            } else {
                lines.next()
            };
            let _ = first.tx.send(line.unwrap_or_default());
        }
        // The last KEPT_BYTES of it (a long-running server's log is not held whole; its
        // final report is at the end).
        let (mut kept, mut bytes) = (std::collections::VecDeque::new(), 0usize);
        for mut l in before.into_iter().chain(lines) {
            if let Some((sample, rest)) = samples.as_ref().and_then(|_| RoleSample::parse(&l)) {
                let rest = rest.to_string();
                samples.iter().for_each(|s| s.push(sample));
                if rest.is_empty() {
                    continue;
                }
                l = rest;
            }
            if let Some(h) = &hook {
                h(&l);
            }
            bytes += l.len() + 1;
            kept.push_back(l);
            while bytes > KEPT_BYTES {
                bytes -= kept.pop_front().map_or(0, |d: String| d.len() + 1);
            }
        }
        let _ = tx.send(Vec::from(kept));
    });
    rx
}

/// The lines of `r`, each at most [`MAX_LINE`] bytes (the rest of a longer one is
/// dropped), bytes that are not UTF-8 replaced: whatever a process writes, its pipe is
/// read to its end and memory stays bounded.
pub(super) fn bounded_lines(r: impl Read) -> impl Iterator<Item = String> {
    let mut r = BufReader::new(r);
    std::iter::from_fn(move || {
        let mut line = Vec::new();
        let n = (&mut r).take(MAX_LINE as u64).read_until(b'\n', &mut line).ok()?;
        if n == 0 {
            return None;
        }
        if line.last() != Some(&b'\n') && line.len() >= MAX_LINE {
            let mut rest = Vec::new();
            loop {
                rest.clear();
                let k = (&mut r).take(64 << 10).read_until(b'\n', &mut rest).ok()?;
                if k == 0 || rest.last() == Some(&b'\n') {
                    break;
                }
            }
        }
        if line.last() == Some(&b'\n') {
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
        }
        Some(String::from_utf8_lossy(&line).into_owned())
    })
}

/// The longest line of a role's output that is kept whole.
pub(super) const MAX_LINE: usize = 4 << 20;

/// The lines read from a pipe of a process that has ended. A process it started may
/// still hold the pipe open: after [`PIPE_GRACE`] what was read is given up on (the
/// reader ends with the pipe).
pub(super) fn join_lines(rx: Option<mpsc::Receiver<Vec<String>>>, killed: bool) -> String {
    // A killed process's output is only for the error message: not worth a long wait.
    let grace = if killed { KILLED_PIPE_GRACE } else { PIPE_GRACE };
    rx.and_then(|rx| rx.recv_timeout(grace).ok()).map(|l| l.join("\n")).unwrap_or_default()
}

/// How long the output of an ended process may take to reach its end.
const PIPE_GRACE: Duration = Duration::from_secs(10);

/// The same for a process that had to be killed.
const KILLED_PIPE_GRACE: Duration = Duration::from_secs(1);

/// How much of a role's output is kept, from its end.
pub(super) const KEPT_BYTES: usize = 16 << 20;

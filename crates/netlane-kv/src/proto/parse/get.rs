//! The head of a get command (get, gets, gat, gats, bget): which one, gat's expiry, and
//! where its keys start; the connection reads the keys themselves as they arrive.

use super::tokens::i32_arg;
use super::{BAD_EXPTIME, ParseError, UNKNOWN};

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

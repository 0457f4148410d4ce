//! Writing replies: numbers without the formatting machinery, memcached's fixed lines,
//! and `STAT` lines.

/// Appends `v` in decimal.
pub fn push_u64(out: &mut Vec<u8>, mut v: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

/// Appends `v` in decimal, with a minus sign when negative.
pub fn push_i64(out: &mut Vec<u8>, v: i64) {
    if v < 0 {
        out.push(b'-');
    }
    push_u64(out, v.unsigned_abs());
}

/// Appends `line` and CRLF.
pub fn line(out: &mut Vec<u8>, line: &[u8]) {
    out.extend_from_slice(line);
    out.extend_from_slice(b"\r\n");
}

/// The `STAT name value` lines of a `stats` reply, ended by [`StatsWriter::end`].
#[derive(Debug)]
pub struct StatsWriter<'a> {
    out: &'a mut Vec<u8>,
}

impl<'a> StatsWriter<'a> {
    /// Writes into `out`.
    pub fn new(out: &'a mut Vec<u8>) -> Self {
        StatsWriter { out }
    }

    /// `STAT name value` with a number.
    pub fn num(&mut self, name: &str, v: u64) -> &mut Self {
        self.out.extend_from_slice(b"STAT ");
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(b' ');
        push_u64(self.out, v);
        self.out.extend_from_slice(b"\r\n");
        self
    }

    /// `STAT name value` with text (spaces and control bytes become `_`: a value is one
    /// token).
    pub fn text(&mut self, name: &str, v: &str) -> &mut Self {
        self.out.extend_from_slice(b"STAT ");
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(b' ');
        self.out.extend(v.bytes().map(|b| if b.is_ascii_graphic() { b } else { b'_' }));
        self.out.extend_from_slice(b"\r\n");
        self
    }

    /// `END`.
    pub fn end(&mut self) {
        self.out.extend_from_slice(b"END\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        for v in [0u64, 1, 9, 10, 12345, u64::MAX] {
            let mut o = Vec::new();
            push_u64(&mut o, v);
            assert_eq!(o, v.to_string().as_bytes());
        }
        for v in [0i64, -1, i64::MIN, i64::MAX] {
            let mut o = Vec::new();
            push_i64(&mut o, v);
            assert_eq!(o, v.to_string().as_bytes());
        }
    }
}

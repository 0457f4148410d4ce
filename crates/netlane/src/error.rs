//! One error shape for a failed operation, and one way to print an error with its
//! causes.
//!
//! An error's message names what failed (`bind 10.0.0.1:11211`); its cause is reachable
//! through [`std::error::Error::source`] only, never repeated in the message. Whoever
//! prints an error for a person prints the chain: the command line does (`error: bind
//! 10.0.0.1:11211: Address already in use`), and logs use [`chain`].

use std::fmt;
use std::io;

/// A system call, file or socket operation that failed: the message is the operation,
/// the cause the [`io::Error`].
#[derive(Debug, thiserror::Error)]
#[error("{what}")]
pub struct IoError {
    what: String,
    #[source]
    source: io::Error,
}

impl IoError {
    /// `what` failed with `source`.
    pub fn new(what: impl Into<String>, source: io::Error) -> IoError {
        IoError { what: what.into(), source }
    }

    /// The cause's kind (`NotFound`, `AddrInUse`).
    pub fn kind(&self) -> io::ErrorKind {
        self.source.kind()
    }

    /// The cause's errno, where it has one.
    pub fn errno(&self) -> Option<i32> {
        self.source.raw_os_error()
    }

    /// The same failure under another name (`write /sys/...` for a write inside a
    /// namespace, say).
    pub fn renamed(self, what: impl Into<String>) -> IoError {
        IoError { what: what.into(), source: self.source }
    }
}

/// An error and its causes on one line, `what: cause: cause`, for logs and for
/// messages that flatten an error into text.
pub fn chain<'a>(e: &'a (dyn std::error::Error + 'static)) -> Chain<'a> {
    Chain(e)
}

/// See [`chain`].
#[derive(Debug, Clone, Copy)]
pub struct Chain<'a>(&'a (dyn std::error::Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(c) = cause {
            write!(f, ": {c}")?;
            cause = c.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum Outer {
        #[error(transparent)]
        Io(#[from] IoError),
    }

    #[test]
    fn the_cause_is_said_once_and_reached_through_source() {
        let e: Outer = IoError::new("bind 10.0.0.1:11211", io::Error::from(io::ErrorKind::AddrInUse)).into();
        assert_eq!(e.to_string(), "bind 10.0.0.1:11211");
        let cause = std::error::Error::source(&e).expect("a cause");
        assert_eq!(cause.to_string(), io::Error::from(io::ErrorKind::AddrInUse).to_string());
        assert_eq!(chain(&e).to_string(), format!("bind 10.0.0.1:11211: {cause}"));
        let Outer::Io(inner) = e;
        assert_eq!(inner.kind(), io::ErrorKind::AddrInUse);
        assert_eq!(inner.renamed("listen").to_string(), "listen");
    }
}

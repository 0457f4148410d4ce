//! Reading a text file a person names (a configuration, a results document) without
//! letting it stall or exhaust the reader: a regular file only, opened without blocking
//! (a FIFO or a device put in its place cannot stall it), of at most a given size.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::error::IoError;

/// Why a file could not be read as text.
#[derive(Debug, thiserror::Error)]
pub enum ReadTextError {
    /// Opening, examining or reading it failed (a file that is not UTF-8 too).
    #[error(transparent)]
    Io(#[from] IoError),
    /// A directory, FIFO, device or socket.
    #[error("{} is not a regular file", .0.display())]
    NotRegular(PathBuf),
    /// Larger than the reader takes (or grew past it while read).
    #[error("{} has {len} bytes or more; at most {max} are read", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size, as far as it was seen.
        len: u64,
        /// The most the reader takes.
        max: u64,
    },
}

/// The text of the regular file `path`, of at most `max` bytes.
pub fn read_text(path: &Path, max: u64) -> Result<String, ReadTextError> {
    let io = |what: &str| {
        let what = format!("{what} {}", path.display());
        move |e| ReadTextError::Io(IoError::new(what, e))
    };
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path).map_err(io("open"))?;
    let meta = file.metadata().map_err(io("stat"))?;
    if !meta.is_file() {
        return Err(ReadTextError::NotRegular(path.to_path_buf()));
    }
    let too_large = |len| ReadTextError::TooLarge { path: path.to_path_buf(), len, max };
    if meta.len() > max {
        return Err(too_large(meta.len()));
    }
    let mut text = String::new();
    file.take(max.saturating_add(1)).read_to_string(&mut text).map_err(io("read"))?;
    if text.len() as u64 > max {
        return Err(too_large(text.len() as u64));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_read_within_its_bound_and_refused_beyond_it_or_when_not_a_file() {
        let dir = std::env::temp_dir().join(format!("netlane-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("a.toml");
        std::fs::write(&f, "port = 1\n").unwrap();
        assert_eq!(read_text(&f, 9).unwrap(), "port = 1\n");
        let e = read_text(&f, 8).unwrap_err();
        assert_eq!(e.to_string(), format!("{} has 9 bytes or more; at most 8 are read", f.display()));
        assert_eq!(read_text(&dir, 8).unwrap_err().to_string(), format!("{} is not a regular file", dir.display()));
        assert!(matches!(read_text(Path::new("/dev/zero"), 8), Err(ReadTextError::NotRegular(_))));
        let missing = read_text(&dir.join("none"), 8).unwrap_err();
        assert!(missing.to_string().starts_with("open ") && std::error::Error::source(&missing).is_some());
        std::fs::write(&f, [0xff, 0xfe]).unwrap();
        assert!(read_text(&f, 8).unwrap_err().to_string().starts_with("read "));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

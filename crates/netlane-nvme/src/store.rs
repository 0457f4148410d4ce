//! Namespace storage: memory or a file, parsed from `mem:SIZE[:BS]` or
//! `file:PATH[:SIZE[:BS]]`.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use crate::proto::namespace::{MemNamespace, Namespace};

use netlane::metrics::units::parse_size;

/// A namespace backed by a regular file or block device: `pread`/`pwrite`, and Flush is
/// `fdatasync`. Thread-safe without locks (positioned I/O).
#[derive(Debug)]
pub struct FileNamespace {
    file: File,
    path: PathBuf,
    block_size: u32,
    blocks: u64,
}

impl FileNamespace {
    /// Opens (creating if needed) `path`; with `size` the file is extended to it, without
    /// it the file's current size is used.
    pub fn open(path: PathBuf, size: Option<u64>, block_size: u32) -> io::Result<FileNamespace> {
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path)?;
        let meta = file.metadata()?;
        // A device has no length to set: its own size, or the size given, is used.
        let cur = if meta.is_file() { meta.len() } else { (&file).seek(io::SeekFrom::End(0))? };
        let len = match size {
            Some(s) if s > cur && meta.is_file() => {
                file.set_len(s)?;
                s
            }
            Some(s) if s > cur && cur > 0 => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} holds {cur} bytes, fewer than the {s} asked for", path.display()),
                ));
            }
            Some(s) => s,
            None => cur,
        };
        let blocks = len / u64::from(block_size);
        if blocks == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} holds no whole {block_size}-byte block (give a size: file:PATH:1G)", path.display()),
            ));
        }
        Ok(FileNamespace { file, path, block_size, blocks })
    }
}

impl Namespace for FileNamespace {
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn blocks(&self) -> u64 {
        self.blocks
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.file.write_all_at(data, offset)
    }
    fn flush(&self) -> io::Result<()> {
        self.file.sync_data().map_err(|e| io::Error::new(e.kind(), format!("fdatasync {}: {e}", self.path.display())))
    }
}

/// Builds a namespace from a spec: `mem:SIZE[:BS]` or `file:PATH[:SIZE[:BS]]`, sizes
/// with K/M/G suffixes (binary), BS 512 or 4096 (default 4096).
pub fn open_namespace(spec: &str) -> Result<Arc<dyn Namespace>, String> {
    let bs = |s: Option<&str>| -> Result<u32, String> {
        match s {
            None => Ok(4096),
            Some(s) => {
                let v = parse_size(s).map_err(|e| format!("block size {s:?}: {e}"))?;
                match v {
                    512 | 1024 | 2048 | 4096 | 8192 | 16384 | 32768 | 65536 => Ok(v as u32),
                    _ => Err(format!("block size {v} must be a power of two from 512 to 64K")),
                }
            }
        }
    };
    if let Some(rest) = spec.strip_prefix("mem:") {
        let mut it = rest.split(':');
        let size = it.next().filter(|s| !s.is_empty()).ok_or("mem: needs a size, e.g. mem:256M")?;
        let size = parse_size(size).map_err(|e| format!("namespace size {size:?}: {e}"))?;
        let ns = MemNamespace::new(size, bs(it.next())?)?;
        if it.next().is_some() {
            return Err(format!("{spec:?}: too many fields (mem:SIZE[:BS])"));
        }
        Ok(Arc::new(ns))
    } else if let Some(rest) = spec.strip_prefix("file:") {
        let mut it = rest.split(':');
        let path = it.next().filter(|s| !s.is_empty()).ok_or("file: needs a path")?;
        let size = match it.next() {
            Some(s) => Some(parse_size(s).map_err(|e| format!("namespace size {s:?}: {e}"))?),
            None => None,
        };
        let block = bs(it.next())?;
        if it.next().is_some() {
            return Err(format!("{spec:?}: too many fields (file:PATH[:SIZE[:BS]])"));
        }
        let ns = FileNamespace::open(PathBuf::from(path), size, block).map_err(|e| format!("{path}: {e}"))?;
        Ok(Arc::new(ns))
    } else {
        Err(format!("namespace {spec:?}: expected mem:SIZE[:BS] or file:PATH[:SIZE[:BS]]"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_files_persist() {
        assert_eq!(open_namespace("mem:1M").unwrap().blocks(), 256);
        assert_eq!(open_namespace("mem:1M:512").unwrap().blocks(), 2048);
        for bad in ["mem:", "mem:1M:1000", "disk:1G", "mem:1M:4K:x", "file:", "mem:zz"] {
            assert!(open_namespace(bad).is_err(), "{bad}");
        }
        let dir = std::env::temp_dir().join(format!("netlane-ns-{}", std::process::id()));
        let spec = format!("file:{}:1M", dir.display());
        let ns = open_namespace(&spec).unwrap();
        ns.write(4096, b"durable").unwrap();
        ns.flush().unwrap();
        drop(ns);
        let again = open_namespace(&format!("file:{}", dir.display())).unwrap();
        let mut b = [0u8; 7];
        again.read(4096, &mut b).unwrap();
        assert_eq!(&b, b"durable");
        std::fs::remove_file(&dir).unwrap();
    }
}

//! Storage behind an NVMe namespace.
//!
//! The controller state machine never touches storage: it emits storage requests
//! (`target::StorageRequest`) and the driver runs them against a [`Namespace`], on the
//! reactor when [`Namespace::blocking`] says it cannot stall, on a worker otherwise. The
//! server supplies a file-backed implementation; [`MemNamespace`] lives here.

use std::io;
use std::sync::RwLock;

/// The storage behind one namespace. Implementations are shared by every queue of every
/// controller, on many threads.
pub trait Namespace: Send + Sync + std::fmt::Debug {
    /// Logical block size in bytes (a power of two, 512..=65536).
    fn block_size(&self) -> u32;
    /// Size in logical blocks.
    fn blocks(&self) -> u64;
    /// Reads `buf.len()` bytes at byte `offset`. Callers keep the range inside the
    /// namespace.
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Writes `data` at byte `offset`.
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()>;
    /// Makes completed writes durable.
    fn flush(&self) -> io::Result<()>;
    /// Whether an operation may block the calling thread (a file, a device): the driver
    /// then runs it off the reactor so one slow Flush does not stall other queues.
    fn blocking(&self) -> bool {
        true
    }
    /// Deallocates `len` bytes at `offset` (Dataset Management); they read back as
    /// zeroes afterwards (what Identify Namespace DLFEAT promises).
    fn deallocate(&self, offset: u64, len: u64) -> io::Result<()> {
        self.write_zeroes(offset, len)
    }
    /// Memory this namespace may take at most, in bytes (0: it lives elsewhere, a file).
    fn memory(&self) -> u64 {
        0
    }
    /// Zeroes `len` bytes at `offset`.
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        let zeros = vec![0u8; len.min(1 << 20) as usize];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(zeros.len() as u64);
            self.write(offset + done, &zeros[..n as usize])?;
            done += n;
        }
        Ok(())
    }
}

/// Chunk size of [`MemNamespace`]: a lock per chunk keeps concurrent queues writing
/// different regions from contending.
const CHUNK: usize = 64 * 1024;

/// A namespace in memory (not durable). A chunk is allocated when it is first written,
/// so a namespace costs only what was written to it; until then it reads as zeroes, and
/// deallocating a whole chunk gives its memory back.
#[derive(Debug)]
pub struct MemNamespace {
    block_size: u32,
    blocks: u64,
    chunks: Vec<RwLock<Option<Box<[u8]>>>>,
}

impl MemNamespace {
    /// A namespace of `bytes` (rounded down to whole blocks) with `block_size` blocks.
    pub fn new(bytes: u64, block_size: u32) -> Result<MemNamespace, String> {
        if !block_size.is_power_of_two() || !(512..=65536).contains(&block_size) {
            return Err(format!("block size {block_size} is not a power of two in 512..=65536"));
        }
        let blocks = bytes / u64::from(block_size);
        if blocks == 0 {
            return Err(format!("namespace of {bytes} bytes holds no {block_size}-byte block"));
        }
        let total = blocks * u64::from(block_size);
        let n = total.div_ceil(CHUNK as u64) as usize;
        let chunks = (0..n).map(|_| RwLock::new(None)).collect();
        Ok(MemNamespace { block_size, blocks, chunks })
    }

    /// Bytes of chunks allocated now.
    pub fn resident(&self) -> u64 {
        let allocated = self.chunks.iter().filter(|c| c.read().map(|c| c.is_some()).unwrap_or(true)).count();
        allocated as u64 * CHUNK as u64
    }

    /// Runs `f` on each piece of `offset..offset + len` inside one chunk: (chunk index,
    /// offset in the chunk, offset in the range, length).
    fn pieces(
        offset: u64,
        len: usize,
        mut f: impl FnMut(usize, usize, usize, usize) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut done = 0;
        while done < len {
            let pos = offset as usize + done;
            let (c, o) = (pos / CHUNK, pos % CHUNK);
            let n = (CHUNK - o).min(len - done);
            f(c, o, done, n)?;
            done += n;
        }
        Ok(())
    }

    fn span(&self, offset: u64, len: usize) -> io::Result<()> {
        let end = offset.checked_add(len as u64).ok_or_else(|| io::Error::other("offset overflow"))?;
        if end > self.blocks * u64::from(self.block_size) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "range past the end of the namespace"));
        }
        Ok(())
    }
}

impl Namespace for MemNamespace {
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn blocks(&self) -> u64 {
        self.blocks
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.span(offset, buf.len())?;
        Self::pieces(offset, buf.len(), |c, o, at, n| {
            let chunk = self.chunks[c].read().map_err(|_| poisoned())?;
            match chunk.as_deref() {
                Some(data) => buf[at..at + n].copy_from_slice(&data[o..o + n]),
                None => buf[at..at + n].fill(0),
            }
            Ok(())
        })
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.span(offset, data.len())?;
        Self::pieces(offset, data.len(), |c, o, at, n| {
            let mut chunk = self.chunks[c].write().map_err(|_| poisoned())?;
            let chunk = chunk.get_or_insert_with(|| vec![0u8; CHUNK].into_boxed_slice());
            chunk[o..o + n].copy_from_slice(&data[at..at + n]);
            Ok(())
        })
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        let len = usize::try_from(len).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "length overflow"))?;
        self.span(offset, len)?;
        Self::pieces(offset, len, |c, o, _, n| {
            let mut chunk = self.chunks[c].write().map_err(|_| poisoned())?;
            if n == CHUNK {
                *chunk = None;
            } else if let Some(data) = chunk.as_deref_mut() {
                data[o..o + n].fill(0);
            }
            Ok(())
        })
    }
    fn memory(&self) -> u64 {
        self.blocks * u64::from(self.block_size)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn blocking(&self) -> bool {
        false
    }
}

fn poisoned() -> io::Error {
    io::Error::other("poisoned chunk lock")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_namespace_reads_back_across_chunks() {
        let ns = MemNamespace::new(1 << 20, 4096).unwrap();
        let data: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        ns.write(CHUNK as u64 - 100, &data).unwrap();
        let mut back = vec![0; data.len()];
        ns.read(CHUNK as u64 - 100, &mut back).unwrap();
        assert_eq!(back, data);
        ns.write_zeroes(CHUNK as u64, 4096).unwrap();
        ns.read(CHUNK as u64, &mut back[..4096]).unwrap();
        assert!(back[..4096].iter().all(|&b| b == 0));
        assert!(ns.read((1 << 20) - 10, &mut [0; 20]).is_err());
        assert!(MemNamespace::new(1000, 4096).is_err());
    }

    #[test]
    fn mem_namespace_takes_memory_only_where_written_and_gives_whole_chunks_back() {
        let ns = MemNamespace::new(64 << 30, 4096).unwrap();
        assert_eq!(ns.resident(), 0);
        assert_eq!(ns.memory(), 64 << 30);
        let mut back = [1u8; 8192];
        ns.read(40 << 30, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0));
        ns.write((40 << 30) + 10, &[7; 100]).unwrap();
        assert_eq!(ns.resident(), CHUNK as u64);
        ns.read(40 << 30, &mut back).unwrap();
        assert!(back[10..110].iter().all(|&b| b == 7) && back[..10].iter().all(|&b| b == 0));
        ns.write_zeroes((40 << 30) + 4096, 4096).unwrap();
        assert_eq!(ns.resident(), CHUNK as u64, "a partial zeroing keeps the chunk");
        ns.deallocate(40 << 30, CHUNK as u64).unwrap();
        assert_eq!(ns.resident(), 0);
        ns.read(40 << 30, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0));
        assert!(MemNamespace::new(1 << 20, 1000).is_err());
    }
}

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

/// A namespace in memory (not durable). Allocated lazily by the OS (zeroed pages).
#[derive(Debug)]
pub struct MemNamespace {
    block_size: u32,
    blocks: u64,
    chunks: Vec<RwLock<Box<[u8]>>>,
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
        let chunks = (0..n).map(|_| RwLock::new(vec![0u8; CHUNK].into_boxed_slice())).collect();
        Ok(MemNamespace { block_size, blocks, chunks })
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
        let mut done = 0;
        while done < buf.len() {
            let pos = offset as usize + done;
            let (c, o) = (pos / CHUNK, pos % CHUNK);
            let n = (CHUNK - o).min(buf.len() - done);
            let chunk = self.chunks[c].read().map_err(|_| io::Error::other("poisoned chunk lock"))?;
            buf[done..done + n].copy_from_slice(&chunk[o..o + n]);
            done += n;
        }
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.span(offset, data.len())?;
        let mut done = 0;
        while done < data.len() {
            let pos = offset as usize + done;
            let (c, o) = (pos / CHUNK, pos % CHUNK);
            let n = (CHUNK - o).min(data.len() - done);
            let mut chunk = self.chunks[c].write().map_err(|_| io::Error::other("poisoned chunk lock"))?;
            chunk[o..o + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn blocking(&self) -> bool {
        false
    }
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
        assert!(MemNamespace::new(1 << 20, 1000).is_err());
    }
}

//! memcached's size classes, for reporting only.
//!
//! The store allocates each item on its own (no slabs), but memcached's tools and
//! clients read the cache through its classes: `stats items` and `stats slabs` per
//! class, `stats cachedump <class>`. So items are counted by the class memcached 1.6
//! would keep them in: chunk sizes from 96 bytes growing by the factor (`-f`, 1.25),
//! 8-byte aligned, up to half the largest item (`slab_chunk_max`); an item's size as
//! memcached counts it (`ITEM_ntotal`: a 48-byte header, the key and a NUL, 4 bytes
//! of client flags when they are not 0, the value and its CRLF, 8 bytes of CAS).

/// Most classes (memcached's `MAX_NUMBER_OF_SLAB_CLASSES` less its unused class 0).
pub const MAX_CLASSES: usize = 63;

/// memcached's item header (`sizeof(item)` on 64-bit Linux).
const ITEM_HEADER: u64 = 48;
/// memcached's chunk alignment.
const ALIGN: u64 = 8;

/// The class boundaries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Classes {
    /// Chunk size of class `i + 1`.
    sizes: Vec<u64>,
}

/// How the classes are laid out (memcached's `-f`, `-n`, `slab_chunk_max`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClassConfig {
    /// Growth factor between classes (`-f`), above 1.
    pub factor: f64,
    /// Smallest space for key, value and flags (`-n`, 48).
    pub min_size: u64,
    /// Largest chunk (`slab_chunk_max`; memcached's default is half the largest item).
    pub chunk_max: u64,
}

impl ClassConfig {
    /// memcached's defaults for items of up to `item_max` bytes.
    pub fn for_item_max(item_max: usize) -> ClassConfig {
        ClassConfig { factor: 1.25, min_size: 48, chunk_max: (item_max as u64 / 2).max(1024) }
    }
}

impl Classes {
    /// The classes memcached's `slabs_init` builds for `cfg`.
    pub fn new(cfg: ClassConfig) -> Classes {
        let factor = if cfg.factor.is_finite() && cfg.factor > 1.0 { cfg.factor } else { 1.25 };
        let mut sizes = Vec::new();
        let mut size = ITEM_HEADER + cfg.min_size;
        while sizes.len() < MAX_CLASSES - 1 && (size as f64) < cfg.chunk_max as f64 / factor {
            if !size.is_multiple_of(ALIGN) {
                size += ALIGN - size % ALIGN;
            }
            sizes.push(size);
            size = (size as f64 * factor) as u64;
        }
        sizes.push(cfg.chunk_max);
        Classes { sizes }
    }

    /// The size memcached counts for an item (`ITEM_ntotal`).
    pub fn item_size(key_len: usize, value_len: usize, flags: u32, cas: bool) -> u64 {
        ITEM_HEADER
            + key_len as u64
            + 1
            + if flags != 0 { 4 } else { 0 }
            + value_len as u64
            + 2
            + if cas { 8 } else { 0 }
    }

    /// The class of an item of `size` bytes (1-based; an item over the largest chunk is
    /// counted in the largest class, where memcached keeps its chunks).
    pub fn class_of_size(&self, size: u64) -> u32 {
        let i = self.sizes.iter().position(|&s| size <= s).unwrap_or(self.sizes.len() - 1);
        i as u32 + 1
    }

    /// Chunk size of class `class` (1-based).
    pub fn chunk_size(&self, class: u32) -> u64 {
        self.sizes.get(class.saturating_sub(1) as usize).copied().unwrap_or(0)
    }

    /// How many classes.
    pub fn len(&self) -> usize {
        self.sizes.len()
    }

    /// Never: there is always the largest class.
    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_match_memcacheds_defaults() {
        let c = Classes::new(ClassConfig::for_item_max(1 << 20));
        // memcached 1.6.18 -vv with the defaults: 39 classes, 96, 120, 152, ..., 524288.
        assert_eq!(&c.sizes[..4], &[96, 120, 152, 192]);
        assert_eq!(c.chunk_size(31), 82792);
        assert_eq!(*c.sizes.last().unwrap(), 512 << 10);
        assert_eq!(c.len(), 39);
        // A 66560-byte value under a short key is in class 31 (memcached's t/issue_163.t).
        assert_eq!(c.class_of_size(Classes::item_size(3, 66560, 0, true)), 31);
        assert_eq!(c.class_of_size(Classes::item_size(1, 1, 0, true)), 1);
        assert_eq!(c.class_of_size(1 << 30), 39);
    }
}

//! The NVMe/TCP digest: CRC32C (Castagnoli), seed and final XOR 0xFFFFFFFF, stored
//! little-endian (NVMe/TCP 3.6.1.2). The `crc32c` crate uses SSE4.2/ARMv8 CRC
//! instructions when the CPU has them.

/// CRC32C of `data` as NVMe/TCP digests use it.
#[inline]
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_the_castagnoli_check_value() {
        // The standard check value of CRC-32C over "123456789" (RFC 3720 B.4 family).
        assert_eq!(super::crc32c(b"123456789"), 0xe306_9283);
        // 32 bytes of zeros, from RFC 3720 B.4.
        assert_eq!(super::crc32c(&[0u8; 32]), 0x8a91_36aa);
    }
}

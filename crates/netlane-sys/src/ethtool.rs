//! A device's RSS configuration (receive flow hash indirection table, hash key, hash
//! function) through the `SIOCETHTOOL` ioctl: `ETHTOOL_GRSSH` and `ETHTOOL_SRSSH`, what
//! `ethtool -x` and `ethtool -X` use. Ethtool netlink reads RSS only since Linux 6.2 and
//! sets it only since 6.17; this ioctl does both on every kernel a user runs
//! (include/uapi/linux/ethtool.h, `struct ethtool_rxfh`).

use std::io;
use std::os::fd::AsRawFd;

use socket2::{Domain, Socket, Type};

/// `ETHTOOL_GRSSH`: get the RX flow hash configuration.
const ETHTOOL_GRSSH: u32 = 0x46;
/// `ETHTOOL_SRSSH`: set it.
const ETHTOOL_SRSSH: u32 = 0x47;
/// `indir_size` of a set that leaves the table as it is.
const ETH_RXFH_INDIR_NO_CHANGE: u32 = 0xffff_ffff;
/// The fixed part of `struct ethtool_rxfh` in 32-bit words: cmd, rss_context,
/// indir_size, key_size, (hfunc, input_xfrm, rsvd8[2]), rsvd32.
const HEADER_WORDS: usize = 6;
/// The largest table and key a device may report (the kernel's own bound on
/// `ETHTOOL_GRSSH` answers is the driver's; these keep a broken one from making us
/// allocate without end).
const MAX_INDIR: u32 = 1 << 16;
const MAX_KEY: u32 = 1 << 12;

/// A device's RSS configuration (its default context).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rxfh {
    /// The indirection table: entry i names the receive queue of flows whose hash
    /// selects i.
    pub indir: Vec<u32>,
    /// The hash key.
    pub key: Vec<u8>,
    /// The hash function as a bit set (`ETH_RSS_HASH_*`: bit 0 Toeplitz, 1 XOR, 2 CRC32).
    pub hfunc: u8,
}

/// What to set of a device's RSS configuration (`None`: leave it as it is).
#[derive(Debug, Clone, Copy, Default)]
pub struct RxfhSet<'a> {
    /// A new indirection table, of the device's size; an empty one resets the table to
    /// the kernel's default spread (and clears its mark as the user's). Give a key in a
    /// call of its own then: kernels before a 2024 fix read it from the wrong place.
    pub indir: Option<&'a [u32]>,
    /// A new hash key, of the device's size.
    pub key: Option<&'a [u8]>,
}

/// An `SIOCETHTOOL` call on `ifname` (in the calling thread's network namespace) with
/// `buf` as its `ifr_data`.
fn ethtool_ioctl(ifname: &str, buf: &mut [u32]) -> io::Result<()> {
    let name = ifname.as_bytes();
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains(&0) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{ifname:?} is not a device name")));
    }
    let sock = Socket::new(Domain::IPV4, Type::DGRAM, None)?;
    // SAFETY: `ifreq` is plain old data (a name array and a union of plain fields):
    // all zeroes is a valid value of it.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(name) {
        *dst = *src as libc::c_char;
    }
    ifr.ifr_ifru.ifru_data = buf.as_mut_ptr().cast();
    // SAFETY: SIOCETHTOOL reads the `ifreq` (a live, NUL-terminated name and a pointer),
    // then reads and writes at most the `struct ethtool_rxfh` the pointer's buffer holds:
    // the header plus the `indir_size` words and `key_size` bytes the header states,
    // which the callers size `buf` for; `buf` is exclusively borrowed for the call.
    crate::cvt(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCETHTOOL as _, &mut ifr as *mut libc::ifreq) })?;
    Ok(())
}

/// The words after the header that hold `indir` table entries and `key` bytes.
fn body_words(indir: u32, key: u32) -> usize {
    indir as usize + (key as usize).div_ceil(4)
}

/// The hash function, from the header word of hfunc, input_xfrm and rsvd8[2].
fn hfunc_of(word: u32) -> u8 {
    word.to_ne_bytes()[0]
}

/// Reads `ifname`'s RSS configuration. `EOPNOTSUPP` where the device has none.
pub fn get_rxfh(ifname: &str) -> io::Result<Rxfh> {
    // First the sizes (a zero-sized request), then the table and key.
    let mut head = [0u32; HEADER_WORDS];
    head[0] = ETHTOOL_GRSSH;
    ethtool_ioctl(ifname, &mut head)?;
    let (indir_size, key_size) = (head[2], head[3]);
    if indir_size > MAX_INDIR || key_size > MAX_KEY {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the device reports a {indir_size}-entry table and a {key_size}-byte key"),
        ));
    }
    let mut buf = vec![0u32; HEADER_WORDS + body_words(indir_size, key_size)];
    buf[0] = ETHTOOL_GRSSH;
    buf[2] = indir_size;
    buf[3] = key_size;
    ethtool_ioctl(ifname, &mut buf)?;
    let body = &buf[HEADER_WORDS..];
    let indir = body[..indir_size as usize].to_vec();
    let key: Vec<u8> =
        body[indir_size as usize..].iter().flat_map(|w| w.to_ne_bytes()).take(key_size as usize).collect();
    Ok(Rxfh { indir, key, hfunc: hfunc_of(buf[4]) })
}

/// Sets what `set` gives of `ifname`'s RSS configuration; the sizes must be the device's
/// (as [`get_rxfh`] reads them), or the kernel refuses (`EINVAL`), as it does a table
/// entry past the device's receive queues.
pub fn set_rxfh(ifname: &str, set: &RxfhSet<'_>) -> io::Result<()> {
    let indir = set.indir.unwrap_or(&[]);
    let key = set.key.unwrap_or(&[]);
    if set.indir.is_some_and(<[u32]>::is_empty) && !key.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "a table reset and a key in one call"));
    }
    let too_big = |n: usize, max: u32| u32::try_from(n).map_or(true, |n| n > max);
    if too_big(indir.len(), MAX_INDIR) || too_big(key.len(), MAX_KEY) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "the table or key is larger than any device's"));
    }
    let mut buf = vec![0u32; HEADER_WORDS + body_words(indir.len() as u32, key.len() as u32)];
    buf[0] = ETHTOOL_SRSSH;
    // Zero would reset the table to the driver's default: "no change" is its own value.
    buf[2] = if set.indir.is_some() { indir.len() as u32 } else { ETH_RXFH_INDIR_NO_CHANGE };
    buf[3] = key.len() as u32;
    // Without a table, the key follows the header directly.
    let body = &mut buf[HEADER_WORDS..];
    body[..indir.len()].copy_from_slice(indir);
    for (word, chunk) in body[indir.len()..].iter_mut().zip(key.chunks(4)) {
        let mut b = [0u8; 4];
        b[..chunk.len()].copy_from_slice(chunk);
        *word = u32::from_ne_bytes(b);
    }
    // The input transform (symmetric hashing, Linux 6.8) is set by the same call: the one
    // read is written back (a kernel before 6.8 reads that byte as reserved, zero).
    let mut head = [0u32; HEADER_WORDS];
    head[0] = ETHTOOL_GRSSH;
    ethtool_ioctl(ifname, &mut head)?;
    buf[4] = u32::from_ne_bytes([0, head[4].to_ne_bytes()[1], 0, 0]);
    ethtool_ioctl(ifname, &mut buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_is_the_uapi_structs_size() {
        // struct ethtool_rxfh without rss_config[]: 24 bytes.
        assert_eq!(HEADER_WORDS * 4, 24);
        assert_eq!(body_words(128, 40), 138);
        assert_eq!(body_words(0, 0), 0);
        assert_eq!(body_words(4, 3), 5);
        assert_eq!(hfunc_of(u32::from_ne_bytes([1, 0, 0, 0])), 1);
    }

    #[test]
    fn a_device_without_rss_says_so_and_a_bad_name_is_refused() {
        let err = get_rxfh("lo").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EOPNOTSUPP), "{err}");
        assert_eq!(get_rxfh("").unwrap_err().kind(), io::ErrorKind::InvalidInput);
        assert_eq!(get_rxfh("a-name-longer-than-ifnamsiz").unwrap_err().kind(), io::ErrorKind::InvalidInput);
        let err = set_rxfh("lo", &RxfhSet { indir: Some(&[0; 4]), key: None }).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EOPNOTSUPP), "{err}");
    }
}

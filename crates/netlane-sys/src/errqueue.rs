//! Error-queue records (`struct sock_extended_err`, include/uapi/linux/errqueue.h).
//!
//! Read with `recvmsg(MSG_ERRQUEUE)`; each record arrives as an `IP_RECVERR` or
//! `IPV6_RECVERR` control message whose data is the 16-byte struct, optionally followed
//! by the offending address. netlane reads two kinds:
//!
//! - MSG_ZEROCOPY completions (`SO_EE_ORIGIN_ZEROCOPY`): `ee_info..=ee_data` is an
//!   inclusive range of the socket's 32-bit send counter (it wraps), and
//!   `ee_code & SO_EE_CODE_ZEROCOPY_COPIED` says the kernel copied after all
//!   (Documentation/networking/msg_zerocopy.rst);
//! - SO_TXTIME errors (`SO_EE_ORIGIN_TXTIME`): the packet's release time was invalid or
//!   missed; `ee_data:ee_info` hold the txtime (high and low 32 bits).

use crate::consts;

/// A decoded `struct sock_extended_err`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtendedErr {
    /// `ee_errno`.
    pub errno: u32,
    /// `ee_origin` (`SO_EE_ORIGIN_*`).
    pub origin: u8,
    /// `ee_type`.
    pub kind: u8,
    /// `ee_code`.
    pub code: u8,
    /// `ee_info`.
    pub info: u32,
    /// `ee_data`.
    pub data: u32,
}

/// Size of `struct sock_extended_err`.
pub const EXTENDED_ERR_LEN: usize = 16;

impl ExtendedErr {
    /// Parses the struct from the start of a control message's data; `None` if short.
    pub fn parse(data: &[u8]) -> Option<Self> {
        let b = data.get(..EXTENDED_ERR_LEN)?;
        let u32_at = |i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Some(Self { errno: u32_at(0), origin: b[4], kind: b[5], code: b[6], info: u32_at(8), data: u32_at(12) })
    }

    /// Encodes the struct (for tests and fixtures).
    pub fn to_bytes(&self) -> [u8; EXTENDED_ERR_LEN] {
        let mut out = [0u8; EXTENDED_ERR_LEN];
        out[0..4].copy_from_slice(&self.errno.to_ne_bytes());
        out[4] = self.origin;
        out[5] = self.kind;
        out[6] = self.code;
        out[8..12].copy_from_slice(&self.info.to_ne_bytes());
        out[12..16].copy_from_slice(&self.data.to_ne_bytes());
        out
    }

    /// The record as a zerocopy completion, if it is one.
    pub fn zerocopy(&self) -> Option<ZerocopyRange> {
        (self.origin == consts::SO_EE_ORIGIN_ZEROCOPY && self.errno == 0).then_some(ZerocopyRange {
            lo: self.info,
            hi: self.data,
            copied: self.code & consts::SO_EE_CODE_ZEROCOPY_COPIED != 0,
        })
    }

    /// The record as a txtime error, if it is one.
    pub fn txtime(&self) -> Option<TxtimeError> {
        (self.origin == consts::SO_EE_ORIGIN_TXTIME).then(|| TxtimeError {
            missed: self.code == consts::SO_EE_CODE_TXTIME_MISSED,
            txtime_ns: (u64::from(self.data) << 32) | u64::from(self.info),
        })
    }
}

/// A zerocopy completion: sends `lo..=hi` (send-call counter values, wrapping) are done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZerocopyRange {
    /// First completed send counter value.
    pub lo: u32,
    /// Last completed send counter value (inclusive; may be below `lo` after a wrap).
    pub hi: u32,
    /// The kernel copied the data instead of sending from the pinned pages.
    pub copied: bool,
}

impl ZerocopyRange {
    /// How many sends the range completes, counting across the 32-bit wrap.
    pub fn count(&self) -> u64 {
        u64::from(self.hi.wrapping_sub(self.lo)) + 1
    }

    /// Whether counter value `id` lies in the range (wrap-aware).
    pub fn contains(&self, id: u32) -> bool {
        id.wrapping_sub(self.lo) <= self.hi.wrapping_sub(self.lo)
    }
}

/// A packet whose SO_TXTIME release time the qdisc rejected or missed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxtimeError {
    /// `SO_EE_CODE_TXTIME_MISSED` (else: invalid parameter).
    pub missed: bool,
    /// The release time the packet carried.
    pub txtime_ns: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmsg::{Cmsg, CmsgBuf};

    fn zc(lo: u32, hi: u32, code: u8) -> ExtendedErr {
        ExtendedErr { errno: 0, origin: consts::SO_EE_ORIGIN_ZEROCOPY, kind: 0, code, info: lo, data: hi }
    }

    #[test]
    fn zerocopy_record_round_trips_through_a_control_buffer() {
        // As the kernel delivers it over IPv4: sock_extended_err + sockaddr_in offender.
        let mut data = zc(5, 9, consts::SO_EE_CODE_ZEROCOPY_COPIED).to_bytes().to_vec();
        data.extend_from_slice(&[0u8; 16]);
        let mut buf = CmsgBuf::<128>::new();
        buf.push(libc::SOL_IP, libc::IP_RECVERR, &data).unwrap();
        let m = buf.iter().next().unwrap().unwrap();
        let Cmsg::RecvErr(ee) = Cmsg::decode(m) else { panic!("not decoded as RecvErr") };
        let r = ee.zerocopy().unwrap();
        assert_eq!(r, ZerocopyRange { lo: 5, hi: 9, copied: true });
        assert_eq!(r.count(), 5);
        assert!(ee.txtime().is_none());
    }

    #[test]
    fn zerocopy_over_ipv6_and_not_copied() {
        let mut data = zc(0, 0, 0).to_bytes().to_vec();
        data.extend_from_slice(&[0u8; 28]);
        let mut buf = CmsgBuf::<128>::new();
        buf.push(libc::SOL_IPV6, libc::IPV6_RECVERR, &data).unwrap();
        let Cmsg::RecvErr(ee) = Cmsg::decode(buf.iter().next().unwrap().unwrap()) else {
            panic!("not decoded as RecvErr")
        };
        assert_eq!(ee.zerocopy(), Some(ZerocopyRange { lo: 0, hi: 0, copied: false }));
    }

    #[test]
    fn zerocopy_range_wraps() {
        let r = zc(u32::MAX - 2, 1, 0).zerocopy().unwrap();
        assert_eq!(r.count(), 5); // MAX-2, MAX-1, MAX, 0, 1
        assert!(r.contains(u32::MAX));
        assert!(r.contains(0));
        assert!(r.contains(1));
        assert!(!r.contains(2));
        assert!(!r.contains(u32::MAX - 3));
    }

    #[test]
    fn full_counter_space_range() {
        let r = zc(7, 6, 0).zerocopy().unwrap();
        assert_eq!(r.count(), 1u64 << 32);
    }

    #[test]
    fn icmp_errors_are_not_completions() {
        let ee = ExtendedErr {
            errno: libc::ECONNREFUSED as u32,
            origin: libc::SO_EE_ORIGIN_ICMP,
            kind: 3,
            code: 3,
            info: 0,
            data: 0,
        };
        assert!(ee.zerocopy().is_none());
        assert!(ee.txtime().is_none());
        // A zerocopy origin with an errno is also not a completion.
        let mut bad = zc(1, 2, 0);
        bad.errno = 5;
        assert!(bad.zerocopy().is_none());
    }

    #[test]
    fn txtime_error_decodes_time() {
        let ee = ExtendedErr {
            errno: libc::ETIME as u32,
            origin: consts::SO_EE_ORIGIN_TXTIME,
            kind: 0,
            code: consts::SO_EE_CODE_TXTIME_MISSED,
            info: 0x9abc_def0,
            data: 0x1234_5678,
        };
        assert_eq!(ee.txtime(), Some(TxtimeError { missed: true, txtime_ns: 0x1234_5678_9abc_def0 }));
    }

    #[test]
    fn short_data_is_rejected() {
        assert!(ExtendedErr::parse(&[0u8; 15]).is_none());
        let mut buf = CmsgBuf::<64>::new();
        buf.push(libc::SOL_IP, libc::IP_RECVERR, &[1, 2, 3]).unwrap();
        assert!(matches!(Cmsg::decode(buf.iter().next().unwrap().unwrap()), Cmsg::Other(_)));
    }
}

//! Kernel constants that the `libc` crate does not carry (yet), each with its source.

/// `SO_EE_ORIGIN_ZEROCOPY` (include/uapi/linux/errqueue.h): a zerocopy completion.
pub const SO_EE_ORIGIN_ZEROCOPY: u8 = 5;
/// `SO_EE_ORIGIN_TXTIME` (include/uapi/linux/errqueue.h): a txtime (SO_TXTIME) error.
pub const SO_EE_ORIGIN_TXTIME: u8 = 6;
/// `SO_EE_CODE_ZEROCOPY_COPIED`: the kernel copied the data after all.
pub const SO_EE_CODE_ZEROCOPY_COPIED: u8 = 1;
/// `SO_EE_CODE_TXTIME_INVALID_PARAM`: the txtime was rejected by the qdisc.
pub const SO_EE_CODE_TXTIME_INVALID_PARAM: u8 = 1;
/// `SO_EE_CODE_TXTIME_MISSED`: the packet missed its txtime and was dropped.
pub const SO_EE_CODE_TXTIME_MISSED: u8 = 2;

/// `UDP_MAX_SEGMENTS` in include/linux/udp.h: 64 until Linux 6.x raised it to 128.
/// netlane never asks for more than this.
pub const UDP_MAX_SEGMENTS: usize = 64;

/// `SOF_TXTIME_DEADLINE_MODE` (include/uapi/linux/net_tstamp.h).
pub const SOF_TXTIME_DEADLINE_MODE: u32 = 1 << 0;
/// `SOF_TXTIME_REPORT_ERRORS` (include/uapi/linux/net_tstamp.h).
pub const SOF_TXTIME_REPORT_ERRORS: u32 = 1 << 1;

/// Largest UDP payload in one IPv4 datagram: 65535 - 20 (IPv4) - 8 (UDP).
pub const MAX_UDP_PAYLOAD_V4: usize = 65_507;
/// Largest UDP payload in one IPv6 datagram without jumbograms: 65535 - 8 (UDP); the
/// IPv6 payload length does not count the 40-byte fixed header.
pub const MAX_UDP_PAYLOAD_V6: usize = 65_527;

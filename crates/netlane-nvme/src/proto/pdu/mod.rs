//! NVMe/TCP PDUs: framing, validation, parsing and emission.
//!
//! Wire layout of every PDU (NVMe/TCP transport specification, section 3.6.2):
//!
//! ```text
//! CH (8) | PSH (hlen - 8) | [HDGST 4] | [PAD] | DATA | [DDGST 4]
//! ```
//!
//! `hlen` and `pdo` count bytes, `plen` is a full 32-bit length of the whole PDU.
//! [`decode`] validates the header fields in the order the specification asks errors to
//! be reported (type, flags, hlen, pdo, plen), checks the header digest, and returns a
//! borrowed [`Pdu`] view; it never panics and never reads outside the buffer. A
//! violation comes back as a [`Violation`] carrying the Fatal Error Status and Fatal
//! Error Information the receiver puts in its termination request.
//!
//! The data digest is checked too, but a mismatch is not a framing violation: it is
//! reported in the PDU (`ddgst_ok`) so the queue can fail just that command with a
//! transient transport error, as the specification allows.
//!
//! This module holds the common header's constants, the PDU types and the receiving
//! role; the parts by role: `violation.rs` the Fatal Error Statuses and the errors
//! [`decode`] returns, `kinds.rs` the parsed PDUs, `receive.rs` header validation and
//! decoding, `emit.rs` emission and the output buffer, `tests.rs` the unit tests.

mod emit;
mod kinds;
mod receive;
#[cfg(test)]
mod tests;
mod violation;

pub use emit::{OutBuf, TxConfig};
pub use kinds::{Decoded, H2cData, IcReq, IcResp, Pdu};
pub use receive::{Frame, RxConfig, decode, offending_header, validate_header};
pub use violation::{DecodeError, Fes, Violation};

/// Length of the common header.
pub const CH_LEN: usize = 8;
/// Header length of ICReq and ICResp (and their total length).
pub const IC_LEN: usize = 128;
/// Header length of termination requests.
pub const TERM_HLEN: usize = 24;
/// Largest termination request: header plus up to 128 bytes of the offending header.
pub const TERM_MAX_PLEN: usize = 152;
/// Header length of a command capsule (8 + 64-byte SQE).
pub const CMD_HLEN: usize = 72;
/// Header length of a response capsule (8 + 16-byte CQE).
pub const RSP_HLEN: usize = 24;
/// Header length of H2CData, C2HData and R2T.
pub const DATA_HLEN: usize = 24;
/// Size of a header or data digest.
pub const DIGEST_LEN: usize = 4;

/// Common-header flag: a header digest follows the PDU-specific header.
pub const FLAG_HDGSTF: u8 = 0x01;
/// Common-header flag: a data digest follows the data.
pub const FLAG_DDGSTF: u8 = 0x02;
/// H2CData/C2HData flag: last data PDU of the command (or of the R2T).
pub const FLAG_LAST: u8 = 0x04;
/// C2HData flag: the command succeeded; no response capsule follows (requires LAST).
pub const FLAG_SUCCESS: u8 = 0x08;

/// PDU types (byte 0 of the common header). Host-to-controller types are even.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PduType {
    /// Initialize Connection Request (host to controller).
    IcReq = 0x00,
    /// Initialize Connection Response.
    IcResp = 0x01,
    /// Host-to-controller termination request.
    H2cTermReq = 0x02,
    /// Controller-to-host termination request.
    C2hTermReq = 0x03,
    /// Command capsule.
    CapsuleCmd = 0x04,
    /// Response capsule.
    CapsuleResp = 0x05,
    /// Host-to-controller data.
    H2cData = 0x06,
    /// Controller-to-host data.
    C2hData = 0x07,
    /// Ready to transfer.
    R2t = 0x09,
}

impl PduType {
    /// The type for a wire value, if it is one.
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0x00 => Self::IcReq,
            0x01 => Self::IcResp,
            0x02 => Self::H2cTermReq,
            0x03 => Self::C2hTermReq,
            0x04 => Self::CapsuleCmd,
            0x05 => Self::CapsuleResp,
            0x06 => Self::H2cData,
            0x07 => Self::C2hData,
            0x09 => Self::R2t,
            _ => return None,
        })
    }

    /// The fixed header length for this type.
    pub fn hlen(self) -> usize {
        match self {
            Self::IcReq | Self::IcResp => IC_LEN,
            Self::H2cTermReq | Self::C2hTermReq => TERM_HLEN,
            Self::CapsuleCmd => CMD_HLEN,
            Self::CapsuleResp => RSP_HLEN,
            Self::H2cData | Self::C2hData | Self::R2t => DATA_HLEN,
        }
    }

    /// Flags that may be set on this type.
    fn valid_flags(self) -> u8 {
        match self {
            Self::IcReq | Self::IcResp | Self::H2cTermReq | Self::C2hTermReq => 0,
            Self::CapsuleCmd => FLAG_HDGSTF | FLAG_DDGSTF,
            Self::CapsuleResp | Self::R2t => FLAG_HDGSTF,
            Self::H2cData => FLAG_HDGSTF | FLAG_DDGSTF | FLAG_LAST,
            Self::C2hData => FLAG_HDGSTF | FLAG_DDGSTF | FLAG_LAST | FLAG_SUCCESS,
        }
    }

    /// Whether PDUs of this type may carry data.
    fn carries_data(self) -> bool {
        matches!(self, Self::CapsuleCmd | Self::H2cData | Self::C2hData)
    }
}

/// Which end is receiving: controllers receive even types, hosts odd ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The controller (target) side.
    Controller,
    /// The host side.
    Host,
}

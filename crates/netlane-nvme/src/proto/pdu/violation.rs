//! What goes wrong on receipt: the Fatal Error Status a termination request carries, a
//! protocol violation with its status and field offset, and why [`decode`](super::decode)
//! returned no PDU.

/// Fatal Error Status of a termination request (NVMe/TCP 3.6.2.9, figure 31).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Fes {
    /// A header field is invalid; FEI is the byte offset of the field.
    InvalidHeaderField = 0x01,
    /// A PDU arrived that is not allowed in this state.
    PduSequenceError = 0x02,
    /// The header digest did not match.
    HeaderDigestError = 0x03,
    /// Data offset/length outside the command's (or the R2T's) range.
    DataOutOfRange = 0x04,
    /// More data than MAXH2CDATA, or too many outstanding R2Ts.
    DataLimitExceeded = 0x05,
    /// An ICReq/ICResp parameter is not supported; FEI is its byte offset.
    UnsupportedParameter = 0x06,
}

impl std::fmt::Display for Fes {
    /// The specification's name and the wire value: `PDU sequence error (FES 0x02)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            Fes::InvalidHeaderField => "invalid header field",
            Fes::PduSequenceError => "PDU sequence error",
            Fes::HeaderDigestError => "header digest error",
            Fes::DataOutOfRange => "data transfer out of range",
            Fes::DataLimitExceeded => "data transfer limit exceeded",
            Fes::UnsupportedParameter => "unsupported parameter",
        };
        write!(f, "{name} (FES {:#04x})", *self as u16)
    }
}

impl Fes {
    /// The status for a wire value.
    pub fn from_u16(v: u16) -> Option<Self> {
        Some(match v {
            0x01 => Self::InvalidHeaderField,
            0x02 => Self::PduSequenceError,
            0x03 => Self::HeaderDigestError,
            0x04 => Self::DataOutOfRange,
            0x05 => Self::DataLimitExceeded,
            0x06 => Self::UnsupportedParameter,
            _ => return None,
        })
    }
}

/// A protocol violation: what the receiver reports in its termination request before it
/// closes the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("NVMe/TCP protocol violation: {reason} (FES {fes:?}, FEI {fei})")]
pub struct Violation {
    /// Fatal Error Status.
    pub fes: Fes,
    /// Fatal Error Information: the byte offset of the offending field for
    /// [`Fes::InvalidHeaderField`] and [`Fes::UnsupportedParameter`], else 0.
    pub fei: u32,
    /// What was wrong, for logs.
    pub reason: &'static str,
}

impl Violation {
    /// A violation of `fes` at field offset `fei`.
    pub const fn new(fes: Fes, fei: u32, reason: &'static str) -> Self {
        Self { fes, fei, reason }
    }
    pub(super) const fn field(off: u32, reason: &'static str) -> Self {
        Self::new(Fes::InvalidHeaderField, off, reason)
    }
}

/// Why [`decode`](super::decode) returned no PDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The buffer holds only part of a PDU; at least this many bytes in total are needed
    /// (the common header has already been validated when this is more than 8).
    #[error("incomplete PDU: {0} bytes needed")]
    Incomplete(usize),
    /// A violation to report in a termination request.
    #[error(transparent)]
    Violation(#[from] Violation),
    /// A termination request with an invalid length: close without reporting
    /// (NVMe/TCP 3.6.2.9 / NVMe-oF 1.1 7.4.7).
    #[error("invalid termination request length; closing without reply")]
    Reset,
}

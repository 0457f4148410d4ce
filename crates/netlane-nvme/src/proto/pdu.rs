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

use crate::proto::digest;

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
    const fn field(off: u32, reason: &'static str) -> Self {
        Self::new(Fes::InvalidHeaderField, off, reason)
    }
}

/// Why [`decode`] returned no PDU.
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

/// Which end is receiving: controllers receive even types, hosts odd ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The controller (target) side.
    Controller,
    /// The host side.
    Host,
}

/// What a receiver has negotiated and will accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxConfig {
    /// Which end is receiving.
    pub role: Role,
    /// Whether connection initialisation (ICReq/ICResp) is complete. Before it only the
    /// IC PDU is accepted; after it, no IC PDU is.
    pub established: bool,
    /// Header digests negotiated.
    pub hdgst: bool,
    /// Data digests negotiated.
    pub ddgst: bool,
    /// Required alignment of `pdo` in bytes for PDUs this end receives ((pda + 1) * 4).
    pub pda: u32,
    /// Largest data payload accepted in a command capsule (in-capsule data).
    pub max_icd: u32,
    /// Largest data payload accepted in one H2CData/C2HData PDU.
    pub max_data: u32,
}

impl RxConfig {
    /// A receiver before initialisation: only the IC PDU is accepted.
    pub fn initial(role: Role) -> Self {
        Self { role, established: false, hdgst: false, ddgst: false, pda: 4, max_icd: 0, max_data: 0 }
    }
}

/// Parameters of ICReq (host to controller).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcReq {
    /// PDU format version (0 = 1.0).
    pub pfv: u16,
    /// Host PDU data alignment, 0's based dwords (0..=31).
    pub hpda: u8,
    /// Header digest requested.
    pub hdgst: bool,
    /// Data digest requested.
    pub ddgst: bool,
    /// Maximum outstanding R2Ts per command, 0's based.
    pub maxr2t: u32,
}

/// Parameters of ICResp (controller to host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcResp {
    /// PDU format version (0 = 1.0).
    pub pfv: u16,
    /// Controller PDU data alignment, 0's based dwords (0..=31).
    pub cpda: u8,
    /// Header digest enabled.
    pub hdgst: bool,
    /// Data digest enabled.
    pub ddgst: bool,
    /// Largest H2CData payload the controller accepts, bytes.
    pub maxh2cdata: u32,
}

/// A parsed PDU, borrowing its data from the receive buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pdu<'a> {
    /// Initialize Connection Request.
    IcReq(IcReq),
    /// Initialize Connection Response.
    IcResp(IcResp),
    /// A termination request from the peer (either direction).
    TermReq {
        /// Fatal Error Status as sent (may be a value this crate does not know).
        fes: u16,
        /// Fatal Error Information.
        fei: u32,
    },
    /// A command capsule, with in-capsule data if any.
    CapsuleCmd {
        /// The submission queue entry.
        sqe: crate::proto::cmd::Sqe,
        /// In-capsule data (empty when none).
        data: &'a [u8],
        /// Whether the data digest matched (true when no digest is used).
        ddgst_ok: bool,
    },
    /// A response capsule.
    CapsuleResp {
        /// The completion queue entry.
        cqe: crate::proto::cmd::Cqe,
    },
    /// Host-to-controller data.
    H2cData(H2cData<'a>),
    /// Controller-to-host data.
    C2hData {
        /// Command identifier of the command.
        cccid: u16,
        /// Offset of this data in the command's buffer.
        datao: u32,
        /// Last PDU of the command.
        last: bool,
        /// The command succeeded and no response capsule follows.
        success: bool,
        /// The data.
        data: &'a [u8],
        /// Whether the data digest matched.
        ddgst_ok: bool,
    },
    /// Ready to transfer.
    R2t {
        /// Command identifier of the command.
        cccid: u16,
        /// Transfer tag to echo in the H2CData PDUs.
        ttag: u16,
        /// Offset requested.
        r2to: u32,
        /// Length requested.
        r2tl: u32,
    },
}

/// A received H2CData PDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct H2cData<'a> {
    /// Command identifier of the command.
    pub cccid: u16,
    /// Transfer tag from the R2T.
    pub ttag: u16,
    /// Offset of this data in the command's buffer.
    pub datao: u32,
    /// Last PDU of the R2T.
    pub last: bool,
    /// The data.
    pub data: &'a [u8],
    /// Whether the data digest matched.
    pub ddgst_ok: bool,
}

/// One decoded PDU and the number of bytes it occupied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoded<'a> {
    /// The PDU.
    pub pdu: Pdu<'a>,
    /// Its total length (`plen`); consume this many bytes.
    pub len: usize,
}

#[inline]
fn le16(b: &[u8], off: usize) -> u16 {
    match b.get(off..off + 2) {
        Some(s) => u16::from_le_bytes([s[0], s[1]]),
        None => 0,
    }
}

#[inline]
fn le32(b: &[u8], off: usize) -> u32 {
    match b.get(off..off + 4) {
        Some(s) => u32::from_le_bytes([s[0], s[1], s[2], s[3]]),
        None => 0,
    }
}

/// The validated shape of a PDU from its common header alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    /// The type.
    pub ty: PduType,
    /// Flags.
    pub flags: u8,
    /// Total length.
    pub plen: usize,
    /// Offset of the data (meaningful when `data_len > 0`).
    pub pdo: usize,
    /// Data length, excluding a data digest.
    pub data_len: usize,
}

/// Validates a common header (the first 8 bytes of `ch`) against `cfg`, in the order the
/// specification asks errors to be reported. Needs only the common header, so a hostile
/// `plen` is refused before any of its bytes are waited for.
pub fn validate_header(ch: &[u8; CH_LEN], cfg: &RxConfig) -> Result<Frame, DecodeError> {
    let (type_byte, flags, hlen, pdo) = (ch[0], ch[1], ch[2] as usize, ch[3] as usize);
    let plen = le32(ch, 4) as usize;

    // Type: direction, then state.
    let to_controller = type_byte & 1 == 0;
    if to_controller != (cfg.role == Role::Controller) {
        return Err(Violation::field(0, "PDU type of the wrong direction").into());
    }
    let ty = PduType::from_u8(type_byte).ok_or(Violation::field(0, "unknown PDU type"))?;
    let is_ic = matches!(ty, PduType::IcReq | PduType::IcResp);
    let is_term = matches!(ty, PduType::H2cTermReq | PduType::C2hTermReq);
    if is_term {
        if !(TERM_HLEN..=TERM_MAX_PLEN).contains(&plen) {
            return Err(DecodeError::Reset);
        }
    } else if is_ic && cfg.established {
        return Err(Violation::field(0, "initialize-connection PDU on an established connection").into());
    } else if !is_ic && !cfg.established {
        return Err(Violation::new(Fes::PduSequenceError, 0, "PDU before connection initialisation").into());
    }

    // Flags.
    let valid = ty.valid_flags();
    if flags & !valid != 0 {
        return Err(Violation::field(1, "flag not valid for this PDU type").into());
    }
    let full_hlen = hlen + if flags & FLAG_HDGSTF != 0 { DIGEST_LEN } else { 0 };
    let raw_data_len = if plen == full_hlen { 0 } else { plen.saturating_sub(pdo) };
    let mut want = 0;
    if cfg.hdgst {
        want |= FLAG_HDGSTF;
    }
    if cfg.ddgst && raw_data_len != 0 {
        want |= FLAG_DDGSTF;
    }
    if want & valid != flags & (FLAG_HDGSTF | FLAG_DDGSTF) {
        return Err(Violation::field(1, "digest flags differ from what was negotiated").into());
    }
    if ty == PduType::C2hData && flags & (FLAG_LAST | FLAG_SUCCESS) == FLAG_SUCCESS {
        return Err(Violation::field(1, "C2HData SUCCESS without LAST").into());
    }

    // hlen.
    if hlen != ty.hlen() {
        return Err(Violation::field(2, "header length differs from the fixed length of this type").into());
    }

    // pdo.
    if ty.carries_data() {
        let no_data = raw_data_len == 0 && pdo == 0;
        if !no_data && (pdo < full_hlen || pdo > plen || cfg.pda == 0 || pdo % cfg.pda as usize != 0) {
            return Err(Violation::field(3, "data offset inside the header, past the PDU, or misaligned").into());
        }
    } else if pdo != 0 {
        return Err(Violation::field(3, "data offset on a PDU type without data").into());
    }

    // plen.
    if plen < full_hlen {
        return Err(Violation::field(4, "PDU length shorter than its header").into());
    }
    if is_ic && plen != IC_LEN {
        return Err(Violation::field(4, "initialize-connection PDU length is not 128").into());
    }
    let mut data_len = raw_data_len;
    if ty.carries_data() {
        if flags & FLAG_DDGSTF != 0 {
            if data_len <= DIGEST_LEN {
                return Err(Violation::field(4, "PDU too short for its data digest").into());
            }
            data_len -= DIGEST_LEN;
        }
        let limit = match ty {
            PduType::CapsuleCmd => cfg.max_icd,
            _ => cfg.max_data,
        } as usize;
        if data_len > limit {
            return Err(match ty {
                PduType::CapsuleCmd => Violation::new(Fes::DataOutOfRange, 0, "in-capsule data larger than IOCCSZ"),
                _ => Violation::new(Fes::DataLimitExceeded, 0, "data PDU larger than the negotiated maximum"),
            }
            .into());
        }
    } else if !is_term && !is_ic && plen != full_hlen {
        return Err(Violation::field(4, "PDU length does not match a PDU type without data").into());
    }
    Ok(Frame { ty, flags, plen, pdo, data_len })
}

/// Decodes one PDU from the front of `buf`.
///
/// Returns [`DecodeError::Incomplete`] with the number of bytes needed when `buf` holds
/// less than a whole PDU (after validating the common header, so a bad header is
/// reported as soon as its 8 bytes are in).
pub fn decode<'a>(buf: &'a [u8], cfg: &RxConfig) -> Result<Decoded<'a>, DecodeError> {
    let Some(ch) = buf.first_chunk::<CH_LEN>() else {
        return Err(DecodeError::Incomplete(CH_LEN));
    };
    let frame = validate_header(ch, cfg)?;
    let Some(pdu_bytes) = buf.get(..frame.plen) else {
        return Err(DecodeError::Incomplete(frame.plen));
    };
    let hlen = frame.ty.hlen();
    if frame.flags & FLAG_HDGSTF != 0 {
        let want = le32(pdu_bytes, hlen);
        if digest::crc32c(&pdu_bytes[..hlen]) != want {
            return Err(Violation::new(Fes::HeaderDigestError, 0, "header digest mismatch").into());
        }
    }
    let data = if frame.data_len == 0 { &[][..] } else { &pdu_bytes[frame.pdo..frame.pdo + frame.data_len] };
    let ddgst_ok = if frame.flags & FLAG_DDGSTF != 0 {
        digest::crc32c(data) == le32(pdu_bytes, frame.pdo + frame.data_len)
    } else {
        true
    };
    let h = pdu_bytes;
    let pdu = match frame.ty {
        PduType::IcReq => Pdu::IcReq(IcReq {
            pfv: le16(h, 8),
            hpda: h[10],
            hdgst: h[11] & 1 != 0,
            ddgst: h[11] & 2 != 0,
            maxr2t: le32(h, 12),
        }),
        PduType::IcResp => Pdu::IcResp(IcResp {
            pfv: le16(h, 8),
            cpda: h[10],
            hdgst: h[11] & 1 != 0,
            ddgst: h[11] & 2 != 0,
            maxh2cdata: le32(h, 12),
        }),
        PduType::H2cTermReq | PduType::C2hTermReq => Pdu::TermReq { fes: le16(h, 8), fei: le32(h, 10) },
        PduType::CapsuleCmd => {
            let mut sqe = [0u8; 64];
            sqe.copy_from_slice(&h[8..72]);
            Pdu::CapsuleCmd { sqe: crate::proto::cmd::Sqe(sqe), data, ddgst_ok }
        }
        PduType::CapsuleResp => {
            let mut cqe = [0u8; 16];
            cqe.copy_from_slice(&h[8..24]);
            Pdu::CapsuleResp { cqe: crate::proto::cmd::Cqe::from_bytes(&cqe) }
        }
        PduType::H2cData => Pdu::H2cData(H2cData {
            cccid: le16(h, 8),
            ttag: le16(h, 10),
            datao: le32(h, 12),
            last: frame.flags & FLAG_LAST != 0,
            data,
            ddgst_ok,
        }),
        PduType::C2hData => Pdu::C2hData {
            cccid: le16(h, 8),
            datao: le32(h, 12),
            last: frame.flags & FLAG_LAST != 0,
            success: frame.flags & FLAG_SUCCESS != 0,
            data,
            ddgst_ok,
        },
        PduType::R2t => Pdu::R2t { cccid: le16(h, 8), ttag: le16(h, 10), r2to: le32(h, 12), r2tl: le32(h, 16) },
    };
    // The datal field of a data PDU must agree with the length framing implies.
    if let PduType::H2cData | PduType::C2hData = frame.ty {
        let datal = le32(h, 16) as usize;
        if datal != frame.data_len {
            return Err(Violation::field(16, "DATAL differs from the data the PDU carries").into());
        }
    }
    Ok(Decoded { pdu, len: frame.plen })
}

/// The bytes of a PDU to quote in a termination request: its header as far as it is
/// in `buf` (at least the common header).
pub fn offending_header(buf: &[u8]) -> &[u8] {
    let hlen = buf.get(2).map_or(CH_LEN, |&h| usize::from(h).max(CH_LEN));
    &buf[..buf.len().min(hlen)]
}

/// PDUs waiting to be sent: appended at the back, sent from the front.
#[derive(Debug, Default)]
pub struct OutBuf {
    buf: Vec<u8>,
    sent: usize,
}

impl OutBuf {
    /// An empty buffer with room for `cap` bytes.
    pub fn with_capacity(cap: usize) -> OutBuf {
        OutBuf { buf: Vec::with_capacity(cap), sent: 0 }
    }

    /// Bytes not sent yet.
    pub fn pending(&self) -> &[u8] {
        &self.buf[self.sent..]
    }

    /// Marks `n` pending bytes as sent; the storage is reused once all are.
    pub fn advance(&mut self, n: usize) {
        self.sent = (self.sent + n).min(self.buf.len());
        if self.sent == self.buf.len() {
            self.buf.clear();
            self.sent = 0;
        }
    }

    /// The vector to append PDUs to (the `TxConfig` emitters take it).
    pub fn vec(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }
}

/// What a sender has negotiated: digests and the data alignment the peer asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxConfig {
    /// Append header digests.
    pub hdgst: bool,
    /// Append data digests.
    pub ddgst: bool,
    /// Data alignment the receiver requires, bytes ((pda + 1) * 4).
    pub pda: u32,
}

impl Default for TxConfig {
    fn default() -> Self {
        Self { hdgst: false, ddgst: false, pda: 4 }
    }
}

impl TxConfig {
    /// Data offset for a header of `hlen` bytes.
    fn pdo(&self, hlen: usize) -> usize {
        let full = hlen + if self.hdgst { DIGEST_LEN } else { 0 };
        let a = self.pda.max(1) as usize;
        full.div_ceil(a) * a
    }

    /// Appends a PDU's header, header digest and padding, up to where its data starts
    /// (the common header already carries `plen` for `data_len` bytes of data). Returns
    /// whether a data digest must follow the data.
    fn emit_header(
        &self,
        out: &mut Vec<u8>,
        ty: PduType,
        extra_flags: u8,
        psh: impl FnOnce(&mut [u8]),
        data_len: usize,
    ) -> bool {
        let hlen = ty.hlen();
        let start = out.len();
        let has_data = data_len > 0;
        let mut flags = extra_flags;
        if self.hdgst && !matches!(ty, PduType::IcReq | PduType::IcResp | PduType::H2cTermReq | PduType::C2hTermReq) {
            flags |= FLAG_HDGSTF;
        }
        let ddgst = self.ddgst && has_data;
        if ddgst {
            flags |= FLAG_DDGSTF;
        }
        let hd = if flags & FLAG_HDGSTF != 0 { DIGEST_LEN } else { 0 };
        let pdo = if has_data { self.pdo(hlen) } else { 0 };
        let plen = if has_data { pdo + data_len + if ddgst { DIGEST_LEN } else { 0 } } else { hlen + hd };
        out.resize(start + if has_data { pdo } else { plen }, 0);
        let p = &mut out[start..];
        p[0] = ty as u8;
        p[1] = flags;
        p[2] = hlen as u8;
        p[3] = pdo as u8;
        p[4..8].copy_from_slice(&(plen as u32).to_le_bytes());
        psh(&mut p[8..hlen]);
        if hd != 0 {
            let d = digest::crc32c(&p[..hlen]);
            p[hlen..hlen + 4].copy_from_slice(&d.to_le_bytes());
        }
        ddgst
    }

    /// Appends a PDU whose type-specific header is written by `psh` (bytes 8..hlen of the
    /// header) and whose `data_len` bytes of data are written in place by `fill` (e.g.
    /// straight from storage). Returns what `fill` returned.
    pub fn emit_with<R>(
        &self,
        out: &mut Vec<u8>,
        ty: PduType,
        extra_flags: u8,
        psh: impl FnOnce(&mut [u8]),
        data_len: usize,
        fill: impl FnOnce(&mut [u8]) -> R,
    ) -> R {
        let ddgst = self.emit_header(out, ty, extra_flags, psh, data_len);
        let at = out.len();
        out.resize(at + data_len, 0);
        let r = fill(&mut out[at..]);
        if ddgst {
            let d = digest::crc32c(&out[at..]);
            out.extend_from_slice(&d.to_le_bytes());
        }
        r
    }

    /// Appends a PDU carrying `data` (copied once, with no zero-fill first).
    fn emit_slice(&self, out: &mut Vec<u8>, ty: PduType, extra_flags: u8, psh: impl FnOnce(&mut [u8]), data: &[u8]) {
        let ddgst = self.emit_header(out, ty, extra_flags, psh, data.len());
        out.extend_from_slice(data);
        if ddgst {
            out.extend_from_slice(&digest::crc32c(data).to_le_bytes());
        }
    }

    /// Appends ICReq.
    pub fn ic_req(out: &mut Vec<u8>, p: &IcReq) {
        TxConfig::default().emit_with(
            out,
            PduType::IcReq,
            0,
            |h| {
                h[0..2].copy_from_slice(&p.pfv.to_le_bytes());
                h[2] = p.hpda;
                h[3] = u8::from(p.hdgst) | (u8::from(p.ddgst) << 1);
                h[4..8].copy_from_slice(&p.maxr2t.to_le_bytes());
            },
            0,
            |_| (),
        )
    }

    /// Appends ICResp.
    pub fn ic_resp(out: &mut Vec<u8>, p: &IcResp) {
        TxConfig::default().emit_with(
            out,
            PduType::IcResp,
            0,
            |h| {
                h[0..2].copy_from_slice(&p.pfv.to_le_bytes());
                h[2] = p.cpda;
                h[3] = u8::from(p.hdgst) | (u8::from(p.ddgst) << 1);
                h[4..8].copy_from_slice(&p.maxh2cdata.to_le_bytes());
            },
            0,
            |_| (),
        )
    }

    /// Appends a termination request of `role`'s direction (a controller sends C2H), with
    /// up to 128 bytes of the offending PDU header.
    pub fn term_req(out: &mut Vec<u8>, sender: Role, fes: Fes, fei: u32, offending: &[u8]) {
        let ty = match sender {
            Role::Controller => PduType::C2hTermReq,
            Role::Host => PduType::H2cTermReq,
        };
        let copy = &offending[..offending.len().min(TERM_MAX_PLEN - TERM_HLEN)];
        let start = out.len();
        out.resize(start + TERM_HLEN, 0);
        let p = &mut out[start..];
        p[0] = ty as u8;
        p[2] = TERM_HLEN as u8;
        p[4..8].copy_from_slice(&((TERM_HLEN + copy.len()) as u32).to_le_bytes());
        p[8..10].copy_from_slice(&(fes as u16).to_le_bytes());
        p[10..14].copy_from_slice(&fei.to_le_bytes());
        out.extend_from_slice(copy);
    }

    /// Appends a command capsule with in-capsule `data` (may be empty).
    pub fn capsule_cmd(&self, out: &mut Vec<u8>, sqe: &crate::proto::cmd::Sqe, data: &[u8]) {
        self.emit_with(
            out,
            PduType::CapsuleCmd,
            0,
            |h| h.copy_from_slice(&sqe.0),
            data.len(),
            |d| d.copy_from_slice(data),
        )
    }

    /// Appends a response capsule.
    pub fn capsule_resp(&self, out: &mut Vec<u8>, cqe: &crate::proto::cmd::Cqe) {
        self.emit_with(out, PduType::CapsuleResp, 0, |h| h.copy_from_slice(&cqe.to_bytes()), 0, |_| ())
    }

    /// Appends an R2T.
    pub fn r2t(&self, out: &mut Vec<u8>, cccid: u16, ttag: u16, r2to: u32, r2tl: u32) {
        self.emit_with(
            out,
            PduType::R2t,
            0,
            |h| {
                h[0..2].copy_from_slice(&cccid.to_le_bytes());
                h[2..4].copy_from_slice(&ttag.to_le_bytes());
                h[4..8].copy_from_slice(&r2to.to_le_bytes());
                h[8..12].copy_from_slice(&r2tl.to_le_bytes());
            },
            0,
            |_| (),
        )
    }

    /// Appends an H2CData PDU carrying `data` at offset `datao`.
    pub fn h2c_data(&self, out: &mut Vec<u8>, cccid: u16, ttag: u16, datao: u32, data: &[u8], last: bool) {
        let flags = if last { FLAG_LAST } else { 0 };
        self.emit_slice(out, PduType::H2cData, flags, |h| data_psh(h, cccid, ttag, datao, data.len()), data)
    }

    /// Appends a C2HData PDU of `len` bytes at offset `datao`, the data written in place
    /// by `fill` (e.g. straight from the namespace). Returns what `fill` returned.
    #[allow(clippy::too_many_arguments)]
    pub fn c2h_data_with<R>(
        &self,
        out: &mut Vec<u8>,
        cccid: u16,
        datao: u32,
        len: usize,
        last: bool,
        success: bool,
        fill: impl FnOnce(&mut [u8]) -> R,
    ) -> R {
        let mut flags = if last { FLAG_LAST } else { 0 };
        if success && last {
            flags |= FLAG_SUCCESS;
        }
        self.emit_with(out, PduType::C2hData, flags, |h| data_psh(h, cccid, 0, datao, len), len, fill)
    }
}

fn data_psh(h: &mut [u8], cccid: u16, ttag: u16, datao: u32, datal: usize) {
    h[0..2].copy_from_slice(&cccid.to_le_bytes());
    h[2..4].copy_from_slice(&ttag.to_le_bytes());
    h[4..8].copy_from_slice(&datao.to_le_bytes());
    h[8..12].copy_from_slice(&(datal as u32).to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::cmd::{Cqe, Sqe, Status};

    fn est(role: Role, hdgst: bool, ddgst: bool) -> RxConfig {
        RxConfig { role, established: true, hdgst, ddgst, pda: 4, max_icd: 8192, max_data: 131072 }
    }

    #[test]
    fn ic_req_round_trip_is_128_bytes() {
        let mut out = Vec::new();
        let p = IcReq { pfv: 0, hpda: 0, hdgst: true, ddgst: false, maxr2t: 3 };
        TxConfig::ic_req(&mut out, &p);
        assert_eq!(out.len(), 128);
        assert_eq!(&out[..8], &[0, 0, 128, 0, 128, 0, 0, 0]);
        let d = decode(&out, &RxConfig::initial(Role::Controller)).unwrap();
        assert_eq!(d.len, 128);
        assert_eq!(d.pdu, Pdu::IcReq(p));
    }

    #[test]
    fn capsule_with_digests_round_trips_and_detects_corruption() {
        for (hd, dd) in [(false, false), (true, false), (false, true), (true, true)] {
            let tx = TxConfig { hdgst: hd, ddgst: dd, pda: 4 };
            let mut sqe = Sqe::default();
            sqe.set_opcode(0x01);
            sqe.set_cid(7);
            let data: Vec<u8> = (0..100u8).collect();
            let mut out = Vec::new();
            tx.capsule_cmd(&mut out, &sqe, &data);
            let want = 72 + if hd { 4 } else { 0 } + 100 + if dd { 4 } else { 0 };
            assert_eq!(out.len(), want);
            let cfg = est(Role::Controller, hd, dd);
            let d = decode(&out, &cfg).unwrap();
            match d.pdu {
                Pdu::CapsuleCmd { sqe: s, data: got, ddgst_ok } => {
                    assert_eq!(s.cid(), 7);
                    assert_eq!(got, &data[..]);
                    assert!(ddgst_ok);
                }
                other => panic!("{other:?}"),
            }
            // Every strict prefix is incomplete, never an error or a panic.
            for n in 8..out.len() {
                assert!(matches!(decode(&out[..n], &cfg), Err(DecodeError::Incomplete(_))), "prefix {n}");
            }
            if hd {
                let mut bad = out.clone();
                bad[20] ^= 1;
                assert_eq!(
                    decode(&bad, &cfg).unwrap_err(),
                    DecodeError::Violation(Violation::new(Fes::HeaderDigestError, 0, "header digest mismatch"))
                );
            }
            if dd {
                let mut bad = out.clone();
                let n = bad.len();
                bad[n - 10] ^= 1;
                assert!(matches!(decode(&bad, &cfg).unwrap().pdu, Pdu::CapsuleCmd { ddgst_ok: false, .. }));
            }
        }
    }

    #[test]
    fn digest_flag_mismatch_is_invalid_field_1() {
        let mut out = Vec::new();
        TxConfig::default().capsule_resp(&mut out, &Cqe { cid: 1, status: Status::SUCCESS, ..Cqe::default() });
        let err = decode(&out, &est(Role::Host, true, false)).unwrap_err();
        assert!(matches!(err, DecodeError::Violation(Violation { fes: Fes::InvalidHeaderField, fei: 1, .. })));
    }

    #[test]
    fn header_fields_are_checked_in_order() {
        let cfg = est(Role::Controller, false, false);
        let mut sqe_pdu = Vec::new();
        TxConfig::default().capsule_cmd(&mut sqe_pdu, &Sqe::default(), &[]);
        let fei = |b: &[u8]| match decode(b, &cfg) {
            Err(DecodeError::Violation(v)) => (v.fes, v.fei),
            other => panic!("{other:?}"),
        };
        let mut b = sqe_pdu.clone();
        b[0] = 0x05; // a controller-to-host type sent to a controller
        assert_eq!(fei(&b), (Fes::InvalidHeaderField, 0));
        let mut b = sqe_pdu.clone();
        b[0] = 0x0a; // unknown even type
        assert_eq!(fei(&b), (Fes::InvalidHeaderField, 0));
        let mut b = sqe_pdu.clone();
        b[1] = FLAG_LAST;
        assert_eq!(fei(&b), (Fes::InvalidHeaderField, 1));
        let mut b = sqe_pdu.clone();
        b[2] = 18; // hlen in dwords: wrong
        assert_eq!(fei(&b), (Fes::InvalidHeaderField, 2));
        let mut b = sqe_pdu.clone();
        b[4] = 80; // plen with 8 bytes of data but pdo 0
        assert_eq!(fei(&b), (Fes::InvalidHeaderField, 3));
        let mut b = sqe_pdu.clone();
        b[4] = 60; // plen shorter than the header: the pdo check sees it first
        assert_eq!(fei(&b), (Fes::InvalidHeaderField, 3));
        let dd = RxConfig { ddgst: true, ..cfg };
        let mut b = sqe_pdu.clone();
        b[1] = FLAG_DDGSTF;
        b[3] = 72;
        b[4] = 75; // three bytes: too short to hold a data digest
        b.resize(75, 0);
        assert!(matches!(decode(&b, &dd), Err(DecodeError::Violation(Violation { fei: 4, .. }))));
        let mut b = sqe_pdu.clone();
        b[0] = 0x00; // ICReq on an established connection
        assert_eq!(fei(&b), (Fes::InvalidHeaderField, 0));
        let b = sqe_pdu.clone();
        let pre = RxConfig::initial(Role::Controller);
        assert!(matches!(decode(&b, &pre), Err(DecodeError::Violation(Violation { fes: Fes::PduSequenceError, .. }))));
    }

    #[test]
    fn oversized_data_is_refused_from_the_header_alone() {
        let cfg = est(Role::Controller, false, false);
        let mut b = Vec::new();
        TxConfig::default().h2c_data(&mut b, 1, 2, 0, &[1, 2, 3, 4], true);
        b[4..8].copy_from_slice(&(24u32 + 200_000).to_le_bytes());
        b[3] = 24;
        assert!(matches!(
            decode(&b[..8], &cfg),
            Err(DecodeError::Violation(Violation { fes: Fes::DataLimitExceeded, .. }))
        ));
        let mut c = Vec::new();
        TxConfig::default().capsule_cmd(&mut c, &Sqe::default(), &vec![0; 9000]);
        assert!(matches!(
            decode(&c[..8], &cfg),
            Err(DecodeError::Violation(Violation { fes: Fes::DataOutOfRange, .. }))
        ));
    }

    #[test]
    fn term_req_bad_length_resets() {
        let mut b = Vec::new();
        TxConfig::term_req(&mut b, Role::Host, Fes::PduSequenceError, 0, &[0; 200]);
        assert_eq!(b.len(), TERM_MAX_PLEN);
        assert!(matches!(decode(&b, &est(Role::Controller, false, false)).unwrap().pdu, Pdu::TermReq { fes: 2, .. }));
        b[4] = 200;
        assert_eq!(decode(&b, &est(Role::Controller, false, false)), Err(DecodeError::Reset));
    }

    #[test]
    fn c2h_success_requires_last_and_aligned_pdo() {
        let tx = TxConfig { hdgst: true, ddgst: true, pda: 16 };
        let mut b = Vec::new();
        tx.c2h_data_with(&mut b, 3, 0, 10, true, true, |d| d.fill(0xab));
        assert_eq!(b[3], 32, "pdo rounds 24+4 up to 16-byte alignment");
        let cfg = RxConfig { pda: 16, ..est(Role::Host, true, true) };
        match decode(&b, &cfg).unwrap().pdu {
            Pdu::C2hData { cccid: 3, last: true, success: true, data, ddgst_ok: true, .. } => {
                assert_eq!(data, &[0xab; 10])
            }
            other => panic!("{other:?}"),
        }
        let mut bad = b.clone();
        bad[1] &= !FLAG_LAST;
        assert!(matches!(decode(&bad, &cfg), Err(DecodeError::Violation(Violation { fei: 1, .. }))));
    }

    #[test]
    fn datal_must_match_framing() {
        let cfg = est(Role::Controller, false, false);
        let mut b = Vec::new();
        TxConfig::default().h2c_data(&mut b, 1, 2, 0, &[9; 16], true);
        b[16] = 15;
        assert!(matches!(decode(&b, &cfg), Err(DecodeError::Violation(Violation { fei: 16, .. }))));
    }

    proptest::proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..400),
                               hd: bool, dd: bool, est_: bool, host: bool) {
            let cfg = RxConfig {
                role: if host { Role::Host } else { Role::Controller },
                established: est_, hdgst: hd, ddgst: dd, pda: 4, max_icd: 8192, max_data: 65536,
            };
            if let Ok(d) = decode(&bytes, &cfg) {
                proptest::prop_assert!(d.len <= bytes.len() && d.len >= 8);
            }
        }
    }
}

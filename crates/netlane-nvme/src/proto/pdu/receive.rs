//! The receiving side: what a receiver has negotiated, the common header validated in
//! the order the specification asks errors to be reported, and one PDU decoded from the
//! front of a buffer.

use super::{
    CH_LEN, DIGEST_LEN, DecodeError, Decoded, FLAG_DDGSTF, FLAG_HDGSTF, FLAG_LAST, FLAG_SUCCESS, Fes, H2cData, IC_LEN,
    IcReq, IcResp, Pdu, PduType, Role, TERM_HLEN, TERM_MAX_PLEN, Violation,
};
use crate::proto::digest;

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

//! The sending side: PDUs appended to an output buffer with the negotiated digests and
//! data alignment, and the buffer they wait in until sent.

use super::{
    DIGEST_LEN, FLAG_DDGSTF, FLAG_HDGSTF, FLAG_LAST, FLAG_SUCCESS, Fes, IcReq, IcResp, PduType, Role, TERM_HLEN,
    TERM_MAX_PLEN,
};
use crate::proto::digest;

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

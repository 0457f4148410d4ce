//! The PDUs as [`decode`](super::decode) returns them: one variant per PDU type, the
//! initialize-connection parameters, and a received H2CData PDU.

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

//! NVMe submission and completion queue entries, SGL descriptors and status codes
//! (NVMe Base Specification 2.0, sections 4.1, 4.3, 4.6).

/// Admin opcodes netlane implements.
pub mod admin {
    /// Get Log Page.
    pub const GET_LOG_PAGE: u8 = 0x02;
    /// Identify.
    pub const IDENTIFY: u8 = 0x06;
    /// Set Features.
    pub const SET_FEATURES: u8 = 0x09;
    /// Get Features.
    pub const GET_FEATURES: u8 = 0x0a;
    /// Asynchronous Event Request.
    pub const ASYNC_EVENT: u8 = 0x0c;
    /// Keep Alive.
    pub const KEEP_ALIVE: u8 = 0x18;
}

/// NVM command set opcodes netlane implements.
pub mod nvm {
    /// Flush.
    pub const FLUSH: u8 = 0x00;
    /// Write.
    pub const WRITE: u8 = 0x01;
    /// Read.
    pub const READ: u8 = 0x02;
    /// Compare.
    pub const COMPARE: u8 = 0x05;
    /// Write Zeroes.
    pub const WRITE_ZEROES: u8 = 0x08;
    /// Dataset Management.
    pub const DSM: u8 = 0x09;
    /// Verify.
    pub const VERIFY: u8 = 0x0c;
}

/// The Fabrics command opcode; the command type is in byte 4.
pub const FABRICS: u8 = 0x7f;

/// PSDT value in SQE byte 1 for "SGL for data, metadata buffer" (bits 7:6 = 01).
pub const PSDT_SGL: u8 = 0x40;

/// SGL descriptor identifier: data block, offset subtype (in-capsule data).
pub const SGL_ICD: u8 = 0x01;
/// SGL descriptor identifier: transport data block, transport-specific subtype (data
/// moved by R2T/H2CData or C2HData).
pub const SGL_TRANSPORT: u8 = 0x5a;

/// Direction of a command's data transfer, from opcode bits 1:0 (or the Fabrics command
/// type's bits 1:0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataDir {
    /// No data.
    None,
    /// Host to controller.
    ToController,
    /// Controller to host.
    ToHost,
    /// Both (not used by any command here).
    Both,
}

impl DataDir {
    /// The direction encoded in the low two bits of `code`.
    pub fn from_code(code: u8) -> Self {
        match code & 3 {
            0 => Self::None,
            1 => Self::ToController,
            2 => Self::ToHost,
            _ => Self::Both,
        }
    }
}

/// An SGL descriptor (16 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SglDesc {
    /// Address (for in-capsule data: the offset into the capsule data).
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Descriptor identifier: `(type << 4) | subtype`.
    pub id: u8,
}

/// A 64-byte submission queue entry, as raw little-endian bytes with typed accessors.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Sqe(pub [u8; 64]);

impl Default for Sqe {
    fn default() -> Self {
        Sqe([0; 64])
    }
}

impl std::fmt::Debug for Sqe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sqe")
            .field("opcode", &format_args!("{:#04x}", self.opcode()))
            .field("cid", &self.cid())
            .field("nsid", &self.nsid())
            .field("sgl", &self.sgl())
            .field("cdw10", &format_args!("{:#x}", self.cdw(10)))
            .finish()
    }
}

impl Sqe {
    fn u16_at(&self, off: usize) -> u16 {
        u16::from_le_bytes([self.0[off], self.0[off + 1]])
    }
    fn u32_at(&self, off: usize) -> u32 {
        u32::from_le_bytes([self.0[off], self.0[off + 1], self.0[off + 2], self.0[off + 3]])
    }
    fn put(&mut self, off: usize, b: &[u8]) {
        self.0[off..off + b.len()].copy_from_slice(b);
    }

    /// Opcode (byte 0).
    pub fn opcode(&self) -> u8 {
        self.0[0]
    }
    /// Sets the opcode.
    pub fn set_opcode(&mut self, op: u8) {
        self.0[0] = op;
    }
    /// Flags (byte 1: FUSE bits 1:0, PSDT bits 7:6).
    pub fn flags(&self) -> u8 {
        self.0[1]
    }
    /// Sets the flags byte.
    pub fn set_flags(&mut self, f: u8) {
        self.0[1] = f;
    }
    /// Command identifier.
    pub fn cid(&self) -> u16 {
        self.u16_at(2)
    }
    /// Sets the command identifier.
    pub fn set_cid(&mut self, cid: u16) {
        self.put(2, &cid.to_le_bytes());
    }
    /// Namespace identifier.
    pub fn nsid(&self) -> u32 {
        self.u32_at(4)
    }
    /// Sets the namespace identifier.
    pub fn set_nsid(&mut self, nsid: u32) {
        self.put(4, &nsid.to_le_bytes());
    }
    /// Fabrics command type (byte 4 of a Fabrics command).
    pub fn fctype(&self) -> u8 {
        self.0[4]
    }
    /// Command dword `n` (10..=15 are at 40 + 4 * (n - 10); 0..=15 all addressable).
    pub fn cdw(&self, n: usize) -> u32 {
        self.u32_at((n % 16) * 4)
    }
    /// Sets command dword `n`.
    pub fn set_cdw(&mut self, n: usize, v: u32) {
        self.put((n % 16) * 4, &v.to_le_bytes());
    }
    /// The first SGL descriptor (bytes 24..40).
    pub fn sgl(&self) -> SglDesc {
        let b = &self.0[24..40];
        SglDesc {
            addr: u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
            len: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
            id: b[15],
        }
    }
    /// Sets the first SGL descriptor and marks the command as using SGLs.
    pub fn set_sgl(&mut self, d: SglDesc) {
        self.0[1] = (self.0[1] & 0x3f) | PSDT_SGL;
        self.put(24, &d.addr.to_le_bytes());
        self.put(32, &d.len.to_le_bytes());
        self.0[36..39].fill(0);
        self.0[39] = d.id;
    }
    /// The direction of this command's data.
    pub fn data_dir(&self) -> DataDir {
        if self.opcode() == FABRICS { DataDir::from_code(self.fctype()) } else { DataDir::from_code(self.opcode()) }
    }
    /// Starting LBA of an NVM command (CDW10-11).
    pub fn slba(&self) -> u64 {
        u64::from(self.cdw(10)) | (u64::from(self.cdw(11)) << 32)
    }
    /// Number of logical blocks of an NVM command (CDW12 bits 15:0, 0's based, returned
    /// 1's based).
    pub fn nlb(&self) -> u32 {
        (self.cdw(12) & 0xffff) + 1
    }
    /// Sets SLBA and NLB (1's based `nlb`, 1..=65536).
    pub fn set_lba_range(&mut self, slba: u64, nlb: u32) {
        self.set_cdw(10, slba as u32);
        self.set_cdw(11, (slba >> 32) as u32);
        self.set_cdw(12, (self.cdw(12) & !0xffff) | (nlb.saturating_sub(1) & 0xffff));
    }
}

/// A completion status: Status Code Type, Status Code, More and Do Not Retry (the phase
/// bit is not part of it; fabrics completions carry phase 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Status(pub u16);

impl Status {
    /// Successful completion.
    pub const SUCCESS: Status = Status(0);
    /// Invalid Command Opcode.
    pub const INVALID_OPCODE: Status = Status::generic(0x01).dnr();
    /// Invalid Field in Command.
    pub const INVALID_FIELD: Status = Status::generic(0x02).dnr();
    /// Data Transfer Error.
    pub const DATA_XFER_ERROR: Status = Status::generic(0x04);
    /// Internal Error.
    pub const INTERNAL: Status = Status::generic(0x06);
    /// Invalid Namespace or Format.
    pub const INVALID_NS: Status = Status::generic(0x0b).dnr();
    /// Command Sequence Error.
    pub const CMD_SEQ_ERROR: Status = Status::generic(0x0c).dnr();
    /// Data SGL Length Invalid.
    pub const SGL_LENGTH_INVALID: Status = Status::generic(0x0f).dnr();
    /// SGL Descriptor Type Invalid.
    pub const SGL_TYPE_INVALID: Status = Status::generic(0x11).dnr();
    /// SGL Offset Invalid.
    pub const SGL_OFFSET_INVALID: Status = Status::generic(0x16).dnr();
    /// Transient Transport Error (e.g. a data digest error): may be retried.
    pub const TRANSIENT_TRANSPORT: Status = Status::generic(0x22);
    /// LBA Out of Range.
    pub const LBA_RANGE: Status = Status::generic(0x80).dnr();
    /// Asynchronous Event Request Limit Exceeded.
    pub const AER_LIMIT: Status = Status::cmd_specific(0x05).dnr();
    /// Invalid Log Page.
    pub const INVALID_LOG_PAGE: Status = Status::cmd_specific(0x09).dnr();
    /// Connect: Incompatible Format.
    pub const CONNECT_INCOMPATIBLE: Status = Status::cmd_specific(0x80).dnr();
    /// Connect: Controller Busy.
    pub const CONNECT_BUSY: Status = Status::cmd_specific(0x81);
    /// Connect: Invalid Parameters (DW0 says which).
    pub const CONNECT_INVALID_PARAM: Status = Status::cmd_specific(0x82).dnr();
    /// Connect: Invalid Host.
    pub const CONNECT_INVALID_HOST: Status = Status::cmd_specific(0x84).dnr();
    /// Write Fault (media error).
    pub const WRITE_FAULT: Status = Status::media(0x80);
    /// Unrecovered Read Error.
    pub const READ_ERROR: Status = Status::media(0x81);
    /// Compare Failure: the data differ.
    pub const COMPARE_FAILURE: Status = Status::media(0x85);

    const fn with(sct: u16, sc: u16) -> Status {
        Status(((sct & 7) << 8) | (sc & 0xff))
    }
    /// A generic command status (SCT 0).
    pub const fn generic(sc: u16) -> Status {
        Self::with(0, sc)
    }
    /// A command-specific status (SCT 1).
    pub const fn cmd_specific(sc: u16) -> Status {
        Self::with(1, sc)
    }
    /// A media and data integrity status (SCT 2).
    pub const fn media(sc: u16) -> Status {
        Self::with(2, sc)
    }
    /// The same status with Do Not Retry set.
    pub const fn dnr(self) -> Status {
        Status(self.0 | 0x4000)
    }
    /// Status Code Type.
    pub fn sct(self) -> u8 {
        ((self.0 >> 8) & 7) as u8
    }
    /// Status Code.
    pub fn sc(self) -> u8 {
        (self.0 & 0xff) as u8
    }
    /// Do Not Retry.
    pub fn is_dnr(self) -> bool {
        self.0 & 0x4000 != 0
    }
    /// Whether this is success.
    pub fn is_success(self) -> bool {
        self.sct() == 0 && self.sc() == 0
    }
    /// The 15-bit field as it sits in CQE bits 15:1.
    fn wire(self) -> u16 {
        self.0 << 1
    }
    fn from_wire(w: u16) -> Status {
        Status(w >> 1)
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SCT {:#x} SC {:#04x}{}", self.sct(), self.sc(), if self.is_dnr() { " DNR" } else { "" })
    }
}

/// A 16-byte completion queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cqe {
    /// Command-specific dword 0 (e.g. the CNTLID of a Connect).
    pub dw0: u32,
    /// Command-specific dword 1.
    pub dw1: u32,
    /// Submission queue head pointer.
    pub sqhd: u16,
    /// Submission queue identifier.
    pub sqid: u16,
    /// Command identifier.
    pub cid: u16,
    /// Status.
    pub status: Status,
}

impl Cqe {
    /// Encodes to the 16 wire bytes.
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..4].copy_from_slice(&self.dw0.to_le_bytes());
        b[4..8].copy_from_slice(&self.dw1.to_le_bytes());
        b[8..10].copy_from_slice(&self.sqhd.to_le_bytes());
        b[10..12].copy_from_slice(&self.sqid.to_le_bytes());
        b[12..14].copy_from_slice(&self.cid.to_le_bytes());
        b[14..16].copy_from_slice(&self.status.wire().to_le_bytes());
        b
    }
    /// Decodes the 16 wire bytes.
    pub fn from_bytes(b: &[u8; 16]) -> Cqe {
        Cqe {
            dw0: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            dw1: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            sqhd: u16::from_le_bytes([b[8], b[9]]),
            sqid: u16::from_le_bytes([b[10], b[11]]),
            cid: u16::from_le_bytes([b[12], b[13]]),
            status: Status::from_wire(u16::from_le_bytes([b[14], b[15]])),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqe_fields_sit_at_spec_offsets() {
        let mut s = Sqe::default();
        s.set_opcode(nvm::READ);
        s.set_cid(0x1234);
        s.set_nsid(1);
        s.set_sgl(SglDesc { addr: 0, len: 4096, id: SGL_TRANSPORT });
        s.set_lba_range(0x1_0000_0002, 8);
        assert_eq!(s.0[0], 2);
        assert_eq!(s.0[1], 0x40);
        assert_eq!(&s.0[2..4], &[0x34, 0x12]);
        assert_eq!(&s.0[32..36], &4096u32.to_le_bytes());
        assert_eq!(s.0[39], 0x5a);
        assert_eq!(&s.0[40..44], &2u32.to_le_bytes());
        assert_eq!(&s.0[44..48], &1u32.to_le_bytes());
        assert_eq!(&s.0[48..50], &7u16.to_le_bytes());
        assert_eq!(s.slba(), 0x1_0000_0002);
        assert_eq!(s.nlb(), 8);
        assert_eq!(s.data_dir(), DataDir::ToHost);
    }

    #[test]
    fn cqe_status_is_shifted_past_the_phase_bit() {
        let c = Cqe { dw0: 5, cid: 9, status: Status::CONNECT_INVALID_HOST, ..Cqe::default() };
        let b = c.to_bytes();
        // SCT 1, SC 0x84, DNR: bits 15 | 11:9 = 001 | 8:1 = 0x84.
        assert_eq!(u16::from_le_bytes([b[14], b[15]]), 0x8000 | (1 << 9) | (0x84 << 1));
        assert_eq!(Cqe::from_bytes(&b), c);
    }
}

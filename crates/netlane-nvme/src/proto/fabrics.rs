//! NVMe over Fabrics commands: Connect, Property Get/Set, Disconnect, and the controller
//! registers reached through properties (NVMe-oF 1.1 section 3; NVMe Base 2.0 section 3.1).

use crate::proto::cmd::{FABRICS, SGL_ICD, SglDesc, Sqe};

/// Fabrics command types (SQE byte 4).
pub mod fctype {
    /// Property Set.
    pub const PROPERTY_SET: u8 = 0x00;
    /// Connect.
    pub const CONNECT: u8 = 0x01;
    /// Property Get.
    pub const PROPERTY_GET: u8 = 0x04;
    /// Disconnect.
    pub const DISCONNECT: u8 = 0x08;
}

/// Controller register offsets reachable by Property Get/Set.
pub mod reg {
    /// Controller Capabilities (8 bytes).
    pub const CAP: u32 = 0x00;
    /// Version.
    pub const VS: u32 = 0x08;
    /// Controller Configuration.
    pub const CC: u32 = 0x14;
    /// Controller Status.
    pub const CSTS: u32 = 0x1c;
}

/// CC.EN.
pub const CC_EN: u32 = 1;
/// CC.SHN mask (bits 15:14).
pub const CC_SHN_MASK: u32 = 3 << 14;
/// CSTS.RDY.
pub const CSTS_RDY: u32 = 1;
/// CSTS.SHST = shutdown processing complete (bits 3:2 = 10b).
pub const CSTS_SHST_COMPLETE: u32 = 2 << 2;
/// CC value a host writes to enable: EN, IOSQES 6 (64 B), IOCQES 4 (16 B), NVM command set.
pub const CC_ENABLE: u32 = CC_EN | (6 << 16) | (4 << 20);
/// Connect CATTR bit 2: the host disables submission queue flow control, which lets the
/// controller use the C2HData SUCCESS optimisation.
pub const CATTR_DISABLE_SQFLOW: u8 = 1 << 2;
/// The CNTLID a host puts in an admin Connect to ask for a dynamic controller.
pub const CNTLID_DYNAMIC: u16 = 0xffff;
/// Length of the Connect command's data.
pub const CONNECT_DATA_LEN: usize = 1024;

/// The Connect command's parameters (SQE and its 1024 bytes of data).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connect {
    /// Record format (must be 0).
    pub recfmt: u16,
    /// Queue ID: 0 for the admin queue.
    pub qid: u16,
    /// Submission queue size, 0's based.
    pub sqsize: u16,
    /// Connect attributes.
    pub cattr: u8,
    /// Keep-alive timeout, milliseconds (admin queue only; 0 disables).
    pub kato_ms: u32,
    /// Host identifier.
    pub hostid: [u8; 16],
    /// Controller ID: [`CNTLID_DYNAMIC`] on the admin queue, the admin Connect's answer on
    /// I/O queues.
    pub cntlid: u16,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Host NQN.
    pub hostnqn: String,
}

/// Where a Connect parameter problem is: in the SQE or in the data (the IATTR bit of the
/// failed Connect's DW0) and at which byte offset (IPO).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidParam {
    /// True when the offset is in the Connect data, false when in the SQE.
    pub in_data: bool,
    /// Byte offset of the parameter.
    pub offset: u16,
}

impl InvalidParam {
    /// The DW0 value of the failed Connect's completion.
    pub fn dw0(self) -> u32 {
        u32::from(self.offset) | (u32::from(self.in_data) << 16)
    }
}

fn nqn_from(field: &[u8]) -> String {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

fn put_nqn(field: &mut [u8], nqn: &str) {
    let n = nqn.len().min(field.len() - 1);
    field[..n].copy_from_slice(&nqn.as_bytes()[..n]);
}

impl Connect {
    /// Reads the parameters from the SQE and the Connect data; `None` when the data is
    /// not exactly 1024 bytes.
    pub fn parse(sqe: &Sqe, data: &[u8]) -> Option<Connect> {
        if data.len() != CONNECT_DATA_LEN {
            return None;
        }
        let s = &sqe.0;
        let mut hostid = [0u8; 16];
        hostid.copy_from_slice(&data[0..16]);
        Some(Connect {
            recfmt: u16::from_le_bytes([s[40], s[41]]),
            qid: u16::from_le_bytes([s[42], s[43]]),
            sqsize: u16::from_le_bytes([s[44], s[45]]),
            cattr: s[46],
            kato_ms: u32::from_le_bytes([s[48], s[49], s[50], s[51]]),
            hostid,
            cntlid: u16::from_le_bytes([data[16], data[17]]),
            subnqn: nqn_from(&data[256..512]),
            hostnqn: nqn_from(&data[512..768]),
        })
    }

    /// The SQE (with command id `cid`) and the 1024 bytes of data, sent in-capsule.
    pub fn encode(&self, cid: u16) -> (Sqe, Vec<u8>) {
        let mut sqe = Sqe::default();
        sqe.set_opcode(FABRICS);
        sqe.set_cid(cid);
        sqe.0[4] = fctype::CONNECT;
        sqe.set_sgl(SglDesc { addr: 0, len: CONNECT_DATA_LEN as u32, id: SGL_ICD });
        sqe.0[40..42].copy_from_slice(&self.recfmt.to_le_bytes());
        sqe.0[42..44].copy_from_slice(&self.qid.to_le_bytes());
        sqe.0[44..46].copy_from_slice(&self.sqsize.to_le_bytes());
        sqe.0[46] = self.cattr;
        sqe.0[48..52].copy_from_slice(&self.kato_ms.to_le_bytes());
        let mut data = vec![0u8; CONNECT_DATA_LEN];
        data[0..16].copy_from_slice(&self.hostid);
        data[16..18].copy_from_slice(&self.cntlid.to_le_bytes());
        put_nqn(&mut data[256..512], &self.subnqn);
        put_nqn(&mut data[512..768], &self.hostnqn);
        (sqe, data)
    }
}

/// A Property Get or Set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Property {
    /// 8-byte access when true, 4-byte when false.
    pub wide: bool,
    /// Register offset.
    pub offset: u32,
    /// Value written (Set) or ignored (Get).
    pub value: u64,
}

impl Property {
    /// Reads the parameters of a Property Get/Set SQE.
    pub fn parse(sqe: &Sqe) -> Property {
        let s = &sqe.0;
        Property {
            wide: s[40] & 7 == 1,
            offset: u32::from_le_bytes([s[44], s[45], s[46], s[47]]),
            value: u64::from_le_bytes([s[48], s[49], s[50], s[51], s[52], s[53], s[54], s[55]]),
        }
    }

    /// A Property Get SQE.
    pub fn get(cid: u16, offset: u32, wide: bool) -> Sqe {
        Property { wide, offset, value: 0 }.encode(cid, fctype::PROPERTY_GET)
    }

    /// A Property Set SQE.
    pub fn set(cid: u16, offset: u32, value: u64, wide: bool) -> Sqe {
        Property { wide, offset, value }.encode(cid, fctype::PROPERTY_SET)
    }

    fn encode(&self, cid: u16, fc: u8) -> Sqe {
        let mut sqe = Sqe::default();
        sqe.set_opcode(FABRICS);
        sqe.set_cid(cid);
        sqe.0[4] = fc;
        sqe.set_sgl(SglDesc { addr: 0, len: 0, id: crate::proto::cmd::SGL_TRANSPORT });
        sqe.0[40] = u8::from(self.wide);
        sqe.0[44..48].copy_from_slice(&self.offset.to_le_bytes());
        sqe.0[48..56].copy_from_slice(&self.value.to_le_bytes());
        sqe
    }
}

/// A Disconnect SQE (closes the I/O queue it is sent on).
pub fn disconnect(cid: u16) -> Sqe {
    let mut sqe = Sqe::default();
    sqe.set_opcode(FABRICS);
    sqe.set_cid(cid);
    sqe.0[4] = fctype::DISCONNECT;
    sqe.set_sgl(SglDesc { addr: 0, len: 0, id: crate::proto::cmd::SGL_TRANSPORT });
    sqe
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_round_trips_at_spec_offsets() {
        let c = Connect {
            recfmt: 0,
            qid: 3,
            sqsize: 127,
            cattr: CATTR_DISABLE_SQFLOW,
            kato_ms: 5000,
            hostid: [7; 16],
            cntlid: 2,
            subnqn: "nqn.2026-11.io.netlane:test".into(),
            hostnqn: "nqn.2014-08.org.nvmexpress:uuid:0".into(),
        };
        let (sqe, data) = c.encode(1);
        assert_eq!(sqe.0[4], 1);
        assert_eq!(&sqe.0[42..44], &3u16.to_le_bytes());
        assert_eq!(&data[256..259], b"nqn");
        assert_eq!(Connect::parse(&sqe, &data), Some(c));
        assert_eq!(Connect::parse(&sqe, &data[..1000]), None);
    }

    #[test]
    fn property_round_trip() {
        let sqe = Property::set(4, reg::CC, u64::from(CC_ENABLE), false);
        let p = Property::parse(&sqe);
        assert_eq!((p.wide, p.offset, p.value), (false, 0x14, u64::from(CC_ENABLE)));
        assert!(Property::parse(&Property::get(1, reg::CAP, true)).wide);
    }
}

//! Identify data structures and log pages (NVMe Base 2.0 sections 5.14 and 5.17; the
//! NVM command set's Identify Namespace), built and read at the spec's byte offsets.

/// Identify CNS values.
pub mod cns {
    /// Identify Namespace.
    pub const NAMESPACE: u8 = 0x00;
    /// Identify Controller.
    pub const CONTROLLER: u8 = 0x01;
    /// Active Namespace ID list.
    pub const ACTIVE_NS_LIST: u8 = 0x02;
    /// Namespace Identification Descriptor list.
    pub const NS_DESCRIPTORS: u8 = 0x03;
    /// I/O Command Set specific Identify Controller (with CSI 0: the NVM command set's
    /// limits for Verify, Write Zeroes and Dataset Management).
    pub const IO_CONTROLLER: u8 = 0x06;
}

/// Controller types (Identify Controller CNTRLTYPE).
pub mod cntrltype {
    /// An I/O controller: namespaces, I/O queues.
    pub const IO: u8 = 1;
    /// A discovery controller: the discovery log page only.
    pub const DISCOVERY: u8 = 2;
}

/// Log page identifiers.
pub mod lid {
    /// Error Information.
    pub const ERROR: u8 = 0x01;
    /// SMART / Health Information.
    pub const SMART: u8 = 0x02;
    /// Firmware Slot Information.
    pub const FIRMWARE: u8 = 0x03;
    /// Changed Namespace List.
    pub const CHANGED_NS: u8 = 0x04;
    /// Discovery (NVMe-oF: discovery controllers only).
    pub const DISCOVERY: u8 = 0x70;
}

/// Feature identifiers.
pub mod fid {
    /// Arbitration.
    pub const ARBITRATION: u8 = 0x01;
    /// Power Management.
    pub const POWER_MGMT: u8 = 0x02;
    /// Volatile Write Cache.
    pub const VOLATILE_WC: u8 = 0x06;
    /// Number of Queues.
    pub const NUM_QUEUES: u8 = 0x07;
    /// Asynchronous Event Configuration.
    pub const ASYNC_EVENT_CONFIG: u8 = 0x0b;
    /// Keep Alive Timer.
    pub const KEEP_ALIVE: u8 = 0x0f;
}

/// Bits of Identify Controller OAES (NVMe Base 2.0, figure 275) and of Set Features
/// (Asynchronous Event Configuration) that enable the matching notices.
pub mod oaes {
    /// Namespace Attribute Notices (the Changed Namespace List log).
    pub const NS_ATTR: u32 = 1 << 8;
    /// Firmware Activation Notices.
    pub const FW_ACTIVATION: u32 = 1 << 9;
    /// The notices a host driver like Linux's enables when advertised
    /// (drivers/nvme/host/core.c, `NVME_AEN_SUPPORTED`, without ANA and discovery).
    pub const HOST_WANTS: u32 = NS_ATTR | FW_ACTIVATION;
}

/// Bits of Identify Controller ONCS: optional NVM commands (NVMe Base 2.0, figure 275).
pub mod oncs {
    /// Compare.
    pub const COMPARE: u16 = 1 << 0;
    /// Dataset Management (deallocate).
    pub const DSM: u16 = 1 << 2;
    /// Write Zeroes.
    pub const WRITE_ZEROES: u16 = 1 << 3;
    /// Verify.
    pub const VERIFY: u16 = 1 << 7;
}

/// Size of every Identify data structure.
pub const IDENTIFY_LEN: usize = 4096;

/// What Identify Controller reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerInfo {
    /// Serial number (20 ASCII characters, space padded).
    pub serial: String,
    /// Model (40 characters).
    pub model: String,
    /// Firmware revision (8 characters).
    pub firmware: String,
    /// Maximum data transfer size, as a power of two in units of 4 KiB (0 = no limit).
    pub mdts: u8,
    /// Controller ID.
    pub cntlid: u16,
    /// Version (e.g. 0x0001_0400 for 1.4).
    pub version: u32,
    /// Keep-alive granularity in units of 100 ms (must be non-zero for Linux hosts).
    pub kas: u16,
    /// Maximum outstanding commands (0 = not reported).
    pub maxcmd: u16,
    /// Number of namespaces (highest NSID).
    pub nn: u32,
    /// Asynchronous Event Request limit, 0's based.
    pub aerl: u8,
    /// Optional Asynchronous Events Supported (OAES): the notices a host may enable
    /// with Set Features (Asynchronous Event Configuration).
    pub oaes: u32,
    /// Optional NVM Command Support (ONCS): which optional I/O commands work.
    pub oncs: u16,
    /// Volatile Write Cache (VWC): bit 0 set when Flush matters.
    pub vwc: u8,
    /// Controller type ([`cntrltype`]).
    pub cntrltype: u8,
    /// I/O queue command capsule size in 16-byte units (64 B SQE + in-capsule data).
    pub ioccsz: u32,
    /// I/O queue response capsule size in 16-byte units.
    pub iorcsz: u32,
    /// Subsystem NQN.
    pub subnqn: String,
}

fn put_str(b: &mut [u8], s: &str, pad: u8) {
    b.fill(pad);
    let n = s.len().min(b.len());
    b[..n].copy_from_slice(&s.as_bytes()[..n]);
}

fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from(u32_at(b, off)) | (u64::from(u32_at(b, off + 4)) << 32)
}

fn trimmed(b: &[u8]) -> String {
    String::from_utf8_lossy(b).trim_end_matches([' ', '\0']).to_string()
}

impl ControllerInfo {
    /// The 4096-byte Identify Controller structure.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; IDENTIFY_LEN];
        put_str(&mut b[4..24], &self.serial, b' ');
        put_str(&mut b[24..64], &self.model, b' ');
        put_str(&mut b[64..72], &self.firmware, b' ');
        b[72] = 6; // RAB: recommended arbitration burst
        b[76] = 0x03; // CMIC: multiple ports/controllers may share the subsystem
        b[77] = self.mdts;
        b[78..80].copy_from_slice(&self.cntlid.to_le_bytes());
        b[80..84].copy_from_slice(&self.version.to_le_bytes());
        b[92..96].copy_from_slice(&self.oaes.to_le_bytes());
        b[111] = self.cntrltype;
        b[258] = 3; // ACL: abort command limit, 0's based
        b[259] = self.aerl;
        b[260] = 0x03; // FRMW: slot 1 read-only, one slot
        b[261] = 0x04; // LPA: extended data for Get Log Page
        b[262] = 63; // ELPE: 64 error log entries, 0's based
        b[320..322].copy_from_slice(&self.kas.to_le_bytes());
        b[512] = 0x66; // SQES: 64-byte entries
        b[513] = 0x44; // CQES: 16-byte entries
        b[514..516].copy_from_slice(&self.maxcmd.to_le_bytes());
        b[516..520].copy_from_slice(&self.nn.to_le_bytes());
        b[520..522].copy_from_slice(&self.oncs.to_le_bytes());
        b[525] = self.vwc;
        // SGLS: SGLs supported (no alignment requirement), SGL offsets in capsules.
        b[536..540].copy_from_slice(&(1u32 | (1 << 20)).to_le_bytes());
        put_str(&mut b[768..1024], &self.subnqn, 0);
        b[1792..1796].copy_from_slice(&self.ioccsz.to_le_bytes());
        b[1796..1800].copy_from_slice(&self.iorcsz.to_le_bytes());
        // ICDOFF (1800) = 0, FCATT (1802) = 0: dynamic controller model.
        b[1803] = 1; // MSDBD: one SGL descriptor
        b
    }

    /// Reads an Identify Controller structure; `None` when it is not 4096 bytes.
    pub fn parse(b: &[u8]) -> Option<ControllerInfo> {
        if b.len() != IDENTIFY_LEN {
            return None;
        }
        Some(ControllerInfo {
            serial: trimmed(&b[4..24]),
            model: trimmed(&b[24..64]),
            firmware: trimmed(&b[64..72]),
            mdts: b[77],
            cntlid: u16_at(b, 78),
            version: u32_at(b, 80),
            kas: u16_at(b, 320),
            maxcmd: u16_at(b, 514),
            nn: u32_at(b, 516),
            aerl: b[259],
            oaes: u32_at(b, 92),
            oncs: u16_at(b, 520),
            vwc: b[525],
            cntrltype: b[111],
            ioccsz: u32_at(b, 1792),
            iorcsz: u32_at(b, 1796),
            subnqn: trimmed(&b[768..1024]),
        })
    }

    /// Largest in-capsule data an I/O queue accepts, bytes.
    pub fn in_capsule_bytes(&self) -> u32 {
        self.ioccsz.saturating_mul(16).saturating_sub(64)
    }

    /// Largest transfer in bytes (`None` when unlimited), for 4 KiB minimum pages.
    pub fn max_transfer(&self) -> Option<u64> {
        (self.mdts != 0).then(|| 4096u64 << self.mdts.min(40))
    }
}

/// What Identify Namespace reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespaceInfo {
    /// Size in logical blocks.
    pub blocks: u64,
    /// Logical block size in bytes (a power of two, >= 512).
    pub block_size: u32,
    /// Namespace globally unique identifier.
    pub nguid: [u8; 16],
    /// Whether the namespace may be attached to more than one controller (NMIC bit 0).
    /// A subsystem that reports CMIC bit 1 (several controllers) must say so, or a host
    /// that connects twice (multipath) sees two namespaces with one NGUID: Linux refuses
    /// the second ("duplicate IDs in subsystem", drivers/nvme/host/core.c).
    pub shared: bool,
}

impl NamespaceInfo {
    /// The 4096-byte Identify Namespace structure.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; IDENTIFY_LEN];
        for off in [0, 8, 16] {
            b[off..off + 8].copy_from_slice(&self.blocks.to_le_bytes()); // NSZE, NCAP, NUSE
        }
        b[25] = 0; // NLBAF: one format, 0's based
        b[26] = 0; // FLBAS: format 0
        // DLFEAT: deallocated blocks read as zeroes (bits 2:0 = 001b); Write Zeroes may
        // deallocate (bit 3).
        b[33] = 0x09;
        b[30] = u8::from(self.shared); // NMIC
        b[104..120].copy_from_slice(&self.nguid);
        // LBAF0 at 128: MS = 0, LBADS = log2(block size), RP = 0.
        b[130] = self.block_size.trailing_zeros() as u8;
        b
    }

    /// Reads an Identify Namespace structure; `None` if it is malformed.
    pub fn parse(b: &[u8]) -> Option<NamespaceInfo> {
        if b.len() != IDENTIFY_LEN {
            return None;
        }
        let fmt = (b[26] & 0x0f) as usize;
        let lbads = *b.get(128 + fmt * 4 + 2)?;
        if !(9..=16).contains(&lbads) {
            return None;
        }
        let mut nguid = [0u8; 16];
        nguid.copy_from_slice(&b[104..120]);
        Some(NamespaceInfo { blocks: u64_at(b, 0), block_size: 1 << lbads, nguid, shared: b[30] & 1 != 0 })
    }

    /// The Namespace Identification Descriptor list: the NGUID (type 2) and a UUID (type
    /// 3) derived from it.
    pub fn descriptors(&self) -> Vec<u8> {
        let mut b = vec![0u8; IDENTIFY_LEN];
        b[0] = 2;
        b[1] = 16;
        b[4..20].copy_from_slice(&self.nguid);
        b[20] = 3;
        b[21] = 16;
        let mut uuid = self.nguid;
        uuid[6] = (uuid[6] & 0x0f) | 0x40; // version 4 layout
        uuid[8] = (uuid[8] & 0x3f) | 0x80; // RFC 4122 variant
        b[24..40].copy_from_slice(&uuid);
        b
    }
}

/// The Active Namespace ID list: NSIDs greater than `after`, in order.
pub fn active_ns_list(nn: u32, after: u32) -> Vec<u8> {
    let mut b = vec![0u8; IDENTIFY_LEN];
    for (i, nsid) in ((after.saturating_add(1))..=nn).take(IDENTIFY_LEN / 4).enumerate() {
        b[i * 4..i * 4 + 4].copy_from_slice(&nsid.to_le_bytes());
    }
    b
}

/// Reads an Active Namespace ID list.
pub fn parse_ns_list(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).take_while(|&n| n != 0).collect()
}

/// Counters reported in the SMART / Health log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Smart {
    /// 512-byte blocks read.
    pub sectors_read: u64,
    /// 512-byte blocks written.
    pub sectors_written: u64,
    /// Read commands completed.
    pub read_cmds: u64,
    /// Write commands completed.
    pub write_cmds: u64,
}

impl Smart {
    /// The 512-byte SMART / Health Information log page.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; 512];
        b[1..3].copy_from_slice(&(273u16 + 35).to_le_bytes()); // composite temperature, K
        b[3] = 100; // available spare %
        b[4] = 10; // available spare threshold %
        // Data units are thousands of 512-byte units, rounded up (NVMe Base 5.16.1.3).
        let units = |s: u64| s.div_ceil(1000) as u128;
        b[32..48].copy_from_slice(&units(self.sectors_read).to_le_bytes());
        b[48..64].copy_from_slice(&units(self.sectors_written).to_le_bytes());
        b[64..80].copy_from_slice(&(self.read_cmds as u128).to_le_bytes());
        b[80..96].copy_from_slice(&(self.write_cmds as u128).to_le_bytes());
        b
    }
}

/// The NVM command set's Identify Controller (CNS 06h, CSI 0): VSL, the largest Verify,
/// as a power of two in 4 KiB units like MDTS (0 = no limit); WZSL, the same for Write
/// Zeroes; DMRL, DMRSL: Dataset Management ranges per command and blocks per range
/// (0 = no limit).
pub fn nvm_controller(vsl: u8, wzsl: u8, dmrl: u8, dmrsl: u32) -> Vec<u8> {
    let mut b = vec![0u8; IDENTIFY_LEN];
    b[0] = vsl;
    b[1] = wzsl;
    b[3] = dmrl;
    b[4..8].copy_from_slice(&dmrsl.to_le_bytes());
    b
}

/// Length of the Changed Namespace List log page: 1024 NSIDs.
pub const CHANGED_NS_LEN: usize = 4096;

/// One entry of the discovery log page (NVMe-oF 1.1, figure 38): where a subsystem is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryEntry {
    /// Transport type: 3 = TCP.
    pub trtype: u8,
    /// Address family: 1 = IPv4, 2 = IPv6.
    pub adrfam: u8,
    /// Subsystem type: 2 = an NVM subsystem, 3 = this discovery subsystem.
    pub subtype: u8,
    /// Transport requirements (bit 2: SQ flow control may be disabled).
    pub treq: u8,
    /// Port ID.
    pub portid: u16,
    /// Entry flags: bit 0 DUPRETINFO (a discovery controller returning this same log;
    /// nvme-cli's connect-all does not recurse into it).
    pub eflags: u16,
    /// Transport service ID: the TCP port, as text.
    pub trsvcid: String,
    /// The subsystem's NQN.
    pub subnqn: String,
    /// Transport address: the IP address, as text.
    pub traddr: String,
}

/// Discovery entry constants.
pub mod disc {
    /// TRTYPE: TCP.
    pub const TRTYPE_TCP: u8 = 3;
    /// ADRFAM: IPv4.
    pub const ADRFAM_IPV4: u8 = 1;
    /// ADRFAM: IPv6.
    pub const ADRFAM_IPV6: u8 = 2;
    /// SUBTYPE: an NVM subsystem.
    pub const SUBTYPE_NVM: u8 = 2;
    /// SUBTYPE: the discovery subsystem answering (current discovery subsystem).
    pub const SUBTYPE_CURRENT: u8 = 3;
    /// EFLAGS bit 0: duplicate returned information.
    pub const EFLAGS_DUPRETINFO: u16 = 1;
    /// TREQ bit 2: SQ flow control disable supported (what nvmet reports for TCP).
    pub const TREQ_DISABLE_SQFLOW: u8 = 1 << 2;
    /// The well-known discovery subsystem NQN.
    pub const NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
    /// Size of the log header and of each entry.
    pub const RECORD: usize = 1024;
}

impl DiscoveryEntry {
    fn encode_into(&self, b: &mut [u8]) {
        b[0] = self.trtype;
        b[1] = self.adrfam;
        b[2] = self.subtype;
        b[3] = self.treq;
        b[4..6].copy_from_slice(&self.portid.to_le_bytes());
        b[6..8].copy_from_slice(&0xffffu16.to_le_bytes()); // CNTLID: dynamic controllers
        b[8..10].copy_from_slice(&32u16.to_le_bytes()); // ASQSZ: admin queue depth
        b[10..12].copy_from_slice(&self.eflags.to_le_bytes());
        put_str(&mut b[32..64], &self.trsvcid, 0);
        put_str(&mut b[256..512], &self.subnqn, 0);
        put_str(&mut b[512..768], &self.traddr, 0);
        // TSAS (768..1024) for TCP: SECTYPE 0, no security.
    }

    fn parse(b: &[u8]) -> DiscoveryEntry {
        DiscoveryEntry {
            trtype: b[0],
            adrfam: b[1],
            subtype: b[2],
            treq: b[3],
            portid: u16_at(b, 4),
            eflags: u16_at(b, 10),
            trsvcid: trimmed(&b[32..64]),
            subnqn: trimmed(&b[256..512]),
            traddr: trimmed(&b[512..768]),
        }
    }
}

/// The discovery log page: a 1024-byte header (GENCTR, NUMREC, RECFMT) and the entries.
pub fn discovery_log(genctr: u64, entries: &[DiscoveryEntry]) -> Vec<u8> {
    let mut b = vec![0u8; disc::RECORD * (1 + entries.len())];
    b[0..8].copy_from_slice(&genctr.to_le_bytes());
    b[8..16].copy_from_slice(&(entries.len() as u64).to_le_bytes());
    for (i, e) in entries.iter().enumerate() {
        let at = disc::RECORD * (i + 1);
        e.encode_into(&mut b[at..at + disc::RECORD]);
    }
    b
}

/// Reads a discovery log page: GENCTR and the entries present in `b` (as many of NUMREC
/// as it holds).
pub fn parse_discovery_log(b: &[u8]) -> Option<(u64, Vec<DiscoveryEntry>)> {
    if b.len() < disc::RECORD {
        return None;
    }
    let numrec = u64_at(b, 8);
    let entries = b[disc::RECORD..]
        .chunks_exact(disc::RECORD)
        .take(usize::try_from(numrec).unwrap_or(usize::MAX))
        .map(DiscoveryEntry::parse)
        .collect();
    Some((u64_at(b, 0), entries))
}

/// The 512-byte Firmware Slot Information log page, slot 1 active.
pub fn firmware_log(firmware: &str) -> Vec<u8> {
    let mut b = vec![0u8; 512];
    b[0] = 1;
    put_str(&mut b[8..16], firmware, b' ');
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> ControllerInfo {
        ControllerInfo {
            serial: "nl0001".into(),
            model: "netlane".into(),
            firmware: "0.1".into(),
            mdts: 9,
            cntlid: 3,
            version: 0x0001_0400,
            kas: 10,
            maxcmd: 128,
            nn: 2,
            aerl: 3,
            oaes: oaes::NS_ATTR,
            oncs: oncs::WRITE_ZEROES,
            vwc: 1,
            cntrltype: cntrltype::IO,
            ioccsz: (64 + 8192) / 16,
            iorcsz: 1,
            subnqn: "nqn.x".into(),
        }
    }

    #[test]
    fn controller_identify_has_the_linux_host_gates() {
        let b = info().encode();
        assert_eq!(b.len(), 4096);
        assert_eq!(u16_at(&b, 78), 3);
        assert_ne!(u16_at(&b, 320), 0, "KAS");
        assert!(u32_at(&b, 1792) >= 4, "IOCCSZ");
        assert!(u32_at(&b, 1796) >= 1, "IORCSZ");
        assert_eq!(u16_at(&b, 1800), 0, "ICDOFF");
        assert_ne!(u32_at(&b, 536) & 3, 0, "SGLS");
        assert_eq!((b[512], b[513]), (0x66, 0x44));
        assert_eq!(ControllerInfo::parse(&b), Some(info()));
        assert_eq!(info().in_capsule_bytes(), 8192);
        assert_eq!(info().max_transfer(), Some(2 << 20));
    }

    #[test]
    fn namespace_and_lists() {
        let ns = NamespaceInfo { blocks: 1000, block_size: 4096, nguid: [5; 16], shared: true };
        assert_eq!(NamespaceInfo::parse(&ns.encode()), Some(ns));
        assert_eq!(parse_ns_list(&active_ns_list(3, 0)), vec![1, 2, 3]);
        assert_eq!(parse_ns_list(&active_ns_list(3, 2)), vec![3]);
        assert_eq!(parse_ns_list(&active_ns_list(3, u32::MAX)), Vec::<u32>::new());
        let d = ns.descriptors();
        assert_eq!((d[0], d[1], d[20], d[21]), (2, 16, 3, 16));
    }

    #[test]
    fn discovery_log_round_trips_at_the_spec_offsets() {
        let e = DiscoveryEntry {
            trtype: disc::TRTYPE_TCP,
            adrfam: disc::ADRFAM_IPV4,
            subtype: disc::SUBTYPE_NVM,
            treq: disc::TREQ_DISABLE_SQFLOW,
            portid: 2,
            eflags: 0,
            trsvcid: "4420".into(),
            subnqn: "nqn.2026-11.io.netlane:t".into(),
            traddr: "10.0.2.2".into(),
        };
        let b = discovery_log(7, std::slice::from_ref(&e));
        assert_eq!(b.len(), 2048);
        assert_eq!((u64_at(&b, 0), u64_at(&b, 8), u16_at(&b, 16)), (7, 1, 0));
        assert_eq!(&b[1024 + 32..1024 + 36], b"4420");
        assert_eq!(&b[1024 + 512..1024 + 520], b"10.0.2.2");
        assert_eq!(u16_at(&b, 1024 + 6), 0xffff);
        assert_eq!(parse_discovery_log(&b), Some((7, vec![e.clone()])));
        // A short read (the header first, as nvme-cli does) has no entries.
        assert_eq!(parse_discovery_log(&b[..1024]), Some((7, vec![])));
        assert_eq!(parse_discovery_log(&b[..100]), None);
    }
}

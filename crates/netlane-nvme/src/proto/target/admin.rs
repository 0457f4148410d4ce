//! The admin and Fabrics command set: Connect (admin and I/O queues), Property
//! Get/Set, Identify, log pages, features, keep-alive and asynchronous events.

use std::sync::atomic::Ordering;

use super::Controller;
use super::queue::{Outcome, State, TargetQueue, next_sqhd};
use crate::proto::cmd::{Sqe, Status, admin};
use crate::proto::fabrics::{self, Connect, InvalidParam, Property, fctype, reg};
use crate::proto::identify::{self, ControllerInfo, cns, cntrltype, disc, fid, lid};

/// The optional asynchronous event notices this controller raises: none yet, so none
/// are advertised, and a host enables only what OAES says (Linux: nvme_enable_aen).
const OAES: u32 = 0;

/// The optional NVM commands implemented (Identify Controller ONCS).
const ONCS: u16 = identify::oncs::COMPARE | identify::oncs::DSM | identify::oncs::WRITE_ZEROES | identify::oncs::VERIFY;

/// Keep-alive timeout given to a discovery controller whose host asked for none, so an
/// abandoned one goes away (nvmet: NVMET_DISC_KATO_MS, drivers/nvme/target/nvmet.h).
const DISCOVERY_KATO_MS: u32 = 120_000;

impl TargetQueue {
    pub(super) fn connect(&mut self, sqe: &Sqe, data: &[u8], now_ns: u64) -> Outcome {
        let Some(c) = Connect::parse(sqe, data) else {
            return Outcome::Done(Status::SGL_LENGTH_INVALID, 0);
        };
        let bad =
            |in_data, offset| Outcome::Done(Status::CONNECT_INVALID_PARAM, InvalidParam { in_data, offset }.dw0());
        if c.recfmt != 0 {
            return Outcome::Done(Status::CONNECT_INCOMPATIBLE, 0);
        }
        let cfg = &self.subsys.config;
        let discovery = c.subnqn == disc::NQN;
        if c.subnqn != cfg.nqn && !discovery {
            return bad(true, 256);
        }
        if c.hostnqn.is_empty() {
            return bad(true, 512);
        }
        if c.sqsize == 0 || c.sqsize > cfg.mqes {
            return bad(false, 44);
        }
        let ctrl = if c.qid == 0 {
            if c.cntlid != fabrics::CNTLID_DYNAMIC {
                return bad(true, 16);
            }
            let kato_ms = if discovery && c.kato_ms == 0 { DISCOVERY_KATO_MS } else { c.kato_ms };
            match self.subsys.create_controller(&c.hostnqn, kato_ms, discovery) {
                Some(ctrl) => ctrl,
                None => return Outcome::Done(Status::CONNECT_BUSY, 0),
            }
        } else {
            let Some(ctrl) = self.subsys.find_controller(c.cntlid) else {
                return bad(true, 16);
            };
            if ctrl.hostnqn != c.hostnqn {
                return Outcome::Done(Status::CONNECT_INVALID_HOST, 0);
            }
            if !ctrl.ready() {
                return Outcome::Done(Status::CMD_SEQ_ERROR, 0);
            }
            if ctrl.discovery != discovery {
                return bad(true, 256);
            }
            if c.qid > ctrl.io_queues.load(Ordering::Acquire) {
                return bad(false, 42);
            }
            let Ok(mut connected) = ctrl.connected.lock() else {
                return Outcome::Done(Status::INTERNAL, 0);
            };
            match connected.get_mut(usize::from(c.qid)) {
                Some(slot) if !*slot => *slot = true,
                // A second Connect for a queue that is already connected.
                _ => return Outcome::Done(Status::CMD_SEQ_ERROR, 0),
            }
            drop(connected);
            ctrl
        };
        let cntlid = ctrl.cntlid;
        self.ctrl = Some(ctrl);
        self.qid = c.qid;
        self.sqsize = c.sqsize;
        self.sqhd = next_sqhd(0, c.sqsize);
        self.sqflow_disabled = c.cattr & fabrics::CATTR_DISABLE_SQFLOW != 0;
        self.last_keepalive_ns = now_ns;
        if c.qid != 0 {
            self.rx.max_icd = cfg.in_capsule;
        } else {
            self.rx.max_icd = cfg.admin_in_capsule;
        }
        self.state = State::Live;
        Outcome::Done(Status::SUCCESS, u32::from(cntlid))
    }

    pub(super) fn fabrics(&mut self, sqe: &Sqe) -> Outcome {
        let Some(ctrl) = self.ctrl.clone() else { return Outcome::Done(Status::CMD_SEQ_ERROR, 0) };
        match sqe.fctype() {
            fctype::CONNECT => Outcome::Done(Status::CMD_SEQ_ERROR, 0),
            fctype::DISCONNECT => Outcome::Done(Status::SUCCESS, 0),
            fctype::PROPERTY_GET if self.qid == 0 => {
                let p = Property::parse(sqe);
                let v = match (p.offset, p.wide) {
                    (reg::CAP, true) => Some(self.cap()),
                    (reg::VS, false) => Some(0x0001_0400),
                    (reg::CC, false) => Some(u64::from(ctrl.cc.load(Ordering::Acquire))),
                    (reg::CSTS, false) => Some(u64::from(ctrl.csts.load(Ordering::Acquire))),
                    (reg::CAP | reg::VS | reg::CC | reg::CSTS, _) => None,
                    // The rest of 00h..3Fh is reserved or optional under Fabrics (NVMe
                    // Base 2.0, figure 33): it reads as zero, as reserved registers do.
                    // nvme-cli 2.3 (Debian 12) `show-regs` reads every offset up to CMBSZ
                    // and gives up on any status but a plain Invalid Field (nvme.c,
                    // nvme_get_properties: the DNR bit nvmet sets makes its
                    // nvme_status_equals fail), so answering zero is what lets it work.
                    (off, _) if off < 0x40 && off.is_multiple_of(4) => Some(0),
                    _ => None,
                };
                v.map_or(Outcome::Done(Status::INVALID_FIELD, 0), Outcome::Value)
            }
            fctype::PROPERTY_SET if self.qid == 0 => {
                let p = Property::parse(sqe);
                if p.offset != reg::CC || p.wide {
                    return Outcome::Done(Status::INVALID_FIELD, 0);
                }
                let cc = p.value as u32;
                let was = ctrl.cc.swap(cc, Ordering::AcqRel);
                let mut csts = ctrl.csts.load(Ordering::Acquire);
                if cc & fabrics::CC_EN != 0 && was & fabrics::CC_EN == 0 {
                    // IOSQES/IOCQES must describe 64/16-byte entries.
                    if (cc >> 16) & 0xf != 6 || (cc >> 20) & 0xf != 4 {
                        csts |= 2; // CFS: controller fatal status
                    } else {
                        csts |= fabrics::CSTS_RDY;
                    }
                } else if cc & fabrics::CC_EN == 0 {
                    csts &= !fabrics::CSTS_RDY;
                }
                if cc & fabrics::CC_SHN_MASK != 0 {
                    csts = (csts & !(3 << 2)) | fabrics::CSTS_SHST_COMPLETE;
                }
                ctrl.csts.store(csts, Ordering::Release);
                Outcome::Done(Status::SUCCESS, 0)
            }
            _ => Outcome::Done(Status::INVALID_OPCODE, 0),
        }
    }

    pub(super) fn cap(&self) -> u64 {
        // MQES, CQR, TO and CSS: the same for I/O and discovery controllers.
        let cfg = &self.subsys.config;
        u64::from(cfg.mqes) // MQES
            | (1 << 16) // CQR: contiguous queues required
            | (15 << 24) // TO: 7.5 s in 500 ms units
            | (1 << 37) // CSS: NVM command set
    }

    pub(super) fn controller_info(&self, ctrl: &Controller) -> ControllerInfo {
        let cfg = &self.subsys.config;
        ControllerInfo {
            serial: cfg.serial.clone(),
            model: cfg.model.clone(),
            firmware: env!("CARGO_PKG_VERSION").chars().take(8).collect(),
            mdts: cfg.mdts,
            cntlid: ctrl.cntlid,
            version: 0x0001_0400,
            kas: cfg.kas,
            maxcmd: cfg.mqes.saturating_add(1),
            nn: self.subsys.namespaces.len() as u32,
            aerl: 3,
            oaes: OAES,
            oncs: ONCS,
            vwc: 0x01, // a volatile write cache: Flush matters
            cntrltype: cntrltype::IO,
            ioccsz: (64 + cfg.in_capsule) / 16,
            iorcsz: 1,
            subnqn: cfg.nqn.clone(),
        }
    }

    pub(super) fn admin(&mut self, sqe: &Sqe, now_ns: u64) -> Outcome {
        let Some(ctrl) = self.ctrl.clone() else { return Outcome::Done(Status::CMD_SEQ_ERROR, 0) };
        if ctrl.cc.load(Ordering::Acquire) & fabrics::CC_EN == 0 {
            return Outcome::Done(Status::CMD_SEQ_ERROR, 0);
        }
        match sqe.opcode() {
            admin::IDENTIFY => {
                let nn = self.subsys.namespaces.len() as u32;
                match (sqe.cdw(10) & 0xff) as u8 {
                    cns::CONTROLLER => Outcome::Data(self.controller_info(&ctrl).encode()),
                    cns::NAMESPACE | cns::NS_DESCRIPTORS => {
                        let nsid = sqe.nsid();
                        let Some(ns) = self.subsys.namespace(nsid) else {
                            return Outcome::Done(Status::INVALID_NS, 0);
                        };
                        let info = self.subsys.nsinfo(nsid, ns.as_ref());
                        if (sqe.cdw(10) & 0xff) as u8 == cns::NAMESPACE {
                            Outcome::Data(info.encode())
                        } else {
                            Outcome::Data(info.descriptors())
                        }
                    }
                    cns::ACTIVE_NS_LIST => {
                        if sqe.nsid() >= 0xffff_fffe {
                            return Outcome::Done(Status::INVALID_NS, 0);
                        }
                        Outcome::Data(identify::active_ns_list(nn, sqe.nsid()))
                    }
                    // The NVM command set (CSI 0, CDW11 bits 31:24): Verify is bounded
                    // like a transfer (VSL = MDTS), the rest unlimited.
                    cns::IO_CONTROLLER if sqe.cdw(11) >> 24 == 0 => {
                        Outcome::Data(identify::nvm_controller(self.subsys.config.mdts, 0, 0, 0))
                    }
                    _ => Outcome::Done(Status::INVALID_FIELD, 0),
                }
            }
            admin::GET_LOG_PAGE => {
                let numd = ((sqe.cdw(10) >> 16) | ((sqe.cdw(11) & 0xffff) << 16)) as u64 + 1;
                let offset = u64::from(sqe.cdw(12)) | (u64::from(sqe.cdw(13)) << 32);
                let page = match (sqe.cdw(10) & 0xff) as u8 {
                    lid::ERROR => vec![0u8; 64 * 64],
                    lid::SMART => {
                        let s = self.subsys.stats.counts.load();
                        identify::Smart {
                            sectors_read: s.sectors_read,
                            sectors_written: s.sectors_written,
                            read_cmds: s.read_cmds,
                            write_cmds: s.write_cmds,
                        }
                        .encode()
                    }
                    lid::FIRMWARE => identify::firmware_log(env!("CARGO_PKG_VERSION")),
                    // Namespaces never change here: the list is empty.
                    lid::CHANGED_NS => vec![0u8; identify::CHANGED_NS_LEN],
                    _ => return Outcome::Done(Status::INVALID_LOG_PAGE, 0),
                };
                log_window(&page, offset, numd)
            }
            admin::SET_FEATURES => {
                let v = sqe.cdw(11);
                match (sqe.cdw(10) & 0xff) as u8 {
                    fid::NUM_QUEUES => {
                        if v & 0xffff == 0xffff || v >> 16 == 0xffff {
                            return Outcome::Done(Status::INVALID_FIELD, 0);
                        }
                        let max = self.subsys.config.max_io_queues;
                        let want = ((v & 0xffff) as u16).max((v >> 16) as u16).saturating_add(1);
                        let n = want.min(max);
                        ctrl.io_queues.store(n, Ordering::Release);
                        let z = u32::from(n - 1);
                        Outcome::Done(Status::SUCCESS, z | (z << 16))
                    }
                    // The SMART warning bits (7:0) are always accepted; notices above them
                    // only when OAES advertises them (nvmet answers Invalid Field the same
                    // way: drivers/nvme/target/admin-cmd.c, nvmet_set_feat_async_event).
                    fid::ASYNC_EVENT_CONFIG if v & !0xff & !OAES != 0 => Outcome::Done(Status::INVALID_FIELD, 0),
                    fid::ASYNC_EVENT_CONFIG => {
                        ctrl.aen_config.store(v, Ordering::Release);
                        Outcome::Done(Status::SUCCESS, 0)
                    }
                    fid::KEEP_ALIVE | fid::ARBITRATION | fid::POWER_MGMT | fid::VOLATILE_WC => {
                        Outcome::Done(Status::SUCCESS, 0)
                    }
                    _ => Outcome::Done(Status::INVALID_FIELD, 0),
                }
            }
            admin::GET_FEATURES => match (sqe.cdw(10) & 0xff) as u8 {
                fid::NUM_QUEUES => {
                    let z = u32::from(ctrl.io_queues.load(Ordering::Acquire).saturating_sub(1));
                    Outcome::Done(Status::SUCCESS, z | (z << 16))
                }
                fid::ASYNC_EVENT_CONFIG => Outcome::Done(Status::SUCCESS, ctrl.aen_config.load(Ordering::Acquire)),
                fid::KEEP_ALIVE => Outcome::Done(Status::SUCCESS, ctrl.kato_ms),
                fid::VOLATILE_WC => Outcome::Done(Status::SUCCESS, 1),
                fid::ARBITRATION | fid::POWER_MGMT => Outcome::Done(Status::SUCCESS, 0),
                _ => Outcome::Done(Status::INVALID_FIELD, 0),
            },
            admin::ASYNC_EVENT => {
                if self.held_aers.len() >= 4 {
                    Outcome::Done(Status::AER_LIMIT, 0)
                } else {
                    // Held until an event occurs; netlane raises none, so it stays
                    // outstanding for the controller's life, as on real controllers.
                    self.held_aers.push(sqe.cid());
                    Outcome::Hold
                }
            }
            admin::KEEP_ALIVE => {
                self.last_keepalive_ns = now_ns.max(self.last_keepalive_ns);
                Outcome::Done(Status::SUCCESS, 0)
            }
            _ => Outcome::Done(Status::INVALID_OPCODE, 0),
        }
    }
}

/// The part of a log page a Get Log Page asked for: `numd` dwords from byte `offset`
/// (dword aligned, inside the page); bytes past the end of the page read as zero (NVMe
/// Base 2.0, 5.16), up to 1 MiB.
pub(super) fn log_window(page: &[u8], offset: u64, numd: u64) -> Outcome {
    if !offset.is_multiple_of(4) || offset > page.len() as u64 {
        return Outcome::Done(Status::INVALID_FIELD, 0);
    }
    let mut out = page[offset as usize..].to_vec();
    out.resize((numd * 4).min(1 << 20) as usize, 0);
    Outcome::Data(out)
}

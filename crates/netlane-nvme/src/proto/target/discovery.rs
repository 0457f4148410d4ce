//! The discovery controller (NVMe-oF 1.1, section 5): what a host finds by connecting
//! to the well-known discovery NQN, as `nvme discover` and `nvme connect-all` do. It
//! answers Identify Controller, the discovery log page, keep-alive, asynchronous event
//! requests and the two features nvmet's discovery controller has (keep-alive timer and
//! asynchronous event configuration); anything else is an invalid opcode or field, as
//! on nvmet (drivers/nvme/target/discovery.c).

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;

use super::admin::log_window;
use super::queue::{Outcome, TargetQueue};
use crate::proto::cmd::{Sqe, Status, admin};
use crate::proto::fabrics;
use crate::proto::identify::{self, ControllerInfo, DiscoveryEntry, cns, cntrltype, disc, fid, lid};

/// The discovery log's generation counter: the log never changes while a target runs.
const GENCTR: u64 = 1;

impl TargetQueue {
    pub(super) fn discovery_admin(&mut self, sqe: &Sqe, now_ns: u64) -> Outcome {
        let Some(ctrl) = self.ctrl.clone() else { return Outcome::Done(Status::CMD_SEQ_ERROR, 0) };
        if ctrl.csts.load(Ordering::Acquire) & fabrics::CSTS_RDY == 0 {
            return Outcome::Done(Status::INVALID_OPCODE, 0);
        }
        match sqe.opcode() {
            admin::IDENTIFY if (sqe.cdw(10) & 0xff) as u8 == cns::CONTROLLER => {
                let cfg = &self.subsys.config;
                let info = ControllerInfo {
                    serial: cfg.serial.clone(),
                    model: cfg.model.clone(),
                    firmware: env!("CARGO_PKG_VERSION").chars().take(8).collect(),
                    mdts: 0,
                    cntlid: ctrl.cntlid,
                    version: 0x0001_0400,
                    kas: cfg.kas,
                    maxcmd: cfg.mqes.saturating_add(1),
                    nn: 0,
                    aerl: 3,
                    oaes: 0,
                    oncs: 0,
                    vwc: 0,
                    cntrltype: cntrltype::DISCOVERY,
                    ioccsz: 0,
                    iorcsz: 0,
                    subnqn: disc::NQN.into(),
                };
                Outcome::Data(info.encode())
            }
            admin::IDENTIFY => Outcome::Done(Status::INVALID_FIELD, 0),
            admin::GET_LOG_PAGE => {
                if (sqe.cdw(10) & 0xff) as u8 != lid::DISCOVERY {
                    return Outcome::Done(Status::INVALID_FIELD, 0);
                }
                let numd = ((sqe.cdw(10) >> 16) | ((sqe.cdw(11) & 0xffff) << 16)) as u64 + 1;
                let offset = u64::from(sqe.cdw(12)) | (u64::from(sqe.cdw(13)) << 32);
                let page = identify::discovery_log(GENCTR, &self.discovery_entries());
                log_window(&page, offset, numd)
            }
            admin::SET_FEATURES => match (sqe.cdw(10) & 0xff) as u8 {
                fid::KEEP_ALIVE => Outcome::Done(Status::SUCCESS, 0),
                // No optional notices (no discovery log change events): only 0.
                fid::ASYNC_EVENT_CONFIG if sqe.cdw(11) & !0xff != 0 => Outcome::Done(Status::INVALID_FIELD, 0),
                fid::ASYNC_EVENT_CONFIG => {
                    ctrl.aen_config.store(sqe.cdw(11), Ordering::Release);
                    Outcome::Done(Status::SUCCESS, 0)
                }
                _ => Outcome::Done(Status::INVALID_FIELD, 0),
            },
            admin::GET_FEATURES => match (sqe.cdw(10) & 0xff) as u8 {
                fid::KEEP_ALIVE => Outcome::Done(Status::SUCCESS, ctrl.kato_ms),
                fid::ASYNC_EVENT_CONFIG => Outcome::Done(Status::SUCCESS, ctrl.aen_config.load(Ordering::Acquire)),
                _ => Outcome::Done(Status::INVALID_FIELD, 0),
            },
            admin::ASYNC_EVENT | admin::KEEP_ALIVE => self.admin(sqe, now_ns),
            _ => Outcome::Done(Status::INVALID_OPCODE, 0),
        }
    }

    /// The log: this discovery subsystem at the address the host used, then the NVM
    /// subsystem at every configured port.
    fn discovery_entries(&self) -> Vec<DiscoveryEntry> {
        let local = self.local;
        let shown = |a: SocketAddr| match (a.ip().is_unspecified(), local) {
            (true, Some(l)) => SocketAddr::new(l.ip(), a.port()),
            _ => a,
        };
        let mut ports: Vec<SocketAddr> = self.subsys.discovery_ports().into_iter().map(shown).collect();
        if ports.is_empty() {
            ports.extend(local);
        }
        let entry = |subtype, portid, a: SocketAddr, subnqn: &str, eflags| DiscoveryEntry {
            trtype: disc::TRTYPE_TCP,
            adrfam: match a.ip() {
                IpAddr::V4(_) => disc::ADRFAM_IPV4,
                IpAddr::V6(_) => disc::ADRFAM_IPV6,
            },
            subtype,
            treq: disc::TREQ_DISABLE_SQFLOW,
            portid,
            eflags,
            trsvcid: a.port().to_string(),
            subnqn: subnqn.to_string(),
            traddr: a.ip().to_string(),
        };
        let mut entries = Vec::new();
        // The port this host came in on (the first one when unknown).
        let here = local.and_then(|l| ports.iter().position(|p| p.port() == l.port())).unwrap_or(0);
        if let Some(&a) = ports.get(here) {
            entries.push(entry(disc::SUBTYPE_CURRENT, here as u16 + 1, a, disc::NQN, disc::EFLAGS_DUPRETINFO));
        }
        for (i, &a) in ports.iter().enumerate() {
            entries.push(entry(disc::SUBTYPE_NVM, i as u16 + 1, a, &self.subsys.config.nqn, 0));
        }
        entries
    }
}

//! Entry points for the fuzz targets in `fuzz/` (cargo-fuzz), also run over the seed
//! corpus and random inputs by the ordinary test suite. Each must return normally on
//! every input: a panic is a bug.

use std::sync::Arc;

use crate::proto::cmd::Sqe;
use crate::proto::fabrics::{self, Connect, Property, reg};
use crate::proto::host::{HostQueue, HostQueueConfig};
use crate::proto::namespace::{MemNamespace, Namespace};
use crate::proto::pdu::{self, IcReq, IcResp, Role, RxConfig, TxConfig};
use crate::proto::target::{Subsystem, TargetConfig, TargetQueue};

/// Decodes `data` as a stream of PDUs under every receiver configuration.
pub fn decode_stream(data: &[u8]) {
    for role in [Role::Controller, Role::Host] {
        for bits in 0..8u8 {
            let cfg = RxConfig {
                role,
                established: bits & 1 != 0,
                hdgst: bits & 2 != 0,
                ddgst: bits & 4 != 0,
                pda: 4,
                max_icd: 8192,
                max_data: 1 << 20,
            };
            let mut off = 0;
            while let Ok(d) = pdu::decode(&data[off..], &cfg) {
                assert!(d.len >= pdu::CH_LEN && off + d.len <= data.len());
                off += d.len;
            }
        }
    }
}

/// The bytes a host sends to bring up an admin queue (ICReq, Connect, CC.EN), with the
/// given digests: the prefix that lets fuzzed input reach a live controller queue.
pub fn admin_prefix(hdgst: bool, ddgst: bool) -> Vec<u8> {
    let mut out = Vec::new();
    TxConfig::ic_req(&mut out, &IcReq { pfv: 0, hpda: 0, hdgst, ddgst, maxr2t: 3 });
    let tx = TxConfig { hdgst, ddgst, pda: 4 };
    let c = Connect {
        recfmt: 0,
        qid: 0,
        sqsize: 31,
        cattr: fabrics::CATTR_DISABLE_SQFLOW,
        kato_ms: 0,
        hostid: [0; 16],
        cntlid: fabrics::CNTLID_DYNAMIC,
        subnqn: FUZZ_NQN.into(),
        hostnqn: "nqn.fuzz-host".into(),
    };
    let (sqe, data) = c.encode(1);
    tx.capsule_cmd(&mut out, &sqe, &data);
    tx.capsule_cmd(&mut out, &Property::set(2, reg::CC, u64::from(fabrics::CC_ENABLE), false), &[]);
    out
}

/// The bytes a host sends to connect I/O queue 1 of controller 1 (ICReq, Connect).
pub fn io_prefix(hdgst: bool, ddgst: bool) -> Vec<u8> {
    let mut out = Vec::new();
    TxConfig::ic_req(&mut out, &IcReq { pfv: 0, hpda: 0, hdgst, ddgst, maxr2t: 3 });
    let c = Connect {
        recfmt: 0,
        qid: 1,
        sqsize: 31,
        cattr: fabrics::CATTR_DISABLE_SQFLOW,
        kato_ms: 0,
        hostid: [0; 16],
        cntlid: 1,
        subnqn: FUZZ_NQN.into(),
        hostnqn: "nqn.fuzz-host".into(),
    };
    let (sqe, data) = c.encode(1);
    TxConfig { hdgst, ddgst, pda: 4 }.capsule_cmd(&mut out, &sqe, &data);
    out
}

/// NQN of the fuzzing subsystem.
pub const FUZZ_NQN: &str = "nqn.2026-11.io.netlane:fuzz";

/// A subsystem with controller 1 enabled (its admin queue is returned and must be kept),
/// ready for [`io_prefix`].
pub fn enabled_subsystem() -> (Arc<Subsystem>, TargetQueue) {
    let subsys = subsystem();
    let mut admin = TargetQueue::new(subsys.clone(), 0);
    let prefix = admin_prefix(false, false);
    let used = admin.handle_input(&prefix, 0);
    debug_assert_eq!(used, prefix.len());
    (subsys, admin)
}

/// The fuzzing subsystem: one 1 MiB namespace of 512-byte blocks, small PDU limits.
pub fn subsystem() -> Arc<Subsystem> {
    let ns: Arc<dyn Namespace> = Arc::new(MemNamespace::new(1 << 20, 512).unwrap_or_else(|_| unreachable!()));
    Subsystem::new(
        TargetConfig { nqn: FUZZ_NQN.into(), c2h_max: 4096, r2t_max: 8192, ..TargetConfig::default() },
        vec![ns],
    )
    .unwrap_or_else(|e| unreachable!("{e}"))
}

/// Feeds `data` to a controller queue: raw from the first byte when `data[0]` is even,
/// else as I/O queue 1 of an enabled controller after a valid ICReq and Connect (digest
/// settings from `data[0]` bits 1 and 2). Input is split at a position taken from
/// `data[1]` to exercise partial PDUs.
pub fn target_queue(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    let Some((&split, rest)) = rest.split_first() else { return };
    let mut stream = if mode & 1 == 1 { io_prefix(mode & 2 != 0, mode & 4 != 0) } else { Vec::new() };
    stream.extend_from_slice(rest);
    let (subsys, _admin) = enabled_subsystem();
    let mut q = TargetQueue::new(subsys, 0);
    let cut = (usize::from(split) * stream.len() / 256).min(stream.len());
    let mut buf = stream[..cut].to_vec();
    let used = q.handle_input(&buf, 1);
    q.run_storage(1);
    buf.drain(..used);
    buf.extend_from_slice(&stream[cut..]);
    let used = q.handle_input(&buf, 2);
    assert!(used <= buf.len());
    q.run_storage(2);
    q.poll(u64::MAX / 2);
    let out = q.poll_output().len();
    q.handle_written(out);
}

/// Feeds `data` to a host queue after a valid ICResp (digests from `data[0]`), with a
/// read and a write outstanding so data PDUs and R2Ts have somewhere to go.
pub fn host_queue(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    let (hdgst, ddgst) = (mode & 1 != 0, mode & 2 != 0);
    let mut q = HostQueue::new(HostQueueConfig { qid: 1, in_capsule: 0, ..HostQueueConfig::admin(hdgst, ddgst) });
    let mut resp = Vec::new();
    TxConfig::ic_resp(&mut resp, &IcResp { pfv: 0, cpda: 0, hdgst, ddgst, maxh2cdata: 8192 });
    if q.handle_input(&resp).is_err() {
        return;
    }
    let mut read = Sqe::default();
    read.set_opcode(crate::proto::cmd::nvm::READ);
    let _ = q.submit(read, vec![0; 16384], 1);
    let mut write = Sqe::default();
    write.set_opcode(crate::proto::cmd::nvm::WRITE);
    let _ = q.submit(write, vec![7; 16384], 2);
    let _ = q.handle_input(rest);
    while q.pop_completion().is_some() {}
    let _ = q.fail_all();
}

//! What the integration tests share: a target on real sockets, and how a host reaches it.

#![allow(dead_code)] // each test file uses its own part of this

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use netlane_nvme::host::ConnectOptions;
use netlane_nvme::proto::target::{Subsystem, TargetConfig};
use netlane_nvme::store::open_namespace;
use netlane_nvme::target::{TargetOptions, TargetServer};

pub const NQN: &str = "nqn.2026-11.io.netlane:test";

pub struct Fixture {
    pub server: TargetServer,
    pub subsys: Arc<Subsystem>,
    pub file: PathBuf,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
    }
}

/// A target with a memory namespace (1) and a file namespace (2); small PDU limits so
/// reads split into several C2HData and writes take several R2Ts of several H2CData.
pub fn target(listen: SocketAddr, tag: &str) -> Fixture {
    target_with(listen, tag, |_| {})
}

/// [`target`] with its options changed by `change`.
pub fn target_with(listen: SocketAddr, tag: &str, change: impl FnOnce(&mut TargetOptions)) -> Fixture {
    let file = std::env::temp_dir().join(format!("netlane-nvme-test-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let namespaces =
        vec![open_namespace("mem:64M").unwrap(), open_namespace(&format!("file:{}:8M", file.display())).unwrap()];
    let cfg = TargetConfig {
        nqn: NQN.into(),
        maxh2cdata: 32 * 1024,
        c2h_max: 16 * 1024,
        r2t_max: 64 * 1024,
        in_capsule: 8192,
        ..TargetConfig::default()
    };
    let subsys = Subsystem::new(cfg, namespaces).unwrap();
    let mut opts = TargetOptions::new(listen);
    change(&mut opts);
    let server = TargetServer::start(subsys.clone(), &opts).unwrap();
    Fixture { server, subsys, file }
}

pub fn opts(addr: SocketAddr, hd: bool, dd: bool) -> ConnectOptions {
    let mut o = ConnectOptions::new(addr, NQN);
    o.hdgst = hd;
    o.ddgst = dd;
    o.kato_ms = 3000;
    o
}

/// A perf run of `group` against the test target at `addr`: one default queue on CPU 0,
/// 32 entries, batching, 16 MiB of namespace 1, 800 ms after a 100 ms ramp; a test
/// changes what it is about.
pub fn perf_options(addr: SocketAddr, group: &str) -> netlane_nvme::perf::PerfOptions {
    netlane_nvme::perf::PerfOptions {
        connect: opts(addr, false, false),
        nsid: 1,
        groups: vec![netlane_nvme::perf::JobGroup::parse(group).unwrap()],
        duration: std::time::Duration::from_millis(800),
        ramp: std::time::Duration::from_millis(100),
        queues: 1,
        read_queues: 0,
        poll_queues: 0,
        queue_cpus: netlane::cpus::CpuList::one(0),
        queue_depth: 32,
        direct_send: false,
        batch: true,
        wake_each: false,
        caravan: None,
        verify: netlane_nvme::perf::VerifyMode::Off,
        size: Some(16 << 20),
        target_pid: None,
        target_threads: Vec::new(),
        busy_poll: None,
        napi: Default::default(),
        coalesce: Default::default(),
    }
}

/// The NAPI instances of interface `ifindex` in `ns`.
pub fn napis(ns: &netlane::topology::Netns, ifindex: u32) -> Vec<netlane::topology::netdev::Napi> {
    ns.run(move || netlane::topology::netdev::Netdev::open().unwrap().napis(ifindex).unwrap()).unwrap()
}

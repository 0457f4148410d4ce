//! Interoperability with the Linux kernel's NVMe/TCP implementation, in a QEMU guest
//! (Debian's kernel: `netlane_testkit::guest`).
//!
//! - netlane's host against the kernel target (nvmet-tcp) with a RAM and a file
//!   namespace: bring-up, every queue map, digests, in-capsule and R2T writes, data
//!   verified.
//! - the kernel's host (nvme-tcp and nvme-cli) against netlane's target on two ports:
//!   discovery, connect-all (multipath), every nvme-cli admin command, block I/O through
//!   the kernel's block layer with data checked, Flush, Compare, Dataset Management,
//!   Write Zeroes, Verify, keep-alive, reset, digests, and the target restarted during
//!   I/O (`guest/kernel_host.sh` is what runs in the guest).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use netlane::cpus::CpuList;
use netlane_nvme::host::{ConnectOptions, Controller};
use netlane_nvme::perf::{self, JobGroup, PerfOptions};
use netlane_nvme::proto::target::{Subsystem, TargetConfig};
use netlane_nvme::store::open_namespace;
use netlane_nvme::target::{TargetOptions, TargetServer};
use netlane_testkit::guest::{Guest, GuestSpec, free_port, guest_available};

const NQN: &str = "nqn.2026-11.io.netlane:guest-target";

/// One guest at a time: two TCG guests on a 2-core machine starve each other into
/// timeouts that say nothing about either side.
fn one_guest_at_a_time() -> MutexGuard<'static, ()> {
    static GUEST: Mutex<()> = Mutex::new(());
    GUEST.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// nvmet in the guest: subsystem NQN (any host), namespace 1 on a 64 MiB RAM disk,
/// namespace 2 on a 64 MiB file in tmpfs (buffered: tmpfs has no O_DIRECT in 6.1), a TCP port on 4420.
fn nvmet_script() -> String {
    format!(
        r#"set -e
modprobe brd rd_nr=1 rd_size=65536
modprobe nvmet
modprobe nvmet_tcp
s=/sys/kernel/config/nvmet/subsystems/{NQN}
mkdir $s
echo 1 > $s/attr_allow_any_host
mkdir $s/namespaces/1
echo /dev/ram0 > $s/namespaces/1/device_path
echo 1 > $s/namespaces/1/enable
dd if=/dev/zero of=/tmp/ns2.img bs=1M count=64 2>/dev/null
mkdir $s/namespaces/2
echo /tmp/ns2.img > $s/namespaces/2/device_path
echo 1 > $s/namespaces/2/buffered_io
echo 1 > $s/namespaces/2/enable
p=/sys/kernel/config/nvmet/ports/1
mkdir $p
echo tcp > $p/addr_trtype
echo ipv4 > $p/addr_adrfam
echo 0.0.0.0 > $p/addr_traddr
echo 4420 > $p/addr_trsvcid
ln -s $s $p/subsystems/{NQN}
echo "NETLANE-GUEST: nvmet ready"
sleep 900
"#
    )
}

fn options(addr: SocketAddr, nsid: u32, groups: &[&str]) -> PerfOptions {
    let mut connect = ConnectOptions::new(addr, NQN);
    connect.timeout = Duration::from_secs(30); // TCG is slow
    PerfOptions {
        connect,
        nsid,
        groups: groups.iter().map(|g| JobGroup::parse(g).unwrap()).collect(),
        duration: Duration::from_millis(1500),
        ramp: Duration::from_millis(200),
        queues: 1,
        read_queues: 0,
        poll_queues: 0,
        queue_cpus: CpuList::online(),
        queue_depth: 32,
        direct_send: false,
        batch: true,
        wake_each: false,
        caravan: None,
        verify: netlane_nvme::perf::VerifyMode::Write,
        size: Some(8 << 20),
        target_pid: None,
        target_threads: Vec::new(),
        busy_poll: None,
        napi: Default::default(),
        coalesce: Default::default(),
    }
}

#[test]
fn netlane_host_against_the_kernel_target() {
    if !guest_available("netlane_host_against_the_kernel_target") {
        return;
    }
    let _one = one_guest_at_a_time();
    let port = free_port();
    let mut spec = GuestSpec::new(&nvmet_script(), Duration::from_secs(300));
    spec.forwards.push((port, 4420));
    let mut guest = Guest::boot(&spec).unwrap();
    guest.expect("nvmet ready", Duration::from_secs(120)).unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();

    // Bring-up: what the controller says about itself.
    let mut c = ConnectOptions::new(addr, NQN);
    c.timeout = Duration::from_secs(30);
    let ctrl = Controller::connect(&c, 4).unwrap_or_else(|e| panic!("bring-up against nvmet: {e}\n{}", guest.tail(30)));
    assert_eq!(ctrl.info.subnqn, NQN);
    assert_eq!(ctrl.namespaces.iter().map(|n| n.nsid).collect::<Vec<_>>(), [1, 2]);
    for n in &ctrl.namespaces {
        assert_eq!(n.info.blocks * u64::from(n.info.block_size), 64 << 20, "namespace {}", n.nsid);
    }
    ctrl.shutdown().unwrap();

    // Data through every queue map, with and without digests; 4 KiB writes go in the
    // capsule, 64 KiB ones by R2T.
    let cases: Vec<(&str, PerfOptions)> = vec![
        ("default map, RAM namespace", options(addr, 1, &["name=a,rw=randrw,bs=4k,qd=4,jobs=2"])),
        ("default map, file namespace, R2T writes", options(addr, 2, &["name=a,rw=randrw,bs=64k,qd=4,jobs=2"])),
        (
            "separate read map",
            PerfOptions { read_queues: 1, ..options(addr, 1, &["name=a,rw=randrw,bs=8k,qd=8,jobs=2"]) },
        ),
        (
            "poll queue",
            PerfOptions { poll_queues: 1, ..options(addr, 1, &["name=a,rw=randrw,bs=4k,qd=2,jobs=1,hipri=1"]) },
        ),
        (
            "direct send, batching off",
            PerfOptions {
                direct_send: true,
                batch: false,
                ..options(addr, 2, &["name=a,rw=randrw,bs=16k,qd=8,jobs=1"])
            },
        ),
        ("header and data digests", {
            let mut o = options(addr, 1, &["name=a,rw=randrw,bs=32k,qd=4,jobs=2"]);
            o.connect.hdgst = true;
            o.connect.ddgst = true;
            o
        }),
    ];
    for (what, o) in cases {
        let r = perf::run(&o).unwrap_or_else(|e| panic!("{what}: {e}\n{}", guest.tail(30)));
        let g = &r.groups[0];
        assert!(g.reads > 0 && g.writes > 0, "{what}: {} reads, {} writes", g.reads, g.writes);
        assert_eq!((g.errors, g.mismatches), (0, 0), "{what}");
        eprintln!("{what}: {:.0} IOPS, {} reads, {} writes verified", r.iops, g.reads, g.writes);
    }
}

/// The checks `guest/kernel_host.sh` reports; each must say ok.
const KERNEL_HOST_CHECKS: &[&str] = &[
    "discover",
    "connect-all",
    "multipath-two-controllers",
    "block-devices",
    "multipath-one-namespace-node",
    "id-ctrl",
    "id-ns",
    "list-ns",
    "smart-log",
    "error-log",
    "fw-log",
    "changed-ns-list-log",
    "get-feature",
    "show-regs",
    "direct-4K-ram",
    "direct-4K-file",
    "buffered-4K-file",
    "direct-64K-ram",
    "direct-1M-file",
    "buffered-1M-file",
    "direct-8M-ram",
    "direct-8M-file",
    "buffered-8M-file",
    "parallel-direct",
    "flush",
    "compare-equal",
    "compare-differs",
    "dsm-deallocate",
    "dsm-reads-zeroes",
    "blkdiscard",
    "discard-reads-zeroes",
    "write-zeroes",
    "write-zeroes-reads-zeroes",
    "verify",
    "keep-alive-idle",
    "reset",
    "after-reset",
    "disconnect-all",
    "connect-digest-none",
    "digest-none-io",
    "digest-none-io-r2t",
    "connect-digest-hdr",
    "digest-hdr-io-r2t",
    "connect-digest-data",
    "digest-data-io-r2t",
    "connect-digest-both",
    "digest-both-io",
    "digest-both-io-r2t",
    "disconnect-digest-both",
    "connect-reconnecting",
    "restart-reconnected",
    "restart-nothing-lost",
];

const TARGET_NQN: &str = "nqn.2026-11.io.netlane:kernel-host";

/// The netlane target the guest uses: a RAM namespace and a file namespace, listening on
/// two loopback ports that the discovery log advertises as the guest sees them.
fn start_target(ports: [u16; 2], file: &std::path::Path) -> TargetServer {
    let namespaces =
        vec![open_namespace("mem:64M").unwrap(), open_namespace(&format!("file:{}:64M", file.display())).unwrap()];
    let config = TargetConfig {
        nqn: TARGET_NQN.into(),
        ports: ports.iter().map(|p| SocketAddr::from(([10, 0, 2, 2], *p))).collect(),
        ..TargetConfig::default()
    };
    let subsys: Arc<Subsystem> = Subsystem::new(config, namespaces).unwrap();
    let mut opts = TargetOptions::new(SocketAddr::from(([127, 0, 0, 1], ports[0])));
    opts.listen.push(SocketAddr::from(([127, 0, 0, 1], ports[1])));
    TargetServer::start(subsys, &opts).unwrap()
}

#[test]
fn kernel_host_against_the_netlane_target() {
    if !guest_available("kernel_host_against_the_netlane_target") {
        return;
    }
    let _one = one_guest_at_a_time();
    let ports = [free_port(), free_port()];
    let file = std::env::temp_dir().join(format!("netlane-interop-{}.img", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let mut server = Some(start_target(ports, &file));
    let script = format!(
        "A=10.0.2.2\nP1={}\nP2={}\nN={TARGET_NQN}\n{}",
        ports[0],
        ports[1],
        include_str!("guest/kernel_host.sh")
    );
    let mut guest = Guest::boot(&GuestSpec::new(&script, Duration::from_secs(600))).unwrap();

    // The restart: the guest is writing; stop the target (every connection drops), and
    // start a new one on the same ports and file while the host retries.
    guest.expect("restart-me", Duration::from_secs(450)).unwrap_or_else(|e| panic!("{e}"));
    std::thread::sleep(Duration::from_millis(1500));
    let before = server.take().map(|s| s.stop()).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    server = Some(start_target(ports, &file));
    let lines = guest.finish().unwrap_or_else(|e| panic!("{e}"));
    let _ = std::fs::remove_file(&file);

    let failed: Vec<&String> = lines.iter().filter(|l| l.starts_with("FAIL")).collect();
    let missing: Vec<&&str> =
        KERNEL_HOST_CHECKS.iter().filter(|c| !lines.iter().any(|l| l == &format!("ok {c}"))).collect();
    assert!(
        failed.is_empty() && missing.is_empty(),
        "failed: {failed:?}\nmissing: {missing:?}\nguest said:\n{}",
        lines.join("\n")
    );
    eprintln!("{}", lines.iter().find(|l| l.starts_with("restart:")).map_or("", |l| l.as_str()));
    assert_eq!(before.subsystem.terminations, 0, "no protocol violation: {before:?}");
    assert_eq!(before.subsystem.keepalive_expiries, 0, "keep-alive kept the controllers: {before:?}");
    let after = server.take().map(|s| s.stop()).unwrap();
    assert!(after.subsystem.write_cmds > 0, "the restarted target served the rest of the writes: {after:?}");
}

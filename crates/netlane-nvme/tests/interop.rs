//! Interoperability with the Linux kernel's NVMe/TCP implementation, in a QEMU guest
//! (Debian's kernel: `netlane::testing::guest`).
//!
//! - netlane's host against the kernel target (nvmet-tcp) with a RAM and a file
//!   namespace: bring-up, every queue map, digests, in-capsule and R2T writes, data
//!   verified.

use std::net::SocketAddr;
use std::time::Duration;

use netlane::cpus::CpuList;
use netlane::testing::guest::{Guest, GuestSpec, free_port, guest_available};
use netlane_nvme::host::{ConnectOptions, Controller};
use netlane_nvme::perf::{self, JobGroup, PerfOptions};

const NQN: &str = "nqn.2026-11.io.netlane:guest-target";

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
        caravan: None,
        verify: true,
        size: Some(8 << 20),
        target_pid: None,
    }
}

#[test]
fn netlane_host_against_the_kernel_target() {
    if !guest_available("netlane_host_against_the_kernel_target") {
        return;
    }
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

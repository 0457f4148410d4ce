//! The target on lanes: over a two-queue veth, each connection goes to the reactor that
//! owns the receive queue (NAPI instance) its packets arrive on. Needs root.

use std::net::SocketAddr;
use std::time::Duration;

use netlane::topology::{LinkConfig, RxTuning, TwoHosts};
use netlane_nvme::perf::{self, PerfOptions};

mod common;
use common::{napis, perf_options, target_with};

#[test]
fn each_connection_is_served_by_the_reactor_owning_its_receive_queue() {
    if !netlane_testkit::privileged("each_connection_is_served_by_the_reactor_owning_its_receive_queue") {
        return;
    }
    let hosts =
        TwoHosts::create("nvme-lanes", LinkConfig { mtu: 1500, queues: 2, rx: RxTuning::threaded_napi() }).unwrap();
    // A veth hands what its sender may segment (TSO) to the peer's backlog, past the
    // NAPI instances: packets from a host end with TSO on would carry no NAPI id.
    hosts.set_tx_tso(false).unwrap();
    let listen = SocketAddr::new(hosts.rx_addr(false), netlane_nvme::DEFAULT_PORT);
    let dev = hosts.rx_if.clone();
    let f = hosts
        .rx
        .run(move || {
            target_with(listen, "lanes", |o| {
                o.cpus = vec![0, 1];
                o.lane_device = Some(dev);
            })
        })
        .unwrap();
    let napis: Vec<u32> = napis(&hosts.rx, hosts.rx_index).into_iter().map(|n| n.id).collect();
    assert_eq!(napis.len(), 2, "{napis:?}");
    // Eight I/O queues and the admin queue: nine connections from different ports,
    // spread over the two receive queues by the sender's hash.
    let o = PerfOptions {
        duration: Duration::from_millis(500),
        queues: 8,
        queue_cpus: netlane::cpus::CpuList::new(vec![0, 1]),
        ..perf_options(listen, "name=rd,rw=randread,bs=4k,qd=4,jobs=2,cpus=0-1")
    };
    let r = hosts.tx.run(move || perf::run(&o)).unwrap().unwrap();
    assert!(r.ops > 100, "{} commands", r.ops);
    let stats = f.server.stats();
    let lanes = stats.lanes.expect("the target reports its lanes");
    eprintln!("{lanes:?}");
    // Each reactor owns one of the device's two NAPI instances, dealt at start.
    let mut owned: Vec<u32> = lanes.reactors.iter().flat_map(|r| r.napi_ids.clone()).collect();
    owned.sort_unstable();
    let mut listed = napis.clone();
    listed.sort_unstable();
    assert_eq!(owned, listed);
    assert!(lanes.reactors.iter().all(|r| r.napi_ids.len() == 1), "{lanes:?}");
    // Every connection came through one of them and went to its owner.
    assert_eq!(lanes.by_owner, 9, "{lanes:?}");
    assert_eq!((lanes.new_ids, lanes.no_napi), (0, 0), "{lanes:?}");
    assert_eq!(lanes.reactors.iter().map(|r| r.connections).sum::<u64>(), 9);
    drop(f);
}

//! nvme perf's CPU figures over a veth with threaded NAPI: the host's receive work runs
//! in its NAPI thread, which the report counts and names. Needs root.

use std::net::SocketAddr;

use netlane::topology::{LinkConfig, TwoHosts};
use netlane_nvme::perf::{self, PerfOptions};

mod common;
use common::{perf_options, target};

/// Over a veth with threaded NAPI on both ends, the host's receive work runs in its NAPI
/// thread, not in nvme perf's process: the report must count it (found from the route
/// to the target) and name it, and the target's threads given count with the target.
#[test]
fn perf_counts_the_napi_threads_that_do_the_receive_work() {
    if !netlane_testkit::privileged("perf_counts_the_napi_threads_that_do_the_receive_work") {
        return;
    }
    use netlane::topology::RxTuning;
    let hosts =
        TwoHosts::create("nvme-napi", LinkConfig { mtu: 1500, queues: 1, rx: RxTuning::threaded_napi() }).unwrap();
    RxTuning::threaded_napi().apply(&hosts.tx, &hosts.tx_if, hosts.tx_index).unwrap();
    // A veth hands TSO segments to the peer's backlog, skipping its NAPI: with TSO off
    // at the target's end the data it returns takes the host end's NAPI thread.
    hosts.set_rx_tso(false).unwrap();
    let listen = SocketAddr::new(hosts.rx_addr(false), netlane_nvme::DEFAULT_PORT);
    let f = hosts.rx.run(move || target(listen, "napi")).unwrap();
    let target_threads: Vec<u32> = common::napis(&hosts.rx, hosts.rx_index).into_iter().filter_map(|n| n.pid).collect();
    assert!(!target_threads.is_empty(), "the target end's NAPI is threaded");
    let o = PerfOptions {
        target_pid: Some(std::process::id()),
        target_threads: target_threads.clone(),
        ..perf_options(listen, "name=rd,rw=randread,bs=64k,qd=8,jobs=1")
    };
    let r = hosts.tx.run(move || perf::run(&o)).unwrap().unwrap();
    assert!(r.ops > 100, "{} commands", r.ops);
    assert_eq!(r.host_napi_threads.len(), 1, "{:?}", r.host_napi_threads);
    assert!(r.host_napi_threads[0].starts_with("napi/tx0-"), "{:?}", r.host_napi_threads);
    let napi = r.host_napi_cpu_us_per_io.expect("the host's NAPI thread's CPU was read");
    let process = r.host_cpu_us_per_io.unwrap();
    eprintln!("{} commands; host: process {process:.2} us/IO, NAPI {napi:.2} us/IO ({:?})", r.ops, r.host_napi_threads);
    // 64 KiB reads arrive as data the host's NAPI thread takes in: a real share of the
    // host's work, which a figure from the process alone would leave out.
    assert!(napi > 0.1 * process, "NAPI {napi:.2} us/IO against the process's {process:.2}");
    assert_eq!(r.target_threads.len(), target_threads.len(), "{:?}", r.target_threads);
    assert!(r.target_threads[0].starts_with("napi/rx0-"), "{:?}", r.target_threads);
    drop(f);
}

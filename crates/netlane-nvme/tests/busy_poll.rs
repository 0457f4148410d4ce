//! Poll queues reaped with the kernel's busy polling, over a veth whose host end's NAPI
//! is threaded (a NIC's interrupt wakes that thread; here the target's transmit does):
//! busy polling takes the completions' packets in itself, so no interrupt-driven
//! wake-up (of the job, or of the NAPI thread) is left per I/O; and when polling finds
//! nothing for longer than its time, the job sleeps and an interrupt wakes it, nothing
//! lost. Needs root.

use std::net::SocketAddr;

use netlane::lanes::BusyPoll;
use netlane::topology::netdev::NapiSettings;
use netlane::topology::{LinkConfig, RxTuning, TwoHosts};
use netlane_nvme::perf::{self, PerfOptions, PerfReport};

mod common;
use common::{perf_options, target};

fn options(listen: SocketAddr, busy_poll: Option<BusyPoll>, napi: NapiSettings) -> PerfOptions {
    PerfOptions {
        poll_queues: 1,
        busy_poll,
        napi,
        ..perf_options(listen, "name=rd,rw=randread,bs=4k,qd=1,jobs=1,cpus=0,hipri=1")
    }
}

fn run(hosts: &TwoHosts, listen: SocketAddr, busy_poll: Option<BusyPoll>, napi: NapiSettings) -> PerfReport {
    run_options(hosts, options(listen, busy_poll, napi))
}

fn run_options(hosts: &TwoHosts, o: PerfOptions) -> PerfReport {
    let (busy_poll, napi) = (o.busy_poll, o.napi);
    let r = hosts.tx.run(move || perf::run(&o)).unwrap().unwrap();
    let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
    eprintln!(
        "busy poll {busy_poll:?}, {napi:?}: {} commands, p50 {:.1} us, job sleeps {}/IO, NAPI runs {}/IO, busy-polled \
         packets {}/IO; {:?}",
        r.ops,
        r.groups[0].read_lat_ns.p50 as f64 / 1e3,
        f(r.job_sleeps_per_io),
        f(r.host_napi_runs_per_io),
        f(r.busy_polled_packets_per_io),
        r.knobs.iter().map(ToString::to_string).collect::<Vec<_>>()
    );
    assert!(r.ops > 100, "{} commands", r.ops);
    assert_eq!(r.groups[0].errors, 0);
    r
}

#[test]
fn poll_queues_busy_polled_by_the_kernel_complete_io_without_interrupt_driven_wake_ups() {
    if !netlane_testkit::privileged(
        "poll_queues_busy_polled_by_the_kernel_complete_io_without_interrupt_driven_wake_ups",
    ) {
        return;
    }
    let hosts =
        TwoHosts::create("nvme-bpoll", LinkConfig { mtu: 1500, queues: 1, rx: RxTuning::threaded_napi() }).unwrap();
    RxTuning::threaded_napi().apply(&hosts.tx, &hosts.tx_if, hosts.tx_index).unwrap();
    // Segments a veth takes as TSO skip the receiving end's NAPI.
    hosts.set_rx_tso(false).unwrap();
    let listen = SocketAddr::new(hosts.rx_addr(false), netlane_nvme::DEFAULT_PORT);
    let f = hosts.rx.run(move || target(listen, "bpoll")).unwrap();

    // Spinning in user space: every completion's packets are taken in by the NAPI
    // thread the target's transmit woke.
    let spin = run(&hosts, listen, None, NapiSettings::default());
    assert!(spin.host_napi_runs_per_io.unwrap() > 0.9, "{:?}", spin.host_napi_runs_per_io);
    assert_eq!(spin.busy_polled_packets_per_io, Some(0.0));

    // The kernel's busy polling, preferred over the NAPI thread, with the device's
    // interrupts deferred while it polls (for longer than a command takes): the job takes
    // every completion's packets in itself. What is left is the scheduler cutting the
    // job's busy loop short, which then sleeps: well under one I/O in fifty, where
    // spinning had one NAPI wake-up per I/O.
    let deferred = NapiSettings { defer_hard_irqs: Some(2), gro_flush_timeout_ns: Some(200_000), ..Default::default() };
    let busy = run(&hosts, listen, Some("1000,8,prefer".parse().unwrap()), deferred);
    assert!(busy.knobs.iter().all(|k| k.applied()), "{:?}", busy.knobs);
    assert!(busy.busy_polled_packets_per_io.unwrap() >= 1.0, "{:?}", busy.busy_polled_packets_per_io);
    assert!(busy.host_napi_runs_per_io.unwrap() < 0.02, "NAPI runs {:?}/IO", busy.host_napi_runs_per_io);
    assert!(busy.job_sleeps_per_io.unwrap() < 0.02, "job sleeps {:?}/IO", busy.job_sleeps_per_io);
    // The moderation was the run's: put back as it was.
    let now = common::napis(&hosts.tx, hosts.tx_index);
    assert!(now.iter().all(|n| n.defer_hard_irqs == Some(0) && n.gro_flush_timeout_ns == Some(0)), "{now:?}");

    // Without preferring it, the interrupt schedules the NAPI thread first: the poll
    // finds the instance taken and takes nothing. The device's own coalescing, asked for
    // too, a veth refuses: the run goes on and its knob says why.
    let o = options(listen, Some("1000,8".parse().unwrap()), NapiSettings::default());
    let plain = run_options(&hosts, PerfOptions { coalesce: [("rx-usecs".to_string(), 100)].into(), ..o });
    assert!(plain.busy_polled_packets_per_io.unwrap() < 0.1, "{:?}", plain.busy_polled_packets_per_io);
    let coalesce = plain.knobs.iter().find(|k| k.name == format!("{} coalesce", hosts.tx_if)).expect("its knob");
    assert!(!coalesce.applied() && coalesce.to_string().contains("not supported"), "{coalesce}");

    // Polling for less than a command takes: the job falls back to sleeping, and an
    // interrupt-driven wake-up brings each completion in, none lost.
    let short = run(&hosts, listen, Some("1,8".parse().unwrap()), NapiSettings::default());
    assert!(short.job_sleeps_per_io.unwrap() > 0.5, "job sleeps {:?}/IO", short.job_sleeps_per_io);
    drop(f);
}

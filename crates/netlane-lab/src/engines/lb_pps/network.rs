//! The network the runs share, built once and torn down when dropped: a generator
//! namespace and a balancer namespace joined by a veth pair (threaded NAPI pinned on
//! each end), the sink on the generator's end, the no-device references, and for the
//! two-core runs a second veth pair with a receive queue per CPU on each end.

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::BorrowedFd;
use std::rc::Rc;

use netlane::topology::{End, Netns, RxTuning, TopologyError, netdev, pin_napi_by_queue, veth_link, veth_link_queues};
use netlane_lb::LbError;
use netlane_sys::bpf::{PKTGEN_HEADER_LEN, PktGen, PktGenOptions, XdpLink, XdpMode, XdpTx};

use super::{GEN_SRC, PpsCpus, kernel};

/// The network and the pieces that live across runs.
pub(super) struct Bench {
    pub(super) gen_ns: Netns,
    pub(super) lb_ns: Netns,
    pub(super) g0: u32,
    pub(super) l0: u32,
    pub(super) g0_mac: [u8; 6],
    pub(super) l0_mac: [u8; 6],
    pub(super) napi_pid: u32,
    pub(super) sink: (Rc<PktGen>, XdpLink),
    /// The generator namespace's loopback device (drops XDP frames sent to it).
    pub(super) lo: u32,
    /// `xdp_tx` and `xdp_tx_room`, the references programs are timed against with no
    /// device.
    pub(super) reference: XdpTx,
    /// The two-core link, when asked for.
    pub(super) two: Option<TwoCores>,
    /// Where the generators and the balancer's threads run.
    pub(super) cpus: PpsCpus,
}

/// A second veth pair with a receive queue per CPU each end for the two-core runs: a
/// generator on CPU c reaches receive queue c of `l1` (veth picks the peer's queue by
/// the sending CPU), whose NAPI thread runs on the matching balancer CPU; the sink takes
/// both balancer threads' XDP_TX output on the generator's end, on the CPU that sent it.
pub(super) struct TwoCores {
    pub(super) g1: u32,
    pub(super) l1: u32,
    /// The NAPI threads of the l1 receive queues the two generators feed.
    pub(super) napi_pids: [u32; 2],
    _sink: XdpLink,
}

impl Bench {
    pub(super) fn build(cpus: PpsCpus, two_cores: bool) -> Result<Bench, LbError> {
        let gen_ns = Netns::create("pps-gen")?;
        let lb_ns = Netns::create("pps-lb")?;
        let g_addr = [(IpAddr::V4(Ipv4Addr::new(10, 211, 0, 1)), 24)];
        let l_addr = [(IpAddr::V4(Ipv4Addr::new(10, 211, 0, 2)), 24)];
        let (g0, l0) = veth_link(
            End { ns: &gen_ns, name: "g0", addrs: &g_addr },
            End { ns: &lb_ns, name: "l0", addrs: &l_addr },
            1500,
        )?;
        RxTuning::threaded_napi_on(cpus.balancers[0]).apply(&lb_ns, "l0", l0)?;
        RxTuning::threaded_napi_on(cpus.generators[0]).apply(&gen_ns, "g0", g0)?;
        let napis =
            lb_ns.run(move || netdev::Netdev::open().and_then(|mut n| n.napis(l0)))?.map_err(TopologyError::from)?;
        let napi_pid = napis
            .iter()
            .find_map(|n| n.pid)
            .ok_or_else(|| TopologyError::Unsupported("l0 has no threaded NAPI thread".into()))?;
        let mac = |ns: &Netns, i: u32| -> Result<[u8; 6], LbError> {
            let m = ns.with_rtnl(|r| r.link_mac(i))?;
            m.try_into().map_err(|_| LbError::Invalid("veth without a MAC".into()))
        };
        let (g0_mac, l0_mac) = (mac(&gen_ns, g0)?, mac(&lb_ns, l0)?);
        // The sink on the generator's end takes the balancer's XDP_TX frames.
        let helpers = Rc::new(
            PktGen::load(PktGenOptions {
                flows: 1,
                with_hints: false,
                src_base: GEN_SRC,
                header: [0; PKTGEN_HEADER_LEN],
            })
            .map_err(kernel("load the sink"))?,
        );
        gen_ns.enter_on_this_thread()?;
        let sink = XdpLink::attach(helpers.sink_fd(), g0, XdpMode::Native).map_err(kernel("attach the sink to g0"))?;
        let two = if two_cores { Some(Self::two_cores(&gen_ns, &lb_ns, cpus, helpers.sink_fd())?) } else { None };
        let lo = nix::net::if_::if_nametoindex("lo")
            .map_err(|e| kernel("find the generator namespace's loopback device")(e.into()))?;
        let reference = XdpTx::load().map_err(kernel("load the references xdp_tx and xdp_tx_room"))?;
        Ok(Bench { gen_ns, lb_ns, g0, l0, g0_mac, l0_mac, napi_pid, sink: (helpers, sink), lo, reference, two, cpus })
    }

    /// Builds the two-core link (the calling thread is in the generator's namespace).
    fn two_cores(gen_ns: &Netns, lb_ns: &Netns, cpus: PpsCpus, sink: BorrowedFd<'_>) -> Result<TwoCores, LbError> {
        let g_addr = [(IpAddr::V4(Ipv4Addr::new(10, 211, 2, 1)), 24)];
        let l_addr = [(IpAddr::V4(Ipv4Addr::new(10, 211, 2, 2)), 24)];
        let queues = cpus.queues();
        let (g1, l1) = veth_link_queues(
            End { ns: gen_ns, name: "g1", addrs: &g_addr },
            End { ns: lb_ns, name: "l1", addrs: &l_addr },
            1500,
            queues,
        )?;
        RxTuning::threaded_napi().apply(gen_ns, "g1", g1)?;
        RxTuning::threaded_napi().apply(lb_ns, "l1", l1)?;
        // l1's queue of the i-th generator's CPU is served on the i-th balancer CPU. A
        // balancer thread's XDP_TX lands on g1's queue of its CPU, whose sink thread
        // runs there too. Queues nobody sends to stay idle where they are put.
        let [b0, _] = cpus.balancers;
        let mut served = vec![b0; queues as usize];
        let mut sinks = vec![b0; queues as usize];
        for (g, b) in cpus.generators.iter().zip(&cpus.balancers) {
            served[*g] = *b;
            sinks[*b] = *b;
        }
        let pinned = pin_napi_by_queue(lb_ns, l1, &served)?;
        pin_napi_by_queue(gen_ns, g1, &sinks)?;
        let napis =
            lb_ns.run(move || netdev::Netdev::open().and_then(|mut n| n.napis(l1)))?.map_err(TopologyError::from)?;
        let pid_of = |queue: u32| -> Result<u32, LbError> {
            pinned
                .iter()
                .find(|(q, ..)| *q == queue)
                .and_then(|(_, id, _)| napis.iter().find(|n| n.id == *id))
                .and_then(|n| n.pid)
                .ok_or_else(|| TopologyError::Unsupported(format!("l1 queue {queue} has no NAPI thread")).into())
        };
        let napi_pids = [pid_of(cpus.generators[0] as u32)?, pid_of(cpus.generators[1] as u32)?];
        let _sink = XdpLink::attach(sink, g1, XdpMode::Native).map_err(kernel("attach the sink to g1"))?;
        Ok(TwoCores { g1, l1, napi_pids, _sink })
    }
}

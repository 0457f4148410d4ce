//! The balancer's whole path in network namespaces, for tests and the lab's soak: a
//! client behind a router, the balancer on one leg of the router (its XDP program sends
//! each packet back to the router, encapsulated, with XDP_TX), and reals on legs of
//! their own that decapsulate in XDP and own the VIP on `lo`, so they answer the client
//! directly (direct server return).
//!
//! ```text
//!  client c0 ---- rc [router] rl ---- l0 balancer
//!                    rr0 rr1 ..
//!                     |   |
//!                 real0 real1 ..   (r0 each, VIP on lo, decap on r0)
//! ```
//!
//! Everything is removed when the [`BalancerNet`] is dropped.

use std::net::{IpAddr, Ipv4Addr};

use netlane::topology::{End, Netns, TopologyError, set_net_sysctl, veth_link};
use netlane_sys::bpf::{Decap, PKTGEN_HEADER_LEN, PktGen, PktGenOptions, XdpLink, XdpMode};

/// What building the network can fail on.
#[derive(Debug, thiserror::Error)]
pub enum TestNetError {
    /// A namespace, link, address, route or sysctl.
    #[error("build the balancer's network")]
    Topology(#[from] TopologyError),
    /// Loading or attaching an XDP program.
    #[error("load or attach the network's XDP programs")]
    Bpf(#[from] std::io::Error),
    /// Too many reals for the address plan.
    #[error("{0} reals: the network has room for 1..=200")]
    Reals(usize),
}

/// The balancer's interface in its namespace.
pub const LB_IFACE: &str = "l0";
/// The client's interface in its namespace.
pub const CLIENT_IFACE: &str = "c0";

/// The client's address.
pub const CLIENT_ADDR: Ipv4Addr = Ipv4Addr::new(10, 210, 1, 2);

/// Real `i`'s address (its leg of the router).
pub fn real_addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 210, 3 + i as u8, 2)
}

/// The namespaces and programs; dropped in field order (programs before namespaces).
pub struct BalancerNet {
    /// Where the XDP programs on the reals and the router are attached.
    _links: Vec<XdpLink>,
    _decap: Decap,
    _helpers: PktGen,
    /// The client's namespace (its default route is the router).
    pub client: Netns,
    /// The router's namespace (forwarding; the VIP routed to the balancer).
    pub router: Netns,
    /// The balancer's namespace, with [`LB_IFACE`].
    pub lb: Netns,
    /// The reals' namespaces, in address order ([`real_addr`]).
    pub reals: Vec<Netns>,
    /// The router's MAC on the balancer's leg: the balancer's gateway.
    pub gw_mac: [u8; 6],
    /// The balancer's MAC on [`LB_IFACE`].
    pub lb_mac: [u8; 6],
    /// The router's interface index towards the balancer (in the router's namespace).
    pub router_lb_index: u32,
}

impl BalancerNet {
    /// Builds the network for `vip` with `reals` reals; `label` starts every namespace's
    /// name.
    pub fn build(label: &str, vip: Ipv4Addr, reals: usize) -> Result<BalancerNet, TestNetError> {
        if !(1..=200).contains(&reals) {
            return Err(TestNetError::Reals(reals));
        }
        let a = |ip: Ipv4Addr, len: u8| (IpAddr::V4(ip), len);
        let client = Netns::create(&format!("{label}-client"))?;
        let router = Netns::create(&format!("{label}-router"))?;
        let lb = Netns::create(&format!("{label}-lb"))?;
        let real_ns = (0..reals).map(|i| Netns::create(&format!("{label}-real{i}"))).collect::<Result<Vec<_>, _>>()?;
        let r_client = Ipv4Addr::new(10, 210, 1, 1);
        veth_link(
            End { ns: &client, name: CLIENT_IFACE, addrs: &[a(CLIENT_ADDR, 24)] },
            End { ns: &router, name: "rc", addrs: &[a(r_client, 24)] },
            1500,
        )?;
        // The paths that carry encapsulated packets get room for the outer header.
        let lb_addr = Ipv4Addr::new(10, 210, 2, 2);
        let (l0, rl) = veth_link(
            End { ns: &lb, name: LB_IFACE, addrs: &[a(lb_addr, 24)] },
            End { ns: &router, name: "rl", addrs: &[a(Ipv4Addr::new(10, 210, 2, 1), 24)] },
            1600,
        )?;
        let decap = Decap::load()?;
        let mut links = Vec::new();
        for (i, ns) in real_ns.iter().enumerate() {
            let gw = Ipv4Addr::new(10, 210, 3 + i as u8, 1);
            let (r0, _) = veth_link(
                End { ns, name: "r0", addrs: &[a(real_addr(i), 24)] },
                End { ns: &router, name: &format!("rr{i}"), addrs: &[a(gw, 24)] },
                1600,
            )?;
            ns.with_rtnl(|r| {
                r.add_route(Ipv4Addr::UNSPECIFIED.into(), 0, gw.into())?;
                let lo = r.link_index("lo")?;
                r.add_address(lo, vip.into(), 32)
            })?;
            for k in ["ipv4/conf/all/rp_filter", "ipv4/conf/default/rp_filter", "ipv4/conf/r0/rp_filter"] {
                set_net_sysctl(ns, k, "0")?;
            }
            let prog = decap.program_fd();
            links.push(ns.run(move || XdpLink::attach(prog, r0, XdpMode::Native))??);
        }
        client.with_rtnl(|r| r.add_route(Ipv4Addr::UNSPECIFIED.into(), 0, r_client.into()))?;
        // veth leaves TCP/UDP checksums to "the NIC" (CHECKSUM_PARTIAL); XDP_TX turns the
        // packet into a frame and that promise is lost. A NIC would have filled them in:
        // make the client do it.
        client.with_ethtool(|e| e.set_features(CLIENT_IFACE, &[("tx-checksum-ip-generic", false)]))?;
        router.with_rtnl(|r| r.add_route(vip.into(), 32, lb_addr.into()))?;
        set_net_sysctl(&router, "ipv4/ip_forward", "1")?;
        for k in ["ipv4/conf/all/rp_filter", "ipv4/conf/default/rp_filter"] {
            set_net_sysctl(&router, k, "0")?;
        }
        // veth hands the balancer's XDP_TX frames only to a peer with an XDP program.
        let helpers = PktGen::load(PktGenOptions {
            flows: 1,
            with_hints: false,
            src_base: Ipv4Addr::UNSPECIFIED,
            header: [0; PKTGEN_HEADER_LEN],
        })?;
        let pass = helpers.pass_fd();
        links.push(router.run(move || XdpLink::attach(pass, rl, XdpMode::Native))??);
        let mac = |ns: &Netns, index: u32| -> Result<[u8; 6], TestNetError> {
            let m = ns.with_rtnl(|r| r.link_mac(index))?;
            m.try_into().map_err(|m: Vec<u8>| {
                TestNetError::Topology(TopologyError::Invalid(format!("a MAC of {} bytes", m.len())))
            })
        };
        let (gw_mac, lb_mac) = (mac(&router, rl)?, mac(&lb, l0)?);
        Ok(BalancerNet {
            _links: links,
            _decap: decap,
            _helpers: helpers,
            client,
            router,
            lb,
            reals: real_ns,
            gw_mac,
            lb_mac,
            router_lb_index: rl,
        })
    }
}

impl std::fmt::Debug for BalancerNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BalancerNet")
            .field("client", &self.client.name())
            .field("router", &self.router.name())
            .field("lb", &self.lb.name())
            .field("reals", &self.reals.iter().map(Netns::name).collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

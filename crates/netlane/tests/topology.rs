//! The topology builder in real namespaces (needs root).

use std::net::SocketAddr;
use std::time::Duration;

use netlane::topology::{LinkConfig, Netns, RxTuning, TopologyError, TwoHosts};

fn udp_roundtrip(hosts: &TwoHosts, ipv6: bool) {
    let rx_addr = SocketAddr::new(hosts.rx_addr(ipv6), 9000);
    let server = hosts
        .rx
        .run(move || {
            let s = std::net::UdpSocket::bind(rx_addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s
        })
        .unwrap();
    let client =
        hosts.tx.run(|| std::net::UdpSocket::bind(if ipv6 { "[::]:0" } else { "0.0.0.0:0" }).unwrap()).unwrap();
    client.send_to(b"hello", rx_addr).unwrap();
    let mut buf = [0u8; 16];
    let (n, from) = server.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"hello");
    assert_eq!(from.ip(), hosts.tx_addr(ipv6));
}

#[test]
fn two_hosts_carry_ipv4_and_ipv6_and_are_removed_on_drop() {
    if !netlane_testkit::privileged("two_hosts_carry_ipv4_and_ipv6_and_are_removed_on_drop") {
        return;
    }
    let hosts = TwoHosts::create("topo-test", LinkConfig::default()).unwrap();
    let names = [hosts.tx.name().to_string(), hosts.rx.name().to_string()];
    for n in &names {
        assert!(netlane::topology::netns_names().contains(n), "{n} should exist while the guard lives");
    }
    udp_roundtrip(&hosts, false);
    udp_roundtrip(&hosts, true);
    // The receive knobs took effect.
    assert!(matches!(hosts.rx.read_sysfs("class/net/rx0/threaded").unwrap().as_str(), "1" | "enabled"));
    let features = hosts.rx.with_ethtool(|e| e.active_features("rx0")).unwrap();
    assert_eq!(features.get("rx-gro"), Some(&true));
    assert_eq!(features.get("rx-udp-gro-forwarding"), Some(&true));
    // The netns is visible to `ip netns exec` too.
    let out = hosts.rx.command("ip").args(["-o", "link", "show", "rx0"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("rx0"));
    assert_eq!(hosts.egress_qdisc().unwrap().0, "noqueue");
    drop(hosts);
    for n in &names {
        assert!(!netlane::topology::netns_names().contains(n), "{n} left behind");
    }
}

#[test]
fn guard_cleans_up_when_the_test_panics() {
    if !netlane_testkit::privileged("guard_cleans_up_when_the_test_panics") {
        return;
    }
    let names = std::sync::Mutex::new(Vec::new());
    let result = std::panic::catch_unwind(|| {
        let hosts =
            TwoHosts::create("panic-test", LinkConfig { rx: RxTuning::none(), ..LinkConfig::default() }).unwrap();
        names.lock().unwrap().extend([hosts.tx.name().to_string(), hosts.rx.name().to_string()]);
        panic!("boom");
    });
    assert!(result.is_err());
    let names = names.into_inner().unwrap();
    assert_eq!(names.len(), 2);
    for n in &names {
        assert!(!netlane::topology::netns_names().contains(n), "{n} left behind after a panic");
    }
}

#[test]
fn veth_ends_disappear_with_their_namespaces() {
    if !netlane_testkit::privileged("veth_ends_disappear_with_their_namespaces") {
        return;
    }
    let hosts = TwoHosts::create("veth-gone", LinkConfig::default()).unwrap();
    // Keep the tx namespace alive through a duplicate of its fd, then drop the guard.
    // The rx namespace has no other user, so the kernel destroys it, which destroys
    // its veth end, which destroys the pair: tx0 must vanish from the tx namespace.
    let tx_fd = hosts.tx.fd().try_clone_to_owned().unwrap();
    drop(hosts);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let gone = std::thread::spawn(move || {
        nix::sched::setns(&tx_fd, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let mut rtnl = netlane::topology::Rtnl::open().unwrap();
        // Namespace teardown runs on a kernel workqueue: poll briefly.
        while std::time::Instant::now() < deadline {
            match rtnl.link_index("tx0") {
                Err(e) if e.errno() == Some(libc::ENODEV) => return true,
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        false
    })
    .join()
    .unwrap();
    assert!(gone, "the veth pair outlived the rx namespace");
}

#[test]
fn bottleneck_qdisc_is_installed_and_counts() {
    if !netlane_testkit::privileged("bottleneck_qdisc_is_installed_and_counts") {
        return;
    }
    let hosts = TwoHosts::create("tbf-test", LinkConfig::default()).unwrap();
    hosts.set_bottleneck(25_000_000, 32 * 1024, 64 * 1024).unwrap();
    let (kind, _) = hosts.egress_qdisc().unwrap();
    assert_eq!(kind, "tbf");
    // Check the rate with tc's own reading of it.
    let out = hosts.tx.command("tc").args(["qdisc", "show", "dev", "tx0"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("tbf") && text.contains("200Mbit"), "tc shows: {text}");
    // A second root qdisc is refused with the kernel's message.
    let err = hosts.set_bottleneck(1_000_000, 2000, 10_000).unwrap_err();
    assert!(matches!(err, TopologyError::Netlink(_)), "{err}");
    udp_roundtrip(&hosts, false);
    let (_, stats) = hosts.egress_qdisc().unwrap();
    assert!(stats.packets >= 1, "{stats:?}");
}

#[test]
fn missing_qdisc_kind_is_reported_with_the_kernels_words() {
    if !netlane_testkit::privileged("missing_qdisc_kind_is_reported_with_the_kernels_words") {
        return;
    }
    let hosts = TwoHosts::create("qdisc-kind", LinkConfig::default()).unwrap();
    let err = hosts.tx.with_rtnl(|r| r.add_root_qdisc(hosts.tx_index, "no-such-qdisc")).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("no-such-qdisc"), "{text}");
    assert!(text.contains("kernel says"), "the extended ACK message is shown: {text}");
}

#[test]
fn names_are_unique_and_collisions_are_refused() {
    if !netlane_testkit::privileged("names_are_unique_and_collisions_are_refused") {
        return;
    }
    let a = Netns::create("same").unwrap();
    let b = Netns::create("same").unwrap();
    assert_ne!(a.name(), b.name());
    let err = Netns::create_named(a.name()).unwrap_err();
    assert!(matches!(err, TopologyError::NameTaken(_)), "{err}");
    // The failed attempt must not have removed the existing namespace.
    assert!(netlane::topology::netns_names().contains(&a.name().to_string()));
    assert!(Netns::create_named("../etc").is_err());
}

#[test]
fn spawned_threads_run_inside_the_namespace() {
    if !netlane_testkit::privileged("spawned_threads_run_inside_the_namespace") {
        return;
    }
    let ns = Netns::create("spawn").unwrap();
    let inner = std::fs::read_link("/proc/self/ns/net").unwrap();
    let t = ns.spawn("probe", || std::fs::read_link("/proc/thread-self/ns/net").unwrap()).unwrap();
    let seen = t.join().unwrap();
    assert_ne!(seen, inner, "the thread saw the caller's namespace");
    // A child process as well.
    let out = ns.command("readlink").arg("/proc/self/ns/net").output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), seen.to_string_lossy());
}

#[test]
fn napi_knobs_are_set_and_read_back() {
    if !netlane_testkit::privileged("napi_knobs_are_set_and_read_back") {
        return;
    }
    let rx =
        RxTuning { gro_flush_timeout_ns: Some(20_000), napi_defer_hard_irqs: Some(2), ..RxTuning::threaded_napi_on(0) };
    let hosts = TwoHosts::create("napi-knobs", LinkConfig { rx, ..LinkConfig::default() }).unwrap();
    assert_eq!(hosts.rx.read_sysfs("class/net/rx0/gro_flush_timeout").unwrap(), "20000");
    assert_eq!(hosts.rx.read_sysfs("class/net/rx0/napi_defer_hard_irqs").unwrap(), "2");
    // The NAPI thread was pinned to CPU 0: find it through netdev netlink.
    let rx_index = hosts.rx_index;
    let napis =
        hosts.rx.run(move || netlane::topology::netdev::Netdev::open().unwrap().napis(rx_index)).unwrap().unwrap();
    let pid = napis.iter().find_map(|n| n.pid).expect("a threaded NAPI instance");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(status.lines().any(|l| l.starts_with("Cpus_allowed_list:") && l.ends_with("\t0")), "{status}");
    assert_eq!(rx.label(), "threaded-napi+gro+udp-gro-fwd+gro-flush=20000ns+defer-irqs=2+napi-cpu=0");
}

#[test]
fn a_veth_end_without_ipv6_addresses_sends_nothing_of_its_own() {
    if !netlane_testkit::privileged("a_veth_end_without_ipv6_addresses_sends_nothing_of_its_own") {
        return;
    }
    use netlane::topology::{End, veth_link};
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let a = Netns::create("v6off-a").unwrap();
    let b = Netns::create("v6off-b").unwrap();
    let (a_ip, b_ip) = (Ipv4Addr::new(10, 214, 0, 1), Ipv4Addr::new(10, 214, 0, 2));
    veth_link(
        End { ns: &a, name: "va", addrs: &[(IpAddr::V4(a_ip), 24)] },
        End {
            ns: &b,
            name: "vb",
            addrs: &[(IpAddr::V4(b_ip), 24), (IpAddr::V6(Ipv6Addr::new(0xfd14, 0, 0, 0, 0, 0, 0, 2)), 64)],
        },
        1500,
    )
    .unwrap();
    let sysctl = |ns: &Netns, link: &'static str| {
        ns.run(move || std::fs::read_to_string(format!("/proc/sys/net/ipv6/conf/{link}/disable_ipv6")).unwrap())
            .unwrap()
    };
    assert_eq!(sysctl(&a, "va").trim(), "1", "IPv4 only: IPv6 off");
    assert_eq!(sysctl(&b, "vb").trim(), "0", "given an IPv6 address: IPv6 on");
    // IPv4 works; after the time a fresh link takes to send its router solicitation,
    // DAD probe and MLD report, the IPv4-only end has sent exactly the one datagram
    // (static neighbours: no ARP either).
    let server = b.run(move || std::net::UdpSocket::bind((b_ip, 9000)).unwrap()).unwrap();
    server.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let client = a.run(move || std::net::UdpSocket::bind((a_ip, 0)).unwrap()).unwrap();
    client.send_to(b"hello", (b_ip, 9000)).unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(server.recv(&mut buf).unwrap(), 5);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(a.read_sysfs("class/net/va/statistics/tx_packets").unwrap(), "1");
}

#[test]
fn segmentation_is_switched_for_a_guard_s_life_and_put_back() {
    if !netlane_testkit::privileged("segmentation_is_switched_for_a_guard_s_life_and_put_back") {
        return;
    }
    use netlane::topology::Segmentation;
    let hosts = TwoHosts::create("seg-test", LinkConfig::default()).unwrap();
    let state = || {
        let f = hosts.tx.with_ethtool(|e| e.active_features("tx0")).unwrap();
        let on = |n: &str| f.get(n).copied().unwrap_or(false);
        let segs = hosts.tx.with_rtnl(|r| r.link_gso_max_segs(hosts.tx_index)).unwrap();
        (on("tx-udp-segmentation"), on("tx-tcp-segmentation"), segs)
    };
    let before = state();
    assert!(before.0 && before.1 && before.2 > 1, "veth's defaults: {before:?}");
    {
        let _g = hosts.tx_segmentation(Segmentation::Software).unwrap();
        assert_eq!(state(), (false, false, before.2));
        udp_roundtrip(&hosts, false);
    }
    assert_eq!(state(), before);
    {
        let _g = hosts.tx_segmentation(Segmentation::None).unwrap();
        assert_eq!(state(), (false, false, 1));
        // TCP still flows, one segment per packet.
        let addr = SocketAddr::new(hosts.rx_addr(false), 9001);
        let l = hosts.rx.run(move || std::net::TcpListener::bind(addr).unwrap()).unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut v = Vec::new();
            std::io::Read::read_to_end(&mut s, &mut v).unwrap();
            v.len()
        });
        let mut c = hosts.tx.run(move || std::net::TcpStream::connect(addr).unwrap()).unwrap();
        std::io::Write::write_all(&mut c, &vec![7u8; 1 << 20]).unwrap();
        drop(c);
        assert_eq!(t.join().unwrap(), 1 << 20);
    }
    assert_eq!(state(), before);
    // The device's own case changes nothing.
    drop(hosts.tx_segmentation(Segmentation::Device).unwrap());
    assert_eq!(state(), before);
}

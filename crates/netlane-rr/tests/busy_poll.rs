//! Busy polling between two network namespaces joined by a veth pair: every knob read
//! back on each path that polls, and the per-NAPI settings of the device read, applied
//! while the server runs and put back after. Need root.

use netlane::serve::Stop;
use netlane_rr::server::{self, PathKind, ServerConfig};
use netlane_testkit::privileged;

mod common;
use common::veth::{assert_clean, exchange, hosts, server_cfg};
use common::{client, population};

/// AF_XDP with busy polling: every knob read back as asked (the loop's epoll
/// parameters, each socket's `SO_BUSY_POLL`, budget and preference), every request
/// answered, and the kernel counting packets taken by busy polling in the server's
/// namespace; a socket path takes the same options.
#[test]
fn af_xdp_busy_polls_with_every_option_read_back() {
    if !privileged("af_xdp_busy_polls_with_every_option_read_back") {
        return;
    }
    let h = hosts("rr-busy", 1500);
    let bp: netlane::lanes::BusyPoll = "50,16,prefer".parse().unwrap();
    for path in [PathKind::Recvmmsg, PathKind::AfXdp] {
        // Preferring busy polling is not enough on its own: the NAPI thread, free to run
        // on the other CPU, is woken first by the peer's transmit and takes the packets
        // unless the device holds its interrupts off while the server polls (measured in
        // netlane-nvme's busy_poll test: 0 packets busy polled without, 3 per I/O with).
        let held_off = netlane::topology::netdev::NapiSettings {
            defer_hard_irqs: Some(2),
            gro_flush_timeout_ns: Some(200_000),
            irq_suspend_timeout_ns: None,
        };
        let cfg = ServerConfig { busy_poll: Some(bp), napi: held_off, ..server_cfg(&h, path, false) };
        let (r, st) = exchange(&h, cfg, |a| population(a, 8, client(64, 256)));
        assert_clean(&path.to_string(), &r);
        let b = st.busy_poll.as_ref().expect("a busy-poll report");
        assert_eq!(b.policy, "50,16,prefer");
        let names: Vec<&str> = b.knobs.iter().map(|k| k.name.as_str()).collect();
        let sockets: &[&str] =
            if path == PathKind::AfXdp { &["queue 0", "service socket"] } else { &["service socket"] };
        let mut want = vec!["EPIOCSPARAMS".to_string()];
        for s in sockets {
            want.extend(["SO_BUSY_POLL", "SO_BUSY_POLL_BUDGET", "SO_PREFER_BUSY_POLL"].map(|k| format!("{s} {k}")));
        }
        assert_eq!(names, want, "{path}: one AF_XDP socket per queue (one queue here), and the service socket");
        assert!(b.knobs.iter().all(netlane::lanes::Knob::applied), "{path}: {:?}", b.knobs);
        let now: Vec<String> = b.knobs.iter().map(|k| k.to_string()).collect();
        // Linux has no getsockopt for the budget: said as set.
        assert!(now[1].contains("reads 50)") && now[2].contains("set (") && now[3].contains("reads 1)"), "{now:?}");
        // An AF_XDP socket on veth gets no NAPI id here (6.18, native XDP, copy mode), so
        // busy polling has nothing to poll: the report must say so; with an id, it polls.
        let ids: Vec<Option<u32>> = b.napi_ids.iter().map(|(_, id)| *id).collect();
        match (path, ids.as_slice()) {
            // Nothing reached the service socket beside AF_XDP here, so it has no id either.
            (PathKind::AfXdp, [Some(0), Some(0)]) => assert_eq!(b.rx_packets, Some(0), "{b:?}"),
            (PathKind::Recvmmsg, [Some(id)]) if *id > 0 => {
                assert!(b.rx_packets.is_some_and(|n| n > 0), "{path}: no packet taken by busy polling: {b:?}")
            }
            _ => panic!("{path}: {b:?} {:?}", st.xdp),
        }
    }
}

#[test]
fn per_napi_settings_are_read_back_while_serving_and_put_back_after() {
    if !privileged("per_napi_settings_are_read_back_while_serving_and_put_back_after") {
        return;
    }
    let h = hosts("rr-napi", 1500);
    let rx_index = h.rx_index;
    let napi_now = move || {
        let mut nd = netlane::topology::netdev::Netdev::open().unwrap();
        nd.napis(rx_index).unwrap().into_iter().map(|n| (n.defer_hard_irqs, n.gro_flush_timeout_ns)).collect::<Vec<_>>()
    };
    let before = h.rx.run(napi_now).unwrap();
    let cfg = ServerConfig {
        busy_poll: Some("50,8,prefer".parse().unwrap()),
        napi: netlane::topology::netdev::NapiSettings {
            defer_hard_irqs: Some(2),
            gro_flush_timeout_ns: Some(20_000),
            irq_suspend_timeout_ns: None,
        },
        ..server_cfg(&h, PathKind::Recvmmsg, false)
    };
    let (r, st) = exchange(&h, cfg, |a| population(a, 8, client(64, 256)));
    assert_clean("deferred", &r);
    // The device was found from the listen address; each of its instances read back.
    assert!(!st.napi.is_empty() && st.napi.iter().all(netlane::lanes::Knob::applied), "{:?}", st.napi);
    assert!(st.napi.iter().all(|k| k.to_string().contains("defer-hard-irqs=2")), "{:?}", st.napi);
    assert_eq!(h.rx.run(napi_now).unwrap(), before, "put back when the server stopped");
    // Without a device to name (every interface), the settings are refused in one line.
    let cfg = ServerConfig {
        listen: "0.0.0.0:0".parse().unwrap(),
        napi: netlane::topology::netdev::NapiSettings { defer_hard_irqs: Some(2), ..Default::default() },
        ..ServerConfig::default()
    };
    let err = h.rx.run(move || server::serve(&cfg, &Stop::new().unwrap(), |_| {})).unwrap().unwrap_err();
    assert!(err.to_string().contains("name it (`iface`)"), "{err}");
}

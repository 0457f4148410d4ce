//! A device as `netlane nic show` reads it, and its settings changed and put back, on
//! a veth pair with four queues in two namespaces (root).

use netlane::nic::{self, Outcome};
use netlane::topology::ethtool::{Group, Values};
use netlane::topology::{End, Netns, NetnsHandle, veth_link_queues};

fn values(v: &[(&str, u32)]) -> Values {
    v.iter().map(|(k, n)| (k.to_string(), *n)).collect()
}

/// Runs `f` in `ns` with its own sysfs.
fn inside<R: Send>(ns: &Netns, f: impl FnOnce() -> R + Send) -> R {
    ns.run(|| NetnsHandle::current().unwrap().with_sysfs(f).unwrap()).unwrap()
}

#[test]
fn a_veth_is_shown_and_its_channels_change_and_come_back_while_coalescing_is_refused_with_the_reason() {
    if !netlane_testkit::privileged("a_veth_is_shown_and_its_channels_change_and_come_back") {
        return;
    }
    let (a, b) = (Netns::create("nic-a").unwrap(), Netns::create("nic-b").unwrap());
    let (aa, ba) = (["10.79.0.1".parse().unwrap()], ["10.79.0.2".parse().unwrap()]);
    let (a_addrs, b_addrs) = ([(aa[0], 24)], [(ba[0], 24)]);
    veth_link_queues(End { ns: &a, name: "va", addrs: &a_addrs }, End { ns: &b, name: "vb", addrs: &b_addrs }, 1500, 4)
        .unwrap();
    inside(&a, || {
        let v = nic::show("va").unwrap();
        assert_eq!((v.rx_queues, v.tx_queues), (4, 4), "{v:?}");
        assert_eq!(v.driver, None, "veth has no device driver");
        // veth runs NAPI only with GRO or XDP on: none here, and that is no error.
        assert!(v.napis.is_empty() && v.napis_unavailable.is_none(), "{v:?}");
        let channels = v.groups["channels"].value.as_ref().unwrap();
        assert_eq!((channels["rx"], channels["tx"], channels["rx-max"]), (4, 4, 4), "{channels:?}");
        assert!(
            v.groups["coalesce"].unavailable.as_ref().is_some_and(|e| e.contains("not supported")),
            "{:?}",
            v.groups
        );
        assert!(v.xdp.value.as_ref().unwrap().actions.iter().any(|a| a == "redirect"), "{:?}", v.xdp);
        assert_eq!(v.threaded_napi, Some(false));

        // Two queues each way while the guard lives; four again after.
        let (outcome, held) = nic::set_group("va", Group::Channels, &values(&[("rx", 2), ("tx", 2)]));
        assert_eq!(outcome.applied.as_deref(), Some("rx=2,tx=2"), "{outcome}");
        let v = nic::show("va").unwrap();
        assert_eq!((v.rx_queues, v.tx_queues), (2, 2));
        drop(held);
        let v = nic::show("va").unwrap();
        assert_eq!((v.rx_queues, v.tx_queues), (4, 4));

        // Refusals, each with the reason, and nothing held.
        let refusals: [(Outcome, Option<_>); 3] = [
            nic::set_group("va", Group::Coalesce, &values(&[("rx-usecs", 50)])),
            nic::set_group("va", Group::Channels, &values(&[("combined-max", 1)])),
            nic::set_group("nosuch0", Group::Rings, &values(&[("rx", 512)])),
        ];
        let says = ["not supported", "not a setting of channels (it has rx, tx, other, combined)", "No such device"];
        for ((outcome, held), says) in refusals.into_iter().zip(says) {
            assert!(held.is_none() && outcome.applied.is_none(), "{outcome}");
            assert!(outcome.refused.as_deref().is_some_and(|r| r.contains(says)), "{outcome}");
        }
        // Tried: applied and read back, refused with the reason, and put back.
        let asked = nic::Settings {
            groups: vec![
                (Group::Channels, values(&[("rx", 1), ("tx", 3)])),
                (Group::Coalesce, values(&[("adaptive-rx", 1)])),
            ],
            ..Default::default()
        };
        let tried = nic::try_settings("va", &asked);
        assert_eq!(tried.outcomes[0].applied.as_deref(), Some("rx=1,tx=3"), "{tried:?}");
        assert!(tried.outcomes[1].refused.as_deref().is_some_and(|r| r.contains("not supported")), "{tried:?}");
        assert_eq!(tried.put_back.len(), 2, "{tried:?}");
        assert!(tried.put_back.iter().all(|p| p.restored() && p.now == "4"), "{tried:?}");
        // A change someone else made since is left as they made it.
        let (_, held) = nic::set_group("va", Group::Channels, &values(&[("rx", 3)]));
        let (_, other) = nic::set_group("va", Group::Channels, &values(&[("rx", 1)]));
        other.unwrap().release();
        drop(held);
        assert_eq!(nic::show("va").unwrap().rx_queues, 1);
    });
}

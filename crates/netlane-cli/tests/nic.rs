//! `netlane nic show`, as a user runs it.

mod common;

use common::{netlane, stderr, stdout, valid_document};

#[test]
fn nic_show_reads_a_device_and_says_what_it_cannot_read() {
    let o = netlane(&["nic", "show", "lo", "--json", "-"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let doc = valid_document(&stdout(&o), "nic-show");
    assert_eq!(doc["ifname"], "lo");
    assert_eq!(doc["ifindex"], 1);
    assert_eq!(doc["rx_queues"], 1);
    // Loopback has no channels, and the reason is the kernel's.
    assert_eq!(doc["groups"]["channels"]["value"], serde_json::Value::Null);
    assert!(doc["groups"]["channels"]["unavailable"].as_str().unwrap().contains("Operation not supported"), "{doc}");
    assert!(doc["xdp"]["value"]["actions"].as_array().unwrap().is_empty(), "{doc}");
    assert_eq!(doc["rss"]["unavailable"], "ethtool -x lo: Operation not supported (os error 95)", "{doc}");
    let o = netlane(&["nic", "show", "lo"]);
    assert!(stdout(&o).starts_with("lo (index 1, driver none: a virtual device)"), "{}", stdout(&o));

    let o = netlane(&["nic", "show", "nosuch0"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(stderr(&o), "error: read device nosuch0: look up interface nosuch0: No such device (os error 19)\n");
}

#[test]
fn nic_try_refuses_what_it_cannot_try_before_touching_anything() {
    for (args, says) in [
        (vec!["nic", "try", "lo", "--set", "channel.rx=2"], "not a group (channels, rings or coalesce)"),
        (vec!["nic", "try", "lo", "--set", "channels.rx-max=2"], "is not a setting of channels"),
        (vec!["nic", "try", "lo", "--set", "coalesce.adaptive-rx=maybe"], "a number (or on, off)"),
        (vec!["nic", "try", "lo", "--irq", "x=1"], "not an interrupt number"),
        (vec!["nic", "try", "lo", "--rss-key", "6d:5"], "expected a key in hexadecimal bytes"),
        (vec!["nic", "try", "lo", "--rss-equal", "2", "--rss-weights", "1,1"], "cannot be used with"),
        (vec!["nic", "try", "lo", "--rss-weights", "1,x"], "invalid digit"),
        (vec!["nic", "try", "lo", "--qdisc", "fq:1ms"], "fq takes no DELTA"),
        (vec!["nic", "try", "lo", "--qdisc", "cake"], "expected fq, etf or etf:DELTA"),
        (vec!["nic", "try", "lo", "--qdisc", "etf:3s"], "at most about 2.1s"),
    ] {
        let o = netlane(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
    }
    let o = netlane(&["nic", "try", "lo"]);
    assert_eq!(
        stderr(&o),
        "error: nothing to try: give --set, --irq, --threaded, --xps, --xps-rxqs, --tbf, --qdisc or an --rss option\n"
    );
}

#[test]
fn nic_try_on_a_veth_applies_refuses_and_puts_back() {
    if !netlane_testkit::privileged("nic_try_on_a_veth_applies_refuses_and_puts_back") {
        return;
    }
    let (a, b) =
        (netlane::topology::Netns::create("nictry-a").unwrap(), netlane::topology::Netns::create("nictry-b").unwrap());
    netlane::topology::veth_link_queues(
        netlane::topology::End { ns: &a, name: "va", addrs: &[] },
        netlane::topology::End { ns: &b, name: "vb", addrs: &[] },
        1500,
        2,
    )
    .unwrap();
    let o = std::process::Command::new("ip")
        .args(["netns", "exec", a.name(), env!("CARGO_BIN_EXE_netlane"), "nic", "try", "va"])
        .args(["--set", "channels.rx=1", "--set", "rings.tx=64", "--json", "-"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let doc = valid_document(&stdout(&o), "nic-try");
    assert_eq!(doc["outcomes"][0]["applied"], "rx=1", "{doc}");
    assert!(doc["outcomes"][1]["refused"].as_str().unwrap().contains("Operation not supported"), "{doc}");
    assert_eq!(doc["put_back"][0]["before"], "2", "{doc}");
    assert_eq!(doc["put_back"][0]["now"], "2", "{doc}");

    // The device's own files: threaded NAPI (a veth has NAPI once GRO is on) and XPS,
    // each queue's map read back and put back.
    a.run(|| netlane::topology::ethtool::Ethtool::open().unwrap().set_features("va", &[("rx-gro", true)]).unwrap())
        .unwrap();
    let o = std::process::Command::new("ip")
        .args(["netns", "exec", a.name(), env!("CARGO_BIN_EXE_netlane"), "nic", "try", "va"])
        .args(["--threaded", "on", "--xps-rxqs", "--json", "-"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let doc = valid_document(&stdout(&o), "nic-try");
    let applied: Vec<_> = doc["outcomes"].as_array().unwrap().iter().map(|o| o["applied"].clone()).collect();
    assert_eq!(applied, ["1", "1", "2"], "{doc}");
    let put_back = doc["put_back"].as_array().unwrap();
    assert_eq!(put_back.len(), 3, "{doc}");
    assert!(put_back.iter().all(|p| p["before"] == p["now"]), "{doc}");
    let o = std::process::Command::new("ip")
        .args(["netns", "exec", a.name(), env!("CARGO_BIN_EXE_netlane"), "nic", "try", "va", "--xps", "0"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("tx-1 xps_cpus (CPU 0) of va: 00000001: applied, reads 1"), "{}", stdout(&o));

    // A bottleneck as the root qdisc, removed again (veth's default is no qdisc).
    let o = std::process::Command::new("ip")
        .args(["netns", "exec", a.name(), env!("CARGO_BIN_EXE_netlane"), "nic", "try", "va"])
        .args(["--tbf", "25MB/s,16K,32K", "--json", "-"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let doc = valid_document(&stdout(&o), "nic-try");
    assert_eq!(doc["outcomes"][0]["applied"], "tbf", "{doc}");
    assert_eq!((&doc["put_back"][0]["before"], &doc["put_back"][0]["now"]), (&"noqueue".into(), &"noqueue".into()));
}

/// `nic hold`: the settings stay while it runs and are put back when it is stopped
/// (SIGTERM, as a remote role's supervisor sends when its session ends).
#[test]
fn nic_hold_keeps_settings_until_stopped_then_puts_them_back() {
    if !netlane_testkit::privileged("nic_hold_keeps_settings_until_stopped_then_puts_them_back") {
        return;
    }
    use std::io::{BufRead as _, Read as _};
    let (a, b) = (
        netlane::topology::Netns::create("nichold-a").unwrap(),
        netlane::topology::Netns::create("nichold-b").unwrap(),
    );
    netlane::topology::veth_link_queues(
        netlane::topology::End { ns: &a, name: "va", addrs: &[] },
        netlane::topology::End { ns: &b, name: "vb", addrs: &[] },
        1500,
        2,
    )
    .unwrap();
    let channels = || {
        let o = std::process::Command::new("ip")
            .args(["netns", "exec", a.name(), env!("CARGO_BIN_EXE_netlane"), "nic", "show", "va", "--json", "-"])
            .output()
            .unwrap();
        valid_document(&stdout(&o), "nic-show")["groups"]["channels"]["value"]["rx"].as_u64().unwrap()
    };
    assert_eq!(channels(), 2);
    let mut hold = common::Reaped(
        std::process::Command::new("ip")
            .args(["netns", "exec", a.name(), env!("CARGO_BIN_EXE_netlane"), "nic", "hold", "va"])
            .args(["--set", "channels.rx=1", "--set", "coalesce.rx-usecs=10", "--json", "-"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut err = std::io::BufReader::new(hold.stderr.take().unwrap());
    let mut said = String::new();
    while !said.contains("holding") {
        assert!(err.read_line(&mut said).unwrap() > 0, "it ended before holding: {said}");
    }
    assert!(said.contains("channels of va: rx=1: applied, reads rx=1"), "{said}");
    assert!(said.contains("coalesce of va: rx-usecs=10: refused"), "{said}");
    assert!(said.contains("holding 1 settings of va (1 refused)"), "{said}");
    assert_eq!(channels(), 1, "held while it runs");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(hold.id() as i32), nix::sys::signal::SIGTERM).unwrap();
    let mut out = String::new();
    hold.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    assert!(hold.wait().unwrap().success());
    let doc = valid_document(&out, "nic-hold");
    assert_eq!(doc["put_back"][0]["now"], "2", "{doc}");
    assert_eq!(channels(), 2, "put back once stopped");
}

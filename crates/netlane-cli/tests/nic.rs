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
    ] {
        let o = netlane(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
    }
    let o = netlane(&["nic", "try", "lo"]);
    assert_eq!(stderr(&o), "error: nothing to try: give --set or --irq\n");
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
}

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

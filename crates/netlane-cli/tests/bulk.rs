//! `netlane bulk send` and `netlane bulk recv` as a user runs them: two processes on
//! loopback, each writing a JSON document; the receiver counts what the sender sent.

use std::io::{BufReader, Read};
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::{Reaped, netlane, start_listening, stderr, stdout, temp_dir, valid_document};

/// A `netlane bulk recv` process and the address it said it receives on.
fn receiver(extra: &[&str], json: &std::path::Path) -> (Reaped, String, BufReader<std::process::ChildStdout>) {
    let mut args = vec!["bulk", "recv", "--listen", "127.0.0.1:0", "-t", "60s", "--json", json.to_str().unwrap()];
    args.extend(extra);
    start_listening(&args)
}

/// Ends the receiver the way the lab does (SIGINT: it drains, reports, exits 0).
fn stop(mut child: Reaped, mut out: BufReader<std::process::ChildStdout>) -> String {
    let st = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(st.success());
    assert_eq!(child.wait().unwrap().code(), Some(0), "a receiver stopped by SIGINT exits 0");
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    rest
}

#[test]
fn bulk_recv_counts_every_byte_bulk_send_sent_with_gso_and_paced() {
    let dir = temp_dir("bulk");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, send) in [
        ("gso", vec!["--gso", "cmsg", "--segments", "20", "-t", "500ms", "--run-id", "5"]),
        ("paced", vec!["--gso", "sockopt", "--segments", "10", "--rate", "20MB/s", "-t", "1s", "--run-id", "5"]),
    ] {
        let json = dir.join(format!("{name}.json"));
        let (child, addr, out) = receiver(&["--verify", "full", "--run-id", "5"], &json);
        let mut args = vec!["bulk", "send", "--to", addr.as_str(), "--json", "-"];
        args.extend(&send);
        let o = netlane(&args);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        let sent = valid_document(&stdout(&o), "bulk-send");
        let rest = stop(child, out);
        assert!(rest.contains("received ") && rest.contains("kernel drops"), "{name}: {rest}");
        let got = valid_document(&std::fs::read_to_string(&json).unwrap(), "bulk-recv");
        let (tx, rx) = (&sent["report"], &got["report"]);
        let bytes = tx["bytes"].as_u64().unwrap();
        assert!(bytes > 1_000_000, "{name}: a run that moved almost nothing: {tx}");
        // Loopback drops nothing the receive buffer holds; what is missing was dropped
        // by the kernel and counted as such.
        // (RcvbufErrors are the namespace's: another test's receiver may add to them.)
        let (got_n, sent_n) = (rx["datagrams"].as_u64().unwrap(), tx["datagrams"].as_u64().unwrap());
        let drops = rx["kernel_drops"].as_u64().unwrap();
        assert!(got_n <= sent_n && got_n + drops >= sent_n, "{name}: sent {sent_n}, {rx}");
        let i = &rx["integrity"];
        for k in ["corrupt", "foreign", "duplicates", "bad_length"] {
            assert_eq!(i[k].as_u64(), Some(0), "{name} {k}: {i}");
        }
        if name == "paced" {
            let p = &tx["pacing"];
            assert_eq!(p["target_rate_bytes_per_s"].as_u64(), Some(20_000_000), "{tx}");
            assert!(tx["path"].to_string().contains("user-space pacer"), "loopback has no fq: {tx}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_tcp_receiver_ends_with_the_stream() {
    let dir = temp_dir("bulk-tcp");
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("tcp.json");
    let (mut child, addr, _out) = receiver(&["--transport", "tcp", "--verify", "full"], &json);
    let o = netlane(&["bulk", "send", "--to", &addr, "--transport", "tcp", "-t", "300ms", "--json", "-"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let sent = valid_document(&stdout(&o), "bulk-send");
    // No signal: the stream's end ends it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the receiver outlived the stream");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(child.wait().unwrap().code(), Some(0));
    let got = valid_document(&std::fs::read_to_string(&json).unwrap(), "bulk-recv");
    assert_eq!(got["report"]["bytes"], sent["report"]["bytes"], "{got}");
    assert_eq!(got["report"]["integrity"]["corrupt"].as_u64(), Some(0), "{got}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_bulk_options_fail_with_one_line_before_anything_runs() {
    for (args, code, says) in [
        (&["bulk", "send", "--to", "127.0.0.1:9", "--size", "8"][..], 1, "below the 16-byte bulk header"),
        (&["bulk", "send", "--to", "127.0.0.1:9", "--gso", "tso"], 2, "expected off, cmsg or sockopt"),
        (&["bulk", "send", "--to", "127.0.0.1:9", "--gso", "cmsg", "--segments", "64"], 1, "at most 46 fit"),
        (&["bulk", "send", "--to", "127.0.0.1:9", "--rate", "0"], 2, "rate"),
        (&["bulk", "send", "--to", "127.0.0.1:9", "--pacer", "txtime"], 2, "--rate"),
        (&["bulk", "send", "--to", "127.0.0.1:9", "--rate", "1MB/s", "--pacer", "txtime"], 1, "(fq or etf)"),
        (&["bulk", "send", "--to", "127.0.0.1:9", "--rate", "1MB/s", "--pacer", "fq-rate"], 1, "only under the fq"),
        (
            &["bulk", "send", "--to", "127.0.0.1:9", "--rate", "1MB/s", "--pacer", "fq-rate", "--quantum", "1ms"],
            1,
            "no release period",
        ),
        (&["bulk", "send", "--to", "127.0.0.1:9", "--flows", "0"], 2, "--flows"),
        (&["bulk", "send", "--to", "127.0.0.1:9", "--flow-sockets", "2"], 2, "--flows"),
        (&["bulk", "send", "--to", "127.0.0.1:9", "--flows", "10", "--flow-mtus", "40"], 1, "bytes of headers"),
        (&["bulk", "send", "--to", "127.0.0.1:9", "--flows", "10", "--zerocopy"], 1, "many flows send with GSO"),
        (
            &["bulk", "send", "--to", "127.0.0.1:9", "--flows", "10", "--rate", "1MB/s", "--pacer", "txtime"],
            1,
            "in user space",
        ),
        (
            &["bulk", "send", "--to", "127.0.0.1:9", "--flows", "4", "--flow-sockets", "0"],
            1,
            "flow sockets must be 1..=64",
        ),
        (&["bulk", "recv", "--listen", "127.0.0.1:0", "--batch", "0"], 1, "reads per recvmmsg must be 1..=64"),
        (&["bulk", "recv", "--listen", "127.0.0.1:0", "--max-datagram", "70000"], 1, "largest datagram"),
    ] {
        let started = Instant::now();
        let o = netlane(args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        if code == 1 {
            assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        }
        assert!(started.elapsed() < Duration::from_secs(5), "{args:?} ran: {:?}", started.elapsed());
    }
}

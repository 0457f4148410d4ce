//! Kernel pacing where the kernel has it: fq and etf in a QEMU guest running Debian's
//! kernel (this machine's kernel has neither). The guest's netlane sends paced UDP out of
//! a virtio-net device whose tap sits in a namespace this test makes; netlane receivers
//! there, on this machine's clock, see how the datagrams arrived.
//!
//! Every paced run wakes every 20 ms. With the user-space pacer each wake-up's datagrams
//! arrive together, most milliseconds empty; with SO_TXTIME under fq or etf, and with fq
//! at the socket's SO_MAX_PACING_RATE, they arrive spread over the 20 ms, as the release
//! times say. An explicit kernel pacer without its qdisc is refused with the reason.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use netlane::topology::Netns;
use netlane_testkit::guest::{Guest, GuestSpec, guest_available};
use serde_json::Value;

const RATE: f64 = 2e6;
const HOST: &str = "10.77.0.1";

fn ip(ns: &Netns, args: &[&str]) {
    let o = Command::new("ip").args(["-n", ns.name()]).args(args).output().unwrap();
    assert!(o.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&o.stderr));
}

/// This netlane without its symbols, and the libraries it needs that the guest lacks.
fn files(dir: &std::path::Path) -> Vec<(PathBuf, String)> {
    let bin = dir.join("netlane");
    std::fs::copy(env!("CARGO_BIN_EXE_netlane"), &bin).unwrap();
    assert!(Command::new("strip").arg(&bin).status().unwrap().success());
    let lib = |name: &str| {
        let host = std::fs::canonicalize(format!("/lib/x86_64-linux-gnu/{name}")).unwrap();
        (host, format!("lib/x86_64-linux-gnu/{name}"))
    };
    vec![(bin, "bin/netlane".into()), lib("libelf.so.1"), lib("libgcc_s.so.1")]
}

/// A receiver in `ns` on `port`, ended by SIGTERM (by its PID) when the guest is done.
struct Receiver {
    name: &'static str,
    child: Child,
}

impl Receiver {
    fn start(ns: &Netns, name: &'static str, port: u16) -> Receiver {
        let child = Command::new("ip")
            .args(["netns", "exec", ns.name(), env!("CARGO_BIN_EXE_netlane"), "bulk", "recv"])
            .args(["--listen", &format!("{HOST}:{port}"), "--time", "240s", "--json", "-"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Receiver { name, child }
    }

    fn report(self) -> Value {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let out = self.child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("receiver {}: {e}: {text} {}", self.name, String::from_utf8_lossy(&out.stderr)))
    }
}

fn num(v: &Value, path: &str) -> f64 {
    v.pointer(path).and_then(Value::as_f64).unwrap_or_else(|| panic!("no {path} in {v}"))
}

#[test]
fn fq_and_etf_in_a_guest_release_datagrams_at_their_times() {
    let test = "fq_and_etf_in_a_guest_release_datagrams_at_their_times";
    if !netlane_testkit::privileged(test) || !guest_available(test) {
        return;
    }
    let ns = Netns::create("guest-pace").unwrap();
    ip(&ns, &["tuntap", "add", "dev", "tap0", "mode", "tap"]);
    ip(&ns, &["addr", "add", &format!("{HOST}/24"), "dev", "tap0"]);
    ip(&ns, &["link", "set", "tap0", "up"]);
    let runs = [("user", 9001), ("fq-txtime", 9002), ("fq-rate", 9003), ("etf", 9004), ("tbf-fq", 9005)];
    let receivers: Vec<Receiver> = runs.iter().map(|(name, port)| Receiver::start(&ns, name, *port)).collect();
    let dir = std::env::temp_dir().join(format!("netlane-guest-pace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = format!(
        r#"
M="NETLANE-GUEST: "
ip addr add 10.77.0.2/24 dev eth0
run() {{
  name=$1; port=$2; shift 2
  /bin/netlane bulk send --to {HOST}:$port --rate 2MB/s -t 3s --json /tmp/$name.json "$@" > /tmp/$name.out 2>&1
  echo "${{M}}$name exit $?"
  echo "${{M}}$name json $(tr -d '\n' < /tmp/$name.json 2>/dev/null)"
  sed "s/^/${{M}}$name out /" /tmp/$name.out
}}
hold() {{
  name=$1; shift
  /bin/netlane nic hold eth0 "$@" > /tmp/hold.out 2> /tmp/hold.err &
  H=$!
  i=0
  while ! grep -q holding /tmp/hold.err && [ $i -lt 30 ]; do sleep 1; i=$((i+1)); done
  sed "s/^/${{M}}hold $name /" /tmp/hold.err
}}
release() {{
  kill -TERM $H
  wait $H
  echo "${{M}}released exit $?"
}}
run user 9001 --quantum 20ms
run refused 9002 --pacer txtime
hold fq --qdisc fq
run fq-txtime 9002 --quantum 20ms --pacer txtime
run fq-rate 9003 --pacer fq-rate
release
hold etf --qdisc etf:10ms
run etf 9004 --quantum 20ms
release
hold tbf-fq --tbf 4MB/s,64K,1M --qdisc fq
run tbf-fq 9005 --quantum 20ms
release
"#
    );
    let mut spec = GuestSpec::new(&script, Duration::from_secs(240));
    spec.user_net = false;
    spec.netns = Some(ns.name().to_string());
    spec.files = files(&dir);
    spec.qemu_args =
        ["-netdev", "tap,id=n1,ifname=tap0,script=no,downscript=no,vhost=off", "-device", "virtio-net-pci,netdev=n1"]
            .map(String::from)
            .to_vec();
    let booted = Guest::boot(&spec).and_then(Guest::finish);
    let _ = std::fs::remove_dir_all(&dir);
    let reports: Vec<(&str, Value)> = receivers.into_iter().map(|r| (r.name, r.report())).collect();
    let lines = booted.unwrap_or_else(|e| panic!("{e}"));
    let all = lines.join("\n");
    let line =
        |prefix: &str| lines.iter().find_map(|l| l.strip_prefix(prefix)).unwrap_or_else(|| panic!("{prefix}: {all}"));

    // Without a qdisc that holds packets, an explicit kernel pacer is refused.
    assert_ne!(line("refused exit "), "0", "{all}");
    assert!(all.contains("need an egress qdisc that honours them (fq, etf or taprio)"), "{all}");
    for q in ["fq", "etf", "tbf-fq"] {
        let held = |l: &&String| l.starts_with(&format!("hold {q} holding ")) && l.contains("(0 refused)");
        assert!(lines.iter().any(|l| held(&l)), "{all}");
    }

    let ms = |rx: &Value, p: &str| num(rx, &format!("/report/per_ms_bytes/{p}"));
    let user_p99 = ms(&reports[0].1, "p99");
    for (name, rx) in &reports {
        assert_eq!(line(&format!("{name} exit ")), "0", "{all}");
        let tx: Value =
            serde_json::from_str(line(&format!("{name} json "))).unwrap_or_else(|e| panic!("{name}: {e}: {all}"));
        let (pacer, qdisc) = match *name {
            "user" => ("user", None),
            "fq-txtime" => ("txtime", Some("fq")),
            "fq-rate" => ("fq-rate", Some("fq")),
            "etf" => ("txtime", Some("etf")),
            _ => ("txtime", Some("fq under tbf")),
        };
        assert_eq!(tx.pointer("/report/pacing/pacer").and_then(Value::as_str), Some(pacer), "{name}: {tx}");
        let ran_under = tx.pointer("/report/pacing/qdisc").and_then(Value::as_str).unwrap_or_default();
        match qdisc {
            Some(q) => assert_eq!(ran_under, q, "{name}: {tx}"),
            None => assert!(!["fq", "etf"].contains(&ran_under), "{name}: {tx}"),
        }
        // Measured where the datagrams arrive: every datagram that did not arrive is one
        // the qdisc reported dropped for its release time (etf, when the emulator stalls
        // the guest for longer than its head start), and those are few.
        let sent = num(&tx, "/report/datagrams");
        let dropped = num(&tx, "/report/pacing/txtime_missed") + num(&tx, "/report/pacing/txtime_refused");
        assert_eq!(num(rx, "/report/integrity/unique") + dropped, sent, "{name}: lost datagrams: {rx} {tx}");
        assert!(dropped <= sent / 100.0, "{name}: {dropped} of {sent} dropped for their release times: {tx}");
        let rate = num(rx, "/report/bytes") / num(rx, "/report/seconds");
        // fq schedules a flow's next packet from when its last one left, so a late timer
        // (an emulator's) costs an fq-rate sender rate; the others keep their schedules.
        let low = if *name == "fq-rate" { 0.7 } else { 0.8 };
        assert!((low * RATE..1.2 * RATE).contains(&rate), "{name}: {rate} B/s at the receiver: {rx}");
        // How the bytes spread over the receiver's milliseconds: 40 KB every 20 ms from
        // the user-space pacer leave most milliseconds empty; released at their times,
        // a datagram or two comes every millisecond.
        let (p50, p99) = (ms(rx, "p50"), ms(rx, "p99"));
        eprintln!("{name}: {rate:.0} B/s, {dropped} dropped, per ms: p50 {p50}, p99 {p99}, max {}", ms(rx, "max"));
        if *name == "user" {
            assert!(p50 == 0.0 && p99 > 8.0 * RATE / 1e3, "{name}: bursts expected: {rx}");
        } else {
            assert!(p50 > 0.0 && p99 <= user_p99 / 2.0, "{name}: spread releases expected (user p99 {user_p99}): {rx}");
        }
    }
}

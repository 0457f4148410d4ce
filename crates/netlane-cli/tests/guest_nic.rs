//! `netlane nic show` and `nic try` on a device with real queues and interrupts: a
//! multi-queue virtio-net device in a QEMU guest running Debian's kernel (its driver has
//! real NAPI and MSI-X interrupts), backed by a multi-queue tap inside a namespace this
//! test makes. Channels, an interrupt's CPUs and the RSS table and key (the device with
//! QEMU's `rss=on`) are changed and put back; a ring size past the device's maximum is
//! refused with the kernel's reason; an RSS table left by a SIGKILLed hold is put back by
//! `netlane clean`.
//!
//! Kernel pacing where the kernel has it (this machine's kernel has neither fq nor etf):
//! the guest's netlane sends paced UDP out of a virtio-net device whose tap sits in a
//! namespace the test makes, and netlane receivers there, on this machine's clock, see
//! how the datagrams arrived. Every paced run wakes every 20 ms. With the user-space
//! pacer each wake-up's datagrams arrive together, most milliseconds empty; with SO_TXTIME
//! under fq, etf or fq under a tbf, and with fq at the socket's SO_MAX_PACING_RATE, they
//! arrive spread over the 20 ms, as the release times say. An explicit kernel pacer
//! without its qdisc is refused with the reason.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use netlane::topology::Netns;
use netlane_testkit::guest::{Guest, GuestSpec, guest_available};
use serde_json::Value;

/// Two guests at once starve each other's emulated timers on a 2-CPU machine, and the
/// pacing test judges what timers do: the guests take turns.
static ONE_GUEST: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn ip(ns: &Netns, args: &[&str]) {
    let o = Command::new("ip").args(["-n", ns.name()]).args(args).output().unwrap();
    assert!(o.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&o.stderr));
}

/// This netlane without its symbols (a smaller initramfs), and the libraries it needs
/// that the guest lacks.
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

#[test]
fn a_multi_queue_virtio_net_device_takes_channels_and_irq_cpus_and_gets_them_back() {
    if !netlane_testkit::privileged("a_multi_queue_virtio_net_device_takes_channels_and_irq_cpus_and_gets_them_back")
        || !guest_available("a_multi_queue_virtio_net_device_takes_channels_and_irq_cpus_and_gets_them_back")
    {
        return;
    }
    let _turn = ONE_GUEST.lock().unwrap_or_else(|p| p.into_inner());
    let ns = Netns::create("guest-nic").unwrap();
    ip(&ns, &["tuntap", "add", "dev", "tap0", "mode", "tap", "multi_queue"]);
    ip(&ns, &["link", "set", "tap0", "up"]);
    let dir = std::env::temp_dir().join(format!("netlane-guest-nic-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = r#"
M="NETLANE-GUEST: "
IRQ=$(grep 'virtio0-input.0' /proc/interrupts | cut -d: -f1 | tr -d ' ')
echo "${M}irq ${IRQ}"
/bin/netlane nic show eth0 2>&1 | sed "s/^/${M}before /"
/bin/netlane nic try eth0 --set channels.combined=3 --set rings.rx=1000000 --irq "${IRQ}=1" 2>&1 | sed "s/^/${M}try /"
/bin/netlane nic show eth0 2>&1 | sed "s/^/${M}after /"
/bin/netlane nic hold eth0 --set channels.combined=3 --irqs 1 > /tmp/hold.out 2> /tmp/hold.err &
H=$!
i=0
while ! grep -q holding /tmp/hold.err && [ $i -lt 30 ]; do sleep 1; i=$((i+1)); done
sed "s/^/${M}holding /" /tmp/hold.err
echo "${M}held irq $(cat /proc/irq/${IRQ}/smp_affinity_list)"
/bin/netlane nic show eth0 2>&1 | sed "s/^/${M}held /"
kill -TERM $H
wait $H
echo "${M}hold exit $?"
sed "s/^/${M}hold /" /tmp/hold.out
echo "${M}released irq $(cat /proc/irq/${IRQ}/smp_affinity_list)"
/bin/netlane nic show eth0 2>&1 | sed "s/^/${M}released /"
"#;
    // RSS: a table and a key tried and put back; then held by a process killed with
    // SIGKILL, which `netlane clean` puts back from its record.
    let key: Vec<String> = (0..40).map(|i| format!("{i:02x}")).collect();
    let key = key.join(":");
    let rss = format!(
        r#"
/bin/netlane nic try eth0 --rss-weights 0,1 --rss-key {key} 2>&1 | sed "s/^/${{M}}rss-try /"
/bin/netlane nic try eth0 --rss-equal 3 --rss-key 01:02 2>&1 | sed "s/^/${{M}}rss-refused /"
/bin/netlane nic hold eth0 --rss-equal 1 > /dev/null 2> /tmp/rss.err &
R=$!
i=0
while ! grep -q holding /tmp/rss.err && [ $i -lt 30 ]; do sleep 1; i=$((i+1)); done
/bin/netlane nic show eth0 2>&1 | grep RSS | sed "s/^/${{M}}rss-held /"
kill -KILL $R
wait $R
/bin/netlane clean 2>&1 | sed "s/^/${{M}}rss-clean /"
/bin/netlane nic show eth0 2>&1 | grep RSS | sed "s/^/${{M}}rss-cleaned /"
"#
    );
    let script = format!("{script}{rss}");
    let mut spec = GuestSpec::new(&script, Duration::from_secs(300));
    spec.user_net = false;
    spec.netns = Some(ns.name().to_string());
    spec.files = files(&dir);
    spec.qemu_args = [
        "-netdev",
        "tap,id=n1,ifname=tap0,script=no,downscript=no,queues=4,vhost=off",
        "-device",
        "virtio-net-pci,netdev=n1,mq=on,vectors=10,rss=on",
    ]
    .map(String::from)
    .to_vec();
    let lines = Guest::boot(&spec).unwrap().finish().unwrap_or_else(|e| panic!("{e}"));
    let _ = std::fs::remove_dir_all(&dir);
    let all = lines.join("\n");
    let irq = lines.iter().find_map(|l| l.strip_prefix("irq ")).unwrap_or_else(|| panic!("{all}"));
    assert!(irq.parse::<u32>().is_ok(), "no interrupt for the first receive queue: {all}");
    // Four queue pairs offered; the driver uses as many as the guest has CPUs.
    let before = lines.iter().find(|l| l.starts_with("before   channels:")).unwrap_or_else(|| panic!("{all}"));
    assert!(before.contains("combined=2") && before.contains("combined-max=4"), "{all}");
    let head =
        |l: &&String| l.starts_with("before eth0 (") && l.contains("driver virtio_net): 2 receive and 2 transmit");
    assert!(lines.iter().any(|l| head(&l)), "{all}");
    let tried = |text: &str| lines.iter().any(|l| l.starts_with("try ") && l.contains(text));
    assert!(tried("channels of eth0: combined=3: applied, reads combined=3"), "{all}");
    assert!(
        tried(
            "rings of eth0: rx=1000000: refused: ethtool -G eth0 rx 1000000 (kernel says: requested ring size exceeds maximum): Invalid argument"
        ),
        "{all}"
    );
    assert!(tried(&format!("IRQ {irq} on CPUs 1: applied, reads 1")), "{all}");
    assert!(tried("channels of eth0: combined: put back to 2"), "{all}");
    assert!(tried(&format!("IRQ {irq}'s CPUs: put back to")), "{all}");
    let after = lines.iter().find(|l| l.starts_with("after   channels:")).unwrap_or_else(|| panic!("{all}"));
    assert!(after.contains("combined=2"), "{all}");
    // `nic hold`: held while it runs (every interrupt of the device on CPU 1: Linux 6.1
    // does not say which NAPI instance has which, so its MSI vectors), put back on SIGTERM.
    let was = lines.iter().find_map(|l| l.strip_prefix("released irq ")).unwrap_or_else(|| panic!("{all}"));
    assert!(
        lines.iter().any(|l| l.starts_with("holding holding ") && l.contains("settings of eth0 (0 refused)")),
        "{all}"
    );
    assert!(lines.iter().any(|l| l == "held irq 1"), "{all}");
    let held = lines.iter().find(|l| l.starts_with("held   channels:")).unwrap_or_else(|| panic!("{all}"));
    assert!(held.contains("combined=3"), "{all}");
    assert!(lines.iter().any(|l| l == "hold exit 0"), "{all}");
    assert!(lines.iter().any(|l| l.starts_with("hold channels of eth0: combined: put back to 2")), "{all}");
    let released = lines.iter().find(|l| l.starts_with("released   channels:")).unwrap_or_else(|| panic!("{all}"));
    assert!(released.contains("combined=2"), "{all}");
    let before_irq = lines.iter().find(|l| l.starts_with(&format!("try IRQ {irq}'s CPUs: put back to "))).unwrap();
    assert!(before_irq.ends_with(was), "the interrupt's CPUs as before the hold: {all}");
    rss_checks(&lines, &key);
}

/// The RSS part: the device's default table over its 2 queues, a weighted table and a
/// key applied and read back, put back; refusals; a SIGKILLed hold's table put back by
/// `netlane clean`.
fn rss_checks(lines: &[String], key: &str) {
    let all = lines.join("\n");
    let default = "RSS: 128 entries (rx-0 64, rx-1 64), hash toeplitz, key ";
    let before = lines.iter().find(|l| l.starts_with("before   RSS: ")).unwrap_or_else(|| panic!("{all}"));
    assert!(before.starts_with(&format!("before   {default}")), "{all}");
    let was_key = before.rsplit(' ').next().unwrap();
    // Tables read as their spread and a digest of the whole table (`#xxxxxxxx`).
    let tried =
        |text: &str, end: &str| lines.iter().any(|l| l.starts_with("rss-try ") && l.contains(text) && l.ends_with(end));
    let applied = format!("RSS of eth0: weights 0,1, key {key}: applied, reads table of 128 (rx-1 128) #");
    assert!(tried(&applied, &format!(", key {key}")), "{all}");
    assert!(tried("RSS of eth0: put back to table of 128 (rx-0 64, rx-1 64) #", &format!(", key {was_key}")), "{all}");
    assert!(
        lines.iter().any(|l| l
            == "rss-refused RSS of eth0: equal 3, key 01:02: refused: equal 3 names rx-2: eth0 has 2 receive queues"),
        "{all}"
    );
    assert!(lines.iter().any(|l| l.starts_with("rss-held   RSS: 128 entries (rx-0 128), ")), "{all}");
    // Put back as the default spread it was (reset, not written: the driver keeps
    // following its queues).
    assert!(
        lines.iter().any(|l| l.starts_with("rss-clean RSS of eth0: table of 128 (rx-0 128) #")
            && l.contains("(was table of 128 (rx-0 64, rx-1 64) #")
            && l.contains("restored to table of 128 (rx-0 64, rx-1 64) #")),
        "{all}"
    );
    assert!(lines.iter().any(|l| l.starts_with(&format!("rss-cleaned   {default}{was_key}"))), "{all}");
}

const RATE: f64 = 2e6;
const HOST: &str = "10.77.0.1";

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
    let _turn = ONE_GUEST.lock().unwrap_or_else(|p| p.into_inner());
    let ns = Netns::create("guest-pace").unwrap();
    ip(&ns, &["tuntap", "add", "dev", "tap0", "mode", "tap"]);
    ip(&ns, &["addr", "add", &format!("{HOST}/24"), "dev", "tap0"]);
    ip(&ns, &["link", "set", "tap0", "up"]);
    let link = Command::new("ip").args(["-n", ns.name(), "-o", "link", "show", "tap0"]).output().unwrap();
    let link = String::from_utf8_lossy(&link.stdout).to_string();
    let mac = link.split_whitespace().skip_while(|w| *w != "link/ether").nth(1).unwrap_or_else(|| panic!("{link}"));
    let runs = [("user", 9001), ("fq-txtime", 9002), ("fq-rate", 9003), ("etf", 9004), ("tbf-fq", 9005)];
    let receivers: Vec<Receiver> = runs.iter().map(|(name, port)| Receiver::start(&ns, name, *port)).collect();
    let dir = std::env::temp_dir().join(format!("netlane-guest-pace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = format!(
        r#"
M="NETLANE-GUEST: "
ip addr add 10.77.0.2/24 dev eth0
# The pacing qdiscs are in the guest's modules, loaded by the test that uses them.
for m in sch_fq sch_etf sch_tbf; do modprobe $m; done
# etf drops ARP (it has no release time): the receiver's address is resolved here.
ip neigh replace {HOST} lladdr {mac} dev eth0 nud permanent
run() {{
  name=$1; port=$2; shift 2
  /bin/netlane bulk send --to {HOST}:$port --rate 2MB/s -t 2s --json /tmp/$name.json "$@" > /tmp/$name.out 2>&1
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
run etf-user 9006 --quantum 20ms --pacer user
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

    // Without a qdisc that holds packets, an explicit kernel pacer is refused; etf, which
    // drops every packet without a release time, refuses any other sender.
    assert_ne!(line("refused exit "), "0", "{all}");
    assert!(all.contains("need an egress qdisc that honours them (fq or etf)"), "{all}");
    assert_ne!(line("etf-user exit "), "0", "{all}");
    assert!(all.contains("only a sender pacing by release times (txtime) can send through it"), "{all}");
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
        // the guest for longer than its head start), and those are few. The qdisc counts
        // sends; these sends are one datagram each.
        let sent = num(&tx, "/report/datagrams");
        let dropped = num(&tx, "/report/pacing/txtime_missed") + num(&tx, "/report/pacing/txtime_refused");
        assert_eq!(num(rx, "/report/integrity/unique") + dropped, sent, "{name}: lost datagrams: {rx} {tx}");
        assert!(dropped <= sent / 100.0, "{name}: {dropped} of {sent} dropped for their release times: {tx}");
        let rate = num(rx, "/report/bytes") / num(rx, "/report/seconds");
        // fq schedules a flow's next packet from when its last one left, so a late timer
        // (an emulator's) costs an fq-rate sender rate; the others keep their schedules.
        let low = if *name == "fq-rate" { 0.6 } else { 0.8 };
        assert!((low * RATE..1.2 * RATE).contains(&rate), "{name}: {rate} B/s at the receiver: {rx}");
        // How the bytes spread over the receiver's milliseconds: 40 KB every 20 ms from
        // the user-space pacer leave most milliseconds empty; released at their times,
        // a datagram or two comes every millisecond.
        let (p50, p99) = (ms(rx, "p50"), ms(rx, "p99"));
        eprintln!("{name}: {rate:.0} B/s, {dropped} dropped, per ms: p50 {p50}, p99 {p99}, max {}", ms(rx, "max"));
        if *name == "user" {
            assert!(p50 == 0.0 && p99 > 8.0 * RATE / 1e3, "{name}: bursts expected: {rx}");
        } else {
            // The 99th percentile is where an emulator's stalls show (the qdisc then
            // sends what came due together), so it is only held below the user pacer's.
            let spread = p50 > 0.0 && p99 < user_p99 / 1.25;
            assert!(spread, "{name}: spread releases expected (user p99 {user_p99}): {rx}");
        }
    }
}

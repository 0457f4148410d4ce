//! Per-application priority and shaping in real cgroups and namespaces (needs root):
//! every socket of a process in an application's cgroup gets its priority and mark;
//! htb classes fed by the mark classifier hold each application between its guaranteed
//! and its highest rate, measured at the receiver; a hundred applications each have
//! their own class, and their traffic lands in it.

use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use netlane::lanes::apps::{self, AppCgroup, AppSpec, BackendChoice, Shaper, ShapingBackend};
use netlane::topology::{LinkConfig, TwoHosts};

/// Creates sockets every way a program does and prints (how, priority, mark) for each.
const SOCKETS: &str = r#"
import json, os, socket, threading
S = socket.SOL_SOCKET
def pm(s):
    return [s.getsockopt(S, socket.SO_PRIORITY), s.getsockopt(S, socket.SO_MARK)]
out = []
for name, fam, typ in [("tcp4", socket.AF_INET, socket.SOCK_STREAM), ("udp4", socket.AF_INET, socket.SOCK_DGRAM),
                       ("tcp6", socket.AF_INET6, socket.SOCK_STREAM), ("udp6", socket.AF_INET6, socket.SOCK_DGRAM)]:
    with socket.socket(fam, typ) as s:
        out.append([name] + pm(s))
box = []
t = threading.Thread(target=lambda: box.append(pm(socket.socket())))
t.start(); t.join()
out.append(["thread"] + box[0])
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen()
c = socket.create_connection(l.getsockname())
a, _ = l.accept()
out.append(["connected"] + pm(c)); out.append(["accepted"] + pm(a))
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(w, json.dumps(pm(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))).encode()); os._exit(0)
os.waitpid(pid, 0)
out.append(["forked"] + json.loads(os.read(r, 100)))
print(json.dumps(out))
"#;

fn sockets_of(cmd: &mut Command) -> Vec<(String, u32, u32)> {
    let o = cmd.args(["-c", SOCKETS]).output().expect("run python3");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Vec<(String, u32, u32)> = serde_json::from_slice(&o.stdout).expect("the script's JSON");
    assert_eq!(v.len(), 8, "{v:?}");
    v
}

#[test]
fn every_socket_of_an_application_gets_its_priority_and_mark() {
    if !netlane_testkit::privileged("every_socket_of_an_application_gets_its_priority_and_mark") {
        return;
    }
    let spec = AppSpec { name: "prio-test".into(), priority: 5, mark: 0x4e4c, min_rate: 1, max_rate: 1, htb_prio: 0 };
    let cg = AppCgroup::create(&spec).unwrap();
    let path = cg.path().to_path_buf();
    assert!(path.is_dir());
    let mut inside = Command::new("python3");
    cg.command(&mut inside);
    for (how, priority, mark) in sockets_of(&mut inside) {
        assert_eq!((priority, mark), (5, 0x4e4c), "a {how} socket in the application's cgroup");
    }
    assert!(cg.sockets().unwrap() >= 7, "the program counted {} sockets", cg.sockets().unwrap());
    // A process outside keeps the defaults.
    for (how, priority, mark) in sockets_of(&mut Command::new("python3")) {
        assert_eq!((priority, mark), (0, 0), "a {how} socket outside");
    }
    // A running process moved in: its new sockets get the policy.
    let mut sleeper = Command::new("python3")
        .args(["-c", "import socket,sys; sys.stdin.readline(); s=socket.socket(); print(s.getsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY), s.getsockopt(socket.SOL_SOCKET, socket.SO_MARK))"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    cg.add_pid(sleeper.id()).unwrap();
    drop(sleeper.stdin.take());
    let mut line = String::new();
    sleeper.stdout.take().unwrap().read_to_string(&mut line).unwrap();
    assert!(sleeper.wait().unwrap().success());
    assert_eq!(line.trim(), format!("5 {}", 0x4e4c));
    drop(cg);
    assert!(!path.exists(), "the cgroup is removed on drop");
}

/// A sink in the receiver's namespace counting the bytes of every connection to `port`.
fn sink(hosts: &TwoHosts, port: u16, stop: Arc<AtomicBool>) -> Arc<AtomicU64> {
    let addr = SocketAddr::new(hosts.rx_addr(false), port);
    let listener = hosts.rx.run(move || TcpListener::bind(addr).unwrap()).unwrap();
    listener.set_nonblocking(true).unwrap();
    let bytes = Arc::new(AtomicU64::new(0));
    let b = bytes.clone();
    std::thread::spawn(move || {
        let mut readers = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((mut c, _)) => {
                    c.set_nonblocking(false).unwrap();
                    c.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
                    let (b, stop) = (b.clone(), stop.clone());
                    readers.push(std::thread::spawn(move || {
                        let mut buf = vec![0u8; 1 << 16];
                        while !stop.load(Ordering::Relaxed) {
                            match c.read(&mut buf) {
                                Ok(0) => return,
                                Ok(n) => {
                                    b.fetch_add(n as u64, Ordering::Relaxed);
                                }
                                Err(e)
                                    if matches!(
                                        e.kind(),
                                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                                    ) => {}
                                Err(_) => return,
                            }
                        }
                    }));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        for r in readers {
            let _ = r.join();
        }
    });
    bytes
}

/// Kills the child (by its PID, which this test started) when dropped.
struct Sender(std::process::Child);

impl Drop for Sender {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A bulk TCP sender (socat from /dev/zero) in `cg`, in the sender's namespace.
fn bulk_sender(hosts: &TwoHosts, cg: &AppCgroup, port: u16) -> Sender {
    let mut cmd = hosts.tx.command("socat");
    cg.command(&mut cmd);
    cmd.args(["-u", "/dev/zero", &format!("TCP:{}:{port}", hosts.rx_addr(false))]).stdout(Stdio::null());
    Sender(cmd.spawn().expect("start socat (scripts/setup.sh installs it)"))
}

/// Bytes per second each counter grows by over `window`.
fn rates(counters: &[&AtomicU64], window: Duration) -> Vec<f64> {
    let before: Vec<u64> = counters.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    let t = Instant::now();
    std::thread::sleep(window);
    let secs = t.elapsed().as_secs_f64();
    counters.iter().zip(before).map(|(c, b)| (c.load(Ordering::Relaxed) - b) as f64 / secs).collect()
}

#[test]
fn htb_classes_hold_each_application_between_its_guaranteed_and_highest_rate() {
    if !netlane_testkit::privileged("htb_classes_hold_each_application_between_its_guaranteed_and_highest_rate") {
        return;
    }
    const MB: u64 = 1_000_000;
    let hosts = TwoHosts::create("apps-htb", LinkConfig::default()).unwrap();
    let a = AppSpec { name: "htb-a".into(), priority: 1, mark: 0xa, min_rate: 4 * MB, max_rate: 7 * MB, htb_prio: 0 };
    let b = AppSpec { name: "htb-b".into(), priority: 2, mark: 0xb, min_rate: 12 * MB, max_rate: 25 * MB, htb_prio: 0 };
    let plan = apps::plan(25 * MB, &[a.clone(), b.clone()]).unwrap();
    let ifindex = hosts.tx_index;
    let mut shaper = hosts.tx.run(move || Shaper::install(ifindex, plan)).unwrap().unwrap();
    assert_eq!(hosts.egress_qdisc().unwrap().0, "htb");
    let (cg_a, cg_b) = (AppCgroup::create(&a).unwrap(), AppCgroup::create(&b).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let (got_a, got_b) = (sink(&hosts, 9301, stop.clone()), sink(&hosts, 9302, stop.clone()));
    let check = |what: &str, rate: f64, lo: f64, hi: f64| {
        assert!(rate >= lo && rate <= hi, "{what}: {:.2} MB/s, expected {:.2}..{:.2}", rate / 1e6, lo / 1e6, hi / 1e6);
    };

    // Both busy: each gets at least its guarantee; A no more than its ceiling; together
    // no more than the link.
    let send_a = bulk_sender(&hosts, &cg_a, 9301);
    let send_b = bulk_sender(&hosts, &cg_b, 9302);
    std::thread::sleep(Duration::from_millis(800));
    let r = rates(&[&got_a, &got_b], Duration::from_secs(2));
    check("A beside B", r[0], 0.8 * a.min_rate as f64, 1.1 * a.max_rate as f64);
    check("B beside A", r[1], 0.8 * b.min_rate as f64, 1.1 * b.max_rate as f64);
    check("A and B together", r[0] + r[1], 0.7 * 25e6, 1.1 * 25e6);

    // A alone: the link is free, but A stays under its ceiling.
    drop(send_b);
    std::thread::sleep(Duration::from_millis(500));
    let r = rates(&[&got_a], Duration::from_secs(2));
    check("A alone", r[0], 0.7 * a.max_rate as f64, 1.1 * a.max_rate as f64);
    drop(send_a);

    assert_eq!(shaper.backend(), ShapingBackend::Htb);
    let (classified, _) = shaper.classified().unwrap().expect("htb counts what it classifies");
    assert!(classified > 100, "the classifier put only {classified} packets in a class");
    let classes = shaper.classes().unwrap();
    for app in ["htb-a", "htb-b"] {
        let c = classes.iter().find(|c| c.app == app).unwrap();
        assert!(c.stats.bytes > 5 * MB, "{app}'s class sent only {} bytes: {classes:?}", c.stats.bytes);
    }
    stop.store(true, Ordering::Relaxed);
    drop(shaper);
    assert_eq!(hosts.egress_qdisc().unwrap().0, "noqueue", "the shaper's qdisc is removed on drop");
}

#[test]
fn mqprio_channel_mode_is_detected_and_htb_takes_over_with_the_reason() {
    if !netlane_testkit::privileged("mqprio_channel_mode_is_detected_and_htb_takes_over_with_the_reason") {
        return;
    }
    const MB: u64 = 1_000_000;
    let hosts = TwoHosts::create("apps-mqprio", LinkConfig { mtu: 1500, queues: 4, ..LinkConfig::default() }).unwrap();
    let a = AppSpec { name: "mq-a".into(), priority: 3, mark: 0xa, min_rate: 4 * MB, max_rate: 7 * MB, htb_prio: 0 };
    let b = AppSpec { name: "mq-b".into(), priority: 5, mark: 0xb, min_rate: 2 * MB, max_rate: 9 * MB, htb_prio: 0 };
    let plan = apps::plan(25 * MB, &[a.clone(), b.clone()]).unwrap();
    let layout = plan.mqprio_layout(4).unwrap();
    assert_eq!(layout.queues, [(0, 2), (2, 1), (3, 1)]);
    assert_eq!((layout.prio_tc_map[3], layout.prio_tc_map[5], layout.prio_tc_map[0]), (1, 2, 0));
    let ifindex = hosts.tx_index;

    // No device here offloads mqprio's channel mode (veth has no ndo_setup_tc, and this
    // kernel may have no mqprio at all): asking for it fails, says why, changes nothing.
    let p = plan.clone();
    let e = hosts.tx.run(move || Shaper::install_with(ifindex, p, BackendChoice::Mqprio)).unwrap().unwrap_err();
    let e = e.to_string();
    eprintln!("mqprio refused: {e}");
    assert!(
        e.contains("this kernel has no mqprio qdisc") || e.contains("refused") || e.contains("does not offload"),
        "{e}"
    );
    assert_eq!(hosts.egress_qdisc().unwrap().0, "noqueue", "a refused mqprio leaves the qdisc as it was");

    // Auto: htb, with the kernel's reason.
    let p = plan.clone();
    let shaper = hosts.tx.run(move || Shaper::install_with(ifindex, p, BackendChoice::Auto)).unwrap().unwrap();
    assert_eq!(shaper.backend(), ShapingBackend::Htb);
    let why = shaper.why_not_mqprio().unwrap().to_string();
    assert!(e.ends_with(&why), "auto gives the same reason as the refusal: {why:?} vs {e:?}");
    assert_eq!(hosts.egress_qdisc().unwrap().0, "htb");
    drop(shaper);

    // Plans mqprio cannot express are refused before the kernel is asked.
    let zero = AppSpec { priority: 0, ..a.clone() };
    let p = apps::plan(25 * MB, &[zero, b.clone()]).unwrap();
    let e = hosts.tx.run(move || Shaper::install_with(ifindex, p, BackendChoice::Mqprio)).unwrap().unwrap_err();
    assert!(e.to_string().contains("priority 0, every other socket's"), "{e}");
    let twice = AppSpec { priority: 5, ..a.clone() };
    assert!(
        apps::plan(25 * MB, &[twice, b.clone()]).unwrap().mqprio_layout(4).unwrap_err().contains("share priority 5")
    );
    assert!(plan.mqprio_layout(2).unwrap_err().contains("2 transmit queues; mqprio needs one per traffic class (3)"));
    assert_eq!(hosts.egress_qdisc().unwrap().0, "noqueue");
}

#[test]
fn each_application_s_flows_land_on_its_queue_group() {
    if !netlane_testkit::privileged("each_application_s_flows_land_on_its_queue_group") {
        return;
    }
    use netlane::lanes::groups::{GroupRule, QueueGroups, SteerProto};
    use netlane::topology::RxTuning;
    // Four queues with a NAPI instance each; the client end's TSO off so that TCP takes
    // the NAPI path and every server socket learns the id of the queue it came through.
    let hosts = TwoHosts::create("apps-groups", LinkConfig { mtu: 1500, queues: 4, rx: RxTuning::threaded_napi() })
        .expect("two namespaces");
    hosts.set_tx_tso(false).unwrap();
    let rx_index = hosts.rx_index;
    let dev = hosts.rx.run(move || netlane::lanes::queues::discover(rx_index)).unwrap().unwrap();
    let napi_of = |q: u32| dev.rx.iter().find(|r| r.queue == q).map(|r| r.napi_id).unwrap();
    let (a, b) = (SocketAddr::new(hosts.rx_addr(false), 9501), SocketAddr::new(hosts.rx_addr(false), 9502));
    let tx_index = hosts.tx_index;
    let mut groups = hosts.tx.run(move || QueueGroups::install(tx_index, 4)).unwrap().unwrap();
    groups.add(GroupRule { dst: a, proto: SteerProto::Tcp, first: 0, count: 2 }).unwrap();
    groups.add(GroupRule { dst: b, proto: SteerProto::Tcp, first: 2, count: 2 }).unwrap();
    let e = groups.add(GroupRule { dst: b, proto: SteerProto::Tcp, first: 3, count: 2 }).unwrap_err().to_string();
    assert!(e.contains("queues 0..4"), "{e}");

    for (dst, want) in [(a, [napi_of(0), napi_of(1)]), (b, [napi_of(2), napi_of(3)])] {
        let listener = hosts.rx.run(move || TcpListener::bind(dst).unwrap()).unwrap();
        let clients: Vec<std::net::TcpStream> = hosts
            .tx
            .run(move || {
                (0..32)
                    .map(|_| {
                        let mut s = std::net::TcpStream::connect_timeout(&dst, Duration::from_secs(5)).unwrap();
                        std::io::Write::write_all(&mut s, b"x").unwrap();
                        s
                    })
                    .collect()
            })
            .unwrap();
        let mut seen = std::collections::BTreeMap::new();
        for _ in 0..clients.len() {
            let (mut c, _) = listener.accept().unwrap();
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut byte = [0u8; 1];
            c.read_exact(&mut byte).unwrap();
            let id = netlane::sockopt::incoming_napi_id(std::os::fd::AsFd::as_fd(&c)).unwrap();
            *seen.entry(id).or_insert(0) += 1;
        }
        assert!(
            seen.keys().all(|id| want.contains(id)),
            "{dst}: flows arrived through NAPI ids {seen:?}, its group is {want:?}"
        );
        assert_eq!(seen.len(), 2, "{dst}: 32 flows spread over both queues of the group: {seen:?}");
    }
    let (steered, _) = groups.counts().unwrap();
    assert!(steered >= 128, "every packet of the 64 flows was steered, counted {steered}");
}

/// Beyond tc's 16 traffic classes: 100 applications, each with its class in the kernel,
/// and every datagram of each (marked with SO_MARK directly, the mark its cgroup program
/// would give it) counted in its own class and nowhere else.
#[test]
fn a_hundred_applications_each_get_their_own_class_in_the_kernel() {
    if !netlane_testkit::privileged("a_hundred_applications_each_get_their_own_class_in_the_kernel") {
        return;
    }
    const MB: u64 = 1_000_000;
    const APPS: u32 = 100;
    let hosts = TwoHosts::create("apps-100", LinkConfig::default()).unwrap();
    let specs: Vec<AppSpec> = (1..=APPS)
        .map(|i| AppSpec {
            name: format!("app-{i}"),
            priority: i % 16,
            mark: 0x1000 + i,
            min_rate: MB,
            max_rate: 100 * MB,
            htb_prio: i % 8,
        })
        .collect();
    let plan = apps::plan(125 * MB, &specs).unwrap();
    let ifindex = hosts.tx_index;
    let mut shaper = hosts.tx.run(move || Shaper::install(ifindex, plan)).unwrap().unwrap();
    assert_eq!(shaper.backend(), ShapingBackend::Htb);
    // Application i sends i datagrams, so that each class's count names its sender.
    let dst = SocketAddr::new(TwoHosts::RX_V4.into(), 9400);
    hosts
        .tx
        .run(move || {
            for i in 1..=APPS {
                let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).unwrap();
                s.set_mark(0x1000 + i).unwrap();
                for _ in 0..i {
                    s.send_to(b"classified", &dst.into()).unwrap();
                }
            }
        })
        .unwrap();
    // htb counts a packet when it leaves its class, and a burst this long is partly sent
    // from the transmit softirq after the last send returns: read until every
    // application's class has counted its datagrams (within a bound). The default class
    // takes the unmarked rest (ARP), not counted here.
    let all_left = |classes: &[netlane::lanes::apps::ClassReport]| {
        (1..=APPS).all(|i| classes.iter().any(|c| c.app == format!("app-{i}") && c.stats.packets >= u64::from(i)))
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let classes = loop {
        let classes = shaper.classes().unwrap();
        if all_left(&classes) || Instant::now() > deadline {
            break classes;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    for i in 1..=APPS {
        let c = classes.iter().find(|c| c.app == format!("app-{i}")).unwrap_or_else(|| panic!("no class of app-{i}"));
        assert_eq!(c.stats.packets, u64::from(i), "app-{i} in class {}: {classes:?}", c.class);
    }
    let (classified, _) = shaper.classified().unwrap().expect("htb counts what it classifies");
    assert!(classified >= u64::from(APPS * (APPS + 1) / 2), "{classified}");
    drop(shaper);
    assert_eq!(hosts.egress_qdisc().unwrap().0, "noqueue", "the shaper's qdisc is removed on drop");
}

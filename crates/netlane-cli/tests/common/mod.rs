//! What the command line's integration tests share: running `netlane`, its output, its
//! JSON documents checked against their schema, child processes that are reaped.

#![allow(dead_code)] // each test binary uses its own part

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdout, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A test's hold on a lock that keeps others of its kind from running beside it.
pub type Alone = std::sync::MutexGuard<'static, ()>;

/// Waits for `lock` (a test that failed holding it does not keep the others out).
pub fn alone(lock: &'static std::sync::Mutex<()>) -> Alone {
    lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub fn netlane(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_netlane")).args(args).output().expect("run netlane")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("netlane-cli-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Parses `text` as JSON and validates it against `docs/schema/<kind>.schema.json`.
pub fn valid_document(text: &str, kind: &str) -> serde_json::Value {
    let doc: serde_json::Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    let path = repo().join(format!("docs/schema/{kind}.schema.json"));
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
            .unwrap();
    let v = jsonschema::validator_for(&schema).expect("a valid schema");
    let errors: Vec<String> = v.iter_errors(&doc).map(|e| format!("{} at {}", e, e.instance_path())).collect();
    assert!(errors.is_empty(), "{kind} document does not match its schema:\n{}", errors.join("\n"));
    assert_eq!(doc["schema_version"], 2);
    assert_eq!(doc["provenance"]["tool"], "netlane");
    assert!(doc["provenance"]["git_commit"].as_str().is_some_and(|c| !c.is_empty()));
    assert!(doc["host"]["cpus"].as_u64().unwrap() >= 1);
    doc
}

/// A child process killed and reaped on drop (by the PID this test started).
pub struct Reaped(pub std::process::Child);

impl std::ops::Deref for Reaped {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Reaped {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Starts `netlane args...` (a server) and reads its first line, `listening on ADDR ...`:
/// the process, the address, and the rest of its standard output.
pub fn start_listening(args: &[&str]) -> (Reaped, String, BufReader<ChildStdout>) {
    let Started { mut child, out, first } = Started::new(args);
    let addr = first.strip_prefix("listening on ").and_then(|r| r.split_whitespace().next()).unwrap_or_default();
    if addr.is_empty() {
        let mut err = String::new();
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        panic!("netlane {args:?} said {first:?}, stderr {err:?}");
    }
    let addr = addr.to_string();
    (child, addr, out)
}

/// [`prometheus_samples`] once the sample `name` reads `value` (the counters a server
/// publishes may trail what a client already saw), or as they are after 5 s.
pub fn prometheus_samples_once(addr: &str, name: &str, value: f64) -> Vec<(String, String, f64)> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let samples = prometheus_samples(addr);
        if samples.iter().any(|s| s.0 == name && s.2 == value) || Instant::now() > deadline {
            return samples;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// GET http://`addr`/metrics, parsed by Debian's python3-prometheus-client: (sample
/// name, labels as `k=v,k=v` sorted, value) for every sample.
pub fn prometheus_samples(addr: &str) -> Vec<(String, String, f64)> {
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    write!(c, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut resp = String::new();
    c.read_to_string(&mut resp).unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200") && head.contains("text/plain; version=0.0.4"), "{head}");
    let parser = "import sys\nfrom prometheus_client.parser import text_string_to_metric_families as f\n\
                  for fam in f(sys.stdin.read()):\n  for s in fam.samples:\n    \
                  print(s.name, ','.join(k + '=' + v for k, v in sorted(s.labels.items())), s.value, sep='\\t')\n";
    let mut py = Command::new("/usr/bin/python3")
        .args(["-c", parser])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("/usr/bin/python3 (scripts/setup.sh installs it with python3-prometheus-client)");
    py.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    let o = py.wait_with_output().unwrap();
    assert!(o.status.success(), "the Prometheus parser refused the exposition: {}\n{body}", stderr(&o));
    stdout(&o)
        .lines()
        .map(|l| {
            let mut f = l.split('\t');
            let (n, labels, v) = (f.next().unwrap(), f.next().unwrap_or(""), f.next().unwrap());
            (n.to_string(), labels.to_string(), v.parse().unwrap())
        })
        .collect()
}

/// A server started by a test: the process, its standard output after the first line,
/// and what that line says.
pub struct Started {
    pub child: Reaped,
    pub out: BufReader<ChildStdout>,
    /// `listening on ADDR ...`.
    pub first: String,
}

impl Started {
    /// `netlane args...`, its first line read.
    pub fn new(args: &[&str]) -> Started {
        let mut child = Reaped(
            Command::new(env!("CARGO_BIN_EXE_netlane"))
                .args(args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("start netlane {args:?}: {e}")),
        );
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        out.read_line(&mut first).unwrap();
        Started { child, out, first }
    }

    /// The address it serves: the word after `listening on`.
    pub fn addr(&self) -> String {
        self.first.split_whitespace().nth(2).unwrap_or_else(|| panic!("no address in {:?}", self.first)).to_string()
    }

    /// Its metrics endpoint, `ADDR` of `metrics=http://ADDR/metrics` on the first line.
    pub fn metrics(&self) -> String {
        self.first
            .split_whitespace()
            .find_map(|w| w.strip_prefix("metrics=http://"))
            .and_then(|w| w.strip_suffix("/metrics"))
            .unwrap_or_else(|| panic!("no metrics endpoint in {:?}", self.first))
            .to_string()
    }

    /// Stops it with SIGTERM: its exit code, the rest of its standard output, and its
    /// standard error.
    pub fn stop(mut self) -> (Option<i32>, String, String) {
        let st = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap();
        assert!(st.success());
        let mut rest = String::new();
        self.out.read_to_string(&mut rest).unwrap();
        let code = self.child.wait().unwrap().code();
        let mut err = String::new();
        self.child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        (code, rest, err)
    }
}

/// Two namespaces `<label>-a` and `<label>-b` joined by a veth pair named `names`,
/// addressed 10.`subnet`.0.1/24 and .2.
pub fn veth_pair(label: &str, names: (&str, &str), subnet: u8) -> (netlane::topology::Netns, netlane::topology::Netns) {
    use std::net::{IpAddr, Ipv4Addr};
    let a = netlane::topology::Netns::create(&format!("{label}-a")).unwrap();
    let b = netlane::topology::Netns::create(&format!("{label}-b")).unwrap();
    let addr = |o| [(IpAddr::V4(Ipv4Addr::new(10, subnet, 0, o)), 24)];
    let (aa, ba) = (addr(1), addr(2));
    netlane::topology::veth_link(
        netlane::topology::End { ns: &a, name: names.0, addrs: &aa },
        netlane::topology::End { ns: &b, name: names.1, addrs: &ba },
        1500,
    )
    .unwrap();
    (a, b)
}

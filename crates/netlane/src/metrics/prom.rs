//! The Prometheus text exposition format (version 0.0.4), written from snapshots, and a
//! small HTTP endpoint that serves it.
//!
//! Servers keep their own counters (atomics, per-thread structs published by their
//! threads); at scrape time they render a snapshot with [`Exposition`]. The endpoint is
//! for a loopback address only: one request per connection, bounded in size and time,
//! served by one thread that stops when the [`MetricsServer`] is dropped.

use std::fmt::{Display, Write as _};
use std::io::{self, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// Escapes a label value (backslash, double quote, newline).
pub fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// A metric family's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (a `_total` name).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Cumulative buckets, `_sum` and `_count`.
    Histogram,
}

impl Kind {
    fn word(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// A document being written: families (HELP and TYPE) followed by their samples.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    /// An empty document.
    pub fn new() -> Exposition {
        Exposition::default()
    }

    /// Starts a family: its HELP and TYPE lines. Samples of it follow.
    pub fn family(&mut self, name: &str, help: &str, kind: Kind) -> &mut Self {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {}", kind.word());
        self
    }

    /// One sample: `name{labels} value`.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl Display) -> &mut Self {
        self.out.push_str(name);
        self.labels(labels, None);
        let _ = writeln!(self.out, " {value}");
        self
    }

    /// A histogram's samples: `buckets` are (upper bound, count in that bucket alone) in
    /// increasing order; written cumulatively with the `+Inf` bucket, `_sum` and `_count`.
    pub fn histogram(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        buckets: impl IntoIterator<Item = (f64, u64)>,
        sum: f64,
    ) -> &mut Self {
        let mut total = 0u64;
        for (le, n) in buckets {
            total += n;
            let _ = write!(self.out, "{name}_bucket");
            self.labels(labels, Some(&le.to_string()));
            let _ = writeln!(self.out, " {total}");
        }
        let _ = write!(self.out, "{name}_bucket");
        self.labels(labels, Some("+Inf"));
        let _ = writeln!(self.out, " {total}");
        let _ = write!(self.out, "{name}_sum");
        self.labels(labels, None);
        let _ = writeln!(self.out, " {sum}");
        let _ = write!(self.out, "{name}_count");
        self.labels(labels, None);
        let _ = writeln!(self.out, " {total}");
        self
    }

    fn labels(&mut self, labels: &[(&str, &str)], le: Option<&str>) {
        if labels.is_empty() && le.is_none() {
            return;
        }
        self.out.push('{');
        let mut first = true;
        for (k, v) in labels.iter().map(|(k, v)| (*k, escape_label(v))).chain(le.map(|l| ("le", l.to_string()))) {
            if !first {
                self.out.push(',');
            }
            first = false;
            let _ = write!(self.out, "{k}=\"{v}\"");
        }
        self.out.push('}');
    }

    /// The document.
    pub fn finish(self) -> String {
        self.out
    }
}

/// What the endpoint answers for a path: content type and body, or `None` (404).
pub type Handler = dyn Fn(&str) -> Option<(&'static str, String)> + Send + Sync;

/// The content type of the text exposition format.
pub const TEXT_FORMAT: &str = "text/plain; version=0.0.4";

/// Longest request head the endpoint reads, and how long it waits for it or for the
/// client to take the answer.
const REQUEST_MAX: usize = 1024;
const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);

/// An HTTP endpoint on a loopback address; stops (and joins its thread) when dropped.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// Refuses an address that is not loopback: metrics carry addresses of peers and are
/// not for the network.
pub fn check_metrics_addr(addr: SocketAddr) -> Result<(), String> {
    if addr.ip().is_loopback() {
        Ok(())
    } else {
        Err(format!("--metrics-addr {addr}: serve metrics on a loopback address only"))
    }
}

impl MetricsServer {
    /// Binds `addr` (loopback only) and serves `handler` on a thread named `name`.
    pub fn start(addr: SocketAddr, name: &str, handler: Arc<Handler>) -> io::Result<MetricsServer> {
        check_metrics_addr(addr).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new().name(name.into()).spawn(move || serve(&listener, &flag, &*handler))?;
        Ok(MetricsServer { addr, stop, thread: Some(thread) })
    }

    /// The bound address (with the port the kernel chose for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(listener: &TcpListener, stop: &AtomicBool, handler: &Handler) {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    while !stop.load(Ordering::Relaxed) {
        let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
        if !matches!(poll(&mut fds, PollTimeout::from(100u16)), Ok(n) if n > 0) {
            continue;
        }
        let Ok((mut conn, _)) = listener.accept() else {
            // Out of descriptors or the like: do not spin on it.
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        let _ = conn.set_read_timeout(Some(CLIENT_TIMEOUT));
        let _ = conn.set_write_timeout(Some(CLIENT_TIMEOUT));
        // The request head, up to its blank line (a client may write it in pieces);
        // answering before it all arrived would make the client's later writes fail.
        let mut req = [0u8; REQUEST_MAX];
        let mut n = 0;
        while n < req.len() && !req[..n].windows(4).any(|w| w == b"\r\n\r\n") {
            match conn.read(&mut req[n..]) {
                Ok(0) | Err(_) => break,
                Ok(m) => n += m,
            }
        }
        let line = String::from_utf8_lossy(&req[..n]);
        let mut words = line.split_whitespace();
        let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or("/"));
        let (status, ctype, body) = if method != "GET" {
            ("405 Method Not Allowed", "text/plain", "GET only\n".to_string())
        } else {
            match handler(path) {
                Some((ctype, body)) => ("200 OK", ctype, body),
                None => ("404 Not Found", "text/plain", "try /metrics\n".to_string()),
            }
        };
        let _ = write!(
            conn,
            "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_has_help_type_escaped_labels_and_cumulative_buckets() {
        let mut e = Exposition::new();
        e.family("x_total", "Things.\nMore", Kind::Counter).sample("x_total", &[("a", "q\"\\\n")], 5);
        e.family("lat_seconds", "Latency.", Kind::Histogram).histogram(
            "lat_seconds",
            &[("q", "1")],
            [(0.001, 2), (0.002, 0), (0.004, 3)],
            0.01,
        );
        let t = e.finish();
        assert!(t.starts_with("# HELP x_total Things.\\nMore\n# TYPE x_total counter\n"), "{t}");
        assert!(t.contains("x_total{a=\"q\\\"\\\\\\n\"} 5\n"), "{t}");
        assert!(t.contains("lat_seconds_bucket{q=\"1\",le=\"0.002\"} 2\n"), "{t}");
        assert!(t.contains("lat_seconds_bucket{q=\"1\",le=\"0.004\"} 5\n"), "{t}");
        assert!(t.contains("lat_seconds_bucket{q=\"1\",le=\"+Inf\"} 5\n"), "{t}");
        assert!(t.contains("lat_seconds_count{q=\"1\"} 5\n"), "{t}");
        assert!(t.contains("lat_seconds_sum{q=\"1\"} 0.01\n"), "{t}");
    }

    #[test]
    fn the_endpoint_serves_stops_and_refuses_other_addresses() {
        let h: Arc<Handler> = Arc::new(|p: &str| (p == "/metrics").then(|| (TEXT_FORMAT, "up 1\n".to_string())));
        let s = MetricsServer::start("127.0.0.1:0".parse().unwrap(), "test-metrics", h.clone()).unwrap();
        let get = |path: &str| {
            let mut c = std::net::TcpStream::connect(s.local_addr()).unwrap();
            // In pieces, as a client may send it.
            write!(c, "GET {path} HTTP/1.1\r\n").unwrap();
            std::thread::sleep(Duration::from_millis(20));
            write!(c, "Host: x\r\n\r\n").unwrap();
            let mut r = String::new();
            c.read_to_string(&mut r).unwrap();
            r
        };
        let ok = get("/metrics");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n") && ok.ends_with("\r\n\r\nup 1\n"), "{ok}");
        assert!(get("/nothing").starts_with("HTTP/1.1 404"));
        let addr = s.local_addr();
        drop(s);
        assert!(std::net::TcpStream::connect(addr).is_err(), "still listening after drop");
        assert!(MetricsServer::start("0.0.0.0:0".parse().unwrap(), "m", h).is_err());
    }
}

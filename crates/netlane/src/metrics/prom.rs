//! The Prometheus text exposition format (version 0.0.4), written from snapshots, and a
//! small HTTP endpoint that serves it.
//!
//! Servers keep their own counters (atomics, per-thread structs published by their
//! threads); at scrape time they render a snapshot with [`Exposition`]. The endpoint is
//! for a loopback address only: HTTP/1.1 (hyper), connections served concurrently and
//! bounded in number and time, on one thread that stops when the [`MetricsServer`] is
//! dropped.

use std::fmt::{Display, Write as _};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;

/// Escapes a label value (backslash, double quote, newline).
pub fn escape_label(v: &str) -> std::borrow::Cow<'_, str> {
    // Most values need nothing: no copy then (a page may have a million labels).
    if !v.contains(['\\', '"', '\n']) {
        return std::borrow::Cow::Borrowed(v);
    }
    std::borrow::Cow::Owned(v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n"))
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
    fn name(self) -> &'static str {
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
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {}", kind.name());
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

    /// Every counter of `set` as a family of its own: `{prefix}_{name}_total`, its doc
    /// comment the HELP text.
    pub fn counters(&mut self, prefix: &str, set: &impl super::CounterSet) -> &mut Self {
        set.each(&mut |name, help, v| {
            let n = format!("{prefix}_{name}_total");
            self.family(&n, help, Kind::Counter).sample(&n, &[], v);
        });
        self
    }

    fn labels(&mut self, labels: &[(&str, &str)], le: Option<&str>) {
        if labels.is_empty() && le.is_none() {
            return;
        }
        self.out.push('{');
        let mut first = true;
        for (k, v) in labels
            .iter()
            .map(|(k, v)| (*k, escape_label(v)))
            .chain(le.map(|l| ("le", std::borrow::Cow::Owned(l.to_string()))))
        {
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

/// How long the endpoint waits for a request head, and for a whole exchange.
const HEAD_TIMEOUT: Duration = Duration::from_secs(2);
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections served at once; more are closed at once (a scraper retries).
pub const MAX_CONNECTIONS: usize = 64;

/// An HTTP/1.1 endpoint (hyper) on a loopback address, serving connections concurrently
/// on a thread of its own: each connection gets `HEAD_TIMEOUT` to send its request
/// head and `EXCHANGE_TIMEOUT` in all, at most [`MAX_CONNECTIONS`] at once, so idle or
/// slow clients cannot hold a scrape up. Stops (and joins its thread) when dropped.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// Refuses an address that is not loopback: metrics carry addresses of peers and are
/// not for the network.
pub fn check_metrics_addr(addr: SocketAddr) -> Result<(), String> {
    if addr.ip().is_loopback() { Ok(()) } else { Err("serve metrics on a loopback address only".into()) }
}

impl MetricsServer {
    /// Binds `addr` (loopback only) and serves `handler` on a thread named `name`.
    pub fn start(addr: SocketAddr, name: &str, handler: Arc<Handler>) -> io::Result<MetricsServer> {
        check_metrics_addr(addr).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{addr}: {e}")))?;
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let rt = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build()?;
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let thread = std::thread::Builder::new().name(name.into()).spawn(move || {
            rt.block_on(async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => serve(l, stopped, handler).await,
                    Err(e) => tracing::warn!(error = %e, "metrics endpoint: cannot use its socket"),
                }
            })
        })?;
        Ok(MetricsServer { addr, stop: Some(stop), thread: Some(thread) })
    }

    /// The bound address (with the port the kernel chose for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn serve(
    listener: tokio::net::TcpListener,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
    handler: Arc<Handler>,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let conn = tokio::select! {
            _ = &mut stopped => return,
            c = listener.accept() => c,
        };
        let Ok((stream, _)) = conn else {
            // Out of descriptors or the like: do not spin on it.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        // Over the limit: closed at once, the others are not held up.
        let Ok(slot) = slots.clone().try_acquire_owned() else { continue };
        let handler = handler.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let answer = respond(&*handler, req.method(), req.uri().path());
                async move { Ok::<_, std::convert::Infallible>(answer) }
            });
            let exchange = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .keep_alive(false)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            let _ = tokio::time::timeout(EXCHANGE_TIMEOUT, exchange).await;
            drop(slot);
        });
    }
}

fn respond(handler: &Handler, method: &hyper::Method, path: &str) -> hyper::Response<Full<Bytes>> {
    let (status, ctype, body) = if method != hyper::Method::GET {
        (hyper::StatusCode::METHOD_NOT_ALLOWED, "text/plain", "GET only\n".to_string())
    } else {
        match handler(path) {
            Some((ctype, body)) => (hyper::StatusCode::OK, ctype, body),
            None => (hyper::StatusCode::NOT_FOUND, "text/plain", "try /metrics\n".to_string()),
        }
    };
    let mut r = hyper::Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(ctype) {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read as _, Write as _};

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
    fn idle_connections_do_not_hold_up_a_scrape() {
        let h: Arc<Handler> = Arc::new(|p: &str| (p == "/metrics").then(|| (TEXT_FORMAT, "up 1\n".to_string())));
        let s = MetricsServer::start("127.0.0.1:0".parse().unwrap(), "test-metrics", h).unwrap();
        // Fifteen clients that connect and say nothing, one that sends half a head.
        let mut idle: Vec<std::net::TcpStream> =
            (0..15).map(|_| std::net::TcpStream::connect(s.local_addr()).unwrap()).collect();
        let mut half = std::net::TcpStream::connect(s.local_addr()).unwrap();
        write!(half, "GET /metrics HTTP/1.1\r\n").unwrap();
        idle.push(half);
        let t = std::time::Instant::now();
        let mut c = std::net::TcpStream::connect(s.local_addr()).unwrap();
        write!(c, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut r = String::new();
        c.read_to_string(&mut r).unwrap();
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n") && r.ends_with("\r\n\r\nup 1\n"), "{r}");
        assert!(t.elapsed() < HEAD_TIMEOUT, "the scrape waited {:?} behind idle clients", t.elapsed());
        // The half-sent head times out and its connection is closed.
        let mut rest = Vec::new();
        let waited = std::time::Instant::now();
        let _ = idle[15].read_to_end(&mut rest);
        assert!(waited.elapsed() < HEAD_TIMEOUT + Duration::from_secs(2), "a slow client kept its connection");
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

//! The two ends' jobs, each run on the calling thread in its network namespace: what
//! `netlane bulk send` and `netlane bulk recv` do between their options and their
//! reports, and what the lab's threads do when both ends are threads.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::AtomicBool;

use serde::Serialize;

use super::{BulkError, RxReport, RxSpec, Transport, TxReport, TxSpec, io_err, receiver, tcp_tx, udp_tx};

/// How SO_TXTIME can be used on the sender's path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub enum Txtime {
    /// The egress qdisc honours release times (fq, etf, taprio).
    Kernel,
    /// It does not; the reason is reported.
    Unsupported(String),
}

/// Everything a sender needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SenderJob {
    /// What to send.
    pub spec: TxSpec,
    /// Where to (its family is the run's).
    pub dst: SocketAddr,
    /// Run id for the datagram headers.
    pub run_id: u32,
}

impl SenderJob {
    /// Checks the job for values that cannot work (see [`TxSpec::validate`]).
    pub fn validate(&self) -> Result<(), BulkError> {
        self.spec.validate(self.dst.is_ipv6(), None)
    }
}

/// Runs the sender described by `job` on the calling thread (pinned as the job says), in
/// the calling thread's network namespace. This is all `netlane bulk send` does between
/// its options and its report.
pub fn run_sender_job(job: &SenderJob) -> Result<TxReport, BulkError> {
    job.validate()?;
    netlane::cpus::pin(job.spec.cpu);
    match job.spec.transport {
        Transport::Udp => {
            let txtime = if job.spec.pacing.is_some() {
                txtime_support(job.dst.ip())?
            } else {
                Txtime::Unsupported("not paced".into())
            };
            udp_tx::send(&job.spec, job.dst, job.dst.is_ipv6(), job.run_id, &txtime)
        }
        Transport::Tcp => tcp_tx::send(&job.spec, job.dst),
    }
}

/// Everything a receiver needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RecvJob {
    /// Address to bind (port 0 picks one).
    pub listen: SocketAddr,
    /// What the receiver does.
    pub spec: RxSpec,
    /// The run id the sender writes in its datagram headers.
    pub run_id: u32,
    /// The datagram size the sender uses (what full checks expect).
    pub datagram_size: usize,
}

/// A receiver whose socket is bound (made in the calling thread's namespace, before any
/// sender starts, so no early datagram meets a closed port).
#[derive(Debug)]
pub struct BoundReceiver {
    socket: receiver::RxSocket,
    job: RecvJob,
    drops_before: u64,
}

impl BoundReceiver {
    /// Binds `job`'s socket.
    pub fn bind(job: RecvJob) -> Result<BoundReceiver, BulkError> {
        job.spec.validate()?;
        let socket = receiver::RxSocket::bind(job.listen, &job.spec)?;
        Ok(BoundReceiver { socket, job, drops_before: thread_udp_rcvbuf_errors() })
    }

    /// The address it receives on.
    pub fn local_addr(&self) -> SocketAddr {
        SocketAddr::new(self.job.listen.ip(), self.socket.port())
    }

    /// Receives on the calling thread (pinned as the job says) until `done` is set and
    /// the socket has gone quiet (or a TCP stream ended), then reports, with the
    /// datagrams the kernel dropped for a full receive buffer meanwhile (UDP
    /// RcvbufErrors of the namespace: other UDP receivers there count too).
    pub fn receive(self, done: &AtomicBool) -> Result<RxReport, BulkError> {
        netlane::cpus::pin(self.job.spec.cpu);
        let j = self.job;
        let mut report = self.socket.receive(&j.spec, j.run_id, j.datagram_size, done)?;
        report.kernel_drops = thread_udp_rcvbuf_errors().saturating_sub(self.drops_before);
        Ok(report)
    }
}

/// Qdiscs that hold packets until their SO_TXTIME release time.
const TXTIME_QDISCS: [&str; 3] = ["fq", "etf", "taprio"];

/// Whether packets to `dst` leave, in the calling thread's namespace, through a qdisc
/// that honours SO_TXTIME.
fn txtime_support(dst: IpAddr) -> Result<Txtime, BulkError> {
    let mut rtnl = netlane::topology::Rtnl::open().map_err(io_err("open a route netlink socket"))?;
    let route_err = |e: netlane::topology::NetlinkError| BulkError::Topology(e.into());
    let kind = match rtnl.output_interface(dst).map_err(route_err)? {
        Some(index) => rtnl.root_qdisc(index).map_err(route_err)?.map_or_else(|| "noqueue".to_string(), |(k, _)| k),
        None => return Ok(Txtime::Unsupported(format!("no route to {dst}"))),
    };
    Ok(if TXTIME_QDISCS.contains(&kind.as_str()) {
        Txtime::Kernel
    } else {
        Txtime::Unsupported(format!("egress qdisc {kind} ignores release times; only fq, etf and taprio honour them"))
    })
}

/// Reads `Udp: ... RcvbufErrors` from /proc/net/snmp text.
fn udp_rcvbuf_errors(snmp: &str) -> u64 {
    let mut lines = snmp.lines().filter(|l| l.starts_with("Udp:"));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else { return 0 };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "RcvbufErrors")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// UDP RcvbufErrors of the calling thread's network namespace (`/proc/net` is the
/// process's, which a thread that entered another namespace has left).
fn thread_udp_rcvbuf_errors() -> u64 {
    udp_rcvbuf_errors(&std::fs::read_to_string("/proc/thread-self/net/snmp").unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rcvbuf_errors_are_read_from_snmp() {
        let snmp = "Ip: Forwarding\nIp: 1\nUdp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\nUdp: 10 0 5 3 42 0\nUdpLite: x\nUdpLite: 1\n";
        assert_eq!(udp_rcvbuf_errors(snmp), 42);
        assert_eq!(udp_rcvbuf_errors("nothing"), 0);
    }
}

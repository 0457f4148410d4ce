//! The two ends' jobs, each run on the calling thread in its network namespace: what
//! `netlane bulk send` and `netlane bulk recv` do between their options and their
//! reports, and what the lab's threads do when both ends are threads.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::AtomicBool;

use netlane::topology::QdiscInfo;
use serde::Serialize;

use super::{
    BulkError, Pacer, PacerRan, RxReport, RxSpec, Transport, TxReport, TxSpec, flows_tx, io_err, receiver, tcp_tx,
    udp_tx,
};

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
    if job.spec.transport == Transport::Tcp {
        return tcp_tx::send(&job.spec, job.dst);
    }
    let ipv6 = job.dst.is_ipv6();
    let egress = egress_qdisc(job.dst.ip())?;
    let pacer = match job.spec.pacing {
        Some(p) if job.spec.flows.is_none() => {
            let mut chosen = choose_pacer(p.pacer, job.dst, egress.as_ref())?;
            if chosen.clock == Some(TxClock::Tai) {
                // etf dequeues a packet from `delta` before its time: a release time
                // further ahead than that leaves the qdisc's timer the whole of `delta`
                // to be late in before the packet is dropped.
                let delta = egress.as_ref().and_then(|e| e.etf_delta_ns);
                chosen.lead_ns = delta.map_or(DEFAULT_TAI_LEAD_NS, |d| u64::from(d) + TAI_MARGIN_NS);
            }
            Some(chosen)
        }
        _ => None,
    };
    if let Some(e) = egress.as_ref().filter(|e| e.kind == "etf")
        && !pacer.as_ref().is_some_and(|c| c.ran == PacerRan::Txtime)
    {
        return Err(BulkError::Config(format!(
            "datagrams to {} leave through the {} qdisc, which drops every packet without a CLOCK_TAI release \
             time: only a sender pacing by release times (txtime) can send through it",
            job.dst.ip(),
            e.name
        )));
    }
    let drops_before = thread_udp_sndbuf_errors(ipv6);
    let mut report = match &job.spec.flows {
        Some(flows) => flows_tx::send(&job.spec, flows, job.dst, job.run_id)?,
        None => udp_tx::send(&job.spec, job.dst, ipv6, job.run_id, pacer.as_ref())?,
    };
    report.kernel_drops = thread_udp_sndbuf_errors(ipv6).saturating_sub(drops_before);
    Ok(report)
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

/// How a paced sender keeps its rate, chosen from what the egress qdisc does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ChosenPacer {
    /// Who keeps the rate.
    pub ran: PacerRan,
    /// The egress qdisc (`noqueue` without one, `no route` without a route).
    pub qdisc: String,
    /// The release times' clock, with `txtime`.
    pub clock: Option<TxClock>,
    /// Why the sender paces in user space when it was left to choose.
    pub user_because: Option<String>,
    /// How far ahead of now release times start, nanoseconds.
    pub lead_ns: u64,
}

/// Release times on CLOCK_TAI start this far ahead of now when etf's head start cannot
/// be read: etf refuses a packet whose time has passed when it reaches it.
const DEFAULT_TAI_LEAD_NS: u64 = 2_000_000;
/// Beyond etf's head start: time for a send to reach the qdisc.
const TAI_MARGIN_NS: u64 = 1_000_000;

/// The clock a qdisc reads release times on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TxClock {
    /// fq: CLOCK_MONOTONIC, the clock the pacer runs on.
    Monotonic,
    /// etf: CLOCK_TAI only.
    Tai,
}

impl TxClock {
    /// As reports write it.
    pub fn name(self) -> &'static str {
        match self {
            TxClock::Monotonic => "monotonic",
            TxClock::Tai => "tai",
        }
    }
}

/// Qdiscs that hold packets until their SO_TXTIME release time, and their clocks.
/// taprio is not one: in software it only checks that a time falls in an open gate
/// (and drops it unreported when not); it holds packets only with etf under it.
fn txtime_clock(qdisc: &str) -> Option<TxClock> {
    match qdisc {
        "fq" => Some(TxClock::Monotonic),
        "etf" => Some(TxClock::Tai),
        _ => None,
    }
}

/// The qdisc a device's packets wait in: its root qdisc, or the one under a root tbf.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Egress {
    /// As reports name it (`fq`, `fq under tbf`, `noqueue`).
    pub name: String,
    /// The kind of the qdisc that holds packets until they may leave.
    pub kind: String,
    /// etf's head start, nanoseconds.
    pub etf_delta_ns: Option<u32>,
}

/// Who paces a sender asked for `pacer` whose datagrams to `dst` leave through `egress`
/// (`None`: no route). An explicit kernel pacer the qdisc cannot run is an error, not a
/// quiet fallback.
pub(crate) fn choose_pacer(pacer: Pacer, dst: SocketAddr, egress: Option<&Egress>) -> Result<ChosenPacer, BulkError> {
    let name = egress.map_or_else(|| "no route".to_string(), |e| e.name.clone());
    let clock = egress.and_then(|e| txtime_clock(&e.kind));
    let chosen = |ran, clock, user_because| ChosenPacer { ran, qdisc: name.clone(), clock, user_because, lead_ns: 0 };
    let leaves = match egress {
        Some(e) => format!("datagrams to {} leave through the {} qdisc", dst.ip(), e.name),
        None => format!("there is no route to {}", dst.ip()),
    };
    Ok(match (pacer, clock) {
        (Pacer::Auto, Some(c)) | (Pacer::Txtime, Some(c)) => chosen(PacerRan::Txtime, Some(c), None),
        (Pacer::Auto, None) => {
            chosen(PacerRan::User, None, Some(format!("{leaves}, which ignores release times; fq and etf honour them")))
        }
        (Pacer::User, _) => chosen(PacerRan::User, None, None),
        (Pacer::Txtime, None) => {
            return Err(BulkError::Config(format!(
                "SO_TXTIME release times need an egress qdisc that honours them (fq or etf), but {leaves}"
            )));
        }
        (Pacer::FqRate, _) if egress.is_some_and(|e| e.kind == "fq") => chosen(PacerRan::FqRate, None, None),
        (Pacer::FqRate, _) => {
            return Err(BulkError::Config(format!(
                "SO_MAX_PACING_RATE paces UDP only under the fq qdisc, but {leaves}"
            )));
        }
    })
}

/// The qdisc packets to `dst` wait in, in the calling thread's namespace: the root
/// qdisc of the device they leave by (`noqueue` without one), or the qdisc under a root
/// tbf (the lab's bottleneck, with fq under it where the kernel has fq). `None` without
/// a route.
fn egress_qdisc(dst: IpAddr) -> Result<Option<Egress>, BulkError> {
    let mut rtnl = netlane::topology::Rtnl::open().map_err(io_err("open a route netlink socket"))?;
    let route_err = |e: netlane::topology::NetlinkError| BulkError::Topology(e.into());
    let Some(index) = rtnl.output_interface(dst).map_err(route_err)? else { return Ok(None) };
    Ok(Some(egress_of(&rtnl.qdiscs(index).map_err(route_err)?)))
}

/// [`egress_qdisc`]'s choice among a device's qdiscs.
fn egress_of(qdiscs: &[QdiscInfo]) -> Egress {
    let Some(root) = qdiscs.iter().find(|q| q.root) else {
        return Egress { name: "noqueue".into(), kind: "noqueue".into(), etf_delta_ns: None };
    };
    // mq (a multi-queue device's default) gives each transmit queue a qdisc of its own:
    // release times are honoured when every one of them honours them.
    let children: Vec<&QdiscInfo> = qdiscs.iter().filter(|q| !q.root && q.parent.0 == root.handle.0).collect();
    if root.kind == "mq"
        && let Some(first) = children.first()
        && txtime_clock(&first.kind).is_some()
        && children.iter().all(|c| c.kind == first.kind)
    {
        let delta = children.iter().filter_map(|c| c.etf_delta_ns()).min();
        return Egress { name: format!("{} under mq", first.kind), kind: first.kind.clone(), etf_delta_ns: delta };
    }
    let under = (root.kind == "tbf")
        .then(|| qdiscs.iter().find(|q| !q.root && q.parent == (root.handle.0, 1)))
        .flatten()
        // A tbf's default child (a bfifo) is not a qdisc of anyone's choosing.
        .filter(|q| q.kind != "bfifo");
    match under {
        Some(q) => {
            Egress { name: format!("{} under tbf", q.kind), kind: q.kind.clone(), etf_delta_ns: q.etf_delta_ns() }
        }
        None => Egress { name: root.kind.clone(), kind: root.kind.clone(), etf_delta_ns: root.etf_delta_ns() },
    }
}

/// Reads `Udp: ... <field>` (`RcvbufErrors`, `SndbufErrors`) from /proc/net/snmp text.
fn udp_counter(snmp: &str, field: &str) -> u64 {
    let mut lines = snmp.lines().filter(|l| l.starts_with("Udp:"));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else { return 0 };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == field)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// A UDP counter of the calling thread's network namespace (`/proc/net` is the
/// process's, which a thread that entered another namespace has left).
fn thread_udp_counter(field: &str) -> u64 {
    udp_counter(&std::fs::read_to_string("/proc/thread-self/net/snmp").unwrap_or_default(), field)
}

/// UDP SndbufErrors of the calling thread's namespace: `Udp6SndbufErrors` in
/// `snmp6` for IPv6 (the `Udp:` line of `snmp` is IPv4's).
fn thread_udp_sndbuf_errors(ipv6: bool) -> u64 {
    if !ipv6 {
        return thread_udp_counter("SndbufErrors");
    }
    let snmp6 = std::fs::read_to_string("/proc/thread-self/net/snmp6").unwrap_or_default();
    snmp6_counter(&snmp6, "Udp6SndbufErrors")
}

/// A counter of /proc/net/snmp6 text (a name and a value per line).
fn snmp6_counter(snmp6: &str, name: &str) -> u64 {
    snmp6
        .lines()
        .find_map(|l| l.split_once(char::is_whitespace).filter(|(n, _)| *n == name))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0)
}

/// UDP RcvbufErrors of the calling thread's namespace.
fn thread_udp_rcvbuf_errors() -> u64 {
    thread_udp_counter("RcvbufErrors")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pacer_is_chosen_from_the_egress_qdisc() {
        let dst: SocketAddr = "10.0.0.1:9000".parse().unwrap();
        let egress = |q: &str| Egress { name: q.into(), kind: q.into(), etf_delta_ns: None };
        let pick = |p, q: Option<&str>| choose_pacer(p, dst, q.map(egress).as_ref());
        let auto_fq = pick(Pacer::Auto, Some("fq")).unwrap();
        assert_eq!((auto_fq.ran, auto_fq.clock), (PacerRan::Txtime, Some(TxClock::Monotonic)));
        let etf = pick(Pacer::Txtime, Some("etf")).unwrap();
        assert_eq!((etf.ran, etf.clock, etf.qdisc.as_str()), (PacerRan::Txtime, Some(TxClock::Tai), "etf"));
        let auto_none = pick(Pacer::Auto, Some("noqueue")).unwrap();
        assert_eq!(auto_none.ran, PacerRan::User);
        assert!(auto_none.user_because.unwrap().contains("the noqueue qdisc, which ignores release times"));
        let user = pick(Pacer::User, Some("fq")).unwrap();
        assert_eq!((user.ran, user.clock, user.user_because), (PacerRan::User, None, None));
        assert_eq!(pick(Pacer::FqRate, Some("fq")).unwrap().ran, PacerRan::FqRate);
        let e = pick(Pacer::FqRate, Some("etf")).unwrap_err().to_string();
        assert!(e.contains("only under the fq qdisc") && e.contains("the etf qdisc"), "{e}");
        let e = pick(Pacer::Txtime, Some("tbf")).unwrap_err().to_string();
        assert!(e.contains("(fq or etf)") && e.contains("through the tbf qdisc"), "{e}");
        let e = pick(Pacer::Txtime, None).unwrap_err().to_string();
        assert!(e.contains("no route to 10.0.0.1"), "{e}");
    }

    #[test]
    fn the_egress_qdisc_is_the_root_or_the_one_under_a_tbf() {
        let q = |kind: &str, root, handle, parent, options: Vec<(u16, Vec<u8>)>| QdiscInfo {
            handle,
            root,
            parent,
            kind: kind.into(),
            options,
        };
        assert_eq!(egress_of(&[]).name, "noqueue");
        let etf = [q(
            "etf",
            true,
            (1, 0),
            (0xffff, 0xffff),
            vec![(1, [500_000i32.to_ne_bytes(), 11i32.to_ne_bytes(), [0; 4]].concat())],
        )];
        assert_eq!(egress_of(&etf), Egress { name: "etf".into(), kind: "etf".into(), etf_delta_ns: Some(500_000) });
        let tbf = q("tbf", true, (1, 0), (0xffff, 0xffff), Vec::new());
        let fq_under = [tbf.clone(), q("fq", false, (2, 0), (1, 1), Vec::new())];
        let e = egress_of(&fq_under);
        assert_eq!((e.name.as_str(), e.kind.as_str()), ("fq under tbf", "fq"));
        let default_child = [tbf.clone(), q("bfifo", false, (0x8001, 0), (1, 1), Vec::new())];
        assert_eq!(egress_of(&default_child).name, "tbf");
        let mq = q("mq", true, (1, 0), (0xffff, 0xffff), Vec::new());
        let fq_per_queue =
            [mq.clone(), q("fq", false, (0, 0), (1, 1), Vec::new()), q("fq", false, (0, 0), (1, 2), Vec::new())];
        assert_eq!(egress_of(&fq_per_queue).name, "fq under mq");
        let mixed =
            [mq, q("fq", false, (0, 0), (1, 1), Vec::new()), q("pfifo_fast", false, (0, 0), (1, 2), Vec::new())];
        assert_eq!(egress_of(&mixed).name, "mq");
        let dst: SocketAddr = "10.0.0.1:9000".parse().unwrap();
        let chosen = choose_pacer(Pacer::Auto, dst, Some(&e)).unwrap();
        assert_eq!((chosen.ran, chosen.qdisc.as_str()), (PacerRan::Txtime, "fq under tbf"));
    }

    #[test]
    fn rcvbuf_errors_are_read_from_snmp() {
        let snmp = "Ip: Forwarding\nIp: 1\nUdp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\nUdp: 10 0 5 3 42 0\nUdpLite: x\nUdpLite: 1\n";
        assert_eq!(udp_counter(snmp, "RcvbufErrors"), 42);
        assert_eq!(udp_counter(snmp, "SndbufErrors"), 0);
        assert_eq!(udp_counter("nothing", "RcvbufErrors"), 0);
        let snmp6 = "Udp6InDatagrams                 \t5\nUdp6SndbufErrors                \t17\n";
        assert_eq!(snmp6_counter(snmp6, "Udp6SndbufErrors"), 17);
        assert_eq!(snmp6_counter(snmp6, "Udp6RcvbufErrors"), 0);
    }
}

//! `netlane bulk send` and `netlane bulk recv`: the two ends of a bulk transfer (UDP
//! with GSO, batching, zerocopy and pacing, or TCP), each its own process on its own
//! host or namespace, measured from both ends. The lab's udp-bulk and udp-pacing
//! scenarios run exactly these.

use netlane_report::options::parse_endpoint;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use netlane::pace::Quantum;
use netlane::udp::{Batching, GsoMode, RxBatching};
use netlane_bulk::flows::Flows;
use netlane_bulk::{
    BoundReceiver, Pacer, Pacing, RecvJob, RxReport, RxSpec, SenderJob, Transport, TxReport, TxSpec, Verify,
    run_sender_job,
};
use netlane_report::options::{
    parse_cpu, parse_positive_duration, parse_quantum, parse_rate, parse_size, parse_size_usize,
};

use crate::documents::{BulkRecv, BulkSend};
use crate::out::{self, OutputArgs};
use crate::signals::STOP;

/// Bulk transfer: the sender and the receiver, each a process of its own.
#[derive(Debug, Subcommand)]
pub enum BulkCmd {
    /// Send for a time (or a number of bytes) as fast as the path takes, or paced, then
    /// print what was sent and how. It stays one thread, so its system calls and CPU are
    /// its own; Ctrl-C ends it without a report.
    Send(Box<SendArgs>),
    /// Receive until SIGINT/SIGTERM (or --time, or the end of a TCP stream), drain, and
    /// print what arrived: rate, loss, order, corruption, burstiness, kernel drops.
    Recv(Box<RecvArgs>),
}

/// Runs a `bulk` command.
pub fn run(cmd: BulkCmd) -> Result<u8> {
    match cmd {
        BulkCmd::Send(a) => a.run(),
        BulkCmd::Recv(a) => a.run(),
    }
}

/// `netlane bulk send`.
#[derive(Debug, Args)]
pub struct SendArgs {
    /// The receiver's address and port: HOST:PORT, or a host alone (port 9000).
    #[arg(long, value_parser = |s: &str| parse_endpoint(s, Some(9000)))]
    pub to: SocketAddr,
    /// UDP datagrams or a TCP stream.
    #[arg(long, value_enum, default_value_t = Transport::Udp)]
    pub transport: Transport,
    /// UDP payload bytes per datagram (the GSO segment size); at least the 16-byte
    /// header every datagram carries (magic, run id, sequence number).
    #[arg(long, default_value = "1400", value_parser = parse_size_usize)]
    pub size: usize,
    /// UDP segmentation offload: off, cmsg (a UDP_SEGMENT control message per send) or
    /// sockopt (the UDP_SEGMENT socket option).
    #[arg(long, default_value = "off")]
    pub gso: GsoMode,
    /// Datagrams per GSO send, or per sendmmsg call.
    #[arg(long, default_value_t = 1)]
    pub segments: usize,
    /// Without GSO: single (a sendmsg per datagram) or mmsg (sendmmsg).
    #[arg(long, default_value = "single")]
    pub batching: Batching,
    /// MSG_ZEROCOPY, with its completions counted (copied anyway on loopback and veth).
    #[arg(long)]
    pub zerocopy: bool,
    /// Pace UDP to this payload rate (`100MB/s`, `1gbit`; a bare number is bytes/s)
    /// [default: as fast as the path takes].
    #[arg(long, value_parser = parse_rate)]
    pub rate: Option<u64>,
    /// Time between paced releases, or auto (whole GSO sends per release).
    #[arg(long, default_value = "auto", value_parser = parse_quantum)]
    pub quantum: Quantum,
    /// Who keeps --rate: txtime (every quantum the next quantum's datagrams, each send
    /// with its SO_TXTIME release time, held by an fq or etf egress qdisc), fq-rate
    /// (fq paces the socket to its SO_MAX_PACING_RATE), user (the sender sleeps until each
    /// release), or auto (txtime where the egress qdisc honours it, else user).
    /// `netlane nic hold DEV --qdisc fq` puts fq on a device for a while.
    #[arg(long, value_enum, default_value_t = Pacer::Auto, requires = "rate")]
    pub pacer: Pacer,
    /// TCP: bytes per send call.
    #[arg(long, default_value = "64K", value_parser = parse_size_usize)]
    pub tcp_write: usize,
    /// How long to send.
    #[arg(short = 't', long, default_value = "10s", value_parser = parse_positive_duration)]
    pub time: Duration,
    /// Stop after this many payload bytes [default: send for the whole time].
    #[arg(long, value_parser = parse_size)]
    pub limit: Option<u64>,
    /// CPU to pin the sender to.
    #[arg(long, value_parser = parse_cpu)]
    pub cpu: Option<usize>,
    /// Send buffer size [default: the kernel's].
    #[arg(long, value_parser = parse_size_usize)]
    pub sndbuf: Option<usize>,
    /// UDP: take the payload from a buffer of this size, one send's worth after another
    /// (`128M`; larger than the last-level cache, every send copies cold memory)
    /// [default: one send's worth, always cached].
    #[arg(long, value_parser = parse_size_usize)]
    pub payload_span: Option<usize>,
    /// UDP: this many flows (clients) from a few unconnected sockets, served in turn,
    /// each send one flow's train with its own UDP_SEGMENT; with --rate, each flow is
    /// paced at its share of the rate; their datagram sizes come from --flow-mtus, not
    /// --size. The receiver's `--flows` counts each.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(netlane_bulk::flows::MAX_FLOWS)))]
    pub flows: Option<u32>,
    /// The unconnected sockets that serve --flows (flow i from socket i mod N)
    /// [default: 4, or as many as the flows when fewer].
    #[arg(long, requires = "flows")]
    pub flow_sockets: Option<u32>,
    /// The path MTUs of the flows' peers, given to the flows in turn: each flow's
    /// datagrams are as large as its MTU allows (e.g. 1280,1400,1500).
    #[arg(long, value_delimiter = ',', default_value = "1500", requires = "flows")]
    pub flow_mtus: Vec<u32>,
    /// Run id written in every datagram (the receiver counts only its own run).
    #[arg(long, default_value_t = 1)]
    pub run_id: u32,
    /// Print the report as JSON to FILE, or to stdout with `-`.
    #[arg(long, value_name = "FILE|-", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<std::path::PathBuf>,
}

impl SendArgs {
    /// The job these options describe.
    pub fn job(&self) -> SenderJob {
        SenderJob {
            spec: TxSpec {
                transport: self.transport,
                gso: self.gso,
                batching: self.batching,
                zerocopy: self.zerocopy,
                datagram_size: self.size,
                segments_per_send: self.segments,
                pacing: self.rate.map(|rate| Pacing { rate, quantum: self.quantum, pacer: self.pacer }),
                tcp_write: self.tcp_write,
                duration: self.time,
                cpu: self.cpu,
                sndbuf: self.sndbuf,
                limit_bytes: self.limit,
                payload_span: self.payload_span,
                flows: self.flows.map(|count| Flows {
                    count,
                    sockets: self.flow_sockets.unwrap_or(count.min(4)),
                    mtus: self.flow_mtus.clone(),
                }),
            },
            dst: self.to,
            run_id: self.run_id,
        }
    }

    fn run(&self) -> Result<u8> {
        let out = OutputArgs { json: self.json.clone(), csv: None };
        out.validate()?;
        let job = self.job();
        job.validate()?;
        let report = run_sender_job(&job).context("bulk send")?;
        if !out.json_to_stdout() {
            out::println(&sent_line(&report));
        }
        out.write_json(&netlane_report::document("bulk-send", BulkSend { to: self.to.to_string(), report }))?;
        Ok(0)
    }
}

fn sent_line(r: &TxReport) -> String {
    let rate = if r.seconds > 0.0 { r.bytes as f64 / r.seconds } else { 0.0 };
    let mut l = format!(
        "sent {}B in {} datagrams over {:.2} s: {} with {} system calls, cpu {:.3} s; {}",
        netlane_report::format::si(r.bytes as f64),
        r.datagrams,
        r.seconds,
        netlane_report::format::bytes_per_second(rate),
        r.syscalls,
        r.cpu.total_s(),
        r.path.join(", ")
    );
    if let Some(p) = &r.pacing {
        l.push_str(&format!("; paced to {:.1}% of the target", p.accuracy * 100.0));
    }
    if r.kernel_drops > 0 {
        l.push_str(&format!(
            "; {} sends dropped by this host's kernel after they returned (UDP SndbufErrors)",
            r.kernel_drops
        ));
    }
    l
}

/// `netlane bulk recv`.
#[derive(Debug, Args)]
pub struct RecvArgs {
    /// Address and port to receive on (port 0 picks one), or an address or host alone
    /// (port 9000).
    #[arg(long, default_value = "0.0.0.0:9000", value_parser = |s: &str| parse_endpoint(s, Some(9000)))]
    pub listen: SocketAddr,
    /// UDP datagrams or a TCP stream.
    #[arg(long, value_enum, default_value_t = Transport::Udp)]
    pub transport: Transport,
    /// single (a recvmsg per read) or mmsg (recvmmsg).
    #[arg(long, default_value = "mmsg")]
    pub batching: Batching,
    /// Reads per recvmmsg call.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// UDP_GRO on the socket: a read may return a train of coalesced datagrams.
    #[arg(long)]
    pub gro: bool,
    /// What to check: count (bytes only, for senders other than netlane's), header
    /// (loss, duplicates, reordering) or full (every payload byte too).
    #[arg(long, value_enum, default_value_t = Verify::Header)]
    pub verify: Verify,
    /// Receive buffer size.
    #[arg(long, default_value = "16M", value_parser = parse_size_usize)]
    pub rcvbuf: usize,
    /// Largest datagram expected (bytes per read buffer without GRO).
    #[arg(long, default_value = "65535", value_parser = parse_size_usize)]
    pub max_datagram: usize,
    /// The sender's datagram size (what full checks expect).
    #[arg(long, default_value = "1400", value_parser = parse_size_usize)]
    pub size: usize,
    /// The sender's run id (datagrams of another run are counted as foreign).
    #[arg(long, default_value_t = 1)]
    pub run_id: u32,
    /// CPU to pin the receiver to.
    #[arg(long, value_parser = parse_cpu)]
    pub cpu: Option<usize>,
    /// A many-flow sender's flows (`bulk send --flows`): each flow's rate, loss and
    /// largest millisecond, summarised over the flows.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(netlane_bulk::flows::MAX_FLOWS)))]
    pub flows: Option<u32>,
    /// Stop after this long [default: run until SIGINT/SIGTERM, or a TCP stream's end].
    #[arg(short = 't', long, value_parser = parse_positive_duration)]
    pub time: Option<Duration>,
    /// Print the report as JSON to FILE, or to stdout with `-` (the first line,
    /// `listening on ...`, then goes to stderr).
    #[arg(long, value_name = "FILE|-", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<std::path::PathBuf>,
}

impl RecvArgs {
    /// The job these options describe.
    pub fn job(&self) -> RecvJob {
        RecvJob {
            listen: self.listen,
            spec: RxSpec {
                transport: self.transport,
                batching: match self.batching {
                    Batching::Single => RxBatching::Single,
                    Batching::Mmsg => RxBatching::Mmsg(self.batch),
                },
                gro: self.gro,
                verify: self.verify,
                rcvbuf: self.rcvbuf,
                cpu: self.cpu,
                max_datagram: self.max_datagram,
                flows: self.flows.unwrap_or(0),
            },
            run_id: self.run_id,
            datagram_size: self.size,
        }
    }

    fn run(&self) -> Result<u8> {
        let out = OutputArgs { json: self.json.clone(), csv: None };
        out.validate()?;
        let bound = BoundReceiver::bind(self.job()).context("bulk recv")?;
        let bound_addr = bound.local_addr();
        let l = format!("listening on {bound_addr} ({})", self.transport_name());
        if out.json_to_stdout() {
            eprintln!("{l}");
        } else {
            out::println(&l);
        }
        let done = AtomicBool::new(false);
        let report = std::thread::scope(|s| {
            // Tells the receiver to drain and stop on a signal or at the time limit.
            let watcher = s.spawn(|| {
                let end = self.time.map(|t| Instant::now() + t);
                while !done.load(Ordering::Acquire) {
                    let left = end.map_or(Duration::from_secs(1), |e| e.saturating_duration_since(Instant::now()));
                    if STOP.wait(left.min(Duration::from_secs(1))) || end.is_some_and(|e| Instant::now() >= e) {
                        done.store(true, Ordering::Release);
                    }
                }
            });
            let report = bound.receive(&done);
            done.store(true, Ordering::Release);
            let _ = watcher.join();
            report
        })
        .context("bulk recv")?;
        if !out.json_to_stdout() {
            out::println(&received_line(&report));
        }
        let listen = bound_addr.to_string();
        out.write_json(&netlane_report::document("bulk-recv", BulkRecv { listen, report }))?;
        Ok(0)
    }

    fn transport_name(&self) -> String {
        use clap::ValueEnum;
        self.transport.to_possible_value().map(|v| v.get_name().to_string()).unwrap_or_default()
    }
}

fn received_line(r: &RxReport) -> String {
    let rate = if r.seconds > 0.0 { r.bytes as f64 / r.seconds } else { 0.0 };
    let i = &r.integrity;
    format!(
        "received {}B in {} datagrams ({} reads, {} GRO) over {:.2} s: {}; missing below the highest {} duplicates {} \
         reordered {} corrupt {} wrong length {} foreign {} truncated {} kernel drops {}; {} system calls, cpu {:.3} s",
        netlane_report::format::si(r.bytes as f64),
        r.datagrams,
        r.reads,
        r.gro_reads,
        r.seconds,
        netlane_report::format::bytes_per_second(rate),
        i.high_water.saturating_sub(i.unique),
        i.duplicates,
        i.reordered,
        i.corrupt,
        i.bad_length,
        i.foreign,
        r.truncated,
        r.kernel_drops,
        r.syscalls,
        r.cpu.total_s()
    ) + &r.flows.as_ref().map(flows_line).unwrap_or_default()
}

fn flows_line(f: &netlane_bulk::flows::FlowsReport) -> String {
    let (rate, loss, burst) = (&f.rate_bytes_per_s, &f.loss_ppm, &f.max_per_ms_bytes);
    format!(
        "\n{} of {} flows seen ({} datagrams of no flow expected); per flow: rate min {} p50 {} max {}, loss p50 {} \
         p99 {} max {} ppm, largest millisecond p50 {}B p99 {}B",
        f.seen,
        f.expected,
        f.unknown,
        netlane_report::format::bytes_per_second(rate.min as f64),
        netlane_report::format::bytes_per_second(rate.p50 as f64),
        netlane_report::format::bytes_per_second(rate.max as f64),
        loss.p50,
        loss.p99,
        loss.max,
        netlane_report::format::si(burst.p50 as f64),
        netlane_report::format::si(burst.p99 as f64),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::parse_command;
    use netlane_lab::engines::bulk::{recv_args, send_args};

    /// The lab runs `netlane bulk send` with the arguments it writes for a job: they must
    /// give back that job, option by option.
    #[test]
    fn the_lab_s_sender_arguments_give_back_its_job() {
        let base = SenderJob { spec: TxSpec::udp(), dst: "10.0.0.2:9000".parse().unwrap(), run_id: 3 };
        let jobs = [
            base.clone(),
            SenderJob {
                spec: TxSpec {
                    gso: GsoMode::Cmsg,
                    zerocopy: true,
                    segments_per_send: 46,
                    pacing: Some(Pacing::new(123_456_789, Quantum::Fixed(250_000))),
                    duration: Duration::from_millis(2500),
                    cpu: Some(1),
                    sndbuf: Some(1 << 22),
                    limit_bytes: Some(10_000_000),
                    payload_span: Some(3 << 20),
                    ..TxSpec::udp()
                },
                dst: "[fd00::2]:1234".parse().unwrap(),
                run_id: 9,
            },
            SenderJob {
                spec: TxSpec {
                    gso: GsoMode::Sockopt,
                    batching: Batching::Mmsg,
                    pacing: Some(Pacing::new(10_000_000, Quantum::Auto)),
                    ..TxSpec::udp()
                },
                ..base.clone()
            },
            SenderJob {
                spec: TxSpec {
                    gso: GsoMode::Cmsg,
                    pacing: Some(Pacing { pacer: Pacer::User, ..Pacing::new(50_000_000, Quantum::Fixed(2_000_000)) }),
                    flows: Some(Flows { count: 1000, sockets: 3, mtus: vec![1280, 1500] }),
                    ..TxSpec::udp()
                },
                ..base.clone()
            },
            SenderJob { spec: TxSpec { tcp_write: 12_345, zerocopy: true, ..TxSpec::tcp() }, ..base },
        ];
        for job in jobs {
            let args = send_args(&job);
            assert_eq!(parse_command::<SendArgs>(&args).job(), job, "{args:?}");
        }
    }

    /// The same for the lab's receivers.
    #[test]
    fn the_lab_s_receiver_arguments_give_back_its_job() {
        let base =
            RecvJob { listen: "10.0.0.2:0".parse().unwrap(), spec: RxSpec::udp(), run_id: 4, datagram_size: 1400 };
        let jobs = [
            base,
            RecvJob {
                spec: RxSpec {
                    batching: RxBatching::Single,
                    gro: true,
                    verify: Verify::Full,
                    rcvbuf: 1 << 20,
                    cpu: Some(0),
                    max_datagram: 9000,
                    flows: 10_000,
                    ..RxSpec::udp()
                },
                listen: "[::1]:7000".parse().unwrap(),
                run_id: 77,
                datagram_size: 8952,
            },
            RecvJob { spec: RxSpec { batching: RxBatching::Mmsg(8), verify: Verify::Count, ..RxSpec::tcp() }, ..base },
        ];
        for job in jobs {
            let args = recv_args(&job, Duration::from_secs(600));
            let parsed = parse_command::<RecvArgs>(&args);
            assert_eq!(parsed.time, Some(Duration::from_secs(600)), "{args:?}");
            assert_eq!(parsed.job(), job, "{args:?}");
        }
    }
}

//! The udp-bulk scenario's options: the modes, the paced rates, the comparison with the
//! kernel's sender.

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args, ValueEnum};
use netlane::pace::Quantum;
use netlane::topology::Segmentation;

use crate::engines::bulk::Verify;
use crate::scenarios::net::NetArgs;
use netlane_report::options::{parse_positive_duration, parse_quantum, parse_rate};

/// A way of moving bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum)]
pub enum Mode {
    /// TCP stream, 64 KiB per send (the baseline): the device takes its large packets
    /// whole, as a NIC with TSO does (veth never cuts them).
    Tcp,
    /// TCP with TSO off at the sender's device: the kernel's GSO cuts its packets in
    /// software just before the device (the talk's "TCP without TSO").
    TcpSw,
    /// TCP with neither TSO nor GSO: gso_max_segs 1 at the sender's device, one
    /// segment per packet through the whole stack (the talk's "segmentation offload
    /// off completely").
    TcpMss,
    /// TCP stream with MSG_ZEROCOPY.
    TcpZc,
    /// One sendmsg per UDP datagram; one recvmsg per datagram.
    Udp,
    /// sendmmsg batches; recvmmsg batches.
    Sendmmsg,
    /// sendmmsg batches of single datagrams to a UDP_GRO receiver: GRO coalesces them
    /// in the receiving device's NAPI.
    SendmmsgGro,
    /// UDP GSO via a per-call UDP_SEGMENT cmsg; recvmmsg receiver. The device takes
    /// each train whole (veth never cuts it), as a NIC with UDP segmentation offload.
    Gso,
    /// UDP GSO with UDP segmentation offload off at the sender's device: the kernel
    /// cuts each train in software just before the device (the talk's GSO case).
    GsoSw,
    /// UDP GSO via the UDP_SEGMENT socket option.
    GsoSockopt,
    /// UDP GSO to a UDP_GRO receiver (each train arrives whole: nothing to coalesce).
    GsoGro,
    /// UDP GSO with MSG_ZEROCOPY.
    GsoZc,
    /// UDP GSO from a payload span larger than the last-level cache (--cold-span):
    /// every send copies memory the cache no longer holds.
    GsoCold,
    /// UDP GSO with MSG_ZEROCOPY from the same cold span.
    GsoZcCold,
    /// UDP GSO paced at each of --rates, to a UDP_GRO receiver.
    Paced,
    /// Many flows from a few unconnected sockets, each paced at its share of
    /// --flows-rate, for each of --flows (the most also unpaced), to a UDP_GRO receiver
    /// that counts each flow.
    Flows,
}

impl Mode {
    /// The word the command line takes.
    pub fn name(self) -> String {
        crate::scenarios::value_name(&self)
    }

    /// Where the sender's device cuts this mode's large sends.
    pub fn segmentation(self) -> Segmentation {
        match self {
            Mode::TcpSw | Mode::GsoSw => Segmentation::Software,
            Mode::TcpMss => Segmentation::None,
            _ => Segmentation::Device,
        }
    }

    /// Which case of the talk's this mode's figures are, as the report says it.
    pub fn case(self) -> &'static str {
        match self {
            Mode::Tcp | Mode::TcpZc => "TCP, not cut (like TSO)",
            Mode::TcpSw => "TCP, cut in software (GSO)",
            Mode::TcpMss => "TCP, one segment per packet",
            Mode::Udp | Mode::Sendmmsg => "one datagram per packet",
            Mode::SendmmsgGro => "coalesced by GRO at the receiver",
            Mode::Gso | Mode::GsoSockopt | Mode::GsoZc => "train not cut (like USO)",
            Mode::GsoSw => "train cut in software (GSO)",
            Mode::GsoGro | Mode::Paced => "train not cut, arrives whole",
            Mode::Flows => "a flow's train, not cut",
            Mode::GsoCold | Mode::GsoZcCold => "train not cut, cold payload",
        }
    }

    /// Whether the mode switches the sender's device offloads (only the lab's own
    /// veth is its to switch).
    pub fn switches_the_device(self) -> bool {
        self.segmentation() != Segmentation::Device
    }
}

/// The quick lab's modes: the talk's controls stay; the other ways to ask for the same
/// path (the socket option, zerocopy from a cached buffer, TCP zerocopy) go.
pub const QUICK_MODES: [Mode; 13] = {
    use Mode::*;
    [Tcp, TcpSw, TcpMss, Udp, Sendmmsg, SendmmsgGro, Gso, GsoSw, GsoGro, GsoCold, GsoZcCold, Paced, Flows]
};

/// Options of the `udp-bulk` scenario.
#[derive(Debug, Clone, Args)]
pub struct UdpBulkArgs {
    /// Network placement.
    #[command(flatten)]
    pub net: NetArgs,
    /// Modes to run, comma separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "tcp,tcp-sw,tcp-mss,tcp-zc,udp,sendmmsg,sendmmsg-gro,gso,gso-sw,gso-sockopt,gso-gro,gso-zc,\
                         gso-cold,gso-zc-cold,paced,flows"
    )]
    pub modes: Vec<Mode>,
    /// How long each run sends.
    #[arg(short = 't', long, alias = "duration", default_value = "2s", value_parser = parse_positive_duration)]
    pub time: Duration,
    /// Rounds: every mode runs once per round, in a rotating order; checks pair the
    /// modes they compare within each round.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub repeat: u32,
    /// UDP payload bytes per datagram (the GSO segment size).
    #[arg(long, default_value_t = 1400)]
    pub gso_size: usize,
    /// Datagrams per GSO send or sendmmsg call [default: as many as fit 64 KB, at most 64].
    #[arg(long)]
    pub segments: Option<usize>,
    /// Target rates of the paced mode, comma separated (e.g. 10MB/s,1GB/s,200mbit).
    #[arg(long, value_delimiter = ',', default_value = "10MB/s,100MB/s,1GB/s", value_parser = parse_rate, allow_hyphen_values = true)]
    pub rates: Vec<u64>,
    /// The payload span of the cold modes: larger than the last-level cache of the
    /// sender's CPU, or they are not cold.
    #[arg(long, default_value = "256M", value_parser = netlane_report::options::parse_size_usize)]
    pub cold_span: usize,
    /// Pacing release quantum: auto, or a duration such as 1ms (at most a tenth of --time).
    #[arg(long, default_value = "auto", value_parser = parse_quantum)]
    pub quantum: Quantum,
    /// The flows mode's flow counts (the talk's server: many clients from a few
    /// unconnected sockets), each paced at its share of --flows-rate, the most flows also
    /// unpaced; `none` runs none. A count whose flows could not each send ten times in
    /// --time is left out, and said so.
    #[arg(long, value_delimiter = ',', default_value = "1,100,10000", value_parser = parse_flow_count)]
    pub flows: Vec<u32>,
    /// All the flows' rate together.
    #[arg(long, default_value = "100MB/s", value_parser = parse_rate)]
    pub flows_rate: u64,
    /// The flows' peers' path MTUs, given to the flows in turn (their datagram sizes).
    #[arg(long, value_delimiter = ',', default_value = "1280,1400,1500")]
    pub flow_mtus: Vec<u32>,
    /// What the receiver verifies.
    #[arg(long, value_enum, default_value_t = Verify::Header)]
    pub verify: Verify,
    /// The kernel's udpgso_bench_tx, to compare senders [default: target/kselftest/udpgso_bench_tx or $NETLANE_UDPGSO_BENCH_TX].
    #[arg(long)]
    pub selftest: Option<PathBuf>,
    /// Skip the comparison with udpgso_bench_tx.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set)]
    pub no_selftest: bool,
    /// The testbed it runs on (none: this machine). The sender runs on its server host,
    /// the receiver on its first client host at that host's `addr`; --tx-cpu and --rx-cpu
    /// then name CPUs there; each end is a process; udpgso_bench_tx is not compared.
    #[command(flatten)]
    pub on: crate::testbed::TestbedArgs,
}

/// A flow count, or `none` (0: no flows).
fn parse_flow_count(s: &str) -> Result<u32, String> {
    if s.eq_ignore_ascii_case("none") {
        return Ok(0);
    }
    let n: u32 = s.parse().map_err(|e| format!("{s:?}: {e}"))?;
    if !(1..=netlane_bulk::flows::MAX_FLOWS).contains(&n) {
        return Err(format!("{n} flows: 1 to {}", netlane_bulk::flows::MAX_FLOWS));
    }
    Ok(n)
}

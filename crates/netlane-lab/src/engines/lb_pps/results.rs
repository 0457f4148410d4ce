//! What the harness measures and returns: the subjects (what runs on the balancer's
//! interface, and how frames reach it), one slice of a turn, and a run's figures over
//! its slices.

use netlane_sys::bpf::HintMode;
use serde::Serialize;

use super::WarmUp;
use crate::stats::{Spread, median};

/// What runs on the balancer's interface, and how frames reach it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    /// The trivial XDP_TX program (swap MACs, send back): the ceiling.
    XdpTxCeiling,
    /// The balancer with these hints (plain build, hints from the metadata area).
    Balancer(HintMode),
    /// The XDP_TX ceiling on frames that arrive as skbs (a packet socket's).
    SkbCeiling,
    /// The balancer on frames that arrive as skbs: off is the plain build; with hints,
    /// the device-bound build reads them with the RX-hash kfunc (rx-hash: the kernel's
    /// flow hash; tags: set by the TCX classifier on the sending end).
    SkbBalancer(HintMode),
    /// The XDP_TX ceiling on two cores: two receive queues, two NAPI threads.
    TwoCoreCeiling,
    /// The balancer (as [`Subject::Balancer`]) on two cores.
    TwoCoreBalancer(HintMode),
}

impl Serialize for Subject {
    /// As its label: `xdp_tx ceiling`, `lb hints=flow-tag`.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.label())
    }
}

impl Subject {
    /// A short label.
    pub fn label(&self) -> String {
        match self {
            Subject::XdpTxCeiling => "xdp_tx ceiling".into(),
            Subject::Balancer(h) => format!("lb hints={}", h.name()),
            Subject::SkbCeiling => "xdp_tx ceiling (skb)".into(),
            Subject::SkbBalancer(HintMode::Off) => "lb hints=off (skb)".into(),
            Subject::SkbBalancer(h) => format!("lb hints={} (skb, kfunc)", h.name()),
            Subject::TwoCoreCeiling => "xdp_tx ceiling (2 cores)".into(),
            Subject::TwoCoreBalancer(h) => format!("lb hints={} (2 cores)", h.name()),
        }
    }

    /// Cores the subject runs on.
    pub fn cores(&self) -> u32 {
        match self {
            Subject::TwoCoreCeiling | Subject::TwoCoreBalancer(_) => 2,
            _ => 1,
        }
    }

    /// The same program on one core, for a two-core subject.
    pub fn on_one_core(&self) -> Option<Subject> {
        match self {
            Subject::TwoCoreCeiling => Some(Subject::XdpTxCeiling),
            Subject::TwoCoreBalancer(h) => Some(Subject::Balancer(*h)),
            _ => None,
        }
    }

    /// The same program on two cores (frames path only).
    pub(super) fn on_two_cores(&self) -> Option<Subject> {
        match self {
            Subject::XdpTxCeiling => Some(Subject::TwoCoreCeiling),
            Subject::Balancer(h) => Some(Subject::TwoCoreBalancer(*h)),
            _ => None,
        }
    }

    /// The XDP_TX program on the same path.
    pub fn ceiling(&self) -> Subject {
        match self {
            Subject::XdpTxCeiling | Subject::Balancer(_) => Subject::XdpTxCeiling,
            Subject::SkbCeiling | Subject::SkbBalancer(_) => Subject::SkbCeiling,
            Subject::TwoCoreCeiling | Subject::TwoCoreBalancer(_) => Subject::TwoCoreCeiling,
        }
    }

    /// The balancer's hint mode (none for a ceiling).
    pub fn hint(&self) -> Option<HintMode> {
        match self {
            Subject::Balancer(h) | Subject::SkbBalancer(h) | Subject::TwoCoreBalancer(h) => Some(*h),
            _ => None,
        }
    }

    /// Whether this is an XDP_TX ceiling.
    pub fn is_ceiling(&self) -> bool {
        matches!(self, Subject::XdpTxCeiling | Subject::SkbCeiling | Subject::TwoCoreCeiling)
    }
}

/// One slice of a measured run.
#[derive(Debug, Clone, Copy)]
pub(super) struct Slice {
    /// Packets the program handled (its own counters; run-time statistics off).
    pub(super) runs: u64,
    /// Run time and runs in the part of the slice with run-time statistics on.
    pub(super) prog_ns: u64,
    pub(super) prog_runs: u64,
    /// CPU time of the NAPI threads (both, on two cores).
    pub(super) cpu_ns: u64,
    /// The smaller of the two threads' CPU times on two cores (= `cpu_ns` on one).
    pub(super) cpu_ns_min: u64,
    pub(super) secs: f64,
    /// With no device (the generator chained into the program, on the balancer's CPU):
    /// ns per frame for the program, and for the same frames through `xdp_tx` and
    /// `xdp_tx_room`.
    pub(super) bare: Option<Bare>,
}

/// Times per frame with no device, generator included, for one program and its two
/// references on the same frames (see [`Bench::time_without_device`](super::Bench::time_without_device)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Bare {
    pub(super) program_ns: f64,
    pub(super) xdp_tx_ns: f64,
    pub(super) room_ns: f64,
}

impl Slice {
    /// Packets per microsecond of NAPI-thread CPU time; None when the slice measured
    /// nothing (a thread got no CPU, or the program never ran), or on two cores when one
    /// thread did less than a quarter of the other's work (then it measured one core,
    /// not two): such a slice is left out, never counted as 0 Mpps.
    pub(super) fn mpps_per_core(&self) -> Option<f64> {
        let other = self.cpu_ns.saturating_sub(self.cpu_ns_min);
        let balanced = self.cpu_ns_min == self.cpu_ns || self.cpu_ns_min.saturating_mul(4) >= other;
        (self.cpu_ns > 0 && self.runs > 0 && balanced).then(|| self.runs as f64 * 1e3 / self.cpu_ns as f64)
    }

    pub(super) fn prog_ns_per_packet(&self) -> Option<f64> {
        (self.prog_runs > 0).then(|| self.prog_ns as f64 / self.prog_runs as f64)
    }
}

/// One measured run: per-core figures are the median of its slices.
#[derive(Debug, Clone, Serialize)]
pub struct PpsResult {
    /// What ran.
    pub subject: Subject,
    /// Distinct flows.
    pub flows: u32,
    /// Seconds measured.
    pub seconds: f64,
    /// Packets the program ran on.
    pub packets: u64,
    /// Million packets per second (wall clock; bounded by the generator's core).
    pub mpps: f64,
    /// CPU seconds of the balancer's NAPI threads.
    pub napi_cpu_s: f64,
    /// Cores (NAPI threads) the balancer ran on.
    pub cores: u32,
    /// Million packets per second per core: packets / CPU time of the NAPI threads
    /// (median of the measured slices; None when no slice measured anything).
    pub mpps_per_core: Option<f64>,
    /// Every slice's Mpps per core, in order (None: the slice measured nothing).
    pub slices_mpps_per_core: Vec<Option<f64>>,
    /// Nanoseconds per packet in the program (BPF run-time statistics; median of the slices).
    pub prog_ns_per_packet: Option<f64>,
    /// Nanoseconds of the NAPI thread per packet (1000 / Mpps per core).
    pub core_ns_per_packet: Option<f64>,
    /// With no device: ns per frame of the generator chained into the program by a
    /// tail call, as the kernel's live-frames runner times it (no veth, no run-time
    /// statistics; median of the slices). Frames path, one core only.
    pub bare_ns_per_packet: Option<f64>,
    /// With no device, the same frames: the program's ns per frame over `xdp_tx`'s
    /// (median of the slices' differences; the generator's work cancels out).
    pub over_xdp_tx_ns: Option<f64>,
    /// Of that, what `xdp_tx_room` costs over `xdp_tx`: making room for an outer
    /// header (bpf_xdp_adjust_head), the least an encapsulating balancer does.
    pub room_ns: Option<f64>,
    /// The rest: `over_xdp_tx_ns` - `room_ns` (the program's ns per frame over
    /// `xdp_tx_room`'s, from the two medians).
    pub beyond_room_ns: Option<f64>,
    /// The spread (max - min) of the slices' `over_xdp_tx_ns`.
    pub over_xdp_tx_spread_ns: Option<f64>,
    /// Slices timed with no device.
    pub bare_slices: usize,
    /// Fraction of packets that took the hint path.
    pub hint_hit_ratio: f64,
    /// Fraction of packets that found their connection-table entry.
    pub conn_hit_ratio: f64,
    /// Frames the sink got back while this flow count's programs took their turns (all
    /// of them, lead-ins included).
    pub sink_frames_all_turns: u64,
    /// How warming up went (balancers).
    pub warm_up: Option<WarmUp>,
}

impl PpsResult {
    pub(super) fn from_slices(
        subject: Subject,
        flows: u32,
        slices: &[Slice],
        hint_hit_ratio: f64,
        conn_hit_ratio: f64,
        sink_frames_all_turns: u64,
        warm_up: Option<WarmUp>,
    ) -> PpsResult {
        let packets: u64 = slices.iter().map(|s| s.runs).sum();
        let seconds: f64 = slices.iter().map(|s| s.secs).sum();
        let cpu_ns: u64 = slices.iter().map(|s| s.cpu_ns).sum();
        let measured: Vec<f64> = slices.iter().filter_map(Slice::mpps_per_core).collect();
        let mpps_per_core = (!measured.is_empty()).then(|| median(measured));
        let prog: Vec<f64> = slices.iter().filter_map(Slice::prog_ns_per_packet).collect();
        let bare = |f: fn(&Bare) -> f64| -> Vec<f64> { slices.iter().filter_map(|s| s.bare.as_ref().map(f)).collect() };
        let med = |v: Vec<f64>| (!v.is_empty()).then(|| median(v));
        let over = bare(|b| b.program_ns - b.xdp_tx_ns);
        let over_spread = Spread::of(&over).filter(|s| s.n > 1).map(|s| s.max - s.min);
        let bare_slices = over.len();
        let (over, room) = (med(over), med(bare(|b| b.room_ns - b.xdp_tx_ns)));
        PpsResult {
            subject,
            flows,
            seconds,
            packets,
            mpps: if seconds > 0.0 { packets as f64 / seconds / 1e6 } else { 0.0 },
            napi_cpu_s: cpu_ns as f64 / 1e9,
            cores: subject.cores(),
            mpps_per_core,
            slices_mpps_per_core: slices.iter().map(Slice::mpps_per_core).collect(),
            prog_ns_per_packet: (!prog.is_empty()).then(|| median(prog)),
            core_ns_per_packet: mpps_per_core.filter(|m| *m > 0.0).map(|m| 1e3 / m),
            bare_ns_per_packet: med(bare(|b| b.program_ns)),
            over_xdp_tx_ns: over,
            room_ns: room,
            // The medians of the slices' own rests would not add up with the other two.
            beyond_room_ns: over.zip(room).map(|(o, r)| o - r),
            over_xdp_tx_spread_ns: over_spread,
            bare_slices,
            hint_hit_ratio,
            conn_hit_ratio,
            sink_frames_all_turns,
            warm_up,
        }
    }

    /// The slices that measured something.
    pub fn measured_slices(&self) -> Vec<f64> {
        self.slices_mpps_per_core.iter().flatten().copied().collect()
    }
}

//! Packets per second through the balancer, per core, with and without hints, against
//! a trivial XDP_TX program in the same run.
//!
//! Network: a generator namespace and a balancer namespace joined by a veth pair. The
//! generator is `BPF_PROG_RUN` in live-frames mode on the generator's end (the first
//! generator CPU of [`PpsCpus`]): it rewrites a 64-byte TCP frame for the next of N
//! flows, writes the flow's hint into the XDP metadata when hints are on (the NIC's
//! part, emulated: veth carries metadata with the frame), and transmits it. The
//! balancer (plain build, hints from metadata) runs in the threaded NAPI of the
//! balancer's end, pinned to the first balancer CPU, and sends everything back with
//! XDP_TX into a sink. Per-core rate = packets the program ran on / CPU time of
//! that NAPI thread (everything that core did for them: veth, XDP, XDP_TX), with the
//! kernel's BPF run-time statistics off (they cost every run two clock reads; packets
//! come from the programs' own per-CPU counters); ns per packet = those statistics for
//! the program alone, switched on for the last quarter of each one-core slice.
//!
//! For each flow count, every program (the ceiling and each hint mode, each with a
//! generator of its own) is loaded first. A balancer is attached once to warm up: every
//! flow is sent, in bursts the veth ring holds, until a pass where 99.9% of the flows
//! took the mode's fast path, so the connection table is warm and, in tag modes, the
//! control plane has received each flow's event and installed its tag in the generator's
//! "classifier" (the hints it writes) exactly as `netlane lb` does with a NIC. Then the
//! programs take turns on the interface (an atomic link update, in a rotating order),
//! six short slices each; per-core figures are the median of a program's slices, so
//! the machine's drift (a VM's neighbours) touches every program alike.
//!
//! Two cores (the talk's multi-core result): a second veth pair with a receive queue per
//! CPU on each end. Each turn of a frames-path program has a one-core slice (above) and
//! a two-core slice on that pair: the program's generator runs on both generator CPUs
//! at once, each sending its half of the flows (as RSS keeps a flow on one queue), and
//! veth puts a CPU's frames on the receive queue of that number, whose NAPI thread runs
//! on the matching balancer CPU; the sink's thread for what a balancer thread sends
//! back runs on that balancer thread's CPU. Per-core rate = packets / CPU time of both
//! threads. Where the plan could not keep generators and balancer threads apart (two
//! CPUs: each CPU runs one generator, the other queue's balancer thread and a sink),
//! the two-core ceiling is the reference, not the one-core rate.
//!
//! No device: after its rate, each one-core slice of a frames-path program times it
//! once more with no device in the path. The generator's frames go on to the program by a tail call
//! (`PktGen::chain`) instead of out of the veth, on the balancer's CPU (where its
//! per-CPU state is warm), and what the program XDP_TXes is dropped at the loopback
//! device; then the same frames into `xdp_tx` and `xdp_tx_room` (XDP_TX after making
//! room for an outer header). The kernel's live-frames runner times each; differences
//! on the same frames are the program's own cost, with the generator's cancelled.
//!
//! Warm-up sends the flows in order; measured frames visit them in a scattered order
//! (a stride coprime with the flow count), so state allocated in first-seen order
//! (connection entries, tag ids) is not walked sequentially, which real traffic never
//! does and which would flatter every table.
//!
//! The folder: `results.rs` (what ran, a slice, a run's figures), `options.rs` (what can
//! be asked), `network.rs` (the namespaces, veth pairs, NAPI threads and sink the runs
//! share), `generator.rs` (frames, how they are sent, the classifiers that write hints),
//! `counters.rs` (what a contender runs, and reading its counters), `contender.rs`
//! (loading each program with its generator), `warm_up.rs` (passes until the state is
//! warm), `measure.rs` (the turns and what one slice measures).

mod contender;
mod counters;
mod generator;
mod measure;
mod network;
mod options;
mod results;
#[cfg(test)]
mod tests;
mod warm_up;

use std::net::Ipv4Addr;

use netlane_lb::LbError;

pub use self::contender::conn_entries;
use self::network::Bench;
pub use self::options::{PpsCpus, PpsOptions, SKB_MAX_FLOWS, splits_in_two};
pub use self::results::{PpsResult, Subject};
pub use self::warm_up::{WarmPass, WarmUp};

fn kernel(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LbError {
    LbError::kernel(what)
}

const VIP: Ipv4Addr = Ipv4Addr::new(10, 100, 0, 1);
const GEN_SRC: Ipv4Addr = Ipv4Addr::new(10, 212, 0, 0);
/// Frames per generator call while warming up: what the veth ring holds, so that new
/// flows (slower than known ones) are not dropped on the way.
const WARM_BURST: u32 = 256;
/// Passes over every flow at most, while warming up.
const WARM_PASSES: usize = 8;
/// The share of the flows that must be known (and tagged) after warm-up.
const WARM_ENOUGH: f64 = 0.999;
/// Turns each program gets (per-core figures are the median of its slices).
const SLICES: usize = 6;
/// Frames per generator call while measuring.
const SEND_BATCH: u32 = 1 << 14;
/// Unmeasured frames after a program switch.
const LEAD_IN: u32 = 2048;
/// Frames per timing with no device (a frames-path slice times its program, `xdp_tx`
/// and `xdp_tx_room` with this many each), at most; a short slice times fewer
/// ([`bare_frames`]).
const BARE_FRAMES: u32 = 1 << 18;

/// Frames per timing with no device for a slice of `slice`: the three timings take
/// about as long as the slice's rate (at 300 ns a frame, the slowest program's here),
/// between 2^14 and [`BARE_FRAMES`], so short slices (the quick lab's) are not mostly
/// spent timing.
fn bare_frames(slice: std::time::Duration) -> u32 {
    (slice.as_nanos() / (3 * 300)).clamp(1 << 14, u128::from(BARE_FRAMES)) as u32
}
/// Threads sending warm-up bursts at once. Each BPF_PROG_RUN call waits for RCU grace
/// periods (the kernel's XDP dispatcher takes the program in and out), milliseconds on
/// a quiet machine; enough callers overlap those waits.
const WARM_THREADS: usize = 8;

/// Runs every flow count with the XDP_TX ceiling and every balancer mode taking turns
/// (`Bench::compare`); `progress` is told what happens. The runs happen on a thread
/// of their own (pinned to the first generator's CPU), which moves between the benchmark's namespaces; the
/// caller's thread keeps its namespace.
pub fn run(opts: &PpsOptions, progress: &dyn Fn(&str)) -> Result<Vec<PpsResult>, LbError> {
    opts.validate()?;
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::scope(|s| {
        let worker = s.spawn(move || -> Result<Vec<PpsResult>, LbError> {
            netlane::cpus::pin(Some(opts.cpus.generators[0]));
            if std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").is_ok_and(|v| v.trim() == "1") {
                tracing::warn!(
                    "kernel.bpf_stats_enabled is 1: run-time statistics stay on while rates are measured, and cost \
                     every program run two clock reads"
                );
            }
            let bench = Bench::build(opts.cpus, opts.two_cores)?;
            let tell = |m: &str| {
                let _ = tx.send(m.to_string());
            };
            let mut subjects = vec![Subject::XdpTxCeiling];
            subjects.extend(opts.modes.iter().map(|m| Subject::Balancer(*m)));
            let mut skb_subjects = vec![Subject::SkbCeiling];
            skb_subjects.extend(opts.modes.iter().map(|m| Subject::SkbBalancer(*m)));
            let mut out = Vec::new();
            for &flows in &opts.flows {
                out.extend(bench.compare(&subjects, flows, opts.time, &tell)?);
                if opts.skb && flows <= SKB_MAX_FLOWS {
                    out.extend(bench.compare(&skb_subjects, flows, opts.time, &tell)?);
                }
            }
            Ok(out)
        });
        for label in rx {
            progress(&label);
        }
        worker.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

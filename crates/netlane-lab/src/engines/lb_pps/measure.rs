//! The turns and what one slice measures: the contenders of a flow count take turns on
//! the interface (an atomic program swap, in rotating order); a slice is a program's
//! packets and its NAPI threads' CPU time on one core or two, the program's own time
//! from BPF run-time statistics, and its time with no device.
//!
//! These rounds are slices within one run of the scenario, with every program loaded
//! and swapped on one link, not the scenario runs that [`crate::runner::Runner`] makes
//! in rounds; only their rotation ([`crate::stats::round_order`]) is shared.

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use netlane::metrics::cpu::task_cpu_ns;
use netlane_lb::LbError;
use netlane_sys::bpf::{PktGen, XdpLink, XdpMode, enable_run_time_stats, program_run_stats};

use super::contender::Contender;
use super::counters::Program;
use super::generator::{Feed, pin_to};
use super::network::{Bench, TwoCores};
use super::results::{Bare, PpsResult, Slice, Subject};
use super::{LEAD_IN, SEND_BATCH, SLICES, bare_frames, kernel, splits_in_two};
use crate::stats::round_order;

impl Bench {
    /// Measures `subjects` at `flows` flows: all are loaded (and warmed up) first, then
    /// they take turns on the interface, one slice of `time / SLICES` each per round,
    /// so that a drift of the machine during the runs touches all of them alike.
    pub(super) fn compare(
        &self,
        subjects: &[Subject],
        flows: u32,
        time: Duration,
        progress: &dyn Fn(&str),
    ) -> Result<Vec<PpsResult>, LbError> {
        let mut contenders = Vec::with_capacity(subjects.len());
        for s in subjects {
            progress(&format!("{flows} flows: load and warm up {}", s.label()));
            contenders.push(self.contender(*s, flows)?);
        }
        // Two cores too: frames-path programs at flow counts that split in two.
        let two =
            self.two.as_ref().filter(|_| splits_in_two(flows) && subjects.iter().all(|s| s.on_two_cores().is_some()));
        let path = if subjects.iter().any(|s| s.ceiling() == Subject::SkbCeiling) {
            " (skb path)"
        } else if two.is_some() {
            ", on one and two cores"
        } else {
            ""
        };
        progress(&format!("{flows} flows: measure {} programs in turns{path}", contenders.len()));
        let sunk0 = self.sink.0.sunk().map_err(kernel("read the sink"))?;
        self.lb_ns.enter_on_this_thread()?;
        let link = XdpLink::attach(contenders[0].program.fd(), self.l0, XdpMode::Native);
        let link2 = two.map(|t| XdpLink::attach(contenders[0].program.fd(), t.l1, XdpMode::Native));
        self.gen_ns.enter_on_this_thread()?;
        let link = link.map_err(kernel("attach to l0"))?;
        let link2 = link2.transpose().map_err(kernel("attach to l1"))?;
        let slice = time / SLICES as u32;
        for round in 0..SLICES {
            // Each round starts with another program, so none is always first.
            for i in round_order(contenders.len(), round) {
                let c = &mut contenders[i];
                link.replace_program(c.program.fd()).map_err(kernel("switch the program on l0"))?;
                let m = self.measure(c, slice)?;
                c.slices.push(m);
                if let Some(l) = &link2 {
                    l.replace_program(c.program.fd()).map_err(kernel("switch the program on l1"))?;
                    let before = c.program.counts()?;
                    let m = self.measure_two(c, slice)?;
                    if let (Some(b), Some(a)) = (before, c.program.counts()?) {
                        for k in 0..3 {
                            c.two_core_counts[k] += a[k].saturating_sub(b[k]);
                        }
                    }
                    c.two_core_slices.push(m);
                }
            }
        }
        drop(link);
        drop(link2);
        let returned = self.sink.0.sunk().map_err(kernel("read the sink"))?.saturating_sub(sunk0);
        let mut out = Vec::new();
        for c in &contenders {
            out.extend(c.results(returned)?);
        }
        Ok(out)
    }

    /// Like [`Bench::measure`] on two cores: `c`'s generator runs on both generator CPUs
    /// at once, each sending its half of the flows into l1's queue of that CPU.
    fn measure_two(&self, c: &mut Contender, time: Duration) -> Result<Slice, LbError> {
        let two = self.two.as_ref().ok_or_else(|| LbError::Invalid("no two-core link was built".into()))?;
        let Feed::Frames(g, frame) = &c.feed else {
            return Err(LbError::Invalid(format!("{} has no two-core run", c.subject.label())));
        };
        g.set_split(&self.cpus.generators).map_err(kernel("split the flows between the generators"))?;
        // Program time comes from the one-core slices.
        let slice = self.measure_split(two, g, frame, &c.program, time);
        // The one-core turns send every flow from the first generator CPU again.
        let undone = g.set_split(&[]).map_err(kernel("undo the generator's split"));
        let slice = slice?;
        undone?;
        Ok(slice)
    }

    fn measure_split(
        &self,
        two: &TwoCores,
        g: &PktGen,
        frame: &[u8],
        program: &Program,
        time: Duration,
    ) -> Result<Slice, LbError> {
        let sender = g.sender();
        let (gen_ns, g1, second) = (&self.gen_ns, two.g1, self.cpus.generators[1]);
        let cpu = |pid: u32| task_cpu_ns(pid).map_err(kernel("read a NAPI thread's CPU time"));
        let ready = std::sync::Barrier::new(2);
        let deadline = std::sync::OnceLock::<Instant>::new();
        std::thread::scope(|s| -> Result<Slice, LbError> {
            let helper = s.spawn(|| -> Result<(), LbError> {
                let sent = pin_to(second)
                    .and_then(|()| gen_ns.enter_on_this_thread().map_err(LbError::from))
                    .and_then(|()| sender.send(g1, frame, LEAD_IN).map_err(kernel("run the second generator")));
                // Both waits happen whatever went wrong, so the caller is never left waiting.
                ready.wait();
                ready.wait();
                sent?;
                let end = *deadline.get().ok_or_else(|| LbError::Invalid("no deadline set".into()))?;
                while Instant::now() < end {
                    sender.send(g1, frame, SEND_BATCH).map_err(kernel("run the second generator"))?;
                }
                Ok(())
            });
            let lead = sender.send(g1, frame, LEAD_IN).map_err(kernel("run the generator"));
            ready.wait();
            let before = lead.and_then(|()| Ok((program.packets()?, cpu(two.napi_pids[0])?, cpu(two.napi_pids[1])?)));
            let start = Instant::now();
            // Set even when the lead-in failed, so the helper is not left waiting.
            let _ = deadline.set(start + time);
            ready.wait();
            let mine = before.and_then(|b| {
                while start.elapsed() < time {
                    sender.send(g1, frame, SEND_BATCH).map_err(kernel("run the generator"))?;
                }
                Ok(b)
            });
            let theirs = helper.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            let secs = start.elapsed().as_secs_f64();
            let (p0, a0, b0) = mine?;
            theirs?;
            let p1 = program.packets()?;
            let (a, b) = (cpu(two.napi_pids[0])?.saturating_sub(a0), cpu(two.napi_pids[1])?.saturating_sub(b0));
            Ok(Slice {
                runs: p1.saturating_sub(p0),
                prog_ns: 0,
                prog_runs: 0,
                cpu_ns: a + b,
                cpu_ns_min: a.min(b),
                secs,
                bare: None,
            })
        })
    }

    /// Runs `c`'s generator flat out for `time` (after a short unmeasured lead-in,
    /// so frames queued for the previous program are done), measuring the packets `c`'s program
    /// handled and the NAPI thread's CPU time; then, on the frames path, times the
    /// program with no device ([`Bench::time_without_device`]; a failure there is
    /// logged and leaves the slice untimed, not the run lost). A tag mode on the skb
    /// path has its classifier attached to g0 for the slice only (two on one egress
    /// would overwrite each other's tags).
    fn measure(&self, c: &mut Contender, time: Duration) -> Result<Slice, LbError> {
        let _classifier = match &c.tagger {
            Some(t) => Some(t.attach_egress(self.g0).map_err(kernel("attach the flow classifier to g0"))?),
            None => None,
        };
        c.feed.send(self.g0, LEAD_IN).map_err(kernel("run the generator"))?;
        // Packets per core with run-time statistics off (they cost every run two clock
        // reads); program time in a last quarter with them on.
        let (rate_time, prog_time) = (time * 3 / 4, time / 4);
        let p0 = c.program.packets()?;
        let cpu0 = task_cpu_ns(self.napi_pid).map_err(kernel("read the NAPI thread's CPU time"))?;
        let start = Instant::now();
        while start.elapsed() < rate_time {
            c.feed.send(self.g0, SEND_BATCH).map_err(kernel("run the generator"))?;
        }
        let secs = start.elapsed().as_secs_f64();
        let p1 = c.program.packets()?;
        let cpu1 = task_cpu_ns(self.napi_pid).map_err(kernel("read the NAPI thread's CPU time"))?;
        let _stats = enable_run_time_stats().map_err(kernel("enable BPF run-time statistics"))?;
        let prog = c.program.fd();
        let (c0, t0) = program_run_stats(prog).map_err(kernel("read program statistics"))?;
        let start = Instant::now();
        while start.elapsed() < prog_time {
            c.feed.send(self.g0, SEND_BATCH).map_err(kernel("run the generator"))?;
        }
        let (c1, t1) = program_run_stats(prog).map_err(kernel("read program statistics"))?;
        drop(_stats);
        let bare = match &c.feed {
            Feed::Frames(g, frame) => {
                let before = c.program.counts()?;
                let frames = bare_frames(time);
                let bare = pin_to(self.cpus.balancers[0])
                    .and_then(|()| self.time_without_device(g, frame, c.program.fd(), frames));
                // Back on the generator's CPU whatever happened: every later send is from there.
                pin_to(self.cpus.generators[0])?;
                if let (Some(b), Some(a)) = (before, c.program.counts()?) {
                    for k in 0..3 {
                        c.bare_counts[k] += a[k].saturating_sub(b[k]);
                    }
                }
                bare.inspect_err(|e| {
                    let e = netlane::error::chain(e);
                    tracing::warn!("{}: timing with no device failed: {e}", c.subject.label())
                })
                .ok()
            }
            Feed::Skb(_) => None,
        };
        Ok(Slice {
            runs: p1.saturating_sub(p0),
            prog_ns: t1.saturating_sub(t0),
            prog_runs: c1.saturating_sub(c0),
            cpu_ns: cpu1.saturating_sub(cpu0),
            cpu_ns_min: cpu1.saturating_sub(cpu0),
            secs,
            bare,
        })
    }

    /// Times `prog` with no device in the path: `g` runs `frames` frames chained
    /// into it (a tail call in place of the transmit) on the balancer's CPU, where its
    /// per-CPU state is warm, and the program's XDP_TX output is dropped at the
    /// namespace's loopback device; then the generator's next frames into `xdp_tx`
    /// and `xdp_tx_room` (the same flows and hints; at many flows each timing walks
    /// its own part of them), so that differences cancel the generator's work (which
    /// differs: with hints it writes the metadata). Kernel's ns per frame (whole ns),
    /// runner included.
    /// The caller pins the thread to the balancer's CPU and back.
    fn time_without_device(
        &self,
        g: &PktGen,
        frame: &[u8],
        prog: BorrowedFd<'_>,
        frames: u32,
    ) -> Result<Bare, LbError> {
        let time = |p: BorrowedFd<'_>, what: &str| -> Result<f64, LbError> {
            g.chain(p)
                .and_then(|c| c.send_timed(self.lo, frame, frames))
                .map(f64::from)
                .map_err(kernel(format!("run the generator chained into {what}")))
        };
        Ok(Bare {
            program_ns: time(prog, "the program")?,
            xdp_tx_ns: time(self.reference.program_fd(), "xdp_tx")?,
            room_ns: time(self.reference.room_program_fd(), "xdp_tx_room")?,
        })
    }
}

//! Warming a balancer up before its turns: every flow sent, pass after pass, until the
//! connection table is warm and, in tag modes, every flow's tag is installed; how a
//! pass is judged, and how the warm-up went.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use netlane_lb::{Lb, LbError, LbStats};
use netlane_sys::bpf::{HintMode, PktGen, XdpLink, XdpMode};
use serde::Serialize;

use super::counters::{fast_path, packets_of};
use super::generator::{SkbFeed, pin_to};
use super::network::Bench;
use super::{WARM_BURST, WARM_ENOUGH, WARM_PASSES, WARM_THREADS, kernel};

/// How a balancer's warm-up went.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WarmUp {
    /// Passes over every flow it took.
    pub passes: u32,
    /// Whether the last pass met `WARM_ENOUGH`.
    pub complete: bool,
    /// What the last pass saw, or why it fell short.
    pub last: String,
}

/// One warm-up pass: every flow sent once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WarmPass {
    /// Flows (frames sent in the pass).
    pub flows: u64,
    /// Frames the balancer ran on in the pass.
    pub ran: u64,
    /// Of those, frames that took the fast path (connection-table or hint hit).
    pub fast: u64,
    /// Tags held after the pass (tag modes).
    pub tagged: Option<u64>,
}

impl std::fmt::Display for WarmPass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} of {} frames reached the balancer, {} took the fast path", self.ran, self.flows, self.fast)?;
        if let Some(t) = self.tagged {
            write!(f, ", {t} flows tagged")?;
        }
        Ok(())
    }
}

impl WarmPass {
    /// Ok when most of the pass's frames reached the balancer, (nearly) every one that
    /// did took the fast path, and in tag modes (nearly) every flow has a tag; else why
    /// not.
    ///
    /// Frames are lost at the veth ring, before the balancer and whatever their flow's
    /// state, so the frames that arrived are a fair sample of the flows: if 99.9% of a
    /// majority of the flows were served from warm state, so are about 99.9% of all.
    /// A pass where most frames never arrived proves nothing and is not accepted.
    pub fn check(&self) -> Result<(), String> {
        let pct = |n: u64, of: u64| 100.0 * n as f64 / of.max(1) as f64;
        if self.ran * 2 <= self.flows {
            return Err(format!("only {:.1}% of the frames reached the balancer", pct(self.ran, self.flows)));
        }
        if (self.fast as f64) < WARM_ENOUGH * self.ran as f64 {
            return Err(format!(
                "only {:.1}% of the frames that reached the balancer took the fast path",
                pct(self.fast, self.ran)
            ));
        }
        if let Some(t) = self.tagged
            && (t as f64) < WARM_ENOUGH * self.flows as f64
        {
            return Err(format!("only {:.1}% of the flows had a tag", pct(t, self.flows)));
        }
        Ok(())
    }
}

/// Where warm-up frames come from.
#[derive(Debug, Clone, Copy)]
struct WarmFrom {
    /// The senders' CPU.
    cpu: usize,
    /// The generator end they send out of.
    ifindex: u32,
    /// Frames per pass (the flows the generator sends from that CPU).
    per_pass: u32,
    /// The second CPU's pass: tags were counted in the first (they are not per CPU),
    /// and in rx-hash mode only hint hits count as warm (the flow cache is per CPU; a
    /// miss there still finds the connection table).
    second_cpu: bool,
}

impl Bench {
    /// Sends every flow once per pass (from [`WARM_THREADS`] threads) until a pass where
    /// all but 1 - [`WARM_ENOUGH`] of the flows were in the connection table and, in tag
    /// modes, that share of the flows has a tag; new-flow events are serviced (and so
    /// tags installed) as they come. Frames lost on the way only cost another pass.
    pub(super) fn warm_up(
        &self,
        g: &PktGen,
        frame: &[u8],
        lb: &mut Lb,
        hint: HintMode,
        flows: u32,
    ) -> Result<WarmUp, LbError> {
        self.warm_passes(
            g,
            frame,
            lb,
            hint,
            WarmFrom { cpu: self.cpus.generators[0], ifindex: self.g0, per_pass: flows, second_cpu: false },
        )
    }

    /// For the two-core turns: the second generator's half of the flows, sent from its
    /// CPU into l1 (whose NAPI thread for that queue runs on the second balancer CPU), as
    /// in those turns, until that CPU's per-CPU state (the rx-hash flow cache) is warm
    /// too. The balancer is attached to
    /// l1 meanwhile.
    pub(super) fn warm_up_second_cpu(
        &self,
        g: &PktGen,
        frame: &[u8],
        lb: &mut Lb,
        hint: HintMode,
        flows: u32,
    ) -> Result<WarmUp, LbError> {
        let two = self.two.as_ref().ok_or_else(|| LbError::Invalid("no two-core link was built".into()))?;
        self.lb_ns.enter_on_this_thread()?;
        let link = XdpLink::attach(lb.balancer().program_fd(), two.l1, XdpMode::Native);
        self.gen_ns.enter_on_this_thread()?;
        let _link = link.map_err(kernel("attach to l1"))?;
        g.set_split(&self.cpus.generators).map_err(kernel("split the flows between the generators"))?;
        let warm = self.warm_passes(
            g,
            frame,
            lb,
            hint,
            WarmFrom { cpu: self.cpus.generators[1], ifindex: two.g1, per_pass: flows / 2, second_cpu: true },
        );
        g.set_split(&[]).map_err(kernel("undo the generator's split"))?;
        warm
    }

    fn warm_passes(
        &self,
        g: &PktGen,
        frame: &[u8],
        lb: &mut Lb,
        hint: HintMode,
        from: WarmFrom,
    ) -> Result<WarmUp, LbError> {
        let tagging = hint.tags();
        let (sender, gen_ns, g0) = (g.sender(), &self.gen_ns, from.ifindex);
        let flows = from.per_pass;
        let mut last = String::from("no pass ran");
        // Fewer senders after a pass that lost most of its frames on the way: the veth
        // ring holds WARM_BURST frames, and parallel bursts (released together at the
        // end of an RCU grace period) overrun it when the balancer is slow.
        let mut threads = WARM_THREADS;
        for pass in 1..=WARM_PASSES as u32 {
            let warm_count = |st: &LbStats| {
                if from.second_cpu && hint == HintMode::RxHash {
                    st.global.get("hint_hit").copied().unwrap_or(0)
                } else {
                    fast_path(st)
                }
            };
            let st0 = lb.stats()?;
            let (fast0, ran0) = (warm_count(&st0), packets_of(&st0));
            let left = AtomicI64::new(i64::from(flows));
            std::thread::scope(|s| -> Result<(), LbError> {
                let senders: Vec<_> = (0..threads)
                    .map(|_| {
                        s.spawn(|| -> Result<(), LbError> {
                            pin_to(from.cpu)?;
                            gen_ns.enter_on_this_thread()?;
                            loop {
                                let was = left.fetch_sub(i64::from(WARM_BURST), Ordering::Relaxed);
                                if was <= 0 {
                                    return Ok(());
                                }
                                let n = was.min(i64::from(WARM_BURST)) as u32;
                                sender.send(g0, frame, n).map_err(kernel("run the generator"))?;
                            }
                        })
                    })
                    .collect();
                while !senders.iter().all(|t| t.is_finished()) {
                    if tagging {
                        lb.service_events(Duration::from_millis(1))?;
                    } else {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                for t in senders {
                    t.join().unwrap_or_else(|p| std::panic::resume_unwind(p))?;
                }
                Ok(())
            })?;
            if tagging {
                lb.service_events(Duration::from_millis(5))?;
            }
            let st = lb.stats()?;
            let p = WarmPass {
                flows: u64::from(flows),
                ran: packets_of(&st).saturating_sub(ran0),
                fast: warm_count(&st).saturating_sub(fast0),
                tagged: (tagging && !from.second_cpu).then_some(st.tags_in_use as u64),
            };
            match p.check() {
                Ok(()) => return Ok(WarmUp { passes: pass, complete: true, last: p.to_string() }),
                Err(why) => last = format!("{why} ({threads} parallel senders)"),
            }
            if p.ran * 2 <= p.flows {
                threads = (threads / 2).max(1);
            }
        }
        // Not warm (frames lost on the way, or a table too small): the report flags it.
        tracing::warn!(flows, hint = hint.name(), "warm-up incomplete: {last}");
        Ok(WarmUp { passes: WARM_PASSES as u32, complete: false, last })
    }
}

/// Warms a balancer up on the skb path: every flow sent through the packet socket per
/// pass (in bursts the veth ring holds, events serviced between them) until a pass
/// where its connection entry and, in tag modes, its tag (installed in the TCX
/// classifier on g0) are in place.
pub(super) fn warm_skb(feed: &mut SkbFeed, lb: &mut Lb, hint: HintMode, flows: u32) -> Result<WarmUp, LbError> {
    let tagging = hint.tags();
    let mut warm = WarmUp { passes: 0, complete: false, last: "no pass ran".into() };
    for pass in 1..=WARM_PASSES as u32 {
        let st0 = lb.stats()?;
        let (fast0, ran0) = (fast_path(&st0), packets_of(&st0));
        for chunk in 0..flows.div_ceil(WARM_BURST) {
            let n = (flows - chunk * WARM_BURST).min(WARM_BURST);
            feed.send(n as usize).map_err(kernel("send on g0"))?;
            lb.service_events(Duration::from_millis(if tagging { 1 } else { 0 }))?;
        }
        std::thread::sleep(Duration::from_millis(20));
        if tagging {
            lb.service_events(Duration::from_millis(5))?;
        }
        let st = lb.stats()?;
        let p = WarmPass {
            flows: u64::from(flows),
            ran: packets_of(&st).saturating_sub(ran0),
            fast: fast_path(&st).saturating_sub(fast0),
            tagged: tagging.then_some(st.tags_in_use as u64),
        };
        match p.check() {
            Ok(()) => {
                warm = WarmUp { passes: pass, complete: true, last: p.to_string() };
                break;
            }
            Err(why) => warm = WarmUp { passes: pass, complete: false, last: why },
        }
    }
    if !warm.complete {
        tracing::warn!(flows, hint = hint.name(), "warm-up incomplete (skb path): {}", warm.last);
    }
    Ok(warm)
}

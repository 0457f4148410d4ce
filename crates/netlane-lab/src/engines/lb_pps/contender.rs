//! Loading the contenders of a comparison: each program (the XDP_TX ceiling, or the
//! balancer in a hint mode, with its configuration) with a generator of its own, on
//! the frames path or the skb path, warmed up and detached; and a contender's results
//! after its turns.

use std::rc::Rc;

use netlane_lb::proto::config::Config;
use netlane_lb::{HintSource, Lb, LbError, LbOptions};
use netlane_sys::bpf::{HintMode, PKTGEN_HEADER_LEN, PktGen, PktGenOptions, XdpMode, XdpTx};

use super::counters::{Program, packets_of};
use super::generator::{Feed, GenClassifier, SkbClassifier, SkbFeed, template};
use super::network::Bench;
use super::results::{PpsResult, Slice, Subject};
use super::warm_up::{WarmUp, warm_skb};
use super::{GEN_SRC, VIP, kernel, splits_in_two};

/// One subject of a comparison, ready to take its turns.
pub(super) struct Contender {
    pub(super) subject: Subject,
    pub(super) flows: u32,
    pub(super) feed: Feed,
    pub(super) program: Program,
    /// The classifier of a tag mode on the skb path (attached in its turns only).
    pub(super) tagger: Option<Rc<netlane_sys::bpf::FlowTagger>>,
    pub(super) slices: Vec<Slice>,
    /// Slices on two cores (frames path, when measured).
    pub(super) two_core_slices: Vec<Slice>,
    /// A balancer's hint hits, connection-table hits and runs in the two-core turns.
    pub(super) two_core_counts: [u64; 3],
    /// The same in its runs with no device.
    pub(super) bare_counts: [u64; 3],
}

impl Bench {
    /// Loads `subject` for `flows` flows with a generator of its own, attaches it to
    /// warm it up (balancers), and detaches it again.
    pub(super) fn contender(&self, subject: Subject, flows: u32) -> Result<Contender, LbError> {
        let hints = matches!(subject, Subject::Balancer(h) if h != HintMode::Off);
        let frame = template(self.l0_mac, self.g0_mac);
        let mut header = [0u8; PKTGEN_HEADER_LEN];
        header.copy_from_slice(&frame[..PKTGEN_HEADER_LEN]);
        let generator = Rc::new(
            PktGen::load(PktGenOptions { flows, with_hints: hints, src_base: GEN_SRC, header })
                .map_err(kernel("load the generator"))?,
        );
        let program = match subject {
            Subject::SkbCeiling | Subject::SkbBalancer(_) => return self.contender_skb(subject, flows),
            Subject::TwoCoreCeiling | Subject::TwoCoreBalancer(_) => {
                return Err(LbError::Invalid(format!(
                    "{} is measured with its one-core program, in the same turns",
                    subject.label()
                )));
            }
            Subject::XdpTxCeiling => Program::XdpTx(XdpTx::load().map_err(kernel("load xdp_tx"))?),
            Subject::Balancer(hint) => {
                let mut opts = LbOptions::new("l0", self.g0_mac);
                opts.hint = hint;
                opts.hint_source = HintSource::Metadata;
                opts.max_vips = 1;
                opts.max_reals = 8;
                opts.max_tags = flows.max(1024);
                // Room for every flow: in the rx-hash cache (a direct-mapped cache: 4 slots
                // per flow keep collisions to about a fifth of the flows) and in the
                // event ring while the control plane catches up.
                opts.hint_cache = (flows.saturating_mul(4)).next_power_of_two().clamp(1 << 16, 1 << 22);
                opts.event_ring_bytes = (flows.saturating_mul(64)).next_power_of_two().clamp(1 << 20, 1 << 26);
                self.lb_ns.enter_on_this_thread()?;
                let lb = Lb::start(&lb_config(flows), opts);
                self.gen_ns.enter_on_this_thread()?;
                let mut lb = lb?;
                if lb.mode() != XdpMode::Native {
                    return Err(LbError::Invalid("the balancer did not attach in native mode".into()));
                }
                lb.set_classifier(Box::new(GenClassifier(generator.clone())));
                if hint == HintMode::RxHash {
                    // The "NIC" hashes each flow: a fixed, well-mixed value per flow.
                    // (The top bit keeps it from being 0, "no hint"; the cache uses low bits.)
                    let h: Vec<u32> = (0..flows)
                        .map(|f| f.wrapping_add(1).wrapping_mul(0x9e37_79b1).rotate_left(7) | 1 << 31)
                        .collect();
                    for (i, c) in h.chunks(1 << 16).enumerate() {
                        generator.set_hints(i as u32 * (1 << 16), c).map_err(kernel("write generator hints"))?;
                    }
                }
                let mut warm = self.warm_up(&generator, &frame, &mut lb, hint, flows)?;
                if self.two.is_some() && splits_in_two(flows) {
                    let second = self.warm_up_second_cpu(&generator, &frame, &mut lb, hint, flows)?;
                    if !second.complete {
                        warm = WarmUp {
                            passes: warm.passes + second.passes,
                            complete: false,
                            last: format!("on the second CPU (two-core turns): {}", second.last),
                        };
                    }
                }
                lb.detach();
                let before = lb.stats()?;
                Program::Balancer(Box::new(lb), before, warm)
            }
        };
        // Measured frames visit the flows in a scattered order, not the order in which
        // they were first seen (and their state allocated).
        generator.set_stride(PktGen::scatter_stride(flows)).map_err(kernel("set the generator's flow order"))?;
        Ok(Contender {
            subject,
            flows,
            feed: Feed::Frames(generator, frame),
            program,
            tagger: None,
            slices: Vec::new(),
            two_core_slices: Vec::new(),
            two_core_counts: [0; 3],
            bare_counts: [0; 3],
        })
    }

    /// Loads `subject` on the skb path, attaches it, and warms it up: every flow sent
    /// until its connection entry (and in tag modes its tag, installed in the TCX
    /// classifier on g0) is in place.
    fn contender_skb(&self, subject: Subject, flows: u32) -> Result<Contender, LbError> {
        let frame = template(self.l0_mac, self.g0_mac);
        let mut feed = SkbFeed::open(self.g0, flows, &frame).map_err(kernel("open the packet socket on g0"))?;
        let (program, tagger) = match subject {
            Subject::SkbBalancer(hint) => {
                let tagging = hint.tags();
                let mut opts = LbOptions::new("l0", self.g0_mac);
                opts.hint = hint;
                opts.hint_source = HintSource::Kfunc;
                opts.max_vips = 1;
                opts.max_reals = 8;
                opts.max_tags = flows.max(1024);
                self.lb_ns.enter_on_this_thread()?;
                let lb = Lb::start(&lb_config(flows), opts);
                self.gen_ns.enter_on_this_thread()?;
                let mut lb = lb?;
                let tagger = if tagging {
                    let t = Rc::new(
                        netlane_sys::bpf::FlowTagger::load(flows.max(1024))
                            .map_err(kernel("load the flow classifier"))?,
                    );
                    lb.set_classifier(Box::new(SkbClassifier(t.clone())));
                    Some(t)
                } else {
                    None
                };
                let link = match &tagger {
                    Some(t) => Some(t.attach_egress(self.g0).map_err(kernel("attach the flow classifier to g0"))?),
                    None => None,
                };
                let warm = warm_skb(&mut feed, &mut lb, hint, flows)?;
                drop(link);
                lb.detach();
                let before = lb.stats()?;
                (Program::Balancer(Box::new(lb), before, warm), tagger)
            }
            Subject::SkbCeiling => (Program::XdpTx(XdpTx::load().map_err(kernel("load xdp_tx"))?), None),
            _ => return Err(LbError::Invalid(format!("{} is not on the skb path", subject.label()))),
        };
        Ok(Contender {
            subject,
            flows,
            feed: Feed::Skb(feed),
            program,
            tagger,
            slices: Vec::new(),
            two_core_slices: Vec::new(),
            two_core_counts: [0; 3],
            bare_counts: [0; 3],
        })
    }
}

impl Contender {
    /// The results (one core, and two when measured); `returned` frames came back
    /// during all contenders' turns.
    pub(super) fn results(&self, returned: u64) -> Result<Vec<PpsResult>, LbError> {
        // Hint and connection-table hits over every run during the turns, lead-ins
        // included: the one-core turns', and the two-core turns' on their own.
        let ratio = |c: [u64; 3]| (c[0] as f64 / c[2].max(1) as f64, c[1] as f64 / c[2].max(1) as f64);
        let ((hint, conn), (hint2, conn2)) = match &self.program {
            Program::XdpTx(_) => ((0.0, 0.0), (0.0, 0.0)),
            Program::Balancer(lb, before, _) => {
                let after = lb.stats()?;
                let d = |k: &str| {
                    after.global.get(k).copied().unwrap_or(0).saturating_sub(before.global.get(k).copied().unwrap_or(0))
                };
                let hint = d(super::counters::hint_counter(lb.options().hint));
                let total = [hint, d("conn_hit"), packets_of(&after).saturating_sub(packets_of(before))];
                let two = self.two_core_counts;
                let one = [0, 1, 2].map(|k| total[k].saturating_sub(two[k]).saturating_sub(self.bare_counts[k]));
                (ratio(one), ratio(two))
            }
        };
        let warm = match &self.program {
            Program::Balancer(.., w) => Some(w.clone()),
            Program::XdpTx(_) => None,
        };
        let mut out =
            vec![PpsResult::from_slices(self.subject, self.flows, &self.slices, hint, conn, returned, warm.clone())];
        if let (false, Some(two)) = (self.two_core_slices.is_empty(), self.subject.on_two_cores()) {
            out.push(PpsResult::from_slices(two, self.flows, &self.two_core_slices, hint2, conn2, returned, warm));
        }
        Ok(out)
    }
}

/// Connection-table entries for `flows` flows on a machine with `possible_cpus` CPUs.
/// The table keeps one LRU list per possible CPU and splits its entries evenly between
/// them, and here every flow arrives on one CPU: that CPU's share must hold all flows,
/// with room to spare (at 1.25 x the flows, the kernel's LRU evicted live entries:
/// half the lookups missed).
pub fn conn_entries(flows: u32, possible_cpus: usize) -> u32 {
    (u64::from(flows) * 2 * possible_cpus as u64).clamp(4096, u64::from(netlane_lb::proto::config::MAX_CONN_ENTRIES))
        as u32
}

/// The balancer's configuration for `flows` flows. The CPU count is the kernel's
/// possible CPUs (what per-CPU LRU lists are made for), not `available_parallelism()`,
/// which says 1 on the generator's thread, pinned to one CPU.
pub(super) fn lb_config(flows: u32) -> Config {
    let conn = conn_entries(flows, netlane::cpus::possible_count());
    let text = format!(
        "ring_size = 65537\nconn_entries = {conn}\nmax_new_conns_per_cpu = 0\n[[vip]]\naddress = \"{VIP}\"\nport = 80\n\
         proto = \"tcp\"\n[[vip.real]]\naddress = \"10.211.1.1\"\n[[vip.real]]\naddress = \"10.211.1.2\"\n\
         [[vip.real]]\naddress = \"10.211.1.3\"\n"
    );
    Config::parse(&text).expect("the benchmark's own configuration is valid")
}

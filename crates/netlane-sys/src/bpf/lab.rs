//! The lab's packet generator and sink (`bpf/lab/pktgen.bpf.c`).
//!
//! The generator runs in the calling thread through `BPF_PROG_RUN` in live-frames mode:
//! the kernel builds frames from a template, runs the program on each (it rewrites the
//! flow and, with hints, writes the hint into the metadata) and transmits the result on
//! the interface given as the run's ingress (veth: to the peer, as XDP frames).

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags};

use super::{object_storage, percpu_sum, pktgen_skel, to_io};

/// `BPF_F_TEST_XDP_LIVE_FRAMES`.
const LIVE_FRAMES: u32 = 1 << 1;

/// Source ports per source address (flow f uses address base + f / this, port
/// 10000 + f % this), as in the program.
pub const PORTS_PER_ADDR: u32 = 50_000;
/// First source port.
pub const PORT_BASE: u16 = 10_000;

/// What to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PktGenOptions {
    /// Distinct flows, cycled through in order (or with [`PktGen::set_stride`]).
    pub flows: u32,
    /// Write each flow's hint (from [`PktGen::set_hints`]) into the metadata.
    pub with_hints: bool,
    /// Source address of flow 0.
    pub src_base: Ipv4Addr,
    /// Ethernet, IPv4 and TCP header of every frame (the generator rewrites the source
    /// address, its checksum and the source port).
    pub header: [u8; HEADER_LEN],
}

/// Bytes of the header the generator writes.
pub const HEADER_LEN: usize = 54;

/// The generator and sink programs, loaded.
pub struct PktGen {
    skel: pktgen_skel::PktgenSkel<'static>,
    opts: PktGenOptions,
}

impl std::fmt::Debug for PktGen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PktGen").field("opts", &self.opts).finish_non_exhaustive()
    }
}

impl PktGen {
    /// Loads both programs.
    pub fn load(opts: PktGenOptions) -> io::Result<PktGen> {
        if opts.flows == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "the generator needs at least one flow"));
        }
        let mut open = pktgen_skel::PktgenSkelBuilder::default().open(object_storage()).map_err(to_io)?;
        open.maps.gen_hints.set_max_entries(opts.flows).map_err(to_io)?;
        let ro = open.maps.rodata_data.as_deref_mut().ok_or_else(|| io::Error::other("pktgen has no .rodata"))?;
        ro.flows = opts.flows;
        ro.with_hints = u32::from(opts.with_hints);
        ro.src_base = u32::from(opts.src_base);
        ro.header = opts.header;
        Ok(PktGen { skel: open.load().map_err(to_io)?, opts })
    }

    /// Flow `f`'s source address and port.
    pub fn flow_source(&self, f: u32) -> (Ipv4Addr, u16) {
        let addr = Ipv4Addr::from(u32::from(self.opts.src_base).wrapping_add(f / PORTS_PER_ADDR));
        (addr, PORT_BASE + (f % PORTS_PER_ADDR) as u16)
    }

    /// The flow a source address and port belong to, if it is one of ours.
    pub fn flow_of(&self, src: Ipv4Addr, sport: u16) -> Option<u32> {
        let a = u32::from(src).checked_sub(u32::from(self.opts.src_base))?;
        let p = u32::from(sport.checked_sub(PORT_BASE)?);
        let f = a.checked_mul(PORTS_PER_ADDR)?.checked_add(p)?;
        (p < PORTS_PER_ADDR && f < self.opts.flows).then_some(f)
    }

    /// Sets the flow order: run k of a pass sends flow (k * stride) % flows. The stride
    /// must be coprime with the flow count (so a pass still sends every flow once); 1
    /// is in order (the default).
    pub fn set_stride(&self, stride: u32) -> io::Result<()> {
        if stride == 0 || gcd(stride, self.opts.flows) != 1 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("stride {stride} is not coprime with {} flows", self.opts.flows),
            ));
        }
        let zero = 0u32.to_ne_bytes();
        self.skel.maps.gen_stride.update(&zero, &stride.to_ne_bytes(), MapFlags::ANY).map_err(to_io)
    }

    /// A stride that scatters: coprime with `flows`, near `flows` times the golden
    /// ratio's fractional part (1 for one or two flows).
    pub fn scatter_stride(flows: u32) -> u32 {
        if flows <= 2 {
            return 1;
        }
        let mut s = ((u64::from(flows) * 618_034 / 1_000_000) as u32).max(1);
        while gcd(s, flows) != 1 {
            s += 1;
        }
        s
    }

    /// Splits the flows between generators on `cpus`, as RSS keeps a flow on one queue:
    /// with more than one CPU, the generator on the i-th sends only the positions of a
    /// pass congruent to i modulo their number, so they never send the same flow (CPUs
    /// not listed must not send meanwhile). Their number must divide the flow count; one
    /// CPU, or none, lets every CPU send every flow (the default).
    pub fn set_split(&self, cpus: &[usize]) -> io::Result<()> {
        let parts = cpus.len().max(1) as u32;
        let invalid = |why: String| Err(io::Error::new(io::ErrorKind::InvalidInput, why));
        if !self.opts.flows.is_multiple_of(parts) {
            return invalid(format!("{} flows cannot be split into {parts} equal parts", self.opts.flows));
        }
        let possible = libbpf_rs::num_possible_cpus().map_err(to_io)?;
        if let Some(c) = cpus.iter().find(|c| **c >= possible) {
            return invalid(format!("CPU {c} is not a possible CPU (there are {possible})"));
        }
        if cpus.iter().enumerate().any(|(i, c)| cpus[..i].contains(c)) {
            return invalid(format!("CPUs {cpus:?}: a CPU is listed twice"));
        }
        // struct gen_split { u32 part; u32 parts; } for each possible CPU.
        let values: Vec<Vec<u8>> = (0..possible)
            .map(|c| {
                let part = cpus.iter().position(|x| *x == c).unwrap_or(0) as u32;
                let mut v = part.to_ne_bytes().to_vec();
                v.extend_from_slice(&parts.to_ne_bytes());
                v
            })
            .collect();
        self.skel.maps.gen_split.update_percpu(&0u32.to_ne_bytes(), &values, MapFlags::ANY).map_err(to_io)
    }

    /// Sets the hints of flows `first..first + hints.len()` (0 = none).
    pub fn set_hints(&self, first: u32, hints: &[u32]) -> io::Result<()> {
        if hints.is_empty() {
            return Ok(());
        }
        let end = first.checked_add(hints.len() as u32).filter(|e| *e <= self.opts.flows);
        if end.is_none() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "hints beyond the generator's flows"));
        }
        let keys: Vec<u8> = (first..first + hints.len() as u32).flat_map(|f| f.to_ne_bytes()).collect();
        let values: Vec<u8> = hints.iter().flat_map(|h| h.to_ne_bytes()).collect();
        self.skel
            .maps
            .gen_hints
            .update_batch(&keys, &values, hints.len() as u32, MapFlags::ANY, MapFlags::ANY)
            .map_err(to_io)
    }

    /// Sends `count` frames built from `template` (an Ethernet/IPv4/TCP frame) out of
    /// interface `ifindex`, which must be in the calling thread's network namespace.
    /// Returns when the kernel has run the program `count` times.
    pub fn send(&self, ifindex: u32, template: &[u8], count: u32) -> io::Result<()> {
        self.sender().send(ifindex, template, count)
    }

    /// A handle that sends from any thread (each in the generator's namespace); runs
    /// from several threads at once share the flow sequence.
    pub fn sender(&self) -> LiveSender<'_> {
        LiveSender { prog: self.skel.progs.pktgen.as_fd() }
    }

    /// Sends every generated frame on to `prog` (an XDP program, not device-bound)
    /// instead of out of the device, until the returned guard is dropped: with
    /// [`LiveSender::send_timed`] on the loopback device this times `prog` per frame
    /// with no device in the path. One chain at a time: a second replaces the first,
    /// and either guard's drop ends both.
    pub fn chain(&self, prog: BorrowedFd<'_>) -> io::Result<Chain<'_>> {
        let key = 0u32.to_ne_bytes();
        let fd = prog.as_raw_fd().to_ne_bytes();
        self.skel.maps.gen_next.update(&key, &fd, MapFlags::ANY).map_err(to_io)?;
        Ok(Chain { generator: self })
    }

    /// The sink program (attach it where the balancer's output arrives).
    pub fn sink_fd(&self) -> BorrowedFd<'_> {
        self.skel.progs.sink.as_fd()
    }

    /// The pass-everything program (for a veth end that must receive XDP_TX frames).
    pub fn pass_fd(&self) -> BorrowedFd<'_> {
        self.skel.progs.pass.as_fd()
    }

    /// The generator program's fd.
    pub fn pktgen_fd(&self) -> BorrowedFd<'_> {
        self.skel.progs.pktgen.as_fd()
    }

    /// Frames the sink has dropped so far.
    pub fn sunk(&self) -> io::Result<u64> {
        percpu_sum(&self.skel.maps.sink_stats, 0)
    }
}

/// Generated frames go on to another program while this lives (see [`PktGen::chain`]).
#[derive(Debug)]
pub struct Chain<'a> {
    generator: &'a PktGen,
}

impl Chain<'_> {
    /// Runs the generator and the chained program on `count` frames (on interface
    /// `ifindex`, as [`PktGen::send`]); the kernel's mean time per frame in ns.
    pub fn send_timed(&self, ifindex: u32, template: &[u8], count: u32) -> io::Result<u32> {
        self.generator.sender().send_timed(ifindex, template, count)
    }
}

impl Drop for Chain<'_> {
    fn drop(&mut self) {
        // ENOENT: a later chain's guard has already emptied the slot.
        if let Err(e) = self.generator.skel.maps.gen_next.delete(&0u32.to_ne_bytes())
            && e.kind() != libbpf_rs::ErrorKind::NotFound
        {
            tracing::warn!("could not unchain the generator: {e}");
        }
    }
}

/// Sends live frames through the generator program (see [`PktGen::sender`]).
#[derive(Debug, Clone, Copy)]
pub struct LiveSender<'a> {
    prog: BorrowedFd<'a>,
}

impl LiveSender<'_> {
    /// As [`PktGen::send`].
    pub fn send(&self, ifindex: u32, template: &[u8], count: u32) -> io::Result<()> {
        self.send_timed(ifindex, template, count).map(|_| ())
    }

    /// As [`PktGen::send`]; returns the kernel's mean time per frame in ns (the
    /// program and the live-frames runner around it, transmit included).
    pub fn send_timed(&self, ifindex: u32, template: &[u8], count: u32) -> io::Result<u32> {
        if template.len() < 14 + 20 + 20 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "template shorter than Ethernet/IPv4/TCP headers"));
        }
        let len = u32::try_from(template.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "template longer than 4 GiB"))?;
        // struct xdp_md as the input context: data_end = the frame's length, and the
        // interface the frames go out of as ingress_ifindex.
        let mut ctx = [0u8; 24];
        ctx[4..8].copy_from_slice(&len.to_ne_bytes());
        ctx[12..16].copy_from_slice(&ifindex.to_ne_bytes());
        // SAFETY: bpf_test_run_opts is a plain C struct; all-zero is "no options" and
        // `sz` says which fields exist.
        let mut opts: libbpf_sys::bpf_test_run_opts = unsafe { std::mem::zeroed() };
        opts.sz = std::mem::size_of::<libbpf_sys::bpf_test_run_opts>() as _;
        opts.data_in = template.as_ptr().cast();
        opts.data_size_in = len;
        opts.ctx_in = ctx.as_ptr().cast();
        opts.ctx_size_in = ctx.len() as u32;
        opts.flags = LIVE_FRAMES;
        opts.repeat = i32::try_from(count)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("at most {} frames per run", i32::MAX)))?;
        // SAFETY: the program fd is valid while `self` borrows it; data_in and ctx_in
        // point to buffers of the sizes given that outlive the call, and the kernel
        // only reads them (no output buffers are set).
        let rc = unsafe { libbpf_sys::bpf_prog_test_run_opts(self.prog.as_raw_fd(), &mut opts) };
        if rc < 0 {
            return Err(io::Error::from_raw_os_error(-rc));
        }
        Ok(opts.duration)
    }
}

fn gcd(mut a: u32, mut b: u32) -> u32 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn online_cpus() -> usize {
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    }

    /// The flow of a frame the generator built (source address and port).
    fn flow_in(g: &PktGen, frame: &[u8]) -> u32 {
        let src = Ipv4Addr::new(frame[26], frame[27], frame[28], frame[29]);
        let sport = u16::from_be_bytes([frame[34], frame[35]]);
        g.flow_of(src, sport).expect("one of the generator's flows")
    }

    #[test]
    fn generators_on_two_cpus_split_the_flows_between_them() {
        if !super::super::tests::may_load_bpf("generators_on_two_cpus_split_the_flows_between_them") {
            return;
        }
        assert!(online_cpus() >= 2, "this test runs the generator on two CPUs");
        let mut template = vec![0u8; 64];
        template[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        template[14] = 0x45;
        let mut header = [0u8; HEADER_LEN];
        header.copy_from_slice(&template[..HEADER_LEN]);
        let flows = 10u32;
        let g = PktGen::load(PktGenOptions { flows, with_hints: false, src_base: Ipv4Addr::new(10, 9, 0, 0), header })
            .unwrap();
        g.set_stride(3).unwrap();
        let on_cpu = |cpu: usize, runs: u32| -> Vec<u32> {
            std::thread::scope(|s| {
                s.spawn(|| {
                    let mut set = nix::sched::CpuSet::new();
                    set.set(cpu).unwrap();
                    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).unwrap();
                    (0..runs)
                        .map(|_| {
                            flow_in(&g, &super::super::test_run_xdp(&g.skel.progs.pktgen, &template).unwrap().packet)
                        })
                        .collect()
                })
                .join()
                .unwrap()
            })
        };
        // Unsplit: a CPU sends every flow, in the stride's order.
        let all = on_cpu(0, flows);
        assert_eq!(all, (0..flows).map(|k| k * 3 % flows).collect::<Vec<_>>());
        g.set_split(&[1, 0]).unwrap();
        let (a, b) = (on_cpu(1, flows), on_cpu(0, flows));
        let (mut sa, mut sb) = (a.clone(), b.clone());
        sa.sort_unstable();
        sa.dedup();
        sb.sort_unstable();
        sb.dedup();
        assert_eq!((sa.len(), sb.len()), (5, 5), "each CPU sends its half, twice over: {a:?} {b:?}");
        assert!(sa.iter().all(|f| !sb.contains(f)), "no flow from both CPUs: {a:?} {b:?}");
        assert!(g.set_split(&[0, 1, 2]).is_err(), "10 flows do not split in 3");
        assert!(g.set_split(&[1, 1]).is_err(), "a CPU twice");
        assert!(g.set_split(&[0, usize::MAX]).is_err(), "no such CPU");
        g.set_split(&[]).unwrap();
        let mut again = on_cpu(1, flows);
        again.sort_unstable();
        assert_eq!(again, (0..flows).collect::<Vec<_>>(), "split undone: every flow");
    }

    #[test]
    fn a_chained_program_gets_every_generated_frame_instead_of_the_device() {
        if !super::super::tests::may_load_bpf("a_chained_program_gets_every_generated_frame_instead_of_the_device") {
            return;
        }
        let mut template = vec![0u8; 64];
        template[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        template[14] = 0x45;
        let mut header = [0u8; HEADER_LEN];
        header.copy_from_slice(&template[..HEADER_LEN]);
        let g =
            PktGen::load(PktGenOptions { flows: 4, with_hints: true, src_base: Ipv4Addr::new(10, 9, 0, 0), header })
                .unwrap();
        g.set_hints(0, &[7, 7, 7, 7]).unwrap();
        let tx = super::super::XdpTx::load().unwrap();
        // The loopback device cannot transmit XDP frames: what reaches it is dropped.
        let lo = nix::net::if_::if_nametoindex("lo").unwrap();
        {
            let chain = g.chain(tx.program_fd()).unwrap();
            let ns = chain.send_timed(lo, &template, 1000).unwrap();
            assert!(ns > 0, "the kernel timed the runs");
            assert_eq!(tx.stats().unwrap(), (1000, 0), "every frame went on to the chained program");
            // Another program replaces the first; frames with metadata still make room.
            let room = g.chain(tx.room_program_fd()).unwrap();
            room.send_timed(lo, &template, 500).unwrap();
            assert_eq!(tx.stats().unwrap(), (1500, 0), "xdp_tx_room made room for an outer header and sent");
        }
        // Unchained: the frames go to the device again, and the program sees none.
        g.send(lo, &template, 100).unwrap();
        assert_eq!(tx.stats().unwrap(), (1500, 0));
    }

    #[test]
    fn scatter_stride_is_a_permutation() {
        for flows in [1u32, 2, 3, 100, 10_000, 65_536, 1_000_000] {
            let s = PktGen::scatter_stride(flows);
            assert_eq!(gcd(s, flows), 1, "{flows}");
            if flows <= 100_000 {
                let mut seen = vec![false; flows as usize];
                for k in 0..flows {
                    let f = (u64::from(k) * u64::from(s) % u64::from(flows)) as usize;
                    assert!(!seen[f], "flow {f} twice for {flows} flows");
                    seen[f] = true;
                }
            }
        }
    }
}

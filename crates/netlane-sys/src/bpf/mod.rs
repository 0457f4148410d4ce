//! netlane's BPF programs (C under `bpf/`), compiled by this crate's build script, with
//! their libbpf-rs skeletons and a safe face for loading, attaching and test-running them.
//!
//! - [`XdpTx`]: the trivial XDP_TX program, the lab's ceiling;
//! - [`Balancer`]: the load balancer (`bpf/lb/balancer.bpf.c`, plain or device-bound);
//! - [`Decap`]: the reals' decapsulation program;
//! - [`FlowTagger`]: the NIC flow classifier emulated with a TCX program;
//! - [`PktGen`]: the lab's packet generator (live-frames `BPF_PROG_RUN`) and sink;
//! - [`XskRedirect`]: the datagram service's AF_XDP steering program;
//! - [`RingSelect`]: the packet fanout program that picks the adaptive path's ring;
//! - [`ReuseportNapi`]: the SO_REUSEPORT selector that puts a connection on the lane
//!   owning its NAPI id;
//! - [`AppSockPolicy`]/[`AppClassifier`]: per-application socket priority and mark
//!   (cgroup), and the egress classifier that maps a mark to an htb class;
//! - [`QueueSteer`]: ingress steering of a destination's flows into a queue group, the
//!   NIC's classifier emulated on the wire side of a veth;
//! - [`RxQueueRecord`]: a veth's receive queue recorded on each packet as a NIC driver
//!   records it, for XPS by receive queue;
//! - [`XdpLink`]/[`TcxLink`]: attachments that detach when dropped.
//!
//! The skeleton modules are generated code (libbpf-cargo): their `unsafe` is libbpf-rs's
//! own pattern for borrowing the object's maps and programs and is not annotated here.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::AsRawFd;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, ProgramInput, ProgramOutput};

/// Includes the skeleton libbpf-cargo generated for `bpf/lb/<name>.bpf.c`.
macro_rules! skeleton {
    ($module:ident, $dir:literal, $file:literal) => {
        #[doc = concat!("Generated skeleton of `bpf/", $dir, "/", $file, ".bpf.c`.")]
        #[allow(clippy::all, clippy::undocumented_unsafe_blocks, clippy::multiple_unsafe_ops_per_block, missing_docs)]
        #[allow(missing_debug_implementations, unsafe_op_in_unsafe_fn, rust_2018_idioms)]
        pub mod $module {
            include!(concat!(env!("OUT_DIR"), "/", $file, ".skel.rs"));
        }
    };
}

skeleton!(xdp_tx_skel, "lb", "xdp_tx");
skeleton!(balancer_skel, "lb", "balancer");
skeleton!(balancer_bound_skel, "lb", "balancer_bound");
skeleton!(decap_skel, "lb", "decap");
skeleton!(flow_tagger_skel, "lb", "flow_tagger");
skeleton!(pktgen_skel, "lab", "pktgen");
skeleton!(xsk_redirect_skel, "rr", "xsk_redirect");
skeleton!(ring_select_skel, "rr", "ring_select");
skeleton!(reuseport_napi_skel, "lanes", "reuseport_napi");
skeleton!(app_sock_skel, "lanes", "app_sock");
skeleton!(app_class_skel, "lanes", "app_class");
skeleton!(queue_steer_skel, "lanes", "queue_steer");
skeleton!(rxq_record_skel, "lanes", "rxq_record");

mod apps;
mod balancer;
mod lab;
mod link;
mod reuseport;
mod ring_select;
mod rxq;
mod steer;
mod tagger;
mod xsk;

pub use apps::{APP_CLASS_MAX, AppClassifier, AppSockPolicy, CgroupLink};
pub use balancer::{
    Balancer, BalancerOptions, BalancerSizes, Counter, DataPlaneConfig, FlowEvent, FlowEvents, FlowKey, GlobalStat,
    HintMode, RealWrite, TAG_VALUES, TagKey,
};
pub use lab::{HEADER_LEN as PKTGEN_HEADER_LEN, LiveSender, PktGen, PktGenOptions};
pub use link::{TcxLink, XdpLink, XdpMode, enable_run_time_stats, program_run_stats};
pub use reuseport::{REUSEPORT_MAX_NAPI_IDS, ReuseportNapi};
pub use ring_select::RingSelect;
pub use rxq::RxQueueRecord;
pub use steer::{QueueSteer, STEER_MAX_RULES, SteerProto};
pub use tagger::FlowTagger;
pub use xsk::{MAX_QUEUES as XSK_MAX_QUEUES, XskDst, XskRedirect};

/// Storage for libbpf's object that lives as long as the skeleton borrowing it: a
/// 'static home, one small allocation per load, never freed.
pub(crate) fn object_storage() -> &'static mut MaybeUninit<libbpf_rs::OpenObject> {
    route_libbpf_messages();
    Box::leak(Box::new(MaybeUninit::uninit()))
}

/// Sends libbpf's own messages to `tracing` (target `libbpf`: its warnings and the
/// verifier's log at debug, its debug output at trace) instead of stderr: a failure
/// comes back as an error that says what was being done, and `RUST_LOG=libbpf=debug`
/// shows libbpf's side of it.
fn route_libbpf_messages() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        fn print(level: libbpf_rs::PrintLevel, msg: String) {
            let msg = msg.trim_end();
            match level {
                libbpf_rs::PrintLevel::Debug => tracing::trace!(target: "libbpf", "{msg}"),
                _ => tracing::debug!(target: "libbpf", "{msg}"),
            }
        }
        libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Debug, print)));
    });
}

/// Entries `0..entries` of a per-CPU array, read with `BPF_MAP_LOOKUP_BATCH` (a few
/// system calls for a million entries, where one lookup per entry takes seconds): for
/// each entry, every possible CPU's value, each padded to 8 bytes as the kernel lays
/// them out. libbpf-rs's batch lookup refuses per-CPU maps, hence the raw call.
pub(crate) fn percpu_array_values(map: &dyn MapCore, entries: u32) -> io::Result<Vec<u8>> {
    const BATCH: u32 = 4096;
    if map.key_size() != 4 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "a per-CPU array has 4-byte keys"));
    }
    let cpus = libbpf_rs::num_possible_cpus().map_err(to_io)?;
    let stride = (map.value_size() as usize).next_multiple_of(8) * cpus;
    let entries = entries.min(map.max_entries());
    let mut out = vec![0u8; entries as usize * stride];
    let mut keys = vec![0u32; BATCH as usize];
    let mut done = 0u32;
    let mut token = 0u32;
    while done < entries {
        let want = BATCH.min(entries - done);
        let mut count = want;
        let opts = libbpf_sys::bpf_map_batch_opts {
            sz: std::mem::size_of::<libbpf_sys::bpf_map_batch_opts>() as _,
            ..Default::default()
        };
        let values = &mut out[done as usize * stride..(done + want) as usize * stride];
        let in_batch: *mut std::ffi::c_void = if done == 0 { std::ptr::null_mut() } else { (&raw mut token).cast() };
        let mut next = 0u32;
        // SAFETY: `keys` holds `want` 4-byte keys and `values` `want` entries of
        // `stride` bytes (the kernel writes `value_size` rounded up to 8 per possible
        // CPU); the batch tokens are a 4-byte key each (array maps); `opts` is
        // initialised with its size. The kernel writes at most `count` entries.
        let rc = unsafe {
            libbpf_sys::bpf_map_lookup_batch(
                map.as_fd().as_raw_fd(),
                in_batch,
                (&raw mut next).cast(),
                keys.as_mut_ptr().cast(),
                values.as_mut_ptr().cast(),
                &mut count,
                &opts,
            )
        };
        // ENOENT: the map's end was reached; `count` entries were still read.
        let end = rc == -libc::ENOENT;
        if rc < 0 && !end {
            return Err(io::Error::from_raw_os_error(-rc));
        }
        done += count.min(want);
        token = next;
        if end || count == 0 {
            break;
        }
    }
    out.truncate(done as usize * stride);
    Ok(out)
}

/// Entry `index` of a per-CPU array of u64 counters, summed over CPUs.
pub(crate) fn percpu_sum(map: &dyn MapCore, index: u32) -> io::Result<u64> {
    let per_cpu = map.lookup_percpu(&index.to_ne_bytes(), libbpf_rs::MapFlags::ANY).map_err(to_io)?;
    Ok(per_cpu
        .unwrap_or_default()
        .iter()
        .filter_map(|v| v.get(..8))
        .map(|b| u64::from_ne_bytes(b.try_into().unwrap_or([0; 8])))
        .sum())
}

pub(crate) fn to_io(e: libbpf_rs::Error) -> io::Error {
    use libbpf_rs::ErrorKind as K;
    let kind = match e.kind() {
        K::NotFound => io::ErrorKind::NotFound,
        K::PermissionDenied => io::ErrorKind::PermissionDenied,
        K::AlreadyExists => io::ErrorKind::AlreadyExists,
        K::WouldBlock => io::ErrorKind::WouldBlock,
        K::InvalidInput => io::ErrorKind::InvalidInput,
        K::InvalidData => io::ErrorKind::InvalidData,
        K::TimedOut => io::ErrorKind::TimedOut,
        K::Interrupted => io::ErrorKind::Interrupted,
        K::Unsupported => io::ErrorKind::Unsupported,
        K::OutOfMemory => io::ErrorKind::OutOfMemory,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, e.to_string())
}

/// The result of one `BPF_PROG_RUN`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestRun {
    /// The program's return value (the XDP verdict).
    pub verdict: u32,
    /// The packet as the program left it.
    pub packet: Vec<u8>,
}

/// Runs an XDP program once on `packet` with `BPF_PROG_RUN` (the packet is copied in
/// and out; headroom the program adds is zero-filled by the kernel).
pub fn test_run_xdp(prog: &libbpf_rs::ProgramMut<'_>, packet: &[u8]) -> io::Result<TestRun> {
    test_run_xdp_with_meta(prog, &[], packet)
}

/// Like [`test_run_xdp`], with `meta` in the XDP metadata area in front of the packet
/// (what `data_meta` points at; at most 32 bytes, a multiple of 4).
pub fn test_run_xdp_with_meta(prog: &libbpf_rs::ProgramMut<'_>, meta: &[u8], packet: &[u8]) -> io::Result<TestRun> {
    if meta.len() > 32 || !meta.len().is_multiple_of(4) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "XDP metadata must be 0..=32 bytes, a multiple of 4"));
    }
    let input_len = meta.len() + packet.len();
    let mut data_in = Vec::with_capacity(input_len);
    data_in.extend_from_slice(meta);
    data_in.extend_from_slice(packet);
    // struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index,
    // egress_ifindex (u32 each). `data` = the metadata length.
    let mut ctx_in = [0u8; 24];
    ctx_in[0..4].copy_from_slice(&(meta.len() as u32).to_ne_bytes());
    ctx_in[4..8].copy_from_slice(&(input_len as u32).to_ne_bytes());
    let mut ctx_out = [0u8; 24];
    let mut out = vec![0u8; input_len + 256];
    let input = ProgramInput {
        data_in: Some(&data_in),
        data_out: Some(&mut out),
        context_in: Some(&mut ctx_in),
        context_out: Some(&mut ctx_out),
        ..Default::default()
    };
    let ProgramOutput { return_value, data, .. } = prog.test_run(input).map_err(to_io)?;
    // `data` is the output buffer cut to the length the kernel reported: metadata,
    // then the packet, which starts at the context's `data` offset.
    let data = data.map(|d| d.to_vec()).unwrap_or_default();
    let start = u32::from_ne_bytes([ctx_out[0], ctx_out[1], ctx_out[2], ctx_out[3]]) as usize;
    let packet = data.get(start..).map(<[u8]>::to_vec).unwrap_or_default();
    Ok(TestRun { verdict: return_value, packet })
}

/// The `xdp_tx` ceiling program, loaded.
pub struct XdpTx {
    skel: xdp_tx_skel::XdpTxSkel<'static>,
}

impl std::fmt::Debug for XdpTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpTx").finish_non_exhaustive()
    }
}

impl XdpTx {
    /// Opens and loads the program (needs CAP_BPF or root).
    pub fn load() -> io::Result<XdpTx> {
        let open = xdp_tx_skel::XdpTxSkelBuilder::default().open(object_storage()).map_err(to_io)?;
        let skel = open.load().map_err(to_io)?;
        Ok(XdpTx { skel })
    }

    /// The XDP program.
    pub fn program(&self) -> &libbpf_rs::ProgramMut<'static> {
        &self.skel.progs.xdp_tx
    }

    /// The program's fd (to attach it).
    pub fn program_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.skel.progs.xdp_tx)
    }

    /// `xdp_tx_room`: the same after making room for an outer IPv4 header (what an
    /// encapsulating balancer does at least); it counts in the same counters.
    pub fn room_program_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.skel.progs.xdp_tx_room)
    }

    /// Frames bounced and dropped so far, summed over CPUs.
    pub fn stats(&self) -> io::Result<(u64, u64)> {
        let map = &self.skel.maps.tx_stats;
        Ok((percpu_sum(map, 0)?, percpu_sum(map, 1)?))
    }
}

/// The reals' decapsulation program (`bpf/lb/decap.bpf.c`), loaded.
pub struct Decap {
    skel: decap_skel::DecapSkel<'static>,
}

impl std::fmt::Debug for Decap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decap").finish_non_exhaustive()
    }
}

impl Decap {
    /// Opens and loads the program.
    pub fn load() -> io::Result<Decap> {
        let open = decap_skel::DecapSkelBuilder::default().open(object_storage()).map_err(to_io)?;
        Ok(Decap { skel: open.load().map_err(to_io)? })
    }

    /// The XDP program.
    pub fn program(&self) -> &libbpf_rs::ProgramMut<'static> {
        &self.skel.progs.decap
    }

    /// The program's fd (to attach it).
    pub fn program_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.skel.progs.decap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn may_load_bpf(test: &str) -> bool {
        // SAFETY: geteuid(2) has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            return true;
        }
        if std::env::var("NETLANE_REQUIRE_PRIVILEGED").as_deref() == Ok("1") {
            panic!("{test}: needs root to load BPF, and NETLANE_REQUIRE_PRIVILEGED=1 forbids skipping");
        }
        eprintln!("SKIPPED {test}: needs root to load BPF");
        false
    }

    #[test]
    fn xdp_tx_swaps_macs_and_drops_runts() {
        if !may_load_bpf("xdp_tx_swaps_macs_and_drops_runts") {
            return;
        }
        let p = XdpTx::load().unwrap();
        let mut frame = vec![0u8; 64];
        frame[..6].copy_from_slice(&[2, 0, 0, 0, 0, 0xbb]);
        frame[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 0xaa]);
        frame[12..14].copy_from_slice(&[0x08, 0x00]);
        frame[20] = 0x5a;
        let r = test_run_xdp(p.program(), &frame).unwrap();
        assert_eq!(r.verdict, 3, "XDP_TX");
        assert_eq!(&r.packet[..12], &[2, 0, 0, 0, 0, 0xaa, 2, 0, 0, 0, 0, 0xbb]);
        assert_eq!(&r.packet[12..], &frame[12..], "the rest is untouched");
        // BPF_PROG_RUN refuses frames shorter than an Ethernet header (EINVAL), so the
        // runt branch is only reachable on a live interface; the counters show TX.
        assert_eq!(p.stats().unwrap(), (1, 0));
    }
}

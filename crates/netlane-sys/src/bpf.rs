//! netlane's BPF programs (C under `bpf/`), compiled by this crate's build script, with
//! their libbpf-rs skeletons and a safe face for loading and test-running them.
//!
//! The skeleton modules are generated code (libbpf-cargo): their `unsafe` is libbpf-rs's
//! own pattern for borrowing the object's maps and programs and is not annotated here.

use std::io;
use std::mem::MaybeUninit;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{ProgramInput, ProgramOutput};

/// Generated skeleton of `bpf/lb/xdp_tx.bpf.c`.
#[allow(clippy::all, clippy::undocumented_unsafe_blocks, clippy::multiple_unsafe_ops_per_block, missing_docs)]
#[allow(missing_debug_implementations, unsafe_op_in_unsafe_fn, rust_2018_idioms)]
pub mod xdp_tx_skel {
    include!(concat!(env!("OUT_DIR"), "/xdp_tx.skel.rs"));
}

fn to_io(e: libbpf_rs::Error) -> io::Error {
    io::Error::other(e.to_string())
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
    let mut out = vec![0u8; packet.len() + 256];
    let input = ProgramInput { data_in: Some(packet), data_out: Some(&mut out), ..Default::default() };
    let ProgramOutput { return_value, data, .. } = prog.test_run(input).map_err(to_io)?;
    // `data` is the output buffer cut to the length the kernel reported.
    let packet = data.map(|d| d.to_vec()).unwrap_or_default();
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
        // The skeleton borrows libbpf's object storage for as long as it lives; giving
        // it a 'static home costs one small allocation per load, never freed.
        let obj = Box::leak(Box::new(MaybeUninit::uninit()));
        let open = xdp_tx_skel::XdpTxSkelBuilder::default().open(obj).map_err(to_io)?;
        let skel = open.load().map_err(to_io)?;
        Ok(XdpTx { skel })
    }

    /// The XDP program.
    pub fn program(&self) -> &libbpf_rs::ProgramMut<'static> {
        &self.skel.progs.xdp_tx
    }

    /// Frames bounced and dropped so far, summed over CPUs.
    pub fn stats(&self) -> io::Result<(u64, u64)> {
        use libbpf_rs::MapCore;
        let mut sums = [0u64; 2];
        for (i, sum) in sums.iter_mut().enumerate() {
            let key = (i as u32).to_ne_bytes();
            if let Some(per_cpu) =
                self.skel.maps.tx_stats.lookup_percpu(&key, libbpf_rs::MapFlags::ANY).map_err(to_io)?
            {
                *sum = per_cpu
                    .iter()
                    .filter_map(|v| v.get(..8))
                    .map(|b| u64::from_ne_bytes(b.try_into().unwrap_or([0; 8])))
                    .sum();
            }
        }
        Ok((sums[0], sums[1]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn may_load_bpf(test: &str) -> bool {
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

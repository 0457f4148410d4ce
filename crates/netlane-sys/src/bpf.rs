//! netlane's BPF programs (C under `bpf/`), compiled by this crate's build script, with
//! their libbpf-rs skeletons and a safe face for loading and test-running them.
//!
//! The skeleton modules are generated code (libbpf-cargo): their `unsafe` is libbpf-rs's
//! own pattern for borrowing the object's maps and programs and is not annotated here.

use std::io;
use std::mem::MaybeUninit;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, ProgramInput, ProgramOutput};

/// Includes the skeleton libbpf-cargo generated for `bpf/lb/<name>.bpf.c`.
macro_rules! skeleton {
    ($module:ident, $file:literal) => {
        #[doc = concat!("Generated skeleton of `bpf/lb/", $file, ".bpf.c`.")]
        #[allow(clippy::all, clippy::undocumented_unsafe_blocks, clippy::multiple_unsafe_ops_per_block, missing_docs)]
        #[allow(missing_debug_implementations, unsafe_op_in_unsafe_fn, rust_2018_idioms)]
        pub mod $module {
            include!(concat!(env!("OUT_DIR"), "/", $file, ".skel.rs"));
        }
    };
}

skeleton!(xdp_tx_skel, "xdp_tx");
skeleton!(balancer_skel, "balancer");
skeleton!(decap_skel, "decap");

/// Storage for libbpf's object that lives as long as the skeleton borrowing it: a
/// 'static home, one small allocation per load, never freed.
fn object_storage() -> &'static mut MaybeUninit<libbpf_rs::OpenObject> {
    Box::leak(Box::new(MaybeUninit::uninit()))
}

/// Entry `index` of a per-CPU array of u64 counters, summed over CPUs.
fn percpu_sum(map: &dyn MapCore, index: u32) -> io::Result<u64> {
    let per_cpu = map.lookup_percpu(&index.to_ne_bytes(), libbpf_rs::MapFlags::ANY).map_err(to_io)?;
    Ok(per_cpu
        .unwrap_or_default()
        .iter()
        .filter_map(|v| v.get(..8))
        .map(|b| u64::from_ne_bytes(b.try_into().unwrap_or([0; 8])))
        .sum())
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
        let open = xdp_tx_skel::XdpTxSkelBuilder::default().open(object_storage()).map_err(to_io)?;
        let skel = open.load().map_err(to_io)?;
        Ok(XdpTx { skel })
    }

    /// The XDP program.
    pub fn program(&self) -> &libbpf_rs::ProgramMut<'static> {
        &self.skel.progs.xdp_tx
    }

    /// Frames bounced and dropped so far, summed over CPUs.
    pub fn stats(&self) -> io::Result<(u64, u64)> {
        let map = &self.skel.maps.tx_stats;
        Ok((percpu_sum(map, 0)?, percpu_sum(map, 1)?))
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
}

/// Generated map types that are plain old data: `repr(C)`, every bit pattern valid,
/// no padding (checked by the size assertions below).
trait Pod: Copy {}
impl Pod for balancer_skel::types::vip_key {}
impl Pod for balancer_skel::types::vip_meta {}
impl Pod for balancer_skel::types::real_def {}
impl Pod for balancer_skel::types::lb_config {}
impl Pod for balancer_skel::types::vip_addr {}
const _: () = assert!(std::mem::size_of::<balancer_skel::types::vip_key>() == 20);
const _: () = assert!(std::mem::size_of::<balancer_skel::types::vip_meta>() == 8);
const _: () = assert!(std::mem::size_of::<balancer_skel::types::real_def>() == 20);
const _: () = assert!(std::mem::size_of::<balancer_skel::types::lb_config>() == 32);
const _: () = assert!(std::mem::size_of::<balancer_skel::types::vip_addr>() == 20);

fn pod_bytes<T: Pod>(v: &T) -> &[u8] {
    // SAFETY: `T: Pod` is a repr(C) struct without padding (sizes asserted above), so all
    // of its size_of::<T>() bytes are initialised; the slice borrows `v`.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}

/// Map sizes of a balancer, chosen from its configuration before loading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BalancerSizes {
    /// VIPs.
    pub max_vips: u32,
    /// Reals (indexes 0..max_reals).
    pub max_reals: u32,
    /// Maglev ring slots per VIP (a prime).
    pub ring_size: u32,
    /// Connection-table entries.
    pub conn_entries: u32,
}

/// Family tags used in keys and reals.
const FAM_V4: u8 = 4;
const FAM_V6: u8 = 6;

/// An address as the data plane stores it: the packet's bytes in host-order words
/// (IPv4 in the first word), and its family.
fn addr_words(a: std::net::IpAddr) -> ([u32; 4], u8) {
    let mut w = [0u32; 4];
    match a {
        std::net::IpAddr::V4(v4) => {
            w[0] = u32::from_ne_bytes(v4.octets());
            (w, FAM_V4)
        }
        std::net::IpAddr::V6(v6) => {
            for (i, c) in v6.octets().chunks_exact(4).enumerate() {
                w[i] = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
            }
            (w, FAM_V6)
        }
    }
}

/// The balancer program (`bpf/lb/balancer.bpf.c`), loaded, with its maps.
pub struct Balancer {
    skel: balancer_skel::BalancerSkel<'static>,
    sizes: BalancerSizes,
}

impl std::fmt::Debug for Balancer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Balancer").field("sizes", &self.sizes).finish_non_exhaustive()
    }
}

impl Balancer {
    /// Opens the object, sizes its maps, sets the ring size and loads it.
    pub fn load(sizes: BalancerSizes) -> io::Result<Balancer> {
        use libbpf_rs::skel::OpenSkel as _;
        let ring_total = sizes
            .max_vips
            .checked_mul(sizes.ring_size)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "max_vips x ring_size overflows"))?;
        let mut open = balancer_skel::BalancerSkelBuilder::default().open(object_storage()).map_err(to_io)?;
        let m = &mut open.maps;
        m.vip_map.set_max_entries(sizes.max_vips).map_err(to_io)?;
        m.vip_addrs.set_max_entries(sizes.max_vips).map_err(to_io)?;
        m.vip_stats.set_max_entries(sizes.max_vips).map_err(to_io)?;
        m.ring_map.set_max_entries(ring_total).map_err(to_io)?;
        m.reals.set_max_entries(sizes.max_reals).map_err(to_io)?;
        m.real_stats.set_max_entries(sizes.max_reals).map_err(to_io)?;
        m.conn_table.set_max_entries(sizes.conn_entries).map_err(to_io)?;
        match m.rodata_data.as_deref_mut() {
            Some(ro) => ro.ring_size = sizes.ring_size,
            None => return Err(io::Error::other("balancer object has no .rodata")),
        }
        let skel = open.load().map_err(to_io)?;
        let b = Balancer { skel, sizes };
        // Every ring slot starts empty.
        let empty = vec![u32::MAX; sizes.ring_size as usize];
        for v in 0..sizes.max_vips {
            b.set_ring(v, &empty)?;
        }
        Ok(b)
    }

    /// The XDP program.
    pub fn program(&self) -> &libbpf_rs::ProgramMut<'static> {
        &self.skel.progs.balancer
    }

    /// The sizes it was loaded with.
    pub fn sizes(&self) -> BalancerSizes {
        self.sizes
    }

    /// Sets the MAC addresses and outer source addresses encapsulated packets use.
    pub fn set_config(
        &self,
        gw_mac: [u8; 6],
        own_mac: [u8; 6],
        src4: std::net::Ipv4Addr,
        src6: std::net::Ipv6Addr,
    ) -> io::Result<()> {
        let cfg = balancer_skel::types::lb_config {
            gw_mac,
            own_mac,
            src4: addr_words(src4.into()).0[0],
            src6: addr_words(src6.into()).0,
        };
        self.skel.maps.lb_cfg.update(&0u32.to_ne_bytes(), pod_bytes(&cfg), libbpf_rs::MapFlags::ANY).map_err(to_io)
    }

    fn vip_key(addr: std::net::IpAddr, port: u16, proto: u8) -> balancer_skel::types::vip_key {
        let (w, family) = addr_words(addr);
        balancer_skel::types::vip_key { addr: w, port: u16::from_ne_bytes(port.to_be_bytes()), proto, family }
    }

    /// Adds or updates a VIP (port 0 = any port) using ring `index`.
    pub fn set_vip(&self, addr: std::net::IpAddr, port: u16, proto: u8, index: u32) -> io::Result<()> {
        if index >= self.sizes.max_vips {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("VIP index {index} >= {}", self.sizes.max_vips),
            ));
        }
        let key = Self::vip_key(addr, port, proto);
        let meta = balancer_skel::types::vip_meta { index, flags: 0 };
        self.skel.maps.vip_map.update(pod_bytes(&key), pod_bytes(&meta), libbpf_rs::MapFlags::ANY).map_err(to_io)
    }

    /// Marks `addr` as a VIP address (answered to ICMP echo) or not. The control plane
    /// keeps it set while any VIP uses the address.
    pub fn set_vip_address(&self, addr: std::net::IpAddr, present: bool) -> io::Result<()> {
        let (w, family) = addr_words(addr);
        let key = balancer_skel::types::vip_addr { addr: w, family, pad: [0; 3] };
        if present {
            self.skel
                .maps
                .vip_addrs
                .update(pod_bytes(&key), &1u32.to_ne_bytes(), libbpf_rs::MapFlags::ANY)
                .map_err(to_io)
        } else {
            match self.skel.maps.vip_addrs.delete(pod_bytes(&key)) {
                Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(()),
                r => r.map_err(to_io),
            }
        }
    }

    /// Removes a VIP.
    pub fn remove_vip(&self, addr: std::net::IpAddr, port: u16, proto: u8) -> io::Result<()> {
        self.skel.maps.vip_map.delete(pod_bytes(&Self::vip_key(addr, port, proto))).map_err(to_io)
    }

    /// Writes VIP `index`'s ring (`ring_size` real indexes, `u32::MAX` = none) in one
    /// batch update.
    pub fn set_ring(&self, index: u32, ring: &[u32]) -> io::Result<()> {
        if ring.len() != self.sizes.ring_size as usize || index >= self.sizes.max_vips {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "ring of the wrong size or VIP index out of range",
            ));
        }
        let base = index * self.sizes.ring_size;
        let keys: Vec<u8> = (0..self.sizes.ring_size).flat_map(|i| (base + i).to_ne_bytes()).collect();
        let values: Vec<u8> = ring.iter().flat_map(|r| r.to_ne_bytes()).collect();
        self.skel
            .maps
            .ring_map
            .update_batch(&keys, &values, self.sizes.ring_size, libbpf_rs::MapFlags::ANY, libbpf_rs::MapFlags::ANY)
            .map_err(to_io)
    }

    /// Sets real `index`'s address.
    pub fn set_real(&self, index: u32, addr: std::net::IpAddr) -> io::Result<()> {
        let (w, family) = addr_words(addr);
        let real = balancer_skel::types::real_def { addr: w, family, pad: [0; 3] };
        self.skel.maps.reals.update(&index.to_ne_bytes(), pod_bytes(&real), libbpf_rs::MapFlags::ANY).map_err(to_io)
    }

    /// The global counters, summed over CPUs, in `lb_global_stat` order.
    pub fn global_stats(&self) -> io::Result<Vec<u64>> {
        let map = &self.skel.maps.global_stats;
        (0..map.max_entries()).map(|i| percpu_sum(map, i)).collect()
    }
}

//! The packet generator's side: the frame template, pinning a generator thread, the
//! classifiers through which the control plane's hints reach the frames (the
//! generator's hint table, or the TCX classifier on the skb path), and the two ways a
//! contender's frames are sent (`BPF_PROG_RUN` live frames, or a packet socket).

use std::net::IpAddr;
use std::rc::Rc;

use netlane_lb::{Classifier, LbError};
use netlane_sys::bpf::{FlowKey, PktGen};

use super::{GEN_SRC, VIP};

/// A 64-byte TCP ACK to the VIP; the generator rewrites source address and port.
pub(super) fn template(dst_mac: [u8; 6], src_mac: [u8; 6]) -> Vec<u8> {
    let mut f = vec![0u8; 64];
    f[0..6].copy_from_slice(&dst_mac);
    f[6..12].copy_from_slice(&src_mac);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip = &mut f[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&50u16.to_be_bytes());
    ip[8] = 64;
    ip[9] = 6;
    ip[12..16].copy_from_slice(&GEN_SRC.octets());
    ip[16..20].copy_from_slice(&VIP.octets());
    let tcp = &mut f[34..54];
    tcp[2..4].copy_from_slice(&80u16.to_be_bytes());
    tcp[12] = 5 << 4;
    tcp[13] = 0x10; // ACK: an established flow
    f
}

/// Pins the calling thread to `cpu`, and fails if it does not run there: a generator
/// on the wrong CPU feeds another receive queue than the one measured.
pub(super) fn pin_to(cpu: usize) -> Result<(), LbError> {
    netlane::cpus::pin(Some(cpu));
    match netlane::cpus::current() {
        c if c == cpu => Ok(()),
        c => Err(LbError::Invalid(format!("a generator thread pinned to CPU {cpu} runs on CPU {c}"))),
    }
}

/// The generator's hint table as the NIC classifier: a flow's hint is written into the
/// metadata of its frames from now on.
pub(super) struct GenClassifier(pub(super) Rc<PktGen>);

impl GenClassifier {
    /// The generator's flow with this key (it only sends IPv4).
    fn flow(&self, k: &FlowKey) -> Option<u32> {
        match k.src {
            IpAddr::V4(a) => self.0.flow_of(a, k.sport),
            IpAddr::V6(_) => None,
        }
    }
}

impl Classifier for GenClassifier {
    fn install(&mut self, flow: &FlowKey, hint: u32) -> std::io::Result<()> {
        self.flow(flow).map_or(Ok(()), |f| self.0.set_hints(f, &[hint]))
    }

    fn remove(&mut self, flow: &FlowKey) -> std::io::Result<()> {
        self.flow(flow).map_or(Ok(()), |f| self.0.set_hints(f, &[0]))
    }
}

/// Frames for every flow, sent through the generator end's stack by a packet socket
/// (TPACKET_V2 ring, through the qdisc layer, so the TCX classifier sees them): they
/// reach the balancer's end as skbs.
pub(super) struct SkbFeed {
    tx: netlane_sys::packet::PacketTx,
    frames: Vec<Vec<u8>>,
    next: usize,
}

impl SkbFeed {
    /// Opens the socket on `g0` (the calling thread must be in the generator's
    /// namespace) with one frame per flow: source port and address vary by flow, in a
    /// scattered order.
    pub(super) fn open(g0: u32, flows: u32, template: &[u8]) -> std::io::Result<SkbFeed> {
        let tx = netlane_sys::packet::PacketTx::open(g0, 128, 4096)?;
        let stride = PktGen::scatter_stride(flows);
        let mut frames = Vec::with_capacity(flows as usize);
        for k in 0..flows {
            let f = (u64::from(k) * u64::from(stride) % u64::from(flows)) as u32;
            let mut fr = template.to_vec();
            let src = u32::from(GEN_SRC) + f / 50_000;
            fr[26..30].copy_from_slice(&src.to_be_bytes());
            fr[34..36].copy_from_slice(&(10_000 + (f % 50_000) as u16).to_be_bytes());
            fr[24..26].copy_from_slice(&[0, 0]);
            let sum = netlane_rr::proto::frames::checksum(&fr[14..34]);
            fr[24..26].copy_from_slice(&sum.to_be_bytes());
            frames.push(fr);
        }
        Ok(SkbFeed { tx, frames, next: 0 })
    }

    /// Sends `n` frames (the next flows in turn), waiting while the ring is full.
    pub(super) fn send(&mut self, n: usize) -> std::io::Result<()> {
        self.tx.send_in_turn(&self.frames, &mut self.next, n)
    }
}

/// A flow classifier whose program is attached only during its balancer's turns (two
/// taggers on one egress would overwrite each other's tags).
pub(super) struct SkbClassifier(pub(super) Rc<netlane_sys::bpf::FlowTagger>);

impl Classifier for SkbClassifier {
    fn install(&mut self, flow: &FlowKey, hint: u32) -> std::io::Result<()> {
        self.0.set_rule(flow, hint)
    }

    fn remove(&mut self, flow: &FlowKey) -> std::io::Result<()> {
        self.0.remove_rule(flow)
    }
}

/// How a contender's frames are sent.
pub(super) enum Feed {
    /// `BPF_PROG_RUN` live frames (its own generator and frame template).
    Frames(Rc<PktGen>, Vec<u8>),
    /// A packet socket's frames through the stack: skbs at the balancer.
    Skb(SkbFeed),
}

impl Feed {
    pub(super) fn send(&mut self, g0: u32, n: u32) -> std::io::Result<()> {
        match self {
            Feed::Frames(g, frame) => g.send(g0, frame, n),
            Feed::Skb(f) => f.send(n as usize),
        }
    }
}

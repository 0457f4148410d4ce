//! The udp-bulk scenario's plan: the arms every round runs (each mode, each paced rate,
//! each side of the comparison with `udpgso_bench_tx`) and the runs they make.

use std::path::PathBuf;

use netlane::metrics::units::compact_rate;
use netlane::udp::gso::GsoLimits;
use netlane::udp::{Batching, GsoMode, RxBatching};

use super::{Mode, UdpBulkArgs};
use crate::engines::bulk::{BulkRun, Pacing, RxSpec, Transport, TxSource, TxSpec, Verify};
use crate::scenarios::net::{PathKind, RxNapi};
use crate::scenarios::{from_words, selftest};

/// Which side of what an arm is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// A mode of the main table.
    Main(Mode, Option<u64>),
    /// netlane's sender against a counting receiver (compared with the kernel's).
    Ours(bool),
    /// The kernel's udpgso_bench_tx (plain, or with -S).
    Kernel(bool),
    /// Many flows (how many, paced).
    Flows(u32, bool),
}

/// One arm: a labelled run that every round repeats.
#[derive(Debug, Clone)]
pub(super) struct Arm {
    pub(super) label: String,
    pub(super) role: Role,
    pub(super) run: BulkRun,
}

impl UdpBulkArgs {
    /// The defaults, as `netlane bench udp-bulk` has them.
    pub fn defaults() -> UdpBulkArgs {
        from_words(&[]).expect("the defaults parse")
    }

    pub(super) fn segments(&self) -> usize {
        self.segments.unwrap_or_else(|| GsoLimits::for_family(self.net.ipv6).segments_per_send(self.gso_size))
    }

    pub(super) fn tx(&self) -> TxSpec {
        TxSpec {
            datagram_size: self.gso_size,
            segments_per_send: self.segments(),
            duration: self.time,
            cpu: Some(self.net.tx_cpu),
            ..TxSpec::udp()
        }
    }

    pub(super) fn rx(&self) -> RxSpec {
        RxSpec { verify: self.verify, cpu: Some(self.net.rx_cpu()), ..RxSpec::udp() }
    }

    /// Sender and receiver for `mode` (and `rate` for the paced mode).
    pub(super) fn specs(&self, mode: Mode, rate: Option<u64>) -> (TxSpec, RxSpec) {
        let (tx, rx) = (self.tx(), self.rx());
        let gso = TxSpec { gso: GsoMode::Cmsg, ..tx.clone() };
        let tcp_rx = RxSpec { transport: Transport::Tcp, ..rx };
        let tcp = TxSpec { transport: Transport::Tcp, ..tx.clone() };
        let gro_rx = RxSpec { gro: true, batching: RxBatching::Mmsg(8), ..rx };
        let cold = TxSpec { payload_span: Some(self.cold_span), ..gso.clone() };
        match mode {
            // Where the device cuts the packets is the arm's (`Mode::segmentation`).
            Mode::Tcp | Mode::TcpSw | Mode::TcpMss => (tcp, tcp_rx),
            Mode::TcpZc => (TxSpec { zerocopy: true, ..tcp }, tcp_rx),
            Mode::Udp => (TxSpec { segments_per_send: 1, ..tx }, RxSpec { batching: RxBatching::Single, ..rx }),
            Mode::Sendmmsg => (TxSpec { batching: Batching::Mmsg, ..tx }, rx),
            Mode::SendmmsgGro => (TxSpec { batching: Batching::Mmsg, ..tx }, gro_rx),
            Mode::Gso | Mode::GsoSw => (gso, rx),
            Mode::GsoSockopt => (TxSpec { gso: GsoMode::Sockopt, ..tx }, rx),
            Mode::GsoGro => (gso, gro_rx),
            Mode::GsoZc => (TxSpec { zerocopy: true, ..gso }, rx),
            Mode::GsoCold => (cold, rx),
            Mode::GsoZcCold => (TxSpec { zerocopy: true, ..cold }, rx),
            // Paced runs deliver to a GRO receiver: the receiver-side rate then measures
            // the pacer, not a receiver that cannot take 1 GB/s without GRO.
            Mode::Paced => (TxSpec { pacing: rate.map(|rate| Pacing::new(rate, self.quantum)), ..gso }, gro_rx),
            // Its arms are the flow counts' own (`flow_arms`).
            Mode::Flows => (gso, gro_rx),
        }
    }

    pub(super) fn arm(&self, mode: Mode, rate: Option<u64>) -> Arm {
        let (tx, rx) = self.specs(mode, rate);
        let label = match rate {
            Some(r) => format!("paced {}", compact_rate(r)),
            None => mode.name().to_string(),
        };
        Arm {
            label,
            role: Role::Main(mode, rate),
            run: BulkRun { tx: TxSource::Netlane(tx), rx, ipv6: self.net.ipv6, run_id: 0, roles: self.net.roles() },
        }
    }

    pub(super) fn selftest_binary(&self) -> Option<PathBuf> {
        // The kernel's sender is a binary of this machine: not on a testbed's.
        if self.no_selftest || self.on.testbed.is_some() { None } else { selftest::locate(self.selftest.as_deref()) }
    }

    /// The modes asked for that cannot run here ([`UdpBulkArgs::cannot_run`]): they are
    /// left out, and said so.
    pub(super) fn left_out(&self) -> Vec<Mode> {
        self.modes.iter().copied().filter(|m| self.cannot_run(*m).is_some()).collect()
    }

    /// Why mode `m` cannot run where this scenario runs, if it cannot.
    pub(super) fn cannot_run(&self, m: Mode) -> Option<&'static str> {
        let own_veth = self.net.path == PathKind::Veth && self.on.testbed.is_none();
        if m.switches_the_device() && !own_veth {
            return Some(
                "it switches the sender's device offloads, which only the lab's own veth is the lab's to switch",
            );
        }
        let receive_napi =
            self.on.testbed.is_some() || (self.net.path == PathKind::Veth && self.net.rx_napi == RxNapi::Threaded);
        if m == Mode::SendmmsgGro && !receive_napi {
            return Some(
                "GRO coalesces in the receiving device's NAPI, which loopback and a veth with its NAPI off do not have",
            );
        }
        None
    }

    /// Every arm: the modes, then the two sides of the comparison with the kernel's sender.
    pub(super) fn arms(&self) -> Vec<Arm> {
        let mut arms = Vec::new();
        let left_out = self.left_out();
        for mode in self.modes.iter().filter(|m| !left_out.contains(m)) {
            if *mode == Mode::Flows {
                arms.extend(self.flow_arms());
            } else if *mode == Mode::Paced {
                arms.extend(self.rates.iter().map(|r| self.arm(*mode, Some(*r))));
            } else {
                arms.push(self.arm(*mode, None));
            }
        }
        if let Some(bin) = self.selftest_binary() {
            for gso in [false, true] {
                let mode = if gso { Mode::Gso } else { Mode::Udp };
                // Both senders face the identical receiver: it only counts (the kernel's
                // sender does not write netlane's header) and reads into datagram-sized
                // buffers. How fast the receiver drains decides how often a sender
                // blocks, so anything else would skew the CPU.
                let (_, rx) = self.specs(mode, None);
                let counting = RxSpec { verify: Verify::Count, max_datagram: self.gso_size, ..rx };
                let mut ours = self.arm(mode, None);
                ours.label = format!("netlane {}", mode.name());
                ours.role = Role::Ours(gso);
                ours.run.rx = counting;
                arms.push(ours);
                let ext = selftest::sender(
                    &bin,
                    self.net.ipv6,
                    self.time,
                    self.gso_size,
                    self.segments(),
                    gso,
                    self.net.tx_cpu,
                );
                arms.push(Arm {
                    label: format!("udpgso_bench_tx{}", if gso { " -S" } else { "" }),
                    role: Role::Kernel(gso),
                    run: BulkRun {
                        tx: TxSource::External(ext),
                        rx: counting,
                        ipv6: self.net.ipv6,
                        run_id: 0,
                        roles: self.net.roles(),
                    },
                });
            }
        }
        arms
    }
}

//! What the udp-bulk scenario's targets compare, as one list: two arms round by round,
//! each figure taken only from a run that is possible.

use netlane::metrics::units::compact_rate;
use netlane_report::{Check, Value};

use super::plan::{Arm, Role};
use super::{Mode, UdpBulkArgs};
use crate::engines::bulk::BulkResult;
use crate::stats;
use crate::verdict::{Measure, Spec, paired};

/// `f` of a run, or why the run cannot be used (it is impossible).
pub(super) fn usable(r: &BulkResult, f: &dyn Fn(&BulkResult) -> Measure) -> Measure {
    match r.impossible() {
        Some(why) => Err(why),
        None => f(r),
    }
}

/// Median over the usable runs.
pub(super) fn med(rs: &[BulkResult], f: impl Fn(&BulkResult) -> Measure) -> Value {
    stats::med(rs, |r| usable(r, &f))
}

pub(super) fn values(rs: &[BulkResult], f: impl Fn(&BulkResult) -> Measure) -> Vec<f64> {
    stats::values(rs, |r| usable(r, &f))
}

/// The talk's figures for the sender's cost, each mode against another, sender CPU per
/// GB: plain UDP costs about 5x TCP's cycles and GSO cut in software about TCP's with
/// TSO; a device that cuts UDP trains itself (USO) half GSO's; TCP without TSO about
/// 3x, and with no segmentation offload at all no better than UDP; copying a cold
/// payload must cost more than a cached one (by a tenth at least). Each is (id, what,
/// at most (else at least), target, the mode, against).
const SENDER_COSTS: [(&str, &str, bool, f64, Mode, Mode); 8] = [
    (
        "udp-bulk.gso-sw-cpu-vs-udp",
        "GSO sender CPU per GB, trains cut in software, vs one sendmsg per datagram",
        true,
        0.25,
        Mode::GsoSw,
        Mode::Udp,
    ),
    (
        "udp-bulk.gso-sw-cpu-vs-tcp",
        "GSO sender CPU per GB, trains cut in software, vs TCP not cut (TSO)",
        true,
        1.5,
        Mode::GsoSw,
        Mode::Tcp,
    ),
    (
        "udp-bulk.uso-cpu-vs-gso-sw",
        "GSO sender CPU per GB, trains not cut (like USO), vs cut in software",
        true,
        0.5,
        Mode::Gso,
        Mode::GsoSw,
    ),
    (
        "udp-bulk.gso-cpu-vs-udp",
        "GSO sender CPU per GB, trains not cut (like USO), vs one sendmsg per datagram",
        true,
        0.25,
        Mode::Gso,
        Mode::Udp,
    ),
    (
        "udp-bulk.gso-cpu-vs-tcp",
        "GSO sender CPU per GB vs TCP, both not cut (USO, TSO)",
        true,
        1.5,
        Mode::Gso,
        Mode::Tcp,
    ),
    (
        "udp-bulk.tcp-sw-cpu-vs-tcp",
        "TCP sender CPU per GB, cut in software, vs not cut (TSO)",
        false,
        2.0,
        Mode::TcpSw,
        Mode::Tcp,
    ),
    (
        "udp-bulk.tcp-mss-cpu-vs-udp",
        "TCP sender CPU per GB, one segment per packet, vs one sendmsg per UDP datagram",
        false,
        1.0,
        Mode::TcpMss,
        Mode::Udp,
    ),
    (
        "udp-bulk.cold-cpu-vs-warm",
        "GSO sender CPU per GB, payload cold, vs always cached",
        false,
        1.1,
        Mode::GsoCold,
        Mode::Gso,
    ),
];

/// What GRO must save the receive path per GB received: a fifth.
const GRO_RX_CPU_MAX: f64 = 0.8;

impl UdpBulkArgs {
    /// Zerocopy from a cold span against copying it: what zerocopy saves where a copy
    /// costs most. Not shown where the kernel copied the zerocopy sends after all.
    fn zerocopy_cold(&self, zc: Option<&[BulkResult]>, copy: Option<&[BulkResult]>) -> Check {
        let spec = Spec::below(
            "udp-bulk.zc-cold-vs-cold",
            "GSO sender CPU per GB from a cold payload, MSG_ZEROCOPY vs copying",
            1.0,
            "x",
        );
        let (Some(zc), Some(copy)) = (zc, copy) else {
            return spec.skipped("not run (needs the gso-zc-cold and gso-cold modes)");
        };
        let (completed, copied) = zc
            .iter()
            .filter_map(|r| r.tx.zerocopy)
            .fold((0u64, 0u64), |acc, z| (acc.0 + z.completed, acc.1 + z.copied));
        if copied > 0 {
            return spec.not_shown_for(
                "a device that sends from the pinned pages (a NIC)",
                &format!("the kernel copied {copied} of {completed} zerocopy sends (SO_EE_CODE_ZEROCOPY_COPIED)"),
            );
        }
        // Refused (ENOBUFS: the socket's optmem full), the sender copies from then on.
        let fell_back = zc.iter().filter(|r| r.tx.zerocopy_fallbacks > 0).count();
        if fell_back > 0 {
            return spec.invalid(format!(
                "MSG_ZEROCOPY was refused (ENOBUFS) in {fell_back} run(s), which then copied: not a zerocopy sender"
            ));
        }
        spec.evaluate(
            paired(zc, copy, |r| usable(r, &BulkResult::tx_cpu_s_per_gb)),
            "gso-zc-cold / gso-cold sender CPU s/GB sent, per round",
        )
    }

    /// GRO coalescing single datagrams against the same datagrams received one by one:
    /// the busy time of the receiver's CPU per GB, which runs the receiving NAPI too.
    fn gro_coalesced(&self, gro: Option<&[BulkResult]>, plain: Option<&[BulkResult]>) -> Check {
        let spec = Spec::at_most(
            "udp-bulk.gro-coalesced-rx-cpu",
            "Receive CPU per GB (receiver and NAPI), single datagrams coalesced by GRO, vs not",
            GRO_RX_CPU_MAX,
            "x",
        );
        let (Some(gro), Some(plain)) = (gro, plain) else {
            return spec.skipped("not run (needs the sendmmsg-gro and sendmmsg modes)");
        };
        let rx = self.net.rx_cpu();
        match self.net.napi_cpu {
            Some(napi) if napi != rx && self.on.testbed.is_none() => {
                return spec.skipped(format!("the receiving NAPI runs on CPU {napi}, apart from the receiver's {rx}"));
            }
            _ => {}
        }
        spec.evaluate(
            paired(gro, plain, |r| usable(r, &BulkResult::receiving_cpu_s_per_gb)),
            "sendmmsg-gro / sendmmsg busy s of the receiver's CPU per GB received, per round",
        )
    }

    pub(super) fn checks(&self, arms: &[Arm], results: &[Vec<BulkResult>]) -> Vec<Check> {
        let find = |role: Role| arms.iter().position(|a| a.role == role).map(|i| &results[i][..]);
        let mode = |m: Mode| find(Role::Main(m, None));
        let missing = |what: &str| format!("not run (needs the {what} modes)");
        let pair = |spec: Spec,
                    a: Option<&[BulkResult]>,
                    b: Option<&[BulkResult]>,
                    f: &dyn Fn(&BulkResult) -> Measure,
                    how: &str,
                    needs: &str| {
            match (a, b) {
                (Some(a), Some(b)) => spec.evaluate(paired(a, b, |r| usable(r, f)), how),
                _ => spec.skipped(missing(needs)),
            }
        };
        let mut c: Vec<Check> = SENDER_COSTS
            .iter()
            .map(|&(id, name, most, target, a, b)| {
                let spec =
                    if most { Spec::at_most(id, name, target, "x") } else { Spec::at_least(id, name, target, "x") };
                let how = format!("{} / {} sender CPU s/GB sent, per round", a.name(), b.name());
                let needs = format!("{} and {}", a.name(), b.name());
                pair(spec, mode(a), mode(b), &BulkResult::tx_cpu_s_per_gb, &how, &needs)
            })
            .collect();
        c.extend([
            pair(
                Spec::at_least(
                    "udp-bulk.gro-rx-vs-udp",
                    "Receiver rate, GSO trains arriving whole at a GRO socket, vs plain UDP's",
                    4.0,
                    "x",
                ),
                mode(Mode::GsoGro),
                mode(Mode::Udp),
                &BulkResult::rx_rate,
                "gso-gro / udp bytes per second at the receiver, per round",
                "gso-gro and udp",
            ),
            self.gro_coalesced(mode(Mode::SendmmsgGro), mode(Mode::Sendmmsg)),
            self.zerocopy_cold(mode(Mode::GsoZcCold), mode(Mode::GsoCold)),
        ]);
        for (i, a) in arms.iter().enumerate() {
            let Role::Main(Mode::Paced, Some(rate)) = a.role else { continue };
            let r = compact_rate(rate);
            let rs = &results[i];
            c.push(
                Spec::within(
                    &format!("udp-bulk.paced-{r}-rate"),
                    format!("paced {r}: rate at the receiver, % of the target"),
                    98.0,
                    102.0,
                    "%",
                )
                .evaluate(
                    rs.iter()
                        .map(|x| {
                            usable(x, &|x| x.rx_pacing_accuracy().unwrap_or(Err("not paced".into())).map(|a| a * 100.0))
                        })
                        .collect(),
                    "bytes received over the receiver's own span plus one release period, per run",
                ),
            );
            c.push(pair(
                Spec::at_most(
                    &format!("udp-bulk.paced-{r}-cpu"),
                    format!("paced {r}: sender CPU per GB vs unpaced GSO"),
                    1.3,
                    "x",
                ),
                Some(rs),
                mode(Mode::Gso),
                &BulkResult::tx_cpu_s_per_gb,
                "paced / gso sender CPU s/GB sent, per round",
                "gso",
            ));
        }
        for (gso, what) in [(false, "plain"), (true, "GSO")] {
            let spec = Spec::at_most(
                &format!("udp-bulk.{}-sender-vs-kernel", what.to_lowercase()),
                format!("{what} sender CPU per GB vs the kernel's udpgso_bench_tx"),
                1.0,
                "x",
            );
            c.push(match (find(Role::Ours(gso)), find(Role::Kernel(gso))) {
                (Some(a), Some(b)) => spec.evaluate(
                    paired(a, b, |r| usable(r, &BulkResult::tx_cpu_s_per_gb)),
                    "netlane / udpgso_bench_tx sender CPU s/GB, same receiver, per round",
                ),
                _ => spec.skipped("udpgso_bench_tx not run"),
            });
        }
        c
    }
}

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

impl UdpBulkArgs {
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
        let mut c = vec![
            pair(
                Spec::at_most(
                    "udp-bulk.gso-cpu-vs-udp",
                    "GSO sender CPU per GB vs one sendmsg per datagram",
                    0.25,
                    "x",
                ),
                mode(Mode::Gso),
                mode(Mode::Udp),
                &BulkResult::tx_cpu_s_per_gb,
                "gso / udp sender CPU s/GB sent, per round",
                "gso and udp",
            ),
            pair(
                Spec::at_most("udp-bulk.gso-cpu-vs-tcp", "GSO sender CPU per GB vs a TCP stream", 1.5, "x"),
                mode(Mode::Gso),
                mode(Mode::Tcp),
                &BulkResult::tx_cpu_s_per_gb,
                "gso / tcp sender CPU s/GB sent, per round",
                "gso and tcp",
            ),
            pair(
                Spec::at_least("udp-bulk.gro-rx-vs-udp", "GSO+GRO receiver rate vs plain UDP's", 4.0, "x"),
                mode(Mode::GsoGro),
                mode(Mode::Udp),
                &BulkResult::rx_rate,
                "gso-gro / udp bytes per second at the receiver, per round",
                "gso-gro and udp",
            ),
        ];
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

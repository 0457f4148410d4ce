//! `netlane lab`: every scenario, one after another, each on a network of its own,
//! written to a report directory (`index.html`, JSON, CSV, SVG charts).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{ArgAction, Args, ValueEnum};

use crate::progress::Reporter;
use crate::report;
use crate::scenarios::{self, LabProfile, Scenario, ScenarioName};
use netlane_report::{Document, Results, ScenarioReport};

/// Options of `netlane lab`.
#[derive(Debug, Clone, Args)]
pub struct LabArgs {
    /// Short runs, for a smoke test (a few minutes in all).
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set)]
    pub quick: bool,
    /// Report directory [default: lab-report/DATE-TIME (UTC), with lab-report/latest pointing to it].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Run only these scenarios (comma separated).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<ScenarioName>,
    /// The kernel's udpgso_bench_tx [default: target/kselftest/udpgso_bench_tx or $NETLANE_UDPGSO_BENCH_TX].
    #[arg(long)]
    pub selftest: Option<PathBuf>,
    /// Use IPv6 instead of IPv4 where a scenario offers both.
    #[arg(short = '6', long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set)]
    pub ipv6: bool,
    /// Run on the machines this testbed file names (the server on one host, the load
    /// from the client hosts, over SSH): the scenarios that run across hosts (kv so
    /// far); the others are named and left out.
    #[arg(long, value_name = "FILE")]
    pub testbed: Option<PathBuf>,
    /// Where a testbed host has no netlane of this version, copy this one there (over
    /// SSH, into ~/.cache/netlane/) and use that.
    #[arg(long, requires = "testbed")]
    pub deploy: bool,
    /// Change one option of one scenario from the lab's plan, by its long name in `netlane
    /// bench SCENARIO --help` (not the output options; repeatable): `--set
    /// udp-bulk.mtu=9000`, `--set kv.rates=10k,40k`. On a testbed the CPUs and the testbed
    /// stay the file's.
    #[arg(long = "set", value_name = "SCENARIO.OPTION=VALUE", value_parser = parse_setting)]
    pub set: Vec<(ScenarioName, String)>,
}

/// `udp-bulk.mtu=9000` as the scenario and `mtu=9000`.
fn parse_setting(s: &str) -> Result<(ScenarioName, String), String> {
    let (scenario, option) = s.split_once('.').ok_or("expected SCENARIO.OPTION=VALUE, e.g. udp-bulk.mtu=9000")?;
    let name = ScenarioName::from_str(scenario, true).map_err(|_| {
        let all: Vec<String> = ScenarioName::ALL.iter().map(crate::scenarios::value_name).collect();
        format!("no scenario {scenario:?} (there are {})", all.join(", "))
    })?;
    let option = option.trim_start_matches("--");
    match option.split_once('=') {
        Some((key, _)) if !key.is_empty() => Ok((name, option.to_string())),
        _ => Err(format!("expected OPTION=VALUE after {scenario}., e.g. {scenario}.time=2s")),
    }
}

/// A lab that is ready to run: options checked, report directory made.
#[derive(Debug)]
pub struct Lab {
    /// Where the report goes.
    pub dir: PathBuf,
    latest: bool,
    plans: Vec<ScenarioName>,
    /// Scenarios asked for that a testbed cannot run.
    left_out: Vec<ScenarioName>,
    profile: LabProfile,
}

impl LabArgs {
    /// Checks everything before any work starts: privileges, every scenario's plan,
    /// and the report directory (created now, so a bad path fails at once).
    pub fn prepare(&self, stamp: &str) -> Result<Lab> {
        if self.testbed.is_none() && !netlane::topology::have_privileges() {
            bail!(
                "the lab builds its own network (namespaces, veth pairs, qdiscs) and needs root; run it as root \
                 (`sudo make lab`), or run single benchmarks on loopback: netlane bench udp-bulk --path loopback"
            );
        }
        let mut plans: Vec<ScenarioName> = if self.only.is_empty() {
            ScenarioName::ALL.to_vec()
        } else {
            ScenarioName::ALL.into_iter().filter(|s| self.only.contains(s)).collect()
        };
        let mut left_out = Vec::new();
        if let Some(path) = &self.testbed {
            let (_, spec) = crate::testbed::TestbedArgs::for_lab(path, self.deploy, &Default::default())?;
            // udp-bulk and udp-pacing receive on the first client host: at the address the
            // file gives it; udp-pacing's bottleneck and the lanes go on the server's
            // interface.
            let receives = spec.clients.first().is_some_and(|c| c.addr.is_some());
            let iface = spec.server.iface.is_some();
            let runs = |s: &ScenarioName| {
                s.across_hosts()
                    && (*s != ScenarioName::UdpBulk || receives)
                    && (*s != ScenarioName::UdpPacing || (receives && iface))
                    && (*s != ScenarioName::Lanes || iface)
            };
            left_out = plans.iter().copied().filter(|s| !runs(s)).collect();
            plans.retain(runs);
            if plans.is_empty() {
                bail!(
                    "no scenario asked for runs across hosts (udp-bulk, with an `addr` for the first client, \
                     udp-pacing, with that and an `iface` for the server, lanes, with that `iface`, nvme, rr, kv and \
                     soak do)"
                );
            }
        }
        if let Some((name, option)) = self.set.iter().find(|(n, _)| !plans.contains(n)) {
            let n = crate::scenarios::value_name(name);
            if left_out.contains(name) {
                bail!("{n}.{option}: the testbed leaves {n} out");
            }
            bail!("{n}.{option}: this lab does not run {n}");
        }
        let profile = LabProfile {
            set: self.set.clone(),
            quick: self.quick,
            ipv6: self.ipv6,
            selftest: self.selftest.clone(),
            testbed: self.testbed.clone(),
            deploy: self.deploy,
            reached: Default::default(),
        };
        for p in &plans {
            scenarios::lab_plan(*p, &profile)?;
        }
        let dir = self.out.clone().unwrap_or_else(|| Path::new("lab-report").join(stamp));
        std::fs::create_dir_all(&dir).with_context(|| format!("create the report directory {}", dir.display()))?;
        Ok(Lab { dir, latest: self.out.is_none(), plans, left_out, profile })
    }
}

impl Lab {
    /// The scenarios, in order.
    pub fn scenarios(&self) -> Result<Vec<Box<dyn Scenario>>> {
        self.plans.iter().map(|p| scenarios::lab_plan(*p, &self.profile)).collect()
    }

    /// Runs every scenario ([`scenarios::run_all`]), writes the report directory, and returns the document. `each` sees each
    /// scenario's report as it finishes.
    pub fn run(
        &self,
        progress: &Reporter,
        each: impl FnMut(&ScenarioReport) -> Result<()>,
    ) -> Result<Document<Results>> {
        let list = self.scenarios()?;
        let total: usize = list.iter().map(|s| s.runs()).sum();
        progress.println(&format!(
            "netlane lab: {} scenarios, {total} runs{}; report in {}",
            list.len(),
            if self.profile.quick { " (quick)" } else { "" },
            self.dir.display()
        ));
        if !self.left_out.is_empty() {
            let names: Vec<String> = self.left_out.iter().map(crate::scenarios::value_name).collect();
            let bulk = self
                .left_out
                .iter()
                .any(|s| matches!(s, ScenarioName::UdpBulk | ScenarioName::UdpPacing | ScenarioName::Lanes));
            progress.println(&format!(
                "not run on the testbed (they build their network on this machine, for now{}): {}",
                if bulk {
                    "; udp-bulk needs an `addr` for the first client, udp-pacing that and an `iface` for the server, \
                     lanes that `iface`"
                } else {
                    ""
                },
                names.join(", ")
            ));
        }
        let refs: Vec<&dyn Scenario> = list.iter().map(|s| s.as_ref()).collect();
        let mut results = scenarios::run_all(&refs, progress, each)?;
        results.quick = self.profile.quick;
        let doc = netlane_report::document("lab", results);
        report::write_dir(&self.dir, &doc)?;
        if self.latest
            && let Some(name) = self.dir.file_name()
        {
            let latest = self.dir.with_file_name("latest");
            let _ = std::fs::remove_file(&latest);
            let _ = std::os::unix::fs::symlink(name, &latest);
        }
        Ok(doc)
    }
}

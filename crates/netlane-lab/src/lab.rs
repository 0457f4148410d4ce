//! `netlane lab`: every registered scenario, one after another on its own network,
//! with progress bars, written to a report directory (HTML with charts, JSON, CSV).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, ValueEnum};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::report::html::RunInfo;
use crate::report::{ScenarioReport, Status, write_html};
use crate::scenarios::lb_pps::LbPpsArgs;
use crate::scenarios::nvme::NvmeBenchArgs;
use crate::scenarios::udp_bulk::UdpBulkArgs;
use crate::scenarios::udp_pacing::UdpPacingArgs;
use crate::scenarios::{self, Progress};

/// The scenarios the lab knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ScenarioName {
    /// UDP bulk transfer in every mode (GSO, GRO, zerocopy, pacing) vs TCP and the kernel's sender.
    UdpBulk,
    /// Pacing quantum sweep at a bottleneck: loss vs sender CPU.
    UdpPacing,
    /// NVMe/TCP host and target: QD1 latency, QD32 IOPS per core, mixed-workload queue maps.
    Nvme,
    /// XDP load balancer: Mpps per core, hints off/on, 1 to 1M flows, vs an XDP_TX ceiling.
    LbPps,
}

/// Options of `netlane lab`.
#[derive(Debug, Clone, Args)]
pub struct LabArgs {
    /// Short runs, for a smoke test (about a minute in all).
    #[arg(long)]
    pub quick: bool,
    /// Report directory [default: lab-report/<UTC date-time>, with lab-report/latest pointing to it].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Run only these scenarios (comma separated).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<ScenarioName>,
    /// The kernel's udpgso_bench_tx [default: target/kselftest/udpgso_bench_tx or $NETLANE_UDPGSO_BENCH_TX].
    #[arg(long)]
    pub selftest: Option<PathBuf>,
    /// Use IPv6 instead of IPv4.
    #[arg(short = '6', long)]
    pub ipv6: bool,
    /// Exit with status 1 if any target check fails.
    #[arg(long)]
    pub strict: bool,
}

/// Builds a benchmark's options from command-line words, so the lab uses the same
/// defaults and validation as `netlane bench`.
fn args_from<T: Args>(words: &[String]) -> Result<T> {
    #[derive(Parser)]
    struct Wrap<U: Args> {
        #[command(flatten)]
        inner: U,
    }
    let argv = std::iter::once("netlane".to_string()).chain(words.iter().cloned());
    Ok(Wrap::<T>::try_parse_from(argv).map_err(|e| anyhow::anyhow!("{e}"))?.inner)
}

enum Scenario {
    UdpBulk(Box<UdpBulkArgs>),
    UdpPacing(Box<UdpPacingArgs>),
    Nvme(Box<NvmeBenchArgs>),
    LbPps(Box<LbPpsArgs>),
}

impl Scenario {
    fn name(&self) -> &'static str {
        match self {
            Scenario::UdpBulk(_) => "udp-bulk",
            Scenario::UdpPacing(_) => "udp-pacing",
            Scenario::Nvme(_) => "nvme",
            Scenario::LbPps(_) => "lb-pps",
        }
    }

    fn runs(&self) -> usize {
        match self {
            Scenario::UdpBulk(a) => a.run_count(),
            Scenario::UdpPacing(a) => a.run_count(),
            Scenario::Nvme(a) => a.run_count(),
            Scenario::LbPps(a) => a.run_count(),
        }
    }

    fn run(&self, p: &dyn Progress) -> Result<ScenarioReport> {
        match self {
            Scenario::UdpBulk(a) => a.run(p),
            Scenario::UdpPacing(a) => a.run(p),
            Scenario::Nvme(a) => a.run(p),
            Scenario::LbPps(a) => a.run(p),
        }
    }
}

fn scenarios(args: &LabArgs) -> Result<Vec<Scenario>> {
    let mut common: Vec<String> = Vec::new();
    if args.ipv6 {
        common.push("--ipv6".into());
    }
    let secs = if args.quick { "1s" } else { "2s" };
    let all = [ScenarioName::UdpBulk, ScenarioName::UdpPacing, ScenarioName::Nvme, ScenarioName::LbPps];
    let chosen: Vec<ScenarioName> =
        if args.only.is_empty() { all.to_vec() } else { all.into_iter().filter(|s| args.only.contains(s)).collect() };
    let mut out = Vec::new();
    for s in chosen {
        if s == ScenarioName::LbPps {
            let words: Vec<String> = if args.quick {
                vec!["--flows".into(), "1,10000".into(), "--time".into(), "500ms".into()]
            } else {
                vec!["--time".into(), "2s".into()]
            };
            let a: LbPpsArgs = args_from(&words)?;
            a.validate()?;
            out.push(Scenario::LbPps(Box::new(a)));
            continue;
        }
        if s == ScenarioName::Nvme {
            // NVMe/TCP over IPv4 only (the target listens on the veth's IPv4 address).
            let words: Vec<String> = vec![
                "--time".into(),
                if args.quick { "1s" } else { "4s" }.into(),
                "--repeat".into(),
                if args.quick { "1" } else { "2" }.into(),
            ];
            let a: NvmeBenchArgs = args_from(&words)?;
            a.validate()?;
            out.push(Scenario::Nvme(Box::new(a)));
            continue;
        }
        let mut words = common.clone();
        words.extend(["--duration".into(), secs.into()]);
        match s {
            ScenarioName::UdpBulk => {
                words.extend(["--repeat".into(), if args.quick { "2" } else { "6" }.into()]);
                if let Some(p) = &args.selftest {
                    words.extend(["--selftest".into(), p.display().to_string()]);
                }
                let a: UdpBulkArgs = args_from(&words)?;
                a.validate()?;
                out.push(Scenario::UdpBulk(Box::new(a)));
            }
            ScenarioName::UdpPacing => {
                let a: UdpPacingArgs = args_from(&words)?;
                a.validate()?;
                out.push(Scenario::UdpPacing(Box::new(a)));
            }
            ScenarioName::Nvme | ScenarioName::LbPps => {}
        }
    }
    Ok(out)
}

/// Progress bars: one for the whole lab, the current run as its message.
struct BarProgress {
    bar: ProgressBar,
    multi: MultiProgress,
    scenario: &'static str,
    plain: bool,
}

impl Progress for BarProgress {
    fn plan(&self, _total: usize) {}

    fn start(&self, label: &str) {
        self.bar.set_message(format!("{}: {label}", self.scenario));
    }

    fn finish(&self, label: &str, summary: &str) {
        self.bar.inc(1);
        let line = format!("  {} {label}: {summary}", self.scenario);
        if self.plain {
            eprintln!("{line}");
        } else {
            let _ = self.multi.println(line);
        }
    }
}

/// UTC date-time from the Unix clock, as `YYYYMMDD-HHMMSS` and `YYYY-MM-DD HH:MM:SS`.
fn utc_now() -> (String, String) {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mo <= 2);
    (format!("{y:04}{mo:02}{d:02}-{h:02}{m:02}{s:02}"), format!("{y:04}-{mo:02}-{d:02} {h:02}:{m:02}:{s:02}"))
}

fn report_dir(args: &LabArgs, stamp: &str) -> Result<PathBuf> {
    let dir = match &args.out {
        Some(d) => d.clone(),
        None => Path::new("lab-report").join(stamp),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("create report directory {}", dir.display()))?;
    if args.out.is_none() {
        let latest = Path::new("lab-report").join("latest");
        let _ = std::fs::remove_file(&latest);
        let _ = std::os::unix::fs::symlink(stamp, &latest);
    }
    Ok(dir)
}

/// Runs the lab.
pub fn run(args: &LabArgs) -> Result<()> {
    if !netlane::topology::have_privileges() {
        bail!(
            "the lab builds its own network (namespaces, veth pairs, qdiscs) and needs root; run it as root \
             (`sudo make lab`), or run single benchmarks on loopback: netlane bench udp-bulk --path loopback"
        );
    }
    match netlane::topology::registry::clean_stale() {
        Ok(removed) if !removed.is_empty() => eprintln!("removed {} namespaces left by earlier runs", removed.len()),
        Ok(_) => {}
        Err(e) => eprintln!("warning: could not look for stale namespaces: {e}"),
    }
    let list = scenarios(args)?;
    let (stamp, started) = utc_now();
    let dir = report_dir(args, &stamp)?;
    let total: usize = list.iter().map(Scenario::runs).sum();
    let plain = !std::io::stderr().is_terminal();
    let multi = MultiProgress::with_draw_target(if plain {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    });
    let bar = multi.add(ProgressBar::new(total as u64));
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} runs  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    eprintln!(
        "netlane lab: {} scenarios, {total} runs{}; report in {}",
        list.len(),
        if args.quick { " (quick)" } else { "" },
        dir.display()
    );
    let t0 = Instant::now();
    let mut reports = Vec::new();
    for s in &list {
        let progress = BarProgress { bar: bar.clone(), multi: multi.clone(), scenario: s.name(), plain };
        let report = s.run(&progress).with_context(|| format!("scenario {}", s.name()))?;
        report.write_files(&dir)?;
        multi.suspend(|| {
            println!();
            report.print();
        });
        reports.push(report);
    }
    bar.finish_and_clear();
    let info = RunInfo {
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).unwrap_or_default(),
        cpus: scenarios::cpus(),
        started,
        seconds: t0.elapsed().as_secs_f64(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
    };
    write_html(&dir, &info, &reports)?;
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_string_pretty(&serde_json::json!({ "run": info, "scenarios": reports }))?,
    )?;
    let checks: Vec<_> = reports.iter().flat_map(|r| r.checks.iter()).collect();
    let failed = checks.iter().filter(|c| c.status == Status::Fail).count();
    let passed = checks.iter().filter(|c| c.status == Status::Pass).count();
    println!();
    println!(
        "lab finished in {:.0} s: {passed} targets met, {failed} missed, {} not measured",
        info.seconds,
        checks.len() - passed - failed
    );
    println!("report: {}", dir.join("index.html").display());
    if args.strict && failed > 0 {
        bail!("{failed} target checks failed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_scenarios_validate() {
        let args = LabArgs { quick: true, out: None, only: vec![], selftest: None, ipv6: false, strict: false };
        let s = scenarios(&args).unwrap();
        assert_eq!(s.iter().map(Scenario::name).collect::<Vec<_>>(), vec!["udp-bulk", "udp-pacing", "nvme", "lb-pps"]);
        let only = LabArgs { only: vec![ScenarioName::UdpPacing], ..args };
        assert_eq!(scenarios(&only).unwrap().len(), 1);
    }

    #[test]
    fn utc_dates() {
        let (stamp, human) = utc_now();
        assert_eq!(stamp.len(), 15);
        assert!(human.starts_with("20"), "{human}");
    }
}

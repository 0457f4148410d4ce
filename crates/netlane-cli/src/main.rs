//! `netlane`: servers, load generators, benchmarks and the lab.

#![forbid(unsafe_code)]

mod lb;
mod nvme;

use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use netlane_lab::scenarios::{self as bench, udp_bulk::UdpBulkArgs, udp_pacing::UdpPacingArgs};
use netlane_lab::{lab, report};

/// netlane: the short path from the wire to the application thread, measured.
#[derive(Debug, Parser)]
#[command(name = "netlane", version, about, long_about = None, propagate_version = true)]
struct Cli {
    /// More logging (-v: info, -vv: debug). RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run one benchmark and print its results.
    Bench {
        #[command(subcommand)]
        bench: BenchCmd,
    },
    /// Build the lab network, run every scenario, and write a report.
    Lab(lab::LabArgs),
    /// The XDP L4 load balancer: run it on an interface, or check a configuration.
    Lb {
        #[command(subcommand)]
        cmd: lb::LbCmd,
    },
    /// NVMe/TCP in user space: the target server and the perf load generator.
    Nvme {
        #[command(subcommand)]
        cmd: nvme::NvmeCmd,
    },
    /// Show which kernel fast paths work on this machine, and why not.
    Probe {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// The lab's network namespaces.
    Topo {
        #[command(subcommand)]
        cmd: TopoCmd,
    },
    /// Internal: run one bulk sender job read as JSON from stdin, print its report as
    /// JSON (how benchmarks run the sender in a process of its own).
    #[command(name = "__bulk-tx", hide = true)]
    BulkTx,
}

#[derive(Debug, Subcommand)]
enum BenchCmd {
    /// UDP bulk transfer: TCP, plain UDP, sendmmsg, GSO, GSO+GRO, zerocopy, paced.
    UdpBulk(Box<UdpBulkArgs>),
    /// Pacing release quantum vs loss and CPU at a bottleneck.
    UdpPacing(Box<UdpPacingArgs>),
    /// NVMe/TCP: QD1 latency, QD32 IOPS per core, mixed workload queue maps.
    Nvme(Box<bench::nvme::NvmeBenchArgs>),
    /// XDP load balancer packets per second per core: hints off/on, 1 to 1M flows, vs XDP_TX.
    LbPps(Box<bench::lb_pps::LbPpsArgs>),
}

#[derive(Debug, Subcommand)]
enum TopoCmd {
    /// Remove namespaces left behind by netlane processes that no longer run.
    Clean,
    /// List the netlane namespaces that exist.
    List,
}

fn write_outputs(
    report: &report::ScenarioReport,
    json: Option<&std::path::Path>,
    csv: Option<&std::path::Path>,
) -> Result<()> {
    if let Some(path) = json {
        std::fs::write(path, serde_json::to_string_pretty(report)?)
            .with_context(|| format!("write {}", path.display()))?;
    }
    if let Some(path) = csv
        && let Some(t) = report.tables.first()
    {
        std::fs::write(path, t.to_csv()).with_context(|| format!("write {}", path.display()))?;
    }
    Ok(())
}

fn probe(json: bool) -> Result<()> {
    let (features, qdiscs) = netlane::probe::probe_all();
    if json {
        let q: Vec<_> = qdiscs.iter().map(|(k, s)| serde_json::json!({ "qdisc": k, "support": s })).collect();
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "features": features, "qdiscs": q }))?);
        return Ok(());
    }
    let word = |s: &netlane::probe::Support| match s {
        netlane::probe::Support::Supported(_) => "yes",
        netlane::probe::Support::Unsupported(_) => "no",
        netlane::probe::Support::Unknown(_) => "?",
    };
    println!("feature             works  detail");
    for f in &features {
        println!("{:<19} {:<6} {}", f.name, word(&f.support), f.support.detail());
    }
    println!();
    println!("qdisc               works  detail");
    for (k, s) in &qdiscs {
        println!("{:<19} {:<6} {}", k, word(s), s.detail());
    }
    Ok(())
}

fn topo(cmd: &TopoCmd) -> Result<()> {
    match cmd {
        TopoCmd::Clean => {
            let removed = netlane::topology::registry::clean_stale().context("removing stale namespaces")?;
            if removed.is_empty() {
                println!("no stale netlane namespaces");
            }
            for n in removed {
                println!("removed {n}");
            }
        }
        TopoCmd::List => {
            let dir = std::fs::read_dir(netlane::topology::NETNS_RUN_DIR);
            let mut names: Vec<String> = dir
                .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
                .unwrap_or_default();
            names.retain(|n| n.starts_with(netlane::topology::NAME_PREFIX));
            names.sort();
            for n in names {
                let alive = netlane::topology::registry::owner_pid(&n)
                    .is_some_and(|pid| std::path::Path::new("/proc").join(pid.to_string()).exists());
                println!("{n}{}", if alive { "" } else { "  (stale: its process is gone)" });
            }
        }
    }
    Ok(())
}

/// The sender-process side of `netlane_lab::engines::bulk::TxSource::Process`.
fn bulk_tx() -> Result<()> {
    // Die with the benchmark that started us, whatever killed it.
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).context("set parent-death signal")?;
    let mut input = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut input).context("read the sender job")?;
    let job: netlane_lab::engines::bulk::SenderJob = serde_json::from_str(&input).context("decode the sender job")?;
    let report = netlane_lab::engines::bulk::run_sender_job(&job)?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Bench { bench } => match bench {
            BenchCmd::UdpBulk(a) => {
                a.validate()?;
                let r = a.run(&bench::LineProgress)?;
                r.print();
                write_outputs(&r, a.json.as_deref(), a.csv.as_deref())
            }
            BenchCmd::UdpPacing(a) => {
                a.validate()?;
                let r = a.run(&bench::LineProgress)?;
                r.print();
                write_outputs(&r, a.json.as_deref(), a.csv.as_deref())
            }
            BenchCmd::LbPps(a) => {
                a.validate()?;
                let r = a.run(&bench::LineProgress)?;
                r.print();
                Ok(())
            }
            BenchCmd::Nvme(a) => {
                a.validate()?;
                let r = a.run(&bench::LineProgress)?;
                r.print();
                Ok(())
            }
        },
        Cmd::Lab(a) => lab::run(&a),
        Cmd::Lb { cmd } => lb::run(&cmd),
        Cmd::Nvme { cmd } => nvme::run(&cmd),
        Cmd::Probe { json } => probe(json),
        Cmd::Topo { cmd } => topo(&cmd),
        Cmd::BulkTx => bulk_tx(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let level = match cli.verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false).init();

    // The sender process stays single-threaded: no handler thread, no namespaces.
    let install_handler = !matches!(cli.cmd, Cmd::BulkTx);
    // The balancer stops on its own (to print its last counters and detach); a second
    // Ctrl-C ends it at once (the kernel detaches its links when the process exits).
    let graceful = matches!(cli.cmd, Cmd::Lb { cmd: lb::LbCmd::Run(_) | lb::LbCmd::Decap { .. } });
    // Ctrl-C, SIGTERM, SIGHUP: destructors do not run when the process is killed by a signal, so remove
    // this process's namespaces (and with them its veth pairs and qdiscs) here.
    if !install_handler {
        // Nothing to clean up in a sender process.
    } else if let Err(e) = ctrlc::set_handler(move || {
        if graceful && !lb::STOP.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let n = netlane::topology::registry::cleanup_all();
        eprintln!("\ninterrupted; removed {n} network namespaces");
        std::process::exit(130);
    }) {
        eprintln!(
            "warning: no Ctrl-C handler ({e}); an interrupted run may leave namespaces behind (netlane topo clean removes them)"
        );
    }

    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

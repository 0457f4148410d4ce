//! `netlane`: servers, load generators, benchmarks and the lab. This crate only parses
//! arguments, calls the libraries and prints; see `docs/architecture.md`.
//!
//! Exit codes: 0 ok, 1 error, 2 usage, 3 targets missed, invalid or skipped under
//! `--strict`, 128+N killed by signal N.

#![forbid(unsafe_code)]
// The doc comments of the argument structs are `--help` text for clap, which writes
// `NAME[:SOCKPRIO]` and `<pid>` as they are: not links, not HTML.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

mod agents;
mod app;
mod bench;
mod bulk;
mod compare;
mod config_file;
mod documents;
mod hostile;
mod kv;
mod lab;
mod lb;
mod napi_args;
mod nic;
mod nvme;
mod out;
mod role;
mod rr;
mod signals;
#[cfg(test)]
mod testing;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use netlane_report::{Column, Row, Table, Value};

/// netlane: the short path from the wire to the application thread, measured.
#[derive(Debug, Parser)]
#[command(
    name = "netlane",
    version = netlane_report::provenance::VERSION_LINE,
    about,
    long_about = None,
    propagate_version = true,
    after_help = "Exit codes: 0 ok, 1 error, 2 usage, 3 targets missed/invalid/skipped under --strict, 128+N killed by signal N."
)]
struct Cli {
    /// More logging (-v: info, -vv: debug). RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run one scenario of the lab with your options, and print its results.
    Bench {
        #[command(subcommand)]
        bench: bench::BenchCmd,
    },
    /// Build the lab network, run every scenario, and write a report.
    Lab(Box<lab::LabCmd>),
    /// The memcached-protocol cache server and its load generator.
    Kv {
        #[command(subcommand)]
        cmd: kv::KvCmd,
    },
    /// The XDP L4 load balancer: run it on an interface, check a configuration, decapsulate on a real.
    Lb {
        #[command(subcommand)]
        cmd: lb::LbCmd,
    },
    /// NVMe/TCP in user space: the target server and the perf load generator.
    Nvme {
        #[command(subcommand)]
        cmd: nvme::NvmeCmd,
    },
    /// Bulk transfer (UDP with GSO, batching, zerocopy, pacing; or TCP): the sender and
    /// the receiver, measured from both ends.
    Bulk {
        #[command(subcommand)]
        cmd: bulk::BulkCmd,
    },
    /// Datagram request/response IPC: the server on five receive paths and the client
    /// population.
    Rr {
        #[command(subcommand)]
        cmd: rr::RrCmd,
    },
    /// Per-application policies for any program: socket priority and mark from a
    /// cgroup, egress classes by application.
    App {
        #[command(subcommand)]
        cmd: app::AppCmd,
    },
    /// Run a program as a lab role for a lab on another machine, which starts this over
    /// SSH: orders on standard input, one signal name a line (INT, TERM, HUP, KILL, USR1); at
    /// the end of input the program gets SIGTERM, and SIGKILL --grace later; the last line
    /// of standard error says how it ended and its CPU use, as JSON.
    Role(role::RoleArgs),
    /// Hostile clients of a netlane server, as `bench soak` runs them beside its valid
    /// load (garbage, impossible lengths, oversized values, connections that set up and
    /// stall, a datagram flood): for a soak across machines, or a campaign of your own.
    /// Runs for its time, then says how many operations it made.
    Hostile(hostile::HostileArgs),
    /// Compare two results (a lab's report directory or results.json, a bench's --json):
    /// each check regressed, improved or unchanged beyond both runs' spread, and the
    /// metrics that moved.
    Compare(compare::CompareArgs),
    /// Network devices: what the lab would use of one, and which settings it takes.
    Nic {
        #[command(subcommand)]
        cmd: nic::NicCmd,
    },
    /// Show which kernel fast paths work on this machine, and why not.
    Probe {
        #[command(flatten)]
        out: out::OutputArgs,
    },
    /// Undo what netlane processes that no longer run left behind: end processes still
    /// in their network namespaces and remove the namespaces; remove their qdiscs and
    /// cgroups; put back sysctls they changed. Says what it did.
    Clean,
    /// The lab's network namespaces.
    Topo {
        #[command(subcommand)]
        cmd: TopoCmd,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Write man pages (netlane.1 and one per subcommand) into a directory.
    Man {
        /// Where to write them (created if missing).
        dir: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
enum TopoCmd {
    /// The same as `netlane clean`.
    Clean,
    /// List the netlane namespaces that exist.
    List,
}

fn probe(o: &out::OutputArgs) -> Result<()> {
    o.validate()?;
    let p = netlane::probe::probe_all();
    let mut t = Table::new(
        "probe",
        "Kernel fast paths on this machine",
        vec![
            Column::new("feature", "feature", 0),
            Column::new("works", "works", 0),
            Column::new("detail", "detail", 0),
        ],
    );
    let word = |s: &netlane::probe::Support| match s {
        netlane::probe::Support::Supported(_) => "yes",
        netlane::probe::Support::Unsupported(_) => "no",
        netlane::probe::Support::Unknown(_) => "unknown",
    };
    for f in &p.features {
        t.push(Row::new(vec![Value::text(f.name), Value::text(word(&f.support)), Value::text(f.support.detail())]));
    }
    for q in &p.qdiscs {
        t.push(Row::new(vec![
            Value::text(format!("qdisc {}", q.qdisc)),
            Value::text(word(&q.support)),
            Value::text(q.support.detail()),
        ]));
    }
    let doc = netlane_report::document("probe", p);
    if !o.json_to_stdout() {
        out::print(&netlane_report::terminal::table(&t));
    }
    o.write_json(&doc)?;
    o.write_tables(&doc.provenance.run_id, &[t])
}

/// `netlane clean`: exits 1 when something could not be undone (its record is kept).
fn clean() -> Result<u8> {
    let cleaned = netlane::topology::registry::clean_stale().context("removing stale namespaces")?;
    for (pid, comm, ns) in &cleaned.processes {
        out::println(&format!("ended {comm} (pid {pid}), still running in {ns}"));
    }
    for n in &cleaned.namespaces {
        out::println(&format!("removed namespace {n}"));
    }
    let undone = netlane::installed::clean_stale()
        .with_context(|| format!("reading the records in {}", netlane::installed::DIR))?;
    let mut failed = 0;
    for u in &undone {
        match &u.outcome {
            Ok(what) => out::println(&format!("{} (left by pid {}): {what}", u.change, u.pid)),
            Err(why) => {
                failed += 1;
                eprintln!("netlane clean: {} (left by pid {}): not undone: {why}", u.change, u.pid);
            }
        }
    }
    if cleaned.namespaces.is_empty() && undone.is_empty() {
        out::println("nothing left behind by netlane processes that no longer run");
    }
    Ok(u8::from(failed > 0))
}

fn topo(cmd: &TopoCmd) -> Result<u8> {
    match cmd {
        TopoCmd::Clean => return clean(),
        TopoCmd::List => {
            let mut names = netlane::topology::netns_names();
            names.retain(|n| n.starts_with(netlane::topology::NAME_PREFIX));
            for n in names {
                let alive = netlane::topology::registry::owner_pid(&n)
                    .is_some_and(|pid| std::path::Path::new("/proc").join(pid.to_string()).exists());
                out::println(&format!("{n}{}", if alive { "" } else { "  (stale: its process is gone)" }));
            }
        }
    }
    Ok(0)
}

fn man(dir: &std::path::Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let cmd = Cli::command();
    let mut pages = vec![(cmd.get_name().to_string(), cmd.clone())];
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        pages.push((format!("netlane-{}", sub.get_name()), sub.clone().name(format!("netlane-{}", sub.get_name()))));
        for subsub in sub.get_subcommands() {
            let name = format!("netlane-{}-{}", sub.get_name(), subsub.get_name());
            pages.push((name.clone(), subsub.clone().name(name)));
        }
    }
    for (name, c) in pages {
        let path = dir.join(format!("{name}.1"));
        let mut buf = Vec::new();
        clap_mangen::Man::new(c).render(&mut buf).with_context(|| format!("render {name}"))?;
        std::fs::write(&path, buf).with_context(|| format!("write {}", path.display()))?;
        out::println(&path.display().to_string());
    }
    Ok(())
}

/// Runs the command; `Ok(code)` is the exit status.
fn run(cli: Cli) -> Result<u8> {
    match cli.cmd {
        Cmd::Bench { bench } => bench::run(bench),
        Cmd::Lab(a) => lab::run(&a),
        Cmd::Kv { cmd } => kv::run(cmd),
        Cmd::Lb { cmd } => lb::run(cmd).map(|()| 0),
        Cmd::Nvme { cmd } => nvme::run(cmd),
        Cmd::Rr { cmd } => rr::run(cmd),
        Cmd::Bulk { cmd } => bulk::run(cmd),
        Cmd::App { cmd } => app::run(cmd),
        Cmd::Role(a) => a.run(),
        Cmd::Hostile(a) => a.run(),
        Cmd::Compare(a) => a.run(),
        Cmd::Nic { cmd } => nic::run(cmd),
        Cmd::Probe { out } => probe(&out).map(|()| 0),
        Cmd::Clean => clean(),
        Cmd::Topo { cmd } => topo(&cmd),
        Cmd::Completions { shell } => {
            let mut buf = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "netlane", &mut buf);
            out::print(&String::from_utf8_lossy(&buf));
            Ok(0)
        }
        Cmd::Man { dir } => man(&dir).map(|()| 0),
    }
}

fn main() -> ExitCode {
    let cmd = Cli::command();
    let args = match config_file::expand(&cmd, std::env::args_os().collect()) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("error: {}", out::error_line(&e));
            return ExitCode::from(2);
        }
    };
    let matches = cmd.clone().get_matches_from(args);
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let flags = out::flags_of(&cmd, &matches);
    let level = match cli.verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();

    // The sender stays single-threaded: no handler thread, no namespaces.
    match &cli.cmd {
        // The supervisor passes its signals on to its role.
        Cmd::Bulk { cmd: bulk::BulkCmd::Send(_) } | Cmd::Role(_) | Cmd::Completions { .. } | Cmd::Man { .. } => {}
        Cmd::Lb { cmd: lb::LbCmd::Run(_) | lb::LbCmd::Decap(_) }
        | Cmd::Nvme { cmd: nvme::NvmeCmd::Target(_) }
        | Cmd::Rr { cmd: rr::RrCmd::Serve(_) }
        | Cmd::Kv { cmd: kv::KvCmd::Serve(_) }
        | Cmd::Bulk { cmd: bulk::BulkCmd::Recv(_) }
        | Cmd::Nic { cmd: nic::NicCmd::Hold(_) }
        | Cmd::App { .. } => signals::install(signals::Mode::Server),
        _ => signals::install(signals::Mode::Job),
    }

    match run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {}", out::with_flags(&out::error_line(&e), &flags));
            ExitCode::FAILURE
        }
    }
}

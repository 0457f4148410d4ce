//! What the command line writes, and how it ends.
//!
//! - stdout carries results: the human report, or with `--json -` the JSON document
//!   and nothing else; progress, warnings and errors go to stderr;
//! - `--json FILE` and `--csv DIR` are checked before any work starts;
//! - a closed stdout (`netlane ... | head`) ends the program quietly;
//! - exit codes: 0 ok, 1 error, 2 usage, 3 targets missed, invalid or skipped under
//!   `--strict`, 128+N killed by signal N (141 for a closed pipe).

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use netlane::metrics::run_status::RunStatus;
use netlane_report::{Document, Results};
use serde::Serialize;

/// Exit status: targets missed, invalid or skipped under `--strict`.
pub const EXIT_STRICT: u8 = 3;
/// Exit status when stdout was closed under us (128 + SIGPIPE).
pub const EXIT_PIPE: i32 = 141;

/// Writes `text` to stdout; a closed pipe ends the program quietly (removing any
/// namespaces this process made first).
pub fn print(text: &str) {
    let mut out = std::io::stdout().lock();
    let r = out.write_all(text.as_bytes()).and_then(|()| out.flush());
    if let Err(e) = r {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            netlane::topology::registry::cleanup_all();
            std::process::exit(EXIT_PIPE);
        }
        eprintln!("error: write to stdout: {e}");
        std::process::exit(1);
    }
}

/// `print` with a newline.
pub fn println(text: &str) {
    print(&format!("{text}\n"));
}

/// The error and its causes on one line, `what failed: why: why`. Every error in
/// netlane says its cause once, through `source()` (`netlane::error`), so the chain is
/// printed as it is.
pub fn error_line(e: &anyhow::Error) -> String {
    e.chain().map(|c| c.to_string()).filter(|s| !s.is_empty()).collect::<Vec<_>>().join(": ")
}

/// The long flags of the command that ran (and of the commands above it), by the id of
/// the argument each sets: clap names an argument after its field, and the libraries'
/// configuration fields carry the same names.
pub fn flags_of(cmd: &clap::Command, matches: &clap::ArgMatches) -> BTreeMap<String, String> {
    let mut flags = BTreeMap::new();
    let (mut cmd, mut matches) = (cmd, matches);
    loop {
        for a in cmd.get_arguments() {
            if let Some(long) = a.get_long() {
                flags.insert(a.get_id().to_string(), format!("--{long}"));
            }
        }
        let Some((name, sub)) = matches.subcommand() else { break };
        let Some(next) = cmd.find_subcommand(name) else { break };
        (cmd, matches) = (next, sub);
    }
    flags
}

/// `line` with each configuration field a library named in backticks (`` `max_conns` ``)
/// said as the flag that sets it on this command; a field no flag sets stays as it is.
pub fn with_flags(line: &str, flags: &BTreeMap<String, String>) -> String {
    let parts: Vec<&str> = line.split('`').collect();
    if parts.len().is_multiple_of(2) {
        // An unpaired backtick: no field names to read.
        return line.to_string();
    }
    let mut out = String::with_capacity(line.len());
    for (i, part) in parts.iter().enumerate() {
        match (i % 2 == 1).then(|| flags.get(*part)).flatten() {
            Some(flag) => out.push_str(flag),
            None if i % 2 == 1 => {
                out.push('`');
                out.push_str(part);
                out.push('`');
            }
            None => out.push_str(part),
        }
    }
    out
}

/// `SLA p99=1ms: met (812.3 us)`.
pub fn sla_line(sla: &netlane::metrics::sla::Sla, at: Option<u64>, met: bool) -> String {
    format!(
        "SLA {sla}: {} ({})",
        if met { "met" } else { "missed" },
        at.map_or("the percentile falls among requests without an answer".into(), |n| format!(
            "{:.1} us",
            n as f64 / 1e3
        ))
    )
}

/// A load generator's status line on stderr, as fio's: `[ 45%] measuring 12.3k IOPS, eta
/// 3s`, rewritten in place on a terminal, a line a second otherwise.
pub struct LiveStatus {
    /// What the rate counts (`IOPS`, `requests/s`).
    unit: &'static str,
    tty: bool,
    last: Option<(Duration, u64)>,
    last_line: Instant,
}

impl LiveStatus {
    /// A status line whose rate counts `unit`.
    pub fn new(unit: &'static str) -> LiveStatus {
        LiveStatus { unit, tty: std::io::stderr().is_terminal(), last: None, last_line: Instant::now() }
    }

    /// Says where the run is.
    pub fn show(&mut self, s: &RunStatus) {
        if crate::signals::STOP.is_stopped() {
            return;
        }
        let iops = match self.last {
            Some((t, n)) if s.elapsed > t => (s.completed - n) as f64 / (s.elapsed - t).as_secs_f64(),
            _ => 0.0,
        };
        self.last = Some((s.elapsed, s.completed));
        let pct = 100.0 * s.elapsed.as_secs_f64() / s.total.as_secs_f64().max(1e-9);
        let eta = s.total.saturating_sub(s.elapsed).as_secs();
        let line = format!(
            "[{:>3.0}%] {} {} {}, eta {eta}s",
            pct.min(100.0),
            match (s.measuring, s.elapsed >= s.total) {
                (_, true) => "draining ",
                (true, false) => "measuring",
                (false, false) => "ramping  ",
            },
            netlane_report::format::si(iops),
            self.unit
        );
        if self.tty {
            eprint!("\r{line}   ");
        } else if self.last_line.elapsed() >= Duration::from_secs(1) {
            eprintln!("{line}");
            self.last_line = Instant::now();
        }
    }

    /// Clears the line (on a terminal) before the results are printed.
    pub fn done(&self) {
        if self.tty && self.last.is_some() {
            eprint!("\r{:60}\r", "");
        }
    }
}

/// Where machine-readable output goes: `--json [FILE|-]`, `--csv DIR`.
#[derive(Debug, Clone, Default, Args)]
pub struct OutputArgs {
    /// Write the results as JSON to FILE, or to stdout with `-` (the default when no FILE
    /// is given; nothing else is written to stdout then).
    #[arg(long, value_name = "FILE|-", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<PathBuf>,
    /// Write every table as CSV into DIR (created if missing), plus runs.csv and checks.csv.
    #[arg(long, value_name = "DIR")]
    pub csv: Option<PathBuf>,
}

/// `--strict`: exit with 3 when a target is missed, invalid or skipped.
#[derive(Debug, Clone, Default, Args)]
pub struct StrictArg {
    /// Exit with status 3 when any target is missed, invalid or skipped.
    #[arg(long)]
    pub strict: bool,
}

fn writable_dir(dir: &Path) -> Result<()> {
    let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
    if !dir.is_dir() {
        bail!("directory {} does not exist", dir.display());
    }
    nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK)
        .with_context(|| format!("directory {} is not writable", dir.display()))?;
    Ok(())
}

impl OutputArgs {
    /// Whether the JSON goes to stdout (then stdout carries nothing else).
    pub fn json_to_stdout(&self) -> bool {
        self.json.as_deref() == Some(Path::new("-"))
    }

    /// Checks the paths before any work starts; makes the CSV directory.
    pub fn validate(&self) -> Result<()> {
        if let Some(p) = self.json.as_deref().filter(|p| *p != Path::new("-")) {
            if p.is_dir() {
                bail!("--json {}: is a directory; give a file name", p.display());
            }
            writable_dir(p.parent().unwrap_or(Path::new("."))).with_context(|| format!("--json {}", p.display()))?;
        }
        if let Some(d) = &self.csv {
            std::fs::create_dir_all(d).with_context(|| format!("--csv {}: create the directory", d.display()))?;
            writable_dir(d).with_context(|| format!("--csv {}", d.display()))?;
        }
        Ok(())
    }

    /// Writes a document as JSON where asked.
    pub fn write_json<T: Serialize>(&self, doc: &Document<T>) -> Result<()> {
        match self.json.as_deref() {
            None => Ok(()),
            Some(p) if p == Path::new("-") => {
                println(&netlane_report::to_json(doc));
                Ok(())
            }
            Some(p) => {
                std::fs::write(p, netlane_report::to_json(doc) + "\n").with_context(|| format!("write {}", p.display()))
            }
        }
    }

    /// Writes results as JSON and CSV where asked.
    pub fn write_results(&self, doc: &Document<Results>) -> Result<()> {
        self.write_json(doc)?;
        if let Some(d) = &self.csv {
            netlane_report::csv::write_all(d, &doc.provenance.run_id, &doc.body.scenarios)?;
        }
        Ok(())
    }

    /// Writes tables as CSV where asked (for commands whose results are one table).
    pub fn write_tables(&self, run_id: &str, tables: &[netlane_report::Table]) -> Result<()> {
        if let Some(d) = &self.csv {
            for t in tables {
                netlane_report::csv::write_table(d, run_id, t)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No part of the line says again what a part before it said.
    fn said_once(line: &str) {
        let parts: Vec<&str> = line.split(": ").collect();
        for (i, p) in parts.iter().enumerate() {
            assert!(parts[..i].iter().all(|q| !q.contains(p)), "{p:?} said twice in {line:?}");
        }
    }

    #[test]
    fn each_cause_is_said_once() {
        let refused = std::io::Error::from_raw_os_error(111);
        let e =
            anyhow::Error::new(netlane::error::IoError::new("connect to 127.0.0.1:1", refused)).context("nvme connect");
        let line = error_line(&e);
        assert_eq!(line, format!("nvme connect: connect to 127.0.0.1:1: {}", std::io::Error::from_raw_os_error(111)));
        said_once(&line);
        // The library's own error enums: a bad configuration, a kernel operation.
        let bad = netlane_lb::proto::config::Config::parse("[[vip]]\naddress = 1").unwrap_err();
        let e = anyhow::Error::new(netlane_lb::LbError::from(bad)).context("lb run");
        said_once(&error_line(&e));
        assert!(error_line(&e).starts_with("lb run: configuration: "), "{}", error_line(&e));
        let e =
            anyhow::Error::new(netlane_lb::LbError::kernel("open /nonexistent")(std::io::ErrorKind::NotFound.into()));
        said_once(&error_line(&e));
        // A netlink request the kernel refused, as the topology reports it.
        let refused = netlane::topology::Rtnl::open().unwrap().link_index("nl-nonesuch0").unwrap_err();
        let e = anyhow::Error::new(netlane::topology::TopologyError::from(refused)).context("build the lab");
        said_once(&error_line(&e));
        assert!(error_line(&e).starts_with("build the lab: look up interface nl-nonesuch0: "), "{}", error_line(&e));
    }

    #[test]
    fn library_fields_are_said_as_this_commands_flags() {
        let cmd = clap::Command::new("kv").subcommand(
            clap::Command::new("serve")
                .arg(clap::Arg::new("max_conns").long("conn-limit").short('c'))
                .arg(clap::Arg::new("threads").long("threads")),
        );
        let m = cmd.clone().get_matches_from(["kv", "serve", "-c", "5"]);
        let flags = flags_of(&cmd, &m);
        assert_eq!(
            with_flags("`max_conns` 0: must be 1..=1000000; `threads` too; `ring_size` kept", &flags),
            "--conn-limit 0: must be 1..=1000000; --threads too; `ring_size` kept"
        );
        assert_eq!(with_flags("one ` backtick `threads`", &flags), "one ` backtick `threads`");
        assert_eq!(with_flags("nothing named", &flags), "nothing named");
    }

    #[test]
    fn bad_output_paths_are_refused_before_work() {
        let o = OutputArgs { json: Some("/nonexistent/x.json".into()), csv: None };
        let e = format!("{:#}", o.validate().unwrap_err());
        assert!(e.contains("/nonexistent") && e.contains("does not exist"), "{e}");
        let o = OutputArgs { json: Some("/".into()), csv: None };
        assert!(format!("{:#}", o.validate().unwrap_err()).contains("is a directory"));
        assert!(OutputArgs { json: Some("-".into()), csv: None }.validate().is_ok());
    }
}

//! `netlane app run` and `netlane app shape`: per-application priority and egress
//! shaping for any program (netlane's servers or anyone's).

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use netlane::lanes::apps::{self, AppCgroup, AppSpec, BackendChoice, Shaper};
use netlane::metrics::units::parse_rate;
use netlane_report::format::bytes_per_second;
use netlane_report::options::parse_positive_duration;

use crate::signals::STOP;

/// Per-application policies.
#[derive(Debug, Subcommand)]
pub enum AppCmd {
    /// Run a program as an application: every IPv4/IPv6 socket it (and anything it
    /// starts) creates gets the application's priority and mark, from a cgroup socket
    /// program; no change to the program. Exits with the program's status.
    Run(RunArgs),
    /// Shape an interface's egress by application until SIGINT/SIGTERM (or --time): a
    /// class per application with a guaranteed and a highest rate under the link's
    /// rate (mqprio channel mode offloaded to the device when it can, found by socket
    /// priority; else htb, found by socket mark); then print what each class sent.
    Shape(ShapeArgs),
}

/// Runs an `app` command.
pub fn run(cmd: AppCmd) -> Result<u8> {
    match cmd {
        AppCmd::Run(a) => a.run(),
        AppCmd::Shape(a) => a.run(),
    }
}

fn mark(s: &str) -> Result<u32, String> {
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .map_err(|_| format!("{s:?}: a mark is a number, decimal or 0x hex, up to 32 bits"))?;
    if v == 0 {
        return Err("mark 0 means unmarked; pick another".into());
    }
    Ok(v)
}

fn rate(s: &str) -> Result<u64, String> {
    parse_rate(s).map_err(|e| e.to_string())
}

/// NAME:MARK:MIN:MAX[:PRIO[:SOCKPRIO]].
fn class(s: &str) -> Result<AppSpec, String> {
    let parts: Vec<&str> = s.split(':').collect();
    if !(4..=6).contains(&parts.len()) {
        return Err(format!("{s:?}: expected NAME:MARK:MIN:MAX[:PRIO[:SOCKPRIO]], e.g. cache:0x10:100mbit:1gbit:0:3"));
    }
    let spec = AppSpec {
        name: parts[0].to_string(),
        priority: match parts.get(5) {
            Some(p) => p.parse().map_err(|_| format!("{s:?}: SOCKPRIO is 0..={}", apps::PRIORITY_MAX))?,
            None => 0,
        },
        mark: mark(parts[1])?,
        min_rate: rate(parts[2])?,
        max_rate: rate(parts[3])?,
        htb_prio: match parts.get(4) {
            Some(p) => p.parse().map_err(|_| format!("{s:?}: PRIO is 0..={}", apps::HTB_PRIO_MAX))?,
            None => 0,
        },
    };
    spec.validate().map_err(|e| e.to_string())?;
    Ok(spec)
}

/// `netlane app run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The application's name (its cgroup is netlane-<pid>-<name>).
    #[arg(long)]
    pub name: String,
    /// Socket priority of every socket, 0..=15 (what mqprio maps to a traffic class).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=i64::from(apps::PRIORITY_MAX)))]
    pub priority: u32,
    /// Socket mark of every socket (decimal or 0x hex, not 0): what `netlane app shape`
    /// classifies by.
    #[arg(long, value_parser = mark)]
    pub mark: u32,
    /// The program and its arguments (after --).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "PROGRAM")]
    pub command: Vec<String>,
}

impl RunArgs {
    fn run(&self) -> Result<u8> {
        let spec = AppSpec {
            name: self.name.clone(),
            priority: self.priority,
            mark: self.mark,
            min_rate: 1,
            max_rate: 1,
            htb_prio: 0,
        };
        let cg = AppCgroup::create(&spec)?;
        let (program, args) = self.command.split_first().context("no program to run")?;
        let mut cmd = Command::new(program);
        cmd.args(args);
        cg.command(&mut cmd);
        let mut child = cmd.spawn().with_context(|| format!("start {program}"))?;
        // Wait for it; a SIGINT/SIGTERM/SIGHUP sent to us is passed on as SIGTERM (one
        // from a terminal reaches it anyway), so the program ends before its cgroup goes.
        let mut passed_on = false;
        let status = loop {
            if let Some(s) = child.try_wait().with_context(|| format!("wait for {program}"))? {
                break s;
            }
            if STOP.is_stopped() && !passed_on {
                passed_on = true;
                let pid = nix::unistd::Pid::from_raw(child.id() as i32);
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        eprintln!(
            "app {}: {} sockets given priority {} and mark {:#x}",
            self.name,
            cg.sockets().unwrap_or(0),
            self.priority,
            self.mark
        );
        drop(cg);
        Ok(match status.code() {
            Some(c) => u8::try_from(c).unwrap_or(1),
            None => {
                use std::os::unix::process::ExitStatusExt;
                status.signal().map_or(1, |s| 128u8.saturating_add(s as u8))
            }
        })
    }
}

/// `--backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// mqprio channel mode when it can be had, htb otherwise.
    Auto,
    /// htb classes and a TCX classifier.
    Htb,
    /// mqprio channel mode offloaded to the device, or an error.
    Mqprio,
}

impl From<Backend> for BackendChoice {
    fn from(b: Backend) -> BackendChoice {
        match b {
            Backend::Auto => BackendChoice::Auto,
            Backend::Htb => BackendChoice::Htb,
            Backend::Mqprio => BackendChoice::Mqprio,
        }
    }
}

/// `netlane app shape`.
#[derive(Debug, Args)]
pub struct ShapeArgs {
    /// Interface whose egress is shaped (its root qdisc is replaced while this runs).
    #[arg(long)]
    pub dev: String,
    /// The link's rate, shared by every class (e.g. 10gbit, 1GB/s).
    #[arg(long, value_parser = rate)]
    pub link: u64,
    /// An application's class: NAME:MARK:MIN:MAX[:PRIO[:SOCKPRIO]], the socket mark
    /// given to `netlane app run`, the guaranteed and highest rate (e.g. 100mbit,
    /// 12MB/s), its turn for spare bandwidth under htb (0 first) and the socket priority
    /// given to `netlane app run` (1..=15, distinct: what mqprio finds the class by).
    /// Repeat for each application; other traffic shares what the guarantees leave.
    #[arg(long = "app", required = true, value_parser = class)]
    pub apps: Vec<AppSpec>,
    /// What shapes: mqprio channel mode when the kernel and the device offload it
    /// (auto; htb otherwise, and the reason is printed), htb, or mqprio only.
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    pub backend: Backend,
    /// Stop after this long [default: until SIGINT/SIGTERM].
    #[arg(long, value_parser = parse_positive_duration)]
    pub time: Option<Duration>,
}

impl ShapeArgs {
    fn run(&self) -> Result<u8> {
        let plan = apps::plan(self.link, &self.apps)?;
        let ifindex =
            nix::net::if_::if_nametoindex(self.dev.as_str()).with_context(|| format!("--dev {}", self.dev))?;
        let mut shaper =
            Shaper::install_with(ifindex, plan, self.backend.into()).with_context(|| format!("shape {}", self.dev))?;
        if let (Backend::Auto, Some(why)) = (self.backend, shaper.why_not_mqprio()) {
            eprintln!("mqprio channel mode not used: {why}");
        }
        eprintln!(
            "shaping {}'s egress at {} for {} applications with {}{}",
            self.dev,
            bytes_per_second(self.link as f64),
            self.apps.len(),
            shaper.backend(),
            if self.time.is_some() { "" } else { " (SIGINT/SIGTERM to stop)" }
        );
        let started = Instant::now();
        while !STOP.is_stopped() && self.time.is_none_or(|t| started.elapsed() < t) {
            STOP.wait(Duration::from_millis(50));
        }
        let classified = shaper.classified()?;
        for c in shaper.classes()? {
            println!(
                "{:<16} class {:<6} rate {:>14} ceil {:>14}  sent {} bytes, {} packets, {} dropped",
                c.app,
                c.class,
                bytes_per_second(c.rate as f64),
                bytes_per_second(c.ceil as f64),
                c.stats.bytes,
                c.stats.packets,
                c.stats.drops
            );
        }
        if let Some((classified, other)) = classified {
            println!(
                "classifier: {classified} packets put in an application's class, {other} left to the default class"
            );
        }
        Ok(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_and_marks_parse_or_say_why_not() {
        let c = class("cache:0x10:100mbit:1gbit:1").unwrap();
        assert_eq!(
            (c.name.as_str(), c.mark, c.min_rate, c.max_rate, c.htb_prio),
            ("cache", 16, 12_500_000, 125_000_000, 1)
        );
        assert_eq!(class("bulk:32:1MB/s:2MB/s").unwrap().htb_prio, 0);
        assert_eq!(class("bulk:32:1MB/s:2MB/s:0:7").unwrap().priority, 7);
        for (bad, why) in [
            ("cache:16:1mbit", "expected NAME:MARK"),
            ("cache:0:1mbit:2mbit", "mark 0"),
            ("cache:zz:1mbit:2mbit", "a mark is a number"),
            ("cache:1:2mbit:1mbit", "guaranteed rate"),
            ("cache:1:1mbit:2mbit:9", "htb priority"),
            ("cache:1:1mbit:2mbit:0:16", "priority 16 is above"),
            ("cache:1:1mbit:2mbit:0:x", "SOCKPRIO is"),
            ("cache:1:1mbit:2mbit:0:1:2", "expected NAME:MARK"),
            ("../x:1:1mbit:2mbit", "a name is"),
        ] {
            let e = class(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
        assert_eq!(mark("0xff").unwrap(), 255);
    }
}

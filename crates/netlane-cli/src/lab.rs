//! `netlane lab`: every scenario, and the report directory.

use anyhow::Result;
use clap::Args;
use netlane_lab::lab::LabArgs;
use netlane_lab::progress::Reporter;
use netlane_report::terminal;

use crate::out::{self, EXIT_STRICT, OutputArgs, StrictArg};

#[derive(Debug, Args)]
pub struct LabCmd {
    #[command(flatten)]
    lab: LabArgs,
    #[command(flatten)]
    out: OutputArgs,
    #[command(flatten)]
    strict: StrictArg,
}

/// Runs the lab: everything is checked first, then each scenario's report is printed
/// as it finishes, then the verdict.
pub fn run(a: &LabCmd) -> Result<u8> {
    a.out.validate()?;
    let stamp = jiff::Timestamp::now().strftime("%Y%m%d-%H%M%S").to_string();
    let lab = a.lab.prepare(&stamp)?;
    let progress = Reporter::new();
    let quiet = a.out.json_to_stdout();
    let doc = lab.run(&progress, |s| {
        if !quiet {
            progress.suspend(|| out::print(&format!("{}\n", terminal::scenario(s))));
        }
        Ok(())
    })?;
    if !quiet {
        out::print(&terminal::summary(&doc.body));
        out::println(&format!("report: {}", lab.dir.join("index.html").display()));
    }
    a.out.write_results(&doc)?;
    Ok(if a.strict.strict && doc.body.summary.strict_failures() > 0 { EXIT_STRICT } else { 0 })
}

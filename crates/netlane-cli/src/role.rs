//! `netlane role`: runs one program as a lab role on this machine for a lab on another
//! (started over SSH): its orders on standard input, its end on the last line.

use std::io::Write;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use netlane_lab::host::supervisor::{Supervised, obey};
use netlane_report::options::{parse_duration, parse_positive_duration};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

/// `netlane role`.
#[derive(Debug, Args)]
pub struct RoleArgs {
    /// How long the program has to stop after its orders end (then SIGKILL).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub grace: Duration,
    /// Take the orders as ended when standard input is silent this long (the lab writes
    /// an empty line every 5 s: a connection that died without closing then ends the
    /// program too) [default: wait for the input to end].
    #[arg(long, value_parser = parse_positive_duration)]
    pub silence: Option<Duration>,
    /// Write the program's resident memory and open descriptors to standard error this
    /// often (`netlane role sample: MS RSS FDS` lines, which the lab takes out of its
    /// output).
    #[arg(long, value_parser = parse_positive_duration)]
    pub sample: Option<Duration>,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "PROGRAM")]
    pub command: Vec<String>,
}

impl RoleArgs {
    /// Runs the program to its end; exits as it did (128 + the signal that ended it).
    pub fn run(&self) -> Result<u8> {
        // Signals given to the supervisor (Ctrl-C where it runs by hand) are the role's:
        // it stops with its report, and the supervisor waits for it. Caught from before
        // the role starts, so none ends the supervisor instead.
        let signals = Signals::new([SIGINT, SIGTERM, SIGHUP]);
        let role = Supervised::start(&self.command)?;
        let orders = role.signaller();
        if let Some(every) = self.sample {
            orders.report_samples(every);
        }
        let (grace, silence) = (self.grace, self.silence);
        std::thread::spawn(move || obey(std::io::BufReader::new(std::io::stdin()), &orders, grace, silence));
        match signals {
            Ok(mut signals) => {
                let forward = role.signaller();
                std::thread::spawn(move || {
                    for s in signals.forever() {
                        if let Ok(s) = nix::sys::signal::Signal::try_from(s) {
                            forward.send(s);
                        }
                    }
                });
            }
            Err(e) => eprintln!("warning: signals reach the supervisor only ({e})"),
        }
        let end = role.wait()?;
        // On a line of its own, whatever the program last wrote; nobody may be left to
        // read it (the session dropped).
        let _ = writeln!(std::io::stderr(), "\n{}", end.line());
        Ok(end.exit_code())
    }
}

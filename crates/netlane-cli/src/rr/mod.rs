//! `netlane rr serve` and `netlane rr clients`: arguments in, library calls, output.

use anyhow::Result;
use clap::Subcommand;
use netlane_report::options::parse_size_usize;

mod clients;
mod serve;

pub use self::clients::ClientsArgs;
pub use self::serve::ServeArgs;

/// Datagram request/response service.
#[derive(Debug, Subcommand)]
pub enum RrCmd {
    /// Serve requests on one receive path until SIGINT/SIGTERM (or --time); then print
    /// the final counters and exit 0.
    Serve(Box<ServeArgs>),
    /// Run a client population against a server (ours, or any UDP echo server with
    /// --echo) and print throughput, latency and what went wrong.
    Clients(Box<ClientsArgs>),
}

/// Runs an `rr` command.
pub fn run(cmd: RrCmd) -> Result<u8> {
    match cmd {
        RrCmd::Serve(a) => a.run(),
        RrCmd::Clients(a) => a.run(),
    }
}

fn parse_size_u32(s: &str) -> Result<u32, String> {
    u32::try_from(parse_size_usize(s)?).map_err(|_| format!("{s} is too large"))
}

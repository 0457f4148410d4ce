//! `netlane hostile`: the soak's hostile clients of one netlane server, run against its
//! address for a while (the lab runs them so on a testbed's client host).

use netlane_report::options::parse_endpoint;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Result;
use clap::{Args, ValueEnum};
use netlane_lab::scenarios::soak::{SoakServer, run_hostile};
use netlane_report::options::parse_positive_duration;

use crate::documents::Hostile;
use crate::out::{self, OutputArgs};

/// `netlane hostile`.
#[derive(Debug, Args)]
pub struct HostileArgs {
    /// The kind of server: kv (memcached protocol), rr (datagram request/response) or
    /// nvme (NVMe/TCP).
    #[arg(value_enum)]
    pub server: SoakServer,
    /// Its address: HOST:PORT.
    #[arg(long, value_parser = |s: &str| parse_endpoint(s, None))]
    pub addr: SocketAddr,
    /// Connections held open at once, each having started a message and stalled (TCP
    /// servers).
    #[arg(long, default_value_t = 48, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub connections: u32,
    /// How long.
    #[arg(short = 't', long = "time", default_value = "10s", value_parser = parse_positive_duration)]
    pub time: Duration,
    #[command(flatten)]
    pub out: OutputArgs,
}

impl HostileArgs {
    /// Runs the clients for their time.
    pub fn run(&self) -> Result<u8> {
        self.out.validate()?;
        let operations = run_hostile(self.server, self.addr, self.connections as usize, self.time)?;
        let doc = Hostile {
            server: self.server.to_possible_value().map(|v| v.get_name().to_string()).unwrap_or_default(),
            addr: self.addr.to_string(),
            seconds: self.time.as_secs_f64(),
            operations,
        };
        if !self.out.json_to_stdout() {
            out::println(&format!(
                "{operations} hostile operations against {} {} in {:?}",
                doc.server, doc.addr, self.time
            ));
        }
        self.out.write_json(&netlane_report::document("hostile", doc))?;
        Ok(0)
    }
}

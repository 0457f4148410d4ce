//! Soak: each server (the cache, the datagram service, the NVMe/TCP target, the
//! balancer in `balancer.rs`) runs for a while as a process of its own, in a namespace of its own, under valid load from
//! netlane's own client beside hostile clients of the kinds a black-box campaign found
//! (garbage, impossible lengths, oversized values and responses, connections that set
//! up and stall), and is held to bounds measured from outside: the valid clients lose
//! nothing and keep their tail latency, the server's file descriptors stay within its
//! connection limit, and its resident memory stops growing once warm. The NVMe target
//! is then killed with SIGKILL, started again on the same file, and every block the
//! valid client wrote is read back.

mod balancer;
mod hostile;
mod measure;
mod report;
mod testbed;

pub use hostile::run_hostile;

use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use netlane_report::ScenarioReport;
use netlane_report::options::{OptionList, parse_positive_duration};

use super::Scenario;
use crate::plan::{CpuPlan, Role};
use crate::progress::Progress;
use crate::testbed::TestbedArgs;

/// The servers a soak runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SoakServer {
    /// `netlane kv serve` (memcached protocol over TCP).
    Kv,
    /// `netlane rr serve` (datagram request/response).
    Rr,
    /// `netlane nvme target` on a file namespace.
    Nvme,
    /// `netlane lb run` forwarding to two reals (each `netlane rr serve`) on veth.
    Lb,
}

impl SoakServer {
    fn name(self) -> String {
        crate::scenarios::value_name(&self)
    }

    /// Its port.
    fn port(self) -> u16 {
        match self {
            SoakServer::Kv => 11211,
            SoakServer::Rr | SoakServer::Lb => 7000,
            SoakServer::Nvme => 4420,
        }
    }

    /// Where it listens in a namespace of this machine.
    fn local_addr(self) -> std::net::SocketAddr {
        (std::net::Ipv4Addr::LOCALHOST, self.port()).into()
    }
}

/// `netlane bench soak`.
#[derive(Debug, Clone, Args)]
pub struct SoakArgs {
    /// The servers to soak, one after another.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [SoakServer::Kv, SoakServer::Rr, SoakServer::Nvme, SoakServer::Lb])]
    pub servers: Vec<SoakServer>,
    /// How long each server is soaked.
    #[arg(long, default_value = "5m", value_parser = parse_positive_duration)]
    pub time: Duration,
    /// Connections the hostile clients hold open at once (each server's limit is set
    /// above it, so the valid client always gets in).
    #[arg(long, default_value_t = 48)]
    pub hostile_connections: usize,
    /// Highest p99 latency the valid client may see, in milliseconds.
    #[arg(long, default_value_t = 50)]
    pub p99_ms: u64,
    /// Most the server's resident memory may grow from a third of the run to its end, MiB.
    #[arg(long, default_value_t = 32)]
    pub growth_mib: u64,
    /// Across machines: each server on the testbed's server host at its `addr`, the
    /// valid client on its first client host, the hostile clients on its last (the
    /// balancer stays on one machine).
    #[command(flatten)]
    pub on: TestbedArgs,
}

/// The NVMe file namespace's size and the block the client writes and reads back: the
/// read-back must find every one of `NVME_IMAGE_BYTES / NVME_BLOCK` blocks intact.
const NVME_IMAGE_BYTES: u64 = 64 << 20;
const NVME_BLOCK: u64 = 4096;

/// The server's connection limit: room for the hostile clients and the valid ones.
const VALID_CONNECTIONS: usize = 8;

/// Where the soak's roles run: each server (the balancer and its reals too) on the plan's
/// server CPU, the valid client and the hostile ones on its generator CPU.
fn cpu_plan() -> CpuPlan {
    crate::plan::server_and_generator(&netlane::cpus::machine::CpuTopology::read())
}

/// The CPUs of the soak's two sides, from its plan.
#[derive(Debug, Clone)]
struct Cpus {
    /// The server's processes.
    server: Vec<usize>,
    /// The valid client's process and the hostile clients' threads.
    clients: Vec<usize>,
}

impl Cpus {
    fn of(plan: &CpuPlan) -> Cpus {
        Cpus { server: plan.cpus(Role::Server).to_vec(), clients: plan.cpus(Role::Generator).to_vec() }
    }

    /// Pins the calling thread (and so every thread it starts) to the clients' CPU.
    fn pin_client_thread(&self) {
        netlane::cpus::pin(self.clients.first().copied());
    }
}

impl SoakArgs {
    /// The defaults, as `netlane bench soak` has them.
    pub fn defaults() -> SoakArgs {
        super::from_words(&[]).expect("the defaults parse")
    }

    fn max_connections(&self) -> usize {
        self.hostile_connections + VALID_CONNECTIONS + 16
    }
}

impl Scenario for SoakArgs {
    fn name(&self) -> &'static str {
        "soak"
    }

    fn options(&self) -> OptionList {
        let servers: Vec<String> = self.servers.iter().map(|s| s.name()).collect();
        self.on
            .listed(OptionList::new())
            .words("servers", &servers)
            .duration("time", self.time)
            .int("hostile-connections", self.hostile_connections as u64)
            .int("p99-ms", self.p99_ms)
            .int("growth-mib", self.growth_mib)
    }

    fn validate(&self) -> Result<()> {
        if self.servers.is_empty() {
            bail!("no servers to soak (--servers)");
        }
        if self.time < Duration::from_secs(3) {
            bail!("--time {:?} is too short to see memory settle; at least 3s", self.time);
        }
        if !(1..=4096).contains(&self.hostile_connections) {
            bail!("--hostile-connections must be 1..=4096");
        }
        if let Some(t) = self.on.open()? {
            return self.check_testbed(&t);
        }
        if !nix::unistd::geteuid().is_root() {
            bail!("the soak runs each server in a network namespace of its own: run as root");
        }
        Ok(())
    }

    fn runs(&self) -> usize {
        self.servers.len()
    }

    fn run(&self, progress: &dyn Progress) -> Result<ScenarioReport> {
        if let Some(t) = self.on.open()? {
            return self.run_on_testbed(&t, progress);
        }
        let plan = cpu_plan();
        let cpus = Cpus::of(&plan);
        let mut soaks = Vec::new();
        for &server in &self.servers {
            progress.start(&server.name());
            let s = self.soak(server, &cpus).with_context(|| format!("soak of {}", server.name()))?;
            progress.finish(&server.name(), &s.summary());
            soaks.push(s);
        }
        Ok(self.report(&soaks, plan.view()))
    }
}

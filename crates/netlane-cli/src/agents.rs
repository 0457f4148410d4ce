//! `--agents`: the hosts a client command drives its load from (over SSH), shared by
//! `kv load`, `rr clients` and `nvme perf`.

use anyhow::{Context, Result};
use clap::Args;
use netlane_lab::host::{Agent, SshHost, SshSpec};

/// Where the load comes from when it is not this process.
#[derive(Debug, Clone, Args)]
pub struct AgentHostsArgs {
    /// Drive the load from these hosts instead (SSH destinations, comma-separated; the
    /// same netlane version must be on each): each runs this command as an `--agent`
    /// (which says what part of the load each gets), all start together, and their
    /// latency histograms are merged exactly into one result.
    #[arg(long, value_delimiter = ',', value_name = "HOST,...", conflicts_with = "agent")]
    pub agents: Vec<String>,
    /// The ssh configuration file for --agents (ssh -F) [default: the user's].
    #[arg(long, value_name = "FILE")]
    pub ssh_config: Option<std::path::PathBuf>,
    /// The netlane executable on the --agents hosts (a bare name: found on their PATH).
    #[arg(long, default_value = "netlane", value_name = "PATH")]
    pub agent_netlane: String,
    /// Where an --agents host has no netlane of this version, copy this one there (over
    /// SSH, into ~/.cache/netlane/) and use that.
    #[arg(long)]
    pub deploy: bool,
}

impl AgentHostsArgs {
    /// Whether the load comes from other hosts.
    pub fn any(&self) -> bool {
        !self.agents.is_empty()
    }

    /// Every host of `--agents`, connected, its netlane checked (or deployed).
    pub fn connect(&self) -> Result<AgentHosts> {
        let exe =
            if self.deploy { Some(std::env::current_exe().context("find the netlane executable")?) } else { None };
        let hosts = self
            .agents
            .iter()
            .map(|d| {
                let spec = SshSpec {
                    destination: d.clone(),
                    config: self.ssh_config.clone(),
                    netlane: self.agent_netlane.clone(),
                    deploy: exe.clone(),
                };
                SshHost::connect(&spec).with_context(|| format!("agent {d}"))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(AgentHosts { hosts })
    }
}

/// The agents' hosts, connected.
pub struct AgentHosts {
    hosts: Vec<SshHost>,
}

impl AgentHosts {
    /// One agent on each host, its CPUs as the command line says.
    pub fn agents(&self) -> Vec<Agent<'_>> {
        self.hosts.iter().map(|h| Agent { host: h, cpus: Vec::new() }).collect()
    }
}

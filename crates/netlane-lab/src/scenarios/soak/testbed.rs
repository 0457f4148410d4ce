//! The soak across machines: each server on the testbed's server host at its address,
//! its memory and descriptors sampled there by its supervisor; the valid client on the
//! first client host, the hostile clients (`netlane hostile`) on the last. The NVMe
//! target's file is made on the server host and removed after; its kill and restart
//! happen there.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use netlane_report::ScenarioReport;

use super::measure::{LISTENING, Soak, read_back, run_client, start_server, words};
use super::{Cpus, SoakArgs, SoakServer};
use crate::host::{Program, RoleProcess, RoleSpec};
use crate::progress::Progress;
use crate::testbed::{Needs, Testbed, TestbedHost};

impl SoakArgs {
    /// Refuses what a testbed cannot soak: the balancer alone (it builds its network on
    /// one machine).
    pub(super) fn check_testbed(&self, t: &Testbed) -> Result<()> {
        if self.servers.iter().all(|s| *s == SoakServer::Lb) {
            bail!("--servers lb: not on a testbed (the balancer's soak builds its own network on this machine)");
        }
        t.check(&Needs::default(), &Needs::default())
    }

    pub(super) fn run_on_testbed(&self, t: &Testbed, progress: &dyn Progress) -> Result<ScenarioReport> {
        let cpus = Cpus { server: t.server.pinned(), clients: t.clients[0].pinned() };
        let nic = t.hold_nic()?;
        let mut soaks = Vec::new();
        for &server in self.servers.iter().filter(|s| **s != SoakServer::Lb) {
            progress.start(&server.name());
            let s = self.soak_across(t, server, &cpus).with_context(|| format!("soak of {}", server.name()))?;
            progress.finish(&server.name(), &s.summary());
            soaks.push(s);
        }
        let mut report = self.report(&soaks, t.cpu_plan(&cpus.server));
        let hostile = t.clients.last().map_or_else(String::new, |h| h.label());
        let mut notes = vec![format!(
            "Ran on a testbed: each server on {} at {}, its memory and descriptors sampled there; the valid client \
             on {}, the hostile clients on {hostile}.",
            t.server.label(),
            t.server_addr(),
            t.clients[0].label()
        )];
        if self.servers.contains(&SoakServer::Lb) {
            notes.push("Left out on this testbed: lb (its soak builds its own network on one machine).".into());
        }
        report.notes.splice(0..0, notes);
        report.notes.extend(nic.finish());
        Ok(report)
    }

    fn soak_across(&self, t: &Testbed, server: SoakServer, cpus: &Cpus) -> Result<Soak> {
        let addr = SocketAddr::new(t.server_addr(), server.port());
        let dir = RemoteDir::make(&t.server)?;
        let (server_args, client_args) = self.commands(server, &dir.path, cpus, addr)?;
        let target = start_server(t.server.host(), &server_args, LISTENING, &[], &cpus.server)?;
        let hostile_host = t.clients.last().context("the testbed has no client host")?;
        let hold = self.hostile_connections.to_string();
        let time = format!("{}ms", self.time.as_millis());
        let hostile_args =
            words(&["hostile", &server.name(), "--addr", &addr.to_string(), "--connections", &hold, "-t", &time]);
        let hostile_spec =
            RoleSpec::netlane("the hostile clients", hostile_args.into_iter().chain(words(&["--json", "-"])))
                .on_cpus(&hostile_host.pinned());
        let hostile = RoleProcess::start(hostile_host.host(), &hostile_spec, None)?;
        let limit = self.time + Duration::from_secs(60);
        let valid = run_client(t.clients[0].host(), &client_args, server, limit, &cpus.clients);
        let hostile_ops = hostile
            .wait(limit)
            .and_then(|done| {
                let doc: serde_json::Value = done.json()?;
                doc.pointer("/operations").and_then(serde_json::Value::as_u64).context("no `operations` in its report")
            })
            .context("the hostile clients")?;
        let samples = target.samples();
        let valid = valid?;
        let read_back = (server == SoakServer::Nvme)
            .then(|| read_back((t.server.host(), t.clients[0].host()), &server_args, target, cpus, addr));
        Ok(Soak {
            server,
            samples,
            valid,
            hostile_ops,
            fd_limit: self.max_connections() as u64 + 64,
            read_back,
            edits: None,
            forwarding: None,
            path: "testbed",
        })
    }
}

/// A directory made on a host for a soak's files, held by a shell there that removes it
/// when it ends: when this is dropped, or when the lab dies (its session's end stops the
/// shell with SIGTERM).
struct RemoteDir {
    shell: Option<RoleProcess>,
    path: String,
}

/// The shell: makes the directory, says where, waits; removes it on its way out.
const DIR_KEEPER: &str = "d=$(mktemp -d /tmp/netlane-soak-XXXXXX) || exit 1; \
    trap 'rm -rf \"$d\"' EXIT; trap 'exit 0' TERM INT HUP; echo \"$d\"; while :; do sleep 1; done";

impl RemoteDir {
    fn make(host: &TestbedHost) -> Result<RemoteDir> {
        let spec = RoleSpec::program("the soak's directory", Program::Other("sh".into()), ["-c", DIR_KEEPER])
            .ready_when("/tmp/netlane-soak-", Duration::from_secs(20));
        let shell = RoleProcess::start(host.host(), &spec, None)?;
        let path = shell.first_line().trim().to_string();
        Ok(RemoteDir { shell: Some(shell), path })
    }
}

impl Drop for RemoteDir {
    fn drop(&mut self) {
        if let Some(shell) = self.shell.take()
            && let Err(e) = shell.end_with(nix::sys::signal::Signal::SIGTERM, Duration::from_secs(10))
        {
            tracing::warn!(error = %format!("{e:#}"), dir = %self.path, "the soak's directory may be left behind");
        }
    }
}

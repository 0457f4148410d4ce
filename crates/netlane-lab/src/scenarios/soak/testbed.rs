//! The soak across machines: each server on the testbed's server host at its address,
//! its memory and descriptors sampled there by its supervisor; the valid client on the
//! first client host, the hostile clients (`netlane hostile`) on the last. The NVMe
//! target's file is made on the server host and removed after; its kill and restart
//! happen there.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use netlane_report::ScenarioReport;

use super::measure::{LISTENING, Soak, read_back, run_client, samples, start_server, words};
use super::{Cpus, SoakArgs, SoakServer};
use crate::host::{RoleProcess, RoleSpec};
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
        let samples = samples(&target);
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
        })
    }
}

/// A directory made on a host for a soak's files, removed (with them) when dropped.
struct RemoteDir<'a> {
    host: &'a TestbedHost,
    path: String,
}

impl<'a> RemoteDir<'a> {
    fn make(host: &'a TestbedHost) -> Result<RemoteDir<'a>> {
        let out = host.host().run(&words(&["mktemp", "-d", "/tmp/netlane-soak-XXXXXX"]))?;
        let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !out.status.success() || !path.starts_with("/tmp/netlane-soak-") {
            bail!("make a directory on {}: {}", host.label(), String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(RemoteDir { host, path })
    }
}

impl Drop for RemoteDir<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.host.host().run(&words(&["rm", "-rf", "--", &self.path])) {
            tracing::warn!(error = %format!("{e:#}"), dir = %self.path, "could not remove the soak's directory");
        }
    }
}

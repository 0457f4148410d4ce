//! The rr scenario's roles as processes: `netlane rr serve` for a [`ServerConfig`] and
//! `netlane rr clients` for a [`ClientsConfig`], their results read from their JSON.

use std::time::Duration;

use anyhow::{Context, Result};
use netlane_rr::clients::{ClientsConfig, ClientsReport, Load};
use netlane_rr::proto::wire::HEADER_LEN;
use netlane_rr::server::{ServerConfig, ServerStats};
use serde::Deserialize;

use crate::host::{Args, Finished, RoleSpec};

/// The arguments after `netlane` that serve `cfg`: every option the command line has,
/// written out, so the process serves exactly `cfg` whatever the defaults become (the
/// command line's tests read them back into the same configuration).
pub fn serve_args(cfg: &ServerConfig) -> Vec<String> {
    let mut a = Args::new(&["rr", "serve", "--json", "-"]);
    let (r, ring, x) = (&cfg.responder, &cfg.ring, &cfg.xdp);
    a.opt("listen", cfg.listen).opt("path", cfg.path).opt("batch", cfg.batch).opt("tx", cfg.tx);
    if let Some(p) = &cfg.pace {
        a.opt("pace", p.rate).duration("pace-quantum", p.quantum).opt("pace-queue", p.queue);
    }
    a.opt_some("segment", r.segment)
        .opt("max-response", r.max_response)
        .opt("unverified-ratio", cfg.guard.ratio)
        .opt("unverified-budget", cfg.guard.budget)
        .opt_some("cpu", cfg.cpu)
        .opt_some("lane-device", cfg.lane_device.as_ref())
        .opt_some("iface", cfg.iface.as_ref())
        .opt_some("busy-poll", cfg.busy_poll)
        .napi(&cfg.napi)
        .opt("frame-size", ring.frame_size)
        .opt("frames", ring.frames)
        .opt("frames-per-block", ring.frames_per_block)
        .opt("blocks", ring.blocks)
        .opt("retire-ms", ring.retire_ms)
        .opt("xdp-frames", x.frames)
        .opt("xdp-frame-size", x.frame_size)
        .opt("xdp-ring", x.ring_size)
        .flag("echo", r.echo)
        .flag("adaptive", ring.adaptive)
        .flag("xdp-copy", !x.zero_copy)
        .opt("transport", cfg.transport)
        .opt("max-connections", cfg.max_connections);
    if let Some(t) = cfg.duration {
        a.duration("time", t);
    }
    a.into_vec()
}

/// `netlane rr serve` for `cfg` on the CPUs it is pinned to (its thread's CPU), ready
/// when it says it listens.
pub fn serve_spec(cfg: &ServerConfig) -> RoleSpec {
    let spec = RoleSpec::netlane("netlane rr serve", serve_args(cfg))
        .ready_on_stderr("listening on ", Duration::from_secs(10));
    match cfg.cpu {
        Some(c) => spec.on_cpus(&[c]),
        None => spec,
    }
}

/// The server's final counters, from the JSON document it wrote when it stopped.
pub fn server_stats(f: &Finished) -> Result<ServerStats> {
    #[derive(Deserialize)]
    struct RrServe {
        stats: ServerStats,
    }
    Ok(f.json::<RrServe>().context("read the rr server's final counters")?.stats)
}

/// The arguments after `netlane` that run the population `cfg`, every option written out
/// (the command line's tests read them back into the same configuration).
pub fn clients_args(cfg: &ClientsConfig) -> Vec<String> {
    let mut a = Args::new(&["rr", "clients", "--json", "-"]);
    let c = &cfg.client;
    a.opt("server", cfg.server)
        .opt("clients", cfg.clients)
        .opt("threads", cfg.threads)
        .opt_some("cpus", cfg.cpus.as_ref())
        .opt("request", c.request_len)
        .opt("response", c.response_len as usize + HEADER_LEN);
    match cfg.load {
        Load::Closed { think } => a.duration("think", think),
        Load::Open { rate } => a.opt("rate", rate).opt("in-flight", c.max_outstanding),
    };
    a.duration("timeout", std::time::Duration::from_nanos(c.timeout_ns))
        .opt("retries", c.max_retries)
        .duration("time", cfg.duration)
        .duration("ramp", cfg.ramp)
        .opt("seed", cfg.seed)
        .flag("echo", c.echo)
        .flag("gro", cfg.gro)
        .opt("transport", cfg.transport);
    a.into_vec()
}

/// `netlane rr clients` for `cfg`, pinned to the CPUs its threads are.
pub fn clients_spec(cfg: &ClientsConfig) -> RoleSpec {
    pinned(RoleSpec::netlane("netlane rr clients", clients_args(cfg)), cfg)
}

/// `netlane rr clients --agent` for `cfg`, called `name`: ready when it says so (its
/// sockets made), it starts on SIGUSR1.
pub fn agent_spec(name: &str, cfg: &ClientsConfig) -> RoleSpec {
    let mut args = clients_args(cfg);
    args.push("--agent".into());
    pinned(RoleSpec::netlane(name, args), cfg).ready_on_stderr("ready", Duration::from_secs(30))
}

fn pinned(spec: RoleSpec, cfg: &ClientsConfig) -> RoleSpec {
    match &cfg.cpus {
        Some(cpus) => spec.on_cpus(cpus.as_slice()),
        None => spec,
    }
}

/// What the population measured, from the JSON document it wrote (also when it
/// exited with an error because no response came: the report says what went wrong).
pub fn clients_report(f: &Finished) -> Result<ClientsReport> {
    #[derive(Deserialize)]
    struct RrClients {
        report: ClientsReport,
    }
    Ok(f.json::<RrClients>().context("read the rr clients' report")?.report)
}

//! The rr scenario's roles as processes: `netlane rr serve` for a [`ServerConfig`] and
//! `netlane rr clients` for a [`ClientsConfig`], their results read from their JSON.

use std::time::Duration;

use anyhow::{Context, Result};
use netlane_rr::clients::{ClientsConfig, ClientsReport, Load};
use netlane_rr::proto::wire::HEADER_LEN;
use netlane_rr::server::{ServerConfig, ServerStats};
use serde::Deserialize;

use crate::host::{Finished, RoleSpec};

/// The arguments after `netlane` that serve `cfg`: every option the command line has,
/// written out, so the process serves exactly `cfg` whatever the defaults become (the
/// command line's tests read them back into the same configuration).
pub fn serve_args(cfg: &ServerConfig) -> Vec<String> {
    let mut a: Vec<String> = ["rr", "serve", "--json", "-"].map(String::from).to_vec();
    let mut opt = |name: &str, value: String| {
        a.push(format!("--{name}"));
        a.push(value);
    };
    let r = &cfg.responder;
    opt("listen", cfg.listen.to_string());
    opt("path", cfg.path.to_string());
    opt("batch", cfg.batch.to_string());
    opt("tx", cfg.tx.to_string());
    if let Some(p) = &cfg.pace {
        opt("pace", p.rate.to_string());
        opt("pace-quantum", format!("{}ns", p.quantum.as_nanos()));
        opt("pace-queue", p.queue.to_string());
    }
    if let Some(s) = r.segment {
        opt("segment", s.to_string());
    }
    opt("max-response", r.max_response.to_string());
    opt("unverified-ratio", cfg.guard.ratio.to_string());
    opt("unverified-budget", cfg.guard.budget.to_string());
    if let Some(c) = cfg.cpu {
        opt("cpu", c.to_string());
    }
    if let Some(d) = &cfg.lane_device {
        opt("lane-device", d.clone());
    }
    if let Some(i) = &cfg.iface {
        opt("iface", i.clone());
    }
    let ring = &cfg.ring;
    opt("frame-size", ring.frame_size.to_string());
    opt("frames", ring.frames.to_string());
    opt("frames-per-block", ring.frames_per_block.to_string());
    opt("blocks", ring.blocks.to_string());
    opt("retire-ms", ring.retire_ms.to_string());
    let x = &cfg.xdp;
    opt("xdp-frames", x.frames.to_string());
    opt("xdp-frame-size", x.frame_size.to_string());
    opt("xdp-ring", x.ring_size.to_string());
    if let Some(t) = cfg.duration {
        opt("time", format!("{}ns", t.as_nanos()));
    }
    for (flag, on) in [("echo", r.echo), ("adaptive", ring.adaptive), ("xdp-copy", !x.zero_copy)] {
        if on {
            a.push(format!("--{flag}"));
        }
    }
    a
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
    let mut a: Vec<String> = ["rr", "clients", "--json", "-"].map(String::from).to_vec();
    let mut opt = |name: &str, value: String| {
        a.push(format!("--{name}"));
        a.push(value);
    };
    let c = &cfg.client;
    opt("server", cfg.server.to_string());
    opt("clients", cfg.clients.to_string());
    opt("threads", cfg.threads.to_string());
    if let Some(cpus) = &cfg.cpus {
        opt("cpus", cpus.to_string());
    }
    opt("request", c.request_len.to_string());
    opt("response", (c.response_len as usize + HEADER_LEN).to_string());
    match cfg.load {
        Load::Closed { think } => opt("think", format!("{}ns", think.as_nanos())),
        Load::Open { rate } => {
            opt("rate", rate.to_string());
            opt("in-flight", c.max_outstanding.to_string());
        }
    }
    opt("timeout", format!("{}ns", c.timeout_ns));
    opt("retries", c.max_retries.to_string());
    opt("time", format!("{}ns", cfg.duration.as_nanos()));
    opt("ramp", format!("{}ns", cfg.ramp.as_nanos()));
    for (flag, on) in [("echo", c.echo), ("gro", cfg.gro)] {
        if on {
            a.push(format!("--{flag}"));
        }
    }
    a
}

/// `netlane rr clients` for `cfg`, pinned to the CPUs its threads are.
pub fn clients_spec(cfg: &ClientsConfig) -> RoleSpec {
    let spec = RoleSpec::netlane("netlane rr clients", clients_args(cfg));
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

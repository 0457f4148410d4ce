//! The bodies of the JSON documents the other commands write (`probe`, `lb check`,
//! `lb run`, `nvme perf`, `nvme target`, `rr serve`, `rr clients`, `kv serve`, `kv load`, `bulk send`, `bulk recv`, `hostile`; `compare`'s is in `netlane_report`), and the JSON Schema of every
//! document kind.
//! Each is wrapped in a [`netlane_report::Document`]: the same header everywhere.

use schemars::JsonSchema;
use serde::Serialize;

/// `netlane lb check --json`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct LbCheck {
    /// The configuration file.
    pub config: String,
    /// Maglev slots per VIP.
    pub ring_size: u32,
    /// Connection-table entries (per CPU).
    pub conn_entries: u32,
    /// Every VIP's ring shares.
    pub vips: Vec<netlane_lb::proto::config::VipShares>,
}

/// `netlane lb run --json` (and `lb decap`): the balancer's last counters.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct LbRun {
    /// Seconds it served.
    pub seconds: f64,
    /// The last statistics (none for `lb decap`).
    pub stats: Option<netlane_lb::LbStats>,
    /// The attach mode (native, generic).
    pub mode: String,
}

/// `netlane hostile --json`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Hostile {
    /// The kind of server.
    pub server: String,
    /// Its address.
    pub addr: String,
    /// Seconds the clients ran.
    pub seconds: f64,
    /// Connections made and messages sent.
    pub operations: u64,
}

/// `netlane nvme perf --json`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct NvmePerf {
    /// The resolved options, typed, units in the keys.
    pub options: serde_json::Map<String, serde_json::Value>,
    /// The same options as `key=value` the command line reads back.
    pub echo: Vec<String>,
    /// What the run measured (with --agents: every agent's run merged).
    pub report: netlane_nvme::perf::PerfReport,
    /// An agent's groups' latency histograms (with --agent).
    pub agent: Option<netlane_nvme::perf::AgentOutput>,
    /// Each agent's part of the run (with --agents).
    pub agents: Option<Vec<netlane_lab::scenarios::nvme::NvmeAgent>>,
    /// The SLA, when one was given: every group's main direction judged by it.
    pub sla: Option<String>,
    /// Whether every group held it.
    pub sla_met: Option<bool>,
}

/// `netlane nvme target --json`: the final counters.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct NvmeTarget {
    /// The address it listened on.
    pub listen: String,
    /// The subsystem NQN.
    pub nqn: String,
    /// Namespace specifications, NSID 1 first.
    pub namespaces: Vec<String>,
    /// Seconds it served.
    pub seconds: f64,
    /// The counters.
    pub stats: netlane_nvme::target::TargetStats,
}

/// `netlane rr serve --json`: the server's final counters.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct RrServe {
    /// The counters.
    pub stats: netlane_rr::server::ServerStats,
}

/// `netlane rr clients --json`: what the client population measured.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct RrClients {
    /// The measurements.
    pub report: netlane_rr::clients::ClientsReport,
    /// An agent's latency histogram (with --agent).
    pub agent: Option<netlane_rr::clients::AgentOutput>,
    /// Each agent's part of the run (with --agents; empty when one host ran the whole
    /// population, which is then the report itself).
    pub agents: Option<Vec<netlane_lab::scenarios::rr::RrAgent>>,
    /// The SLA, when one was given.
    pub sla: Option<String>,
    /// Whether the run held it.
    pub sla_met: Option<bool>,
    /// The latency at the SLA's percentile, ns (null: among requests without an answer).
    pub sla_latency_ns: Option<u64>,
}

/// `netlane kv serve --json`: the server's final counters.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct KvServe {
    /// The counters.
    pub stats: netlane_kv::server::ServerStats,
}

/// `netlane kv load --json`: one run, a rate search, or a warm-up alone.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct KvLoad {
    /// The resolved options, typed.
    pub options: serde_json::Map<String, serde_json::Value>,
    /// The same options as `key=value` the command line reads back.
    pub echo: Vec<String>,
    /// The run (null with --search or --warmup-only).
    pub report: Option<netlane_kv::loadgen::LoadReport>,
    /// The SLA, when one was given.
    pub sla: Option<String>,
    /// Whether the run held the SLA (without --search).
    pub sla_met: Option<bool>,
    /// The latency at the SLA's percentile, ns (null: among failed requests).
    pub sla_latency_ns: Option<u64>,
    /// The search (with --search).
    pub search: Option<netlane_kv::loadgen::SearchReport>,
    /// Keys stored before the run (null with --no-warmup).
    pub warmed_up_keys: Option<u64>,
    /// An agent's run whole: every counter and the latency histogram (with --agent).
    pub agent: Option<netlane_kv::loadgen::AgentOutput>,
    /// Each run's agents: host, connections, rates, lag, CPU (with --agents).
    pub agents: Option<Vec<netlane_lab::scenarios::kv::AgentsStep>>,
}

/// `netlane bulk send --json`: what the sender did.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct BulkSend {
    /// The receiver's address.
    pub to: String,
    /// What it did.
    pub report: netlane_bulk::TxReport,
}

/// `netlane bulk recv --json`: what arrived.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct BulkRecv {
    /// The address it received on.
    pub listen: String,
    /// What it saw.
    pub report: netlane_bulk::RxReport,
}

/// Every document kind and its JSON Schema (draft 2020-12), named as in `docs/schema/`.
#[cfg(test)]
fn schemas() -> Vec<(&'static str, serde_json::Value)> {
    use netlane_report::{Document, Results};
    let s = |v: schemars::Schema| v.to_value();
    vec![
        ("results", s(schemars::schema_for!(Document<Results>))),
        ("probe", s(schemars::schema_for!(Document<netlane::probe::ProbeReport>))),
        ("nic-show", s(schemars::schema_for!(Document<netlane::nic::NicView>))),
        ("nic-try", s(schemars::schema_for!(Document<netlane::nic::Tried>))),
        ("nic-hold", s(schemars::schema_for!(Document<netlane::nic::Tried>))),
        ("hostile", s(schemars::schema_for!(Document<Hostile>))),
        ("compare", s(schemars::schema_for!(Document<netlane_report::compare::Comparison>))),
        ("lb-check", s(schemars::schema_for!(Document<LbCheck>))),
        ("lb-run", s(schemars::schema_for!(Document<LbRun>))),
        ("nvme-perf", s(schemars::schema_for!(Document<NvmePerf>))),
        ("nvme-target", s(schemars::schema_for!(Document<NvmeTarget>))),
        ("rr-serve", s(schemars::schema_for!(Document<RrServe>))),
        ("rr-clients", s(schemars::schema_for!(Document<RrClients>))),
        ("kv-serve", s(schemars::schema_for!(Document<KvServe>))),
        ("kv-load", s(schemars::schema_for!(Document<KvLoad>))),
        ("bulk-send", s(schemars::schema_for!(Document<BulkSend>))),
        ("bulk-recv", s(schemars::schema_for!(Document<BulkRecv>))),
    ]
}

/// `docs/schema/` holds the JSON Schema of every document netlane writes, generated from
/// the types above. This test fails when they are stale; to regenerate:
/// `NETLANE_WRITE_SCHEMA=1 cargo test -p netlane-cli documents`.
#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// Every `description` in a schema.
    fn descriptions(v: &serde_json::Value) -> Vec<String> {
        match v {
            serde_json::Value::Object(m) => m
                .iter()
                .flat_map(|(k, v)| match (k.as_str(), v) {
                    ("description", serde_json::Value::String(d)) => vec![d.clone()],
                    _ => descriptions(v),
                })
                .collect(),
            serde_json::Value::Array(a) => a.iter().flat_map(descriptions).collect(),
            _ => Vec::new(),
        }
    }

    #[test]
    fn the_schemas_in_docs_are_generated_from_the_types() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/schema");
        let write = std::env::var("NETLANE_WRITE_SCHEMA").as_deref() == Ok("1");
        let mut stale = Vec::new();
        for (name, schema) in schemas() {
            let path = dir.join(format!("{name}.schema.json"));
            let text = serde_json::to_string_pretty(&schema).unwrap() + "\n";
            if write {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&path, &text).unwrap();
            } else if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
                stale.push(path.display().to_string());
            }
            // Every schema is itself valid.
            jsonschema::validator_for(&schema).unwrap_or_else(|e| panic!("{name}: {e}"));
            // Descriptions are for readers of JSON: no Rust intra-doc links.
            for d in descriptions(&schema) {
                let path = d.match_indices("::").any(|(i, _)| {
                    d[..i].ends_with(|c: char| c.is_alphanumeric()) && d[i + 2..].starts_with(char::is_alphabetic)
                });
                assert!(!d.contains("[`") && !d.contains("`]") && !path, "{name}: Rust markup in {d:?}");
            }
        }
        assert!(
            stale.is_empty(),
            "stale or missing: {stale:?}; regenerate with NETLANE_WRITE_SCHEMA=1 cargo test -p netlane-cli documents"
        );
    }
}

//! netlane's output contract: what every command writes and how.
//!
//! - `model` (re-exported here): the report model, numbers and words, no markup;
//!   [`Document`] is the header every JSON document carries;
//! - [`terminal`] and [`csv`]: writers; JSON is [`to_json`]; [`format`](mod@format): how numbers
//!   read;
//! - [`options`]: resolved options shown two ways (typed JSON, `key=value` echo) and the
//!   command-line value parsers (durations, sizes, rates);
//! - [`provenance`]: what built the numbers and on what;
//! - [`compare`]: two results documents side by side, noise-aware.
//!
//! The CLI, the servers and the lab share it; the lab adds only its HTML page and charts.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod compare;
pub mod csv;
pub mod format;
mod model;
pub mod options;
pub mod provenance;
pub mod terminal;

use serde::Serialize;

pub use model::*;

/// A document of `kind` for this invocation, on this machine.
pub fn document<T>(kind: &str, body: T) -> Document<T> {
    Document {
        schema_version: SCHEMA_VERSION,
        kind: kind.into(),
        provenance: provenance::provenance(std::env::args().collect()),
        host: provenance::host(),
        body,
    }
}

/// Pretty JSON of any document.
pub fn to_json<T: Serialize>(doc: &Document<T>) -> String {
    // The model holds only strings, numbers, maps and sequences: it always serializes.
    serde_json::to_string_pretty(doc).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

//! What scenarios produce ([`model`]: numbers, not markup) and how it is written out:
//! [`terminal`] text, JSON ([`Document`], with a schema generated from the types),
//! [`csv`], and the [`html`] page with [`svg`] charts.

pub mod csv;
pub mod documents;
pub mod format;
pub mod html;
mod model;
pub mod svg;
pub mod terminal;

use std::path::{Path, PathBuf};

use serde::Serialize;

pub use model::*;

/// Why a report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// A file.
    #[error("write {path}: {source}")]
    Io {
        /// Which file.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: std::io::Error,
    },
    /// A CSV file.
    #[error(transparent)]
    Csv(#[from] csv::CsvError),
}

/// A document of `kind` for this invocation, on this machine.
pub fn document<T>(kind: &str, body: T) -> Document<T> {
    Document {
        schema_version: SCHEMA_VERSION,
        kind: kind.into(),
        provenance: crate::machine::provenance(std::env::args().collect()),
        host: crate::machine::host(),
        body,
    }
}

/// Pretty JSON of any document.
pub fn to_json<T: Serialize>(doc: &Document<T>) -> String {
    // The model holds only strings, numbers, maps and sequences: it always serializes.
    serde_json::to_string_pretty(doc).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

fn write(path: &Path, text: &str) -> Result<PathBuf, WriteError> {
    std::fs::write(path, text).map_err(|source| WriteError::Io { path: path.to_path_buf(), source })?;
    Ok(path.to_path_buf())
}

/// Writes a report directory (which must exist): `index.html`, `results.json`, one
/// JSON per scenario (the same document with that scenario alone), one CSV per table
/// plus `runs.csv` and `checks.csv`, and `charts/*.svg`. Returns the files written.
pub fn write_dir(dir: &Path, doc: &Document<Results>) -> Result<Vec<PathBuf>, WriteError> {
    let mut files =
        vec![write(&dir.join("index.html"), &html::page(doc))?, write(&dir.join("results.json"), &to_json(doc))?];
    for s in &doc.body.scenarios {
        let one = Document {
            schema_version: doc.schema_version,
            kind: doc.kind.clone(),
            provenance: doc.provenance.clone(),
            host: doc.host.clone(),
            body: Results {
                machine: doc.body.machine.clone(),
                summary: Tally::of(&s.checks),
                scenarios: vec![s.clone()],
            },
        };
        files.push(write(&dir.join(format!("{}.json", s.name)), &to_json(&one))?);
    }
    files.extend(csv::write_all(dir, &doc.provenance.run_id, &doc.body.scenarios)?);
    let charts = dir.join("charts");
    let has_charts = doc.body.scenarios.iter().any(|s| !s.charts.is_empty());
    if has_charts {
        std::fs::create_dir_all(&charts).map_err(|source| WriteError::Io { path: charts.clone(), source })?;
    }
    for s in &doc.body.scenarios {
        for c in &s.charts {
            match svg::render(c) {
                Ok(text) => files.push(write(&charts.join(format!("{}.svg", c.name)), &text)?),
                Err(e) => tracing::warn!(chart = c.name, error = e, "chart could not be drawn"),
            }
        }
    }
    Ok(files)
}

//! The lab's report directory: the [`html`] page with [`svg`] charts beside the JSON
//! and CSV that `netlane_report` writes (the model and those writers live there, shared
//! with every other command).

pub mod html;
pub mod svg;

use std::path::{Path, PathBuf};

use netlane_report::{Document, Results, Tally, csv, to_json};

/// Why a report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// A file.
    #[error("write {path}")]
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
                quick: doc.body.quick,
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

//! CSV: one file per table, plus every run and every check, in a directory. Columns
//! are typed and unit-free (the unit is in the column's key, `tx_mb_per_s`), missing
//! values are empty, and every row starts with the invocation's `run_id`, so files of
//! several runs can be concatenated.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::format;
use crate::model::{ScenarioReport, Table, Value};

/// Why writing failed.
#[derive(Debug, thiserror::Error)]
pub enum CsvError {
    /// The file.
    #[error("write {path}")]
    Write {
        /// Which file.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: csv::Error,
    },
}

fn writer(path: &Path) -> Result<csv::Writer<std::fs::File>, CsvError> {
    csv::Writer::from_path(path).map_err(|source| CsvError::Write { path: path.to_path_buf(), source })
}

fn cell(v: &Value) -> String {
    match v {
        Value::Num(x) if x.is_finite() => x.to_string(),
        Value::Int(i) => i.to_string(),
        Value::Text(t) => t.clone(),
        _ => String::new(),
    }
}

fn opt(v: Option<f64>) -> String {
    v.filter(|x| x.is_finite()).map(|x| x.to_string()).unwrap_or_default()
}

/// Writes one table as `<dir>/<table>.csv`.
pub fn write_table(dir: &Path, run_id: &str, t: &Table) -> Result<PathBuf, CsvError> {
    let path = dir.join(format!("{}.csv", t.name));
    let err = |source| CsvError::Write { path: path.clone(), source };
    let mut w = writer(&path)?;
    let mut header = vec!["run_id".to_string()];
    header.extend(t.columns.iter().map(|c| c.key.clone()));
    header.push("footnote".into());
    w.write_record(&header).map_err(err)?;
    let notes = t.footnotes();
    for r in &t.rows {
        let mut rec = vec![run_id.to_string()];
        rec.extend(r.cells.iter().map(cell));
        rec.push(r.footnote.as_ref().filter(|n| notes.contains(n)).cloned().unwrap_or_default());
        w.write_record(&rec).map_err(err)?;
    }
    w.flush().map_err(|e| err(e.into()))?;
    Ok(path)
}

/// Writes every table of `scenarios`, and `runs.csv` and `checks.csv` for all of them,
/// into `dir` (which must exist). Returns the files written.
pub fn write_all(dir: &Path, run_id: &str, scenarios: &[ScenarioReport]) -> Result<Vec<PathBuf>, CsvError> {
    let mut files = Vec::new();
    for s in scenarios {
        for t in &s.tables {
            files.push(write_table(dir, run_id, t)?);
        }
    }
    // Every run: one column per metric any run has.
    let path = dir.join("runs.csv");
    let err = |source| CsvError::Write { path: path.clone(), source };
    let mut w = writer(&path)?;
    let keys: BTreeSet<&str> =
        scenarios.iter().flat_map(|s| s.runs.iter().flat_map(|r| r.metrics.keys().map(String::as_str))).collect();
    let mut header: Vec<String> = ["run_id", "scenario", "index", "round", "label"].map(String::from).to_vec();
    header.extend(keys.iter().map(|k| k.to_string()));
    header.push("path".into());
    w.write_record(&header).map_err(err)?;
    for s in scenarios {
        for r in &s.runs {
            let mut rec =
                vec![run_id.to_string(), s.name.clone(), r.index.to_string(), r.round.to_string(), r.label.clone()];
            rec.extend(keys.iter().map(|k| opt(r.metrics.get(*k).copied())));
            rec.push(r.path.join("; "));
            w.write_record(&rec).map_err(err)?;
        }
    }
    w.flush().map_err(|e| err(e.into()))?;
    files.push(path);
    // Every check.
    let path = dir.join("checks.csv");
    let err = |source| CsvError::Write { path: path.clone(), source };
    let mut w = writer(&path)?;
    w.write_record([
        "run_id",
        "scenario",
        "id",
        "name",
        "outcome",
        "op",
        "target",
        "target_upper",
        "unit",
        "median",
        "min",
        "max",
        "samples",
        "reason",
    ])
    .map_err(err)?;
    for s in scenarios {
        for c in &s.checks {
            let m = c.measured.as_ref();
            w.write_record([
                run_id.to_string(),
                s.name.clone(),
                c.id.clone(),
                c.name.clone(),
                c.outcome.name().to_string(),
                c.target.op.name().to_string(),
                format::plain(c.target.value, 6),
                opt(c.target.upper),
                c.target.unit.clone(),
                opt(m.map(|m| m.median)),
                opt(m.map(|m| m.min)),
                opt(m.map(|m| m.max)),
                m.map_or(0, |m| m.samples.len()).to_string(),
                c.reason.clone(),
            ])
            .map_err(err)?;
        }
    }
    w.flush().map_err(|e| err(e.into()))?;
    files.push(path);
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Column, Row};

    #[test]
    fn tables_are_typed_unit_free_and_empty_for_missing() {
        let dir = std::env::temp_dir().join(format!("netlane-csv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut t =
            Table::new("t", "T", vec![Column::new("mode", "mode", 0), Column::new("tx_mb_per_s", "tx MB/s", 1)]);
        t.push(Row { cells: vec![Value::text("a,\"b\""), Value::num(1234.5678)], footnote: Some("why".into()) });
        t.push(Row::new(vec![Value::text("udp"), Value::num(f64::NAN)]));
        let p = write_table(&dir, "R1", &t).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        assert_eq!(text, "run_id,mode,tx_mb_per_s,footnote\nR1,\"a,\"\"b\"\"\",1234.5678,why\nR1,udp,,\n");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

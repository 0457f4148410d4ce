//! `docs/schema/` holds the JSON Schema of every document netlane writes, generated
//! from the report types. This test fails when they are stale; to regenerate:
//! `NETLANE_WRITE_SCHEMA=1 cargo test -p netlane-lab --test schema`.

use std::path::Path;

#[test]
fn the_schemas_in_docs_are_generated_from_the_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/schema");
    let write = std::env::var("NETLANE_WRITE_SCHEMA").as_deref() == Ok("1");
    let mut stale = Vec::new();
    for (name, schema) in netlane_lab::report::documents::schemas() {
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
    }
    assert!(
        stale.is_empty(),
        "stale or missing: {stale:?}; regenerate with NETLANE_WRITE_SCHEMA=1 cargo test -p netlane-lab --test schema"
    );
}

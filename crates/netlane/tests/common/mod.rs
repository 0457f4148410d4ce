//! Shared helpers for integration tests that need root and network namespaces.

#![allow(dead_code)]

/// Whether privileged tests can run. Without root they are skipped with a message,
/// unless `NETLANE_REQUIRE_PRIVILEGED=1` (set by `make test` and CI, which run as
/// root), in which case a missing privilege is a failure, never a silent skip.
pub fn privileged(test: &str) -> bool {
    if netlane::topology::have_privileges() {
        return true;
    }
    if std::env::var("NETLANE_REQUIRE_PRIVILEGED").as_deref() == Ok("1") {
        panic!("{test}: needs root, and NETLANE_REQUIRE_PRIVILEGED=1 forbids skipping");
    }
    eprintln!("SKIPPED {test}: needs root (network namespaces)");
    false
}

/// Names of the namespaces under /run/netns.
pub fn netns_names() -> Vec<String> {
    std::fs::read_dir(netlane::topology::NETNS_RUN_DIR)
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

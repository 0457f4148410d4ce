//! Helpers for the workspace's integration tests that need root and network namespaces.
//!
//! Privileged tests run as root in CI. Without root they are skipped with a message,
//! unless `NETLANE_REQUIRE_PRIVILEGED=1` (set by `make test` as root, and so in CI), in
//! which case a missing privilege fails the test instead of skipping it.
//!
//! [`guest`] boots a stock Linux kernel under QEMU for tests against real kernel peers.

pub mod guest;

/// Whether privileged tests can run (see the module documentation).
///
/// # Panics
/// When they cannot and `NETLANE_REQUIRE_PRIVILEGED=1` forbids skipping.
pub fn privileged(test: &str) -> bool {
    if crate::topology::have_privileges() {
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
    std::fs::read_dir(crate::topology::NETNS_RUN_DIR)
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

//! Helpers for netlane's tests only (a dev-dependency of every crate): the privilege
//! rule for tests that need root and network namespaces, and a Linux guest.
//!
//! Privileged tests run as root in CI. Without root they are skipped with a message,
//! unless `NETLANE_REQUIRE_PRIVILEGED=1` (set by `make test` as root, and so in CI), in
//! which case a missing privilege fails the test instead of skipping it.
//!
//! [`guest`] boots a stock Linux kernel under QEMU for tests against real kernel peers;
//! [`sshd`] makes hosts reached over SSH out of namespaces running OpenSSH's server.

pub mod guest;
pub mod sshd;

/// Whether privileged tests can run (see the module documentation).
///
/// # Panics
/// When they cannot and `NETLANE_REQUIRE_PRIVILEGED=1` forbids skipping.
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

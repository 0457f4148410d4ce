//! Records the git commit the binary is built from (`NETLANE_GIT_COMMIT`), for
//! `--version` and every report's provenance. Outside a git checkout (a packaged
//! crate) it is `unknown`, unless the environment sets `NETLANE_GIT_COMMIT`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).current_dir(dir).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string()).filter(|s| !s.is_empty())
}

fn main() {
    println!("cargo:rerun-if-env-changed=NETLANE_GIT_COMMIT");
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let commit = std::env::var("NETLANE_GIT_COMMIT")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| git(&dir, &["rev-parse", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=NETLANE_GIT_COMMIT={commit}");
    // Build again when HEAD moves: HEAD itself, the branch it names, packed refs. Only
    // files that exist: cargo reruns a build script on every build for a missing one.
    if let Some(gitdir) = git(&dir, &["rev-parse", "--absolute-git-dir"]) {
        let gitdir = PathBuf::from(gitdir);
        let mut watch = vec![gitdir.join("HEAD"), gitdir.join("packed-refs")];
        if let Ok(head) = std::fs::read_to_string(gitdir.join("HEAD"))
            && let Some(r) = head.trim().strip_prefix("ref: ")
        {
            watch.push(gitdir.join(r));
        }
        for w in watch.iter().filter(|w| w.exists()) {
            println!("cargo:rerun-if-changed={}", w.display());
        }
    }
}

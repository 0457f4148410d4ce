//! Provenance: what built the numbers (tool, version, commit, the invocation) and on
//! what (kernel, CPU model, CPUs, memory). Every document carries both.

use crate::model::{Host, Provenance};

/// The version and the git commit this binary was built from.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The git commit this binary was built from (`unknown` outside a checkout).
pub const GIT_COMMIT: &str = env!("NETLANE_GIT_COMMIT");

/// What `--version` prints: `0.1.0 (commit <40 hex digits>)`.
pub const VERSION_LINE: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("NETLANE_GIT_COMMIT"), ")");

/// Tool, version, commit and this invocation.
pub fn provenance(command: Vec<String>) -> Provenance {
    let now = jiff::Timestamp::now();
    Provenance {
        tool: "netlane".into(),
        version: VERSION.into(),
        git_commit: GIT_COMMIT.into(),
        run_id: format!("{}-{}", now.strftime("%Y%m%dT%H%M%SZ"), std::process::id()),
        started_at: now.round(jiff::Unit::Second).map_or_else(|_| now.to_string(), |t| t.to_string()),
        command,
    }
}

/// The value of `key` in `/proc/cpuinfo`-style text (`model name\t: ...`).
fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == key).then(|| v.trim())
    })
}

/// Kernel, CPU model, CPUs and memory of this machine.
pub fn host() -> Host {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let meminfo = read("/proc/meminfo");
    let mem_kib: f64 = field(&meminfo, "MemTotal")
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    Host {
        kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
        cpu_model: field(&cpuinfo, "model name").unwrap_or("unknown").to_string(),
        cpus: netlane::cpus::online_count(),
        memory_gib: (mem_kib / (1024.0 * 1024.0) * 10.0).round() / 10.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_and_provenance_are_filled() {
        let h = host();
        assert!(!h.kernel.is_empty() && h.cpus >= 1 && h.memory_gib > 0.0, "{h:?}");
        let p = provenance(vec!["netlane".into(), "lab".into()]);
        assert_eq!(p.tool, "netlane");
        assert!(p.started_at.ends_with('Z') && p.run_id.contains('T'), "{p:?}");
        assert!(!GIT_COMMIT.is_empty());
        assert!(VERSION_LINE.starts_with(VERSION) && VERSION_LINE.contains(GIT_COMMIT));
    }

    #[test]
    fn cpuinfo_fields() {
        let t = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu\n";
        assert_eq!(field(t, "model name"), Some("AMD EPYC 7B13"));
        assert_eq!(field(t, "missing"), None);
    }
}

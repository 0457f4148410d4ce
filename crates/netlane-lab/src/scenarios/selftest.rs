//! The Linux kernel's own UDP GSO benchmark sender, `udpgso_bench_tx`
//! (tools/testing/selftests/net), as a reference to measure netlane's sender against.
//!
//! `scripts/build-selftests.sh` builds it from Debian's `linux-source` package into
//! `target/kselftest/`. It is run in the sending namespace against netlane's receiver,
//! with `-a` so it prints a summary of everything it sent:
//! `sum udp tx: <MB/s> MB/s <calls> calls (<n>/s) <msgs> msgs (<n>/s)` after
//! `Summary over <s>.<ms> seconds...`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::engines::bulk::{ExternalCounts, ExternalTx};

/// Environment variable naming the binary.
pub const ENV: &str = "NETLANE_UDPGSO_BENCH_TX";

/// Finds `udpgso_bench_tx`: `explicit`, else `$NETLANE_UDPGSO_BENCH_TX`, else
/// `kselftest/udpgso_bench_tx` next to the directory of the running `netlane`
/// (`target/kselftest/` for `target/release/netlane`).
pub fn locate(explicit: Option<&Path>) -> Option<PathBuf> {
    if let Some(p) = explicit {
        return Some(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os(ENV) {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let candidate = exe.parent()?.parent()?.join("kselftest").join("udpgso_bench_tx");
    candidate.is_file().then_some(candidate)
}

/// Parses the `-a` summary.
pub fn parse(text: &str) -> Option<ExternalCounts> {
    let seconds = text.lines().find_map(|l| {
        let rest = l.trim().strip_prefix("Summary over ")?;
        rest.split_whitespace().next()?.parse::<f64>().ok()
    })?;
    let sum = text.lines().find(|l| l.trim_start().starts_with("sum ") && l.contains(" tx:"))?;
    let words: Vec<&str> = sum.split_whitespace().collect();
    let before = |word: &str| -> Option<u64> {
        let i = words.iter().position(|w| *w == word)?;
        words.get(i.checked_sub(1)?)?.parse().ok()
    };
    Some(ExternalCounts { messages: before("msgs")?, syscalls: before("calls")?, seconds })
}

/// What to run: plain 1400-byte datagrams, or GSO trains of `segments` x `gso_size`.
pub fn sender(
    program: &Path,
    ipv6: bool,
    duration: Duration,
    gso_size: usize,
    segments: usize,
    gso: bool,
    cpu: usize,
) -> ExternalTx {
    let secs = duration.as_secs().max(1).to_string();
    let mut args: Vec<String> =
        vec![if ipv6 { "-6" } else { "-4" }.into(), "-D".into(), "{addr}".into(), "-p".into(), "{port}".into()];
    args.extend(["-l".into(), secs, "-a".into()]);
    let (message_bytes, per) = if gso {
        let len = gso_size * segments;
        args.extend(["-S".into(), gso_size.to_string(), "-s".into(), len.to_string()]);
        (len as u64, segments as u64)
    } else {
        args.extend(["-s".into(), gso_size.to_string()]);
        (gso_size as u64, 1)
    };
    ExternalTx {
        program: program.to_path_buf(),
        args,
        message_bytes,
        datagrams_per_message: per,
        cpu: Some(cpu),
        parse,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_audit_summary() {
        let out = "udp tx:    350 MB/s   262000 calls/s 262000 msg/s\nSummary over 2.001 seconds...\nsum udp tx:    342 MB/s     524100 calls (261919/s)     524100 msgs (261919/s)\n";
        let c = parse(out).unwrap();
        assert_eq!(c.messages, 524_100);
        assert_eq!(c.syscalls, 524_100);
        assert!((c.seconds - 2.001).abs() < 1e-9);
        assert!(parse("udp tx: 1 MB/s").is_none());
    }

    #[test]
    fn gso_arguments() {
        let s = sender(Path::new("/x"), false, Duration::from_secs(2), 1400, 46, true, 0);
        assert_eq!(s.message_bytes, 64_400);
        assert_eq!(s.datagrams_per_message, 46);
        assert!(s.args.windows(2).any(|w| w == ["-S", "1400"]));
        assert!(s.args.windows(2).any(|w| w == ["-l", "2"]));
    }
}

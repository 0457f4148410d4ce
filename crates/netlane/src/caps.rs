//! The capabilities a feature needs, checked before it is tried, so that a refusal
//! names what is missing and how to get it instead of an `Operation not permitted`.

use std::fmt;

/// A Linux capability a netlane feature needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cap {
    /// Interfaces, routes, qdiscs, XDP and TC attachments.
    NetAdmin,
    /// Packet sockets (TPACKET rings) and AF_XDP sockets.
    NetRaw,
    /// Namespaces, mounts, cgroups.
    SysAdmin,
    /// Loading BPF programs and making maps.
    Bpf,
}

impl Cap {
    /// Its bit in the capability sets (`linux/capability.h`).
    fn bit(self) -> u32 {
        match self {
            Cap::NetAdmin => 12,
            Cap::NetRaw => 13,
            Cap::SysAdmin => 21,
            Cap::Bpf => 39,
        }
    }

    /// `CAP_NET_RAW`.
    pub fn name(self) -> &'static str {
        match self {
            Cap::NetAdmin => "CAP_NET_ADMIN",
            Cap::NetRaw => "CAP_NET_RAW",
            Cap::SysAdmin => "CAP_SYS_ADMIN",
            Cap::Bpf => "CAP_BPF",
        }
    }
}

impl fmt::Display for Cap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The effective set of this process, from `/proc/self/status` (`None` when it cannot
/// be read: then nothing is refused beforehand and the kernel has the last word).
fn effective() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_effective(&status)
}

fn parse_effective(status: &str) -> Option<u64> {
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?.trim();
    u64::from_str_radix(hex, 16).ok()
}

/// Which of `needed` this process lacks.
pub fn missing(needed: &[Cap]) -> Vec<Cap> {
    match effective() {
        Some(eff) => needed.iter().copied().filter(|c| eff & (1u64 << c.bit()) == 0).collect(),
        None => Vec::new(),
    }
}

/// Why `what` cannot run without `lacking`: the capabilities, and how to get them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} needs {}: run as root, or grant {}: setcap {}+ep on the netlane binary", names(.lacking), if .lacking.len() > 1 { "them" } else { "it" }, setcap(.lacking))]
pub struct Lacking {
    /// What needs them.
    pub what: String,
    /// The capabilities this process lacks.
    pub lacking: Vec<Cap>,
}

/// `CAP_A`, `CAP_A and CAP_B`, `CAP_A, CAP_B and CAP_C`.
fn names(caps: &[Cap]) -> String {
    let n: Vec<&str> = caps.iter().map(|c| c.name()).collect();
    match n.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => n.join(""),
    }
}

fn setcap(caps: &[Cap]) -> String {
    let n: Vec<String> = caps.iter().map(|c| c.name().to_lowercase()).collect();
    n.join(",")
}

/// Refuses `what` when this process lacks any of `needed`.
pub fn require(what: &str, needed: &[Cap]) -> Result<(), Lacking> {
    let lacking = missing(needed);
    if lacking.is_empty() { Ok(()) } else { Err(Lacking { what: what.to_string(), lacking }) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_effective_set_is_read_and_a_refusal_names_what_lacks() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t0000000000003000\n";
        let eff = parse_effective(status).unwrap();
        assert!(eff & (1 << Cap::NetRaw.bit()) != 0 && eff & (1 << Cap::NetAdmin.bit()) != 0);
        assert_eq!(eff & (1 << Cap::Bpf.bit()), 0);
        assert_eq!(parse_effective("Name:\tx\n"), None);
        let e = Lacking { what: "the af-xdp path".into(), lacking: vec![Cap::NetRaw, Cap::Bpf] };
        assert_eq!(
            e.to_string(),
            "the af-xdp path needs CAP_NET_RAW and CAP_BPF: run as root, or grant them: setcap cap_net_raw,cap_bpf+ep \
             on the netlane binary"
        );
        assert_eq!(names(&[Cap::NetRaw, Cap::Bpf, Cap::NetAdmin]), "CAP_NET_RAW, CAP_BPF and CAP_NET_ADMIN");
        assert_eq!(names(&[Cap::Bpf]), "CAP_BPF");
        // This process: refused exactly when its effective set lacks one.
        let has = |c: Cap| effective().is_none_or(|e| e & (1u64 << c.bit()) != 0);
        assert_eq!(require("x", &[Cap::NetRaw, Cap::Bpf]).is_ok(), has(Cap::NetRaw) && has(Cap::Bpf));
    }
}

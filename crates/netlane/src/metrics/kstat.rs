//! Machine-wide kernel event counters, for "how many per request": context switches
//! (`ctxt` in `/proc/stat`), interrupts by kind (`/proc/interrupts`, each row summed
//! over CPUs: device interrupts by number, and the architecture's own rows such as
//! `LOC` local timer, `RES` rescheduling and `CAL` function-call inter-processor
//! interrupts) and softirqs (`/proc/softirqs`: `NET_RX`, `NET_TX`, ...).
//!
//! The parsers take the files' text and never panic: a row they cannot read is skipped.

use std::collections::BTreeMap;
use std::io;

use serde::Serialize;

/// A reading of the counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct KernelCounters {
    /// Context switches since boot.
    pub ctxt: u64,
    /// Interrupts by row name, summed over CPUs.
    pub interrupts: BTreeMap<String, u64>,
    /// Softirqs by name, summed over CPUs.
    pub softirqs: BTreeMap<String, u64>,
}

/// Interrupt rows that are inter-processor interrupts (x86 names).
pub const IPI_ROWS: [&str; 4] = ["RES", "CAL", "TLB", "IWI"];

impl KernelCounters {
    /// Reads the three files.
    pub fn read() -> io::Result<KernelCounters> {
        Ok(KernelCounters::parse(
            &std::fs::read_to_string("/proc/stat")?,
            &std::fs::read_to_string("/proc/interrupts")?,
            &std::fs::read_to_string("/proc/softirqs")?,
        ))
    }

    /// Parses the three files' text.
    pub fn parse(stat: &str, interrupts: &str, softirqs: &str) -> KernelCounters {
        let ctxt = stat.lines().find_map(|l| l.strip_prefix("ctxt ")).and_then(|v| v.trim().parse().ok()).unwrap_or(0);
        KernelCounters { ctxt, interrupts: rows(interrupts), softirqs: rows(softirqs) }
    }

    /// What happened between `self` and `later` (counters that went backwards count 0).
    pub fn delta(&self, later: &KernelCounters) -> KernelCounters {
        let d = |a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>| {
            b.iter().map(|(k, v)| (k.clone(), v.saturating_sub(a.get(k).copied().unwrap_or(0)))).collect()
        };
        KernelCounters {
            ctxt: later.ctxt.saturating_sub(self.ctxt),
            interrupts: d(&self.interrupts, &later.interrupts),
            softirqs: d(&self.softirqs, &later.softirqs),
        }
    }

    /// All interrupts.
    pub fn interrupts_total(&self) -> u64 {
        self.interrupts.values().sum()
    }

    /// Inter-processor interrupts (the [`IPI_ROWS`]).
    pub fn ipis(&self) -> u64 {
        IPI_ROWS.iter().filter_map(|r| self.interrupts.get(*r)).sum()
    }

    /// One softirq's count (0 when absent).
    pub fn softirq(&self, name: &str) -> u64 {
        self.softirqs.get(name).copied().unwrap_or(0)
    }
}

/// `NAME: n0 n1 ... [description]` rows: the counts after the name, up to the first
/// field that is not a number, summed. The header row (CPU names) has no colon.
fn rows(text: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some((name, rest)) = line.split_once(':') else { continue };
        let name = name.trim();
        if name.is_empty() || name.contains(char::is_whitespace) {
            continue;
        }
        let sum = rest.split_whitespace().map_while(|f| f.parse::<u64>().ok()).fold(0u64, u64::saturating_add);
        *out.entry(name.to_string()).or_insert(0) += sum;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  1 2 3 4\ncpu0 1 1 1 1\nintr 12345 1 2\nctxt 987654\nbtime 1\n";
    const INTERRUPTS: &str = "           CPU0       CPU1       \n  \
        4:        120          0   IO-APIC   4-edge      ttyS0\n \
        24:         10         20   PCI-MSI 49152-edge      virtio0-config\n\
        NMI:          0          0   Non-maskable interrupts\n\
        LOC:     100000      90000   Local timer interrupts\n\
        RES:       5000       7000   Rescheduling interrupts\n\
        CAL:        300        400   Function call interrupts\n\
        TLB:         10         20   TLB shootdowns\n\
        ERR:          0\n";
    const SOFTIRQS: &str = "                    CPU0       CPU1       \n          \
        HI:          1          0\n      TIMER:       5000       4000\n     \
        NET_TX:         10         20\n     NET_RX:      70000      80000\n";

    #[test]
    fn the_files_parse_into_sums_over_cpus() {
        let k = KernelCounters::parse(STAT, INTERRUPTS, SOFTIRQS);
        assert_eq!(k.ctxt, 987_654);
        assert_eq!(k.interrupts["4"], 120);
        assert_eq!(k.interrupts["24"], 30);
        assert_eq!(k.interrupts["LOC"], 190_000);
        assert_eq!(k.ipis(), 12_000 + 700 + 30);
        assert_eq!(k.softirq("NET_RX"), 150_000);
        assert_eq!(k.softirq("BLOCK"), 0);
        assert_eq!(k.interrupts_total(), 120 + 30 + 190_000 + 12_000 + 700 + 30);
    }

    #[test]
    fn deltas_subtract_and_never_go_negative() {
        let a = KernelCounters::parse(STAT, INTERRUPTS, SOFTIRQS);
        let mut b = a.clone();
        b.ctxt += 50;
        *b.interrupts.get_mut("RES").unwrap() += 7;
        *b.softirqs.get_mut("NET_RX").unwrap() -= 1;
        let d = a.delta(&b);
        assert_eq!((d.ctxt, d.ipis(), d.softirq("NET_RX")), (50, 7, 0));
        assert_eq!(b.delta(&a).ctxt, 0);
    }

    #[test]
    fn odd_text_is_skipped_without_panicking() {
        let k = KernelCounters::parse("ctxt x\n", "RES: 1 2 three 4\n: 5\nno colon here\nX Y: 3\n", "");
        assert_eq!(k.ctxt, 0);
        assert_eq!(k.interrupts.get("RES"), Some(&3), "numbers up to the first that is not");
        assert_eq!(k.interrupts.len(), 1);
    }
}

//! The per-NAPI interrupt-moderation flags, as every command that takes them spells them.

use std::time::Duration;

use netlane::topology::netdev::NapiSettings;
use netlane_report::options::parse_duration;

/// Interrupt moderation on every NAPI instance of the device the command's traffic
/// arrives on: written with napi-set (else the device's sysfs knobs), read back, and put
/// back when the command ends.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct NapiArgs {
    /// Per-NAPI, on the device the traffic arrives on (kv serve: the lane device; rr
    /// serve: the lane device, --iface or the listen address's; nvme perf: the one towards
    /// the target): empty polls before interrupts are re-enabled (napi-set, else sysfs;
    /// put back at exit).
    #[arg(long)]
    pub napi_defer_hard_irqs: Option<u32>,
    /// Per-NAPI: GRO flush / watchdog timeout, the time interrupts stay deferred (napi-set,
    /// else sysfs; 0 turns it off).
    #[arg(long, value_parser = parse_duration)]
    pub gro_flush_timeout: Option<Duration>,
    /// Per-NAPI: IRQ suspension timeout while busy polling keeps finding events (napi-set,
    /// Linux 6.13+; needs busy polling with prefer).
    #[arg(long, value_parser = parse_duration)]
    pub irq_suspend_timeout: Option<Duration>,
}

impl NapiArgs {
    /// The settings asked for (none: nothing is written).
    pub fn settings(&self) -> NapiSettings {
        NapiSettings {
            defer_hard_irqs: self.napi_defer_hard_irqs,
            gro_flush_timeout_ns: self.gro_flush_timeout.map(|d| d.as_nanos() as u64),
            irq_suspend_timeout_ns: self.irq_suspend_timeout.map(|d| d.as_nanos() as u64),
        }
    }
}

impl NapiArgs {
    /// The settings given, echoed (`--key=value`).
    pub fn echo(&self) -> netlane_report::options::OptionList {
        let mut l = netlane_report::options::OptionList::new();
        if let Some(d) = self.napi_defer_hard_irqs {
            l = l.int("napi-defer-hard-irqs", u64::from(d));
        }
        for (name, d) in
            [("gro-flush-timeout", self.gro_flush_timeout), ("irq-suspend-timeout", self.irq_suspend_timeout)]
        {
            if let Some(d) = d {
                l = l.duration(name, d);
            }
        }
        l
    }
}

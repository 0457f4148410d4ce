//! The lb-pps scenario's options, and the engine's options from them.

use std::time::Duration;

use anyhow::{Result, bail};
use clap::Args;
use netlane_lb::HintMode;
use netlane_report::options::parse_positive_duration;

use crate::engines::lb_pps::{PpsCpus, PpsOptions};
use crate::scenarios::from_words;

/// Options of the `lb-pps` scenario.
#[derive(Debug, Clone, Args)]
pub struct LbPpsArgs {
    /// Flow counts (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "1,100,10000,1000000")]
    pub flows: Vec<u32>,
    /// Balancer hint modes (comma separated): off, rx-hash, flow-tag, dest-tag,
    /// dest-tag-direct (destination tags that skip the transport header).
    #[arg(long, value_delimiter = ',', default_value = "off,rx-hash,flow-tag,dest-tag,dest-tag-direct")]
    pub modes: Vec<String>,
    /// Measured time per program and flow count (taken in six turns).
    #[arg(short = 't', long, default_value = "2s", value_parser = parse_positive_duration)]
    pub time: Duration,
    /// Skip the skb path (frames from a packet socket, flow counts up to 10,000: where
    /// veth has an RX hash, so the device-bound build and the TCX classifier's tags are
    /// measured).
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub no_skb: bool,
    /// Skip the two-core runs (a second veth pair with a queue per CPU, a generator on
    /// each of two CPUs sending half of the flows, two NAPI threads; flow counts that
    /// split in two).
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub no_two_cores: bool,
}

impl LbPpsArgs {
    /// The defaults, as `netlane bench lb-pps` has them.
    pub fn defaults() -> LbPpsArgs {
        from_words(&[]).expect("the defaults parse")
    }

    pub(super) fn engine_options(&self, cpus: PpsCpus) -> Result<PpsOptions> {
        let mut modes = Vec::new();
        for m in &self.modes {
            match HintMode::from_name(m) {
                Some(h) => modes.push(h),
                None => bail!("--modes: {m:?} is not one of {}", HintMode::names()),
            }
        }
        let o = PpsOptions {
            flows: self.flows.clone(),
            modes,
            time: self.time,
            skb: !self.no_skb,
            two_cores: !self.no_two_cores,
            cpus,
        };
        o.validate()?;
        Ok(o)
    }
}

//! The threaded-busy mode's kernel setting: every NAPI instance of the server's veth end
//! polled by its thread without sleeping for one round, then woken by the device again.

use anyhow::{Context, Result};
use netlane::topology::TwoHosts;
use netlane::topology::netdev::{NapiThreaded, Netdev};

/// The server end's NAPI threads busy polling until this drops.
pub(crate) struct BusyPollingThreads<'a> {
    h: &'a TwoHosts,
    ids: Vec<u32>,
}

impl<'a> BusyPollingThreads<'a> {
    /// Sets every NAPI instance of `h`'s rx end to threaded busy polling.
    pub(crate) fn set(h: &'a TwoHosts) -> Result<BusyPollingThreads<'a>> {
        let ifindex = h.rx_index;
        let ids =
            h.rx.run(move || -> Result<Vec<u32>> {
                let mut nd = Netdev::open()?;
                let ids: Vec<u32> = nd.napis(ifindex)?.into_iter().map(|n| n.id).collect();
                for &id in &ids {
                    nd.napi_set_threaded(id, NapiThreaded::BusyPoll)?;
                }
                Ok(ids)
            })?
            .context("set the NAPI threads to busy poll")?;
        Ok(BusyPollingThreads { h, ids })
    }
}

impl Drop for BusyPollingThreads<'_> {
    fn drop(&mut self) {
        let ids = std::mem::take(&mut self.ids);
        let back = self.h.rx.run(move || -> Result<()> {
            let mut nd = Netdev::open()?;
            for id in ids {
                nd.napi_set_threaded(id, NapiThreaded::Enabled)?;
            }
            Ok(())
        });
        if let Err(e) | Ok(Err(e)) = back.map_err(anyhow::Error::from) {
            tracing::warn!("the NAPI threads were not put back to sleeping: {e:#}");
        }
    }
}

//! The threaded-busy mode's kernel setting: every NAPI instance of the server's veth end
//! polled by its thread without sleeping for one round, then as it was before.

use anyhow::{Context, Result, bail};
use netlane::topology::TwoHosts;
use netlane::topology::netdev::{NapiThreaded, Netdev};

/// The server end's NAPI threads busy polling until this drops, which puts back each
/// instance it changed (also those set before a later one was refused).
pub(crate) struct BusyPollingThreads<'a> {
    h: &'a TwoHosts,
    /// (NAPI id, how it was polled before).
    changed: Vec<(u32, NapiThreaded)>,
}

impl<'a> BusyPollingThreads<'a> {
    /// Sets every NAPI instance of `h`'s rx end to threaded busy polling, each read back.
    pub(crate) fn set(h: &'a TwoHosts) -> Result<BusyPollingThreads<'a>> {
        let ifindex = h.rx_index;
        let mut guard = BusyPollingThreads { h, changed: Vec::new() };
        let napis = h.rx.run(move || Netdev::open()?.napis(ifindex))??;
        for n in napis {
            let was = n.threaded.unwrap_or(NapiThreaded::Enabled);
            let now = h.rx.run(move || -> Result<Option<NapiThreaded>> {
                let mut nd = Netdev::open()?;
                nd.napi_set_threaded(n.id, NapiThreaded::BusyPoll)?;
                Ok(nd.napis(ifindex)?.into_iter().find(|x| x.id == n.id).and_then(|x| x.threaded))
            })?;
            let now = now.with_context(|| format!("set NAPI {}'s thread to busy poll", n.id))?;
            guard.changed.push((n.id, was));
            if now != Some(NapiThreaded::BusyPoll) {
                bail!("NAPI {}'s thread reads back as {now:?}, not busy polling", n.id);
            }
        }
        Ok(guard)
    }
}

impl Drop for BusyPollingThreads<'_> {
    fn drop(&mut self) {
        let changed = std::mem::take(&mut self.changed);
        let back = self.h.rx.run(move || -> Result<()> {
            let mut nd = Netdev::open()?;
            for (id, was) in changed {
                nd.napi_set_threaded(id, was)?;
            }
            Ok(())
        });
        if let Err(e) | Ok(Err(e)) = back.map_err(anyhow::Error::from) {
            tracing::warn!("the NAPI threads were not put back as they were: {e:#}");
        }
    }
}

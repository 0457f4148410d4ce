//! Lanes: the server on a device's receive queues, one socket and thread per queue.

use super::*;

/// Lanes: one socket per receive queue in an `SO_REUSEPORT` group, the selector
/// steering by NAPI id, a thread per lane pinned to its queue's CPU. A lane that fails
/// stops the others (it gives `stop`).
pub(super) fn serve_lanes(
    cfg: &ServerConfig,
    dev: &str,
    keys: &std::collections::hash_map::RandomState,
    stop: &Stop,
    live: &SharedRrCounters,
    on_ready: impl FnOnce(SocketAddr),
) -> Result<ServerStats, ServerError> {
    let q = netlane::lanes::queues::lane_device(dev).map_err(ServerError::LaneDevice)?;
    let ids = q.napi_ids();
    let mut map = LaneMap::new(ids.len()).map_err(|e| ServerError::Lanes(e.to_string()))?;
    map.learn(&ids);
    let lanes: Vec<LaneId> = (0..ids.len()).map(|i| map.nth_lane(i)).collect();
    let cpu_of = |lane: LaneId| q.rx.iter().find(|r| map.owner(r.napi_id) == Some(lane)).and_then(|r| r.cpu);
    let cpus: Vec<Option<usize>> = lanes.iter().map(|&l| cpu_of(l)).collect();
    let owned: Vec<Vec<u32>> =
        lanes.iter().map(|&l| ids.iter().copied().filter(|&id| map.owner(id) == Some(l)).collect()).collect();
    // The group: sockets join in lane order, so socket i is lane i.
    let first = bind(cfg, cfg.listen, true)?;
    let local = first.local_addr().map_err(io_err("local address"))?;
    let mut steering = ReuseportSteering::load().map_err(io_err("load the reuseport selector"))?;
    steering.attach(first.as_fd()).map_err(io_err("attach the reuseport selector"))?;
    let mut socks = vec![first];
    for _ in 1..lanes.len() {
        socks.push(bind(cfg, local, true)?);
    }
    for &l in &lanes {
        steering.joined(l);
    }
    steering.sync(&map).map_err(io_err("write the reuseport selector's map"))?;
    let busy_before = cfg.busy_poll.and_then(|_| netlane::lanes::busy::busy_poll_rx_packets());
    on_ready(local);
    let results: Vec<Result<ServerStats, ServerError>> = std::thread::scope(|s| {
        let handles: Vec<_> = socks
            .into_iter()
            .zip(&cpus)
            .map(|(sock, &cpu)| {
                let lane_cfg = ServerConfig { cpu, lane_device: None, ..cfg.clone() };
                s.spawn(move || {
                    let r = serve_on(&lane_cfg, sock, keys, stop, live, |_| {});
                    if r.is_err() {
                        stop.stop();
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(ServerError::Lanes("a lane's thread panicked".into()))))
            .collect()
    });
    let mut per = Vec::with_capacity(results.len());
    for r in results {
        per.push(r?);
    }
    let (by_napi_id, by_hash) = steering.counts().map_err(io_err("read the reuseport selector's counters"))?;
    let mut st = ServerStats {
        path: cfg.path.to_string(),
        listen: local.to_string(),
        tx: cfg.tx.to_string(),
        ..ServerStats::default()
    };
    let mut report = LanesReport { device: dev.to_string(), lanes: Vec::new(), by_napi_id, by_hash };
    for (i, l) in per.iter().enumerate() {
        st.seconds = st.seconds.max(l.seconds);
        st.counters.add(&l.counters);
        st.cpu_s += l.cpu_s;
        report.lanes.push(RrLane {
            lane: i,
            cpu: cpus[i],
            napi_ids: owned[i].clone(),
            frames: l.counters.frames,
            responses: l.counters.responses,
            cpu_s: l.cpu_s,
        });
    }
    for (i, l) in per.iter().enumerate() {
        let Some(b) = &l.busy_poll else { continue };
        let all = st.busy_poll.get_or_insert_with(|| BusyPollReport { policy: b.policy.clone(), ..Default::default() });
        all.knobs
            .extend(b.knobs.iter().map(|k| netlane::lanes::Knob { name: format!("lane {i} {}", k.name), ..k.clone() }));
        all.napi_ids.extend(b.napi_ids.iter().map(|(what, id)| (format!("lane {i} {what}"), *id)));
    }
    if let Some(all) = &mut st.busy_poll {
        // The namespace's count over the whole run, not a lane's.
        all.rx_packets =
            busy_before.zip(netlane::lanes::busy::busy_poll_rx_packets()).map(|(b, a)| a.saturating_sub(b));
    }
    let n = per.len().max(1) as f64;
    st.busy = if st.seconds > 0.0 { (st.cpu_s / (st.seconds * n)).min(1.0) } else { 0.0 };
    st.derive_ratios();
    st.lanes = Some(report);
    Ok(st)
}

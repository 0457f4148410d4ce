//! The target's counters in the Prometheus text format, served on `--metrics-addr`:
//! target-wide totals (monotonic: live queues plus those that closed) and per live
//! queue (labelled by connection, controller, queue ID and host address) commands,
//! reads and writes with their bytes, failed completions by status, and the command
//! latency histogram. Per-second rates (IOPS, throughput) are `rate()` of the totals.

use netlane::metrics::prom::{Exposition, Kind};

use super::{QueueMetricsSnapshot, TargetStats, merge_queue_stats};
use crate::proto::target::{LATENCY_BUCKETS, LatencyHist, QueueStats};

/// Upper bounds of the latency buckets in seconds (bucket i holds latencies under 2^i
/// us; the last one, everything longer, is `+Inf`).
fn buckets(h: &LatencyHist) -> impl Iterator<Item = (f64, u64)> + '_ {
    h.buckets[..LATENCY_BUCKETS - 1].iter().enumerate().map(|(i, n)| ((1u64 << i) as f64 * 1e-6, *n))
}

type Row<'a> = (Vec<(&'static str, String)>, &'a QueueStats);

/// Each per-queue family, with a sample for every row.
fn queue_families(e: &mut Exposition, rows: &[Row<'_>]) {
    type Get = fn(&QueueStats) -> u64;
    let counters: [(&str, &str, Get); 6] = [
        ("netlane_nvme_target_commands_total", "Commands received.", |q| q.commands),
        ("netlane_nvme_target_reads_total", "Reads completed successfully.", |q| q.reads),
        ("netlane_nvme_target_read_bytes_total", "Bytes read.", |q| q.read_bytes),
        ("netlane_nvme_target_writes_total", "Writes completed successfully.", |q| q.writes),
        ("netlane_nvme_target_write_bytes_total", "Bytes written.", |q| q.write_bytes),
        ("netlane_nvme_target_r2ts_total", "R2T PDUs sent.", |q| q.r2ts),
    ];
    for (name, help, get) in counters {
        e.family(name, help, Kind::Counter);
        for (labels, q) in rows {
            e.sample(name, &as_refs(labels), get(q));
        }
    }
    let name = "netlane_nvme_target_errors_total";
    e.family(name, "Failed completions by NVMe status (0xSCT_SC: 0x0002 is Invalid Field).", Kind::Counter);
    for (labels, q) in rows {
        for (status, n) in &q.errors {
            let status = format!("{status:#06x}");
            let mut l = as_refs(labels);
            l.push(("status", &status));
            e.sample(name, &l, n);
        }
    }
    let name = "netlane_nvme_target_command_latency_seconds";
    e.family(name, "From a command's arrival to its completion being queued for sending.", Kind::Histogram);
    for (labels, q) in rows {
        e.histogram(name, &as_refs(labels), buckets(&q.latency), q.latency.sum_ns as f64 * 1e-9);
    }
}

fn as_refs<'a>(labels: &'a [(&'static str, String)]) -> Vec<(&'a str, &'a str)> {
    labels.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// The exposition of `stats` (target-wide) and `queues` (per live queue).
pub fn render(stats: &TargetStats, queues: &QueueMetricsSnapshot) -> String {
    let mut e = Exposition::new();
    let live_queues = queues.live.values().filter(|q| q.qid.is_some()).count();
    for (name, help, v) in [
        ("netlane_nvme_target_open_connections", "Connections open now.", queues.live.len()),
        ("netlane_nvme_target_connected_queues", "Queues connected to a controller now.", live_queues),
    ] {
        e.family(name, help, Kind::Gauge).sample(name, &[], v);
    }
    let conn = "netlane_nvme_target_connections_total";
    e.family(conn, "Connections accepted, refused at the limit, and failed accept() calls.", Kind::Counter);
    for (what, n) in
        [("accepted", stats.connections), ("refused", stats.refused), ("accept_error", stats.accept_errors)]
    {
        e.sample(conn, &[("outcome", what)], n);
    }
    let closed = "netlane_nvme_target_closed_total";
    e.family(closed, "Connections closed, by reason.", Kind::Counter);
    for (reason, n) in &stats.closed {
        e.sample(closed, &[("reason", reason)], n);
    }
    // The subsystem's counters under their own names (what the SMART log reports).
    e.counters("netlane_nvme_target", &stats.subsystem);
    // The target-wide sum first (queue="all"), then each live queue.
    let mut all = queues.closed.clone();
    for q in queues.live.values() {
        merge_queue_stats(&mut all, &q.stats);
    }
    let mut rows: Vec<Row<'_>> = vec![(vec![("queue", "all".to_string())], &all)];
    let opt = |v: Option<u16>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
    for (conn, q) in &queues.live {
        let labels = vec![
            ("queue", conn.to_string()),
            ("cntlid", opt(q.cntlid)),
            ("qid", opt(q.qid)),
            ("peer", q.peer.to_string()),
        ];
        rows.push((labels, &q.stats));
    }
    queue_families(&mut e, &rows);
    e.finish()
}

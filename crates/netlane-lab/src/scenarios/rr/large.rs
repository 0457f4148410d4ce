//! The rr scenario's large part: 8 KiB responses IP-fragmented at MTU 1500, whole at MTU
//! 9000, and as GSO segments read with GRO (the talk's jumbo-frame result); and 8 KiB
//! requests in IP fragments, which the stack reassembles for recvmmsg and the packet
//! rings reassemble themselves. Its modes, table, chart and checks.

use std::net::SocketAddr;

use netlane_report::{Axis, Chart, ChartKind, Check, Column, Point, Series, Table};
use netlane_rr::clients::ClientsConfig;
use netlane_rr::proto::client::ClientConfig;
use netlane_rr::proto::server::ResponderConfig;
use netlane_rr::server::{PathKind as RxPathKind, ServerConfig};

use crate::scenarios::Sections;
use crate::stats::{Spread, sig};
use crate::verdict::{Measure, Spec};

use super::report::{columns, responses_per_s, row};
use super::*;

/// The large part's modes.
pub(super) const LARGE: [&str; 3] = ["8K fragmented, MTU 1500", "8K whole, MTU 9000", "8K GSO segments, MTU 1500"];

/// The paths the large part sends 8 KiB requests to (IP fragments at MTU 1500): the
/// stack reassembles them for recvmmsg, the rings reassemble them themselves.
pub(super) const FRAGMENTED_REQUEST_PATHS: [RxPathKind; 3] =
    [RxPathKind::Recvmmsg, RxPathKind::TpacketV2, RxPathKind::TpacketV3];

/// Bytes of a fragmented request.
pub(super) const FRAGMENTED_REQUEST: usize = 8192;

/// A large-part run of 8 KiB requests to `p`.
pub(super) fn fragmented_request_label(p: RxPathKind) -> String {
    format!("8K requests fragmented, MTU 1500, {p}")
}

/// Responses per second of a run of fragmented requests; on a ring path, invalid
/// unless the ring put together every request it answered (a request that came whole
/// would not show what reassembly costs).
fn reassembled_throughput(r: &RrRun) -> Measure {
    let c = &r.server.counters;
    if r.server.path.parse::<RxPathKind>().is_ok_and(RxPathKind::is_ring) && c.ring_reassembled < c.frames {
        return Err(format!("the ring reassembled {} of {} requests", c.ring_reassembled, c.frames));
    }
    throughput(r)
}

impl RrBenchArgs {
    /// The large part's modes, the server listening on `addr`.
    pub(super) fn large_modes(&self, addr: SocketAddr) -> Vec<Mode> {
        let mut modes = Vec::new();
        let part = Part::Large;
        let mut m = |label: String, mtu, server, clients| modes.push(Mode { part, label, mtu, server, clients });
        let clients = |n: usize, response: usize, time| self.population(addr, n, response, time, self.think);
        let server = |path: RxPathKind, block: u32| self.server(addr, path, block);
        let rm = server(RxPathKind::Recvmmsg, self.block);
        let gso = ServerConfig {
            responder: ResponderConfig { segment: Some(1472), ..ResponderConfig::default() },
            ..rm.clone()
        };
        let c = clients(self.clients, 8192, self.time);
        m(LARGE[0].into(), 1500, rm.clone(), c.clone());
        m(LARGE[1].into(), 9000, rm, c.clone());
        m(LARGE[2].into(), 1500, gso, ClientsConfig { gro: true, ..c });
        let asking = clients(self.clients, self.response, self.time);
        let asking =
            ClientsConfig { client: ClientConfig { request_len: FRAGMENTED_REQUEST, ..asking.client }, ..asking };
        for p in FRAGMENTED_REQUEST_PATHS {
            m(fragmented_request_label(p), 1500, server(p, self.block), asking.clone());
        }
        modes
    }

    /// The large part's checks.
    pub(super) fn large_checks(&self, runs: &Runs<'_>) -> Vec<Check> {
        let mut checks = vec![
            pair(
                runs,
                Spec::at_least(
                    "rr.jumbo-throughput",
                    "8 KiB responses: MTU 9000 raises throughput over IP fragments at 1500 (talk: ~24 K -> ~34 K, 1.4x)",
                    1.2,
                    "x",
                ),
                Part::Large,
                LARGE[1],
                LARGE[0],
                throughput,
                "MTU 9000 / MTU 1500 responses/s",
            ),
            pair(
                runs,
                Spec::at_most(
                    "rr.jumbo-latency",
                    "8 KiB responses: MTU 9000 lowers p50 latency (talk: ~2700 -> ~1800 us, 0.67x)",
                    0.85,
                    "x",
                ),
                Part::Large,
                LARGE[1],
                LARGE[0],
                p50,
                "MTU 9000 / MTU 1500 p50",
            ),
            pair(
                runs,
                Spec::at_least(
                    "rr.gso-segments-throughput",
                    "8 KiB responses: GSO segments read with GRO beat IP fragments at MTU 1500",
                    1.0,
                    "x",
                ),
                Part::Large,
                LARGE[2],
                LARGE[0],
                throughput,
                "GSO segments / fragments responses/s",
            ),
        ];
        // Requests in IP fragments, which a ring sees as fragments: it reassembles
        // them in user space, against the stack reassembling them for recvmmsg.
        let stack = fragmented_request_label(RxPathKind::Recvmmsg);
        for p in [RxPathKind::TpacketV2, RxPathKind::TpacketV3] {
            checks.push(pair(
                runs,
                Spec::at_least(
                    &format!("rr.fragmented-requests-{}", p.name()),
                    format!("8 KiB requests in IP fragments: {p} reassembling them itself vs recvmmsg (the stack's)"),
                    0.8,
                    "x",
                ),
                Part::Large,
                &fragmented_request_label(p),
                &stack,
                reassembled_throughput,
                &format!("{p} / recvmmsg responses/s"),
            ));
        }
        checks
    }

    /// 8 KiB responses: the table, the throughput chart, and the fragmented runs'
    /// retransmissions.
    pub(super) fn large_section(&self, runs: &Runs<'_>, out: &mut Sections) {
        let mut t = Table::new(
            "rr-large",
            format!("8 KiB responses, {} clients, recvmmsg, medians of {} rounds", self.clients, self.repeat),
            columns("responses"),
        );
        let mut points = Vec::new();
        for (x, label) in LARGE.iter().enumerate() {
            let Some(rs) = runs.find(Part::Large, label) else { continue };
            t.push(row(label, rs));
            points.extend(Point::of(x as f64, &values(rs, throughput)));
        }
        out.tables.push(t);
        out.charts.push(Chart {
            name: "rr-large".into(),
            title: "8 KiB responses: responses per second".into(),
            kind: ChartKind::Bars,
            x: Axis::categories("responses", LARGE.iter().map(|s| s.to_string()).collect()),
            y: responses_per_s(),
            series: vec![Series { name: "responses/s".into(), points }],
        });
        self.fragmented_requests(runs, out);
        if let Some(rs) = runs.find(Part::Large, LARGE[0]) {
            let r: Vec<f64> = rs.iter().map(|r| r.clients.retransmits as f64).collect();
            if let Some(s) = Spread::of(&r).filter(|s| s.max > 0.0) {
                out.notes.push(format!(
                    "Fragmented responses needed {} retransmissions per run (median; {}..{}): a lost fragment \
                     loses the whole response.",
                    sig(s.median),
                    sig(s.min),
                    sig(s.max)
                ));
            }
        }
    }

    /// 8 KiB requests in IP fragments on each path: the table, with what the rings'
    /// reassembly counted.
    fn fragmented_requests(&self, runs: &Runs<'_>, out: &mut Sections) {
        let mut cols = columns("path");
        cols.push(Column::new("fragments_per_request", "fragments/request", 1));
        cols.push(Column::new("reassembly_dropped", "reassembly dropped", 0));
        let mut t = Table::new(
            "rr-fragmented-requests",
            format!(
                "{} KiB requests in IP fragments at MTU 1500 ({} B responses), {} clients, medians of {} rounds",
                FRAGMENTED_REQUEST / 1024,
                self.response,
                self.clients,
                self.repeat
            ),
            cols,
        );
        for p in FRAGMENTED_REQUEST_PATHS {
            let Some(rs) = runs.find(Part::Large, &fragmented_request_label(p)) else { continue };
            let mut r = row(p.name(), rs);
            let ring = |f: fn(&netlane_rr::server::RrCounters) -> u64| {
                med(rs, move |r: &RrRun| if p.is_ring() { Ok(f(&r.server.counters) as f64) } else { Err("-".into()) })
            };
            r.cells.push(med(rs, move |r: &RrRun| {
                let c = &r.server.counters;
                if !p.is_ring() || c.ring_reassembled == 0 {
                    return Err("the stack reassembled them".into());
                }
                Ok(c.ring_fragments as f64 / c.ring_reassembled as f64)
            }));
            r.cells.push(ring(|c| c.ring_reasm_given_up + c.ring_reasm_over_memory + c.ring_reasm_refused));
            t.push(r);
        }
        if !t.rows.is_empty() {
            out.tables.push(t);
            out.notes.push(
                "Fragmented requests: a packet ring gets copies of the frames, so it sees the fragments and puts \
                 them together itself (bounded as the kernel bounds its own: 30 s, 4 MiB, 1 MiB a source, \
                 overlapping fragments drop the datagram). The stack still gets the frames too and reassembles them \
                 for the service socket, whose filter drops the copy: on a ring path the server's CPU pays for \
                 both reassemblies."
                    .into(),
            );
        }
    }
}

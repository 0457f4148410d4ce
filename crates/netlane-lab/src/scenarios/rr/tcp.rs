//! The rr scenario's TCP part, the talk's RDS-over-TCP point: the same requests and
//! answers over a TCP connection per client beside UDP datagrams (recvmmsg), the same
//! clients and sizes. Its wall (throughput and latency from 1 to 128 clients) and 8 KiB
//! responses at MTU 1500 and 9000: TCP sends segments of up to 64 KiB whatever the MTU
//! (TSO, or GSO where the device has no TSO), so jumbo frames should gain it less than
//! they gain IP-fragmented datagrams.

use std::net::SocketAddr;
use std::time::Duration;

use netlane_report::{Axis, Chart, ChartKind, Check, Point, Scale, Series, Table, Unit};
use netlane_rr::clients::{ClientsConfig, Transport};
use netlane_rr::server::{PathKind as RxPathKind, ServerConfig};

use crate::scenarios::Sections;
use crate::stats::median;
use crate::verdict::{Measure, Spec, paired, ratio};

use super::report::{columns, row};
use super::*;

/// The least gain jumbo frames must give UDP for TCP's to be compared with it.
const UDP_GAIN_SHOWN: f64 = 1.1;

/// Client counts of the TCP part's wall.
pub(super) const TCP_CLIENTS: [usize; 4] = [1, 8, 32, 128];

/// The jumbo runs: (transport, MTU).
const JUMBO: [(Transport, u32); 4] =
    [(Transport::Udp, 1500), (Transport::Udp, 9000), (Transport::Tcp, 1500), (Transport::Tcp, 9000)];

/// A wall run's label.
pub(super) fn tcp_wall_label(t: Transport, clients: usize) -> String {
    format!("{t}, {clients} clients")
}

/// A jumbo run's label.
fn jumbo_label(t: Transport, mtu: u32) -> String {
    format!("{t} 8K, MTU {mtu}")
}

/// Responses per second of a run, invalid unless it ran over the transport it names
/// and, over TCP, every client kept its connection.
fn throughput_over(t: Transport) -> fn(&RrRun) -> Measure {
    fn over(r: &RrRun, tcp: bool) -> Measure {
        if (r.server.path == "tcp") != tcp {
            return Err(format!("the server ran {}, not the transport asked", r.server.path));
        }
        let c = &r.server.counters;
        if tcp && (c.connections_refused > 0 || r.clients.recv_errors > 0) {
            return Err(format!(
                "{} connections refused, {} closed under their clients",
                c.connections_refused, r.clients.recv_errors
            ));
        }
        throughput(r)
    }
    match t {
        Transport::Udp => |r| over(r, false),
        Transport::Tcp => |r| over(r, true),
    }
}

impl RrBenchArgs {
    /// The TCP part's modes, the server listening on `addr`.
    pub(super) fn tcp_modes(&self, addr: SocketAddr) -> Vec<Mode> {
        let part = Part::Tcp;
        let over = |t: Transport, mtu: u32, n: usize, response: usize, time: Duration| {
            let server = ServerConfig {
                transport: t,
                max_connections: n.max(1),
                ..self.server(addr, RxPathKind::Recvmmsg, self.block)
            };
            let clients = ClientsConfig { transport: t, ..self.population(addr, n, response, time, self.think) };
            (mtu, server, clients)
        };
        let mut modes = Vec::new();
        let wall_time = self.time.min(Duration::from_secs(1));
        for c in TCP_CLIENTS {
            for t in [Transport::Udp, Transport::Tcp] {
                let (mtu, server, clients) = over(t, self.mtu, c, self.response, wall_time);
                modes.push(Mode { part, label: tcp_wall_label(t, c), mtu, server, clients });
            }
        }
        for (t, mtu) in JUMBO {
            let (mtu, server, clients) = over(t, mtu, self.clients, 8192, self.time);
            modes.push(Mode { part, label: jumbo_label(t, mtu), mtu, server, clients });
        }
        modes
    }

    /// TCP's gain from jumbo frames against UDP's, round by round.
    pub(super) fn tcp_checks(&self, runs: &Runs<'_>) -> Vec<Check> {
        let spec = Spec::below(
            "rr.tcp-jumbo-gain-vs-udp",
            "8 KiB responses: TCP's throughput gain from MTU 9000 vs UDP's (talk: RDS over TCP gains less)",
            1.0,
            "x",
        );
        let find = |t, mtu| runs.find(Part::Tcp, &jumbo_label(t, mtu));
        let gain = |t| match (find(t, 9000), find(t, 1500)) {
            (Some(a), Some(b)) => Some(paired(a, b, throughput_over(t))),
            _ => None,
        };
        let check = match (gain(Transport::Tcp), gain(Transport::Udp)) {
            (Some(tcp), Some(udp)) => {
                // Unless jumbo frames gain UDP something, there is no gain for TCP's to
                // fall short of: the comparison would be noise.
                let udp_gains: Vec<f64> = udp.iter().filter_map(|g| g.as_ref().ok().copied()).collect();
                let udp_gain = if udp_gains.is_empty() { 0.0 } else { median(udp_gains) };
                if udp_gain < UDP_GAIN_SHOWN {
                    spec.invalid(format!(
                        "MTU 9000 gained UDP {udp_gain:.2}x (median), below {UDP_GAIN_SHOWN}x: nothing to compare \
                         TCP's gain with"
                    ))
                } else {
                    spec.evaluate(
                        tcp.into_iter().zip(udp).map(|(t, u)| ratio(t, u)).collect(),
                        "(TCP MTU 9000 / 1500) / (UDP MTU 9000 / 1500) responses/s, per round",
                    )
                }
            }
            _ => spec.skipped("the tcp part did not run its four 8 KiB runs"),
        };
        vec![check]
    }

    /// The TCP part's tables and the wall chart.
    pub(super) fn tcp_section(&self, runs: &Runs<'_>, out: &mut Sections) {
        let mut wall = Table::new(
            "rr-tcp-wall",
            format!(
                "UDP (recvmmsg) and TCP, {} B responses, 1 to 128 clients, medians of {} rounds",
                self.response, self.repeat
            ),
            columns("transport, clients"),
        );
        let mut series = Vec::new();
        for t in [Transport::Udp, Transport::Tcp] {
            let mut points = Vec::new();
            for c in TCP_CLIENTS {
                let Some(rs) = runs.find(Part::Tcp, &tcp_wall_label(t, c)) else { continue };
                wall.push(row(&tcp_wall_label(t, c), rs));
                let (tp, lat) = (values(rs, throughput_over(t)), values(rs, p50));
                if !tp.is_empty() && !lat.is_empty() {
                    points.push(Point { x: median(tp), y: median(lat) / 1e9, low: None, high: None });
                }
            }
            series.push(Series { name: t.to_string(), points });
        }
        let mut jumbo = Table::new(
            "rr-tcp-jumbo",
            format!("8 KiB responses over UDP and TCP at MTU 1500 and 9000, {} clients", self.clients),
            columns("transport, MTU"),
        );
        for (t, mtu) in JUMBO {
            if let Some(rs) = runs.find(Part::Tcp, &jumbo_label(t, mtu)) {
                jumbo.push(row(&jumbo_label(t, mtu), rs));
            }
        }
        if wall.rows.is_empty() && jumbo.rows.is_empty() {
            return;
        }
        out.tables.extend([wall, jumbo]);
        out.charts.push(Chart {
            name: "rr-tcp-wall".into(),
            title: "UDP and TCP: p50 latency against responses per second as clients grow (1..128)".into(),
            kind: ChartKind::Lines,
            x: super::report::responses_per_s(),
            y: Axis::numeric("p50 latency", Unit::Seconds, Scale::Log),
            series,
        });
        out.notes.push(
            "TCP part: one connection per client, requests and answers as the same messages the datagrams carry \
             (no cookies: the handshake verified the source), the server one thread on one epoll like the \
             datagram paths. At MTU 9000 UDP's 8 KiB response fits one datagram instead of six IP fragments; \
             TCP already sent it in large segments."
                .into(),
        );
    }
}

//! `netlane rr clients`, alone, as an agent, or coordinating agents on other hosts.

use netlane_report::options::parse_endpoint;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use netlane::cpus::CpuList;
use netlane::metrics::sla::Sla;
use netlane_report::options::{parse_duration, parse_positive_duration, parse_size_usize};
use netlane_rr::clients::{ClientsConfig, ClientsReport, Load, Transport};
use netlane_rr::proto::client::ClientConfig;
use netlane_rr::proto::wire::HEADER_LEN;

use crate::agents::AgentHostsArgs;
use crate::documents::RrClients;
use crate::out::{self, OutputArgs};
use crate::signals::{STOP, StartGate};

/// `netlane rr clients`.
#[derive(Debug, Args)]
pub struct ClientsArgs {
    /// Server address: HOST:PORT (IPv4 or IPv6), or a host alone (port 7070).
    #[arg(long, default_value = "127.0.0.1:7070", value_parser = |s: &str| parse_endpoint(s, Some(7070)))]
    pub server: SocketAddr,
    /// Clients, each with its own socket.
    #[arg(long, default_value_t = 64)]
    pub clients: usize,
    /// Threads the clients are spread over.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// CPUs the threads are pinned to, as a CPU list (thread i on the i-th) [default: unbound].
    #[arg(long, value_parser = netlane::cpus::parse_list)]
    pub cpus: Option<CpuList>,
    /// Request size in bytes (header included; at least 40).
    #[arg(long, default_value = "512", value_parser = parse_size_usize)]
    pub request: usize,
    /// Response size in bytes (header included; at least 40).
    #[arg(long, default_value = "8K", value_parser = parse_size_usize)]
    pub response: usize,
    /// The server echoes (a standard UDP echo server): the response is the request.
    #[arg(long)]
    pub echo: bool,
    /// Closed loop: think time between a response and the next request.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub think: Duration,
    /// Open loop: Poisson arrivals at this many requests per second in all (`50k`;
    /// instead of the closed loop).
    #[arg(long, value_parser = netlane_report::options::parse_count_f64)]
    pub rate: Option<f64>,
    /// Open loop: most requests in flight per client.
    #[arg(long, default_value_t = 64)]
    pub in_flight: usize,
    /// Send a request again when its response has not come within this.
    #[arg(long, default_value = "200ms", value_parser = parse_positive_duration)]
    pub timeout: Duration,
    /// Retransmissions before a request is given up (counted as lost).
    #[arg(long, default_value_t = 3)]
    pub retries: u32,
    /// Read responses with UDP_GRO (for a server sending segments with --segment).
    #[arg(long)]
    pub gro: bool,
    /// udp (a socket per client) or tcp (a connection per client to `rr serve
    /// --transport tcp`, closed loop).
    #[arg(long, default_value = "udp")]
    pub transport: Transport,
    /// Measured time.
    #[arg(short = 't', long, default_value = "5s", value_parser = parse_positive_duration)]
    pub time: Duration,
    /// Time before measuring starts.
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    pub ramp: Duration,
    /// Mixed into the open loop's arrival times (runs with different seeds send at
    /// different moments).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub hosts: AgentHostsArgs,
    /// Run as one agent of a population that `--agents` or the lab coordinates (it starts
    /// this, with this agent's share of --clients and --rate; --threads at most its
    /// clients, --cpus as given): make every socket, say `ready` on standard error, start
    /// on SIGUSR1 (within a minute), and write the run's whole latency histogram with its
    /// report.
    #[arg(long)]
    pub agent: bool,
    /// A tail-latency objective, like p99=1ms (a lost request counts as slower than any
    /// answer): the run says whether it held. With --agents, on two or more hosts.
    #[arg(long, conflicts_with = "agent")]
    pub sla: Option<Sla>,
    /// Exit with status 3 when the run missed --sla.
    #[arg(long, requires = "sla")]
    pub strict: bool,
    /// Write the results as JSON to FILE, or to stdout with `-` (the default when no FILE
    /// is given; nothing else is written to stdout then).
    #[arg(long, value_name = "FILE|-", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<std::path::PathBuf>,
    /// Write the run's figures as CSV into DIR (created if missing): rr-clients.csv, one
    /// row led by the run's id (files of several runs concatenate).
    #[arg(long, value_name = "DIR", conflicts_with = "agent")]
    pub csv: Option<std::path::PathBuf>,
}

impl ClientsArgs {
    /// The population these arguments give.
    fn config(&self) -> Result<ClientsConfig> {
        if self.response < HEADER_LEN && !self.echo {
            bail!("--response {}: at least {HEADER_LEN} bytes (the header)", self.response);
        }
        let response_len = u32::try_from(self.response.saturating_sub(HEADER_LEN))
            .with_context(|| format!("--response {}", self.response))?;
        let (load, max_outstanding) = match self.rate {
            Some(rate) => (Load::Open { rate }, self.in_flight),
            None => (Load::Closed { think: self.think }, 1),
        };
        Ok(ClientsConfig {
            server: self.server,
            clients: self.clients,
            threads: self.threads,
            cpus: self.cpus.clone(),
            client: ClientConfig {
                request_len: self.request,
                response_len,
                echo: self.echo,
                timeout_ns: self.timeout.as_nanos() as u64,
                max_retries: self.retries,
                max_outstanding,
            },
            load,
            ramp: self.ramp,
            duration: self.time,
            gro: self.gro,
            seed: self.seed,
            transport: self.transport,
        })
    }

    pub(super) fn run(&self) -> Result<u8> {
        let out = OutputArgs { json: self.json.clone(), csv: self.csv.clone() };
        out.validate()?;
        let cfg = self.config()?;
        if self.sla.is_some() && self.hosts.agents.len() == 1 {
            bail!("--sla with --agents needs two or more hosts (one host alone sends no latency histogram)");
        }
        cfg.validate()?;
        // The agents' CPUs with --agents, which they check on their machines.
        if let (Some(cpus), false) = (&cfg.cpus, self.hosts.any()) {
            cpus.check_online().context("--cpus")?;
        }
        if self.hosts.any() {
            netlane_rr::clients::split(&cfg, self.hosts.agents.len()).context("--agents")?;
        }
        if self.agent {
            // The coordinator judges the run, so one that measured nothing is written and
            // exits 0 like any other.
            let gate = StartGate::register()?;
            let ready = format!("ready: {} clients to {}", cfg.clients, cfg.server);
            let (report, hist) = netlane_rr::clients::run_gated(&cfg, STOP.flag(), || {
                gate.wait(&ready).map_err(netlane_rr::clients::ClientsError::Invalid)
            })?;
            let agent = Some(netlane_rr::clients::AgentOutput::of(&hist));
            let doc = RrClients { report, agent, agents: None, sla: None, sla_met: None, sla_latency_ns: None };
            out.write_json(&netlane_report::document("rr-clients", doc))?;
            return Ok(0);
        }
        let (rep, hist, agents) = if self.hosts.any() {
            // Connected (and their netlane checked) before any of them runs.
            let hosts = self.hosts.connect()?;
            let (rep, hist, parts, ()) = netlane_lab::scenarios::rr::run_clients(&hosts.agents(), &cfg, || Ok(()))?;
            (rep, hist, Some(parts))
        } else {
            let mut status = out::LiveStatus::new("responses/s");
            let (rep, hist) = netlane_rr::clients::run_observed(&cfg, STOP.flag(), &mut |s| status.show(s))?;
            status.done();
            (rep, Some(hist), None)
        };
        let judged = match (self.sla, &hist) {
            (Some(sla), Some(h)) => {
                // Requests still in flight when the run stopped are left out: the clients
                // stop at the end of the window without waiting, so a closed loop always
                // ends with some, which may yet be answered.
                let at = netlane_rr::clients::latency_at(h, rep.lost, sla.quantile());
                Some((sla, at, sla.is_met_at(at)))
            }
            _ => None,
        };
        if !out.json_to_stdout() {
            for a in agents.iter().flatten() {
                out::println(&format!(
                    "agent {}: {} clients, {:.0} responses/s, latency p50 {:.1} us p99 {:.1} us, lost {}, CPU {:.2} s",
                    a.host,
                    a.clients,
                    a.responses_per_s,
                    a.latency_ns.p50 as f64 / 1e3,
                    a.latency_ns.p99 as f64 / 1e3,
                    a.lost,
                    a.cpu_s
                ));
            }
            print_report(&rep);
            if let Some((sla, at, met)) = judged {
                out::println(&out::sla_line(&sla, at, met));
            }
        }
        let nothing = rep.responses == 0;
        let body = RrClients {
            report: rep,
            agent: None,
            agents,
            sla: judged.map(|(sla, _, _)| sla.to_string()),
            sla_met: judged.map(|(_, _, met)| met),
            sla_latency_ns: judged.and_then(|(_, at, _)| at),
        };
        let doc = netlane_report::document("rr-clients", body);
        out.write_json(&doc)?;
        out.write_tables(&doc.provenance.run_id, &[clients_table(&doc.body)])?;
        if nothing {
            let r = &doc.body.report;
            bail!(
                "no response from {} in {:.1} s ({} requests, {} retransmits, {} receive errors such as ICMP port \
                 unreachable)",
                r.server,
                r.seconds,
                r.requests,
                r.retransmits,
                r.recv_errors
            );
        }
        Ok(if self.strict && judged.is_some_and(|(_, _, met)| !met) { crate::out::EXIT_STRICT } else { 0 })
    }
}

/// The run as one CSV row.
fn clients_table(d: &RrClients) -> netlane_report::Table {
    use netlane_report::{Column, Row, Table, Value};
    let r = &d.report;
    let l = &r.latency_ns;
    let us = |ns: u64| Value::num(ns as f64 / 1e3);
    let mut t = Table::new(
        "rr-clients",
        "The clients' run",
        vec![
            Column::new("server", "server", 0),
            Column::new("clients", "clients", 0),
            Column::new("load", "loop", 0),
            Column::new("seconds", "s", 1),
            Column::new("responses_per_s", "responses/s", 0),
            Column::new("p50_us", "p50 us", 1),
            Column::new("p99_us", "p99 us", 1),
            Column::new("p999_us", "p99.9 us", 1),
            Column::new("p9999_us", "p99.99 us", 1),
            Column::new("max_us", "max us", 1),
            Column::new("requests", "requests", 0),
            Column::new("responses", "responses", 0),
            Column::new("lost", "lost", 0),
            Column::new("retransmits", "retransmits", 0),
            Column::new("corrupt", "corrupt", 0),
            Column::new("mismatched", "mismatched", 0),
            Column::new("cpu_s", "CPU s", 3),
            Column::new("sla", "SLA", 0),
            Column::new("sla_met", "SLA met", 0),
        ],
    );
    t.push(Row::new(vec![
        Value::text(&r.server),
        Value::Int(r.clients as u64),
        Value::text(&r.load),
        Value::num(r.seconds),
        Value::num(r.responses_per_s),
        us(l.p50),
        us(l.p99),
        us(l.p999),
        us(l.p9999),
        us(l.max),
        Value::Int(r.requests),
        Value::Int(r.responses),
        Value::Int(r.lost),
        Value::Int(r.retransmits),
        Value::Int(r.corrupt),
        Value::Int(r.mismatched),
        Value::num(r.cpu_s),
        d.sla.as_ref().map_or(Value::Missing, Value::text),
        d.sla_met.map_or(Value::Missing, |m| Value::text(if m { "yes" } else { "no" })),
    ]));
    t
}

/// The merged report, two lines.
fn print_report(rep: &ClientsReport) {
    let l = &rep.latency_ns;
    out::println(&format!(
        "{} clients ({} loop) -> {}: {:.0} responses/s over {:.1} s, latency p50 {:.1} us p99 {:.1} us \
             p99.99 {:.1} us max {:.1} us",
        rep.clients,
        rep.load,
        rep.server,
        rep.responses_per_s,
        rep.seconds,
        l.p50 as f64 / 1e3,
        l.p99 as f64 / 1e3,
        l.p9999 as f64 / 1e3,
        l.max as f64 / 1e3,
    ));
    out::println(&format!(
        "requests={} responses={} retransmits={} lost={} late={} duplicates={} corrupt={} mismatched={} \
             arrivals_dropped={} send_errors={} recv_errors={} in_flight_at_end={} cpu_s={:.3} wakeups={} \
             woken_per_wakeup={:.2} max_woken={} woken_in_herds={} (wake-ups of {}+ sockets)",
        rep.requests,
        rep.responses,
        rep.retransmits,
        rep.lost,
        rep.late,
        rep.duplicates,
        rep.corrupt,
        rep.mismatched,
        rep.arrivals_dropped,
        rep.send_errors,
        rep.recv_errors,
        rep.in_flight_at_end,
        rep.cpu_s,
        rep.wakeups,
        if rep.wakeups > 0 { rep.woken_sockets as f64 / rep.wakeups as f64 } else { 0.0 },
        rep.max_woken_sockets,
        rep.herd_woken_sockets,
        netlane_rr::clients::HERD,
    ));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::parse_command;

    /// The same for the lab's client populations: closed and open loop.
    #[test]
    fn the_lab_s_client_arguments_give_back_its_population() {
        let closed = ClientsConfig {
            server: "10.0.0.1:7070".parse().unwrap(),
            clients: 64,
            threads: 1,
            cpus: Some(CpuList::one(0)),
            client: ClientConfig {
                request_len: 512,
                response_len: 8192 - HEADER_LEN as u32,
                echo: false,
                timeout_ns: 500_000_000,
                max_retries: 5,
                max_outstanding: 1,
            },
            load: Load::Closed { think: Duration::from_micros(250) },
            ramp: Duration::from_millis(300),
            duration: Duration::from_millis(2500),
            gro: false,
            seed: 0,
            transport: Transport::Udp,
        };
        let tcp = ClientsConfig { transport: Transport::Tcp, ..closed.clone() };
        let open = ClientsConfig {
            load: Load::Open { rate: 25_000.5 },
            client: ClientConfig { max_outstanding: 8, echo: true, ..closed.client },
            threads: 2,
            cpus: None,
            gro: true,
            seed: 3,
            ..closed.clone()
        };
        for cfg in [closed, open, tcp] {
            let args = netlane_lab::scenarios::rr::clients_args(&cfg);
            assert_eq!(args[..2], ["rr", "clients"]);
            let parsed = parse_command::<ClientsArgs>(&args);
            assert_eq!(format!("{:?}", parsed.config().unwrap()), format!("{cfg:?}"), "{args:?}");
        }
    }
}

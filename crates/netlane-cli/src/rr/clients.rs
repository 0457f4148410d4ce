//! `netlane rr clients`, alone, as an agent, or coordinating agents on other hosts.

use netlane_report::options::parse_endpoint;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use netlane::cpus::CpuList;
use netlane_report::options::{parse_duration, parse_positive_duration, parse_size_usize};
use netlane_rr::clients::{ClientsConfig, ClientsReport, Load};
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
    /// Write the results as JSON to FILE, or to stdout with `-` (the default when no FILE
    /// is given; nothing else is written to stdout then).
    #[arg(long, value_name = "FILE|-", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<std::path::PathBuf>,
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
        })
    }

    pub(super) fn run(&self) -> Result<u8> {
        let out = OutputArgs { json: self.json.clone(), csv: None };
        out.validate()?;
        let cfg = self.config()?;
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
            out.write_json(&netlane_report::document("rr-clients", RrClients { report, agent, agents: None }))?;
            return Ok(0);
        }
        let (rep, agents) = if self.hosts.any() {
            // Connected (and their netlane checked) before any of them runs.
            let hosts = self.hosts.connect()?;
            let (rep, parts, ()) = netlane_lab::scenarios::rr::run_clients(&hosts.agents(), &cfg, || Ok(()))?;
            (rep, Some(parts))
        } else {
            (netlane_rr::clients::run(&cfg, STOP.flag())?, None)
        };
        if !out.json_to_stdout() {
            for a in agents.iter().flatten() {
                out::println(&format!(
                    "agent {}: {} clients, {:.0} responses/s, latency p50 {:.1} us p99 {:.1} us, lost {}, CPU {:.2} s",
                    a.host, a.clients, a.responses_per_s, a.p50_us, a.p99_us, a.lost, a.cpu_s
                ));
            }
            print_report(&rep);
        }
        let nothing = rep.responses == 0;
        let doc = netlane_report::document("rr-clients", RrClients { report: rep, agent: None, agents });
        out.write_json(&doc)?;
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
        Ok(0)
    }
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
        };
        let open = ClientsConfig {
            load: Load::Open { rate: 25_000.5 },
            client: ClientConfig { max_outstanding: 8, echo: true, ..closed.client },
            threads: 2,
            cpus: None,
            gro: true,
            seed: 3,
            ..closed.clone()
        };
        for cfg in [closed, open] {
            let args = netlane_lab::scenarios::rr::clients_args(&cfg);
            assert_eq!(args[..2], ["rr", "clients"]);
            let parsed = parse_command::<ClientsArgs>(&args);
            assert_eq!(format!("{:?}", parsed.config().unwrap()), format!("{cfg:?}"), "{args:?}");
        }
    }
}

//! `netlane kv load`: the load generator's arguments, runs and searches, and its report.

use netlane_report::options::parse_endpoint;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::documents::KvLoad;
use anyhow::{Context, Result, bail};
use clap::Args;
use netlane_kv::load::schedule::{Arrivals, Pacing, Process};
use netlane_kv::load::search::{GENERATOR_LAG_MAX, SearchConfig};
use netlane_kv::load::stats::Sla;
use netlane_kv::loadgen::{self, LoadConfig, LoadReport};

/// The percentiles `kv load` prints, as an SLA names them.
const PERCENTILES: [&str; 5] = ["p50", "p90", "p99", "p99.9", "p99.99"];
use netlane_lab::scenarios::kv::WorkloadArgs;
use netlane_report::options::{OptionList, parse_duration, parse_positive_duration, parse_size_usize};

use super::agents;
use crate::agents::AgentHostsArgs;
use crate::out::{self, OutputArgs};
use crate::signals::STOP;

/// `netlane kv load`.
#[derive(Debug, Args)]
pub struct LoadArgs {
    /// The server (any memcached-protocol server): HOST:PORT, or a host alone (port
    /// 11211).
    #[arg(long, default_value = "127.0.0.1:11211", value_parser = |s: &str| parse_endpoint(s, Some(11211)))]
    pub server: SocketAddr,
    /// TCP connections.
    #[arg(short = 'c', long, default_value_t = 64)]
    pub connections: u32,
    /// Threads the connections are spread over.
    #[arg(short = 't', long, default_value_t = 1)]
    pub threads: usize,
    /// CPUs the threads are pinned to (a CPU list) [default: not pinned].
    #[arg(long, value_parser = netlane::cpus::parse_list)]
    pub cpus: Option<netlane::cpus::CpuList>,
    /// Open loop: total requests per second over all connections (`10k`, `1.5M`).
    #[arg(long, conflicts_with = "closed", default_value_t = 10_000.0, value_parser = netlane_report::options::parse_count_f64)]
    pub rate: f64,
    /// Arrival process of the open loop: poisson, constant or etc (Facebook's ETC gaps).
    #[arg(long, default_value = "poisson")]
    pub arrival: Process,
    /// Closed loop instead (memtier-style): this many requests in flight per connection,
    /// the next sent when one is answered; latency from the actual send.
    #[arg(long, value_name = "DEPTH")]
    pub closed: Option<u32>,
    /// The workload.
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// The server's item size limit (values are clamped to it).
    #[arg(long, default_value = "1m", value_parser = parse_size_usize)]
    pub item_max: usize,
    /// How long requests are scheduled (per run with --search).
    #[arg(long, visible_alias = "time", default_value = "5s", value_parser = parse_positive_duration)]
    pub duration: Duration,
    /// Before the measured --duration, how long requests are sent but not measured
    /// (connections and caches settle).
    #[arg(long, default_value = "200ms", value_parser = parse_duration)]
    pub ramp: Duration,
    /// After the window, how long the last replies are awaited (then they count as
    /// unanswered).
    #[arg(long, default_value = "1s", value_parser = parse_positive_duration)]
    pub drain: Duration,
    /// Most requests in flight per connection.
    #[arg(long, default_value_t = 64)]
    pub max_in_flight: u32,
    /// A send later than this after its scheduled time is counted as late.
    #[arg(long, default_value = "100us", value_parser = parse_positive_duration)]
    pub late_after: Duration,
    /// Seed of every random draw.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Do not store every key before the run (which, with --agents, the first agent's host does).
    #[arg(long)]
    pub no_warmup: bool,
    /// Store every key, then exit without a run (a warm-up before runs of their own).
    #[arg(long, conflicts_with_all = ["no_warmup", "search"])]
    pub warmup_only: bool,
    /// A tail-latency objective, like p99.9=1ms: the run says whether it held.
    #[arg(long)]
    pub sla: Option<Sla>,
    /// Find the highest offered rate that holds --sla (bisection over runs of
    /// --duration, the best re-run to confirm it).
    #[arg(long, requires = "sla")]
    pub search: bool,
    /// Search: the lowest rate tried.
    #[arg(long, default_value_t = 1000.0)]
    pub search_lo: f64,
    /// Search: the highest rate tried.
    #[arg(long, default_value_t = 1_000_000.0)]
    pub search_hi: f64,
    /// Search: stop when the bracket is narrower than this ratio.
    #[arg(long, default_value_t = 1.05)]
    pub resolution: f64,
    /// Search: most bisection runs.
    #[arg(long, default_value_t = 12)]
    pub max_bisections: u32,
    /// Exit 3 when the SLA was missed (a search: when no rate held it).
    #[arg(long, requires = "sla")]
    pub strict: bool,
    #[command(flatten)]
    pub hosts: AgentHostsArgs,
    /// Run as one agent of a run that `--agents` coordinates (it starts this, with this
    /// agent's share of --connections and --rate; --threads and --cpus as given): open
    /// every connection, say `ready` on standard error, start the schedule on SIGUSR1
    /// (within a minute), and write the run's whole latency histogram with its report. No
    /// warm-up.
    #[arg(long, conflicts_with_all = ["search", "warmup_only"])]
    pub agent: bool,
    /// Write the results as JSON to FILE, or to stdout with `-` (the default when no FILE
    /// is given; nothing else is written to stdout then).
    #[arg(long, value_name = "FILE|-", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<std::path::PathBuf>,
    /// Write the run's figures as CSV into DIR (created if missing): kv-load.csv, one row
    /// led by the run's id (files of several runs concatenate).
    #[arg(long, value_name = "DIR", conflicts_with_all = ["agent", "search", "warmup_only"])]
    pub csv: Option<std::path::PathBuf>,
}

impl LoadArgs {
    pub(crate) fn config(&self) -> Result<LoadConfig> {
        let item_max = u32::try_from(self.item_max).context("--item-max is too large")?;
        Ok(LoadConfig {
            server: self.server,
            connections: self.connections,
            threads: self.threads,
            cpus: self.cpus.as_ref().map(|c| c.as_slice().to_vec()),
            pacing: match self.closed {
                Some(depth) => Pacing::Closed { depth },
                None => Pacing::Open(Arrivals { process: self.arrival, rate_per_s: self.rate }),
            },
            workload: self.workload.spec(item_max),
            duration: self.duration,
            ramp: self.ramp,
            max_in_flight: self.max_in_flight,
            late_after: self.late_after,
            drain: self.drain,
            seed: self.seed,
        })
    }

    /// The search's range.
    pub(crate) fn range(&self) -> SearchConfig {
        SearchConfig {
            lo_per_s: self.search_lo,
            hi_per_s: self.search_hi,
            resolution: self.resolution,
            max_bisections: self.max_bisections,
        }
    }

    fn options(&self) -> OptionList {
        let list = OptionList::new()
            .text("server", self.server.to_string())
            .int("connections", u64::from(self.connections))
            .int("threads", self.threads as u64)
            .num("rate", self.rate)
            .text("arrival", self.arrival.to_string())
            .text("closed", self.closed.map_or("off".into(), |d| d.to_string()));
        self.workload
            .echo(list)
            .int("item-max", self.item_max as u64)
            .duration("duration", self.duration)
            .duration("ramp", self.ramp)
            .duration("drain", self.drain)
            .int("max-in-flight", u64::from(self.max_in_flight))
            .duration("late-after", self.late_after)
            .int("seed", self.seed)
            .flag("no-warmup", self.no_warmup)
            .flag("warmup-only", self.warmup_only)
            .text("sla", self.sla.map_or("none".into(), |s| s.to_string()))
            .flag("search", self.search)
            .words("agents", &self.hosts.agents)
            .flag("agent", self.agent)
    }

    pub(super) fn run(&self) -> Result<u8> {
        let out = OutputArgs { json: self.json.clone(), csv: self.csv.clone() };
        out.validate()?;
        let quiet = out.json_to_stdout();
        let opts = self.options();
        let mut doc = KvLoad {
            options: opts.object(),
            echo: opts.echo(),
            report: None,
            sla: self.sla.map(|s| s.to_string()),
            sla_met: None,
            sla_latency_ns: None,
            search: None,
            warmed_up_keys: None,
            agent: None,
            agents: None,
        };
        let cfg = self.config()?;
        // --cpus are the agents' with --agents, which check them on their machines.
        match self.hosts.any() {
            true => LoadConfig { cpus: None, ..cfg.clone() }.validate()?,
            false => cfg.validate()?,
        }
        let range = self.range();
        // Every option is checked before anything is written to the server.
        if self.search {
            loadgen::check_search(&cfg, range).context("--search")?;
        }
        if !self.hosts.agents.is_empty() {
            loadgen::split(&cfg, self.hosts.agents.len()).context("--agents")?;
        }
        if self.agent {
            return agents::run_as_agent(&cfg, doc, &out);
        }
        // Agents on other hosts, connected (and their netlane checked) before anything runs.
        let coordinator = if self.hosts.agents.is_empty() { None } else { Some(agents::Coordinator::connect(self)?) };
        if !self.no_warmup {
            let t = Instant::now();
            let n = match &coordinator {
                Some(c) => c.warm_up(&cfg)?,
                None => loadgen::warm_up(&cfg)?,
            };
            eprintln!("warm-up: stored {n} keys in {:.1} s", t.elapsed().as_secs_f64());
            doc.warmed_up_keys = Some(n);
        }
        if self.warmup_only {
            out.write_json(&netlane_report::document("kv-load", doc))?;
            return Ok(0);
        }
        if self.search {
            let sla = self.sla.context("--search needs --sla")?;
            let r = match &coordinator {
                Some(c) => {
                    let (r, steps) = c.search(&cfg, sla, range)?;
                    doc.agents = Some(steps);
                    r
                }
                None => loadgen::search(&cfg, sla, range, STOP.flag(), |p| eprintln!("{}", progress_line(p, sla)))?,
            };
            if !quiet {
                out::println(&self.search_line(&r));
            }
            let held = r.best_per_s.is_some();
            doc.search = Some(r);
            out.write_json(&netlane_report::document("kv-load", doc))?;
            return Ok(if self.strict && !held { 3 } else { 0 });
        }
        let r = match &coordinator {
            Some(c) => {
                let (run, step) = c.run(&cfg)?;
                if !quiet {
                    agents::print_agents(&step.agents);
                }
                doc.agents = Some(vec![step]);
                run
            }
            None => {
                let mut status = out::LiveStatus::new("requests/s");
                let run = loadgen::run_observed(&cfg, STOP.flag(), &mut |s| status.show(s));
                status.done();
                run?
            }
        };
        if !quiet {
            print_report(&r.report);
        }
        let mut missed = false;
        if let Some(sla) = self.sla {
            let m = r.stats.measure(&sla, cfg.duration.as_nanos() as u64);
            missed = !m.sla_met;
            doc.sla_met = Some(m.sla_met);
            doc.sla_latency_ns = m.sla_latency_ns;
            if !quiet {
                out::println(&out::sla_line(&sla, m.sla_latency_ns, m.sla_met));
            }
        }
        let failure = r.report.failure();
        doc.report = Some(r.report);
        // The report is written whatever happened: it says what was measured.
        let doc = netlane_report::document("kv-load", doc);
        out.write_json(&doc)?;
        if let Some(report) = &doc.body.report {
            out.write_tables(&doc.provenance.run_id, &[load_table(report, &doc.body)])?;
        }
        if let Some(why) = failure {
            bail!("the measurement failed: {why} (is a memcached-protocol server listening on {}?)", self.server);
        }
        Ok(if self.strict && missed { 3 } else { 0 })
    }
}

impl LoadArgs {
    /// What a search found, on one line.
    pub(super) fn search_line(&self, r: &loadgen::SearchReport) -> String {
        match r.best_per_s {
            Some(b) => format!(
                "highest rate within {}: {b:.0} requests/s{} ({} runs)",
                r.sla,
                if r.capped {
                    " (the upper bound: the server may hold more)"
                } else if r.generator_limited {
                    " (the generator's limit: above it, it could not keep its schedule)"
                } else {
                    ""
                },
                r.runs
            ),
            None => format!("no rate from {} requests/s held {}", self.search_lo, r.sla),
        }
    }
}

/// One run of a search, as it ends.
pub(super) fn progress_line(p: &loadgen::RunPoint, sla: Sla) -> String {
    let m = &p.measured;
    format!(
        "  rate {:>10.0}/s run {}: offered {:>10.0}/s achieved {:>10.0}/s {} {} {}",
        p.rate_per_s,
        p.vote,
        m.offered_per_s,
        m.achieved_per_s,
        sla,
        m.sla_latency_ns.map_or("beyond every answer".to_string(), |n| format!("{:.0} us", n as f64 / 1e3)),
        if p.met {
            "held"
        } else if m.lag_share > GENERATOR_LAG_MAX {
            "missed (the generator lagged: it measured itself)"
        } else {
            "missed"
        }
    )
}

/// The run as one CSV row.
fn load_table(r: &LoadReport, d: &KvLoad) -> netlane_report::Table {
    use netlane_report::{Column, Row, Table, Value};
    let c = &r.counts;
    let mut columns = vec![
        Column::new("mode", "loop", 0),
        Column::new("target_per_s", "asked /s", 0),
        Column::new("seconds", "s", 1),
        Column::new("offered_per_s", "offered /s", 0),
        Column::new("achieved_per_s", "achieved /s", 0),
    ];
    let mut cells = vec![
        Value::text(&r.mode),
        Value::opt(r.target_per_s),
        Value::num(r.seconds),
        Value::num(r.offered_per_s),
        Value::num(r.achieved_per_s),
    ];
    for p in PERCENTILES {
        columns.push(Column::new(&format!("{}_us", p.replace('.', "")), &format!("{p} us"), 1));
        cells.push(Value::opt(r.latency_ns.us(p)));
    }
    for (key, label, v) in [
        ("completed", "completed", c.completed),
        ("errors", "errors", c.errors),
        ("lost", "lost", c.lost),
        ("unanswered", "unanswered", c.unanswered),
        ("not_sent", "not sent", c.not_sent),
        ("connection_failures", "connection failures", r.connection_failures),
    ] {
        columns.push(Column::new(key, label, 0));
        cells.push(Value::Int(v));
    }
    columns.extend([
        Column::new("mean_us", "mean us", 1),
        Column::new("late_pct", "late %", 2),
        Column::new("client_cpu_s", "client CPU s", 3),
        Column::new("sla", "SLA", 0),
        Column::new("sla_met", "SLA met", 0),
    ]);
    cells.extend([
        Value::opt(r.latency_ns.mean.map(|ns| ns / 1e3)),
        Value::num(r.late_share * 100.0),
        Value::num(r.client_cpu_s),
        d.sla.as_ref().map_or(Value::Missing, Value::text),
        d.sla_met.map_or(Value::Missing, |m| Value::text(if m { "yes" } else { "no" })),
    ]);
    let mut t = Table::new("kv-load", "The load's run", columns);
    t.push(Row::new(cells));
    t
}

pub(super) fn print_report(r: &LoadReport) {
    let c = &r.counts;
    out::println(&format!(
        "{} loop: offered {:.0}/s achieved {:.0}/s over {:.1} s{}",
        r.mode,
        r.offered_per_s,
        r.achieved_per_s,
        r.seconds,
        r.target_per_s.map_or(String::new(), |t| format!(" (asked {t:.0}/s)"))
    ));
    out::println(&format!(
        "completed={} hits={} misses={} stored={} errors={} lost={} unanswered={} not_sent={} late={:.2}% lagged={:.2}% connection_failures={}",
        c.completed,
        c.hits,
        c.misses,
        c.stored,
        c.errors,
        c.lost,
        c.unanswered,
        c.not_sent,
        r.late_share * 100.0,
        r.lag_share * 100.0,
        r.connection_failures
    ));
    let lat: Vec<String> = PERCENTILES
        .iter()
        .map(|p| format!("{p}={}", r.latency_ns.us(p).map_or("failed".to_string(), |u| format!("{u:.1}"))))
        .collect();
    out::println(&format!("latency us: {}", lat.join(" ")));
    out::println(&format!(
        "client CPU: {:.2} s, {:.0}% of its threads' time{}",
        r.client_cpu_s,
        r.client_cpu_busy * 100.0,
        if r.lag_share > GENERATOR_LAG_MAX {
            " (it delayed its own sends: the generator was the bottleneck)"
        } else if r.client_cpu_busy > 0.9 {
            " (the generator may be the bottleneck)"
        } else {
            ""
        }
    ));
}

#[cfg(test)]
mod tests {
    use netlane_kv::load::workload::{KeyDist, SizeDist, WorkloadSpec};
    use netlane_lab::scenarios::kv::{LoadStep, load_args};

    use super::*;
    use crate::testing::parse_command;

    /// The lab runs `netlane kv load` with the arguments it writes for a configuration
    /// and a step: they must give back that configuration, option by option, and ask
    /// for that step.
    #[test]
    fn the_lab_s_load_arguments_give_back_its_configuration() {
        let base = LoadConfig { server: "10.0.0.1:11311".parse().unwrap(), ..LoadConfig::default() };
        let configs = [
            LoadConfig::default(),
            LoadConfig { threads: 2, cpus: Some(vec![0, 1]), seed: 7, ..base.clone() },
            LoadConfig {
                pacing: Pacing::Open(Arrivals { process: Process::Etc, rate_per_s: 12_345.678 }),
                workload: WorkloadSpec {
                    keys: 5_000,
                    key_dist: KeyDist::Zipf { s: 0.99 },
                    key_size: SizeDist::Uniform { min: 10, max: 40 },
                    value_size: SizeDist::Etc,
                    get_ratio: 0.75,
                    multiget: 4,
                    item_max: 512 << 10,
                },
                duration: Duration::from_millis(2500),
                ramp: Duration::ZERO,
                drain: Duration::from_millis(500),
                max_in_flight: 3,
                late_after: Duration::from_micros(250),
                ..base.clone()
            },
            LoadConfig { pacing: Pacing::Closed { depth: 2 }, connections: 8, ..base },
        ];
        let sla: Sla = "p99=500us".parse().unwrap();
        let range = SearchConfig { lo_per_s: 1_000.0, hi_per_s: 250_000.5, resolution: 1.1, max_bisections: 10 };
        for cfg in configs {
            for step in [LoadStep::WarmUp, LoadStep::Run, LoadStep::Agent, LoadStep::Search { sla, range }] {
                let args = load_args(&cfg, step);
                assert_eq!(args[..2], ["kv", "load"]);
                let parsed = parse_command::<LoadArgs>(&args);
                assert_eq!(format!("{:?}", parsed.config().unwrap()), format!("{cfg:?}"), "{args:?}");
                match step {
                    LoadStep::WarmUp => assert!(parsed.warmup_only && !parsed.search, "{args:?}"),
                    LoadStep::Run => {
                        assert!(parsed.no_warmup && !parsed.warmup_only && !parsed.search && !parsed.agent, "{args:?}")
                    }
                    LoadStep::Agent => assert!(parsed.no_warmup && parsed.agent && !parsed.search, "{args:?}"),
                    LoadStep::Search { sla, range } => {
                        assert!(parsed.no_warmup && parsed.search, "{args:?}");
                        assert_eq!(parsed.sla, Some(sla));
                        assert_eq!(parsed.range(), range);
                    }
                }
            }
        }
    }
}

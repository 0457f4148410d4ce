//! Where the bulk-transfer scenarios' two ends run: two namespaces joined by a veth pair
//! (a NIC stand-in, with threaded NAPI on the receiving end) or loopback.

use anyhow::{Context, Result, bail};
use clap::{ArgAction, Args, ValueEnum};
use netlane::topology::{LinkConfig, RxTuning, TwoHosts};

use crate::engines::bulk::{self, BulkError, BulkResult, BulkRun, Endpoints, Roles};
use netlane_report::options::OptionList;

/// Where sender and receiver run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PathKind {
    /// Two network namespaces joined by a veth pair (needs root).
    Veth,
    /// Loopback in the current namespace (no root needed; no NAPI, no GRO coalescing).
    Loopback,
}

impl PathKind {
    /// The word the command line takes.
    pub fn name(self) -> String {
        crate::scenarios::value_name(&self)
    }
}

/// Receive-side NAPI of the veth's receiving end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RxNapi {
    /// GRO on and NAPI in a kernel thread pinned to `--napi-cpu` (like a NIC).
    Threaded,
    /// veth defaults: receive work runs on the sender's CPU, no GRO batching.
    Off,
}

/// Where netlane's two ends run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Placement {
    /// Each in a process of its own (`netlane bulk send`, `netlane bulk recv`),
    /// single-threaded, the sender measured with wait4 like the kernel's selftest sender
    /// (and like hosts apart).
    Process,
    /// On threads of the benchmark process (they share its file table, which costs
    /// every system call an atomic reference count).
    Thread,
}

/// Options every bulk-transfer scenario shares.
#[derive(Debug, Clone, Args)]
pub struct NetArgs {
    /// Where sender and receiver run.
    #[arg(long, value_enum, default_value_t = PathKind::Veth)]
    pub path: PathKind,
    /// Use IPv6 instead of IPv4.
    #[arg(short = '6', long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set)]
    pub ipv6: bool,
    /// MTU of the veth pair.
    #[arg(long, default_value_t = 1500, value_parser = clap::value_parser!(u32).range(1280..=65535))]
    pub mtu: u32,
    /// Receive-side NAPI of the veth.
    #[arg(long, value_enum, default_value_t = RxNapi::Threaded)]
    pub rx_napi: RxNapi,
    /// CPU for the sender [default: the CPU plan's generator CPU].
    #[arg(long, default_value_t = crate::plan::default_cpu(crate::plan::Role::Generator), hide_default_value = true)]
    pub tx_cpu: usize,
    /// Where netlane's sender and receiver run.
    #[arg(long, value_enum, default_value_t = Placement::Process)]
    pub ends: Placement,
    /// CPU for the receiver thread [default: the CPU plan's server CPU].
    #[arg(long)]
    pub rx_cpu: Option<usize>,
    /// CPU for the receiving veth's NAPI thread [default: the receiver's CPU, so the
    /// sender's CPU does only sending, as on two machines].
    #[arg(long)]
    pub napi_cpu: Option<usize>,
}

impl NetArgs {
    /// Checks CPU numbers and privileges against this machine.
    pub fn validate(&self) -> Result<()> {
        let n = netlane::cpus::online_count();
        for (what, cpu) in [("--tx-cpu", Some(self.tx_cpu)), ("--rx-cpu", self.rx_cpu), ("--napi-cpu", self.napi_cpu)] {
            if let Some(c) = cpu
                && c >= n
            {
                bail!("{what} {c}: this machine has CPUs 0-{}", n - 1);
            }
        }
        if self.path == PathKind::Veth && !netlane::topology::have_privileges() {
            bail!(
                "the veth path builds network namespaces and needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN); run as \
                 root, or use --path loopback"
            );
        }
        Ok(())
    }

    /// The receiver's CPU.
    pub fn rx_cpu(&self) -> usize {
        self.rx_cpu.unwrap_or_else(|| crate::plan::default_cpu(crate::plan::Role::Server))
    }

    /// Where the sender, the receiver and the receiving end's NAPI thread ran, for the
    /// report.
    pub fn cpu_plan(&self) -> Vec<netlane_report::RoleCpus> {
        use crate::plan::Role;
        let (tx, rx) = ([self.tx_cpu], [self.rx_cpu()]);
        let napi = [self.napi_cpu.unwrap_or(self.rx_cpu())];
        let mut roles: Vec<(Role, &[usize])> = vec![(Role::Generator, &tx), (Role::Server, &rx)];
        if self.path == PathKind::Veth && self.rx_napi == RxNapi::Threaded {
            roles.push((Role::Napi, &napi));
        }
        crate::plan::as_given(&roles)
    }

    /// The veth link configuration.
    pub fn link(&self) -> LinkConfig {
        let rx = match self.rx_napi {
            RxNapi::Threaded => RxTuning::threaded_napi_on(self.napi_cpu.unwrap_or(self.rx_cpu())),
            RxNapi::Off => RxTuning::none(),
        };
        LinkConfig { mtu: self.mtu, queues: 1, rx }
    }

    /// Path MTU the datagrams must fit.
    pub fn path_mtu(&self) -> u32 {
        match self.path {
            PathKind::Veth => self.mtu,
            PathKind::Loopback => 65_536,
        }
    }

    /// The resolved options.
    pub fn options(&self) -> OptionList {
        let mut o = OptionList::new().text("path", self.path.name()).flag("ipv6", self.ipv6);
        if self.path == PathKind::Veth {
            o = o.int("mtu", u64::from(self.mtu)).text(
                "rx-napi",
                match self.rx_napi {
                    RxNapi::Threaded => "threaded",
                    RxNapi::Off => "off",
                },
            );
            if self.rx_napi == RxNapi::Threaded {
                o = o.int("napi-cpu", self.napi_cpu.unwrap_or(self.rx_cpu()) as u64);
            }
        }
        o.text(
            "ends",
            match self.ends {
                Placement::Process => "process",
                Placement::Thread => "thread",
            },
        )
        .int("tx-cpu", self.tx_cpu as u64)
        .int("rx-cpu", self.rx_cpu() as u64)
    }

    /// Processes or threads, as the options say.
    pub fn roles(&self) -> Roles {
        match self.ends {
            Placement::Thread => Roles::Threads,
            Placement::Process => Roles::Processes,
        }
    }

    /// Builds the veth topology when the path needs one.
    pub fn build(&self, label: &str) -> Result<Option<TwoHosts>> {
        match self.path {
            PathKind::Loopback => Ok(None),
            PathKind::Veth => Ok(Some(TwoHosts::create(label, self.link()).context("building the veth topology")?)),
        }
    }
}

/// Endpoints for an optional topology.
pub fn endpoints(hosts: &Option<TwoHosts>) -> Endpoints<'_> {
    match hosts {
        Some(h) => Endpoints::Veth(h),
        None => Endpoints::Loopback,
    }
}

/// Runs one transfer between `ends`, with the run's label in any error.
pub fn run_one(ends: Endpoints<'_>, label: &str, run: &BulkRun) -> Result<BulkResult> {
    bulk::run(ends, run).map_err(|e| match e {
        BulkError::Config(m) => anyhow::anyhow!("{label}: {m}"),
        other => anyhow::Error::new(other).context(format!("{label} run failed")),
    })
}

/// One line about a run for the progress output.
pub fn summary_line(r: &BulkResult) -> String {
    let rate = |m: crate::verdict::Measure| m.map_or("-".into(), netlane_report::format::bytes_per_second);
    format!(
        "tx {} rx {} | tx {} s/GB | loss {}",
        rate(r.tx_rate()),
        rate(r.rx_rate()),
        r.tx_cpu_s_per_gb().map_or("-".into(), |v| format!("{v:.3}")),
        r.loss().map_or("-".into(), |l| format!("{:.2}%", l * 100.0))
    )
}

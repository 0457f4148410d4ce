//! The testbed file: which machines a lab runs on, and what each is for. Read and
//! checked without touching any host (sans-IO).
//!
//! ```toml
//! ssh_config = "/root/.ssh/lab_config"  # ssh -F (default: the user's configuration)
//! netlane = "/usr/local/bin/netlane"     # netlane on the hosts (default: found on their PATH)
//!
//! [server]
//! ssh = "root@10.0.0.2"   # no `ssh`: this machine
//! addr = "10.0.1.2"       # the address the clients reach the server at
//! iface = "ens1f0"        # the interface that address is on
//! cpus = "8-15"           # the CPUs the server's roles take there
//!
//! [[clients]]
//! ssh = "root@10.0.0.3"
//! cpus = "0-7"
//!
//! [[clients]]
//! ssh = "root@10.0.0.4"
//! ```

use std::net::IpAddr;
use std::path::PathBuf;

use netlane::cpus::CpuList;
use netlane::nic::RssTable;
use serde::Deserialize;

/// The most client hosts a testbed names.
pub const MAX_CLIENTS: usize = 64;

/// A testbed, as its file says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestbedSpec {
    /// The SSH configuration file every `ssh` reads instead of the user's.
    pub ssh_config: Option<PathBuf>,
    /// The server's host.
    pub server: HostSpec,
    /// The client hosts.
    pub clients: Vec<HostSpec>,
}

/// One host of a testbed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSpec {
    /// What to call it (`server`, `client 2`).
    pub role: String,
    /// Its SSH destination (`None`: this machine).
    pub ssh: Option<String>,
    /// The netlane executable there.
    pub netlane: String,
    /// The address others reach it at.
    pub addr: Option<IpAddr>,
    /// The interface that address is on.
    pub iface: Option<String>,
    /// The CPUs its roles take (`None`: as the scenario plans them).
    pub cpus: Option<CpuList>,
    /// Settings of `iface` held while the scenarios run, then put back
    /// (`GROUP.NAME=VALUE`, as `netlane nic hold --set` takes them).
    pub nic: Vec<String>,
    /// The CPUs `iface`'s interrupts are moved to while the scenarios run (one each in
    /// turn), then put back.
    pub irqs: Option<CpuList>,
    /// `iface`'s NAPI polled by kernel threads (or not) while the scenarios run.
    pub threaded: Option<bool>,
    /// `iface`'s transmit queues' XPS maps while the scenarios run.
    pub xps: Option<Xps>,
    /// `iface`'s RSS indirection table while the scenarios run (`equal 4`,
    /// `weights 1,1,0,2`).
    pub rss: Option<RssTable>,
}

/// How a host's transmit queues are chosen (XPS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Xps {
    /// Transmit queue i by the i-th of these CPUs (in turn).
    Cpus(CpuList),
    /// Transmit queue i by sockets whose packets arrive on receive queue i.
    Rxqs,
}

impl HostSpec {
    /// Whether the file sets anything of `iface`.
    pub fn sets_nic(&self) -> bool {
        !self.nic.is_empty()
            || self.irqs.is_some()
            || self.threaded.is_some()
            || self.xps.is_some()
            || self.rss.is_some()
    }

    /// `netlane nic hold`'s options for what the file sets.
    pub fn nic_hold_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        for n in &self.nic {
            args.extend(["--set".to_string(), n.clone()]);
        }
        if let Some(c) = &self.irqs {
            args.extend(["--irqs".to_string(), c.to_string()]);
        }
        if let Some(on) = self.threaded {
            args.extend(["--threaded".to_string(), if on { "on" } else { "off" }.to_string()]);
        }
        match &self.xps {
            Some(Xps::Cpus(c)) => args.extend(["--xps".to_string(), c.to_string()]),
            Some(Xps::Rxqs) => args.push("--xps-rxqs".to_string()),
            None => {}
        }
        match &self.rss {
            Some(RssTable::Equal(n)) => args.extend(["--rss-equal".to_string(), n.to_string()]),
            Some(RssTable::Weights(w)) => {
                let w: Vec<String> = w.iter().map(|x| x.to_string()).collect();
                args.extend(["--rss-weights".to_string(), w.join(",")]);
            }
            None => {}
        }
        args
    }

    /// The first CPU the file gives it (the one a role is pinned to there).
    pub fn first_cpu(&self) -> Option<usize> {
        self.cpus.as_ref().and_then(|c| c.as_slice().first().copied())
    }
}

/// A testbed file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TestbedError {
    /// Not TOML of the testbed's shape.
    #[error("not a testbed file")]
    Syntax(#[source] toml::de::Error),
    /// A value that cannot be used.
    #[error("{0}")]
    Invalid(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    ssh_config: Option<PathBuf>,
    netlane: Option<String>,
    server: RawHost,
    #[serde(default)]
    clients: Vec<RawHost>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHost {
    ssh: Option<String>,
    netlane: Option<String>,
    addr: Option<IpAddr>,
    iface: Option<String>,
    cpus: Option<String>,
    #[serde(default)]
    nic: Vec<String>,
    irqs: Option<String>,
    threaded: Option<bool>,
    xps: Option<String>,
    rss: Option<String>,
}

impl TestbedSpec {
    /// Reads a testbed file's text.
    pub fn parse(text: &str) -> Result<TestbedSpec, TestbedError> {
        let raw: RawFile = toml::from_str(text).map_err(TestbedError::Syntax)?;
        let netlane = raw.netlane.unwrap_or_else(|| "netlane".into());
        let host = |role: String, h: RawHost| -> Result<HostSpec, TestbedError> {
            let bad = |what: String| Err(TestbedError::Invalid(format!("{role}: {what}")));
            if let Some(d) = &h.ssh
                && (d.is_empty() || d.starts_with('-') || d.chars().any(char::is_whitespace))
            {
                return bad(format!("`ssh` {d:?} is not an SSH destination"));
            }
            if let Some(i) = &h.iface
                && (i.is_empty() || i.len() > 15 || i.contains('/') || i.chars().any(char::is_whitespace))
            {
                return bad(format!("`iface` {i:?} is not an interface name"));
            }
            if let Some(a) = h.addr
                && (a.is_unspecified() || a.is_multicast())
            {
                return bad(format!("`addr` {a} is not a host's address"));
            }
            let netlane = h.netlane.unwrap_or_else(|| netlane.clone());
            if netlane.is_empty() {
                return bad("`netlane` is empty".into());
            }
            let list = |what: &str, c: Option<String>| match c {
                Some(c) => match c.parse::<CpuList>() {
                    Ok(list) if !list.is_empty() => Ok(Some(list)),
                    Ok(_) => Err(TestbedError::Invalid(format!("{role}: `{what}` is empty"))),
                    Err(e) => Err(TestbedError::Invalid(format!("{role}: `{what}` {c:?}: {e}"))),
                },
                None => Ok(None),
            };
            let cpus = list("cpus", h.cpus)?;
            let irqs = list("irqs", h.irqs)?;
            for n in &h.nic {
                if let Err(e) = netlane::topology::ethtool::Group::parse_setting(n) {
                    return bad(format!("`nic`: {e}"));
                }
            }
            let xps = match h.xps.as_deref() {
                None => None,
                Some("rxqs") => Some(Xps::Rxqs),
                Some(c) => match list("xps", Some(c.to_string())) {
                    Ok(cpus) => cpus.map(Xps::Cpus),
                    Err(_) => return bad(format!("`xps` {c:?}: `rxqs` or a CPU list")),
                },
            };
            let rss = match h.rss.as_deref().map(str::parse::<RssTable>) {
                Some(Err(e)) => return bad(format!("`rss` {e}")),
                r => r.and_then(Result::ok),
            };
            let spec = HostSpec {
                role: role.clone(),
                ssh: h.ssh,
                netlane,
                addr: h.addr,
                iface: h.iface,
                cpus,
                nic: h.nic,
                irqs,
                threaded: h.threaded,
                xps,
                rss,
            };
            if spec.sets_nic() && spec.iface.is_none() {
                return bad("`nic`, `irqs`, `threaded`, `xps` and `rss` set an interface: `iface` is missing".into());
            }
            Ok(spec)
        };
        let server = host("server".into(), raw.server)?;
        if server.addr.is_none() {
            return Err(TestbedError::Invalid(
                "server: `addr` is missing (the address the clients reach it at)".into(),
            ));
        }
        if raw.clients.is_empty() || raw.clients.len() > MAX_CLIENTS {
            return Err(TestbedError::Invalid(format!(
                "{} client hosts: a testbed has 1 to {MAX_CLIENTS} ([[clients]] entries)",
                raw.clients.len()
            )));
        }
        let clients = raw
            .clients
            .into_iter()
            .enumerate()
            .map(|(i, c)| host(format!("client {}", i + 1), c))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(TestbedSpec { ssh_config: raw.ssh_config, server, clients })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = r#"
        ssh_config = "/etc/lab/ssh_config"
        netlane = "/opt/netlane"

        [server]
        ssh = "root@10.0.0.2"
        addr = "10.0.1.2"
        iface = "ens1f0"
        cpus = "8-11"
        nic = ["coalesce.adaptive-rx=off", "channels.combined=4"]
        irqs = "8-11"
        threaded = true
        xps = "rxqs"
        rss = "equal 4"

        [[clients]]
        ssh = "root@10.0.0.3"
        cpus = "0-3"
        iface = "eth1"
        xps = "0-3"

        [[clients]]
        ssh = "lab4"
        netlane = "netlane"
    "#;

    #[test]
    fn a_testbed_file_names_its_hosts_and_what_each_is_for() {
        let t = TestbedSpec::parse(FULL).unwrap();
        assert_eq!(t.ssh_config, Some(PathBuf::from("/etc/lab/ssh_config")));
        assert_eq!(t.server.role, "server");
        assert_eq!(t.server.ssh.as_deref(), Some("root@10.0.0.2"));
        assert_eq!(t.server.addr, Some("10.0.1.2".parse().unwrap()));
        assert_eq!(t.server.iface.as_deref(), Some("ens1f0"));
        assert_eq!(t.server.cpus.as_ref().map(|c| c.as_slice().to_vec()), Some(vec![8, 9, 10, 11]));
        assert_eq!(t.server.netlane, "/opt/netlane");
        assert_eq!(t.server.nic, ["coalesce.adaptive-rx=off", "channels.combined=4"]);
        assert_eq!(t.server.irqs.as_ref().map(|c| c.as_slice().to_vec()), Some(vec![8, 9, 10, 11]));
        assert!(t.clients[0].nic.is_empty() && t.clients[0].irqs.is_none());
        let hold = |h: &HostSpec| h.nic_hold_args().join(" ");
        assert_eq!(
            hold(&t.server),
            "--set coalesce.adaptive-rx=off --set channels.combined=4 --irqs 8-11 --threaded on --xps-rxqs --rss-equal 4"
        );
        assert_eq!(hold(&t.clients[0]), "--xps 0-3");
        assert!(!t.clients[1].sets_nic());
        assert_eq!(t.clients.len(), 2);
        assert_eq!((t.clients[0].role.as_str(), t.clients[1].role.as_str()), ("client 1", "client 2"));
        assert_eq!(t.clients[1].netlane, "netlane");
        assert_eq!(t.clients[1].cpus, None);
        // The server on this machine: no `ssh`.
        let t = TestbedSpec::parse("[server]\naddr = \"10.0.1.1\"\n[[clients]]\nssh = \"c\"").unwrap();
        assert_eq!(t.server.ssh, None);
        assert_eq!(t.server.netlane, "netlane");
    }

    #[test]
    fn a_bad_testbed_file_says_what_is_wrong_where() {
        let cases = [
            ("[server]\naddr = \"10.0.0.1\"", "0 client hosts"),
            ("[[clients]]\nssh = \"c\"", "not a testbed file"),
            ("[server]\n[[clients]]\nssh = \"c\"", "server: `addr` is missing"),
            ("[server]\naddr = \"0.0.0.0\"\n[[clients]]\nssh = \"c\"", "is not a host's address"),
            ("[server]\naddr = \"10.0.0.1\"\n[[clients]]\nssh = \"-oProxyCommand=x\"", "client 1: `ssh`"),
            ("[server]\naddr = \"10.0.0.1\"\ncpus = \"3-1\"\n[[clients]]\nssh = \"c\"", "server: `cpus` \"3-1\""),
            ("[server]\naddr = \"10.0.0.1\"\niface = \"a/b\"\n[[clients]]\nssh = \"c\"", "not an interface name"),
            ("[server]\naddr = \"10.0.0.1\"\nport = 1\n[[clients]]\nssh = \"c\"", "not a testbed file"),
            ("[server]\naddr = \"10.0.0.1\"\nirqs = \"1\"\n[[clients]]\nssh = \"c\"", "`iface` is missing"),
            ("[server]\naddr = \"10.0.0.1\"\nthreaded = true\n[[clients]]\nssh = \"c\"", "`iface` is missing"),
            (
                "[server]\naddr = \"10.0.0.1\"\niface = \"e\"\nxps = \"tx\"\n[[clients]]\nssh = \"c\"",
                "`xps` \"tx\": `rxqs` or a CPU list",
            ),
            (
                "[server]\naddr = \"10.0.0.1\"\niface = \"e\"\nrss = \"equal\"\n[[clients]]\nssh = \"c\"",
                "`rss` \"equal\": expected `equal N` or `weights W0,W1,...`",
            ),
            (
                "[server]\naddr = \"10.0.0.1\"\niface = \"e\"\nnic = [\"rings.rx=x\"]\n[[clients]]\nssh = \"c\"",
                "server: `nic`: \"x\": a number",
            ),
        ];
        for (text, says) in cases {
            let e = TestbedSpec::parse(text).unwrap_err();
            let full = netlane::error::chain(&e).to_string();
            assert!(full.contains(says), "{text:?}: {full}");
        }
        let many = format!("[server]\naddr = \"10.0.0.1\"\n{}", "[[clients]]\nssh = \"c\"\n".repeat(MAX_CLIENTS + 1));
        assert!(TestbedSpec::parse(&many).unwrap_err().to_string().contains("65 client hosts"));
    }
}

//! The balancer's soak: `lb run` forwarding on the balancer's leg of a [`BalancerNet`]
//! to two reals, each a `rr serve` on the VIP, with `rr clients` from the client as the
//! valid load, beside malformed frames from the router's side and configuration edits,
//! well and badly; stopped with SIGTERM and its own counters read.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use netlane_lb::testnet::{BalancerNet, LB_IFACE, real_addr};
use nix::sys::signal::Signal;

use super::hostile::{balancer_frames, edit_config, flood_frames};
use super::measure::{LISTENING, Soak, run_client, start_server, watch, words};
use super::{Cpus, SoakArgs, SoakServer};
use crate::host::RoleProcess;

/// The balancer's descriptors: it holds none per client or flow, only its maps,
/// programs, links, event ring and files, so a count past this is a leak.
const BALANCER_FDS: u64 = 128;

/// What the balancer counted over its soak, from its final report.
#[derive(Debug, Clone, Copy)]
pub(super) struct Forwarding {
    /// Packets sent on to a real.
    pub(super) tx: u64,
    /// Packets dropped, every reason.
    pub(super) dropped: u64,
    /// Packets passed to the stack (not for a VIP, not IP).
    pub(super) passed: u64,
}

/// Stops the balancer with SIGTERM (it must exit 0 within 10 s) and reads its counters
/// from the report it writes as it stops.
fn stop_balancer(lb: RoleProcess, report: &Path) -> Result<Forwarding, String> {
    lb.stop_with(Signal::SIGTERM, Duration::from_secs(10)).map_err(|e| format!("{e:#}"))?;
    let text = std::fs::read_to_string(report).map_err(|e| format!("read {}: {e}", report.display()))?;
    let doc: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", report.display()))?;
    let global = doc.pointer("/stats/global").ok_or("its report has no counters")?;
    let sum = |pick: &dyn Fn(&str) -> bool| {
        global.as_object().map_or(0, |m| m.iter().filter(|(k, _)| pick(k)).filter_map(|(_, v)| v.as_u64()).sum())
    };
    Ok(Forwarding {
        tx: sum(&|k| k == "tx"),
        dropped: sum(&|k| k.starts_with("drop_")),
        passed: sum(&|k| k.starts_with("pass_")),
    })
}

impl SoakArgs {
    /// The balancer's soak: `lb run` on the balancer's leg of a [`BalancerNet`], a
    /// `rr serve` on each real, `rr clients` to the VIP from the client as the valid
    /// load; hostile frames at the balancer from the router's side and its configuration
    /// edited all the while, well and badly.
    pub(super) fn soak_balancer(&self, dir: &Path, cpus: &Cpus) -> Result<Soak> {
        let vip = SocketAddrV4::new(Ipv4Addr::new(10, 210, 100, 1), 7000);
        let net = BalancerNet::build("soak-lb", *vip.ip(), 2).context("build the balancer's network")?;
        let config = dir.join("lb.toml");
        let good = move |weights: &[u32]| {
            let mut t = format!(
                "ring_size = 4099\nconn_entries = 65536\n[[vip]]\naddress = \"{}\"\nport = {}\nproto = \"udp\"\n",
                vip.ip(),
                vip.port()
            );
            for (i, w) in weights.iter().enumerate() {
                t += &format!("[[vip.real]]\naddress = \"{}\"\nweight = {w}\n", real_addr(i));
            }
            t
        };
        std::fs::write(&config, good(&[1, 1])).with_context(|| format!("write {}", config.display()))?;
        let listen = vip.to_string();
        let _reals = net
            .reals
            .iter()
            .map(|ns| start_server(ns, &words(&["rr", "serve", "--listen", &listen]), LISTENING, &[], &cpus.server))
            .collect::<Result<Vec<_>>>()?;
        let gw = net.gw_mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":");
        let (applied, kept) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let lb_json = dir.join("lb-run.json");
        let lb_args = words(&[
            "lb",
            "run",
            "--config",
            &config.to_string_lossy(),
            "--iface",
            LB_IFACE,
            "--gateway-mac",
            &gw,
            "--stats-interval",
            "1s",
            "--json",
            &lb_json.to_string_lossy(),
        ]);
        let target = start_server(
            &net.lb,
            &lb_args,
            "netlane lb: attached to",
            &[
                ("netlane lb: applied the changed configuration", applied.clone()),
                ("netlane lb: kept the running configuration", kept.clone()),
            ],
            &cpus.server,
        )?;
        let (stop, ops) = watch();
        let frames = balancer_frames((net.gw_mac, net.lb_mac), vip);
        let ifindex = net.router_lb_index;
        let flood = net
            .router
            .spawn("soak-frames", {
                let (stop, ops, cpus) = (stop.clone(), ops.clone(), cpus.clone());
                move || -> std::io::Result<()> {
                    cpus.pin_client_thread();
                    let tx = netlane_sys::packet::PacketTx::open(ifindex, 2048, 256)?;
                    flood_frames(tx, &frames, &stop, &ops);
                    Ok(())
                }
            })
            .context("start the hostile frames in the router's namespace")?;
        let editor = std::thread::spawn({
            let (stop, ops, config) = (stop.clone(), ops.clone(), config.clone());
            move || edit_config(&config, good, &stop, &ops, Duration::from_millis(300))
        });
        let secs = format!("{}ms", self.time.as_millis());
        let client = words(&["rr", "clients", "--server", &listen, "--clients", "8", "--rate", "2000", "-t", &secs]);
        let valid =
            run_client(&net.client, &client, SoakServer::Lb, self.time + Duration::from_secs(60), &cpus.clients);
        stop.store(true, Ordering::Relaxed);
        let flooded = flood.join().map_err(|_| anyhow!("the hostile frames' thread panicked"))?;
        let edited = editor.join().map_err(|_| anyhow!("the configuration editor panicked"))?;
        let samples = target.samples();
        flooded.context("send hostile frames")?;
        edited.context("edit the balancer's configuration")?;
        let valid = valid?;
        let forwarding = stop_balancer(target, &lb_json);
        Ok(Soak {
            server: SoakServer::Lb,
            samples,
            valid,
            hostile_ops: ops.load(Ordering::Relaxed),
            fd_limit: BALANCER_FDS,
            read_back: None,
            edits: Some((applied.load(Ordering::Relaxed), kept.load(Ordering::Relaxed))),
            forwarding: Some(forwarding),
            path: "veth",
        })
    }
}

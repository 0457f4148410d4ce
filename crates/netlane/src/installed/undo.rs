//! Undoing a recorded change, unless someone changed the same thing since.

use std::fs;
use std::io;
use std::path::Path;

use super::{Change, irq_affinity_path, napi_words, values_words};
use crate::error::chain;
use crate::topology::ethtool::{Ethtool, Values};
use crate::topology::netdev::{NapiSettings, Netdev};

/// Whether `now` has every setting `value` wrote.
fn napi_still(now: &NapiSettings, value: &NapiSettings) -> bool {
    (value.defer_hard_irqs.is_none() || now.defer_hard_irqs == value.defer_hard_irqs)
        && (value.gro_flush_timeout_ns.is_none() || now.gro_flush_timeout_ns == value.gro_flush_timeout_ns)
        && (value.irq_suspend_timeout_ns.is_none() || now.irq_suspend_timeout_ns == value.irq_suspend_timeout_ns)
}

/// The settings of NAPI instance `id` of device `ifindex`, read in the calling thread's
/// namespace (`None`: the instance is gone).
fn napi_now(ifindex: u32, id: u32) -> Result<Option<NapiSettings>, String> {
    let mut nd = Netdev::open().map_err(|e| format!("open netdev netlink: {}", chain(&e)))?;
    let all = nd.napis(ifindex).map_err(|e| format!("list NAPI instances: {}", chain(&e)))?;
    Ok(all.into_iter().find(|n| n.id == id).map(|n| NapiSettings {
        defer_hard_irqs: n.defer_hard_irqs,
        gro_flush_timeout_ns: n.gro_flush_timeout_ns,
        irq_suspend_timeout_ns: n.irq_suspend_timeout_ns,
    }))
}

/// Runs `f` on a thread of its own (in the caller's network namespace) whose `/sys`
/// shows that namespace's devices.
fn with_own_sysfs(f: impl FnOnce() -> Result<String, String> + Send) -> Result<String, String> {
    std::thread::scope(|s| {
        s.spawn(|| {
            crate::topology::mount_own_sysfs("this namespace").map_err(|e| e.to_string())?;
            f()
        })
        .join()
        .unwrap_or_else(|_| Err("the thread undoing it panicked".into()))
    })
}

/// Undoes one change, unless someone changed the same thing since.
pub(super) fn undo(change: &Change) -> Result<String, String> {
    match change {
        Change::RootQdisc { place, ifindex, ifname, qdisc } => place.run(|| {
            let mut r = crate::topology::Rtnl::open().map_err(|e| format!("open rtnetlink: {e}"))?;
            if r.link_name(*ifindex).ok().as_deref() != Some(ifname.as_str()) {
                return Ok(format!("{ifname} is gone"));
            }
            match r.root_qdisc(*ifindex).map_err(|e| format!("read {ifname}'s root qdisc: {}", chain(&e)))? {
                Some((kind, _)) if kind == *qdisc => {
                    r.del_root_qdisc(*ifindex).map_err(|e| format!("remove it: {}", chain(&e)))?;
                    Ok("removed".into())
                }
                Some((kind, _)) => Ok(format!("left alone: {ifname}'s root qdisc is {kind} now")),
                None => Ok("already gone".into()),
            }
        }),
        Change::Cgroup { path } => {
            if !path.exists() {
                return Ok("already gone".into());
            }
            let ended = end_processes(path);
            remove_cgroup(path).map_err(|e| format!("remove it: {e}"))?;
            Ok(if ended.is_empty() { "removed".into() } else { format!("ended {}, then removed it", ended.join(", ")) })
        }
        Change::Sysctl { place, path, before, value } => place.run(|| {
            let now = fs::read_to_string(path).map_err(|e| format!("read it: {e}"))?;
            if now.trim() != value.trim() {
                return Ok(format!("left alone: it is {} now", now.trim()));
            }
            if before == value {
                return Ok(format!("left at {value}, as it was found"));
            }
            fs::write(path, before).map_err(|e| format!("restore it: {e}"))?;
            Ok(format!("restored to {before}"))
        }),
        Change::Napi { place, ifindex, id, before, value, .. } => place.run(|| {
            let Some(now) = napi_now(*ifindex, *id)? else { return Ok("gone with its device".into()) };
            if !napi_still(&now, value) {
                return Ok(format!("left alone: it is {} now", napi_words(&now, value)));
            }
            // Only what was written goes back.
            let back = NapiSettings {
                defer_hard_irqs: value.defer_hard_irqs.and(before.defer_hard_irqs),
                gro_flush_timeout_ns: value.gro_flush_timeout_ns.and(before.gro_flush_timeout_ns),
                irq_suspend_timeout_ns: value.irq_suspend_timeout_ns.and(before.irq_suspend_timeout_ns),
            };
            let mut nd = Netdev::open().map_err(|e| format!("open netdev netlink: {}", chain(&e)))?;
            nd.napi_set(*id, &back).map_err(|e| format!("restore it: {}", chain(&e)))?;
            Ok(format!("restored to {}", napi_words(&back, value)))
        }),
        Change::Ethtool { place, ifname, group, before, value } => place.run(|| {
            let mut e = Ethtool::open().map_err(|e| format!("open ethtool netlink: {}", chain(&e)))?;
            let now = match e.settings(ifname, *group) {
                Ok(now) => now,
                Err(err) if err.errno() == Some(libc::ENODEV) => return Ok("gone with its device".into()),
                Err(err) => return Err(format!("read them: {}", chain(&err))),
            };
            if value.iter().any(|(k, v)| now.get(k) != Some(v)) {
                return Ok(format!("left alone: they are {} now", values_words(&now, value)));
            }
            let back: Values = value.keys().filter_map(|k| before.get(k).map(|v| (k.clone(), *v))).collect();
            e.set_settings(ifname, *group, &back).map_err(|e| format!("restore them: {}", chain(&e)))?;
            Ok(format!("restored to {}", values_words(&back, value)))
        }),
        Change::Rss { place, ifname, before, value } => place.run(|| {
            let now = match crate::nic::Rss::read(ifname) {
                Ok(now) => crate::nic::RssParts::of(&now, value),
                Err(e) if e.errno() == Some(libc::ENODEV) => return Ok("gone with its device".into()),
                Err(e) => return Err(format!("read it: {}", chain(&e))),
            };
            if now != *value {
                return Ok(format!("left alone: it is {now} now"));
            }
            before.write(ifname).map_err(|e| format!("restore it: {e}"))?;
            Ok(format!("restored to {before}"))
        }),
        Change::IrqAffinity { irq, before, value } => {
            let path = irq_affinity_path(*irq);
            let now = match fs::read_to_string(&path) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok("gone with its device".into()),
                Err(e) => return Err(format!("read it: {e}")),
            };
            if now.trim() != value.trim() {
                return Ok(format!("left alone: it is {} now", now.trim()));
            }
            fs::write(&path, before).map_err(|e| format!("restore it: {e}"))?;
            Ok(format!("restored to {before}"))
        }
        Change::DeviceFile { place, path, before, value } => place.run(|| {
            with_own_sysfs(|| {
                let now = match fs::read_to_string(path) {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok("gone with its device".into()),
                    Err(e) => return Err(format!("read it: {e}")),
                };
                if now.trim() != value.trim() {
                    return Ok(format!("left alone: it is {} now", now.trim()));
                }
                fs::write(path, before).map_err(|e| format!("restore it: {e}"))?;
                Ok(format!("restored to {before}"))
            })
        }),
    }
}

/// Ends the processes in cgroup `path` (SIGTERM, SIGKILL after a second); returns them
/// as `name (pid N)`.
fn end_processes(path: &Path) -> Vec<String> {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let procs = || -> Vec<i32> {
        fs::read_to_string(path.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    };
    let found: Vec<String> = procs()
        .into_iter()
        .map(|p| {
            let comm = fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
            format!("{} (pid {p})", comm.trim())
        })
        .collect();
    for p in procs() {
        let _ = kill(Pid::from_raw(p), Signal::SIGTERM);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    while !procs().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // cgroup.kill (Linux 5.14) also reaches processes forked meanwhile and those in
    // child cgroups; signalling the listed ones is the fallback.
    if !procs().is_empty() && fs::write(path.join("cgroup.kill"), "1").is_err() {
        for p in procs() {
            let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
        }
    }
    found
}

/// Removes a cgroup directory, waiting up to a second for exiting processes to leave.
pub(crate) fn remove_cgroup(path: &Path) -> io::Result<()> {
    let mut tries = 0;
    loop {
        match fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && tries < 50 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => return Err(e),
        }
    }
}

//! Job groups: what a set of identical jobs does (fio's job section), parsed from
//! `key=value,...` and printed back in the same form.

use std::fmt;

use netlane::cpus::CpuList;
use netlane::metrics::units::format_size;
use serde::Serialize;

/// Which CPUs a job group's threads run on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CpuBinding {
    /// Job i is pinned to the `i`-th CPU of the list (wrapping around).
    Pinned(CpuList),
    /// Not pinned: the scheduler decides, and each command goes to the queue of the CPU
    /// it is submitted from.
    Unbound,
}

/// One group of identical jobs (fio's job section).
#[derive(Debug, Clone, Serialize)]
pub struct JobGroup {
    /// Name in reports.
    pub name: String,
    /// Random offsets (else sequential).
    pub random: bool,
    /// Percentage of reads (100 = read only, 0 = write only).
    pub read_pct: u8,
    /// Block size in bytes (a multiple of the namespace block size).
    pub bs: u32,
    /// Commands in flight per job.
    pub qd: u32,
    /// Number of jobs.
    pub jobs: u32,
    /// CPU binding.
    pub cpus: CpuBinding,
    /// High priority: use the poll queues.
    pub hipri: bool,
}

impl JobGroup {
    /// Parses `key=value,...`: name, rw (read|write|randread|randwrite|rw|randrw),
    /// rwmixread, bs, qd (iodepth), jobs (numjobs), cpus (a CPU list such as `0-3,5`,
    /// or `any`), hipri (1/0, true/false, yes/no). A CPU list's own commas need no
    /// quoting: `cpus=0-1,3,qd=4` is cpus 0, 1 and 3 with qd 4, since a piece without
    /// `=` continues the value before it.
    pub fn parse(spec: &str) -> Result<JobGroup, String> {
        let mut g = JobGroup {
            name: "job".into(),
            random: true,
            read_pct: 100,
            bs: 4096,
            qd: 1,
            jobs: 1,
            cpus: CpuBinding::Unbound,
            hipri: false,
        };
        let mut mix = None;
        let mut rw_mixed = false;
        for (k, v) in pairs(spec)? {
            let (k, v) = (k.as_str(), v.as_str());
            let num = |v: &str, max: u64| match v.parse::<u64>() {
                Ok(n) if n <= max => Ok(n),
                Ok(_) => Err(format!("{k}={v}: at most {max}")),
                Err(_) => Err(format!("{k}={v}: not a number")),
            };
            match k {
                "name" => g.name = v.to_string(),
                "rw" => {
                    (g.random, g.read_pct, rw_mixed) = match v {
                        "read" => (false, 100, false),
                        "write" => (false, 0, false),
                        "randread" => (true, 100, false),
                        "randwrite" => (true, 0, false),
                        "rw" | "readwrite" => (false, 50, true),
                        "randrw" => (true, 50, true),
                        _ => return Err(format!("rw={v}: expected read, write, randread, randwrite, rw or randrw")),
                    }
                }
                "rwmixread" => {
                    mix = Some(num(v, 100)? as u8);
                }
                "bs" => {
                    let b = netlane::metrics::units::parse_size(v).map_err(|e| e.to_string())?;
                    if b == 0 || b > u64::from(u32::MAX) {
                        return Err(format!("bs={v}: must be 1 byte..4 GiB"));
                    }
                    g.bs = b as u32;
                }
                "qd" | "iodepth" => g.qd = num(v, 65535)? as u32,
                "jobs" | "numjobs" => g.jobs = num(v, 4096)? as u32,
                "cpus" | "cpus_allowed" => {
                    g.cpus = if v == "any" {
                        CpuBinding::Unbound
                    } else {
                        CpuBinding::Pinned(
                            v.parse().map_err(|e: netlane::cpus::CpuListError| format!("cpus={v}: {e}"))?,
                        )
                    }
                }
                "hipri" => {
                    g.hipri = match v {
                        "1" | "true" | "yes" => true,
                        "0" | "false" | "no" => false,
                        _ => return Err(format!("hipri={v}: expected 1 or 0")),
                    }
                }
                _ => return Err(format!("unknown job key {k:?}")),
            }
        }
        if let Some(p) = mix {
            if !rw_mixed {
                return Err("rwmixread needs rw=rw or rw=randrw".into());
            }
            g.read_pct = p;
        }
        if g.qd == 0 || g.jobs == 0 {
            return Err("qd and jobs must be at least 1".into());
        }
        Ok(g)
    }

    /// fio's name for the pattern: `randread`, `write`, `rw`, ...
    pub fn rw_name(&self) -> String {
        let base = match self.read_pct {
            100 => "read",
            0 => "write",
            _ => "rw",
        };
        if self.random { format!("rand{base}") } else { base.to_string() }
    }
}

/// Splits `k=v,k=v` into pairs; a piece without `=` continues the previous value (a
/// CPU list's commas).
fn pairs(spec: &str) -> Result<Vec<(String, String)>, String> {
    let mut out: Vec<(String, String)> = Vec::new();
    for piece in spec.split(',').filter(|s| !s.is_empty()) {
        match piece.split_once('=') {
            Some((k, v)) => out.push((k.trim().to_string(), v.trim().to_string())),
            None => match out.last_mut() {
                Some((_, v)) => {
                    v.push(',');
                    v.push_str(piece.trim());
                }
                None => return Err(format!("{piece:?}: expected key=value")),
            },
        }
    }
    Ok(out)
}

impl fmt::Display for JobGroup {
    /// The group as `key=value` pairs that [`JobGroup::parse`] reads back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "name={},rw={}", self.name, self.rw_name())?;
        if !matches!(self.read_pct, 0 | 100) {
            write!(f, ",rwmixread={}", self.read_pct)?;
        }
        write!(f, ",bs={},qd={},jobs={}", format_size(u64::from(self.bs)), self.qd, self.jobs)?;
        match &self.cpus {
            CpuBinding::Unbound => f.write_str(",cpus=any")?,
            CpuBinding::Pinned(c) => write!(f, ",cpus={c}")?,
        }
        if self.hipri {
            f.write_str(",hipri=1")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_specs_parse_like_fio() {
        let g = JobGroup::parse("name=readers,rw=randread,bs=4k,qd=1,jobs=16,cpus=0").unwrap();
        assert_eq!((g.bs, g.qd, g.jobs, g.read_pct, g.random), (4096, 1, 16, 100, true));
        assert_eq!(g.cpus, CpuBinding::Pinned(CpuList::one(0)));
        let g = JobGroup::parse("rw=randrw,rwmixread=70,bs=1M,iodepth=32,cpus=any").unwrap();
        assert_eq!((g.read_pct, g.bs, g.qd, g.cpus), (70, 1 << 20, 32, CpuBinding::Unbound));
        for bad in [
            "rw=sideways",
            "bs=0",
            "qd=0",
            "qd=70000",
            "rwmixread=70",
            "x=1",
            "cpus=a",
            "rw=randrw,rwmixread=101",
            "bs",
            "hipri=maybe",
            ",0,qd=1",
        ] {
            assert!(JobGroup::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn cpu_lists_keep_their_commas() {
        let g = JobGroup::parse("name=a,cpus=0-1,3,qd=4").unwrap();
        assert_eq!(g.cpus, CpuBinding::Pinned("0-1,3".parse().unwrap()));
        assert_eq!(g.qd, 4);
    }

    #[test]
    fn printed_groups_parse_back() {
        for spec in [
            "name=readers,rw=randread,bs=4K,qd=1,jobs=16,cpus=0-1,3",
            "name=w,rw=rw,rwmixread=70,bs=1M,qd=32,jobs=1,cpus=any,hipri=1",
        ] {
            let g = JobGroup::parse(spec).unwrap();
            assert_eq!(g.to_string(), spec);
            let again = JobGroup::parse(&g.to_string()).unwrap();
            assert_eq!(again.to_string(), spec);
        }
    }
}

//! CPU time from `getrusage(2)` and `/proc/stat`.

use std::fs;
use std::io;
use std::ops::Sub;

use nix::sys::resource::{UsageWho, getrusage};
use serde::Serialize;

/// User and system CPU time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct CpuTime {
    /// Seconds in user mode.
    pub user_s: f64,
    /// Seconds in the kernel (including softirq work charged to this task).
    pub system_s: f64,
    /// Voluntary context switches (the task blocked: a full socket buffer, a sleep).
    pub voluntary_switches: u64,
    /// Involuntary context switches (the task was preempted).
    pub involuntary_switches: u64,
}

impl CpuTime {
    /// User plus system seconds.
    pub fn total_s(&self) -> f64 {
        self.user_s + self.system_s
    }
}

impl Sub for CpuTime {
    type Output = CpuTime;
    fn sub(self, rhs: CpuTime) -> CpuTime {
        CpuTime {
            user_s: (self.user_s - rhs.user_s).max(0.0),
            system_s: (self.system_s - rhs.system_s).max(0.0),
            voluntary_switches: self.voluntary_switches.saturating_sub(rhs.voluntary_switches),
            involuntary_switches: self.involuntary_switches.saturating_sub(rhs.involuntary_switches),
        }
    }
}

fn usage(who: UsageWho) -> CpuTime {
    match getrusage(who) {
        Ok(u) => {
            let secs = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
            CpuTime {
                user_s: secs(u.user_time()),
                system_s: secs(u.system_time()),
                voluntary_switches: u.voluntary_context_switches().max(0) as u64,
                involuntary_switches: u.involuntary_context_switches().max(0) as u64,
            }
        }
        // getrusage cannot fail for these `who` values (getrusage(2): EINVAL only for
        // an unknown `who`).
        Err(_) => CpuTime::default(),
    }
}

/// CPU time of the calling thread so far (`RUSAGE_THREAD`).
pub fn thread_cpu() -> CpuTime {
    usage(UsageWho::RUSAGE_THREAD)
}

/// Nanoseconds any task (a kernel thread too, such as a threaded-NAPI poller) has run
/// so far, from the first field of `/proc/<pid>/schedstat`.
pub fn task_cpu_ns(pid: u32) -> io::Result<u64> {
    task_schedstat(pid).map(|(ns, _)| ns)
}

/// Nanoseconds any task has run so far and the times it has been put on a CPU (the
/// first and third fields of `/proc/<pid>/schedstat`): for a kernel thread that sleeps
/// between bursts of work, such as a threaded-NAPI poller, the runs are its wake-ups.
pub fn task_schedstat(pid: u32) -> io::Result<(u64, u64)> {
    let text = fs::read_to_string(format!("/proc/{pid}/schedstat"))?;
    let field = |i: usize| text.split_whitespace().nth(i).and_then(|v| v.parse().ok());
    field(0).zip(field(2)).ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidData, format!("unreadable /proc/{pid}/schedstat: {text:?}"))
    })
}

/// CPU time of the whole process so far (`RUSAGE_SELF`).
pub fn process_cpu() -> CpuTime {
    usage(UsageWho::RUSAGE_SELF)
}

/// Aggregate CPU counters of the machine from the first line of `/proc/stat`, in
/// clock ticks (USER_HZ). `/proc/stat` is not namespaced: inside a network namespace
/// it still describes the whole machine, which is what we want.
///
/// The columns are not measured alike. On a tickless kernel (`NO_HZ`, Debian's, unless
/// booted with `nohz=off`) the idle and iowait columns are measured at every idle entry
/// and exit (fs/proc/stat.c: get_idle_time uses the tick-sched idle clock), but user
/// and system (and irq and softirq, without `IRQ_TIME_ACCOUNTING`) are sampled at the
/// tick (without `VIRT_CPU_ACCOUNTING_GEN`): the tick charges its whole period to
/// whatever it interrupts. Work that runs in step with the tick, such
/// as a wake-up by a jiffies timer (a TPACKET_V3 block retired by its timeout) that is
/// done before the next tick, is charged to no one. A reading therefore carries the
/// monotonic time it was taken at, and [`SystemCpu::delta`] counts busy time as wall
/// time less the measured idle and steal; the sampled columns only split it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SystemCpu {
    user: u64,
    nice: u64,
    system: u64,
    idle: u64,
    iowait: u64,
    irq: u64,
    softirq: u64,
    steal: u64,
    cpus: u32,
    /// CLOCK_MONOTONIC nanoseconds right after the read (0: parsed from text).
    at_ns: u64,
}

/// System-wide CPU use between two [`SystemCpu`] readings, in CPU-seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, schemars::JsonSchema)]
pub struct SystemCpuDelta {
    /// Busy time on all CPUs: wall time less idle, iowait and steal (see
    /// [`SystemCpu`]; from the sampled columns when a reading has no time).
    pub busy_s: f64,
    /// Busy time as the tick sampled it (user + system + irq + softirq): short of
    /// `busy_s` when work runs in step with the tick.
    pub busy_sampled_s: f64,
    /// Of which in user mode (user + nice; sampled at the tick).
    pub user_s: f64,
    /// Of which in the kernel outside interrupts (sampled at the tick).
    pub system_s: f64,
    /// Of which in softirq context (network receive and transmit completion; sampled
    /// at the tick).
    pub softirq_s: f64,
    /// Of which in hard interrupts (sampled at the tick).
    pub irq_s: f64,
    /// Time stolen by the hypervisor.
    pub steal_s: f64,
    /// Wall time covered by all CPUs together (busy + idle + iowait + steal).
    pub total_s: f64,
    /// Number of CPUs.
    pub cpus: u32,
}

impl SystemCpuDelta {
    /// This and `o` as one (two machines' CPUs together).
    pub fn plus(&self, o: &SystemCpuDelta) -> SystemCpuDelta {
        SystemCpuDelta {
            busy_s: self.busy_s + o.busy_s,
            busy_sampled_s: self.busy_sampled_s + o.busy_sampled_s,
            user_s: self.user_s + o.user_s,
            system_s: self.system_s + o.system_s,
            softirq_s: self.softirq_s + o.softirq_s,
            irq_s: self.irq_s + o.irq_s,
            steal_s: self.steal_s + o.steal_s,
            total_s: self.total_s + o.total_s,
            cpus: self.cpus + o.cpus,
        }
    }
}

impl SystemCpu {
    /// Reads `/proc/stat`.
    pub fn read() -> io::Result<Self> {
        let text = fs::read_to_string("/proc/stat")?;
        let at_ns = monotonic_ns();
        let s = Self::parse(&text)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unexpected /proc/stat format"))?;
        Ok(Self { at_ns, ..s })
    }

    /// Reads one CPU's line of `/proc/stat` (`cpuN`).
    pub fn read_cpu(cpu: usize) -> io::Result<Self> {
        let text = fs::read_to_string("/proc/stat")?;
        let at_ns = monotonic_ns();
        let s = Self::parse_cpu(&text, cpu)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("no cpu{cpu} line in /proc/stat")))?;
        Ok(Self { at_ns, ..s })
    }

    /// The same counters taken at `at_ns` monotonic nanoseconds (for tests).
    pub fn at(self, at_ns: u64) -> Self {
        Self { at_ns, ..self }
    }

    /// Parses the line of CPU `cpu` from the text of `/proc/stat` (`cpus` is then 1).
    pub fn parse_cpu(text: &str, cpu: usize) -> Option<Self> {
        let name = format!("cpu{cpu}");
        let line = text.lines().find(|l| l.split_ascii_whitespace().next() == Some(name.as_str()))?;
        let mut s = Self::parse_line(line, &name)?;
        s.cpus = 1;
        Some(s)
    }

    /// Parses the text of `/proc/stat`.
    pub fn parse(text: &str) -> Option<Self> {
        let mut s = Self::parse_line(text.lines().next()?, "cpu")?;
        s.cpus = text
            .lines()
            .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
            .count() as u32;
        Some(s)
    }

    fn parse_line(first: &str, name: &str) -> Option<Self> {
        let mut fields = first.split_ascii_whitespace();
        if fields.next()? != name {
            return None;
        }
        let mut v = [0u64; 8];
        for slot in v.iter_mut() {
            *slot = fields.next().and_then(|f| f.parse().ok()).unwrap_or(0);
        }
        Some(Self {
            user: v[0],
            nice: v[1],
            system: v[2],
            idle: v[3],
            iowait: v[4],
            irq: v[5],
            softirq: v[6],
            steal: v[7],
            cpus: 0,
            at_ns: 0,
        })
    }

    /// CPU use from `self` (earlier) to `later`.
    pub fn delta(&self, later: &SystemCpu) -> SystemCpuDelta {
        let hz = clock_ticks_per_sec();
        let d = |a: u64, b: u64| b.saturating_sub(a) as f64 / hz;
        let user = d(self.user, later.user) + d(self.nice, later.nice);
        let system = d(self.system, later.system);
        let irq = d(self.irq, later.irq);
        let softirq = d(self.softirq, later.softirq);
        // Together: iowait can fall while idle rises by more (an idle period in progress
        // is credited to one or the other by whether tasks wait for I/O at read time).
        let idle = d(self.idle + self.iowait, later.idle + later.iowait);
        let steal = d(self.steal, later.steal);
        let sampled = user + system + irq + softirq;
        // Wall time on every CPU, when both readings carry their time.
        let wall = (self.at_ns > 0 && later.at_ns > self.at_ns)
            .then(|| (later.at_ns - self.at_ns) as f64 / 1e9 * f64::from(later.cpus.max(1)));
        let (busy, total) = match wall {
            // Idle and steal are counted in USER_HZ units: a few ticks of rounding.
            Some(w) => ((w - idle - steal).max(0.0), w.max(idle + steal)),
            None => (sampled, sampled + idle + steal),
        };
        SystemCpuDelta {
            busy_s: busy,
            busy_sampled_s: sampled,
            user_s: user,
            system_s: system,
            softirq_s: softirq,
            irq_s: irq,
            steal_s: steal,
            total_s: total,
            cpus: later.cpus,
        }
    }
}

/// CLOCK_MONOTONIC, nanoseconds (the clock the tick-sched idle time is kept in).
fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

fn clock_ticks_per_sec() -> f64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        Ok(Some(hz)) if hz > 0 => hz as f64,
        _ => 100.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const SAMPLE: &str =
        "cpu  100 5 50 1000 10 3 20 2 0 0\ncpu0 50 2 25 500 5 1 10 1 0 0\ncpu1 50 3 25 500 5 2 10 1 0 0\nintr 1 2 3\n";

    #[test]
    fn parses_proc_stat() {
        let s = SystemCpu::parse(SAMPLE).unwrap();
        assert_eq!(s.cpus, 2);
        let later =
            SystemCpu::parse(&SAMPLE.replacen("cpu  100 5 50 1000 10 3 20 2", "cpu  200 5 150 1100 10 3 120 2", 1))
                .unwrap();
        let d = s.delta(&later);
        let hz = clock_ticks_per_sec();
        assert!((d.busy_s - 300.0 / hz).abs() < 1e-9);
        assert!((d.softirq_s - 100.0 / hz).abs() < 1e-9);
        assert!((d.total_s - 400.0 / hz).abs() < 1e-9);
    }

    #[test]
    fn busy_time_is_wall_time_less_measured_idle() {
        let hz = clock_ticks_per_sec();
        // One CPU, 2 s apart: idle grew by 1.5 s, but the tick sampled only 0.1 s of
        // work (it ran in step with the tick): busy is the 0.5 s that was not idle.
        let a = SystemCpu::parse_cpu("cpu0 0 0 0 0 0 0 0 0\n", 0).unwrap().at(1_000_000_000);
        let ticks = |s: f64| (s * hz).round() as u64;
        let text = format!("cpu0 {} 0 0 {} 0 0 0 0\n", ticks(0.1), ticks(1.5));
        let b = SystemCpu::parse_cpu(&text, 0).unwrap().at(3_000_000_000);
        let d = a.delta(&b);
        assert!((d.total_s - 2.0).abs() < 1e-9, "{d:?}");
        assert!((d.busy_s - 0.5).abs() < 0.02, "{d:?}");
        assert!((d.busy_sampled_s - 0.1).abs() < 0.02, "{d:?}");
        // Without times (parsed text) it falls back to the sampled columns.
        let d =
            SystemCpu::parse_cpu("cpu0 0 0 0 0 0 0 0 0\n", 0).unwrap().delta(&SystemCpu::parse_cpu(&text, 0).unwrap());
        assert!((d.busy_s - d.busy_sampled_s).abs() < 1e-12, "{d:?}");
    }

    #[test]
    fn parses_one_cpu() {
        let c1 = SystemCpu::parse_cpu(SAMPLE, 1).unwrap();
        assert_eq!((c1.cpus, c1.user, c1.idle, c1.softirq), (1, 50, 500, 10));
        assert!(SystemCpu::parse_cpu(SAMPLE, 2).is_none());
        // "cpu1" must not match "cpu10".
        assert!(SystemCpu::parse_cpu("cpu10 1 2 3 4 5 6 7 8\n", 1).is_none());
    }

    #[test]
    fn rejects_garbage() {
        assert!(SystemCpu::parse("").is_none());
        assert!(SystemCpu::parse("intr 1 2").is_none());
    }

    #[test]
    fn reads_this_machine() {
        let a = SystemCpu::read().unwrap();
        assert!(a.cpus >= 1);
        // Spin for 50 ms of wall time: the thread must have been charged most of it.
        let t0 = thread_cpu();
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
        }
        let used = (thread_cpu() - t0).total_s();
        assert!(used > 0.01, "spinning 50 ms charged only {used} s");
        assert!(process_cpu().total_s() > 0.0);
    }
}

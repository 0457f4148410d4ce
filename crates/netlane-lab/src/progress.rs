//! Progress of runs: k of N and an estimate of the time left, as a bar on a terminal
//! and as plain lines otherwise (logs, CI, pipes).

use std::io::IsTerminal;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How scenarios report what they do. Everything goes to stderr.
pub trait Progress: Sync {
    /// `runs` more runs are planned (adds to the total).
    fn plan(&self, runs: usize);
    /// A run starts.
    fn start(&self, label: &str);
    /// A run finished; `summary` is one line.
    fn finish(&self, label: &str, summary: &str);
    /// Something worth saying that is not a run (a phase, a warm-up).
    fn say(&self, text: &str);
}

/// Discards everything (tests, library use).
#[derive(Debug, Default)]
pub struct Silent;

impl Progress for Silent {
    fn plan(&self, _: usize) {}
    fn start(&self, _: &str) {}
    fn finish(&self, _: &str, _: &str) {}
    fn say(&self, _: &str) {}
}

/// The command line's progress: a bar with k/N and ETA on a terminal, lines with the
/// same facts otherwise.
#[derive(Debug)]
pub struct Reporter {
    bar: Option<ProgressBar>,
    total: AtomicUsize,
    done: AtomicUsize,
    scope: Mutex<String>,
    started: Instant,
}

impl Reporter {
    /// A bar if stderr is a terminal, else lines.
    pub fn new() -> Reporter {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
            b.set_style(
                ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} runs, eta {eta}  {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            b.enable_steady_tick(Duration::from_millis(200));
            b
        });
        Reporter {
            bar,
            total: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            scope: Mutex::new(String::new()),
            started: Instant::now(),
        }
    }

    /// Names what runs next (a scenario), put before each label.
    pub fn set_scope(&self, scope: &str) {
        if let Ok(mut s) = self.scope.lock() {
            *s = scope.to_string();
        }
    }

    /// Prints a line above the bar (or as a line).
    pub fn println(&self, line: &str) {
        match &self.bar {
            Some(b) => b.println(line),
            None => eprintln!("{line}"),
        }
    }

    /// Runs `f` with the bar hidden (to print results to stdout on the same terminal).
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        match &self.bar {
            Some(b) => b.suspend(f),
            None => f(),
        }
    }

    /// Removes the bar.
    pub fn clear(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }

    fn scoped(&self, label: &str) -> String {
        let scope = self.scope.lock().map(|s| s.clone()).unwrap_or_default();
        if scope.is_empty() { label.to_string() } else { format!("{scope}: {label}") }
    }

    /// `[3/12, eta 1m20s]`, estimated from the runs done so far.
    fn position(&self) -> String {
        let (done, total) = (self.done.load(Ordering::Relaxed), self.total.load(Ordering::Relaxed));
        let eta = if done > 0 && total > done {
            let per = self.started.elapsed().as_secs_f64() / done as f64;
            format!(", eta {}", short_duration(Duration::from_secs_f64(per * (total - done) as f64)))
        } else {
            String::new()
        };
        format!("[{done}/{total}{eta}]")
    }
}

impl Default for Reporter {
    fn default() -> Self {
        Reporter::new()
    }
}

impl Progress for Reporter {
    fn plan(&self, runs: usize) {
        let t = self.total.fetch_add(runs, Ordering::Relaxed) + runs;
        if let Some(b) = &self.bar {
            b.set_length(t as u64);
        }
    }

    fn start(&self, label: &str) {
        if let Some(b) = &self.bar {
            b.set_message(self.scoped(label));
        }
    }

    fn finish(&self, label: &str, summary: &str) {
        self.done.fetch_add(1, Ordering::Relaxed);
        let line = format!("{} {}: {summary}", self.position(), self.scoped(label));
        match &self.bar {
            Some(b) => {
                b.inc(1);
                b.println(line);
            }
            None => eprintln!("{line}"),
        }
    }

    fn say(&self, text: &str) {
        match &self.bar {
            Some(b) => b.set_message(self.scoped(text)),
            None => eprintln!("{}", self.scoped(text)),
        }
    }
}

/// `1m20s`, `45s`, `1h02m`.
pub fn short_duration(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}h{:02}m", s / 3600, s % 3600 / 60)
    } else if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eta_and_durations() {
        assert_eq!(short_duration(Duration::from_secs(80)), "1m20s");
        assert_eq!(short_duration(Duration::from_secs(7)), "7s");
        assert_eq!(short_duration(Duration::from_secs(3720)), "1h02m");
        let r = Reporter { bar: None, ..Reporter::new() };
        r.plan(4);
        r.done.store(1, Ordering::Relaxed);
        assert!(r.position().starts_with("[1/4, eta "), "{}", r.position());
    }
}

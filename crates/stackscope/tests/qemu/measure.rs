//! What the test kernel measured of itself, and the one comparison of a sampled split with
//! it. Every vCPU of the kernel adds up, with its architecture's counter, the time it spent
//! in `spin_a` and in `spin_b` in the rounds the host ran it through, and prints the totals
//! on the serial port a few times a second (`stackscope-guest: cpuN a=HEX b=HEX u=HEX
//! t=HEX`). The difference between a report before sampling and one after is the split the
//! samples must show. Each report also gives the units of work done (the guest's own
//! progress) and the counter, which holds while the guest is stopped: against the host's
//! clock ([`follow_reports`], [`rate_of`]) they tell what sampling cost the guest.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::common::{parse_folded, wait_until, Truth};

/// One vCPU's stacks, each root first, with counts.
pub type Stacks = Vec<(Vec<String>, u64)>;

/// Counter ticks each vCPU spent in spin_a and spin_b so far, by its last report.
pub type Reports = BTreeMap<u32, (u64, u64)>;

/// Every vCPU's last report in the serial log at `serial`.
pub fn reports(serial: &Path) -> Reports {
    let log = std::fs::read_to_string(serial).unwrap_or_default();
    let mut times = BTreeMap::new();
    for line in log.lines() {
        let Some(rest) = line.strip_prefix("stackscope-guest: cpu") else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let hex = |f: Option<&&str>, key: &str| {
            f.and_then(|f| f.strip_prefix(key))
                .and_then(|v| u64::from_str_radix(v, 16).ok())
        };
        let cpu = fields.first().and_then(|c| c.parse().ok());
        if let (Some(cpu), Some(a), Some(b)) =
            (cpu, hex(fields.get(1), "a="), hex(fields.get(2), "b="))
        {
            times.insert(cpu, (a, b));
        }
    }
    times
}

/// The kernel's measure over a sampled interval: the reports before it and after it.
pub struct Window {
    serial: PathBuf,
    before: Reports,
    after: Reports,
}

impl Window {
    /// Waits until all `cpus` vCPUs have reported in the serial log at `serial`: the start
    /// of a window.
    pub fn open(serial: &Path, cpus: u32) -> Window {
        let before = wait_until(&format!("all {cpus} vCPUs report their times"), || {
            Some(reports(serial)).filter(|m| m.len() == cpus as usize)
        });
        Window {
            serial: serial.to_path_buf(),
            before,
            after: Reports::new(),
        }
    }

    /// Waits until every vCPU has reported again: the end of the window. The guest runs on
    /// after stackscope detaches, so these reports cover the sampled time.
    pub fn close(&mut self) {
        self.after = wait_until("every vCPU reports its times after sampling", || {
            let now = reports(&self.serial);
            let moved = now.iter().all(|(cpu, t)| self.before.get(cpu) != Some(t));
            (now.len() == self.before.len() && moved).then_some(now)
        });
    }

    /// The time vCPUs `cpus` spent in spin_a and in spin_b within the window, as a truth to
    /// compare shares with (counter ticks in place of nanoseconds: only their ratios count).
    pub fn truth(&self, cpus: &[u32]) -> Truth {
        let (mut a, mut b) = (0, 0);
        for cpu in cpus {
            let (a1, b1) = *self.after.get(cpu).expect("a closed window with this vCPU");
            let (a0, b0) = self.before.get(cpu).copied().unwrap_or((0, 0));
            a += a1 - a0;
            b += b1 - b0;
        }
        assert!(
            a + b > 0,
            "the kernel reported no time: {:?} {:?}",
            self.before,
            self.after
        );
        Truth {
            functions: vec![("spin_a".into(), a), ("spin_b".into(), b)],
            cpu_ns: a + b,
        }
    }
}

/// Each vCPU's stacks from folded lines `cpuN;root;...;leaf COUNT`.
pub fn vcpus_of_folded(text: &str) -> BTreeMap<u32, Stacks> {
    let mut by_cpu: BTreeMap<u32, Stacks> = BTreeMap::new();
    for (mut frames, count) in parse_folded(text) {
        let thread = frames.remove(0);
        let cpu = thread
            .strip_prefix("cpu")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("folded line does not start with its vCPU: {thread:?}"));
        by_cpu.entry(cpu).or_default().push((frames, count));
    }
    by_cpu
}

/// Samples in `stacks` whose frames satisfy `keep`.
pub fn count(stacks: &[(Vec<String>, u64)], keep: impl Fn(&[String]) -> bool) -> u64 {
    stacks.iter().filter(|s| keep(&s.0)).map(|s| s.1).sum()
}

/// The most frequent stacks, one a line, for failure messages.
pub fn describe(stacks: &[(Vec<String>, u64)]) -> String {
    let mut sorted: Vec<_> = stacks.iter().collect();
    sorted.sort_by_key(|s| std::cmp::Reverse(s.1));
    let mut text = format!("{} samples; top stacks:\n", count(stacks, |_| true));
    for (frames, count) in sorted.into_iter().take(8) {
        text.push_str(&format!("  {count:5} {}\n", frames.join(";")));
    }
    text
}

/// Asserts spin_a's share of the looks that found spin_a or spin_b against `truth`, within
/// the binomial tolerance of that many looks ([`Truth::tolerance`]).
pub fn assert_split(what: &str, stacks: &[(Vec<String>, u64)], truth: &Truth) {
    let leaf = |name: &'static str| move |f: &[String]| f.last().is_some_and(|l| l == name);
    let a = count(stacks, leaf("spin_a"));
    let looks = a + count(stacks, leaf("spin_b"));
    let got = a as f64 / looks.max(1) as f64;
    let measured = truth.share("spin_a");
    let tolerance = truth.tolerance(measured, looks.max(1));
    eprintln!(
        "{what}: spin_a has {:.1}% of {looks} looks, the kernel measured {:.1}% ± {:.1} points",
        got * 100.0,
        measured * 100.0,
        tolerance * 100.0
    );
    assert!(
        looks > 0 && (got - measured).abs() <= tolerance,
        "{what}: spin_a has {:.1}% of the {looks} looks in spin_a or spin_b, the kernel measured {:.1}% ± {:.1} points\n{}",
        got * 100.0,
        measured * 100.0,
        tolerance * 100.0,
        describe(stacks)
    );
}

/// One report as the host saw it arrive: which vCPU, the units of work it had done, and its
/// counter, which holds while the guest is stopped.
#[derive(Clone, Copy, Debug)]
pub struct Report {
    pub at: std::time::Instant,
    pub cpu: u32,
    pub units: u64,
    pub counter: u64,
}

/// The reports that arrive in the serial log at `serial` while `keep_on` holds, each stamped
/// with the host's clock as it arrives (the log is polled every 2 ms).
pub fn follow_reports(serial: &Path, mut keep_on: impl FnMut() -> bool) -> Vec<Report> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(serial).expect("open the serial log");
    file.seek(SeekFrom::End(0)).expect("seek the serial log");
    let (mut pending, mut got) = (String::new(), Vec::new());
    while keep_on() {
        let _ = file.read_to_string(&mut pending);
        let at = std::time::Instant::now();
        while let Some(end) = pending.find('\n') {
            let line: String = pending.drain(..=end).collect();
            got.extend(report_of(line.trim_end(), at));
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    got
}

/// A report line `stackscope-guest: cpuN a=HEX b=HEX u=HEX t=HEX` that arrived `at`.
fn report_of(line: &str, at: std::time::Instant) -> Option<Report> {
    let rest = line.strip_prefix("stackscope-guest: cpu")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let hex = |i: usize, key: &str| u64::from_str_radix(fields.get(i)?.strip_prefix(key)?, 16).ok();
    Some(Report {
        at,
        cpu: fields.first()?.parse().ok()?,
        units: hex(3, "u=")?,
        counter: hex(4, "t=")?,
    })
}

/// How fast `value` of vCPU `cpu`'s reports grew per second of the host's clock: the
/// least-squares slope, so that a line the host was late to write moves it little.
pub fn rate_of(reports: &[Report], cpu: u32, value: impl Fn(&Report) -> u64) -> f64 {
    let points: Vec<(f64, f64)> = reports
        .iter()
        .filter(|r| r.cpu == cpu)
        .map(|r| {
            (
                r.at.duration_since(reports[0].at).as_secs_f64(),
                value(r) as f64,
            )
        })
        .collect();
    assert!(
        points.len() >= 4,
        "too few reports of vCPU {cpu}: {points:?}"
    );
    let n = points.len() as f64;
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let covariance: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    let variance: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    covariance / variance
}

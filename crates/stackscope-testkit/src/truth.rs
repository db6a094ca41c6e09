//! What a split workload (stackscope's `tests/workloads/split.c` and `rust_deep.rs`) measured
//! of itself, and the one comparison of a profile's shares with it.
//!
//! The workloads read their thread's CPU clock on entering and leaving each hot function and
//! write the totals to a file named on their command line; that is the truth a profile of the
//! same window must show. A sampled share is a binomial estimate of the measured one, so the
//! tolerance follows from the sample count instead of being a fixed number of points.

use std::path::Path;

/// Binomial standard errors a sampled share may stray from the measured share. At 4 a correct
/// profile fails one comparison in about 16,000.
pub const SIGMAS: f64 = 4.0;

/// The measured CPU time outside both functions (clock reads, the loop in main, the truth
/// file's own writes) may be sampled in either of them, so it widens the tolerance; past this
/// share the truth is too loose to test against.
pub const MAX_OUTSIDE: f64 = 0.03;

/// The CPU time a split workload measured over some window: in each hot function, by the name
/// a profiler gives it, and in all.
#[derive(Clone, Debug, PartialEq)]
pub struct Truth {
    pub functions: Vec<(String, u64)>,
    pub cpu_ns: u64,
}

impl Truth {
    /// Reads a truth file (`NAME NS` lines, the last `cpu NS`); `None` while it does not
    /// exist yet.
    pub fn try_read(path: &Path) -> Option<Truth> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => panic!("cannot read truth file {}: {e}", path.display()),
        };
        let mut functions = Vec::new();
        let mut cpu_ns = None;
        for (i, line) in text.lines().enumerate() {
            let (name, ns) = line
                .rsplit_once(' ')
                .and_then(|(name, ns)| Some((name, ns.parse::<u64>().ok()?)))
                .unwrap_or_else(|| panic!("{}:{}: not `NAME NS`: {line:?}", path.display(), i + 1));
            if name == "cpu" {
                cpu_ns = Some(ns);
            } else {
                functions.push((name.to_string(), ns));
            }
        }
        let cpu_ns =
            cpu_ns.unwrap_or_else(|| panic!("{}: no `cpu NS` line:\n{text}", path.display()));
        Some(Truth { functions, cpu_ns })
    }

    /// Reads a truth file that must exist.
    pub fn read(path: &Path) -> Truth {
        Truth::try_read(path)
            .unwrap_or_else(|| panic!("the workload wrote no truth file {}", path.display()))
    }

    /// The truth of the window from `start` (an earlier reading of the same run) to `self`.
    pub fn since(&self, start: &Truth) -> Truth {
        let later = |ns: u64, before: u64| {
            ns.checked_sub(before).unwrap_or_else(|| {
                panic!("truth {self:?} is not later than {start:?}: not the same run?")
            })
        };
        let before = |name: &str| {
            start
                .functions
                .iter()
                .find(|f| f.0 == name)
                .map_or(0, |f| f.1)
        };
        Truth {
            functions: self
                .functions
                .iter()
                .map(|(name, ns)| (name.clone(), later(*ns, before(name))))
                .collect(),
            cpu_ns: later(self.cpu_ns, start.cpu_ns),
        }
    }

    /// Share of the CPU time spent in `name`.
    pub fn share(&self, name: &str) -> f64 {
        let ns = self
            .functions
            .iter()
            .find(|f| f.0 == name)
            .map_or(0, |f| f.1);
        ns as f64 / self.cpu_ns as f64
    }

    /// Share of the CPU time spent outside every hot function.
    pub fn outside(&self) -> f64 {
        let inside: u64 = self.functions.iter().map(|f| f.1).sum();
        1.0 - inside as f64 / self.cpu_ns as f64
    }

    /// Whether the split can be tested against at all: the time measured outside both
    /// functions is at most [`MAX_OUTSIDE`]. A loaded machine can push it past that, which says
    /// nothing of the profiler.
    pub fn testable(&self) -> bool {
        self.cpu_ns > 0 && self.outside() <= MAX_OUTSIDE
    }

    /// How far a share sampled `n` times may sit from the measured share `p`: [`SIGMAS`]
    /// binomial standard errors, sqrt(p(1-p)/n), plus [`Truth::outside`].
    pub fn tolerance(&self, p: f64, n: u64) -> f64 {
        SIGMAS * (p * (1.0 - p) / n as f64).sqrt() + self.outside()
    }

    /// Compares, for every hot function, its share of `n` samples, `got(name)`, with its
    /// measured share: whether each is within [`Truth::tolerance`], and the figures, one line
    /// per function.
    pub fn compare(&self, n: u64, got: impl Fn(&str) -> f64) -> (bool, String) {
        if self.cpu_ns == 0 || n == 0 {
            let text = format!(
                "nothing to compare: {} ns of CPU measured, {n} samples",
                self.cpu_ns
            );
            return (false, text);
        }
        let outside = self.outside();
        let mut ok = self.testable();
        let mut text = format!(
            "{n} samples; {:.3} s of CPU measured by the program, {:.1}% outside both functions{}\n",
            self.cpu_ns as f64 / 1e9,
            outside * 100.0,
            if ok { "" } else { ": too much to test against" },
        );
        for (name, _) in &self.functions {
            let (p, share) = (self.share(name), got(name));
            let sigma = (p * (1.0 - p) / n as f64).sqrt();
            let tolerance = self.tolerance(p, n);
            let off = (share - p).abs() > tolerance;
            ok &= !off;
            text += &format!(
                "  {name}: measured {:.1}%, sampled {:.1}%; allowed ± {:.1} points \
                 ({SIGMAS}σ = {:.1} + {:.1} outside){}\n",
                p * 100.0,
                share * 100.0,
                tolerance * 100.0,
                SIGMAS * sigma * 100.0,
                outside * 100.0,
                if off { "  <-- off" } else { "" }
            );
        }
        (ok, text)
    }

    /// What [`Truth::compare`] finds amiss, if anything.
    pub fn mismatch(&self, n: u64, got: impl Fn(&str) -> f64) -> Option<String> {
        let (ok, text) = self.compare(n, got);
        (!ok).then_some(text)
    }

    /// Panics unless [`Truth::compare`] finds every share within its tolerance; the message
    /// ends with `context()` (the profile's top stacks). The figures go to stderr either way
    /// (seen with `--nocapture`).
    pub fn assert_matches(&self, n: u64, got: impl Fn(&str) -> f64, context: impl Fn() -> String) {
        let (ok, text) = self.compare(n, got);
        eprint!("split: {text}");
        assert!(
            ok,
            "sampled split differs from the measured one: {text}{}",
            context()
        );
    }

    /// The same measurements with the functions' names in reverse order: a wrong truth, to
    /// check that a comparison can fail.
    pub fn swapped(&self) -> Truth {
        let names = self.functions.iter().rev().map(|f| f.0.clone());
        Truth {
            functions: names.zip(self.functions.iter().map(|f| f.1)).collect(),
            cpu_ns: self.cpu_ns,
        }
    }
}

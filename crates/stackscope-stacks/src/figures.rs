//! The figures only one source measures, beyond the profile every source makes: what the
//! eBPF source's kernel maps could not keep and what its program cost, how a GDB stub's
//! stop-the-world rounds went. A [`crate::Recording`] carries its source's figures as one
//! [`SourceFigures`], which the summary reads.

use std::time::Duration;

use stackscope_profile::Profile;

/// What the source that sampled measured, in its own terms.
#[derive(Debug, Clone)]
pub enum SourceFigures {
    /// The eBPF source, which counts stacks in kernel maps with a program of its own.
    Bpf(BpfFigures),
    /// The GDB source, which stops the target to sample it, round by round.
    Gdb(Rounds),
}

/// What the eBPF source's kernel maps could not keep, what its program cost, and what was
/// sampled before the program took over.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BpfFigures {
    pub storage: Storage,
    pub cost: ProgramCost,
    /// The samples of a launched command taken by the perf_event source while the program was
    /// verified and its tables loaded, when it sampled any.
    pub lead_in: Option<LeadInFigures>,
}

/// What the perf_event source sampled before the eBPF program took over.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeadInFigures {
    pub samples: u64,
    /// Of them, the samples with a user stack, and those whose user stack is whole.
    pub user_stacks: u64,
    pub complete: u64,
    /// From the first sample to the handover.
    pub lasted: Duration,
    /// The command ended before the program was ready: these are all its samples.
    pub whole_run: bool,
}

impl LeadInFigures {
    /// What the lead-in's named `profile` holds; `None` when it took no sample. `whole_run`:
    /// the command ended before the program was ready.
    pub fn of(profile: &Profile, whole_run: bool) -> Option<LeadInFigures> {
        let figures = LeadInFigures {
            samples: profile.total_samples(),
            user_stacks: profile.meta.unwind.user_stacks,
            complete: profile.meta.unwind.complete,
            lasted: Duration::from_secs_f64(profile.meta.duration_secs),
            whole_run,
        };
        (figures.samples > 0).then_some(figures)
    }
}

/// Losses of a source that counts stacks in fixed-size kernel maps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Storage {
    /// Some stack was lost because the stack storage was full or its hash bucket taken.
    pub stacks_full: bool,
    /// The count map filled up, so samples of new keys were dropped.
    pub counts_full: bool,
    /// Samples not counted because the count map was full.
    pub dropped_samples: u64,
    /// Stacks that could not be stored, counted as bcc profile counts them for its warning:
    /// one per missed side (user, kernel) of each entry shown.
    pub missed_stacks: u64,
    /// Entries the count map holds: what filled up when `counts_full`.
    pub count_entries: u32,
}

/// What a sampling program in the kernel cost: to load, and to run while the kernel timed it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProgramCost {
    /// Times it ran; 0 when the kernel did not time it.
    pub runs: u64,
    /// Time spent in it in all, in nanoseconds.
    pub run_time_ns: u64,
    /// Instructions the kernel's verifier walked for each program loaded (kernel 5.16+).
    pub verified_insns: Vec<(String, u32)>,
}

/// How fast a stop-the-world source sampled and how long it held the target per round.
#[derive(Debug, Clone, Default)]
pub struct Rounds {
    pub rounds: u64,
    pub stacks: u64,
    pub elapsed: Duration,
    /// From stopping the target to resuming it.
    pub pause_median: Duration,
    pub pause_p95: Duration,
    /// The longest: what the limit on the time stopped can be overrun by at the end.
    pub pause_longest: Duration,
    /// Threads (vCPUs) the target has, and how many were sampled.
    pub threads: usize,
    pub sampled_threads: usize,
    /// Where the pause goes: each step of a round with its median time, in round order.
    pub pause_steps: Vec<(&'static str, Duration)>,
    /// Looks at a thread that had not run since the round before (the host left it no time):
    /// no fresh look at where its time goes, so not counted.
    pub stale_looks: u64,
    /// How long the target ran between two rounds (median): the time each round's looks cover.
    pub run_median: Duration,
    /// How long all rounds, floor rounds included, held the target.
    pub paused: Duration,
    /// The share of wall time the target was allowed to be stopped.
    pub max_slowdown: f64,
    /// Rounds that started later than their schedule to keep within `max_slowdown`.
    pub late_rounds: u64,
    /// Rounds that only stopped the target, read its registers and resumed it, counting
    /// nothing (not among `rounds`), and their median pause: the least a round costs there.
    pub floor_rounds: u64,
    pub floor_median: Duration,
}

impl Rounds {
    pub fn rounds_per_sec(&self) -> f64 {
        self.rounds as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Stacks counted per second: each a look at a thread that ran since the round before.
    pub fn stacks_per_sec(&self) -> f64 {
        self.stacks as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The share of the wall time the target was stopped: what sampling slowed it by.
    pub fn slowdown(&self) -> f64 {
        self.paused.as_secs_f64() / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The median pause of a round against the floor's; `None` without floor rounds.
    pub fn pause_over_floor(&self) -> Option<f64> {
        (self.floor_rounds > 0 && !self.floor_median.is_zero())
            .then(|| self.pause_median.as_secs_f64() / self.floor_median.as_secs_f64())
    }
}

//! Where a round's pause goes: the time of each step, from the interrupt to the resume.

use std::time::{Duration, Instant};

/// The steps of a round, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// The interrupt until the stop reply, with the registers read in the same round trip.
    StopAndRegisters,
    /// Each stack's words, one request per vCPU.
    StackMemory,
    /// The walks, with any memory they needed beyond the words read first.
    Walk,
    /// The resume packet, and the library list when it was read again.
    Resume,
}

const STEPS: [(Step, &str); 4] = [
    (Step::StopAndRegisters, "stop+registers"),
    (Step::StackMemory, "stack memory"),
    (Step::Walk, "walk"),
    (Step::Resume, "resume"),
];

/// Each step's times over all rounds.
pub(super) struct Steps {
    times: [Vec<Duration>; STEPS.len()],
    last: Instant,
}

impl Steps {
    pub(super) fn new() -> Steps {
        Steps {
            times: Default::default(),
            last: Instant::now(),
        }
    }

    /// A round starts now.
    pub(super) fn start(&mut self) {
        self.last = Instant::now();
    }

    /// `step` ended now; it began when the one before it ended.
    pub(super) fn end(&mut self, step: Step) {
        let now = Instant::now();
        self.times[step as usize].push(now - self.last);
        self.last = now;
    }

    /// Each step's median time, in round order; empty before any round.
    pub(super) fn medians(mut self) -> Vec<(&'static str, Duration)> {
        if self.times[0].is_empty() {
            return Vec::new();
        }
        STEPS
            .iter()
            .map(|&(step, name)| {
                let times = &mut self.times[step as usize];
                times.sort();
                (name, super::percentile(times, 50))
            })
            .collect()
    }
}

//! A launched command sampled from its first instruction: while the kernel verifies the
//! sampling program and the command's unwind tables go in, another source (the caller's: the
//! perf_event source) samples it, then hands over at one moment, after which only the program
//! counts. The command is not held meanwhile, so it starts as soon as that source does.
//!
//! The moment is on CLOCK_MONOTONIC, the clock of the program (`bpf_ktime_get_ns`) and of the
//! lead-in's samples: each timer sample is counted by exactly one of the two, whichever CPU or
//! thread it was taken on.

use std::time::Duration;

use stackscope_process::cpu_clock::monotonic_ns;
use stackscope_process::target;
use stackscope_profile::Profile;
use stackscope_stacks::{BpfFigures, Hint, LeadInFigures, Recording, Unnamed};
use stackscope_symbols::Symbolizer;

use super::collect;
use crate::error::BpfError;
use crate::processes::Processes;
use crate::program::{self, ProfileSkel};

/// Another source that samples a launched command until the program takes over.
pub trait LeadIn {
    /// Starts sampling `pid`, still held before exec, with every thread and child it starts;
    /// false when it cannot (the command is then held at exec until its tables are in, as
    /// without a lead-in).
    fn begin(&mut self, pid: u32) -> bool;
    /// The program counts the timer samples taken from `at_ns` (CLOCK_MONOTONIC, still to
    /// come when this is called) on: the lead-in keeps those taken before, and ends once that
    /// moment has passed.
    fn hand_over(&mut self, at_ns: u64);
    /// Ends the lead-in if it still samples and gives its recording, its stacks left unnamed
    /// ([`Recording::unnamed`]) when it handed over, for the program's naming step to name
    /// with the program's own; `None` when it never began.
    fn counted(&mut self) -> Option<Recording>;
}

/// The lead-in's recording, its unnamed stacks named by `symbolizer` (the one that names the
/// program's) with the lead-in's figures and why it stopped early, if it did, for `bpf`.
pub(super) fn named(
    lead: Recording,
    symbolizer: &mut Symbolizer,
    bpf: &mut BpfFigures,
    hints: &mut Vec<Hint>,
) -> Option<Profile> {
    if let Some(e) = &lead.failure {
        let said = format!("the perf_event source's first samples stopped early: {e}");
        hints.push(Hint::Said(said));
    }
    // A lead-in that ended before the handover (its command exited then) named its own.
    let profile = match lead.unnamed {
        Some(Unnamed {
            table,
            meta,
            recovered,
        }) => {
            let (mut profile, _) = table.into_profile(symbolizer, meta, &collect::unnamed_thread);
            profile.meta.unwind.recovered = recovered;
            profile
        }
        None => lead.profile,
    };
    bpf.lead_in = LeadInFigures::of(&profile, false);
    Some(profile)
}

/// How far ahead of now the handover is set. Both sides must know the moment before any
/// sample after it reaches them, so it is later than the few steps that tell them by more
/// than a loaded machine keeps a thread from running.
const HANDOVER_AHEAD: Duration = Duration::from_millis(30);

/// Makes the program count nothing until the handover ([`hand_over`]).
pub(super) fn hold_counting(skel: &mut ProfileSkel<'_>) -> Result<(), BpfError> {
    program::count_timer_from(skel, u64::MAX)
}

/// Loads the tables of the command and of the processes it started so far (following them from
/// now), then sets the moment the lead-in hands over at, on both sides. The program must be
/// sampling already (counting nothing until then: [`hold_counting`]).
pub(super) fn hand_over(
    skel: &mut ProfileSkel<'_>,
    lead_in: &mut (dyn LeadIn + '_),
    processes: &mut Processes,
    pid: u32,
) -> Result<(), BpfError> {
    // Forks after a process is followed reach the program; those before are read from /proc
    // after following it.
    let mut followed = vec![pid];
    let mut next = 0;
    while next < followed.len() {
        let parent = followed[next];
        next += 1;
        for child in target::descendants_of(parent) {
            if !followed.contains(&child) {
                // Sampled, and followed into its own forks, execs and loads.
                program::add_filter_id(skel, child)?;
                program::add_followed_process(skel, child)?;
                followed.push(child);
            }
        }
    }
    for &pid in &followed {
        processes.note_started(pid);
        processes.load(skel, pid);
    }
    let at_ns = monotonic_ns() + HANDOVER_AHEAD.as_nanos() as u64;
    lead_in.hand_over(at_ns);
    program::count_timer_from(skel, at_ns)
}

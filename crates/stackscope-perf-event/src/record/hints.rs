//! The hints a recording carries: what made its stacks less than whole, its frames less named
//! or its samples fewer, each with what to do about it. Hints about a saved file speak of perf
//! record's options, which are perf's; the ones about a live recording carry their figures,
//! for the caller to word with its own options.

use std::sync::Arc;

use stackscope_stacks::table::{Tally, UNREADABLE};
use stackscope_stacks::walk::Stop;
use stackscope_stacks::Hint;

use super::MAX_STACK_COPY;
use crate::unwind::roots::Room;

/// What the hints are drawn from.
pub(super) struct Outcome<'a> {
    /// Binaries that had no unwind info.
    pub missing: &'a [Arc<str>],
    /// The stack copy's size, when stacks were copied (DWARF mode).
    pub stack_bytes: Option<u32>,
    /// False when a saved file was replayed: the hints then speak of perf record's options.
    pub live: bool,
    pub tally: &'a Tally,
    /// What ran the stack copies out.
    pub room: &'a Room,
    pub lost: u64,
    /// Kernel stacks were asked for, but the kernel refused kernel-mode sampling.
    pub kernel_excluded: bool,
}

pub(super) fn hints(o: &Outcome<'_>) -> Vec<Hint> {
    let mut hints = Vec::new();
    stack_hints(o, &mut hints);
    hints.extend(stackscope_stacks::naming_hints(o.tally));
    sample_hints(o, &mut hints);
    hints
}

/// Hints about stacks that are not whole.
fn stack_hints(o: &Outcome<'_>, hints: &mut Vec<Hint>) {
    let stats = &o.tally.stats;
    if !o.missing.is_empty() {
        let names: Vec<&str> = o.missing.iter().map(|p| &**p).take(3).collect();
        hints.push(Hint::Said(format!(
            "{} binaries have no unwind info ({}{}): build with debug info or -C force-frame-pointers=yes",
            o.missing.len(),
            names.join(", "),
            if o.missing.len() > 3 { ", ..." } else { "" }
        )));
    }
    if let Some(bytes) = o.stack_bytes {
        let share = percent(stats.truncated, stats.user_stacks);
        if share >= 1.0 && !o.live {
            hints.push(Hint::Said(format!(
                "{share:.1}% of stacks were deeper than the {bytes}-byte stack copy: record with a larger perf record --call-graph dwarf,SIZE"
            )));
        } else if share >= 1.0 && bytes < MAX_STACK_COPY {
            hints.push(Hint::StackCopyShort {
                share,
                bytes,
                max: MAX_STACK_COPY,
            });
        } else if share >= 1.0 {
            hints.push(Hint::Said(format!(
                "{share:.1}% of stacks were deeper than the largest stack copy perf_event allows ({MAX_STACK_COPY} bytes): their outermost frames are cut and marked [truncated]"
            )));
        }
    }
    room_hint(o, hints);
    let unreadable = percent(stats.unreadable, stats.user_stacks);
    if unreadable >= 1.0 {
        let rest = if o.tally.unreadable_in_exec == stats.unreadable {
            ""
        } else {
            "; the others mostly in a page fault on the stack itself"
        };
        hints.push(Hint::Said(format!(
            "{unreadable:.1}% of user stacks could not be read when sampled ({} inside execve, where the kernel has already replaced the old program's memory while the thread still holds its registers{rest}): they show only the sampled instruction, above {UNREADABLE}, and are not counted as truncated",
            o.tally.unreadable_in_exec
        )));
    }
    let broken: u64 = o.tally.broken_in.values().sum();
    if let Some(((module, why), _)) = worst(&o.tally.stopped) {
        if percent(broken, stats.user_stacks) >= 1.0 {
            hints.push(Hint::Said(format!(
                "{:.1}% of stacks broke off, most in {module}, where the walk stopped: {}; {}",
                percent(broken, stats.user_stacks),
                why.words(),
                advice(*why)
            )));
        }
    } else if percent(broken, stats.user_stacks) >= 1.0 {
        let mut worst: Vec<(&Arc<str>, &u64)> = o.tally.broken_in.iter().collect();
        worst.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        hints.push(Hint::Said(format!(
            "{:.1}% of stacks broke off, most in {}: it may lack unwind info, or run JIT code without a /tmp/perf-PID.map",
            percent(broken, stats.user_stacks),
            worst[0].0
        )));
    }
    let short = percent(o.tally.short_chains, stats.user_stacks);
    if short >= 10.0 {
        hints.push(Hint::ShortChains { share: short });
    }
}

/// The stopping place that most samples share.
fn worst<K: Ord>(counts: &std::collections::HashMap<K, u64>) -> Option<(&K, &u64)> {
    let mut worst: Vec<(&K, &u64)> = counts.iter().collect();
    worst.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    worst.first().copied()
}

/// What to do about a walk stopped for `why`.
fn advice(why: Stop) -> &'static str {
    match why {
        Stop::NoTable => "build it with unwind tables (debug info) or -C force-frame-pointers=yes",
        Stop::TableFull => "the unwind tables did not all fit",
        Stop::FrameLimit => "the stack is deeper than the frames a walk follows",
        Stop::UnreadableMemory | Stop::NoRule => {
            "its unwind tables do not cover that code (hand-written assembly, or code generated at run time)"
        }
        Stop::Unmapped => "code outside every mapped file: JIT code without a /tmp/perf-PID.map",
    }
}

/// What ran the stack copies out, measured, and how many stacks got their outer frames
/// from other samples of their thread.
fn room_hint(o: &Outcome<'_>, hints: &mut Vec<Hint>) {
    let room = o.room;
    let ran_out = room.truncated + room.read_on;
    let (Some(bytes), true) = (o.stack_bytes, ran_out > 0) else {
        return;
    };
    if percent(ran_out, o.tally.stats.user_stacks) < 1.0 {
        return;
    }
    let walks = room.truncated - room.leaf_larger;
    let per_copy = if walks > 0 {
        format!(
            "the others that ran out held {:.1} frames of the stack in the copy on average, the largest {} bytes",
            room.frames as f64 / walks as f64,
            room.largest_frame
        )
    } else {
        "no other".to_string()
    };
    let read_on = match room.read_on {
        0 => String::new(),
        n => format!("{n} were walked on over the live thread's stack, "),
    };
    hints.push(Hint::Said(format!(
        "the {bytes}-byte stack copy ran out in {} samples: {} of them in a single frame larger than the copy; {per_copy}; {read_on}{} got their outer frames from other samples of the same thread, {} stay [truncated]",
        ran_out,
        room.leaf_larger,
        room.recovered,
        o.tally.stats.truncated
    )));
}

/// Hints about samples that are missing.
fn sample_hints(o: &Outcome<'_>, hints: &mut Vec<Hint>) {
    if o.lost > 0 && !o.live {
        hints.push(Hint::Said(format!(
            "{} samples were lost while recording: record with a lower perf record -F or a larger -m",
            o.lost
        )));
    } else if o.lost > 0 {
        hints.push(Hint::RingFull { lost: o.lost });
    }
    if o.kernel_excluded {
        hints.push(Hint::Said(
            "kernel stacks were not sampled: kernel.perf_event_paranoid forbids it for this user; run as root, grant CAP_PERFMON, or set kernel.perf_event_paranoid=1".into(),
        ));
    }
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

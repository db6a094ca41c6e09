//! The short end-of-run report for stderr: how much was sampled and how whole the stacks are.

use crate::{
    printable, CountUnit, FrameKind, Profile, IN_USE_EVENT, MISSED_KERNEL_STACK, MISSED_USER_STACK,
};
use std::collections::HashSet;
use std::fmt::Write;

/// The end-of-run summary for stderr, a few short lines: samples, lost samples, duration, share
/// of user stacks that are whole (their outermost frame is an entry, or the unwind tables mark
/// the end there), share with unknown frames, truncated ones (and, when there are any, ones the
/// kernel could not copy, ones whose outer frames came from other samples and ones holding
/// functions no symbol names), then each of meta.hints on its own line.
///
/// A profile of time says seconds instead of samples (`2.401 s of off-cpu time in 3.0 s`), one
/// of memory bytes and allocations (`1048576 bytes in 512 allocations in 2.0 s`, or `... still
/// held at the end`).
///
/// ```text
/// 1500 samples in 3.0 s, 2 lost
/// user stacks: 1400, 95.0% complete, 3.0% with unknown frames, 2.0% truncated
/// hint: ...
/// ```
pub fn summary(profile: &Profile) -> String {
    let meta = &profile.meta;
    let samples = profile
        .samples
        .iter()
        .fold(0u64, |sum, s| sum.saturating_add(s.count));
    // The timer goes unsaid, as ever; any other event (a probe's hits) is named.
    // A terminal acts on control characters, and the event and hints may name what a saved file
    // or a profiled process chose (a module path): they are shown printable.
    let of = match meta.event.as_str() {
        "" | "cpu-clock" => String::new(),
        event => format!(" of {}", printable(event)),
    };
    let mut s = match meta.count_unit {
        CountUnit::Samples => format!("{samples} samples{of}"),
        CountUnit::Microseconds => match time_by_root(profile) {
            Some(parts) => format!("{:.3} s of time ({parts})", samples as f64 / 1e6),
            None => format!("{:.3} s{of} time", samples as f64 / 1e6),
        },
        CountUnit::Bytes => {
            let objects = profile
                .samples
                .iter()
                .fold(0u64, |sum, s| sum.saturating_add(s.objects));
            let held = match meta.event == IN_USE_EVENT {
                true => " still held at the end",
                false => "",
            };
            format!("{samples} bytes in {objects} allocations{held}")
        }
    };
    let _ = writeln!(
        s,
        " in {:.1} s, {} lost",
        meta.duration_secs, meta.lost_samples
    );
    let unwind = &meta.unwind;
    if unwind.user_stacks == 0 {
        s.push_str("user stacks: none\n");
    } else {
        let share = |n: u64| 100.0 * n as f64 / unwind.user_stacks as f64;
        // Time is not a number of stacks: its shares are of the time.
        let stacks = match meta.count_unit {
            CountUnit::Samples => unwind.user_stacks.to_string(),
            CountUnit::Microseconds => "by time".to_string(),
            CountUnit::Bytes => "by bytes".to_string(),
        };
        let _ = write!(
            s,
            "user stacks: {}, {:.1}% complete, {:.1}% with unknown frames, {:.1}% truncated",
            stacks,
            share(unwind.complete),
            share(unwind.with_unknown),
            share(unwind.truncated),
        );
        if unwind.unreadable > 0 {
            let _ = write!(s, ", {:.1}% unreadable", share(unwind.unreadable));
        }
        if unwind.with_unnamed > 0 {
            let _ = write!(
                s,
                ", {:.1}% with functions named by module+address",
                share(unwind.with_unnamed)
            );
        }
        if unwind.recovered > 0 {
            let _ = write!(
                s,
                ", {:.1}% deeper than the stack copy with their outer frames recovered",
                share(unwind.recovered)
            );
        }
        s.push('\n');
    }
    for hint in &meta.hints {
        let _ = writeln!(s, "hint: {}", printable(hint));
    }
    s
}

/// With several events as roots (`on-cpu, off-cpu`), the time under each: `on-cpu 0.612 s,
/// off-cpu 2.401 s`.
fn time_by_root(profile: &Profile) -> Option<String> {
    let events: Vec<&str> = profile.meta.event.split(", ").collect();
    if events.len() < 2 {
        return None;
    }
    let mut under = vec![0u64; events.len()];
    for sample in &profile.samples {
        let root = profile.stack_frames(sample.stack).next();
        let at = root
            .filter(|f| f.kind == FrameKind::Marker)
            .and_then(|f| events.iter().position(|e| *e == f.name));
        if let Some(i) = at {
            under[i] = under[i].saturating_add(sample.count);
        }
    }
    let parts: Vec<String> = events
        .iter()
        .zip(under)
        .map(|(e, us)| format!("{} {:.3} s", printable(e), us as f64 / 1e6))
        .collect();
    Some(parts.join(", "))
}

/// Stacks the kernel could not store, counted as bcc profile counts them for its warning: one
/// per missed side (user, kernel) of each entry printed, an entry being a process, comm and
/// stack as shown (stacks that differ only in what is not shown, such as source lines, print
/// as one entry).
pub fn missed_stacks(profile: &Profile) -> u64 {
    let mut entries: HashSet<(u32, &str, Vec<&str>)> = HashSet::new();
    let mut missed = 0;
    for sample in &profile.samples {
        let thread = profile.thread(sample.thread);
        let names: Vec<&str> = profile
            .stack_frames(sample.stack)
            .map(|f| f.name.as_str())
            .collect();
        let markers = profile
            .stack_frames(sample.stack)
            .filter(|f| {
                f.kind == FrameKind::Marker
                    && (f.name == MISSED_USER_STACK || f.name == MISSED_KERNEL_STACK)
            })
            .count() as u64;
        if markers > 0 && entries.insert((thread.pid, thread.comm.as_str(), names)) {
            missed += markers;
        }
    }
    missed
}

//! The short end-of-run report for stderr: how much was sampled and how whole the stacks are.

use crate::Profile;
use std::fmt::Write;

/// The end-of-run summary for stderr, a few short lines: samples, lost samples, duration, share
/// of user stacks that unwound completely, share with unknown frames, truncated ones (and, when
/// there are any, ones the kernel could not copy), then each of meta.hints on its own line.
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
    let mut s = format!(
        "{samples} samples in {:.1} s, {} lost\n",
        meta.duration_secs, meta.lost_samples
    );
    let unwind = &meta.unwind;
    if unwind.user_stacks == 0 {
        s.push_str("user stacks: none\n");
    } else {
        let share = |n: u64| 100.0 * n as f64 / unwind.user_stacks as f64;
        let _ = write!(
            s,
            "user stacks: {}, {:.1}% complete, {:.1}% with unknown frames, {:.1}% truncated",
            unwind.user_stacks,
            share(unwind.complete),
            share(unwind.with_unknown),
            share(unwind.truncated),
        );
        if unwind.unreadable > 0 {
            let _ = write!(s, ", {:.1}% unreadable", share(unwind.unreadable));
        }
        s.push('\n');
    }
    for hint in &meta.hints {
        let _ = writeln!(s, "hint: {hint}");
    }
    s
}

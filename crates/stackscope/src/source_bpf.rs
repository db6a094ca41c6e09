//! The eBPF source as the commands use it (`stackscope profile`, `record --backend bpf`): one
//! request in, the recording out, and bcc profile's warnings about what the kernel could not
//! keep.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::record::PerfLeadIn;
use anyhow::Result;
use stackscope_bpf::BpfConfig;
use stackscope_stacks::table::Live;
use stackscope_stacks::{Hint, Recording, SourceFigures, Storage};

/// Samples until the duration ends, the target exits or `stop` is set; `on_start` runs once
/// sampling runs. A launched command is sampled by `lead_in`, when given, until the program
/// takes over; with `live`, the counts are drained into it every refresh instead (a launched
/// command is then held until its tables are in).
pub(crate) fn sample(
    config: BpfConfig,
    stop: &Arc<AtomicBool>,
    on_start: impl FnOnce(),
    lead_in: Option<PerfLeadIn>,
    live: Option<Live>,
) -> Result<Recording> {
    // Refused rather than walk this host's stacks by another architecture's rules.
    if !cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
        anyhow::bail!(
            "the eBPF backend has unwind rules for x86-64 and aarch64 only so far: on this host \
             `stackscope record --backend perf` samples the timer (probes, --off-cpu, --wall, \
             --alloc and --in-use need the eBPF backend)"
        );
    }
    match (live, lead_in) {
        (Some(live), _) => Ok(stackscope_bpf::record_live(config, stop, on_start, live)?),
        (None, Some(lead_in)) => lead_in.sample(config, stop, on_start),
        (None, None) => Ok(stackscope_bpf::record(config, stop, on_start)?),
    }
}

/// bcc profile's warnings, in its words: its advice to raise --stack-storage-size when the
/// storage was full or stacks collided in it (bcc gives it for collisions alone), then why
/// stacks collided when they did, which a storage far from full makes a puzzle.
pub(crate) fn bcc_warnings(recording: &Recording) -> Vec<String> {
    let mut warnings = Vec::new();
    let storage = match &recording.figures {
        Some(SourceFigures::Bpf(figures)) => figures.storage,
        _ => Storage::default(),
    };
    let missed = storage.missed_stacks;
    if missed > 0 {
        let hint = if storage.stacks_full {
            " Consider increasing --stack-storage-size."
        } else {
            ""
        };
        warnings.push(format!(
            "WARNING: {missed} stack traces could not be displayed.{hint}"
        ));
        let collisions = recording
            .hints
            .iter()
            .filter(|h| matches!(h, Hint::StackCollisions { .. }));
        warnings.extend(collisions.map(|h| format!("hint: {}", crate::hint::sentence(h))));
    }
    if storage.counts_full {
        warnings
            .push("WARNING: hash table full. Consider increasing --hash-storage-size.".to_string());
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;
    use stackscope_stacks::BpfFigures;

    fn lost(stacks_full: bool, hints: Vec<Hint>) -> Recording {
        let storage = Storage {
            stacks_full,
            missed_stacks: 1,
            ..Storage::default()
        };
        Recording {
            figures: Some(SourceFigures::Bpf(BpfFigures {
                storage,
                ..BpfFigures::default()
            })),
            hints,
            ..Recording::default()
        }
    }

    #[test]
    fn bccs_storage_advice_comes_only_with_a_full_or_colliding_storage() {
        // A stack the kernel could not take is no matter of room.
        let unread = lost(
            false,
            vec![Hint::Said("1 stack traces could not be taken".into())],
        );
        assert_eq!(
            bcc_warnings(&unread),
            ["WARNING: 1 stack traces could not be displayed."]
        );
        let full = lost(
            true,
            vec![Hint::StackStorageFull {
                missed: 1,
                entries: 16,
            }],
        );
        assert_eq!(
            bcc_warnings(&full),
            ["WARNING: 1 stack traces could not be displayed. Consider increasing --stack-storage-size."]
        );
        // A collision in a storage far from full is said to be one.
        let collided = lost(
            true,
            vec![Hint::StackCollisions {
                missed: 1,
                stored: 150,
                buckets: 16384,
            }],
        );
        let warnings = bcc_warnings(&collided);
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].ends_with("Consider increasing --stack-storage-size."));
        assert!(
            warnings[1].contains("another stack held their hash bucket")
                && warnings[1].contains("150 stacks in 16384 buckets"),
            "{warnings:?}"
        );
    }
}

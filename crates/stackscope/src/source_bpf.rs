//! The eBPF source as the commands use it (`stackscope profile`, `record --backend bpf`): one
//! request in, the recording out, and bcc profile's warnings about what the kernel could not
//! keep.

use std::sync::atomic::AtomicBool;

use anyhow::Result;
use stackscope_bpf::{BpfConfig, BpfRecording};
use stackscope_profile::format::summary::missed_stacks;
use stackscope_stacks::{ProgramCost, Recording, Storage};

/// Samples until the duration ends, the target exits or `stop` is set; `on_start` runs once
/// sampling runs.
pub(crate) fn sample(
    config: BpfConfig,
    stop: &AtomicBool,
    on_start: impl FnOnce(),
) -> Result<Recording> {
    let recording = stackscope_bpf::record(config, stop, on_start)?;
    Ok(recording_of(recording))
}

fn recording_of(bpf: BpfRecording) -> Recording {
    Recording {
        profile: bpf.profile,
        exit_status: bpf.exit_status,
        interrupted: bpf.interrupted,
        failure: None,
        storage: Some(Storage {
            stacks_full: bpf.stack_collisions,
            counts_full: bpf.hash_full,
            dropped_samples: bpf.dropped_samples,
        }),
        program_cost: bpf.sampler_cost.map(|c| ProgramCost {
            runs: c.runs,
            run_time_ns: c.run_time_ns,
        }),
        rounds: None,
    }
}

/// bcc profile's warnings, in its words.
pub(crate) fn bcc_warnings(recording: &Recording) -> Vec<String> {
    let mut warnings = Vec::new();
    let storage = recording.storage.unwrap_or_default();
    let missed = missed_stacks(&recording.profile);
    if missed > 0 {
        let hint = if storage.stacks_full {
            " Consider increasing --stack-storage-size."
        } else {
            ""
        };
        warnings.push(format!(
            "WARNING: {missed} stack traces could not be displayed.{hint}"
        ));
    }
    if storage.counts_full {
        warnings
            .push("WARNING: hash table full. Consider increasing --hash-storage-size.".to_string());
    }
    warnings
}

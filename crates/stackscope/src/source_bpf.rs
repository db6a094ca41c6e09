//! The eBPF source as the commands use it (`stackscope profile`, `record --backend bpf`): one
//! request in, the recording out, and bcc profile's warnings about what the kernel could not
//! keep.

use std::sync::atomic::AtomicBool;

use anyhow::Result;
use stackscope_bpf::BpfConfig;
use stackscope_stacks::Recording;

/// Samples until the duration ends, the target exits or `stop` is set; `on_start` runs once
/// sampling runs.
pub(crate) fn sample(
    config: BpfConfig,
    stop: &AtomicBool,
    on_start: impl FnOnce(),
) -> Result<Recording> {
    Ok(stackscope_bpf::record(config, stop, on_start)?)
}

/// bcc profile's warnings, in its words.
pub(crate) fn bcc_warnings(recording: &Recording) -> Vec<String> {
    let mut warnings = Vec::new();
    let storage = recording.storage.unwrap_or_default();
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
    }
    if storage.counts_full {
        warnings
            .push("WARNING: hash table full. Consider increasing --hash-storage-size.".to_string());
    }
    warnings
}

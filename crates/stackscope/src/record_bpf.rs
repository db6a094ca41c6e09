//! The eBPF source as the commands use it (`stackscope profile`, `record --backend bpf`): one
//! request in, the profile and bcc profile's warnings about what the kernel could not keep out.

use std::collections::HashSet;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use stackscope_bpf::{BpfConfig, ProgramCost, DEFAULT_HASH_STORAGE, DEFAULT_STACK_STORAGE};
use stackscope_linux::sampler::SamplerConfig;
use stackscope_linux::target::Target;
use stackscope_profile::{FrameKind, Profile};

use crate::record::Outcome;

/// The markers bcc prints where a stack could not be stored.
pub(crate) const MISSED_USER: &str = "[Missed User Stack]";
pub(crate) const MISSED_KERNEL: &str = "[Missed Kernel Stack]";

/// What the eBPF source handed back.
pub(crate) struct Sampled {
    pub outcome: Outcome,
    /// Some stack was lost for lack of stack storage (bcc then suggests a larger
    /// `--stack-storage-size`).
    pub storage_full: bool,
    /// The count map filled up, so samples of new keys were dropped.
    pub hash_full: bool,
    /// What the sampling program cost in the kernel, when it was timed.
    pub sampler_cost: Option<ProgramCost>,
}

/// Samples until the duration ends, the target exits or `stop` is set; `on_start` runs once
/// sampling runs.
pub(crate) fn sample(
    config: BpfConfig,
    stop: &AtomicBool,
    on_start: impl FnOnce(),
) -> Result<Sampled> {
    let recording = stackscope_bpf::record(config, stop, on_start)?;
    Ok(Sampled {
        outcome: Outcome {
            profile: recording.profile,
            exit_status: recording.exit_status,
            failure: None,
        },
        storage_full: recording.stack_collisions,
        hash_full: recording.hash_full,
        sampler_cost: recording.sampler_cost,
    })
}

/// `stackscope record --backend bpf`: the eBPF source with record's target, rate and stack
/// choices and bcc's storage sizes; warnings go to stderr.
pub(crate) fn record(
    target: Target,
    config: &SamplerConfig,
    duration: Option<Duration>,
    stop: Arc<AtomicBool>,
    command: &[String],
    on_start: impl FnOnce(),
) -> Result<Outcome> {
    let config = BpfConfig {
        cpu: config.cpu,
        frequency: config.frequency,
        period: config.period,
        user: config.user,
        kernel: config.kernel,
        include_idle: config.include_idle,
        duration,
        command: command.to_vec(),
        measure_cost: true,
        ..BpfConfig::new(target)
    };
    let sampled = sample(config, &stop, on_start)?;
    if let Some(cost) = sampled.sampler_cost.filter(|c| c.runs > 0) {
        eprintln!("{}", describe_cost(&cost));
    }
    // record has no storage flags: say what was lost in its own words.
    let missed = missed_stacks(&sampled.outcome.profile);
    if missed > 0 {
        eprintln!(
            "stackscope: {missed} stacks could not be stored in the kernel's stack storage \
             ({DEFAULT_STACK_STORAGE} unique stacks) and show as [Missed User Stack] or \
             [Missed Kernel Stack]; `stackscope profile --stack-storage-size` can keep more"
        );
    }
    if sampled.hash_full {
        eprintln!(
            "stackscope: the kernel's count table filled up ({DEFAULT_HASH_STORAGE} entries), \
             so samples of new stacks were dropped; `stackscope profile --hash-storage-size` \
             can keep more"
        );
    }
    Ok(sampled.outcome)
}

/// The kernel's timing of the sampling program, in one line: what profiling cost the
/// profiled CPUs in the kernel (the rest of the cost is stackscope's own CPU time).
fn describe_cost(cost: &ProgramCost) -> String {
    format!(
        "in-kernel sampling: {} runs, {:.2} µs each, {:.1} ms of CPU in all",
        cost.runs,
        cost.run_time_ns as f64 / cost.runs as f64 / 1e3,
        cost.run_time_ns as f64 / 1e6
    )
}

/// Stacks that could not be displayed, counted as bcc counts them: one per missed side (user,
/// kernel) of each entry printed, an entry being a process, comm and stack as shown (stacks
/// that differ only in what is not shown, such as source lines, print as one entry).
pub(crate) fn missed_stacks(profile: &Profile) -> u64 {
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
                f.kind == FrameKind::Marker && (f.name == MISSED_USER || f.name == MISSED_KERNEL)
            })
            .count() as u64;
        if markers > 0 && entries.insert((thread.pid, thread.comm.as_str(), names)) {
            missed += markers;
        }
    }
    missed
}

/// bcc profile's warnings, in its words.
pub(crate) fn bcc_warnings(sampled: &Sampled) -> Vec<String> {
    let mut warnings = Vec::new();
    let missed = missed_stacks(&sampled.outcome.profile);
    if missed > 0 {
        let hint = if sampled.storage_full {
            " Consider increasing --stack-storage-size."
        } else {
            ""
        };
        warnings.push(format!(
            "WARNING: {missed} stack traces could not be displayed.{hint}"
        ));
    }
    if sampled.hash_full {
        warnings
            .push("WARNING: hash table full. Consider increasing --hash-storage-size.".to_string());
    }
    warnings
}

//! The ETW source as `stackscope record` uses it on Windows: record's target, rate, duration
//! and stack choices in, the recording out. What ETW cannot do (threads alone, one CPU, a
//! count of events) was refused before, with the Linux-only flags (`platform`).

use std::sync::atomic::AtomicBool;

use anyhow::{bail, Result};
use stackscope_stacks::{Recording, Target};
use stackscope_windows::{Options, What};

use crate::cli::{RecordArgs, RECORD_FREQUENCY};

/// Records `target` until the duration ends, the target exits or `stop` is set; `on_start`
/// runs once samples flow.
pub(crate) fn sample(
    args: &RecordArgs,
    target: Target,
    stop: &AtomicBool,
    on_start: impl FnOnce(),
) -> Result<Recording> {
    let options = options(args, target)?;
    Ok(stackscope_windows::record(options, stop, on_start)?)
}

/// What to sample and how, from record's flags (those ETW cannot honour already refused).
fn options(args: &RecordArgs, target: Target) -> Result<Options> {
    let frequency = args.rate.frequency.frequency.unwrap_or(RECORD_FREQUENCY);
    let frequency = match u32::try_from(frequency) {
        Ok(hz) if hz > 0 => hz,
        _ => bail!("-F {frequency} is not a rate the profile timer takes: give 1 to 10000000"),
    };
    let what = match target {
        Target::Command(command) => What::Launch(command),
        Target::Pids(pids) => What::Pids(pids),
        // -L is refused with the other flags ETW cannot honour, before the target is made.
        Target::Tids(_) => unreachable!("-L reached the ETW source"),
        Target::System => What::System {
            idle: args.stacks.include_idle,
        },
    };
    Ok(Options {
        what,
        frequency,
        duration: args.duration.duration,
        user: !args.stacks.kernel_stacks_only,
        kernel: !args.stacks.user_stacks_only,
    })
}

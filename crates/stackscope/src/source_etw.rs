//! The ETW source as `stackscope record` uses it on Windows: record's target, rate, duration
//! and stack choices in, the recording out. What ETW cannot do (threads alone, one CPU, a
//! count of events) is refused in one line.

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

/// What to sample and how, from record's flags.
fn options(args: &RecordArgs, target: Target) -> Result<Options> {
    if args.cpu.cpu.is_some() {
        bail!("-C/--cpu is not available on Windows: ETW samples every CPU");
    }
    if args.rate.count.is_some() {
        bail!("-c/--count is not available on Windows: the profile timer runs by time; give -F HZ");
    }
    let frequency = args.rate.frequency.frequency.unwrap_or(RECORD_FREQUENCY);
    let frequency = match u32::try_from(frequency) {
        Ok(hz) if hz > 0 => hz,
        _ => bail!("-F {frequency} is not a rate the profile timer takes: give 1 to 10000000"),
    };
    let what = match target {
        Target::Command(command) => What::Launch(command),
        Target::Pids(pids) => What::Pids(pids),
        Target::Tids(_) => {
            bail!("-L/--tid is not available on Windows: ETW samples processes; give -p PIDS")
        }
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

//! `stackscope record`: sample, then write the profile and a short summary.

use std::os::unix::process::ExitStatusExt;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::{bail, Result};
use stackscope_linux::record::{record, RecordOptions, MAX_STACK_COPY};
use stackscope_linux::sampler::{SamplerConfig, StackMode};
use stackscope_linux::target::Target;
use stackscope_profile::format;
use stackscope_profile::Profile;

use crate::cli::{BackendArg, RecordArgs, UnwindArg};
use crate::output::Output;

/// The frequency bcc profile and perf users expect from a CPU profiler: odd, so sampling does
/// not run in lockstep with timers.
const DEFAULT_FREQUENCY: u64 = 999;

pub fn run(args: RecordArgs) -> Result<i32> {
    run_with(args, |output, profile| output.write(profile))
}

/// Bytes of user stack copied per sample when `--stack-size` is not given.
const DEFAULT_STACK_SIZE: u32 = 32 * 1024;

/// `record` with another last step: `write` saves the profile where `output` says (checked
/// writable before sampling began). The drop-in shims use it to trim stacks before writing.
pub(crate) fn run_with(
    args: RecordArgs,
    write: impl FnOnce(&Output, &Profile) -> Result<()>,
) -> Result<i32> {
    let target = target(&args)?;
    if args.cpu.is_some() && !args.all_cpus {
        bail!("-C/--cpu selects a CPU of the whole-system profile: use it with -a");
    }
    if args.backend == BackendArg::Bpf {
        let given = [
            (args.unwind.is_some(), "--unwind"),
            (args.stack_size.is_some(), "--stack-size"),
        ];
        if let Some((_, flag)) = given.iter().find(|(set, _)| *set) {
            bail!(
                "{flag} is for --backend perf: --backend bpf unwinds user stacks in the kernel by the binaries' unwind tables and copies no stack"
            );
        }
    }
    let stack_size = args.stack_size.unwrap_or(DEFAULT_STACK_SIZE);
    if !stack_size.is_multiple_of(8) || stack_size == 0 || stack_size > MAX_STACK_COPY {
        bail!(
            "--stack-size {stack_size} is invalid: it must be a multiple of 8 between 8 and {MAX_STACK_COPY}"
        );
    }
    if args.frequency == Some(0) || args.count == Some(0) {
        bail!("-F and -c must be greater than zero");
    }
    let command: Vec<String> = args
        .command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let what = match &target {
        Target::Command(_) => command.join(" "),
        Target::Pids(p) => format!("pid {}", join(p)),
        Target::Tids(t) => format!("tid {}", join(t)),
        Target::System => match args.cpu {
            Some(cpu) => format!("the whole system, CPU {cpu}"),
            None => "the whole system".to_string(),
        },
    };
    let output = Output::from_args(&args.output, format!("stackscope: {what}"));
    output.check_writable()?;

    let period = args.count;
    let frequency = match period {
        Some(_) => None,
        None => Some(args.frequency.unwrap_or(DEFAULT_FREQUENCY)),
    };
    let config = SamplerConfig {
        cpu: args.cpu,
        frequency,
        period,
        user: !args.kernel_stacks_only,
        kernel: !args.user_stacks_only,
        stack_mode: match args.unwind.unwrap_or(UnwindArg::Dwarf) {
            UnwindArg::Dwarf if !args.kernel_stacks_only => StackMode::Dwarf {
                stack_bytes: stack_size,
            },
            _ => StackMode::FramePointer,
        },
        include_idle: args.include_idle,
        buffer_pages: 0,
    };

    let stop = stop_on_signals()?;

    let rate = match (frequency, period) {
        (Some(hz), _) => format!("{hz} Hz"),
        (None, Some(p)) => format!("every {p} ns of CPU time"),
        _ => unreachable!("either a frequency or a period is set"),
    };
    let until = match args.duration {
        Some(d) => format!("for {} s", d.as_secs_f64()),
        None => match target {
            Target::Command(_) => "until it exits (Ctrl-C stops early)",
            Target::Pids(_) | Target::Tids(_) => "until Ctrl-C or the target exits",
            Target::System => "until Ctrl-C",
        }
        .to_string(),
    };
    let announce = || eprintln!("stackscope: sampling {what} at {rate} {until}");
    let duration = args.duration;
    let outcome = match args.backend {
        BackendArg::Perf => {
            let recording = record(
                RecordOptions {
                    target,
                    sampler: config,
                    duration,
                    stop,
                    command: command.clone(),
                },
                announce,
            )
            .map_err(|e| crate::doctor::point_to(e.into()))?;
            Outcome {
                profile: recording.profile,
                exit_status: recording.exit_status,
                failure: recording.failure.map(|e| e.to_string()),
            }
        }
        BackendArg::Bpf => {
            crate::record_bpf::record(target, &config, duration, stop, &command, announce)
                .map_err(crate::doctor::point_to)?
        }
    };
    finish(outcome, &output, &command, write)
}

/// What a recording by either backend hands back.
pub(crate) struct Outcome {
    pub profile: Profile,
    /// The launched command's exit status, when it exited during the recording.
    pub exit_status: Option<std::process::ExitStatus>,
    /// Why sampling stopped early, if it failed mid-run.
    pub failure: Option<String>,
}

/// Ctrl-C (and SIGTERM) set the returned flag, which stops the recording; a second one ends
/// stackscope at once.
pub(crate) fn stop_on_signals() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [libc::SIGINT, libc::SIGTERM] {
        signal_hook::flag::register_conditional_shutdown(signal, 130, stop.clone())?;
        signal_hook::flag::register(signal, stop.clone())?;
    }
    Ok(stop)
}

/// Reports how the recording ended, prints the summary, writes the profile and returns
/// stackscope's exit code: the launched command's, else 0 (1 when nothing was sampled).
fn finish(
    outcome: Outcome,
    output: &Output,
    command: &[String],
    write: impl FnOnce(&Output, &Profile) -> Result<()>,
) -> Result<i32> {
    if let Some(e) = &outcome.failure {
        eprintln!("stackscope: sampling stopped early: {e}");
    }
    let profile = outcome.profile;
    let exit_code = outcome.exit_status.map(|status| match status.code() {
        Some(code) => code,
        None => 128 + status.signal().unwrap_or(0),
    });
    if let Some(status) = outcome.exit_status {
        if let Some(signal) = status.signal() {
            eprintln!(
                "stackscope: {} was killed by signal {signal}",
                command.first().map(String::as_str).unwrap_or("the command")
            );
        }
    }
    eprint!("{}", format::summary(&profile));
    if profile.samples.is_empty() {
        eprintln!(
            "stackscope: no samples were collected (the target ran for less than one sampling period, or slept the whole time); {} not written",
            output.path.display()
        );
        return Ok(exit_code.unwrap_or(1));
    }
    write(output, &profile)?;
    if !output.is_stdout() {
        eprintln!("stackscope: wrote {}", output.path.display());
    }
    Ok(exit_code.unwrap_or(0))
}

fn target(args: &RecordArgs) -> Result<Target> {
    let chosen = [
        !args.command.is_empty(),
        !args.pid.is_empty(),
        !args.tid.is_empty(),
        args.all_cpus,
    ]
    .iter()
    .filter(|&&b| b)
    .count();
    if chosen > 1 {
        bail!("give one target: a command after --, -p PIDS, -L TIDS, or -a");
    }
    Ok(if !args.command.is_empty() {
        Target::Command(args.command.clone())
    } else if !args.pid.is_empty() {
        Target::Pids(args.pid.clone())
    } else if !args.tid.is_empty() {
        Target::Tids(args.tid.clone())
    } else if args.all_cpus {
        Target::System
    } else {
        bail!("nothing to profile: give a command after --, -p PIDS, -L TIDS, or -a for the whole system (see stackscope record --help)")
    })
}

fn join(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

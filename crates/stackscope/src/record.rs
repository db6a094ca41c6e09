//! `stackscope record`: sample, then write the profile and a short summary.

use std::time::Duration;

use anyhow::{bail, Result};
#[cfg(target_os = "linux")]
use stackscope_bpf::{BpfConfig, EventSpec, MemoryProfile, Rate, TimeProfile, DEFAULT_MAX_FRAMES};
#[cfg(target_os = "linux")]
use stackscope_perf_event::record::{record_live, RecordOptions, MAX_STACK_COPY};
#[cfg(target_os = "linux")]
use stackscope_perf_event::sampler::{SamplerConfig, StackMode};
use stackscope_profile::Profile;
#[cfg(target_os = "linux")]
use stackscope_stacks::table::Live;
use stackscope_stacks::Target;

use crate::cli::RecordArgs;
#[cfg(target_os = "linux")]
use crate::cli::{BackendArg, UnwindArg, RECORD_FREQUENCY, STACK_SIZE};
use crate::output::{Fallback, Output};
use crate::status::stop_on_signals;
use crate::summary::{self, Ending};

#[cfg(target_os = "linux")]
mod counted;
#[cfg(target_os = "linux")]
mod lead_in;
#[cfg(target_os = "linux")]
use counted::{memory_profile, memory_words, time_profile};
#[cfg(target_os = "linux")]
pub(crate) use lead_in::PerfLeadIn;

pub fn run(args: RecordArgs) -> Result<i32> {
    run_with(args, |output, profile| output.write(profile))
}

/// `record` with another last step: `write` saves the profile where `output` says (checked
/// writable before sampling began). The drop-in shims use it to trim stacks before writing.
#[cfg(target_os = "linux")]
pub(crate) fn run_with(
    args: RecordArgs,
    write: impl FnOnce(&Output, &Profile) -> Result<()>,
) -> Result<i32> {
    let plan = Plan::new(&args, false)?;
    let output = Output::from_args(&args.output, Fallback::file(plan.title()))?;
    output.check_writable()?;

    let stop = stop_on_signals()?;
    crate::debuginfod::install(&args.debuginfod);
    let announcement = plan.announcement(args.duration.duration);
    let announce = || eprintln!("{announcement}");
    let mut ending = ending(&plan.command, plan.threads);
    if plan.memory.is_some() {
        ending.why_empty = " (no allocation through the probed allocator was counted)";
    }
    let recording = sample(&args, &plan, &stop, announce, None)?;
    eprintln!("{}", plan.choice.line());
    summary::finish(recording, &output, ending, write)
}

/// What the record flags ask for, checked before anything starts: the one start-up that
/// `record` and `top` share.
#[cfg(target_os = "linux")]
pub(crate) struct Plan {
    pub target: Target,
    /// Threads sampled on the CPU that --off-cpu and --wall could follow off it.
    pub threads: bool,
    time: Option<TimeProfile>,
    memory: Option<MemoryProfile>,
    /// The source sampled with, and why.
    pub choice: crate::backend::Choice,
    pub backend: BackendArg,
    pub config: SamplerConfig,
    pub command: Vec<String>,
    /// The target in the announcement's and title's words.
    pub what: String,
    probes: Option<String>,
}

#[cfg(target_os = "linux")]
impl Plan {
    /// The plan for `args`; `live` for a view that shows samples as they come (`top`).
    pub fn new(args: &RecordArgs, live: bool) -> Result<Plan> {
        let target = target(args)?;
        let threads = !matches!(target, Target::System);
        let time = time_profile(args)?;
        let memory = memory_profile(args)?;
        let choice = crate::backend::choose(args, &target, time.as_ref(), memory.as_ref(), live)?;
        let backend = choice.backend;
        let config = sampler_config(args, backend)?;
        let command = command_line(args);
        let what = describe(&target, &command, config.cpu);
        let probes = probe_names(args);
        Ok(Plan {
            target,
            threads,
            time,
            memory,
            choice,
            backend,
            config,
            command,
            what,
            probes,
        })
    }

    /// The flamegraph's title.
    pub fn title(&self) -> String {
        let what = &self.what;
        match (&self.probes, &self.time) {
            _ if self.memory.is_some() => {
                format!("stackscope: {what} ({})", memory_words(&self.memory))
            }
            (_, Some(TimeProfile::OffCpu { .. })) => {
                format!("stackscope: {what} (off-cpu time, µs)")
            }
            (_, Some(TimeProfile::Wall)) => {
                format!("stackscope: {what} (on-cpu and off-cpu time, µs)")
            }
            (Some(events), None) => format!("stackscope: {what} ({events})"),
            (None, None) => format!("stackscope: {what}"),
        }
    }

    /// Refuses a live view of what only shows at the end: the eBPF backend's probes, time
    /// and memory (its timer samples are drained every refresh).
    pub fn refuse_live(&self) -> Result<()> {
        let counted = match (&self.probes, &self.time, &self.memory) {
            (_, _, Some(_)) => "--alloc and --in-use count",
            (_, Some(_), _) => "--off-cpu and --wall count",
            (Some(_), _, _) => "--event counts",
            _ => return Ok(()),
        };
        bail!("top shows the timer's samples live, while {counted} in the kernel until sampling ends: use stackscope record with it");
    }

    /// What is sampled and until when, said once sampling runs.
    pub fn announcement(&self, duration: Option<Duration>) -> String {
        let (what, target, config) = (&self.what, &self.target, &self.config);
        match (&self.probes, &self.time) {
            _ if self.memory.is_some() => format!(
                "stackscope: counting, by stack, the {} in {what} {}",
                memory_words(&self.memory),
                until(target, duration)
            ),
            (_, Some(TimeProfile::OffCpu { min_block_ns })) => format!(
                "stackscope: counting the off-CPU time of {what}{} {}",
                match min_block_ns / 1000 {
                    0 => String::new(),
                    us => format!(" in blocks of {us} µs or more"),
                },
                until(target, duration)
            ),
            (_, Some(TimeProfile::Wall)) => format!(
                "stackscope: sampling {what} on-CPU at {} and counting its off-CPU time {}",
                rate(config),
                until(target, duration)
            ),
            (Some(events), None) => format!(
                "stackscope: counting stacks of {what} at {events} {}",
                until(target, duration)
            ),
            (None, None) => format!(
                "stackscope: sampling {what} at {} {}",
                rate(config),
                until(target, duration)
            ),
        }
    }
}

/// Samples as `plan` says until the duration ends, the target exits or `stop` is set, feeding
/// `live` as it goes when given.
#[cfg(target_os = "linux")]
pub(crate) fn sample(
    args: &RecordArgs,
    plan: &Plan,
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
    announce: impl FnOnce(),
    live: Option<Live>,
) -> Result<stackscope_stacks::Recording> {
    let duration = args.duration.duration;
    Ok(match plan.backend {
        BackendArg::Perf => {
            let options = RecordOptions {
                target: plan.target.clone(),
                sampler: plan.config.clone(),
                duration,
                stop: stop.clone(),
                command: plan.command.clone(),
                read_stack_on: args.read_stack_on,
                hand_over: None,
                leave_unnamed: false,
            };
            record_live(options, live, announce).map_err(|e| crate::doctor::point_to(e.into()))?
        }
        BackendArg::Bpf => {
            if live.is_some() {
                plan.refuse_live()?;
            }
            let max_frames = args.max_stack.max_stack.unwrap_or(DEFAULT_MAX_FRAMES);
            let config = BpfConfig {
                max_frames,
                events: args.events.clone(),
                time: plan.time,
                memory: plan.memory,
                alloc_fns: args.memory.alloc_fns.clone(),
                sample_bytes: args.memory.sample_bytes,
                ..bpf_config(plan.target.clone(), &plan.config, duration, &plan.command)
            };
            // The perf source samples a launched command until the program takes over (a
            // live view's command is held instead, so that one source feeds the view).
            let lead_in = PerfLeadIn::new(plan.config.clone(), stop.clone());
            let lead_in = live.is_none().then_some(lead_in);
            crate::source_bpf::sample(config, stop, announce, lead_in, live)
                .map_err(crate::doctor::point_to)?
        }
    })
}

/// `record` where neither perf_event nor eBPF exists: the same target, output and ending,
/// with this system's source in the middle.
#[cfg(not(target_os = "linux"))]
pub(crate) fn run_with(
    args: RecordArgs,
    write: impl FnOnce(&Output, &Profile) -> Result<()>,
) -> Result<i32> {
    crate::platform::refuse_unavailable(&args)?;
    let target = target(&args)?;
    let command = command_line(&args);
    let what = describe(&target, &command, None);
    let output = Output::from_args(&args.output, Fallback::file(format!("stackscope: {what}")))?;
    output.check_writable()?;

    let stop = stop_on_signals()?;
    crate::debuginfod::install(&args.debuginfod);
    let announcement = format!(
        "stackscope: sampling {what} {}",
        until(&target, args.duration.duration)
    );
    let announce = || eprintln!("{announcement}");
    let recording = sample(&args, target, &stop, announce)?;
    // No time profile to point to here.
    summary::finish(recording, &output, ending(&command, false), write)
}

/// The sampling source of a system without perf_event and eBPF: ETW on Windows.
#[cfg(windows)]
fn sample(
    args: &RecordArgs,
    target: Target,
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
    on_start: impl FnOnce(),
) -> Result<stackscope_stacks::Recording> {
    crate::source_etw::sample(args, target, stop, on_start)
}

/// No sampling source is built for a system that is neither Linux nor Windows.
#[cfg(not(any(target_os = "linux", windows)))]
fn sample(
    _: &RecordArgs,
    _: Target,
    _: &std::sync::Arc<std::sync::atomic::AtomicBool>,
    _: impl FnOnce(),
) -> Result<stackscope_stacks::Recording> {
    bail!("no sampling source is built for this system: stackscope samples with perf_event or eBPF on Linux, ETW on Windows")
}

/// The launched command's words, for the announcement and the summary.
fn command_line(args: &RecordArgs) -> Vec<String> {
    args.command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

/// How `record`'s summary speaks of the launched command and of an empty profile, and whether
/// it points a target mostly off the CPU to `--off-cpu` (`threads`: not the whole system).
pub(crate) fn ending(command: &[String], threads: bool) -> Ending<'_> {
    Ending {
        command,
        why_empty: " (the target ran for less than one sampling period, or slept the whole time)",
        off_cpu_hint: threads,
    }
}

#[cfg(target_os = "linux")]
/// `record --backend bpf`: the eBPF source with record's target, rate and stack choices, bcc
/// profile's storage sizes, and the program's cost measured.
fn bpf_config(
    target: Target,
    config: &SamplerConfig,
    duration: Option<Duration>,
    command: &[String],
) -> BpfConfig {
    let rate = match (config.frequency, config.period) {
        (Some(hz), _) => Rate::Frequency(hz),
        (None, Some(ns)) => Rate::Period(ns),
        _ => unreachable!("either a frequency or a period is set"),
    };
    BpfConfig {
        cpu: config.cpu,
        user: config.user,
        kernel: config.kernel,
        include_idle: config.include_idle,
        duration,
        command: command.to_vec(),
        measure_cost: true,
        ..BpfConfig::new(target, rate)
    }
}

/// The probes counted, as written, when there are any.
#[cfg(target_os = "linux")]
fn probe_names(args: &RecordArgs) -> Option<String> {
    let names: Vec<String> = args.events.iter().map(|e| e.to_string()).collect();
    args.events
        .iter()
        .any(|e| !e.is_timer())
        .then(|| names.join(", "))
}

/// The timer's rate from `profile:hz:N`, refused beside -F or -c or a second timer.
#[cfg(target_os = "linux")]
fn timer_event(args: &RecordArgs) -> Result<Option<u64>> {
    let mut timers = args.events.iter().filter_map(|e| match e {
        EventSpec::Timer { hz } => Some(*hz),
        _ => None,
    });
    let hz = timers.next();
    if timers.next().is_some() {
        bail!("give one profile:hz:N event: the timer runs at one rate");
    }
    if hz.is_some() && (args.rate.frequency.frequency.is_some() || args.rate.count.is_some()) {
        bail!("profile:hz:N sets the rate: give it or -F/-c, not both");
    }
    Ok(hz)
}

#[cfg(target_os = "linux")]
/// What to sample and how, from the flags, refusing combinations that cannot be honoured.
fn sampler_config(args: &RecordArgs, backend: BackendArg) -> Result<SamplerConfig> {
    let cpu =
        match args.cpu.cpu {
            Some(_) if !args.all_cpus => {
                bail!("-C/--cpu selects a CPU of the whole-system profile: use it with -a")
            }
            Some(cpu) => Some(u32::try_from(cpu).map_err(|_| {
                anyhow::anyhow!("-C/--cpu {cpu} is not a CPU number: give 0 or more")
            })?),
            None => None,
        };
    if backend == BackendArg::Perf && args.max_stack.max_stack.is_some() {
        bail!("--max-stack is for --backend bpf: --backend perf keeps what --stack-size copies, up to 1024 frames");
    }
    if backend == BackendArg::Bpf {
        let given = [
            (args.unwind.is_some(), "--unwind"),
            (args.stack_size.is_some(), "--stack-size"),
            (args.read_stack_on, "--read-stack-on"),
        ];
        if let Some((_, flag)) = given.iter().find(|(set, _)| *set) {
            bail!(
                "{flag} is for --backend perf: --backend bpf unwinds user stacks in the kernel by the binaries' unwind tables and copies no stack"
            );
        }
    }
    let stack_size = args.stack_size.unwrap_or(STACK_SIZE);
    if !stack_size.is_multiple_of(8) || stack_size == 0 || stack_size > MAX_STACK_COPY {
        bail!(
            "--stack-size {stack_size} is invalid: it must be a multiple of 8 between 8 and {MAX_STACK_COPY}"
        );
    }
    let rate = &args.rate;
    let timer_hz = timer_event(args)?;
    if rate.frequency.frequency == Some(0) || rate.count == Some(0) {
        bail!("-F and -c must be greater than zero");
    }
    let stacks = &args.stacks;
    Ok(SamplerConfig {
        cpu,
        frequency: match rate.count {
            Some(_) => None,
            None => Some(
                timer_hz
                    .or(rate.frequency.frequency)
                    .unwrap_or(RECORD_FREQUENCY),
            ),
        },
        period: rate.count,
        user: !stacks.kernel_stacks_only,
        kernel: !stacks.user_stacks_only,
        stack_mode: match args.unwind.unwrap_or(UnwindArg::Dwarf) {
            UnwindArg::Dwarf if !stacks.kernel_stacks_only => StackMode::Dwarf {
                stack_bytes: stack_size,
            },
            _ => StackMode::FramePointer,
        },
        include_idle: stacks.include_idle,
        buffer_pages: 0,
    })
}

/// The target in the words of the announcement and the flamegraph's title.
fn describe(target: &Target, command: &[String], cpu: Option<u32>) -> String {
    match target {
        Target::Command(_) => command.join(" "),
        Target::Pids(p) => format!("pid {}", join(p)),
        Target::Tids(t) => format!("tid {}", join(t)),
        Target::System => match cpu {
            Some(cpu) => format!("the whole system, CPU {cpu}"),
            None => "the whole system".to_string(),
        },
    }
}

#[cfg(target_os = "linux")]
fn rate(config: &SamplerConfig) -> String {
    match (config.frequency, config.period) {
        (Some(hz), _) => format!("{hz} Hz"),
        (None, Some(p)) => format!("every {p} ns of CPU time"),
        _ => unreachable!("either a frequency or a period is set"),
    }
}

fn until(target: &Target, duration: Option<Duration>) -> String {
    match duration {
        Some(d) => format!("for {} s", d.as_secs_f64()),
        None => match target {
            Target::Command(_) => "until it exits (Ctrl-C stops early)",
            Target::Pids(_) | Target::Tids(_) => "until Ctrl-C or the target exits",
            Target::System => "until Ctrl-C",
        }
        .to_string(),
    }
}

fn target(args: &RecordArgs) -> Result<Target> {
    let (pid, tid) = (&args.target.pid, &args.target.tid);
    let chosen = [
        !args.command.is_empty(),
        !pid.is_empty(),
        !tid.is_empty(),
        args.all_cpus,
    ]
    .iter()
    .filter(|&&b| b)
    .count();
    if chosen > 1 {
        bail!("give one target: a command, -p PIDS, -L TIDS, or -a");
    }
    Ok(if !args.command.is_empty() {
        Target::Command(args.command.clone())
    } else if !pid.is_empty() {
        Target::Pids(pid.clone())
    } else if !tid.is_empty() {
        Target::Tids(tid.clone())
    } else if args.all_cpus {
        Target::System
    } else {
        bail!("nothing to profile: give a command (`stackscope record ./prog ARGS`), -p PIDS, -L TIDS, or -a for the whole system (see stackscope record --help)")
    })
}

fn join(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

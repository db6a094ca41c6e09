//! `stackscope profile`: bcc `profile`'s command line, banner, output and warnings, on the eBPF
//! source, which counts stacks in the kernel and unwinds user stacks there from each binary's
//! unwind tables, so stacks come out whole where bcc's break.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use stackscope_bpf::{BpfConfig, Rate, DEFAULT_MAX_FRAMES};
use stackscope_process::target::Target;
use stackscope_profile::format::Format;
use stackscope_stacks::Recording;

use crate::cli::{ProfileArgs, PROFILE_FREQUENCY};
use crate::output::{Fallback, Output};
use crate::status::stop_on_signals;

pub fn run(args: ProfileArgs) -> Result<i32> {
    let target = target(&args)?;
    let output = Output::from_args(
        &args.output,
        Fallback {
            format: Format::Bcc,
            path: |_| PathBuf::from("-"),
            title: "stackscope profile".to_string(),
            preferred: args.folded.then_some(Format::Folded),
        },
    )?;
    output.check_writable()?;

    // bcc: `-F 0` and `-c 0` count as not given.
    let (frequency, period) = match (args.rate.frequency.frequency, args.rate.count) {
        (Some(hz), _) if hz > 0 => (Some(hz), None),
        (_, Some(count)) if count > 0 => (None, Some(count)),
        _ => (Some(PROFILE_FREQUENCY), None),
    };
    let banner = (!args.folded).then(|| banner(&args, frequency, period));
    let stop = stop_on_signals()?;
    crate::debuginfod::install(&args.debuginfod);
    let rate = match period {
        Some(ns) => Rate::Period(ns),
        None => Rate::Frequency(frequency.unwrap_or(PROFILE_FREQUENCY)),
    };
    let config = BpfConfig {
        cpu: args.cpu.cpu.and_then(|cpu| u32::try_from(cpu).ok()),
        user: !args.stacks.kernel_stacks_only,
        kernel: !args.stacks.user_stacks_only,
        include_idle: args.stacks.include_idle,
        stack_storage_size: args.stack_storage_size,
        hash_storage_size: args.hash_storage_size,
        max_frames: args.max_stack.max_stack.unwrap_or(DEFAULT_MAX_FRAMES),
        duration: args.duration.map(std::time::Duration::from_secs),
        ..BpfConfig::new(target, rate)
    };
    let mut recording = crate::source_bpf::sample(
        config,
        &stop,
        || {
            if let Some(banner) = &banner {
                let mut stdout = std::io::stdout().lock();
                let _ = writeln!(stdout, "{banner}");
                let _ = stdout.flush();
            }
        },
        None,
        None,
    )
    .map_err(crate::doctor::point_to)?;
    if !args.folded {
        println!();
    }
    crate::hint::word_hints(&mut recording);
    finish(&recording, &output)?;
    Ok(0)
}

/// Which threads to sample, refusing a CPU or an id that does not exist.
fn target(args: &ProfileArgs) -> Result<Target> {
    let (pid, tid) = (&args.target.pid, &args.target.tid);
    if let Some(cpu) = args.cpu.cpu.filter(|&cpu| cpu < -1) {
        bail!("-C/--cpu {cpu} is not a CPU number: give 0 or more, or -1 for all CPUs");
    }
    for &id in pid.iter().chain(tid) {
        if !Path::new(&format!("/proc/{id}")).exists() {
            let what = if pid.is_empty() { "thread" } else { "process" };
            bail!("no {what} with id {id} (nothing in /proc/{id}); check the id with ps");
        }
    }
    Ok(if !pid.is_empty() {
        Target::Pids(pid.clone())
    } else if !tid.is_empty() {
        Target::Tids(tid.clone())
    } else {
        Target::System
    })
}

/// bcc profile's ending: the profile when anything was sampled, then its warnings.
fn finish(recording: &Recording, output: &Output) -> Result<()> {
    crate::summary::say_failure(recording);
    crate::summary::say_naming();
    let profile = &recording.profile;
    if !profile.samples.is_empty() {
        output.write(profile)?;
    } else if !output.is_stdout() {
        eprintln!(
            "stackscope: no samples were collected; {} not written",
            output.path.display()
        );
    }
    for warning in crate::source_bpf::bcc_warnings(recording) {
        eprintln!("{warning}");
    }
    Ok(())
}

/// bcc's banner, e.g. `Sampling at 49 Hertz of PID [1234] by user + kernel stack for 5 secs.`
/// (bcc shows the id lists as Python lists).
fn banner(args: &ProfileArgs, frequency: Option<u64>, period: Option<u64>) -> String {
    let rate = match (frequency, period) {
        (Some(hz), _) => format!("{hz} Hertz"),
        (None, Some(count)) => format!("every {count} events"),
        (None, None) => unreachable!("a frequency or a period is always chosen"),
    };
    let list = |ids: &[u32]| {
        let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
        format!("[{}]", ids.join(", "))
    };
    let (pid, tid) = (&args.target.pid, &args.target.tid);
    let threads = if !pid.is_empty() {
        format!("PID {}", list(pid))
    } else if !tid.is_empty() {
        format!("TID {}", list(tid))
    } else {
        "all threads".to_string()
    };
    let stacks = if args.stacks.user_stacks_only {
        "user"
    } else if args.stacks.kernel_stacks_only {
        "kernel"
    } else {
        "user + kernel"
    };
    let mut text = format!("Sampling at {rate} of {threads} by {stacks} stack");
    if let Some(cpu) = args.cpu.cpu.filter(|&cpu| cpu >= 0) {
        text.push_str(&format!(" on CPU#{cpu}"));
    }
    match args.duration {
        Some(secs) => text.push_str(&format!(" for {secs} secs.")),
        None => text.push_str("... Hit Ctrl-C to end."),
    }
    text
}

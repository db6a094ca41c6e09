//! `stackscope profile`: bcc `profile`'s command line, banner, output and warnings, on the eBPF
//! source, which counts stacks in the kernel and unwinds user stacks there from each binary's
//! unwind tables, so stacks come out whole where bcc's break.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use clap::Args;
use stackscope_bpf::{BpfConfig, DEFAULT_FREQUENCY, DEFAULT_HASH_STORAGE, DEFAULT_STACK_STORAGE};
use stackscope_linux::target::Target;
use stackscope_profile::format::{Format, WriteOptions};

use crate::output::Output;
use crate::record::stop_on_signals;
use crate::record_bpf;

/// bcc profile's flags, with its short and long names, defaults and help texts; `-o` and
/// `--format` are stackscope's.
#[derive(Args)]
#[command(after_help = "examples:\n    \
    stackscope profile             # profile stack traces at 49 Hertz until Ctrl-C\n    \
    stackscope profile -F 99       # profile stack traces at 99 Hertz\n    \
    stackscope profile -c 1000000  # profile stack traces every 1 in a million events\n    \
    stackscope profile 5           # profile at 49 Hertz for 5 seconds only\n    \
    stackscope profile -f 5        # output in folded format for flame graphs\n    \
    stackscope profile -p 185      # only profile process with PID 185\n    \
    stackscope profile -L 185      # only profile thread with TID 185\n    \
    stackscope profile -U          # only show user space stacks (no kernel)\n    \
    stackscope profile -K          # only show kernel space stacks (no user)\n    \
    stackscope profile -adf -p 185 5 -o out.svg   # a flamegraph instead of text\n\n\
    Unlike bcc, user stacks are unwound with the binaries' DWARF unwind tables inside the \
    kernel, so programs built without frame pointers still show whole stacks, and no stack \
    memory is copied out of the kernel. Needs root, or CAP_BPF and CAP_PERFMON.")]
pub struct ProfileArgs {
    /// profile process with one or more comma separated PIDs only
    #[arg(
        short = 'p',
        long = "pid",
        value_name = "PID",
        value_delimiter = ',',
        conflicts_with = "tid"
    )]
    pub pid: Vec<u32>,

    /// profile thread with one or more comma separated TIDs only
    #[arg(short = 'L', long = "tid", value_name = "TID", value_delimiter = ',')]
    pub tid: Vec<u32>,

    /// show stacks from user space only (no kernel space stacks)
    #[arg(short = 'U', long, conflicts_with = "kernel_stacks_only")]
    pub user_stacks_only: bool,

    /// show stacks from kernel space only (no user space stacks)
    #[arg(short = 'K', long)]
    pub kernel_stacks_only: bool,

    /// sample frequency, Hertz [default: 49]
    #[arg(short = 'F', long, value_name = "FREQUENCY", conflicts_with = "count")]
    pub frequency: Option<u64>,

    /// sample period, number of events (nanoseconds of CPU time)
    #[arg(short = 'c', long, value_name = "COUNT")]
    pub count: Option<u64>,

    /// insert delimiter between kernel/user stacks
    #[arg(short = 'd', long)]
    pub delimited: bool,

    /// add _[k] annotations to kernel frames
    #[arg(short = 'a', long)]
    pub annotations: bool,

    /// include CPU idle stacks
    #[arg(short = 'I', long)]
    pub include_idle: bool,

    /// output folded format, one line per stack (for flame graphs)
    #[arg(short = 'f', long)]
    pub folded: bool,

    /// the number of hash keys that can be stored
    #[arg(long, value_name = "HASH_STORAGE_SIZE", default_value_t = DEFAULT_HASH_STORAGE,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub hash_storage_size: u32,

    /// the number of unique stack traces that can be stored and displayed
    #[arg(long, value_name = "STACK_STORAGE_SIZE", default_value_t = DEFAULT_STACK_STORAGE,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub stack_storage_size: u32,

    /// cpu number to run profile on (-1: all)
    #[arg(short = 'C', long, value_name = "CPU", default_value_t = -1, allow_negative_numbers = true)]
    pub cpu: i32,

    /// duration of trace, in seconds [default: until Ctrl-C]
    #[arg(value_name = "duration", value_parser = clap::value_parser!(u64).range(1..))]
    pub duration: Option<u64>,

    /// Write the profile to FILE instead of standard output.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Output format [default: folded with -f, else from the -o extension, else bcc text].
    #[arg(long, value_name = "FORMAT", value_parser = crate::cli::format_name())]
    pub format: Option<Format>,
}

pub fn run(args: ProfileArgs) -> Result<i32> {
    if args.cpu < -1 {
        bail!(
            "-C/--cpu {} is not a CPU number: give 0 or more, or -1 for all CPUs",
            args.cpu
        );
    }
    for &id in args.pid.iter().chain(&args.tid) {
        if !Path::new(&format!("/proc/{id}")).exists() {
            let what = if args.pid.is_empty() {
                "thread"
            } else {
                "process"
            };
            bail!("no {what} with id {id} (nothing in /proc/{id}); check the id with ps");
        }
    }
    let target = if !args.pid.is_empty() {
        Target::Pids(args.pid.clone())
    } else if !args.tid.is_empty() {
        Target::Tids(args.tid.clone())
    } else {
        Target::System
    };
    let output = Output {
        path: args.output.clone().unwrap_or_else(|| PathBuf::from("-")),
        format: output_format(&args),
        options: WriteOptions {
            delimiter: args.delimited,
            annotate_kernel: args.annotations,
            title: Some("stackscope profile".to_string()),
        },
    };
    output.check_writable()?;

    // bcc: `-F 0` and `-c 0` count as not given.
    let (frequency, period) = match (args.frequency, args.count) {
        (Some(hz), _) if hz > 0 => (Some(hz), None),
        (_, Some(count)) if count > 0 => (None, Some(count)),
        _ => (Some(DEFAULT_FREQUENCY), None),
    };
    let banner = (!args.folded).then(|| banner(&args, frequency, period));
    let stop = stop_on_signals()?;
    let config = BpfConfig {
        cpu: u32::try_from(args.cpu).ok(),
        frequency,
        period,
        user: !args.kernel_stacks_only,
        kernel: !args.user_stacks_only,
        include_idle: args.include_idle,
        stack_storage_size: args.stack_storage_size,
        hash_storage_size: args.hash_storage_size,
        duration: args.duration.map(std::time::Duration::from_secs),
        ..BpfConfig::new(target)
    };
    let sampled = record_bpf::sample(config, &stop, || {
        if let Some(banner) = &banner {
            let mut stdout = std::io::stdout().lock();
            let _ = writeln!(stdout, "{banner}");
            let _ = stdout.flush();
        }
    })
    .map_err(crate::doctor::point_to)?;
    if !args.folded {
        println!();
    }
    if let Some(e) = &sampled.outcome.failure {
        eprintln!("stackscope: sampling stopped early: {e}");
    }
    let profile = &sampled.outcome.profile;
    if !profile.samples.is_empty() {
        output.write(profile)?;
    } else if !output.is_stdout() {
        eprintln!(
            "stackscope: no samples were collected; {} not written",
            output.path.display()
        );
    }
    for warning in record_bpf::bcc_warnings(&sampled) {
        eprintln!("{warning}");
    }
    Ok(0)
}

/// `--format`, else `-f`'s folded, else the `-o` file's extension, else bcc text.
fn output_format(args: &ProfileArgs) -> Format {
    if let Some(format) = args.format {
        return format;
    }
    if args.folded {
        return Format::Folded;
    }
    args.output
        .as_deref()
        .and_then(Format::from_path)
        .unwrap_or(Format::Bcc)
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
    let threads = if !args.pid.is_empty() {
        format!("PID {}", list(&args.pid))
    } else if !args.tid.is_empty() {
        format!("TID {}", list(&args.tid))
    } else {
        "all threads".to_string()
    };
    let stacks = if args.user_stacks_only {
        "user"
    } else if args.kernel_stacks_only {
        "kernel"
    } else {
        "user + kernel"
    };
    let mut text = format!("Sampling at {rate} of {threads} by {stacks} stack");
    if args.cpu >= 0 {
        text.push_str(&format!(" on CPU#{}", args.cpu));
    }
    match args.duration {
        Some(secs) => text.push_str(&format!(" for {secs} secs.")),
        None => text.push_str("... Hit Ctrl-C to end."),
    }
    text
}

//! `stackscope profile`'s command line: bcc profile's, with its short and long names, its
//! positional duration and its defaults, mapped onto the shared flag definitions.

use clap::Args;
use stackscope_bpf::{DEFAULT_HASH_STORAGE, DEFAULT_STACK_STORAGE};

use super::flags::{
    CpuArg, DebuginfodArg, MaxStackArg, OutputArgs, RateArgs, StacksArgs, TargetArgs,
    PROFILE_FREQUENCY,
};

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
// bcc's names and help texts over the shared definitions.
#[command(
    mut_arg("pid", |a| a.value_name("PID")
        .help("profile process with one or more comma separated PIDs only")),
    mut_arg("tid", |a| a.value_name("TID")
        .help("profile thread with one or more comma separated TIDs only")),
    mut_arg("user_stacks_only", |a| a.help("show stacks from user space only (no kernel space stacks)")),
    mut_arg("kernel_stacks_only", |a| a.help("show stacks from kernel space only (no user space stacks)")),
    mut_arg("include_idle", |a| a.help("include CPU idle stacks")),
    mut_arg("frequency", |a| a.value_name("FREQUENCY")
        .help(format!("sample frequency, Hertz [default: {PROFILE_FREQUENCY}]"))),
    mut_arg("count", |a| a.help("sample period, number of events (nanoseconds of CPU time)")),
    mut_arg("cpu", |a| a.help("cpu number to run profile on (-1: all) [default: -1]")),
    mut_arg("delimited", |a| a.short('d').help("insert delimiter between kernel/user stacks")),
    mut_arg("annotate_kernel", |a| a.short('a').long("annotations")
        .visible_alias("annotate-kernel").help("add _[k] annotations to kernel frames")),
    mut_arg("output", |a| a.help("Write the profile to FILE instead of standard output").long_help(None)),
    mut_arg("format", |a| a.help(
        "Output format [default: folded with -f, else from the -o extension, else bcc text]"
    )),
)]
pub struct ProfileArgs {
    #[command(flatten)]
    pub target: TargetArgs,

    #[command(flatten)]
    pub stacks: StacksArgs,

    #[command(flatten)]
    pub rate: RateArgs,

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

    #[command(flatten)]
    pub max_stack: MaxStackArg,

    #[command(flatten)]
    pub cpu: CpuArg,

    /// duration of trace, in seconds [default: until Ctrl-C]
    #[arg(value_name = "duration", value_parser = clap::value_parser!(u64).range(1..))]
    pub duration: Option<u64>,

    #[command(flatten)]
    pub output: OutputArgs,

    #[command(flatten)]
    pub debuginfod: DebuginfodArg,
}

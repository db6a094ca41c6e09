//! Every flag, defined once; `--help` is generated from these definitions. Flags that several
//! commands take are groups in [`flags`] flattened into each (`-p`/`-L`, `-F`/`-c`,
//! `-U`/`-K`/`-I`, `-C`, `-d`, `-o`/`--format` and the stack spelling); a command changes only
//! what it must (its default in the help text, bcc's short names and help texts), never the
//! definition. The commands' own defaults live in [`flags`] too, each defined once.

mod diff;
mod flags;
mod gdb;
mod memory;
#[cfg(target_os = "linux")]
mod profile;
#[cfg(target_os = "linux")]
mod top;

pub use diff::DiffArgs;
pub use flags::*;
pub use gdb::GdbArgs;
pub use memory::MemoryArgs;
#[cfg(target_os = "linux")]
pub use profile::ProfileArgs;
#[cfg(target_os = "linux")]
pub use top::{TopArgs, TOP_REFRESH, TOP_WINDOW};

use std::ffi::OsString;
use std::path::PathBuf;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Args, Parser, Subcommand, ValueEnum};

/// The first examples of `stackscope -h`, which `--help` continues.
const EXAMPLES: &str = "Examples:\n  \
    stackscope record ./myprog arg1             # launch it, into flame.svg\n  \
    stackscope record -p 1234 -d 5 -o out.json  # a running process, for 5 s\n  \
    stackscope record -a -F 99 -d 10            # the whole system at 99 Hz, 10 s\n  \
    stackscope report out.json --top 20         # its 20 hottest functions\n  \
    cargo stackscope --bin myprog               # build with debug info, profile";

/// The first examples of `stackscope record -h`, which `--help` continues.
const RECORD_EXAMPLES: &str = "Examples:\n  \
    stackscope record ./myprog arg1                    # launch it, into flame.svg\n  \
    stackscope record -p 1234,5678 -d 10 -o out.json   # processes, for 10 s\n  \
    stackscope record -a -C 1 -o cpu1.svg              # system, CPU 1, to Ctrl-C\n  \
    stackscope record -F 99 -o out.folded ./myprog -v  # -v is myprog's own\n  \
    stackscope record -L 4321 -d 5 -o out.pb.gz        # a thread, as pprof";

#[derive(Parser)]
#[command(
    name = "stackscope",
    version,
    about = "A sampling CPU profiler: whole call stacks of any process, as flamegraphs and the files other tools read",
    long_about = "A sampling CPU profiler: whole call stacks of any process, as flamegraphs and the files other tools read.\n\n\
        stackscope samples call stacks with perf_event_open on the cpu-clock event (or with an \
        eBPF program that counts and unwinds stacks in the kernel), unwinds user stacks with \
        DWARF unwind info (so binaries without frame pointers, like Rust release builds, still \
        give whole stacks), names every frame (inlined functions included), and writes a \
        flamegraph SVG, folded stacks, bcc profile text, its own JSON, pprof, speedscope, Firefox \
        Profiler, OSDK JSON, perf script or DTrace text. It also samples guest kernels in QEMU \
        (and programs under gdbserver) over the GDB remote protocol, and reads perf.data.",
    after_help = format!("{EXAMPLES}\n\nEach command's flags: stackscope COMMAND -h (or --help, all of them)"),
    after_long_help = format!("{EXAMPLES}\n  \
        stackscope profile -adf -p 1234 5 > out.folded   # bcc profile, eBPF\n  \
        stackscope gdb --remote localhost:1234 --kernel vmlinux -o guest.svg\n  \
        stackscope report perf.data -o flame.svg          # perf record's file\n  \
        stackscope diff before.json after.json -o diff.svg"),
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Sample the call stacks of a command, processes or the whole system.
    ///
    /// A command (with its arguments), processes (-p), threads (-L) or the whole system (-a).
    #[command(
        after_help = format!("{RECORD_EXAMPLES}\n\n\
            Every flag (events, off-CPU and wall-clock time, memory, unwinding, permissions): \
            stackscope record --help"),
        after_long_help = format!("{RECORD_EXAMPLES}\n  \
            stackscope record -o flame.svg -- ./myprog --flag  # `--` is optional\n  \
            stackscope record -e uprobe:libc:malloc ./myprog   # stacks that allocate\n  \
            stackscope record -e tracepoint:syscalls:sys_enter_write -e kprobe:vfs_read ./myprog\n  \
            stackscope record --off-cpu --min-block 1000 ./myprog  # where it waits\n  \
            stackscope record --wall -p 1234 -d 10             # on- and off-CPU time\n  \
            stackscope record --alloc -o alloc.svg ./myprog    # bytes allocated, by stack\n  \
            stackscope record --in-use --min-age 10 -p 1234 -d 60  # held and older than 10 s\n\n\
            Recording stops when the duration ends, when the target exits, or at Ctrl-C; in every \
            case the profile collected so far is written. With a launched command, stackscope \
            exits with the command's exit code.\n\n\
            Without root: profiling your own processes needs kernel.perf_event_paranoid <= 2 \
            (kernel stacks need <= 1); -a needs <= 0, or CAP_PERFMON (setcap cap_perfmon+ep). \
            `stackscope doctor` checks all of it.\n\n\
            Names: a stripped binary's functions are named from its MiniDebugInfo \
            (.gnu_debugdata) and from separate debug files found by build-id and by \
            .gnu_debuglink under /usr/lib/debug, or the directories listed (colon-separated) in \
            STACKSCOPE_DEBUG_FILE_DIRECTORY. Code no symbol names shows as MODULE+0xADDRESS, the \
            start of its function in the module (as objdump and addr2line number it)."),
    )]
    Record(RecordArgs),
    /// The hottest functions and their stacks, live in the terminal (Linux-only).
    ///
    /// The same targets, rates and outputs as `record`: the whole system without one. Keys:
    /// s sort by self/total, / filter, Enter expand a row into its callers and callees, k
    /// kernel frames, g group by process/thread/none, c window/cumulative, p or space pause,
    /// w write the profile so far (-o, else flame.svg), q or Ctrl-C quit.
    #[cfg(target_os = "linux")]
    #[command(after_help = "Examples:\n  \
        stackscope top                                   # the whole system\n  \
        stackscope top -p 4242                           # one process and its threads\n  \
        stackscope top -- ./target/release/myprog args   # launch and watch\n  \
        stackscope top -b 3 -p 4242 > snapshots.txt      # 3 plain-text snapshots\n  \
        stackscope top -o out.json -p 4242               # and write the profile at the end\n\n\
        Counts are of the last --window seconds (5), or everything since the start (c, \
        --cumulative). Nothing is written unless -o is given (at the end) or w is pressed. \
        The perf backend samples unless --backend bpf (or --max-stack) is given: the eBPF \
        program's timer counts are then drained every refresh. What it counts other than the \
        timer (--event, --off-cpu, --wall, --alloc, --in-use) shows only at the end and is \
        refused here.")]
    Top(TopArgs),
    /// The hottest functions live in the terminal: Linux-only.
    #[cfg(not(target_os = "linux"))]
    Top(LinuxOnlyArgs),
    /// Re-render a saved profile, or list its hottest functions.
    ///
    /// It reads stackscope JSON, folded stacks, OSDK JSON, or a perf.data file written by
    /// `perf record`.
    #[command(after_help = "Examples:\n  \
        stackscope report profile.json -o flame.svg\n  \
        stackscope report profile.json --top 10         # the 10 hottest functions, as perf report\n  \
        stackscope report perf.data -o flame.svg        # perf record's file, -g or --call-graph dwarf\n  \
        stackscope report profile.json -o prof.pb.gz    # pprof; also .speedscope.json, .firefox.json\n  \
        stackscope report profile.json -o out.folded --delimited --annotate-kernel\n\n\
        A perf.data file is named as `record` names its frames (see `stackscope record --help`: \
        debug files, STACKSCOPE_DEBUG_FILE_DIRECTORY, MODULE+0xADDRESS).")]
    Report(ReportArgs),
    /// bcc `profile`: its command line and output, whole user stacks (eBPF).
    #[cfg(target_os = "linux")]
    Profile(ProfileArgs),
    /// bcc `profile` with whole user stacks: Linux-only (eBPF).
    #[cfg(not(target_os = "linux"))]
    Profile(LinuxOnlyArgs),
    /// Sample a guest kernel (QEMU) or a program under gdbserver.
    ///
    /// Over the GDB remote protocol: QEMU's `-gdb`, gdbserver, or any stub that speaks it.
    Gdb(GdbArgs),
    /// A differential flamegraph of two profiles.
    ///
    /// Drawn from AFTER's stacks, red where they grew and blue where they shrank: a stack of
    /// BEFORE that AFTER lacks has no width there, so what vanished does not show (the line
    /// printed at the end counts it). --negate draws from BEFORE's stacks instead, where it
    /// shows in blue.
    Diff(DiffArgs),
    /// Check what recording needs on this machine (Linux-only).
    ///
    /// Given a program, also what it offers for unwinding; each check says ok, warn or fail and
    /// its fix.
    #[command(after_help = "Examples:\n  \
        stackscope doctor\n  \
        stackscope doctor -- ./target/release/myprog\n\n\
        Exits 1 when something recording needs fails (sampling cannot start, or the program \
        cannot be profiled by this user), else 0; warnings name what works only in part.")]
    Doctor(DoctorArgs),
}

/// Parses `args` (the program name first) as `P`, or exits with clap's error. An unknown short
/// flag that differs from one of the command's only by case (`-f` for `-F`) gets a tip naming
/// that one, as clap gives one for a mistyped long flag, instead of clap's tip to pass it as a
/// value after `--`.
pub fn parse<P: Parser>(args: Vec<OsString>) -> P {
    P::try_parse_from(&args).unwrap_or_else(|e| with_case_tip(e, &P::command(), &args).exit())
}

fn with_case_tip(
    mut error: clap::Error,
    command: &clap::Command,
    args: &[OsString],
) -> clap::Error {
    if error.kind() != ErrorKind::UnknownArgument {
        return error;
    }
    let Some(ContextValue::String(invalid)) = error.get(ContextKind::InvalidArg) else {
        return error;
    };
    let mut chars = invalid.chars();
    let (Some('-'), Some(short), None) = (chars.next(), chars.next(), chars.next()) else {
        return error;
    };
    let other = match short {
        c if c.is_ascii_lowercase() => c.to_ascii_uppercase(),
        c => c.to_ascii_lowercase(),
    };
    // Flags follow the subcommand they belong to: the first argument names it, when it does.
    let target = args
        .get(1)
        .and_then(|name| command.find_subcommand(name))
        .unwrap_or(command);
    if other == short || !target.get_arguments().any(|a| a.get_short() == Some(other)) {
        return error;
    }
    error.insert(
        ContextKind::SuggestedArg,
        ContextValue::String(format!("-{other}")),
    );
    error.insert(ContextKind::Suggested, ContextValue::StyledStrs(Vec::new()));
    error
}

/// A Linux-only command's arguments on other systems: taken whole, so that the command is
/// refused by name, not by its first flag.
#[cfg(not(target_os = "linux"))]
#[derive(Args)]
pub struct LinuxOnlyArgs {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    pub args: Vec<OsString>,
}

#[derive(Args)]
pub struct DoctorArgs {
    /// A program to check, after `--` (looked up in PATH): its debug info, unwind tables,
    /// frame pointers, and whether its exec would end profiling (setuid, setgid, file
    /// capabilities).
    #[arg(last = true, value_name = "PROGRAM")]
    pub program: Vec<OsString>,
}

#[derive(Args)]
#[command(mut_arg("frequency", |a| a.help(format!("Samples per second per CPU [default: {RECORD_FREQUENCY}]"))))]
// `-h` is one screen: the target, the rate, the duration and the output. `--help` has them all.
#[command(
    mut_arg("count", |a| a.hide_short_help(true)),
    mut_arg("user_stacks_only", |a| a.hide_short_help(true)),
    mut_arg("kernel_stacks_only", |a| a.hide_short_help(true)),
    mut_arg("include_idle", |a| a.hide_short_help(true)),
    mut_arg("max_stack", |a| a.hide_short_help(true)),
    mut_arg("delimited", |a| a.hide_short_help(true)),
    mut_arg("annotate_kernel", |a| a.hide_short_help(true)),
    mut_arg("title", |a| a.hide_short_help(true)),
    mut_arg("no_debuginfod", |a| a.hide_short_help(true)),
)]
pub struct RecordArgs {
    #[command(flatten)]
    pub target: TargetArgs,

    /// Profile the whole system (every process on every CPU).
    #[arg(short, long, conflicts_with_all = ["pid", "tid"])]
    pub all_cpus: bool,

    #[command(flatten)]
    pub cpu: CpuArg,

    #[command(flatten)]
    pub rate: RateArgs,

    #[command(flatten)]
    pub duration: DurationArg,

    #[command(flatten)]
    pub stacks: StacksArgs,

    /// What to count stacks at (repeatable), spelled as bpftrace spells probes:
    /// `profile:hz:N` (the timer, the default; same as -F N), `uprobe:FILE:FUNC`,
    /// `uretprobe:FILE:FUNC` (the caller's stack), `kprobe:FUNC`, `kretprobe:FUNC`,
    /// `tracepoint:CATEGORY:NAME`, `usdt:FILE:PROVIDER:NAME`. FILE is a path, a library as the
    /// dynamic loader finds it (`libc`), or a program in PATH. Every hit counts its stack once.
    /// Any event but the timer runs on the eBPF backend (root, or CAP_BPF+CAP_PERFMON, as for
    /// `stackscope profile`); uprobes go into the target's processes only (with -a, into
    /// every process mapping FILE), so processes it forks later are not probed. With several
    /// events each stack's root frame names its event.
    #[arg(short = 'e', long = "event", value_name = "SPEC", value_parser = parse_event, hide_short_help = true)]
    pub events: Vec<EventArg>,

    /// Count off-CPU time instead of samples: the stack (kernel and user) where a thread left
    /// the CPU (blocked, slept, waited for a lock or I/O, or was preempted), weighted by how
    /// long it stayed off, in microseconds, from the scheduler's switch tracepoint. Time a
    /// thread was stopped (SIGSTOP, a debugger) is not counted; a thread still off the CPU when
    /// recording ends is counted up to the end, one already off when it starts only from its
    /// next switch. eBPF backend (root, or CAP_BPF+CAP_PERFMON). Not with -F/-c or --event.
    #[arg(long, hide_short_help = true)]
    pub off_cpu: bool,

    /// With --off-cpu: leave out blocks shorter than USECS microseconds (as bcc offcputime's
    /// --min-block-time). Default: every block.
    #[arg(long, value_name = "USECS", hide_short_help = true)]
    pub min_block: Option<u64>,

    /// Wall-clock time: on-CPU time (timer samples at -F/-c, each weighing its period) and
    /// off-CPU time (as --off-cpu, every block) in one profile, in microseconds, each stack
    /// rooted in an `on-cpu` or `off-cpu` frame (pprof: an `event` label). A thread's two
    /// add up to the time it lived in the recording. eBPF backend. Not with --event.
    #[arg(long, hide_short_help = true)]
    pub wall: bool,

    #[command(flatten)]
    pub memory: MemoryArgs,

    /// How to sample: `perf` opens perf events and unwinds copied user stacks in stackscope;
    /// `bpf` counts stacks in the kernel with an eBPF program that unwinds user stacks there
    /// from the binaries' unwind tables, so no stack memory leaves the kernel (needs root or
    /// CAP_BPF+CAP_PERFMON); it ends by saying how much CPU the program took in the kernel.
    /// Default: bpf where it can run (whole stacks however deep, where perf's copies break
    /// off), perf where it cannot (the summary's first line says which and why), perf with -a
    /// or a perf-only flag (--unwind, --stack-size, --read-stack-on), bpf with --max-stack, a
    /// probe, --off-cpu or --wall. `top` takes perf unless told: live, it costs less.
    #[arg(long, value_enum, hide_short_help = true)]
    pub backend: Option<BackendArg>,

    /// How the perf backend unwinds user stacks: `dwarf` (the default) copies stack memory
    /// and unwinds with the binaries' unwind tables (whole stacks without frame pointers);
    /// `fp` follows frame pointers in the kernel (cheaper; breaks on code built without
    /// them). Not for `--backend bpf`, which unwinds by the unwind tables in the kernel.
    #[arg(long, value_enum, hide_short_help = true)]
    pub unwind: Option<UnwindArg>,

    /// Bytes of user stack the perf backend copies per sample for `--unwind dwarf` (multiple
    /// of 8, at most 65528; default 32768). A deeper stack takes its outer frames from
    /// another sample of its thread that passed the same frame (or, with --read-stack-on,
    /// from the live thread); where none did, it is cut short and marked `[truncated]`. Not
    /// for `--backend bpf`, which copies no stack.
    #[arg(long, value_name = "BYTES", hide_short_help = true)]
    pub stack_size: Option<u32>,

    /// When a user stack is deeper than its copy, read the rest from the live thread's memory
    /// (process_vm_readv) as the sample is unwound, provided the end of the copy still
    /// matches it (the thread has not returned past it since). Without it, such a stack takes
    /// its outer frames from other samples of its thread that passed the same frame. Reads
    /// the profiled program's memory: for --backend perf only.
    #[arg(long, hide_short_help = true)]
    pub read_stack_on: bool,

    #[command(flatten)]
    pub max_stack: MaxStackArg,

    #[command(flatten)]
    pub output: OutputArgs,

    #[command(flatten)]
    pub debuginfod: DebuginfodArg,

    /// The command to launch and profile, with its arguments.
    ///
    /// `--` before it is optional: every word from the command on is the command's own, flags
    /// included, as for samply, `time` or `env`.
    #[arg(value_name = "COMMAND", trailing_var_arg = true)]
    pub command: Vec<OsString>,
}

/// An `--event` as the eBPF source takes it.
#[cfg(target_os = "linux")]
pub type EventArg = stackscope_bpf::EventSpec;
/// An `--event` where there is no eBPF: its words, refused before sampling.
#[cfg(not(target_os = "linux"))]
pub type EventArg = String;

fn parse_event(s: &str) -> Result<EventArg, String> {
    s.parse::<EventArg>().map_err(|e| e.to_string())
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    Perf,
    Bpf,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum UnwindArg {
    Dwarf,
    Fp,
}

#[derive(Args)]
pub struct ReportArgs {
    /// The saved profile: stackscope JSON, folded stacks, OSDK JSON or perf.data (detected from
    /// the content).
    pub input: PathBuf,

    // `--top` alone is Some(None): the table's own number of rows.
    #[arg(long, value_name = "N", conflicts_with = "format",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..),
          help = format!(
              "Print the N hottest functions (default {}) with their self and total shares, as \
               `perf report`'s first screen does, to standard output (or -o FILE): `--format \
               top` with N rows. Self counts the samples taken in the function itself, total \
               those with it anywhere on the stack",
              stackscope_profile::format::top::DEFAULT_ROWS
          ))]
    pub top: Option<Option<usize>>,

    #[command(flatten)]
    pub output: OutputArgs,

    #[command(flatten)]
    pub debuginfod: DebuginfodArg,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn definitions_are_consistent() {
        Cli::command().debug_assert();
    }

    fn error_of(args: &[&str]) -> String {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        match Cli::try_parse_from(&args) {
            Ok(_) => panic!("{args:?} parsed"),
            Err(e) => with_case_tip(e, &Cli::command(), &args).to_string(),
        }
    }

    #[test]
    fn a_short_flag_in_the_wrong_case_is_pointed_to_the_right_one() {
        let error = error_of(&["stackscope", "record", "-f", "99", "true"]);
        assert!(error.contains("similar argument exists: '-F'"), "{error}");
        assert!(!error.contains("'-- -f'"), "{error}");
        let error = error_of(&["stackscope", "record", "-D", "5", "true"]);
        assert!(error.contains("'-d'"), "{error}");
        // bcc's -f is profile's own; -l is not, -L is.
        let error = error_of(&["stackscope", "profile", "-l", "7"]);
        assert!(error.contains("'-L'"), "{error}");
        // No flag of either case: clap's own message.
        let error = error_of(&["stackscope", "record", "-y", "true"]);
        assert!(!error.contains("similar argument"), "{error}");
    }
}

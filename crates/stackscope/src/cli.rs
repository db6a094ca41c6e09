//! Every flag, defined once; `--help` is generated from these definitions. Flags that several
//! commands take are groups flattened into each (`-p`/`-L`, `-F`/`-c`, `-U`/`-K`/`-I`, `-C`,
//! `-d`, `-o`/`--format` and the stack spelling); a command changes only what it must (its
//! default in the help text, bcc's short names), never the definition. The commands' own
//! defaults are here too, each defined once.

mod diff;
mod gdb;
mod profile;

pub use diff::DiffArgs;
pub use gdb::GdbArgs;
pub use profile::ProfileArgs;

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand, ValueEnum};
use stackscope_profile::format::Format;

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
    after_help = "Examples:\n  \
        stackscope record -o flame.svg -- ./target/release/myprog arg1\n  \
        stackscope record -p 1234 -d 10 -o out.folded\n  \
        stackscope record -a -C 1 -o cpu1.svg          # whole system, one CPU, until Ctrl-C\n  \
        stackscope profile -adf -p 1234 5 > out.folded  # bcc profile, whole stacks (eBPF)\n  \
        stackscope gdb --remote localhost:1234 --kernel vmlinux -o guest.svg\n  \
        stackscope report perf.data -o flame.svg\n  \
        stackscope diff before.json after.json -o diff.svg"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Sample call stacks of a command, processes, threads or the whole system.
    #[command(after_help = "Examples:\n  \
        stackscope record -o flame.svg -- ./target/release/myprog arg1 arg2\n  \
        stackscope record -F 999 -o out.folded -- ./prog\n  \
        stackscope record -p 1234,5678 -d 10 -o out.svg\n  \
        stackscope record -L 4321 -o thread.txt --format bcc\n  \
        stackscope record -a -C 1 -o cpu1.svg\n\n\
        Recording stops when the duration ends, when the target exits, or at Ctrl-C; in every \
        case the profile collected so far is written. With a launched command, stackscope \
        exits with the command's exit code.\n\n\
        Without root: profiling your own processes needs kernel.perf_event_paranoid <= 2 \
        (kernel stacks need <= 1); -a needs <= 0, or CAP_PERFMON (setcap cap_perfmon+ep). \
        `stackscope doctor` checks all of it.")]
    Record(RecordArgs),
    /// Re-render a saved profile (stackscope JSON, folded stacks, OSDK JSON, or a perf.data file
    /// written by `perf record`) into another format.
    #[command(after_help = "Examples:\n  \
        stackscope report profile.json -o flame.svg\n  \
        stackscope report perf.data -o flame.svg        # perf record's file, -g or --call-graph dwarf\n  \
        stackscope report profile.json -o prof.pb.gz    # pprof; also .speedscope.json, .firefox.json\n  \
        stackscope report profile.json -o out.folded --delimited --annotate-kernel")]
    Report(ReportArgs),
    /// bcc `profile`: its command line and output, with whole user stacks (eBPF).
    Profile(ProfileArgs),
    /// Sample a guest kernel (QEMU) or a program under gdbserver over the GDB remote protocol.
    Gdb(GdbArgs),
    /// A differential flamegraph of two profiles.
    Diff(DiffArgs),
    /// Check what recording needs on this machine (and, given one, what a program offers for
    /// unwinding); each check says ok, warn or fail and its fix.
    #[command(after_help = "Examples:\n  \
        stackscope doctor\n  \
        stackscope doctor -- ./target/release/myprog\n\n\
        Exits 1 when something recording needs fails (sampling cannot start, or the program \
        cannot be profiled by this user), else 0; warnings name what works only in part.")]
    Doctor(DoctorArgs),
}

#[derive(Args)]
pub struct DoctorArgs {
    /// A program to check, after `--` (looked up in PATH): its debug info, unwind tables,
    /// frame pointers, and whether its exec would end profiling (setuid, setgid, file
    /// capabilities).
    #[arg(last = true, value_name = "PROGRAM")]
    pub program: Vec<OsString>,
}

/// `-p` and `-L`: which processes or threads to sample (`record`, `profile`).
#[derive(Args)]
pub struct TargetArgs {
    /// Profile these processes (comma-separated pids), with all their threads and children.
    #[arg(
        short,
        long,
        value_name = "PIDS",
        value_delimiter = ',',
        conflicts_with = "tid"
    )]
    pub pid: Vec<u32>,

    /// Profile only these threads (comma-separated tids).
    #[arg(short = 'L', long, value_name = "TIDS", value_delimiter = ',')]
    pub tid: Vec<u32>,
}

/// `-F`: how often to sample (`record`, `profile`, `gdb`); each command says its default.
#[derive(Args)]
pub struct FrequencyArg {
    /// Samples per second per CPU.
    #[arg(short = 'F', long, value_name = "HZ")]
    pub frequency: Option<u64>,
}

/// `-F` or `-c`: sample at a frequency or every so much CPU time (`record`, `profile`).
#[derive(Args)]
pub struct RateArgs {
    #[command(flatten)]
    pub frequency: FrequencyArg,

    /// Sample every COUNT nanoseconds of CPU time instead of at a frequency.
    #[arg(short = 'c', long, value_name = "COUNT", conflicts_with = "frequency")]
    pub count: Option<u64>,
}

/// `-U`, `-K` and `-I`: which stacks to keep (`record`, `profile`).
#[derive(Args)]
pub struct StacksArgs {
    /// Keep only user-space stacks.
    #[arg(short = 'U', long, conflicts_with = "kernel_stacks_only")]
    pub user_stacks_only: bool,

    /// Keep only kernel stacks.
    #[arg(short = 'K', long)]
    pub kernel_stacks_only: bool,

    /// Keep samples of the idle task (pid 0), dropped by default.
    #[arg(short = 'I', long)]
    pub include_idle: bool,
}

/// `-C`: one CPU to sample (`record` with `-a`, `profile`).
#[derive(Args)]
pub struct CpuArg {
    /// With -a: only this CPU.
    #[arg(short = 'C', long, value_name = "CPU", allow_negative_numbers = true)]
    pub cpu: Option<i64>,
}

/// `-d`: how long to sample, in seconds (`record`, `gdb`).
#[derive(Args)]
pub struct DurationArg {
    /// Stop after this many seconds (fractions allowed, at most a year).
    #[arg(short, long, value_name = "SECS", value_parser = positive_seconds)]
    pub duration: Option<Duration>,
}

/// `-o` and `--format`, and how stacks are spelled (every command that writes a profile).
#[derive(Args)]
pub struct OutputArgs {
    /// Where to write the profile; `-` for standard output. Default: flame.svg, or
    /// stackscope.<ext> for the chosen --format. Checked writable before sampling. A regular
    /// file is replaced whole (through a temporary renamed into place); a device, FIFO or
    /// /dev/stdout is written in place; a symbolic link is kept and the file it names
    /// replaced.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Output format. Default: from the --output extension, else svg.
    #[arg(long, value_name = "FORMAT", value_parser = format_name(Format::NAMES))]
    pub format: Option<Format>,

    #[command(flatten)]
    pub style: StyleArgs,
}

/// How stacks are drawn or written, in every command that writes a flamegraph or folded stacks.
#[derive(Args)]
pub struct StyleArgs {
    /// Put a delimiter between user and kernel frames (`-` in folded, `--` in bcc text), as
    /// bcc profile's -d does.
    #[arg(long)]
    pub delimited: bool,

    /// Append `_[k]` to kernel frame names in folded output, as bcc profile's -a does.
    #[arg(long)]
    pub annotate_kernel: bool,

    /// Title of the flamegraph.
    #[arg(long, value_name = "TEXT")]
    pub title: Option<String>,
}

#[derive(Args)]
#[command(mut_arg("frequency", |a| a.help(format!("Samples per second per CPU [default: {RECORD_FREQUENCY}]"))))]
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

    /// How to sample: `perf` opens perf events and unwinds copied user stacks in stackscope;
    /// `bpf` counts stacks in the kernel with an eBPF program that unwinds user stacks there
    /// from the binaries' unwind tables, so no stack memory leaves the kernel (needs root or
    /// CAP_BPF+CAP_PERFMON); it ends by saying how much CPU the program took in the kernel.
    #[arg(long, value_enum, default_value = "perf")]
    pub backend: BackendArg,

    /// How the perf backend unwinds user stacks: `dwarf` (the default) copies stack memory
    /// and unwinds with the binaries' unwind tables (whole stacks without frame pointers);
    /// `fp` follows frame pointers in the kernel (cheaper; breaks on code built without
    /// them). Not for `--backend bpf`, which unwinds by the unwind tables in the kernel.
    #[arg(long, value_enum)]
    pub unwind: Option<UnwindArg>,

    /// Bytes of user stack the perf backend copies per sample for `--unwind dwarf` (multiple
    /// of 8, at most 65528; default 32768). Deeper stacks are cut short and marked
    /// `[truncated]`. Not for `--backend bpf`, which copies no stack.
    #[arg(long, value_name = "BYTES")]
    pub stack_size: Option<u32>,

    #[command(flatten)]
    pub output: OutputArgs,

    /// The command to launch and profile, after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
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

    #[command(flatten)]
    pub output: OutputArgs,
}

/// The `--format` values a command writes, named as [`Format::NAMES`] names them, so every
/// format is named in one place and `--help` shows them all.
pub(crate) fn format_name(names: &'static [&'static str]) -> impl TypedValueParser<Value = Format> {
    PossibleValuesParser::new(names)
        .try_map(|s: String| Format::from_name(&s).ok_or_else(|| format!("unknown format {s}")))
}

/// `record`'s samples per second: odd, so sampling does not run in lockstep with timers.
pub const RECORD_FREQUENCY: u64 = 999;
/// `profile`'s samples per second: bcc profile's.
pub const PROFILE_FREQUENCY: u64 = stackscope_bpf::DEFAULT_FREQUENCY;
/// `gdb`'s rounds per second: each round stops the guest, so fewer than `record` takes.
pub const GDB_FREQUENCY: u64 = 100;
/// Bytes of user stack `record` copies per sample when `--stack-size` is not given.
pub const STACK_SIZE: u32 = 32 * 1024;

/// The most seconds any flag takes: a year. More is a slip of the finger, and far more no
/// longer fits a clock.
pub const MAX_SECONDS: f64 = 365.0 * 24.0 * 3600.0;

/// Parses a number of seconds that must be more than zero (`-d`, `--timeout`).
pub fn positive_seconds(s: &str) -> Result<Duration, String> {
    seconds_within(s, false)
}

/// Parses a number of seconds where zero has a meaning (`--interval 0`: back to back).
pub fn seconds(s: &str) -> Result<Duration, String> {
    seconds_within(s, true)
}

/// Every flag that takes seconds goes through here: a finite number, not negative, zero only
/// where `zero` allows it, at most [`MAX_SECONDS`].
fn seconds_within(s: &str, zero: bool) -> Result<Duration, String> {
    let secs: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !secs.is_finite() {
        return Err(format!("`{s}` is not a finite number of seconds"));
    }
    if secs < 0.0 {
        return Err(format!("{s} s is negative"));
    }
    if secs > MAX_SECONDS {
        return Err(format!(
            "{s} s is more than a year ({MAX_SECONDS} s), the most accepted"
        ));
    }
    let duration = Duration::try_from_secs_f64(secs).map_err(|e| format!("{s} s: {e}"))?;
    if duration.is_zero() && !zero {
        return Err(format!("{s} s: must be more than zero"));
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn definitions_are_consistent() {
        Cli::command().debug_assert();
    }
}

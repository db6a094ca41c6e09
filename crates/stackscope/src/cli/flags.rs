//! The flags several commands share, each defined once as a group a command flattens into
//! its own, the parsers they share, and each command's defaults.

use std::path::PathBuf;
use std::time::Duration;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::Args;
use stackscope_profile::format::Format;

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
    /// Stop after SECS seconds (such as 0.5; at most a year).
    #[arg(short, long, value_name = "SECS", value_parser = positive_seconds)]
    pub duration: Option<Duration>,
}

/// `--max-stack`: how deep the eBPF backend walks user stacks (`record --backend bpf`,
/// `profile`).
#[derive(Args)]
pub struct MaxStackArg {
    /// Frames the eBPF backend keeps per user stack, 1 to 1024 (default 512); a deeper stack
    /// ends in `[truncated]`. A deep stack costs kernel CPU per frame walked, and 8 bytes a
    /// frame of limit per distinct stack over 127 frames.
    #[arg(long, value_name = "FRAMES",
          value_parser = clap::value_parser!(u32).range(1..=stackscope_stacks::walk::MAX_FRAMES as i64))]
    pub max_stack: Option<u32>,
}

/// `-o` and `--format`, and how stacks are spelled (every command that writes a profile).
#[derive(Args)]
pub struct OutputArgs {
    /// Where to write the profile; `-` for standard output [default: flame.svg].
    ///
    /// Without --format, the name's ending chooses the format (`.svg`, `.folded`, `.txt` for
    /// bcc text, `.json`, `.pb.gz`, `.speedscope.json`, `.firefox.json`, ...); an ending that
    /// names none is refused, no ending is SVG. Without -o: flame.svg, or stackscope.<ext>
    /// for the chosen --format. Checked writable before sampling. A regular file is replaced
    /// whole (through a temporary renamed into place); a device, FIFO or
    /// /dev/stdout is written in place; a symbolic link is kept and the file it names
    /// replaced. In a sticky world-writable directory (/tmp), a link or file is followed or
    /// written only where the kernel's fs.protected_symlinks, fs.protected_regular and
    /// fs.protected_fifos would let you open it.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Output format [default: from the -o extension, else svg].
    #[arg(long, value_name = "FORMAT", value_parser = format_name(&Format::ALL))]
    pub format: Option<Format>,

    #[command(flatten)]
    pub style: StyleArgs,
}

/// `--no-debuginfod`: whether debug info may come from debuginfod servers (`record`, `report`,
/// `profile`).
#[derive(Args)]
pub struct DebuginfodArg {
    /// Fetch no debug info from debuginfod servers. Without it, when DEBUGINFOD_URLS names
    /// servers (space-separated, as for perf and gdb), the debug files of binaries whose
    /// frames no local file names are fetched by build-id as frames are named (after sampling
    /// or reading perf.data), read first from
    /// and kept in elfutils' cache ($DEBUGINFOD_CACHE_PATH, else
    /// ~/.cache/debuginfod_client), with a progress bar on a terminal (a line per file
    /// otherwise). DEBUGINFOD_TIMEOUT (seconds, default 90) bounds the wait for a server to
    /// answer, DEBUGINFOD_MAXTIME one file, and 5 minutes all fetching; a server that cannot
    /// be reached is named in one warning, and the profile is written all the same (as at a
    /// Ctrl-C while fetching, which stops it).
    #[arg(long)]
    pub no_debuginfod: bool,
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

/// The `--format` values a command writes, each named by [`Format::name`], so every format is
/// named in one place and `--help` shows them all.
pub(crate) fn format_name(formats: &[Format]) -> impl TypedValueParser<Value = Format> {
    PossibleValuesParser::new(formats.iter().map(|format| format.name()))
        .try_map(|s: String| Format::from_name(&s).ok_or_else(|| format!("unknown format {s}")))
}

/// `record`'s samples per second: odd, so sampling does not run in lockstep with timers.
pub const RECORD_FREQUENCY: u64 = 999;
/// `profile`'s samples per second: bcc profile's.
pub const PROFILE_FREQUENCY: u64 = 49;
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

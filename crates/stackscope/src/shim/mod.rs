//! Drop-in stand-ins for `perf` and `dtrace`: they accept the command lines cargo-flamegraph
//! (and tools like it) pass, profile with stackscope, and print what those tools print.
//!
//! Each shim translates its argv into a `stackscope record` command line, so recording,
//! Ctrl-C handling and exit codes are `record`'s own; only the files they write differ. A shim
//! interrupted by Ctrl-C (or SIGTERM) writes what it collected and then ends by that signal,
//! as `perf record` does: callers such as cargo-flamegraph take that for an interruption and
//! go on to draw the flamegraph, where an exit code would read as a failure.

pub mod dtrace;
#[cfg(target_os = "linux")]
pub mod perf;

/// `perf` is Linux's: elsewhere its stand-in refuses in one line and points to the one that fits.
#[cfg(not(target_os = "linux"))]
pub mod perf {
    /// Refuses to run, naming `stackscope-dtrace` instead.
    pub fn main() -> ! {
        crate::status::exit(Err(anyhow::anyhow!(
            "stackscope-perf stands in for Linux's perf and is Linux-only; cargo flamegraph on \
             this system runs dtrace: DTRACE=stackscope-dtrace"
        )))
    }
}

use std::ffi::OsString;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::{bail, Result};
use clap::Parser;
use stackscope_profile::{FrameId, Profile, ProfileBuilder};

use crate::cli::{Cli, Command, RecordArgs};

/// Parses a `stackscope record` command line (without the program name) built by a shim.
fn record_args(args: Vec<OsString>) -> Result<RecordArgs> {
    let argv = ["stackscope", "record"]
        .map(OsString::from)
        .into_iter()
        .chain(args);
    match Cli::try_parse_from(argv) {
        Ok(Cli {
            command: Command::Record(args),
        }) => Ok(args),
        Ok(_) => bail!("a shim's command line did not parse as `stackscope record`"),
        // clap's message spans lines; keep its first, which names the problem.
        Err(e) => bail!(
            "{}",
            e.to_string()
                .lines()
                .next()
                .unwrap_or_default()
                .trim_start_matches("error: ")
        ),
    }
}

/// Runs a recording and, when SIGINT or SIGTERM arrived during it, ends the process by that
/// signal once the recording has returned successfully (its profile written).
fn interruptible(record: impl FnOnce() -> Result<i32>) -> Result<i32> {
    let caught = Arc::new(AtomicUsize::new(0));
    for signal in [libc::SIGINT, libc::SIGTERM] {
        signal_hook::flag::register_usize(signal, caught.clone(), signal as usize)?;
    }
    let result = record();
    let signal = caught.load(Ordering::SeqCst);
    if signal != 0 && result.is_ok() {
        signal_hook::low_level::emulate_default_handler(signal as i32)?;
    }
    result
}

/// The profile with each stack replaced by `keep(frames)` (root first), samples of stacks that
/// became equal merged.
fn map_stacks(profile: &Profile, keep: impl Fn(&[FrameId]) -> Vec<FrameId>) -> Profile {
    let mut builder = ProfileBuilder::new(profile.meta.clone());
    let frames: Vec<FrameId> = profile
        .frames
        .iter()
        .map(|f| builder.frame(f.clone()))
        .collect();
    let threads: Vec<u32> = profile
        .threads
        .iter()
        .map(|t| builder.thread(t.clone()))
        .collect();
    for sample in &profile.samples {
        let kept: Vec<FrameId> = keep(&profile.stack(sample.stack).frames)
            .into_iter()
            .map(|f| frames[f as usize])
            .collect();
        let stack = builder.stack(&kept);
        builder.add(
            threads[sample.thread as usize],
            stack,
            sample.cpu,
            sample.count,
        );
    }
    builder.finish()
}

/// The value of an option given as `-x VALUE`, `-xVALUE`, `--long VALUE` or `--long=VALUE`;
/// `None` when `arg` is not that option. Takes the next argument from `rest` when needed.
fn option_value(
    arg: &str,
    short: Option<char>,
    long: Option<&str>,
    rest: &mut impl Iterator<Item = OsString>,
) -> Option<Result<String>> {
    let inline = if let Some(name) = long.filter(|_| arg.starts_with("--")) {
        match arg[2..].strip_prefix(name) {
            Some("") => None,
            Some(v) if v.starts_with('=') => Some(v[1..].to_string()),
            _ => return None,
        }
    } else if let Some(c) = short.filter(|_| !arg.starts_with("--")) {
        let mut chars = arg.chars();
        if chars.next() != Some('-') || chars.next() != Some(c) {
            return None;
        }
        let v = chars.as_str();
        (!v.is_empty()).then(|| v.to_string())
    } else {
        return None;
    };
    Some(match inline {
        Some(v) => Ok(v),
        None => rest
            .next()
            .map(|v| v.to_string_lossy().into_owned())
            .ok_or_else(|| anyhow::anyhow!("option {arg} needs a value")),
    })
}

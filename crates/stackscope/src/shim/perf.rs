//! `stackscope-perf`: the `perf record` and `perf script` command lines cargo-flamegraph runs.
//!
//! `record [OPTIONS] CMD ARGS...` profiles with stackscope and writes stackscope JSON where
//! perf would write perf.data (`-o`, default `perf.data`), exiting as perf does with the
//! command's exit code. `script [-i FILE]` reads that file, or a real perf.data, and prints
//! `perf script` text that perf's collapsers fold into the stacks stackscope itself folds.
//! `--help` (alone, or after either command) prints what the stand-in takes.

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use stackscope_perf_event::record::MAX_STACK_COPY;
use stackscope_profile::format::{perf_script, WriteOptions};

use super::{interruptible, map_stacks, option_value, record_args};

/// perf's own default: what `-o` and `-i` name when absent.
const DEFAULT_FILE: &str = "perf.data";

const USAGE: &str = "\
usage: stackscope-perf record [-F HZ | -c COUNT] [-g] [--call-graph dwarf[,SIZE] | fp] [-o FILE]
                              [-p PID | -t TID | -a [-C CPU]] [--] [CMD [ARGS]]
       stackscope-perf script [-i FILE] [--no-inline]
Stands in for `perf record` and `perf script` where cargo-flamegraph runs perf
(PERF=stackscope-perf cargo flamegraph). `record` samples CMD (or the processes, threads or
whole system named) with stackscope and writes stackscope JSON to FILE (default perf.data),
which perf's own tools do not read: read it with `stackscope-perf script` or `stackscope
report`. `script` prints FILE, or a perf.data written by perf, as `perf script` text.
";

const RECORD_OPTIONS: &str = "-F, -c, -g, --call-graph, -z, -o, -p, -t, -a, -C, -e cpu-clock, -q";
const SCRIPT_OPTIONS: &str = "-i, --force, --no-inline, --inline";

/// Runs `stackscope-perf` with the process's arguments and exits with its status.
pub fn main() -> ! {
    crate::status::exit(run(std::env::args_os().skip(1).collect()))
}

/// Runs `stackscope-perf ARGS` (without the program name); returns the exit code.
pub fn run(args: Vec<OsString>) -> Result<i32> {
    let mut args = args.into_iter();
    let sub = args.next().map(|s| s.to_string_lossy().into_owned());
    match sub.as_deref() {
        Some("--help" | "-h" | "help") => usage(),
        Some("record") => record(args),
        Some("script") => script(args),
        Some(other) => bail!(
            "stackscope-perf does not do `perf {other}`: it stands in for `perf record` and `perf script` only"
        ),
        None => bail!("stackscope-perf needs a command: record or script (as perf takes them)"),
    }
}

/// What the stand-in does and takes, as `perf --help` would say it; exits 0.
fn usage() -> Result<i32> {
    print!("{USAGE}");
    Ok(0)
}

/// Whether `arg` asks for help, as perf's `-h` and `--help` do after a command.
fn is_help(arg: &str) -> bool {
    arg == "--help" || arg == "-h"
}

/// `perf record`: translated into `stackscope record` with a JSON output.
fn record(mut args: std::vec::IntoIter<OsString>) -> Result<i32> {
    let mut translation = Translation::default();
    let mut command = Vec::new();
    while let Some(raw) = args.next() {
        let arg = raw.to_string_lossy().into_owned();
        if is_help(&arg) {
            return usage();
        }
        if arg == "--" {
            command.extend(args.by_ref());
            break;
        }
        if !arg.starts_with('-') || arg == "-" {
            command.push(raw);
            command.extend(args.by_ref());
            break;
        }
        translation.option(&arg, &mut args)?;
    }
    let args = record_args(translation.into_record_args(command))?;
    interruptible(|| crate::record::run(args))
}

/// The `stackscope record` flags a `perf record` command line stands for, gathered option by
/// option.
struct Translation {
    out: Vec<OsString>,
    output: String,
    stack_size: Option<u32>,
    frame_pointers: bool,
    has_target: bool,
}

impl Default for Translation {
    fn default() -> Self {
        Translation {
            out: Vec::new(),
            output: DEFAULT_FILE.to_string(),
            stack_size: None,
            frame_pointers: false,
            has_target: false,
        }
    }
}

impl Translation {
    /// Takes one perf option (and its value from `args` when it has one).
    fn option(&mut self, arg: &str, args: &mut std::vec::IntoIter<OsString>) -> Result<()> {
        if let Some(v) = option_value(arg, Some('F'), Some("freq"), args) {
            pair(&mut self.out, "-F", v?);
        } else if let Some(v) = option_value(arg, Some('c'), Some("count"), args) {
            pair(&mut self.out, "-c", v?);
        } else if let Some(v) = option_value(arg, Some('o'), Some("output"), args) {
            self.output = v?;
        } else if let Some(v) = option_value(arg, Some('p'), Some("pid"), args) {
            pair(&mut self.out, "-p", v?);
            self.has_target = true;
        } else if let Some(v) = option_value(arg, Some('t'), Some("tid"), args) {
            pair(&mut self.out, "-L", v?);
            self.has_target = true;
        } else if let Some(v) = option_value(arg, Some('C'), Some("cpu"), args) {
            pair(&mut self.out, "-C", v?);
        } else if let Some(v) = option_value(arg, Some('e'), Some("event"), args) {
            let event = v?;
            if event != "cpu-clock" {
                bail!("stackscope-perf record samples the cpu-clock event only, not -e {event}");
            }
        } else if let Some(v) = option_value(arg, None, Some("call-graph"), args) {
            match call_graph(&v?)? {
                CallGraph::Dwarf(size) => {
                    self.frame_pointers = false;
                    self.stack_size = size;
                }
                CallGraph::FramePointers => self.frame_pointers = true,
            }
        } else if arg == "-z" || arg.starts_with("-z=") || arg.starts_with("--compression-level") {
            // The output is stackscope JSON, which is not compressed.
        } else if arg == "-a" || arg == "--all-cpus" {
            self.out.push("-a".into());
            self.has_target = true;
        } else if arg.len() > 1 && arg[1..].chars().all(|c| "agqv".contains(c)) {
            // Bundled flags such as -ag. -g asks for call graphs, which stackscope always takes.
            if arg.contains('a') {
                self.out.push("-a".into());
                self.has_target = true;
            }
        } else if arg == "--quiet" || arg == "--verbose" {
        } else {
            bail!(
                "stackscope-perf record does not know the perf option {arg} (it understands {RECORD_OPTIONS})"
            );
        }
        Ok(())
    }

    /// The `stackscope record` command line, with the command to launch.
    fn into_record_args(mut self, command: Vec<OsString>) -> Vec<OsString> {
        if self.frame_pointers {
            self.out.extend(["--unwind", "fp"].map(OsString::from));
        } else {
            self.out.extend(["--unwind", "dwarf"].map(OsString::from));
            if let Some(size) = self.stack_size {
                self.out
                    .extend(["--stack-size".into(), size.to_string().into()]);
            }
        }
        self.out.extend([
            "-o".into(),
            self.output.into(),
            "--format".into(),
            "json".into(),
        ]);
        if !command.is_empty() {
            self.out.push("--".into());
            self.out.extend(command);
        } else if !self.has_target {
            // perf records the whole system when given neither a command nor a target.
            self.out.push("-a".into());
        }
        self.out
    }
}

fn pair(out: &mut Vec<OsString>, flag: &str, value: String) {
    out.push(flag.into());
    out.push(value.into());
}

/// How `--call-graph` asks for stacks.
#[derive(Debug, PartialEq)]
enum CallGraph {
    FramePointers,
    /// With the stack bytes to copy, when given.
    Dwarf(Option<u32>),
}

/// `--call-graph VALUE` by perf's rules: `fp`, `dwarf[,SIZE]` or `lbr`, nothing after. What perf
/// refuses is refused here too, rather than profiled some other way; `lbr` perf takes, but
/// stackscope does not do.
fn call_graph(value: &str) -> Result<CallGraph> {
    let mut parts = value.split(',');
    let mode = parts.next().unwrap_or_default();
    let size = parts.next();
    let extra = parts.next().is_some() || (size.is_some() && mode != "dwarf");
    match mode {
        _ if extra => bail!(
            "stackscope-perf record: --call-graph {value} is refused, as perf refuses it: it takes fp, dwarf[,SIZE] or lbr, and nothing after"
        ),
        "fp" => Ok(CallGraph::FramePointers),
        "dwarf" => Ok(CallGraph::Dwarf(size.map(dwarf_stack_size).transpose()?)),
        "lbr" => bail!(
            "stackscope-perf record: --call-graph lbr is not supported; use dwarf[,SIZE] or fp"
        ),
        _ => bail!(
            "stackscope-perf record: --call-graph {value} is refused, as perf refuses it: it takes fp, dwarf[,SIZE] or lbr"
        ),
    }
}

/// The largest stack dump perf takes: the most a u16 record size holds, in whole words.
const PERF_MAX_STACK_DUMP: u64 = 65528;

/// The stack bytes of `--call-graph dwarf,SIZE` as perf reads them (decimal, or hex after
/// `0x`): rounded up to a multiple of 8, then refused when 0 or more than 65528. A size perf
/// takes but a sample cannot carry whole is kept within what stackscope can copy.
fn dwarf_stack_size(size: &str) -> Result<u32> {
    let parsed = match size.strip_prefix("0x").or_else(|| size.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => size.parse(),
    };
    match parsed.ok().and_then(|n| n.checked_next_multiple_of(8)) {
        Some(n) if n > 0 && n <= PERF_MAX_STACK_DUMP => {
            Ok(n.min(u64::from(MAX_STACK_COPY)) as u32)
        }
        _ => bail!(
            "stackscope-perf record: --call-graph dwarf,{size} is refused, as perf refuses it: the stack dump size must be from 1 to {PERF_MAX_STACK_DUMP} bytes"
        ),
    }
}

/// `perf script`: the profile in FILE as perf-script text on standard output.
fn script(mut args: std::vec::IntoIter<OsString>) -> Result<i32> {
    let mut input = PathBuf::from(DEFAULT_FILE);
    let mut inline = true;
    while let Some(raw) = args.next() {
        let arg = raw.to_string_lossy().into_owned();
        if is_help(&arg) {
            return usage();
        }
        if let Some(v) = option_value(&arg, Some('i'), Some("input"), &mut args) {
            input = PathBuf::from(v?);
        } else if arg == "--force" || arg == "-f" {
            // perf refuses files it does not own without it; stackscope never does.
        } else if arg == "--no-inline" {
            inline = false;
        } else if arg == "--inline" {
            inline = true;
        } else {
            bail!(
                "stackscope-perf script does not know the perf option {arg} (it understands {SCRIPT_OPTIONS})"
            );
        }
    }
    let mut profile = crate::input::read_profile(&input)?;
    if !inline {
        profile = map_stacks(&profile, |frames| {
            frames
                .iter()
                .copied()
                .filter(|&f| !profile.frame(f).inlined)
                .collect()
        });
    }
    crate::output::to_stdout(|out| perf_script::write(&profile, &WriteOptions::default(), out))
        .context("cannot write perf-script text to standard output")?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dwarf_sizes_are_read_and_rounded_as_perf_does() {
        assert_eq!(dwarf_stack_size("64000").unwrap(), 64000);
        assert_eq!(dwarf_stack_size("1").unwrap(), 8);
        assert_eq!(dwarf_stack_size("0x1000").unwrap(), 4096);
        assert_eq!(
            dwarf_stack_size("65528").unwrap(),
            MAX_STACK_COPY.min(65528)
        );
        for refused in [
            "0",
            "65529",
            "999999999999",
            "99999999999999999999",
            "big",
            "",
        ] {
            assert!(dwarf_stack_size(refused).is_err(), "{refused}");
        }
    }

    #[test]
    fn call_graph_values_perf_refuses_are_refused() {
        assert_eq!(call_graph("fp").unwrap(), CallGraph::FramePointers);
        assert_eq!(call_graph("dwarf").unwrap(), CallGraph::Dwarf(None));
        assert_eq!(
            call_graph("dwarf,16384").unwrap(),
            CallGraph::Dwarf(Some(16384))
        );
        for refused in [
            "fp,dwarf,lbr",
            "fp,8",
            "dwarf,8,fp",
            "dwarf,999999999999",
            "lbr",
            "lbr,fp",
            "",
            "dwarf,",
            "frame",
        ] {
            let err = call_graph(refused).expect_err(refused).to_string();
            assert!(err.contains("--call-graph"), "{refused}: {err}");
        }
    }
}

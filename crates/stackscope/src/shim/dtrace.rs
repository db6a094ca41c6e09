//! `stackscope-dtrace`: the dtrace command line cargo-flamegraph runs where perf is missing,
//! `-x ustackframes=N -n 'profile-HZ /pid == $target/ { @[ustack(N)] = count(); }' -o FILE
//! -c 'CMD ARGS'` (or `-p PID`, repeatable). Samples user stacks at the probe's rate with
//! stackscope, keeps the frame limit of `ustack(N)` (else `ustackframes`, else DTrace's 100),
//! and writes DTrace aggregation text, exiting with the command's exit code. The same on
//! Windows, where it samples with ETW in blondie_dtrace's place; cargo-flamegraph there first
//! runs `DTRACE --help` to see that the program exists.

use std::ffi::OsString;

use anyhow::{bail, Context, Result};

use super::{interruptible, map_stacks, option_value, record_args};

/// DTrace's default `ustackframes`.
const DEFAULT_FRAMES: usize = 100;
const OPTIONS: &str = "-n, -x ustackframes=N, -o, -c, -p, -q, -Z";
const USAGE: &str = "\
usage: stackscope-dtrace [-x ustackframes=N] -n 'profile-HZ /pid == $target/ { @[ustack(N)] = count(); }'
                         [-o FILE] (-c 'CMD ARGS' | -p PID ...)
Samples the user stacks of CMD (a space inside an argument written `\\ `) or of the
processes PID with stackscope at HZ and writes DTrace aggregation text to FILE (default:
standard output), as cargo-flamegraph reads it (DTRACE=stackscope-dtrace).
";

/// Runs `stackscope-dtrace` with the process's arguments and exits with its status.
pub fn main() -> ! {
    crate::status::exit(run(std::env::args_os().skip(1).collect()))
}

/// Runs `stackscope-dtrace ARGS` (without the program name); returns the exit code.
pub fn run(args: Vec<OsString>) -> Result<i32> {
    let mut args = args.into_iter();
    let mut script = None;
    let mut ustackframes = None;
    let mut output = "-".to_string();
    let mut command = None;
    let mut pids: Vec<String> = Vec::new();
    while let Some(raw) = args.next() {
        let arg = raw.to_string_lossy().into_owned();
        if arg == "--help" {
            print!("{USAGE}");
            return Ok(0);
        }
        if let Some(v) = option_value(&arg, Some('n'), None, &mut args) {
            script = Some(v?);
        } else if let Some(v) = option_value(&arg, Some('x'), None, &mut args) {
            let v = v?;
            // Other tunables size DTrace's buffers, which stackscope does not have.
            if let Some(n) = v.strip_prefix("ustackframes=") {
                ustackframes = Some(
                    n.parse::<usize>()
                        .with_context(|| format!("-x {v}: the frame count is not a number"))?,
                );
            }
        } else if let Some(v) = option_value(&arg, Some('o'), None, &mut args) {
            output = v?;
        } else if let Some(v) = option_value(&arg, Some('c'), None, &mut args) {
            command = Some(split_command(&v?));
        } else if let Some(v) = option_value(&arg, Some('p'), None, &mut args) {
            let pid = v?;
            if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
                bail!("-p {pid}: expected a process id");
            }
            pids.push(pid);
        } else if arg == "-q" || arg == "-Z" {
        } else {
            bail!("stackscope-dtrace does not know the dtrace option {arg} (it understands {OPTIONS})");
        }
    }
    let Some(script) = script else {
        bail!("stackscope-dtrace needs a -n 'profile-HZ ... {{ @[ustack()] = count(); }}' script");
    };
    let probe = Probe::parse(&script)?;
    let frames = probe.frames.or(ustackframes).unwrap_or(DEFAULT_FRAMES);
    if frames == 0 {
        bail!("a stack of 0 frames holds nothing: give ustack(N) or ustackframes=N above 0");
    }

    let mut out: Vec<OsString> = vec!["-F".into(), probe.frequency.to_string().into(), "-U".into()];
    out.extend([
        "-o".into(),
        output.into(),
        "--format".into(),
        "dtrace".into(),
    ]);
    match (command, pids.is_empty()) {
        (Some(_), false) => bail!("give -c CMD or -p PID, not both"),
        (Some(command), true) => {
            if command.is_empty() {
                bail!("-c names no command");
            }
            out.push("--".into());
            out.extend(command.into_iter().map(OsString::from));
        }
        (None, false) => out.extend(["-p".into(), pids.join(",").into()]),
        (None, true) => bail!("nothing to profile: give -c CMD or -p PID"),
    }
    let args = record_args(out)?;
    interruptible(|| {
        crate::record::run_with(args, |output, profile| {
            let kept = map_stacks(profile, |stack| {
                stack[stack.len().saturating_sub(frames)..].to_vec()
            });
            output.write(&kept)
        })
    })
}

/// What stackscope takes from the D script: the `profile-N` rate and the `ustack(N)` limit.
#[derive(Debug, PartialEq)]
struct Probe {
    frequency: u64,
    frames: Option<usize>,
}

impl Probe {
    fn parse(script: &str) -> Result<Probe> {
        let unsupported = || {
            anyhow::anyhow!(
                "stackscope-dtrace runs only scripts of the form 'profile-HZ /pid == $target/ {{ @[ustack()] = count(); }}', not {script:?}"
            )
        };
        let rate = script
            .split("profile-")
            .nth(1)
            .ok_or_else(unsupported)?
            .split(|c: char| c.is_whitespace() || c == '/' || c == '{')
            .next()
            .unwrap_or_default();
        let frequency = frequency(rate).ok_or_else(|| {
            anyhow::anyhow!("profile-{rate}: expected a rate such as profile-997 or profile-1ms")
        })?;
        let args = script.split("ustack(").nth(1).ok_or_else(unsupported)?;
        let args = args.split(')').next().unwrap_or_default().trim();
        let frames = match args.split(',').next().unwrap_or_default().trim() {
            "" => None,
            n => Some(n.parse().map_err(|_| {
                anyhow::anyhow!("ustack({args}): the frame count {n} is not a number")
            })?),
        };
        Ok(Probe { frequency, frames })
    }
}

/// Samples per second of a `profile-` probe rate: `997`, `997hz`, or a period such as `1ms`.
fn frequency(rate: &str) -> Option<u64> {
    let split = rate
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rate.len());
    let n: u64 = rate[..split].parse().ok()?;
    let nanos_per_unit: u64 = match &rate[split..] {
        "" | "hz" => return (n > 0).then_some(n),
        "ns" | "nsec" => 1,
        "us" | "usec" => 1_000,
        "ms" | "msec" => 1_000_000,
        "s" | "sec" => 1_000_000_000,
        _ => return None,
    };
    let period = n.checked_mul(nanos_per_unit).filter(|&p| p > 0)?;
    Some((1_000_000_000 / period).max(1))
}

/// Splits dtrace's `-c` string into arguments at whitespace, as cargo-flamegraph joins them:
/// a space inside an argument is written `\ `, and nothing else is escaped, so every other `\`
/// is itself (a Windows path such as `C:\proj\target\release\my.exe` keeps its separators).
fn split_command(text: &str) -> Vec<String> {
    let mut args = Vec::new();
    let mut arg = String::new();
    let mut started = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&' ') => {
                arg.push(' ');
                chars.next();
                started = true;
            }
            c if c.is_whitespace() => {
                if started {
                    args.push(std::mem::take(&mut arg));
                    started = false;
                }
            }
            c => {
                arg.push(c);
                started = true;
            }
        }
    }
    if started {
        args.push(arg);
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_split_honours_escaped_spaces() {
        assert_eq!(
            split_command(r"./my\ prog  a\ b c\\d e\ "),
            vec!["./my prog", "a b", r"c\\d", "e "]
        );
        assert!(split_command("  ").is_empty());
    }

    /// cargo-flamegraph on Windows names the built program by its full path, backslashes and
    /// all, and escapes only the spaces.
    #[test]
    fn command_split_keeps_windows_paths() {
        assert_eq!(
            split_command(r"C:\Users\me\My\ Code\target\release\prog.exe --n 3 \\srv\share\in.txt"),
            vec![
                r"C:\Users\me\My Code\target\release\prog.exe",
                "--n",
                "3",
                r"\\srv\share\in.txt"
            ]
        );
        assert_eq!(split_command(r"a\ "), vec!["a "]);
        assert_eq!(split_command(r"a\"), vec![r"a\"]);
    }

    #[test]
    fn probe_rate_and_frames() {
        let p = Probe::parse("profile-997 /pid == $target/ { @[ustack(100)] = count(); }");
        assert_eq!(
            p.unwrap(),
            Probe {
                frequency: 997,
                frames: Some(100)
            }
        );
        let p = Probe::parse("profile-1ms{@[ustack()]=count();}").unwrap();
        assert_eq!(
            p,
            Probe {
                frequency: 1000,
                frames: None
            }
        );
        assert!(Probe::parse("tick-1s { @[stack()] = count(); }").is_err());
        assert!(Probe::parse("profile-abc { @[ustack()] = count(); }").is_err());
        assert!(Probe::parse("profile-99 { @[ustack(x)] = count(); }").is_err());
    }
}

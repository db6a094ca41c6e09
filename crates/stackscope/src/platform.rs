//! What only Linux has: perf_event and eBPF, and the commands and flags built on them. On
//! other systems they stay in the command line (so `--help` still names them) and are refused
//! by name in one line, rather than missing without a word. The one other system with a
//! source is Windows, whose ETW source also has no threads alone, single CPU or event count.
//! Built on Linux for its tests, which parse real command lines.

use anyhow::{bail, Result};

use crate::cli::RecordArgs;

/// Refuses `what`, a Linux-only command.
pub(crate) fn refuse(what: &str) -> Result<i32> {
    bail!("{what} is Linux-only: it samples with perf_event and eBPF, which this system does not have")
}

/// Refuses the first `record` flag given that this system's source cannot honour: those of
/// the Linux sources, and what ETW does not do.
pub(crate) fn refuse_unavailable(args: &RecordArgs) -> Result<()> {
    const LINUX: &str = "is Linux-only: it belongs to the perf_event or eBPF source, which this system does not have";
    let given = [
        (args.backend.is_some(), "--backend", LINUX),
        (!args.events.is_empty(), "-e/--event", LINUX),
        (args.unwind.is_some(), "--unwind", LINUX),
        (args.stack_size.is_some(), "--stack-size", LINUX),
        (args.read_stack_on, "--read-stack-on", LINUX),
        (args.max_stack.max_stack.is_some(), "--max-stack", LINUX),
        (args.off_cpu, "--off-cpu", LINUX),
        (args.wall, "--wall", LINUX),
        (args.min_block.is_some(), "--min-block", LINUX),
        (args.memory.alloc, "--alloc", LINUX),
        (args.memory.in_use, "--in-use", LINUX),
        (!args.memory.alloc_fns.is_empty(), "--alloc-fn", LINUX),
        (args.memory.sample_bytes.is_some(), "--sample-bytes", LINUX),
        (
            !args.target.tid.is_empty(),
            "-L/--tid",
            "is not available on Windows: ETW samples processes; give -p PIDS",
        ),
        (
            args.cpu.cpu.is_some(),
            "-C/--cpu",
            "is not available on Windows: ETW samples every CPU",
        ),
        (
            args.rate.count.is_some(),
            "-c/--count",
            "is not available on Windows: the profile timer runs by time; give -F HZ",
        ),
    ];
    match given.iter().find(|(set, _, _)| *set) {
        Some((_, flag, why)) => bail!("{flag} {why}"),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    /// `stackscope record ARGS -- prog`'s arguments.
    fn record(args: &[&str]) -> RecordArgs {
        let argv = ["stackscope", "record"]
            .iter()
            .chain(args)
            .chain(&["--", "prog"]);
        match Cli::try_parse_from(argv) {
            Ok(Cli {
                command: Command::Record(args),
            }) => args,
            Ok(_) => panic!("not a record command line"),
            Err(e) => panic!("{args:?} did not parse: {e}"),
        }
    }

    /// The one-line refusal of `args`, or `None` when they are taken.
    fn refusal(args: &[&str]) -> Option<String> {
        refuse_unavailable(&record(args))
            .err()
            .map(|e| e.to_string())
    }

    #[test]
    fn what_etw_samples_with_is_taken() {
        for args in [
            &[][..],
            &["-F", "4000", "-o", "out.folded", "--format", "folded"],
            &["-U", "-d", "5"],
            &["-K", "-I", "--no-debuginfod"],
            &["-p", "1234", "-d", "10"],
        ] {
            assert_eq!(refusal(args), None, "{args:?}");
        }
    }

    #[test]
    fn each_flag_the_source_cannot_honour_is_refused_by_name() {
        let cases: [(&[&str], &str); 17] = [
            (&["--backend", "bpf"], "--backend is Linux-only"),
            (&["--backend", "perf"], "--backend is Linux-only"),
            (&["-e", "uprobe:libc:malloc"], "-e/--event is Linux-only"),
            (&["--event", "profile:hz:99"], "-e/--event is Linux-only"),
            (&["--unwind", "fp"], "--unwind is Linux-only"),
            (&["--stack-size", "8192"], "--stack-size is Linux-only"),
            (&["--read-stack-on"], "--read-stack-on is Linux-only"),
            (&["--max-stack", "64"], "--max-stack is Linux-only"),
            (&["--off-cpu"], "--off-cpu is Linux-only"),
            (&["--wall"], "--wall is Linux-only"),
            (&["--min-block", "10"], "--min-block is Linux-only"),
            (&["--alloc"], "--alloc is Linux-only"),
            (&["--in-use", "--min-age", "1"], "--in-use is Linux-only"),
            (
                &["--alloc-fn", "./prog:get,put"],
                "--alloc-fn is Linux-only",
            ),
            (&["-L", "4321"], "-L/--tid is not available on Windows"),
            (&["-a", "-C", "1"], "-C/--cpu is not available on Windows"),
            (&["-c", "1000000"], "-c/--count is not available on Windows"),
        ];
        for (args, start) in cases {
            let refusal = refusal(args).unwrap_or_else(|| panic!("{args:?} was taken"));
            assert!(refusal.starts_with(start), "{args:?}: {refusal}");
            assert_eq!(refusal.lines().count(), 1, "{refusal}");
        }
    }

    #[test]
    fn a_linux_only_command_is_refused_by_name() {
        let e = refuse("stackscope profile").unwrap_err().to_string();
        assert!(e.starts_with("stackscope profile is Linux-only"), "{e}");
    }
}

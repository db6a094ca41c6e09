//! Which source `record` samples with, and why: the one choice made from the flags, the
//! target and what this machine allows this user, said in the summary's first line.
//!
//! Without `--backend`, a launched command or `-p`/`-L` is sampled by the eBPF source where
//! it can run (root or CAP_BPF+CAP_PERFMON, kernel 5.17+ with BTF): it unwinds whole user
//! stacks in the kernel, where the perf source's stack copies break off deep stacks (a fifth
//! of rustc's). `-a`, a flag only the perf source has, or a machine without eBPF picks the perf
//! source. The README's "Which backend" part says what was measured.

use anyhow::{bail, Result};
use stackscope_bpf::{MemoryProfile, TimeProfile};
use stackscope_stacks::Target;

use crate::cli::{BackendArg, RecordArgs};

/// The source picked and the reason, in the summary's words.
pub(crate) struct Choice {
    pub backend: BackendArg,
    pub why: String,
}

impl Choice {
    /// The summary's first line: "stackscope: sampled with eBPF (why)".
    pub fn line(&self) -> String {
        let name = match self.backend {
            BackendArg::Bpf => "eBPF, user stacks unwound in the kernel",
            BackendArg::Perf => "perf_event, user stacks copied and unwound here",
        };
        format!("stackscope: sampled with {name} ({})", self.why)
    }

    fn of(backend: BackendArg, why: impl Into<String>) -> Result<Choice> {
        Ok(Choice {
            backend,
            why: why.into(),
        })
    }
}

/// The backend for `args` (whose target is `target`); probes and time need the eBPF one, and
/// asking for the perf one with them is refused. A `live` view (`top`) takes the perf source
/// by default: measured live, it costs less than the eBPF source (README, `top`).
pub(crate) fn choose(
    args: &RecordArgs,
    target: &Target,
    time: Option<&TimeProfile>,
    memory: Option<&MemoryProfile>,
    live: bool,
) -> Result<Choice> {
    if let Some(memory) = memory {
        if args.backend == Some(BackendArg::Perf) {
            bail!("counting {memory} runs on the eBPF backend only: drop --backend perf");
        }
        return Choice::of(
            BackendArg::Bpf,
            format!("{memory} are counted in the kernel"),
        );
    }
    if let Some(time) = time {
        let flag = if args.wall { "--wall" } else { "--off-cpu" };
        if args.backend == Some(BackendArg::Perf) {
            bail!("{flag} ({time}) runs on the eBPF backend only: drop --backend perf");
        }
        return Choice::of(
            BackendArg::Bpf,
            format!("{flag} counts {time} in the kernel"),
        );
    }
    let probe = args.events.iter().find(|e| !e.is_timer());
    match (args.backend, probe) {
        (Some(BackendArg::Perf), Some(probe)) => bail!(
            "--event {probe} runs on the eBPF backend only: drop --backend perf (the perf backend samples the timer, profile:hz:N)"
        ),
        (Some(backend), _) => return Choice::of(backend, "asked for with --backend"),
        (None, Some(probe)) => {
            return Choice::of(BackendArg::Bpf, format!("--event {probe} is a probe"))
        }
        (None, None) => {}
    }
    let perf_flag = [
        (args.unwind.is_some(), "--unwind"),
        (args.stack_size.is_some(), "--stack-size"),
        (args.read_stack_on, "--read-stack-on"),
    ]
    .into_iter()
    .find_map(|(given, flag)| given.then_some(flag));
    if let Some(flag) = perf_flag {
        return Choice::of(BackendArg::Perf, format!("{flag} is the perf backend's"));
    }
    if args.max_stack.max_stack.is_some() {
        return Choice::of(BackendArg::Bpf, "--max-stack is the eBPF backend's");
    }
    if *target == Target::System {
        return Choice::of(
            BackendArg::Perf,
            "-a: the perf source unwinds a process that starts during the recording from its \
             first sample on, where eBPF walks its samples by frame pointers until its unwind \
             tables are in the kernel; --backend bpf to choose it",
        );
    }
    if live {
        return Choice::of(
            BackendArg::Perf,
            "a live view: the perf source costs less there (its start and its refreshes); --backend bpf to choose it",
        );
    }
    let (release, missing) = crate::doctor::bpf_missing();
    if !missing.is_empty() {
        return Choice::of(
            BackendArg::Perf,
            format!(
                "eBPF unavailable on kernel {release}: {}; deep stacks may break off",
                missing.join("; ")
            ),
        );
    }
    Choice::of(
        BackendArg::Bpf,
        "the default where eBPF runs: whole stacks; --backend perf for stack copies",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    /// The choice for `stackscope record WORDS...`, with a launched command unless `target`.
    fn choice(words: &[&str], target: Target) -> Result<Choice> {
        let argv = ["stackscope", "record"].iter().chain(words);
        let Command::Record(args) = Cli::try_parse_from(argv).unwrap().command else {
            unreachable!("a record command line");
        };
        choose(&args, &target, None, None, false)
    }

    fn command() -> Target {
        Target::Command(vec!["prog".into()])
    }

    #[test]
    fn a_flag_of_one_backend_picks_it_and_is_the_reason() {
        for (words, backend, why) in [
            (&["--unwind", "fp"][..], BackendArg::Perf, "--unwind"),
            (&["--stack-size", "4096"], BackendArg::Perf, "--stack-size"),
            (&["--read-stack-on"], BackendArg::Perf, "--read-stack-on"),
            (&["--max-stack", "64"], BackendArg::Bpf, "--max-stack"),
            (&["--backend", "perf"], BackendArg::Perf, "--backend"),
            (&["--backend", "bpf"], BackendArg::Bpf, "--backend"),
        ] {
            let c = choice(words, command()).unwrap();
            assert!(
                c.backend == backend && c.why.contains(why),
                "{words:?}: {}",
                c.line()
            );
        }
    }

    #[test]
    fn the_whole_system_takes_the_perf_source_and_a_command_takes_ebpf_where_it_runs() {
        let c = choice(&[], Target::System).unwrap();
        assert!(
            c.backend == BackendArg::Perf && c.why.starts_with("-a"),
            "{}",
            c.line()
        );
        let c = choice(&[], command()).unwrap();
        let (_, missing) = crate::doctor::bpf_missing();
        match missing.is_empty() {
            true => assert!(c.backend == BackendArg::Bpf, "{}", c.line()),
            false => assert!(
                c.backend == BackendArg::Perf && c.why.contains(missing[0]),
                "{}",
                c.line()
            ),
        }
        assert!(c.line().starts_with("stackscope: sampled with "));
    }

    #[test]
    fn the_perf_backend_with_a_probe_is_refused() {
        let e = choice(&["--backend", "perf", "-e", "kprobe:vfs_read"], command());
        assert!(e.is_err_and(|e| e.to_string().contains("eBPF backend only")));
    }
}

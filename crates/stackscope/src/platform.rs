//! What only Linux has: perf_event and eBPF, and the commands and flags built on them. On
//! other systems they stay in the command line (so `--help` still names them) and are refused
//! by name in one line, rather than missing without a word.

use anyhow::{bail, Result};

use crate::cli::{BackendArg, RecordArgs};

/// Refuses `what`, a Linux-only command.
pub(crate) fn refuse(what: &str) -> Result<i32> {
    bail!("{what} is Linux-only: it samples with perf_event and eBPF, which this system does not have")
}

/// Refuses the first `record` flag given that only the Linux sources honour.
pub(crate) fn refuse_linux_flags(args: &RecordArgs) -> Result<()> {
    let given = [
        (args.backend == BackendArg::Bpf, "--backend bpf"),
        (args.unwind.is_some(), "--unwind"),
        (args.stack_size.is_some(), "--stack-size"),
        (args.read_stack_on, "--read-stack-on"),
        (args.max_stack.max_stack.is_some(), "--max-stack"),
        (args.off_cpu, "--off-cpu"),
        (args.wall, "--wall"),
        (args.min_block.is_some(), "--min-block"),
    ];
    match given.iter().find(|(set, _)| *set) {
        Some((_, flag)) => bail!(
            "{flag} is Linux-only: it needs the perf_event or eBPF source, which this system does not have"
        ),
        None => Ok(()),
    }
}

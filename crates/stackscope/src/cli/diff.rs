//! `stackscope diff`'s command line.

use std::path::PathBuf;

use clap::Args;
use stackscope_profile::format::Format;

use super::flags::{format_name, OutputArgs};

#[derive(Args)]
#[command(after_help = "Examples:\n  \
    stackscope diff before.json after.json -o diff.svg\n  \
    stackscope diff before.folded after.perf.data -o diff.folded --no-normalize\n\n\
    Both inputs may be anything `stackscope report` reads. The folded output has one line per \
    stack: `stack BEFORE AFTER`, as inferno-diff-folded writes it, for inferno-flamegraph or \
    flamegraph.pl; `stackscope report` refuses it (a profile holds one count per stack).")]
#[command(
    mut_arg("output", |a| a.long_help(None).help(
        "Where to write; `-` for standard output. Default: diff.svg, or diff.folded with \
         `--format folded`"
    )),
    mut_arg("format", |a| a
        .help(
            "`svg` (differential flamegraph) or `folded` (`stack BEFORE AFTER` lines). Default: \
             from the --output extension, else svg"
        )
        .value_parser(format_name(&[Format::Svg, Format::Folded]))),
)]
pub struct DiffArgs {
    /// The profile before the change.
    pub before: PathBuf,

    /// The profile after the change.
    pub after: PathBuf,

    #[command(flatten)]
    pub output: OutputArgs,

    /// Compare the counts as they are, instead of scaling the first profile's counts to the
    /// second's total.
    #[arg(long)]
    pub no_normalize: bool,

    /// Replace hexadecimal numbers in frame names (`0x7f12ab`) with `0x...`, so frames named by
    /// address compare equal across runs.
    #[arg(long)]
    pub strip_hex: bool,

    /// Draw the first profile's stacks at their widths instead of the second's, so that what
    /// the second lacks shows (in blue); colours keep their meaning, red grew and blue shrank.
    /// The folded output is then `stack AFTER BEFORE`, as inferno-flamegraph --negate draws
    /// it.
    #[arg(long)]
    pub negate: bool,
}

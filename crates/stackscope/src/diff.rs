//! `stackscope diff`: a differential flamegraph of two profiles, with inferno's differential
//! semantics: each stack of the second profile is drawn at its new width and coloured by how
//! much it grew (red) or shrank (blue) since the first; by default the first profile is first
//! scaled to the second's total, so a longer or busier run does not turn everything red.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use inferno::differential;
use inferno::flamegraph;
use stackscope_profile::format::{self, Format, WriteOptions};
use stackscope_profile::Profile;

use crate::cli::StyleArgs;
use crate::input::read_profile;
use crate::output::Output;

#[derive(Args)]
#[command(after_help = "Examples:\n  \
    stackscope diff before.json after.json -o diff.svg\n  \
    stackscope diff before.folded after.perf.data -o diff.folded --no-normalize\n\n\
    Both inputs may be anything `stackscope report` reads. The folded output has one line per \
    stack: `stack BEFORE AFTER`, as inferno-diff-folded writes it, for inferno-flamegraph or \
    flamegraph.pl.")]
pub struct DiffArgs {
    /// The profile before the change.
    pub before: PathBuf,

    /// The profile after the change.
    pub after: PathBuf,

    /// Where to write; `-` for standard output. Default: diff.svg, or diff.folded with
    /// `--format folded`.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// `svg` (differential flamegraph) or `folded` (`stack BEFORE AFTER` lines). Default: from
    /// the --output extension, else svg.
    #[arg(long, value_name = "FORMAT", value_parser = ["svg", "folded"])]
    pub format: Option<String>,

    /// Compare the counts as they are, instead of scaling the first profile's counts to the
    /// second's total.
    #[arg(long)]
    pub no_normalize: bool,

    /// Replace hexadecimal numbers in frame names (`0x7f12ab`) with `0x...`, so frames named by
    /// address compare equal across runs.
    #[arg(long)]
    pub strip_hex: bool,

    /// Colour by the change from the second profile to the first (blue where the second grew),
    /// as inferno-flamegraph's --negate does.
    #[arg(long)]
    pub negate: bool,

    #[command(flatten)]
    pub style: StyleArgs,
}

pub fn run(args: DiffArgs) -> Result<i32> {
    let format = match args.format.as_deref() {
        Some("folded") => Format::Folded,
        Some(_) => Format::Svg,
        None => match args.output.as_deref().and_then(Format::from_path) {
            Some(Format::Folded) => Format::Folded,
            Some(Format::Svg) | None => Format::Svg,
            Some(other) => bail!(
                "stackscope diff writes svg or folded, not {other}: name the output .svg or .folded, or give --format"
            ),
        },
    };
    let path = args.output.clone().unwrap_or_else(|| {
        PathBuf::from(match format {
            Format::Folded => "diff.folded",
            _ => "diff.svg",
        })
    });
    let folded_options = WriteOptions {
        delimiter: args.style.delimited,
        annotate_kernel: args.style.annotate_kernel,
        title: None,
    };
    let output = Output {
        path,
        format,
        options: folded_options.clone(),
    };
    output.check_writable()?;

    let before = read_profile(&args.before)?;
    let after = read_profile(&args.after)?;
    let diff = differential_lines(
        &before,
        &after,
        &folded_options,
        differential::Options {
            normalize: !args.no_normalize,
            strip_hex: args.strip_hex,
        },
    )?;

    let bytes = match format {
        Format::Folded => diff,
        _ => {
            let mut options = flamegraph::Options::default();
            options.title = args.style.title.clone().unwrap_or_else(|| {
                format!(
                    "stackscope diff: {} → {}",
                    args.before.display(),
                    args.after.display()
                )
            });
            options.subtitle = Some(format!(
                "{} samples before{}, {} after; red grew, blue shrank",
                before.total_samples(),
                if args.no_normalize {
                    ""
                } else {
                    " (scaled to after's total)"
                },
                after.total_samples()
            ));
            options.count_name = "samples".to_string();
            options.negate_differentials = args.negate;
            let text = std::str::from_utf8(&diff).context("the folded stacks are not UTF-8")?;
            let mut svg = Vec::new();
            flamegraph::from_lines(&mut options, text.lines(), &mut svg)
                .context("cannot render the differential flamegraph")?;
            svg
        }
    };
    output.write_with(|out| out.write_all(&bytes))?;
    if !output.is_stdout() {
        eprintln!("stackscope: wrote {}", output.path.display());
    }
    Ok(0)
}

/// The differential folded lines, `stack BEFORE AFTER`, of two profiles folded alike.
fn differential_lines(
    before: &Profile,
    after: &Profile,
    opts: &WriteOptions,
    diff: differential::Options,
) -> Result<Vec<u8>> {
    let fold = |profile: &Profile| -> Result<Vec<u8>> {
        let mut folded = Vec::new();
        format::write(profile, Format::Folded, opts, &mut folded)?;
        Ok(folded)
    };
    let mut out = Vec::new();
    differential::from_readers(diff, &fold(before)?[..], &fold(after)?[..], &mut out)
        .context("cannot compare the two profiles")?;
    Ok(out)
}

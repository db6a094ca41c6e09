//! `stackscope diff`: a differential flamegraph of two profiles, written by the profile
//! crate's differential writer through the same safe output as every other profile, and a
//! line on what the flamegraph cannot show: the stacks of the profile it is not drawn from.

use std::path::PathBuf;

use anyhow::{bail, Result};
use stackscope_profile::format::diff::{self, DiffOptions, Missing};
use stackscope_profile::format::Format;
use stackscope_profile::Profile;

use crate::cli::DiffArgs;
use crate::input::read_profile;
use crate::output::{Fallback, Output};

pub fn run(args: DiffArgs) -> Result<i32> {
    let title = format!(
        "stackscope diff: {} → {}",
        args.before.display(),
        args.after.display()
    );
    let output = Output::from_args(
        &args.output,
        Fallback {
            format: Format::Svg,
            path: |format| match format {
                Format::Folded => PathBuf::from("diff.folded"),
                _ => PathBuf::from("diff.svg"),
            },
            title,
            preferred: None,
        },
    )?;
    if !diff::FORMATS.contains(&output.format) {
        bail!(
            "stackscope diff writes svg or folded, not {}: name the output .svg or .folded, or give --format",
            output.format
        );
    }
    output.check_writable()?;

    let before = read_profile(&args.before)?;
    let after = read_profile(&args.after)?;
    let units = (before.meta.count_unit, after.meta.count_unit);
    if units.0 != units.1 {
        bail!(
            "{} counts {} and {} counts {}: compare two profiles of one unit (folded stacks carry none: save both as .json)",
            args.before.display(),
            units.0.short_name(),
            args.after.display(),
            units.1.short_name()
        );
    }
    let options = DiffOptions {
        no_normalize: args.no_normalize,
        strip_hex: args.strip_hex,
        negate: args.negate,
    };
    output.write_with(|out| {
        diff::write(
            &before,
            &after,
            output.format,
            &output.options,
            &options,
            out,
        )
    })?;
    eprintln!("{}", left_out(&before, &after, &output, &options)?);
    if !output.is_stdout() {
        eprintln!("stackscope: wrote {}", output.written());
    }
    Ok(0)
}

/// The line on what the flamegraph leaves out: the samples of the profile it is not drawn from
/// (before, unless --negate) in stacks the other lacks, and how to draw them.
fn left_out(
    before: &Profile,
    after: &Profile,
    output: &Output,
    options: &DiffOptions,
) -> Result<String> {
    let (hidden, drawn) = match options.negate {
        false => (before, after),
        true => (after, before),
    };
    let missing = diff::missing(hidden, drawn, &output.options, options)?;
    Ok(say_left_out(
        missing,
        hidden.total_samples(),
        options.negate,
    ))
}

/// [`left_out`]'s words for `missing` of the `total` samples of the profile not drawn.
fn say_left_out(missing: Missing, total: u64, negate: bool) -> String {
    let Missing {
        samples,
        stacks,
        functions,
    } = missing;
    let (hidden, drawn, other_way) = match negate {
        false => (
            "before",
            "after",
            "--negate draws before's stacks instead, where they show in blue",
        ),
        true => (
            "after",
            "before",
            "without --negate after's stacks are drawn, where they show in red",
        ),
    };
    if samples == 0 {
        return format!(
            "stackscope: every stack of {hidden} is in {drawn}: the flamegraph, drawn from {drawn}'s stacks, shows all of both"
        );
    }
    let stacks = match stacks {
        1 => "1 stack".to_string(),
        n => format!("{n} stacks"),
    };
    format!(
        "stackscope: {samples} of {hidden}'s {total} samples are in {stacks} {drawn} lacks ({functions} of their functions are nowhere in {drawn}): the flamegraph is drawn from {drawn}'s stacks, so they do not show; {other_way}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_vanished_is_counted_and_the_way_to_draw_it_named() {
        let missing = Missing {
            samples: 340,
            stacks: 3,
            functions: 2,
        };
        let line = say_left_out(missing, 1200, false);
        assert_eq!(
            line,
            "stackscope: 340 of before's 1200 samples are in 3 stacks after lacks (2 of their \
             functions are nowhere in after): the flamegraph is drawn from after's stacks, so \
             they do not show; --negate draws before's stacks instead, where they show in blue"
        );
        let line = say_left_out(missing, 1200, true);
        assert!(line.contains("of after's 1200 samples"), "{line}");
        assert!(line.contains("without --negate"), "{line}");
        let line = say_left_out(Missing::default(), 1200, false);
        assert!(line.contains("every stack of before is in after"), "{line}");
    }
}

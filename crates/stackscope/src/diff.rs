//! `stackscope diff`: a differential flamegraph of two profiles, written by the profile
//! crate's differential writer through the same safe output as every other profile.

use std::path::PathBuf;

use anyhow::{bail, Result};
use stackscope_profile::format::diff::{self, DiffOptions};
use stackscope_profile::format::Format;

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
    if !output.is_stdout() {
        eprintln!("stackscope: wrote {}", output.written());
    }
    Ok(0)
}

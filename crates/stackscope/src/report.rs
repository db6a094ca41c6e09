//! `stackscope report`: read a saved profile (or a perf.data file) and write it in another
//! format.

use std::path::Path;

use anyhow::Result;
use stackscope_profile::format::top::{self, TopOptions};
use stackscope_profile::format::Format;
use stackscope_profile::Profile;

use crate::cli::ReportArgs;
use crate::input::read_profile;
use crate::output::{Fallback, Output};

pub fn run(mut args: ReportArgs) -> Result<i32> {
    // Checked first: a perf.data file can take a while to read, and the output path is known.
    if args.top.is_some() {
        args.output.format = Some(Format::Top);
    }
    let mut output = Output::from_args(&args.output, Fallback::file(String::new()))?;
    output.check_writable()?;
    crate::debuginfod::install(&args.debuginfod);
    let profile = read_profile(&args.input)?;
    crate::summary::say_naming();
    if args.output.style.title.is_none() {
        output.options.title = Some(title(&profile, &args.input));
    }
    match args.top {
        Some(rows) => {
            let options = TopOptions {
                rows: rows.unwrap_or(top::DEFAULT_ROWS),
            };
            output.write_with(|out| top::write(&profile, &options, out))?
        }
        None => output.write(&profile)?,
    }
    if !output.is_stdout() {
        eprintln!(
            "stackscope: wrote {} ({} {})",
            output.written(),
            profile.total_samples(),
            profile.meta.count_unit.short_name()
        );
    }
    Ok(0)
}

/// The title a flamegraph of `profile` gets when --title gives none: the command it recorded,
/// as `record` titled it, else the file it was read from.
fn title(profile: &Profile, input: &Path) -> String {
    if profile.meta.command.is_empty() {
        format!("stackscope: {}", input.display())
    } else {
        format!("stackscope: {}", profile.meta.title())
    }
}

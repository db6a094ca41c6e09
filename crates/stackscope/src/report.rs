//! `stackscope report`: read a saved profile (or a perf.data file) and write it in another
//! format.

use anyhow::Result;
use stackscope_profile::format::top::{self, TopOptions};
use stackscope_profile::format::Format;

use crate::cli::ReportArgs;
use crate::input::read_profile;
use crate::output::{Fallback, Output};

pub fn run(mut args: ReportArgs) -> Result<i32> {
    // Checked first: a perf.data file can take a while to read, and the output path is known.
    let title = format!("stackscope: {}", args.input.display());
    if args.top.is_some() {
        args.output.format = Some(Format::Top);
    }
    let output = Output::from_args(&args.output, Fallback::file(title))?;
    output.check_writable()?;
    crate::debuginfod::install(&args.debuginfod, None);
    let profile = read_profile(&args.input)?;
    crate::summary::say_naming();
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
            "stackscope: wrote {} ({} samples)",
            output.written(),
            profile.total_samples()
        );
    }
    Ok(0)
}

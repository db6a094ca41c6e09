//! `stackscope report`: read a saved profile (or a perf.data file) and write it in another
//! format.

use anyhow::Result;

use crate::cli::ReportArgs;
use crate::input::read_profile;
use crate::output::{Fallback, Output};

pub fn run(args: ReportArgs) -> Result<i32> {
    // Checked first: a perf.data file can take a while to read, and the output path is known.
    let title = format!("stackscope: {}", args.input.display());
    let output = Output::from_args(&args.output, Fallback::file(title))?;
    output.check_writable()?;
    crate::debuginfod::install(&args.debuginfod, None);
    let profile = read_profile(&args.input)?;
    output.write(&profile)?;
    if !output.is_stdout() {
        eprintln!(
            "stackscope: wrote {} ({} samples)",
            output.written(),
            profile.total_samples()
        );
    }
    Ok(0)
}

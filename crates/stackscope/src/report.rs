//! `stackscope report`: read a saved profile and write it in another format.

use anyhow::{bail, Context, Result};
use stackscope_profile::format;

use crate::cli::ReportArgs;
use crate::output::Output;

pub fn run(args: ReportArgs) -> Result<i32> {
    let bytes = std::fs::read(&args.input)
        .with_context(|| format!("cannot read {}", args.input.display()))?;
    let profile = format::read(&bytes).with_context(|| {
        format!(
            "{} is not a profile stackscope can read",
            args.input.display()
        )
    })?;
    if profile.samples.is_empty() {
        bail!(
            "{} holds no samples: nothing to report",
            args.input.display()
        );
    }
    let title = format!("stackscope: {}", args.input.display());
    let output = Output::from_args(&args.output, title);
    output.check_writable()?;
    output.write(&profile)?;
    if !output.is_stdout() {
        eprintln!(
            "stackscope: wrote {} ({} samples)",
            output.path.display(),
            profile.total_samples()
        );
    }
    Ok(0)
}

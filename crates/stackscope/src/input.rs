//! Reading a saved profile from a file, for every command that takes one (`report`, `diff`):
//! a profile stackscope can parse (detected from its content), or a perf.data file as
//! `perf record` wrote it, unwound and symbolized here.

use std::io::{IsTerminal, Read};
use std::path::Path;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use stackscope_linux::perf_data::{self, Progress};
use stackscope_profile::{format, Profile};

/// perf.data files at least this big get a progress bar (when stderr is a terminal).
const PROGRESS_MIN_BYTES: u64 = 32 << 20;

/// Reads the profile in `path`, detecting its format from the content, and refuses one with no
/// samples (there would be nothing to show).
pub fn read_profile(path: &Path) -> Result<Profile> {
    let profile = if starts_as_perf_data(path)? {
        read_perf_data(path)?
    } else {
        let bytes =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        format::read(&bytes)
            .with_context(|| format!("{} is not a profile stackscope can read", path.display()))?
    };
    if profile.samples.is_empty() {
        bail!("{} holds no samples: nothing to report", path.display());
    }
    Ok(profile)
}

fn starts_as_perf_data(path: &Path) -> Result<bool> {
    let mut head = Vec::with_capacity(8);
    std::fs::File::open(path)
        .and_then(|f| f.take(8).read_to_end(&mut head))
        .with_context(|| format!("cannot read {}", path.display()))?;
    Ok(perf_data::is_perf_data(&head))
}

/// Reads a perf.data file, with a progress bar on stderr for a large one.
fn read_perf_data(path: &Path) -> Result<Profile> {
    let large = std::fs::metadata(path).is_ok_and(|m| m.len() >= PROGRESS_MIN_BYTES);
    let bar = (large && std::io::stderr().is_terminal()).then(|| {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template(
                "{msg:12} [{bar:40}] {binary_bytes}/{binary_total_bytes} ({eta})",
            )
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_message("reading");
        bar
    });
    let mut on_progress = |p: Progress| {
        if let Some(bar) = &bar {
            bar.set_length(p.total);
            bar.set_position(p.done);
            if p.done >= p.total {
                bar.set_message("symbolizing");
            }
        }
    };
    let result = perf_data::read_perf_data(path, &mut on_progress);
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    Ok(result?)
}

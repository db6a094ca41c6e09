//! Reading a saved profile from a file, for every command that takes one (`report`, `diff`):
//! a profile stackscope can parse (detected from its content), or a perf.data file as
//! `perf record` wrote it, unwound and symbolized here.
//!
//! The input is opened and read once, so a pipe or FIFO (`<(cmd)`, `/dev/stdin`) reads like a
//! file; one that starts like no known format is refused after its first bytes.

use std::fs::File;
use std::io::Read;
#[cfg(target_os = "linux")]
use std::io::{BufReader, IsTerminal, Seek, SeekFrom};
use std::path::Path;

use anyhow::{bail, Context, Result};
#[cfg(target_os = "linux")]
use indicatif::{ProgressBar, ProgressStyle};
#[cfg(target_os = "linux")]
use stackscope_perf_event::perf_data::{self, Progress};
use stackscope_profile::{format, Profile};

/// perf.data files at least this big get a progress bar (when stderr is a terminal).
#[cfg(target_os = "linux")]
const PROGRESS_MIN_BYTES: u64 = 32 << 20;

/// Reads the profile in `path`, detecting its format from the content, and refuses one with no
/// samples (there would be nothing to show).
pub fn read_profile(path: &Path) -> Result<Profile> {
    let cannot_read = || format!("cannot read {}", path.display());
    let mut file = File::open(path).with_context(cannot_read)?;
    let mut head = Vec::with_capacity(format::START_BYTES);
    (&mut file)
        .take(format::START_BYTES as u64)
        .read_to_end(&mut head)
        .with_context(cannot_read)?;
    // perf.data is read by the Linux source's reader (and its zstd), built on Linux only.
    #[cfg(target_os = "linux")]
    if perf_data::is_perf_data(&head) {
        return with_samples(read_perf_data(file, &head, path)?, path);
    }
    let not_profile = || format!("{} is not a profile stackscope can read", path.display());
    format::check_start(&head).with_context(not_profile)?;
    let mut bytes = head;
    file.read_to_end(&mut bytes).with_context(cannot_read)?;
    with_samples(format::read(&bytes).with_context(not_profile)?, path)
}

/// Refuses a profile with no samples: there would be nothing to show.
fn with_samples(profile: Profile, path: &Path) -> Result<Profile> {
    if profile.samples.is_empty() {
        bail!("{} holds no samples: nothing to report", path.display());
    }
    Ok(profile)
}

/// Reads a perf.data file whose first bytes, `head`, were read from `file` already. The format
/// is read out of order: a pipe's bytes are first copied to an unnamed temporary file.
#[cfg(target_os = "linux")]
fn read_perf_data(mut file: File, head: &[u8], path: &Path) -> Result<Profile> {
    let cannot_read = || format!("cannot read {}", path.display());
    let regular = file.metadata().is_ok_and(|m| m.file_type().is_file());
    if regular {
        file.seek(SeekFrom::Start(0)).with_context(cannot_read)?;
    } else {
        let mut copy = tempfile::tempfile()
            .context("cannot create a temporary file to hold perf.data read from a pipe")?;
        std::io::Write::write_all(&mut copy, head)
            .and_then(|()| std::io::copy(&mut file, &mut copy))
            .and_then(|_| copy.seek(SeekFrom::Start(0)))
            .with_context(|| format!("cannot copy {} to a temporary file", path.display()))?;
        file = copy;
    }
    let large = file.metadata().is_ok_and(|m| m.len() >= PROGRESS_MIN_BYTES);
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
    let input = BufReader::with_capacity(1 << 20, file);
    let result = perf_data::read_perf_data_from(input, path, &mut on_progress);
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let mut recording = result?;
    // A file read only in part still gives its profile; the line says what was left.
    if let Some(failure) = &recording.failure {
        eprintln!("stackscope: {failure}");
    }
    crate::hint::word_hints(&mut recording);
    Ok(recording.profile)
}

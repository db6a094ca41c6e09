//! Reading a saved profile from a file, for every command that takes one (`report`, `diff`).

use std::path::Path;

use anyhow::{bail, Context, Result};
use stackscope_profile::{format, Profile};

/// Reads the profile in `path`, detecting its format from the content, and refuses one with no
/// samples (there would be nothing to show).
pub fn read_profile(path: &Path) -> Result<Profile> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let profile = format::read(&bytes)
        .with_context(|| format!("{} is not a profile stackscope can read", path.display()))?;
    if profile.samples.is_empty() {
        bail!("{} holds no samples: nothing to report", path.display());
    }
    Ok(profile)
}

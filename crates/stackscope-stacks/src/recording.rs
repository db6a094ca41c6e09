//! What a recording hands back, whichever source sampled: the profile, how the target ended,
//! why sampling stopped early, the figures of the source that sampled, and the hints. Every
//! command prints its end-of-run summary from this one type.

use std::process::ExitStatus;

use stackscope_profile::Profile;

use crate::{Hint, SourceFigures};

/// The result of one recording by any source.
#[derive(Debug, Default)]
pub struct Recording {
    pub profile: Profile,
    /// The launched command's exit status, when it exited during the recording.
    pub exit_status: Option<ExitStatus>,
    /// True when the recording ended because its stop flag was set.
    pub interrupted: bool,
    /// Why sampling stopped before its time, when it did; the profile holds everything
    /// collected until then.
    pub failure: Option<String>,
    /// What the source that sampled measured beyond the profile, when it measures anything.
    pub figures: Option<SourceFigures>,
    /// What made the stacks less than whole or the samples fewer, in order; the caller words
    /// them into the profile's hints.
    pub hints: Vec<Hint>,
}

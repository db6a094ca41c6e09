//! What a recording hands back, whichever source sampled: the profile, how the target ended,
//! why sampling stopped early, the figures of the source that sampled, and the hints. Every
//! command prints its end-of-run summary from this one type.

use std::process::ExitStatus;

use stackscope_profile::{Metadata, Profile};

use crate::table::StackTable;
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
    /// Stacks counted but left for the source that took over from this one to name, with its
    /// own, in one run of the naming step; the profile is then empty.
    pub unnamed: Option<Unnamed>,
}

/// Stacks a source counted and did not name: a [`StackTable`], the recording's metadata and
/// how many of its user stacks were carried on beyond their copy.
#[derive(Default)]
pub struct Unnamed {
    pub table: StackTable,
    pub meta: Metadata,
    pub recovered: u64,
}

impl std::fmt::Debug for Unnamed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unnamed")
            .field("stacks", &self.table.nodes())
            .field("meta", &self.meta)
            .finish_non_exhaustive()
    }
}

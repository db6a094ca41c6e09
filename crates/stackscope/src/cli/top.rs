//! `stackscope top`'s flags: record's, whole (the same targets, rates, backends and outputs),
//! and the view's own.

use std::time::Duration;

use clap::Args;

use super::{positive_seconds, RecordArgs};

/// Seconds between two refreshes of the view when not told.
pub const TOP_REFRESH: Duration = Duration::from_secs(1);
/// Seconds of samples the view counts when not told.
pub const TOP_WINDOW: Duration = Duration::from_secs(5);

#[derive(Args)]
pub struct TopArgs {
    /// Print N plain-text snapshots of the hottest functions, one a refresh, then stop (as
    /// `top -b`). Without it and with standard output not a terminal, snapshots are printed
    /// until Ctrl-C, the duration or the target's exit.
    #[arg(short, long, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub batch: Option<u64>,

    /// Seconds between refreshes [default: 1].
    #[arg(long, value_name = "SECS", value_parser = positive_seconds)]
    pub refresh: Option<Duration>,

    /// Count the samples of the last SECS seconds [default: 5]; `c` in the view, or
    /// --cumulative, counts everything since the start instead.
    #[arg(long, value_name = "SECS", value_parser = positive_seconds)]
    pub window: Option<Duration>,

    /// Count every sample since the start, not the last --window seconds.
    #[arg(long, conflicts_with = "window")]
    pub cumulative: bool,

    /// Functions a plain-text snapshot shows [default: 20].
    #[arg(long, value_name = "N",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub rows: Option<usize>,

    #[command(flatten)]
    pub record: RecordArgs,
}

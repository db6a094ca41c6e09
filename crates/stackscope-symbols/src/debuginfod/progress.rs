//! What the user sees while debug files download: a progress bar on a terminal, else one
//! line per file as it begins, so that a log shows what the wait was for.

use std::io::IsTerminal;

use indicatif::{HumanBytes, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The display of one download. Clones show the same one.
#[derive(Debug, Clone)]
pub(super) enum Progress {
    Bar(ProgressBar),
    Note,
}

impl Progress {
    /// A download of the debug info of `name` from `server`, of `length` bytes when the
    /// server said, begins.
    pub(super) fn start(name: &str, server: &str, length: Option<u64>) -> Self {
        let what = format!("debug info of {name} from {server}");
        if !std::io::stderr().is_terminal() {
            let size = length.map_or_else(String::new, |l| format!(" ({})", HumanBytes(l)));
            eprintln!("stackscope: debuginfod: fetching the {what}{size}");
            return Progress::Note;
        }
        let bar = match length {
            Some(length) => {
                ProgressBar::with_draw_target(Some(length), ProgressDrawTarget::stderr())
                    .with_style(style(
                        "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
                    ))
            }
            None => ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
                .with_style(style("{msg} {bytes} {bytes_per_sec}")),
        };
        // Short enough for one terminal line beside the bar.
        let short: String = name.chars().take(21).collect();
        bar.set_message(format!("stackscope: fetching debug info of {short}…"));
        Progress::Bar(bar)
    }

    pub(super) fn advance(&self, bytes: u64) {
        if let Progress::Bar(bar) = self {
            bar.inc(bytes);
        }
    }

    /// Prints `line` without tearing the bar.
    pub(super) fn say(&self, line: &str) {
        match self {
            Progress::Bar(bar) => bar.suspend(|| eprintln!("{line}")),
            Progress::Note => eprintln!("{line}"),
        }
    }

    /// The download ended; a bar leaves no trace (what went wrong is said as a warning).
    pub(super) fn finish(self) {
        if let Progress::Bar(bar) = self {
            bar.finish_and_clear();
        }
    }
}

fn style(template: &str) -> ProgressStyle {
    // The templates are fixed strings; a bad one falls back to indicatif's default.
    ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

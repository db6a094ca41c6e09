//! Whether frames may be named from debug files fetched from debuginfod servers: the
//! process's fetcher, set once before any naming begins, so that every source's naming step
//! uses it.

#[cfg(not(windows))]
use std::sync::Arc;

use stackscope_symbols::debug_file::set_process_fetcher;
#[cfg(not(windows))]
use stackscope_symbols::debug_file::FetchDebugFile;
#[cfg(not(windows))]
use stackscope_symbols::debuginfod::Debuginfod;

use crate::cli::DebuginfodArg;

/// Fetches from the servers `DEBUGINFOD_URLS` names, unless `--no-debuginfod` says not to. A
/// stop signal that stops naming ([`crate::status`]) stops fetching too, so that the profile
/// is written at once with the names it has.
#[cfg(not(windows))]
pub(crate) fn install(arg: &DebuginfodArg) {
    let fetcher = if arg.no_debuginfod {
        None
    } else {
        Debuginfod::from_env().map(|client| Arc::new(client) as Arc<dyn FetchDebugFile>)
    };
    set_process_fetcher(fetcher);
}

/// Windows binaries name their frames from PDBs, not from debuginfod's ELF debug files.
#[cfg(windows)]
pub(crate) fn install(_: &DebuginfodArg) {
    set_process_fetcher(None);
}

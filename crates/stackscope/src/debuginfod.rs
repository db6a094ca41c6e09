//! Whether frames may be named from debug files fetched from debuginfod servers: the
//! process's fetcher, set once before any naming begins, so that every source's naming step
//! uses it.

use std::sync::Arc;

use stackscope_symbols::debug_file::{set_process_fetcher, FetchDebugFile};
use stackscope_symbols::debuginfod::Debuginfod;

use crate::cli::DebuginfodArg;

/// Fetches from the servers `DEBUGINFOD_URLS` names, unless `--no-debuginfod` says not to.
pub(crate) fn install(arg: &DebuginfodArg) {
    let fetcher = if arg.no_debuginfod {
        None
    } else {
        Debuginfod::from_env().map(|client| Arc::new(client) as Arc<dyn FetchDebugFile>)
    };
    set_process_fetcher(fetcher);
}

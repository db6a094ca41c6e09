//! Debug files fetched by build-id from debuginfod servers, as `perf`, `gdb` and `eu-stack`
//! fetch them: the servers named by `DEBUGINFOD_URLS` (space-separated), each file kept in
//! elfutils' client cache (`$DEBUGINFOD_CACHE_PATH`, else `$XDG_CACHE_HOME/debuginfod_client`
//! or `~/.cache/debuginfod_client`, as `<build-id>/debuginfo`) and read from there first, so
//! that stackscope and the elfutils tools share one cache.
//!
//! Time is bounded three ways: `DEBUGINFOD_TIMEOUT` (seconds, default 90, zero or negative
//! for none) for a server to connect and start answering or to send more data,
//! `DEBUGINFOD_MAXTIME` (seconds, default none) for one whole file, and
//! [`OVERALL_BOUND`] for all fetching in one process. A server that cannot be reached is
//! named in one warning and not asked again, so it costs the timeout once, not once per file.
//! A Ctrl-C while fetching stops it, so the profile is written with the names it has.
//!
//! The server list, the URLs asked and the reading of answers are the `debuginfod` crate's;
//! the transport under it (with the timeouts), the cache and the progress are here. What it
//! says goes to stderr itself, as libdebuginfod's own progress does: fetching happens deep in
//! the naming step, long after the command line handed over.

mod cache;
mod progress;
mod session;
mod transport;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use debuginfod::BuildId;

use crate::debug_file::FetchDebugFile;
use cache::{Cache, Cached};
use session::Session;
use transport::Transport;

/// How long all fetching of one process may take together, past which the files not yet
/// fetched stay unfetched: a slow server must not hold a finished recording back for long.
pub const OVERALL_BOUND: Duration = Duration::from_secs(300);
/// elfutils' default for `DEBUGINFOD_TIMEOUT`.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(90);

/// The debuginfod servers of this process and what has been learnt of them.
#[derive(Debug)]
pub struct Debuginfod {
    client: debuginfod::Client,
    cache: Cache,
    session: Arc<Session>,
}

/// What fetching waits for.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// For a server to connect and start answering, and between reads of its answer.
    pub start: Option<Duration>,
    /// For one whole file.
    pub file: Option<Duration>,
    /// For all fetching together.
    pub overall: Duration,
}

impl Timeouts {
    /// `DEBUGINFOD_TIMEOUT` and `DEBUGINFOD_MAXTIME` as elfutils reads them, and
    /// [`OVERALL_BOUND`].
    pub fn from_env() -> Self {
        let seconds = |name| {
            let value = std::env::var(name).ok()?;
            // elfutils reads these with atoi: what is not a number counts as 0.
            Some(value.trim().parse::<i64>().unwrap_or(0))
        };
        let positive = |secs: i64| (secs > 0).then(|| Duration::from_secs(secs as u64));
        Timeouts {
            start: seconds("DEBUGINFOD_TIMEOUT").map_or(Some(DEFAULT_TIMEOUT), positive),
            file: seconds("DEBUGINFOD_MAXTIME").and_then(positive),
            overall: OVERALL_BOUND,
        }
    }
}

impl Debuginfod {
    /// A client of the servers `DEBUGINFOD_URLS` names: `None` when it names none, or names
    /// one wrongly (said in one line), or no cache directory can be named.
    pub fn from_env() -> Option<Debuginfod> {
        let urls = std::env::var("DEBUGINFOD_URLS").ok()?;
        let urls: Vec<&str> = urls.split_whitespace().collect();
        let cache = cache::dir_from_env()?;
        Debuginfod::new(&urls, &cache, Timeouts::from_env())
            .map_err(|e| eprintln!("stackscope: warning: DEBUGINFOD_URLS: {e}"))
            .ok()?
    }

    /// A client of the servers at `urls`, caching under `cache`; `Ok(None)` for no server.
    pub fn new(
        urls: &[&str],
        cache: &Path,
        timeouts: Timeouts,
    ) -> Result<Option<Debuginfod>, String> {
        let session = Arc::new(Session::new(timeouts));
        let transport = Transport::new(Arc::clone(&session));
        let client = debuginfod::Client::builder()
            .http_client(transport)
            .build(urls.iter().copied())
            .map_err(|e| format!("{e:#}"))?;
        Ok(client.map(|client| Debuginfod {
            client,
            cache: Cache::new(cache.to_path_buf()),
            session,
        }))
    }

    /// Stops fetching when `stop` is set (by Ctrl-C) after fetching began: the files not
    /// yet fetched are left out, and the download under way is dropped.
    pub fn stop_on(self, stop: Arc<AtomicBool>) -> Self {
        self.session.stop_on(stop);
        self
    }

    /// The separate debug file of the binary with `build_id`, from the cache or else fetched
    /// into it; `None` when no server has it or none can be asked.
    pub fn fetch_debuginfo(&self, build_id: &[u8]) -> Option<PathBuf> {
        let build_id = BuildId::raw(build_id);
        let hex = build_id.format();
        match self.cache.lookup(&hex) {
            Cached::Found(path) => return Some(path),
            Cached::Missing => return None,
            Cached::Unknown => {}
        }
        if let Err(e) = self.cache.prepare(&hex) {
            self.session.warn_cache(self.cache.dir(), &e);
            return None;
        }
        let name = format!("build-id {hex}");
        self.session.begin(&name);
        let answer = self.client.fetch_debug_info(&build_id);
        match answer {
            Ok(Some(mut found)) => {
                let stored = self.cache.store(&hex, &mut found.data);
                self.session.end();
                match stored {
                    Ok(path) => Some(path),
                    // What stopped at Ctrl-C was said once, when it stopped.
                    Err(_) if self.session.interrupted() => None,
                    Err(e) => {
                        self.session.warn_download(found.server_url, &name, &e);
                        None
                    }
                }
            }
            Ok(None) => {
                self.session.end();
                self.cache.store_missing(&hex);
                None
            }
            // Each server's failure was said by the transport.
            Err(_) => {
                self.session.end();
                None
            }
        }
    }
}

impl FetchDebugFile for Debuginfod {
    fn fetch(&self, build_id: &[u8]) -> Option<PathBuf> {
        self.fetch_debuginfo(build_id)
    }
}

#[cfg(test)]
mod tests;

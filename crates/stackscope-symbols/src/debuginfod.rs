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
//! A Ctrl-C that stops naming ([`crate::interrupt`]) stops fetching too, the download under
//! way included, so the profile is written with the names it has.
//!
//! Size is bounded by `DEBUGINFOD_MAXSIZE` (bytes), else [`DEFAULT_MAX_SIZE`]: sent to the
//! server as elfutils sends it (`X-DEBUGINFOD-MAXSIZE`, which elfutils' server answers with
//! 406), checked against the size the answer states, and counted as the bytes arrive, so
//! that a server sending without end fills neither the disk nor the time bound.
//!
//! What a server sends is not trusted: a file is used, and kept in the cache, only when its
//! own build-id is the one asked; one already in the cache is used on the same condition and
//! otherwise left as it is (it is not ours). Each such file, or answer by its URL, is named in
//! a warning and counted as every debug file of another build is ([`foreign::mismatched`]). A
//! file is downloaded to a temporary beside its cache entry and renamed into place once
//! checked, so nothing else ever appears as an entry; a server whose answer is not used leaves
//! the file to the next one.
//!
//! The server list, the URLs asked and the reading of answers are the `debuginfod` crate's;
//! the transport under it (with the timeouts and the size bound), the cache and the progress
//! are here. What it says goes to stderr itself, as libdebuginfod's own progress does:
//! fetching happens deep in the naming step, long after the command line handed over.

mod cache;
mod progress;
mod session;
mod transport;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use debuginfod::BuildId;

use crate::debug_file::FetchDebugFile;
use crate::elf::build_id_hex;
use crate::foreign;
use cache::{Cache, Cached, Stored};
use session::Session;
use transport::Transport;

/// How long all fetching of one process may take together, past which the files not yet
/// fetched stay unfetched: a slow server must not hold a finished recording back for long.
pub const OVERALL_BOUND: Duration = Duration::from_secs(300);
/// elfutils' default for `DEBUGINFOD_TIMEOUT`.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(90);
/// The most one debug file may be when `DEBUGINFOD_MAXSIZE` does not say (elfutils has no
/// bound then): above the debug info of nearly every binary distributions ship, and short of
/// filling a disk; a larger file needs `DEBUGINFOD_MAXSIZE`.
pub const DEFAULT_MAX_SIZE: u64 = 2 << 30;

/// The debuginfod servers of this process and what has been learnt of them.
#[derive(Debug)]
pub struct Debuginfod {
    /// One client per server, in the order `DEBUGINFOD_URLS` names them: a server whose
    /// answer is not used leaves the file to the next one.
    servers: Vec<debuginfod::Client>,
    cache: Cache,
    session: Arc<Session>,
}

/// What fetching waits for, and how much it writes.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// For a server to connect and start answering, and between reads of its answer.
    pub start: Option<Duration>,
    /// For one whole file.
    pub file: Option<Duration>,
    /// For all fetching together.
    pub overall: Duration,
    /// The most bytes one file may have.
    pub size: u64,
}

impl Limits {
    /// `DEBUGINFOD_TIMEOUT`, `DEBUGINFOD_MAXTIME` and `DEBUGINFOD_MAXSIZE` as elfutils reads
    /// them, [`OVERALL_BOUND`], and [`DEFAULT_MAX_SIZE`] where elfutils has no bound.
    pub fn from_env() -> Self {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// [`Limits::from_env`] over the variables `var` reads, which a test sets without
    /// touching the process's environment.
    fn from_vars(var: impl Fn(&str) -> Option<String>) -> Self {
        let number = |name| {
            let value = var(name)?;
            // elfutils reads these with atoi and atol: what is not a number counts as 0.
            Some(value.trim().parse::<i64>().unwrap_or(0))
        };
        let positive = |n: i64| u64::try_from(n).ok().filter(|&n| n > 0);
        let seconds = |n| positive(n).map(Duration::from_secs);
        Limits {
            start: number("DEBUGINFOD_TIMEOUT").map_or(Some(DEFAULT_TIMEOUT), seconds),
            file: number("DEBUGINFOD_MAXTIME").and_then(seconds),
            overall: OVERALL_BOUND,
            size: number("DEBUGINFOD_MAXSIZE")
                .and_then(positive)
                .unwrap_or(DEFAULT_MAX_SIZE),
        }
    }
}

/// What one server did with a request for a file.
enum Answer {
    /// Sent the file, checked and kept at this path.
    Kept(PathBuf),
    /// Said it has none.
    NotThere,
    /// Anything else (said where it happened): the file may exist all the same.
    LeftOut,
}

impl Debuginfod {
    /// A client of the servers `DEBUGINFOD_URLS` names: `None` when it names none, or names
    /// one wrongly (said in one line), or no cache directory can be named.
    pub fn from_env() -> Option<Debuginfod> {
        let urls = std::env::var("DEBUGINFOD_URLS").ok()?;
        let urls: Vec<&str> = urls.split_whitespace().collect();
        let cache = cache::dir_from_env()?;
        Debuginfod::new(&urls, &cache, Limits::from_env())
            .map_err(|e| eprintln!("stackscope: warning: DEBUGINFOD_URLS: {e}"))
            .ok()?
    }

    /// A client of the servers at `urls`, caching under `cache`; `Ok(None)` for no server.
    pub fn new(urls: &[&str], cache: &Path, limits: Limits) -> Result<Option<Debuginfod>, String> {
        let session = Arc::new(Session::new(limits));
        let transport = Transport::new(Arc::clone(&session));
        let mut servers = Vec::new();
        for url in urls {
            let client = debuginfod::Client::builder()
                .http_client(transport.clone())
                .build([*url])
                .map_err(|e| format!("{e:#}"))?;
            servers.extend(client);
        }
        Ok((!servers.is_empty()).then(|| Debuginfod {
            servers,
            cache: Cache::new(cache.to_path_buf()),
            session,
        }))
    }

    /// The separate debug file of the binary with `build_id`, from the cache or else fetched
    /// into it; `None` when no server has it (whose build-id is `build_id`) or none can be
    /// asked.
    pub fn fetch_debuginfo(&self, build_id: &[u8]) -> Option<PathBuf> {
        let hex = build_id_hex(build_id);
        match self.cache.lookup(&hex, build_id) {
            Cached::Found(path) => return Some(path),
            Cached::Missing => return None,
            Cached::Unknown => {}
            // Replacing it would remove what another tool put there: the names a server has
            // wait until the user removes it, having been told of it.
            Cached::Unusable(_) => return None,
        }
        if let Err(e) = self.cache.prepare(&hex) {
            self.session.warn_cache(self.cache.dir(), &e);
            return None;
        }
        let name = format!("build-id {hex}");
        let mut every_server_said_none = true;
        for server in &self.servers {
            match self.ask(server, build_id, &hex, &name) {
                Answer::Kept(path) => return Some(path),
                Answer::NotThere => {}
                Answer::LeftOut => every_server_said_none = false,
            }
        }
        if every_server_said_none {
            self.cache.store_missing(&hex);
        } else {
            self.cache.tidy(&hex);
        }
        None
    }

    /// Asks `server` for the debug file of `build_id` (`hex`, in words `name`), and keeps it
    /// when its build-id is the one asked.
    fn ask(&self, server: &debuginfod::Client, build_id: &[u8], hex: &str, name: &str) -> Answer {
        self.session.begin(name);
        let answer = server.fetch_debug_info(&BuildId::raw(build_id));
        let mut found = match answer {
            Ok(Some(found)) => found,
            Ok(None) => {
                self.session.end();
                return Answer::NotThere;
            }
            // The server's failure was said by the transport.
            Err(_) => {
                self.session.end();
                return Answer::LeftOut;
            }
        };
        let stored = self.cache.store(hex, build_id, &mut found.data);
        self.session.end();
        let server_url = found.server_url.trim_end_matches('/');
        match stored {
            Ok(Stored::Kept(path)) => return Answer::Kept(path),
            Ok(Stored::Unusable(why)) => {
                let url = format!("{server_url}/buildid/{hex}/debuginfo");
                foreign::mismatched(Path::new(&url), &why.describe(hex));
            }
            // What stopped at Ctrl-C was said once, when it stopped; a body past the size
            // bound was said by the transport as it arrived.
            Err(_) if self.session.interrupted() => {}
            Err(e) if e.kind() == io::ErrorKind::FileTooLarge => {}
            Err(e) => self.session.warn_download(server_url, name, &e),
        }
        Answer::LeftOut
    }
}

impl FetchDebugFile for Debuginfod {
    fn fetch(&self, build_id: &[u8]) -> Option<PathBuf> {
        self.fetch_debuginfo(build_id)
    }
}

#[cfg(test)]
mod tests;

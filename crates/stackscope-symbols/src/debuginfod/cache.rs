//! elfutils' client cache, shared with the elfutils tools: `<cache>/<build-id>/debuginfo` is
//! either a whole download or an empty file recording that no server had it, trusted for
//! `cache_miss_s` seconds (the number in the cache's own `cache_miss_s` file, else 600).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// elfutils' default for how long a miss is trusted.
const DEFAULT_MISS_SECONDS: u64 = 600;

/// The cache directory elfutils' client picks: `$DEBUGINFOD_CACHE_PATH`; else
/// `~/.debuginfod_client_cache` if it exists (its older place); else
/// `$XDG_CACHE_HOME/debuginfod_client`; else `~/.cache/debuginfod_client`.
pub(super) fn dir_from_env() -> Option<PathBuf> {
    let var = |name| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(path) = var("DEBUGINFOD_CACHE_PATH") {
        return Some(path.into());
    }
    let home = var("HOME").map(PathBuf::from);
    if let Some(old) = home.as_ref().map(|h| h.join(".debuginfod_client_cache")) {
        if old.is_dir() {
            return Some(old);
        }
    }
    if let Some(xdg) = var("XDG_CACHE_HOME") {
        return Some(PathBuf::from(xdg).join("debuginfod_client"));
    }
    home.map(|h| h.join(".cache").join("debuginfod_client"))
}

#[derive(Debug)]
pub(super) struct Cache {
    dir: PathBuf,
}

/// What the cache knows of one build-id.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Cached {
    Found(PathBuf),
    /// No server had it, recently enough not to ask again.
    Missing,
    Unknown,
}

impl Cache {
    pub(super) fn new(dir: PathBuf) -> Self {
        Cache { dir }
    }

    fn entry(&self, build_id: &str) -> PathBuf {
        self.dir.join(build_id).join("debuginfo")
    }

    pub(super) fn lookup(&self, build_id: &str) -> Cached {
        let path = self.entry(build_id);
        let Ok(meta) = fs::metadata(&path) else {
            return Cached::Unknown;
        };
        if meta.len() > 0 {
            return Cached::Found(path);
        }
        let age = meta
            .modified()
            .ok()
            .and_then(|m| SystemTime::now().duration_since(m).ok())
            .unwrap_or(Duration::MAX);
        if age < self.miss_lifetime() {
            return Cached::Missing;
        }
        // A stale miss is asked again; elfutils removes it the same way.
        let _ = fs::remove_file(&path);
        Cached::Unknown
    }

    fn miss_lifetime(&self) -> Duration {
        let seconds = fs::read_to_string(self.dir.join("cache_miss_s"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(DEFAULT_MISS_SECONDS);
        Duration::from_secs(seconds)
    }

    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Makes the directory of the entry of `build_id`, so that a cache that cannot be
    /// written is known before anything is downloaded into it.
    pub(super) fn prepare(&self, build_id: &str) -> io::Result<()> {
        fs::create_dir_all(self.dir.join(build_id))
    }

    /// Writes `body` as the entry of `build_id`, whole or not at all: into a temporary file
    /// beside it, renamed into place once complete, so that an interrupted download never
    /// looks like a debug file.
    pub(super) fn store(&self, build_id: &str, body: &mut dyn Read) -> io::Result<PathBuf> {
        let path = self.entry(build_id);
        let dir = path.parent().unwrap_or(&self.dir);
        fs::create_dir_all(dir)?;
        let partial = dir.join(format!(".debuginfo.{}.part", std::process::id()));
        let written = write_whole(&partial, body).and_then(|()| fs::rename(&partial, &path));
        if written.is_err() {
            let _ = fs::remove_file(&partial);
        }
        written.map(|()| path)
    }

    /// Records that no server has `build_id`, as elfutils does: an empty entry with no
    /// permissions. Best effort: without it the next run only asks again.
    pub(super) fn store_missing(&self, build_id: &str) {
        let path = self.entry(build_id);
        if let Some(dir) = path.parent() {
            let _ = fs::create_dir_all(dir);
        }
        let _ = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o000)
            .open(&path);
    }
}

fn write_whole(path: &Path, body: &mut dyn Read) -> io::Result<()> {
    let mut file = File::create(path)?;
    io::copy(body, &mut file)?;
    file.flush()
}

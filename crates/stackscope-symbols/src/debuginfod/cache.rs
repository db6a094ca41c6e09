//! elfutils' client cache, shared with the elfutils tools: `<cache>/<build-id>/debuginfo` is
//! either a whole download or an empty file recording that no server had it, trusted for
//! `cache_miss_s` seconds (the number in the cache's own `cache_miss_s` file, else 600).
//! A file there is used only when its build-id is its entry's ([`has_build_id`], which names
//! and counts one that is not), since the elfutils tools keep whatever a server sent; and a
//! download becomes an entry only on that same condition.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::debug_file::has_build_id;
use crate::elf::{build_id_hex, ElfFile};

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
    /// The entry holds a file that is not the debug file of that build-id (named and
    /// counted by [`has_build_id`] when it is ELF).
    Unusable(PathBuf),
}

/// What became of a download.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Stored {
    /// Checked, and kept at this path.
    Kept(PathBuf),
    /// Not the debug file asked for, and not kept.
    Unusable(Unusable),
}

/// Why a file is not the debug file of the build-id asked for.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Unusable {
    /// It cannot be read as ELF.
    Unreadable(String),
    NoBuildId,
    OtherBuildId(Vec<u8>),
}

impl Unusable {
    /// Why, in words, for a file asked for by `asked` (a build-id in hex), as
    /// [`has_build_id`] says it of a file on disk.
    pub(super) fn describe(&self, asked: &str) -> String {
        match self {
            Unusable::Unreadable(why) => {
                format!("it cannot be read as ELF ({why}), so is not the {asked} looked up")
            }
            Unusable::NoBuildId => format!("its build-id is missing, not the {asked} looked up"),
            Unusable::OtherBuildId(id) => {
                format!(
                    "its build-id is {}, not the {asked} looked up",
                    build_id_hex(id)
                )
            }
        }
    }
}

/// Whether `file`, a download of ours, is an ELF file whose build-id is `build_id`; why not,
/// for the warning that names where it came from.
fn check(file: &File, build_id: &[u8]) -> Result<(), Unusable> {
    let elf = ElfFile::map(file).map_err(|e| Unusable::Unreadable(e.to_string()))?;
    match elf.build_id() {
        Some(id) if id == build_id => Ok(()),
        Some(id) => Err(Unusable::OtherBuildId(id.to_vec())),
        None => Err(Unusable::NoBuildId),
    }
}

impl Cache {
    pub(super) fn new(dir: PathBuf) -> Self {
        Cache { dir }
    }

    fn entry(&self, build_id: &str) -> PathBuf {
        self.dir.join(build_id).join("debuginfo")
    }

    /// What the entry of `hex` (`build_id` in hex) holds.
    pub(super) fn lookup(&self, hex: &str, build_id: &[u8]) -> Cached {
        let path = self.entry(hex);
        let Ok(meta) = fs::metadata(&path) else {
            return Cached::Unknown;
        };
        if meta.len() > 0 {
            // Not ours to replace or remove when it is another build's.
            return if has_build_id(&path, build_id) {
                Cached::Found(path)
            } else {
                Cached::Unusable(path)
            };
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

    /// Writes `body` as the entry of `hex` (`build_id` in hex), whole and checked or not at
    /// all: into a temporary file beside it, renamed into place once complete and found to
    /// be the debug file of `build_id`, so that neither an interrupted download nor another
    /// file ever looks like that debug file. The temporary is removed on every other way out.
    pub(super) fn store(
        &self,
        hex: &str,
        build_id: &[u8],
        body: &mut dyn Read,
    ) -> io::Result<Stored> {
        let path = self.entry(hex);
        let dir = path.parent().unwrap_or(&self.dir);
        fs::create_dir_all(dir)?;
        let mut partial = tempfile::Builder::new()
            .prefix(".debuginfo.")
            .suffix(".part")
            .tempfile_in(dir)?;
        io::copy(body, partial.as_file_mut())?;
        partial.as_file_mut().flush()?;
        if let Err(why) = check(partial.as_file(), build_id) {
            return Ok(Stored::Unusable(why));
        }
        partial.persist(&path).map_err(|e| e.error)?;
        Ok(Stored::Kept(path))
    }

    /// Removes the directory of the entry of `build_id` when nothing is in it, as after a
    /// download that was not kept. Best effort: an empty directory misleads no one.
    pub(super) fn tidy(&self, build_id: &str) {
        let _ = fs::remove_dir(self.dir.join(build_id));
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

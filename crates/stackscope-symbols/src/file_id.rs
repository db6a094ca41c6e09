//! The identity of a file's content as the file system tells it: caches of parsed files are
//! keyed by it, so a binary rebuilt or replaced at the same path is read again.

use std::fs::{File, Metadata};
use std::io;
#[cfg(unix)]
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Device, inode, size and modification time of a file: a change in any means new content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: i64,
    mtime_nsec: i64,
}

impl FileId {
    #[cfg(unix)]
    pub fn of(meta: &Metadata) -> Self {
        FileId {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: meta.mtime(),
            mtime_nsec: meta.mtime_nsec(),
        }
    }

    /// Without stable file indexes in std off Unix, size and modification time alone.
    #[cfg(not(unix))]
    pub fn of(meta: &Metadata) -> Self {
        let since_epoch = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .unwrap_or_default();
        FileId {
            dev: 0,
            ino: 0,
            size: meta.len(),
            mtime: since_epoch.as_secs() as i64,
            mtime_nsec: i64::from(since_epoch.subsec_nanos()),
        }
    }

    /// The identity of an open file.
    pub fn of_file(file: &File) -> io::Result<Self> {
        Ok(Self::of(&file.metadata()?))
    }

    /// Opens the file at `path` with its identity, failing in the symbolizer's terms.
    pub(crate) fn open(path: &Path) -> Result<(File, Self), crate::SymbolError> {
        let read_err = |error| crate::SymbolError::Read {
            path: path.to_path_buf(),
            error,
        };
        let file = crate::foreign::open(path, crate::foreign::Kind::Binary)
            .map_err(|refusal| read_err(refusal.into()))?;
        let id = Self::of_file(&file).map_err(read_err)?;
        Ok((file, id))
    }

    /// The current identity of the file at `path`; fails where opening it would.
    pub fn of_path(path: &Path) -> io::Result<Self> {
        Self::of_file(&crate::foreign::open(path, crate::foreign::Kind::Binary)?)
    }
}

//! Where an output file's bytes go on Windows. A regular file, or a name not in use, is written
//! whole to a temporary beside it and renamed over the name (`MoveFileEx` with replace, through
//! `tempfile`), so a reader sees the old file or the new one, never half of one; anything else
//! (`NUL`, `CON`, a pipe) is opened and written in place.

use std::fs::OpenOptions;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use anyhow::{Context, Result};

/// A temporary beside `path` (a bare name's parent is empty: the current directory).
fn temporary_for(path: &Path) -> io::Result<tempfile::NamedTempFile> {
    tempfile::Builder::new()
        .prefix(".stackscope")
        .tempfile_in(path.parent().unwrap_or(Path::new("")))
}

/// Whether `path` is replaced through a temporary: a regular file or a name not in use.
fn replaced(path: &Path) -> bool {
    std::fs::metadata(path).map_or(true, |m| m.is_file())
}

/// Checks that `path` can be written by really trying, as [`write`] will.
pub fn check(path: &Path) -> Result<()> {
    let context = || format!("cannot write {}", path.display());
    if replaced(path) {
        temporary_for(path).with_context(context)?;
    } else {
        OpenOptions::new()
            .write(true)
            .open(path)
            .with_context(context)?;
    }
    Ok(())
}

/// Writes `path` with what `body` writes, as the module says.
pub fn write(path: &Path, body: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> Result<()> {
    let context = || format!("cannot write {}", path.display());
    if !replaced(path) {
        let mut out = BufWriter::new(
            OpenOptions::new()
                .write(true)
                .open(path)
                .with_context(context)?,
        );
        return body(&mut out)
            .and_then(|()| out.flush())
            .with_context(context);
    }
    let temporary = temporary_for(path).with_context(context)?;
    let mut out = BufWriter::new(temporary);
    body(&mut out).with_context(context)?;
    let temporary = out
        .into_inner()
        .map_err(|e| e.into_error())
        .with_context(context)?;
    temporary.as_file().sync_all().with_context(context)?;
    temporary
        .persist(path)
        .map_err(|e| e.error)
        .with_context(context)?;
    Ok(())
}

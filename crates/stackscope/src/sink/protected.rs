//! The kernel's protections of sticky world-writable directories such as `/tmp`
//! (`fs.protected_symlinks`, `fs.protected_regular`, `fs.protected_fifos`), applied where the
//! sink acts in the kernel's stead: it follows an output's links itself and replaces a regular
//! file by renaming onto it, and the kernel checks neither. Without them, a link another user
//! planted in `/tmp` would have root replace whatever file it points to.
//!
//! The rules are the kernel's own (`may_follow_link` and `may_create_in_sticky` in
//! `fs/namei.c`), with the settings read from `/proc/sys/fs`; a setting that cannot be read is
//! taken as on. The output is judged as if opened with `O_CREAT` by this process's user, as a
//! shell's `>` opens it.

use std::fs::Metadata;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use anyhow::{bail, Context, Result};

use super::directory_of;

/// `S_ISVTX`, the sticky bit (its libc type differs between systems).
const STICKY: u32 = 0o1000;
const WORLD_WRITABLE: u32 = 0o002;
const GROUP_WRITABLE: u32 = 0o020;

/// The kernel's settings, each 0 (off), 1 (world-writable directories) or 2 (group-writable
/// ones too, for regular files and FIFOs).
pub(super) struct Protections {
    symlinks: u8,
    regular: u8,
    fifos: u8,
}

impl Protections {
    pub(super) fn of_this_kernel() -> Protections {
        let setting = |name: &str| {
            std::fs::read_to_string(Path::new("/proc/sys/fs").join(name))
                .ok()
                .and_then(|text| text.trim().parse().ok())
                .unwrap_or(1)
        };
        Protections {
            symlinks: setting("protected_symlinks"),
            regular: setting("protected_regular"),
            fifos: setting("protected_fifos"),
        }
    }

    /// Refuses to follow `link` (of metadata `meta`), met while resolving the output `path`,
    /// where `fs.protected_symlinks` would: the link sits in a sticky world-writable directory
    /// and is owned by neither this user nor the directory's owner.
    pub(super) fn check_follow(&self, path: &Path, link: &Path, meta: &Metadata) -> Result<()> {
        if self.symlinks == 0 || meta.uid() == effective_uid() {
            return Ok(());
        }
        let dir = directory_of(link);
        let dir_meta =
            std::fs::metadata(dir).with_context(|| format!("cannot write {}", path.display()))?;
        let mode = dir_meta.mode();
        if mode & (STICKY | WORLD_WRITABLE) != STICKY | WORLD_WRITABLE
            || dir_meta.uid() == meta.uid()
        {
            return Ok(());
        }
        bail!(
            "cannot write {}: {} a symbolic link owned by uid {} in the sticky world-writable \
             directory {} (owned by uid {}), which fs.protected_symlinks forbids uid {} to follow: \
             Permission denied",
            path.display(),
            subject(path, link),
            meta.uid(),
            dir.display(),
            dir_meta.uid(),
            effective_uid()
        )
    }

    /// Refuses to write the existing `file` (of metadata `meta`, not a directory), the end of
    /// the output `path`, where opening it with `O_CREAT` would be refused: it sits in a
    /// sticky directory and is owned by neither this user nor the directory's owner, and the
    /// directory is world-writable (or group-writable, at setting 2). The kernel applies this to
    /// regular files per `fs.protected_regular`, to FIFOs per `fs.protected_fifos`, and to other
    /// files (devices) always.
    pub(super) fn check_create(&self, path: &Path, file: &Path, meta: &Metadata) -> Result<()> {
        let kind = meta.file_type();
        let (level, rule) = if kind.is_file() {
            (self.regular, "fs.protected_regular")
        } else if kind.is_fifo() {
            (self.fifos, "fs.protected_fifos")
        } else {
            (1, "the sticky directory's rule")
        };
        if level == 0 || meta.uid() == effective_uid() {
            return Ok(());
        }
        let dir = directory_of(file);
        let dir_meta =
            std::fs::metadata(dir).with_context(|| format!("cannot write {}", path.display()))?;
        let mode = dir_meta.mode();
        let writable_by_others = if mode & WORLD_WRITABLE != 0 {
            "world-writable"
        } else if mode & GROUP_WRITABLE != 0 && level >= 2 {
            "group-writable"
        } else {
            return Ok(());
        };
        if mode & STICKY == 0 || dir_meta.uid() == meta.uid() {
            return Ok(());
        }
        bail!(
            "cannot write {}: {} {} owned by uid {} in the sticky {writable_by_others} \
             directory {} (owned by uid {}), which {rule} forbids uid {} to open for writing: \
             Permission denied",
            path.display(),
            subject(path, file),
            stackscope_symbols::foreign::file_type_name(meta),
            meta.uid(),
            dir.display(),
            dir_meta.uid(),
            effective_uid()
        )
    }
}

/// How an error names what it refuses: `it is` when that is the output itself.
fn subject(path: &Path, what: &Path) -> String {
    if what == path {
        "it is".to_string()
    } else {
        format!("{} is", what.display())
    }
}

/// The user the kernel checks an open against (its fsuid, which follows the effective uid).
fn effective_uid() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

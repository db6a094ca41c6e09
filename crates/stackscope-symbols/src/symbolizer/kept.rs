//! The files parsed to name one binary's addresses, and how long they stay parsed: released as
//! soon as the binary is named (a recording names each binary once, at its end, and naming a
//! whole system then holds one binary's symbols at a time), or, for a live view that names a
//! few new addresses of the same binaries every refresh, kept for the binaries named last, so
//! that a binary met again is not parsed again.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use blazesym::symbolize::evict::{self, Evict};

use crate::elf::ElfFile;
use crate::foreign::{self, Kind};
use crate::mini_debuginfo::MiniDebugInfo;
use crate::FileId;

/// The files blazesym was handed to name one binary, each by a path that opens the very file
/// [`foreign::open`] checked (blazesym opens files by path itself), kept open until blazesym
/// lets them go; and the binary's MiniDebugInfo once extracted.
#[derive(Default)]
pub(super) struct Opened {
    /// The path asked for, the path handed to blazesym, and the open file.
    files: Vec<(PathBuf, PathBuf, File)>,
    mini_debuginfo: Option<Option<MiniDebugInfo>>,
}

impl Opened {
    /// The path to hand blazesym for the file at `path`, the same as before when it was
    /// opened before (blazesym keeps what it parsed by that path); `None` when it is refused.
    pub(super) fn open(&mut self, path: &Path) -> Option<PathBuf> {
        if let Some((_, handed, _)) = self.files.iter().find(|(asked, ..)| asked == path) {
            return Some(handed.clone());
        }
        let file = foreign::open(path, Kind::Binary).ok()?;
        #[cfg(target_os = "linux")]
        let handed = foreign::reopen_path(&file);
        // Elsewhere there is no path to an open file: blazesym opens the path checked.
        #[cfg(not(target_os = "linux"))]
        let handed = path.to_path_buf();
        self.files.push((path.to_path_buf(), handed.clone(), file));
        Some(handed)
    }

    /// The path of the decompressed MiniDebugInfo of the binary at `path`, extracted once.
    pub(super) fn mini_debuginfo(&mut self, path: &Path) -> Option<PathBuf> {
        let mini = self.mini_debuginfo.get_or_insert_with(|| {
            ElfFile::open(path)
                .ok()
                .and_then(|elf| MiniDebugInfo::extract(&elf, path))
        });
        mini.as_ref().map(|mini| mini.path().to_path_buf())
    }

    /// Lets blazesym drop what it parsed from these files, and closes them.
    pub(super) fn release(self, inner: &mut blazesym::symbolize::Symbolizer) {
        for (_, handed, _) in self.files {
            // Eviction only fails for a file that was never cached, which is fine.
            let _ = inner.evict(&Evict::Elf(evict::Elf::new(handed)));
        }
    }
}

/// The binaries whose files stay parsed between calls, at most `at_most` of them, the least
/// recently named let go first.
#[derive(Default)]
pub(super) struct Kept {
    at_most: usize,
    /// By the binary's path: its identity when opened, when it was last named, its files.
    binaries: HashMap<PathBuf, (FileId, u64, Opened)>,
    calls: u64,
}

impl Kept {
    pub(super) fn new(at_most: usize) -> Kept {
        Kept {
            at_most,
            ..Kept::default()
        }
    }

    /// The files opened before for the binary at `path`, if it is still the file `id` says;
    /// else none (a binary rebuilt at the same path is parsed anew).
    pub(super) fn take(
        &mut self,
        path: &Path,
        id: FileId,
        inner: &mut blazesym::symbolize::Symbolizer,
    ) -> Opened {
        match self.binaries.remove(path) {
            Some((kept_id, _, opened)) if kept_id == id => opened,
            Some((_, _, stale)) => {
                stale.release(inner);
                Opened::default()
            }
            None => Opened::default(),
        }
    }

    /// Keeps the files opened to name the binary at `path` (`id`), letting the least recently
    /// named binaries go beyond the bound; releases them at once when nothing is kept.
    pub(super) fn put_back(
        &mut self,
        path: &Path,
        id: FileId,
        opened: Opened,
        inner: &mut blazesym::symbolize::Symbolizer,
    ) {
        if self.at_most == 0 {
            opened.release(inner);
            return;
        }
        self.calls += 1;
        self.binaries
            .insert(path.to_path_buf(), (id, self.calls, opened));
        while self.binaries.len() > self.at_most {
            let oldest = self
                .binaries
                .iter()
                .min_by_key(|(_, (_, last, _))| *last)
                .map(|(path, _)| path.clone());
            let Some((_, _, opened)) = oldest.and_then(|path| self.binaries.remove(&path)) else {
                break;
            };
            opened.release(inner);
        }
    }

    /// How many binaries are kept parsed.
    pub(super) fn len(&self) -> usize {
        self.binaries.len()
    }
}

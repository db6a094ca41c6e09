//! Naming a binary's addresses from each of its sources, in order: its own DWARF, a separate
//! debug file, its symbol tables, its MiniDebugInfo, a fetched debug file; and where a function
//! no source names starts.

use std::path::Path;

use super::kept::Opened;
use super::{AddrKind, Symbolizer};
use crate::debug_file::DebugFile;
use crate::elf::{build_id_hex, ElfFile};
use crate::elf_info::ElfInfo;
use crate::foreign;
use crate::{SymFrame, SymbolError};

impl Symbolizer {
    /// `offsets` are FILE OFFSETS into the ELF file at `path` (what you get from a mapping:
    /// addr - mapping.start + mapping.offset); for a PE image, RVAs (what a mapping at its
    /// base with offset 0 gives), named as [`crate::pe`] says. Returns, for each offset, its frames OUTERMOST
    /// FIRST: the real function containing the address, then the functions inlined into it,
    /// the innermost last. An empty Vec means no symbol names it. Errors only when the file
    /// cannot be read at all (missing/unreadable/not ELF), with the path in the message.
    ///
    /// Names come from the first of these that names an address: the file's own DWARF; a
    /// separate debug file ([`DebugFiles::find`]: by `build_id`, else the file's own, under
    /// the debug directories, then by `.gnu_debuglink`); the file's symbol tables; its
    /// MiniDebugInfo (`.gnu_debugdata`); and, for a file whose addresses are still not all
    /// named, a debug file fetched by build-id, whose names then replace the symbol tables'.
    ///
    /// What was parsed for the file (symbol tables, DWARF, its debug file) is released on
    /// return, so that naming a whole system holds one file's symbols at a time: pass all
    /// of a file's offsets in one call. A symbolizer [`keeping`](Symbolizer::keeping) files
    /// keeps them parsed for the next call instead.
    pub fn symbolize_file(
        &mut self,
        path: &Path,
        build_id: Option<&[u8]>,
        offsets: &[u64],
    ) -> Result<Vec<Vec<SymFrame>>, SymbolError> {
        if crate::pe::is_pe(path) {
            return self.symbolize_pe(path, offsets);
        }
        let info = self.elf_info(path)?;
        let mut opened = self.kept.take(path, info.id, &mut self.inner);
        let result = self.symbolize_file_cached(path, &info, build_id, offsets, &mut opened);
        self.kept.put_back(path, info.id, opened, &mut self.inner);
        result
    }

    /// [`Symbolizer::symbolize_file`] of the binary `info` describes, opening what blazesym
    /// parses through `opened`.
    fn symbolize_file_cached(
        &mut self,
        path: &Path,
        info: &ElfInfo,
        build_id: Option<&[u8]>,
        offsets: &[u64],
        opened: &mut Opened,
    ) -> Result<Vec<Vec<SymFrame>>, SymbolError> {
        let mut out = vec![Vec::new(); offsets.len()];
        if offsets.is_empty() {
            return Ok(out);
        }
        if let (Some(mapped), Some(own)) = (build_id, info.build_id.as_deref()) {
            if mapped != own {
                // Replaced since it was mapped (rebuilt, or swapped by its owner): its names
                // are another build's.
                foreign::mismatched(
                    path,
                    &format!(
                        "its build-id is {}, not the {} the process mapped",
                        build_id_hex(own),
                        build_id_hex(mapped)
                    ),
                );
                return Ok(out);
            }
        }
        if !info.has_dwarf {
            if let Some(debug_file) = self.local_debug_file(path, info, build_id) {
                let file = Separate::DebugFile(&debug_file.path);
                self.name_from_separate(file, info, offsets, &mut out, opened);
            }
        }
        self.name_from_binary(path, info.has_dwarf, offsets, &mut out, opened)?;
        let unnamed = |out: &[Vec<SymFrame>]| out.iter().any(Vec::is_empty);
        if info.has_mini_debuginfo && unnamed(&out) {
            if let Some(mini) = opened.mini_debuginfo(path) {
                let file = Separate::MiniDebugInfo(&mini);
                self.name_from_separate(file, info, offsets, &mut out, opened);
            }
        }
        if info.has_dwarf || !unnamed(&out) {
            return Ok(out);
        }
        let build_id = build_id.or(info.build_id.as_deref());
        if let Some(fetched) = build_id.and_then(|id| self.fetch(id)) {
            let file = Separate::DebugFile(&fetched.path);
            self.name_from_separate(file, info, offsets, &mut out, opened);
        }
        Ok(out)
    }

    /// The local separate debug file of the binary at `path`, looked up once per binary.
    fn local_debug_file(
        &mut self,
        path: &Path,
        info: &ElfInfo,
        build_id: Option<&[u8]>,
    ) -> Option<DebugFile> {
        let debug_files = &self.debug_files;
        self.found
            .entry((info.id, build_id.map(<[u8]>::to_vec)))
            .or_insert_with(|| debug_files.find(path, build_id))
            .clone()
    }

    /// The fetcher's debug file for `build_id`, asked once per build-id.
    fn fetch(&mut self, build_id: &[u8]) -> Option<DebugFile> {
        if !self.debug_files.has_fetcher() {
            return None;
        }
        let debug_files = &self.debug_files;
        self.fetched
            .entry(build_id.to_vec())
            .or_insert_with(|| debug_files.fetch(build_id))
            .clone()
    }

    /// Names `offsets` of the binary `info` describes from `file`: a debug file's names
    /// replace what `out` holds, MiniDebugInfo's only fill what it lacks.
    fn name_from_separate(
        &self,
        file: Separate<'_>,
        info: &ElfInfo,
        offsets: &[u64],
        out: &mut [Vec<SymFrame>],
        opened: &mut Opened,
    ) {
        let (path, dwarf) = match file {
            Separate::DebugFile(path) => (path, true),
            Separate::MiniDebugInfo(path) => (path, false),
        };
        // Neither has loadable contents, so they are addressed by virtual address, which
        // only the binary's program headers can give.
        let (indices, vaddrs): (Vec<usize>, Vec<u64>) = offsets
            .iter()
            .enumerate()
            .filter(|(i, _)| dwarf || out[*i].is_empty())
            .filter_map(|(i, &off)| info.file_offset_to_vaddr(off).map(|v| (i, v)))
            .unzip();
        if vaddrs.is_empty() {
            return;
        }
        let Some(path) = opened.open(path) else {
            return;
        };
        let dwarf = dwarf && self.debug_files.links_are_files(&path);
        // A broken debug file must not cost the symbols the binary itself has.
        if let Ok(found) = self.symbolize_elf(&path, dwarf, AddrKind::Virtual, &vaddrs) {
            for (i, frames) in indices.into_iter().zip(found) {
                if !frames.is_empty() {
                    out[i] = frames;
                }
            }
        }
    }

    /// Names the offsets `out` holds nothing for from the binary at `path` itself, with its
    /// DWARF when `dwarf`.
    fn name_from_binary(
        &self,
        path: &Path,
        dwarf: bool,
        offsets: &[u64],
        out: &mut [Vec<SymFrame>],
        opened: &mut Opened,
    ) -> Result<(), SymbolError> {
        let (indices, remaining): (Vec<usize>, Vec<u64>) = offsets
            .iter()
            .enumerate()
            .filter(|(i, _)| out[*i].is_empty())
            .map(|(i, &off)| (i, off))
            .unzip();
        if remaining.is_empty() {
            return Ok(());
        }
        let Some(reopened) = opened.open(path) else {
            return Err(SymbolError::NotElf {
                path: path.to_path_buf(),
            });
        };
        let dwarf = dwarf && self.debug_files.links_are_files(&reopened);
        let syms = match self.symbolize_elf(&reopened, dwarf, AddrKind::FileOffset, &remaining) {
            Ok(syms) => Ok(syms),
            // Debug data can be unusable while the symbol table is fine.
            Err(_) if dwarf => {
                self.symbolize_elf(&reopened, false, AddrKind::FileOffset, &remaining)
            }
            Err(e) => Err(e),
        }
        .map_err(|e| SymbolError::Parse {
            path: path.to_path_buf(),
            message: format!("{e:#}"),
        })?;
        for (i, frames) in indices.into_iter().zip(syms) {
            out[i] = frames;
        }
        Ok(())
    }

    /// Where to name `offsets` (file offsets into the ELF file at `path`; for a PE image,
    /// RVAs, whose function starts its `.pdata` gives) that no symbol names: for each, the ELF virtual address (as `objdump` and `addr2line` take it) of the
    /// start of the function holding it, as the unwind tables (`.eh_frame`) tell it, so that
    /// one function's addresses are one name and two functions two; where no unwind entry
    /// covers it, its own virtual address; in a file that cannot be read, or outside its
    /// loadable segments, the offset itself.
    pub fn function_starts(&mut self, path: &Path, offsets: &[u64]) -> Vec<u64> {
        if crate::pe::is_pe(path) {
            return self.pe_function_starts(path, offsets);
        }
        let Ok(info) = self.elf_info(path) else {
            return offsets.to_vec();
        };
        let vaddrs: Vec<Option<u64>> = offsets
            .iter()
            .map(|&off| info.file_offset_to_vaddr(off))
            .collect();
        let known: Vec<u64> = vaddrs.iter().flatten().copied().collect();
        let mut starts = match ElfFile::open(path) {
            Ok(elf) => elf.function_starts(&known).into_iter(),
            Err(_) => vec![None; known.len()].into_iter(),
        };
        offsets
            .iter()
            .zip(vaddrs)
            .map(|(&off, vaddr)| match vaddr {
                Some(vaddr) => starts.next().flatten().unwrap_or(vaddr),
                None => off,
            })
            .collect()
    }

    /// The ELF virtual address of the program entry the file at `path` states (`e_entry`), as
    /// [`function_starts`](Self::function_starts) numbers addresses: the function every stack
    /// of the program starts in, named or not.
    pub fn entry_point(&mut self, path: &Path) -> Option<u64> {
        self.elf_info(path).ok()?.entry
    }
}

/// A file that names a binary's addresses by virtual address.
#[derive(Clone, Copy)]
enum Separate<'a> {
    /// A separate debug file: DWARF and symbol tables.
    DebugFile(&'a Path),
    /// The binary's decompressed `.gnu_debugdata`: a symbol table.
    MiniDebugInfo(&'a Path),
}

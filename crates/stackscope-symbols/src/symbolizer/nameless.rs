//! Addresses whose nearest symbol has no name. Assemblers leave nameless local symbols inside
//! functions (riscv64's mark what the debug sections' relocations point at, so they appear
//! with `-g`), and a lookup that takes the nearest symbol below an address then names it with
//! nothing, although the function symbol covering it names it.

use std::path::Path;

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::Input;

use super::{AddrKind, Symbolizer};
use crate::elf::{ElfFile, SymbolTable};
use crate::sym_frame::display_name;
use crate::SymFrame;

impl Symbolizer {
    /// Renames the outermost frame of each `out[i]` for `i` in `nameless` (`addrs[i]` of
    /// `kind` in the ELF file at `path`) after the innermost sized function symbol covering
    /// the address, keeping the frame's file and line. The name is what the symbol table
    /// gives for that function's start, so it is demangled as every other name is.
    pub(super) fn name_nameless(
        &self,
        path: &Path,
        kind: AddrKind,
        addrs: &[u64],
        nameless: &[usize],
        out: &mut [Vec<SymFrame>],
    ) {
        let Ok(elf) = ElfFile::open(path) else {
            return;
        };
        let Some(functions) = elf
            .functions(SymbolTable::Static)
            .or_else(|| elf.functions(SymbolTable::Dynamic))
        else {
            return;
        };
        let (indices, starts): (Vec<usize>, Vec<u64>) = nameless
            .iter()
            .filter_map(|&i| {
                let vaddr = match kind {
                    AddrKind::Virtual => addrs[i],
                    AddrKind::FileOffset => {
                        elf.segments().iter().find_map(|s| s.vaddr_of(addrs[i]))?
                    }
                };
                // Nested extents (a function and an alias inside it) name by the innermost.
                let start = functions
                    .iter()
                    .filter(|f| vaddr.checked_sub(f.address).is_some_and(|d| d < f.size))
                    .map(|f| f.address)
                    .max()?;
                Some((i, start))
            })
            .unzip();
        if starts.is_empty() {
            return;
        }
        let mut source = Elf::new(path);
        source.debug_syms = false;
        let Ok(syms) = self
            .inner
            .symbolize(&Source::Elf(source), Input::VirtOffset(&starts))
        else {
            return;
        };
        for (i, sym) in indices.into_iter().zip(syms) {
            let name = sym.as_sym().map(|s| &*s.name).filter(|n| !n.is_empty());
            if let (Some(name), Some(frame)) = (name, out[i].first_mut()) {
                frame.name = display_name(name);
            }
        }
    }
}

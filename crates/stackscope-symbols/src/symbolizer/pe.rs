//! Naming a PE image's RVAs: from its PDB, else from the DWARF inside it; and where a
//! function no source names starts, from its unwind table.

use std::path::{Path, PathBuf};

use blazesym::symbolize::evict::{self, Evict};
use memmap2::Mmap;

use super::{AddrKind, Symbolizer};
use crate::pe::dwarf::DwarfAsElf;
use crate::pe::{pdb, PeInfo};
use crate::{SymFrame, SymbolError};

impl Symbolizer {
    /// [`Symbolizer::symbolize_file`] for a PE image: `rvas` are offsets from its base. Its
    /// PDB names them when one matching its CodeView record is found
    /// ([`crate::pe::pdb`]'s lookup); the DWARF inside the image names those still unnamed.
    pub(super) fn symbolize_pe(
        &mut self,
        path: &Path,
        rvas: &[u64],
    ) -> Result<Vec<Vec<SymFrame>>, SymbolError> {
        let info = PeInfo::inspect(path)?;
        let mut out = vec![Vec::new(); rvas.len()];
        if rvas.is_empty() {
            return Ok(out);
        }
        if let Some(pdb_path) = self.pdb_of(path, &info) {
            // A PDB that cannot be read costs its names, not the DWARF's.
            if let Ok(named) = pdb::name_rvas(&pdb_path, rvas) {
                out = named;
            }
        }
        if info.has_dwarf && out.iter().any(Vec::is_empty) {
            self.name_from_pe_dwarf(path, &info, rvas, &mut out);
        }
        Ok(out)
    }

    /// The matching PDB of the image at `path`, looked up once per image.
    fn pdb_of(&mut self, path: &Path, info: &PeInfo) -> Option<PathBuf> {
        let codeview = info.codeview.as_ref()?;
        let symbol_path = &self.symbol_path;
        self.pdbs
            .entry(info.id)
            .or_insert_with(|| symbol_path.find(path, codeview))
            .clone()
    }

    /// Names the unnamed `rvas` of the image at `path` from its DWARF, read as an ELF debug
    /// file's is.
    fn name_from_pe_dwarf(
        &mut self,
        path: &Path,
        info: &PeInfo,
        rvas: &[u64],
        out: &mut [Vec<SymFrame>],
    ) {
        let Ok(file) = crate::foreign::open(path, crate::foreign::Kind::Binary) else {
            return;
        };
        // SAFETY: read-only private mapping; a file changed under us only gives wrong names.
        let Ok(map) = (unsafe { Mmap::map(&file) }) else {
            return;
        };
        let Some(elf) = DwarfAsElf::extract(&map) else {
            return;
        };
        let (indices, vaddrs): (Vec<usize>, Vec<u64>) = rvas
            .iter()
            .enumerate()
            .filter(|(i, _)| out[*i].is_empty())
            .filter_map(|(i, &rva)| info.image_base.checked_add(rva).map(|v| (i, v)))
            .unzip();
        let named = self.symbolize_elf(elf.path(), true, AddrKind::Virtual, &vaddrs);
        // Eviction only fails for a file that was never cached, which is fine.
        let _ = self
            .inner
            .evict(&Evict::Elf(evict::Elf::new(elf.path().to_path_buf())));
        if let Ok(named) = named {
            for (i, frames) in indices.into_iter().zip(named) {
                out[i] = frames;
            }
        }
    }

    /// [`Symbolizer::function_starts`] for a PE image: the RVA of the start of the function
    /// its unwind table (`.pdata`) puts each RVA in, else the RVA itself.
    pub(super) fn pe_function_starts(&self, path: &Path, rvas: &[u64]) -> Vec<u64> {
        let Ok(info) = PeInfo::inspect(path) else {
            return rvas.to_vec();
        };
        rvas.iter()
            .map(|&rva| {
                u32::try_from(rva)
                    .ok()
                    .and_then(|rva| info.function_start(rva))
                    .map_or(rva, u64::from)
            })
            .collect()
    }
}

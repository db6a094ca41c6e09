//! The [`Symbolizer`]: blazesym plus the lookups it does not do the way stackscope needs
//! (separate debug files in [`crate::debug_file`]'s order, perf maps from a configurable
//! directory and jitdumps, vDSO offsets), and conversion to outermost-first [`SymFrame`] lists.

mod binary;
mod kept;
mod nameless;
mod pe;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use blazesym::symbolize::source::{Elf, Kernel, Process, Source};
use blazesym::symbolize::{CodeInfo, Input, Sym, Symbolized};
use blazesym::{MaybeDefault, Pid};

use crate::debug_file::{DebugFile, DebugFiles};
use crate::elf_info::ElfInfo;
use crate::jitdump::JitDump;
use crate::pe::pdb::SymbolPath;
use crate::perf_map::PerfMap;
use crate::sym_frame::{display_name, strip_rust_hash, sym_frame};
use crate::{FileId, SymFrame, SymbolError};
use kept::Kept;

const DEFAULT_PERF_MAP_DIR: &str = "/tmp";
const KALLSYMS: &str = "/proc/kallsyms";

/// Resolves addresses to frames, caching parsed files across calls. Not `Send`: blazesym's
/// caches are single-threaded, so keep one per thread.
pub struct Symbolizer {
    inner: blazesym::symbolize::Symbolizer,
    debug_files: DebugFiles,
    /// The local debug file of each binary (and build-id it was asked with) looked up:
    /// checking a debug link's CRC reads the whole debug file, so once.
    found: HashMap<(FileId, Option<Vec<u8>>), Option<DebugFile>>,
    /// What the fetcher gave for each build-id asked.
    fetched: HashMap<Vec<u8>, Option<DebugFile>>,
    perf_map_dir: PathBuf,
    elf_infos: HashMap<PathBuf, Rc<ElfInfo>>,
    perf_maps: HashMap<u32, PerfMap>,
    jitdumps: HashMap<u32, JitDump>,
    /// Where PE images' PDBs are looked up beyond their recorded path and directory.
    symbol_path: SymbolPath,
    /// The matching PDB found for each PE image.
    pdbs: HashMap<FileId, Option<PathBuf>>,
    /// The binaries whose parsed files outlive a call.
    kept: Kept,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    /// Inlined functions, demangling and source locations on; separate debug files are
    /// looked up as [`DebugFiles::from_env`] says.
    pub fn new() -> Self {
        Self::with_debug_files(DebugFiles::from_env())
    }

    /// Like [`Symbolizer::new`], looking up separate debug files in `debug_dirs` instead, and
    /// fetching none.
    pub fn with_debug_dirs(debug_dirs: Vec<PathBuf>) -> Self {
        Self::with_debug_files(DebugFiles::new(debug_dirs))
    }

    /// Like [`Symbolizer::new`], looking up separate debug files with `debug_files`; PDBs
    /// also in `_NT_SYMBOL_PATH`'s places.
    pub fn with_debug_files(debug_files: DebugFiles) -> Self {
        let inner = blazesym::symbolize::Symbolizer::builder()
            .enable_code_info(true)
            .enable_inlined_fns(true)
            .enable_demangling(true)
            // For the supplementary files (dwz's `.gnu_debugaltlink`) debug files refer to.
            .set_debug_dirs(Some(debug_files.dirs()))
            .build();
        Self {
            inner,
            debug_files,
            found: HashMap::new(),
            fetched: HashMap::new(),
            perf_map_dir: PathBuf::from(DEFAULT_PERF_MAP_DIR),
            elf_infos: HashMap::new(),
            perf_maps: HashMap::new(),
            jitdumps: HashMap::new(),
            symbol_path: SymbolPath::from_env(),
            pdbs: HashMap::new(),
            kept: Kept::new(0),
        }
    }

    /// Keeps the files parsed for the last `binaries` binaries named (their symbol tables,
    /// DWARF and debug files) between calls, instead of releasing each binary's on return:
    /// for a live view, which names a few new addresses of the same binaries over and over.
    pub fn keeping(mut self, binaries: usize) -> Self {
        self.kept = Kept::new(binaries);
        self
    }

    /// How many binaries are kept parsed between calls.
    pub fn binaries_kept(&self) -> usize {
        self.kept.len()
    }

    /// Looks up PE images' PDBs in `symbol_path`'s places (after their recorded path and
    /// their directory) instead of `_NT_SYMBOL_PATH`'s.
    pub fn with_symbol_path(mut self, symbol_path: SymbolPath) -> Self {
        self.symbol_path = symbol_path;
        self.pdbs.clear();
        self
    }

    /// Reads perf maps as `dir/perf-PID.map`, and jitdumps no process mapped as
    /// `dir/jit-PID.dump`, instead of from `/tmp`.
    pub fn with_perf_map_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.perf_map_dir = dir.into();
        self.perf_maps.clear();
        self.jitdumps.clear();
        self
    }

    /// Kernel addresses via `/proc/kallsyms` (read once). `None` = unknown.
    pub fn symbolize_kernel(&mut self, addrs: &[u64]) -> Vec<Option<SymFrame>> {
        let source = Source::Kernel(Kernel {
            kallsyms: MaybeDefault::Some(PathBuf::from(KALLSYMS)),
            vmlinux: MaybeDefault::None,
            // Only matters for vmlinux; kallsyms already holds randomized addresses.
            kaslr_offset: Some(0),
            debug_syms: false,
            ..Kernel::default()
        });
        match self.inner.symbolize(&source, Input::AbsAddr(addrs)) {
            Ok(syms) => syms
                .into_iter()
                .map(|sym| frames(sym).into_iter().next())
                .collect(),
            Err(_) => vec![None; addrs.len()],
        }
    }

    /// JIT code of process `pid`: from its jitdump (names, and source lines where it has debug
    /// info), at `jitdump` where the process mapped one, else `/tmp/jit-PID.dump`; then from
    /// `/tmp/perf-PID.map` (`START SIZE name` lines, hex START and SIZE). Each file is read
    /// once per pid; a missing one names nothing.
    pub fn symbolize_jit(
        &mut self,
        pid: u32,
        jitdump: Option<&Path>,
        addrs: &[u64],
    ) -> Vec<Option<SymFrame>> {
        let dir = &self.perf_map_dir;
        let dump = self.jitdumps.entry(pid).or_insert_with(|| match jitdump {
            Some(path) => JitDump::read(path),
            None => JitDump::read(&dir.join(format!("jit-{pid}.dump"))),
        });
        let map = self
            .perf_maps
            .entry(pid)
            .or_insert_with(|| PerfMap::read(&dir.join(format!("perf-{pid}.map"))));
        addrs
            .iter()
            .map(|&addr| {
                if let Some(function) = dump.lookup(addr) {
                    let (file, line) = function.location.unzip();
                    return Some(sym_frame(
                        function.name,
                        file.map(str::to_string),
                        line,
                        false,
                    ));
                }
                map.lookup(addr).map(|name| SymFrame {
                    name: strip_rust_hash(name).to_string(),
                    file: None,
                    line: None,
                    inlined: false,
                })
            })
            .collect()
    }

    /// The vDSO: symbolizes offsets into the vDSO image. The image is the same in every
    /// process of this kernel, so our own copy (at `getauxval(AT_SYSINFO_EHDR)`) is used.
    pub fn symbolize_vdso(&mut self, offsets: &[u64]) -> Vec<Vec<SymFrame>> {
        let mut out = vec![Vec::new(); offsets.len()];
        // SAFETY: getauxval only reads the auxiliary vector.
        #[cfg(target_os = "linux")]
        let base = unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) };
        // Only Linux maps a vDSO.
        #[cfg(not(target_os = "linux"))]
        let base: u64 = 0;
        if base == 0 {
            return out;
        }
        let (indices, addrs): (Vec<usize>, Vec<u64>) = offsets
            .iter()
            .enumerate()
            .filter_map(|(i, &off)| base.checked_add(off).map(|a| (i, a)))
            .unzip();
        let mut process = Process::new(Pid::Slf);
        process.perf_map = false;
        process.map_files = false;
        process.debug_syms = false;
        process.vdso = true;
        if let Ok(syms) = self
            .inner
            .symbolize(&Source::Process(process), Input::AbsAddr(&addrs))
        {
            for (i, sym) in indices.into_iter().zip(syms) {
                // Outside the image the process source reports whatever else is mapped there.
                if sym.as_sym().and_then(|s| s.module.as_deref()) == Some("[vdso]".as_ref()) {
                    out[i] = frames(sym);
                }
            }
        }
        out
    }

    fn elf_info(&mut self, path: &Path) -> Result<Rc<ElfInfo>, SymbolError> {
        if let Some(info) = self.elf_infos.get(path) {
            if FileId::of_path(path).ok() == Some(info.id) {
                return Ok(Rc::clone(info));
            }
        }
        let info = Rc::new(ElfInfo::inspect(path)?);
        self.elf_infos.insert(path.to_path_buf(), Rc::clone(&info));
        Ok(info)
    }

    /// Symbolizes `addrs` (of `kind`) in the ELF file at `path`, with DWARF
    /// when `debug_syms`.
    fn symbolize_elf(
        &self,
        path: &Path,
        debug_syms: bool,
        kind: AddrKind,
        addrs: &[u64],
    ) -> Result<Vec<Vec<SymFrame>>, blazesym::Error> {
        let source = |debug_syms| {
            let mut elf = Elf::new(path);
            elf.debug_syms = debug_syms;
            Source::Elf(elf)
        };
        let syms = self
            .inner
            .symbolize(&source(debug_syms), kind.input(addrs))?;
        let starts: Vec<Option<u64>> = syms.iter().map(|s| s.as_sym().map(|s| s.addr)).collect();
        let nameless: Vec<usize> = syms
            .iter()
            .enumerate()
            .filter(|(_, s)| s.as_sym().is_some_and(|s| s.name.is_empty()))
            .map(|(i, _)| i)
            .collect();
        let mut out: Vec<Vec<SymFrame>> = syms.into_iter().map(frames).collect();
        if !nameless.is_empty() {
            self.name_nameless(path, kind, addrs, &nameless, &mut out);
        }
        if !debug_syms {
            return Ok(out);
        }

        // DWARF without linkage names (rustc's line-tables-only) names functions without
        // their path ("outer_work" for "app::outer_work"); the symbol table has the full name.
        let (unqualified, unqualified_addrs): (Vec<usize>, Vec<u64>) = out
            .iter()
            .enumerate()
            .filter(|(_, frames)| frames.first().is_some_and(|f| !f.name.contains("::")))
            .map(|(i, _)| (i, addrs[i]))
            .unzip();
        if unqualified.is_empty() {
            return Ok(out);
        }
        if let Ok(syms) = self
            .inner
            .symbolize(&source(false), kind.input(&unqualified_addrs))
        {
            for (i, sym) in unqualified.into_iter().zip(syms) {
                let Some(sym) = sym.as_sym() else { continue };
                // Same start address: the same function, not a neighbouring symbol.
                if Some(sym.addr) == starts[i] && sym.name.contains("::") {
                    out[i][0].name = display_name(&sym.name);
                }
            }
        }
        Ok(out)
    }
}

/// What the numbers given to blazesym for an ELF file are.
#[derive(Debug, Clone, Copy)]
pub(crate) enum AddrKind {
    FileOffset,
    /// ELF virtual addresses (`p_vaddr` based), as a separate debug file is indexed by.
    Virtual,
}

impl AddrKind {
    fn input(self, addrs: &[u64]) -> Input<&[u64]> {
        match self {
            Self::FileOffset => Input::FileOffset(addrs),
            Self::Virtual => Input::VirtOffset(addrs),
        }
    }
}

/// blazesym's inlined functions are already ordered from the outside in (the first one is
/// inlined directly into the real function), which is our order too. Each frame's location is
/// where execution is inside that function: for all but the innermost, the call site of the
/// next one.
fn frames(symbolized: Symbolized<'_>) -> Vec<SymFrame> {
    let Some(sym) = symbolized.into_sym() else {
        return Vec::new();
    };
    let Sym {
        name,
        code_info,
        inlined,
        ..
    } = sym;
    let mut frames = Vec::with_capacity(1 + inlined.len());
    let (file, line) = location(code_info.as_deref());
    frames.push(sym_frame(&name, file, line, false));
    for inlined_fn in inlined.iter() {
        let (file, line) = location(inlined_fn.code_info.as_ref());
        frames.push(sym_frame(&inlined_fn.name, file, line, true));
    }
    frames
}

fn location(code_info: Option<&CodeInfo<'_>>) -> (Option<String>, Option<u32>) {
    match code_info {
        Some(info) => (
            Some(info.to_path().to_string_lossy().into_owned()),
            info.line,
        ),
        None => (None, None),
    }
}

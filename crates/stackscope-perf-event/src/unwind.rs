//! User-stack unwinding: turns a sample's registers and copied stack memory into the code
//! addresses of its call stack, leaf first, with DWARF CFI (`.eh_frame`, `.debug_frame`) from
//! the mapped files and a frame-pointer fallback where there is none. The walk itself is
//! `stackscope_stacks::walk`, for the architecture the sample's registers are of; this module
//! reads its words from the copied stack bytes.
//!
//! Owns the per-process unwinders (rebuilt when a process's mappings change) and the
//! parsed unwind sections of the files they map, shared between processes. A file no live
//! process maps is kept only while it is among the [`IDLE_FILES`] most recently used, so
//! memory follows what runs now rather than everything that ever ran.

mod live;
pub(crate) mod roots;
#[cfg(test)]
mod tests;

use std::collections::{BTreeSet, HashMap};
use std::convert::Infallible;

use std::ops::Range;

use std::path::Path;
use std::sync::Arc;

use stackscope_process::maps::{open_mapped_file, own_vdso, Mapping};
use stackscope_stacks::arch::{self, Arch, Regs, WalkCache};
use stackscope_stacks::module::ModuleFile;
pub use stackscope_stacks::walk::MAX_FRAMES;
use stackscope_stacks::walk::{Code, Leaf, Stop, Trail, Unread, WalkEnd};
use stackscope_stacks::AddressSpace;
use stackscope_symbols::FileId;

/// Parsed files kept after the last process mapping them is forgotten: enough that a program
/// started again and again (a build's compiler, a shell loop's commands) is not re-read each
/// time, few enough that a whole-system recording does not hold every binary it ever saw.
pub const IDLE_FILES: usize = 32;

/// The unwinder of one process, built from its mappings.
struct ProcessUnwinder {
    /// The generation of the address space it was built from.
    built_from: u64,
    /// The rules of the process's files, for the architecture its samples' registers are of.
    unwinder: arch::Unwinder,
    /// The address ranges the unwinder has tables for, sorted: other mapped code is walked
    /// by frame pointers alone.
    tabled: Vec<Range<u64>>,
    /// The mapped files without tables, with their load bias: the walk reads the code at a
    /// leaf there, whose return address may still be in a link register.
    untabled: Vec<(Range<u64>, u64, Arc<ModuleFile>)>,
    /// The files the unwinder was built from: held so that the cache knows they are in use.
    _files: Vec<Arc<ModuleFile>>,
}

/// One entry of the file cache.
struct CachedFile {
    /// `None` for a file that is not readable ELF.
    file: Option<Arc<ModuleFile>>,
    /// [`ProcessUnwinders::clock`] when a process unwinder last took this file.
    last_used: u64,
}

impl CachedFile {
    /// True when no process unwinder holds the file.
    fn idle(&self) -> bool {
        self.file.as_ref().is_none_or(|f| Arc::strong_count(f) == 1)
    }
}

/// Unwinds user stacks of any number of processes: one [`ProcessUnwinder`] per process, and
/// the parsed files they share.
pub struct ProcessUnwinders {
    /// The walk's rule caches; keyed by each process unwinder's module generation, so one
    /// cache serves all processes.
    cache: WalkCache,
    processes: HashMap<u32, ProcessUnwinder>,
    /// Parsed files, bounded by [`ProcessUnwinders::trim`].
    files: HashMap<FileId, CachedFile>,
    /// Counts file look-ups, to order idle files by last use.
    clock: u64,
    without_unwind_info: BTreeSet<Arc<str>>,
}

impl Default for ProcessUnwinders {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcessUnwinders {
    pub fn new() -> Self {
        ProcessUnwinders {
            cache: WalkCache::default(),
            processes: HashMap::new(),
            files: HashMap::new(),
            clock: 0,
            without_unwind_info: BTreeSet::new(),
        }
    }

    /// Unwinds one sample. `stack` is the copied user stack memory starting at `regs.sp`.
    /// Pushes *lookup addresses* into `out.addrs`, leaf first: the first is `regs.pc`; each
    /// following one is a return address minus 1 (so it falls inside the call instruction,
    /// which is what symbolization and inlining need), with each frame's stack pointer in
    /// `out.sps`. `out` is cleared first.
    /// Per-process state (the unwinder with its modules) is (re)built from `maps` when
    /// `maps.generation()` changed since the last call for this pid, or the registers are of
    /// another architecture than it was built for.
    pub fn unwind(
        &mut self,
        pid: u32,
        maps: &AddressSpace,
        regs: Regs,
        stack: &[u8],
        out: &mut Trail,
    ) -> WalkEnd {
        out.addrs.clear();
        out.sps.clear();
        let key = maps.generation();
        let built = self.processes.get(&pid);
        if built.map(|p| (p.built_from, p.unwinder.arch())) != Some((key, regs.arch)) {
            let process = self.build(pid, maps, (key, regs.arch));
            self.processes.insert(pid, process);
            self.trim();
        }
        let unmapped = WalkEnd::Stopped {
            module: None,
            why: Some(Stop::Unmapped),
        };
        let Some(process) = self.processes.get(&pid) else {
            return unmapped;
        };
        if maps.find(regs.pc).is_none() {
            out.addrs.push(regs.pc);
            out.sps.push(regs.sp);
            return unmapped;
        }
        walk(process, &mut self.cache, maps, regs, stack, out)
    }

    /// Drops per-process state (the process exited or exec'd).
    pub fn forget(&mut self, pid: u32) {
        if self.processes.remove(&pid).is_some() {
            self.trim();
        }
    }

    /// Number of parsed files held (in use or idle), for tests of the cache bound.
    pub fn cached_files(&self) -> usize {
        self.files.len()
    }

    /// Drops the least recently used idle files beyond [`IDLE_FILES`].
    fn trim(&mut self) {
        let mut idle: Vec<(u64, FileId)> = self
            .files
            .iter()
            .filter(|(_, f)| f.idle())
            .map(|(key, f)| (f.last_used, *key))
            .collect();
        let Some(excess) = idle.len().checked_sub(IDLE_FILES).filter(|&n| n > 0) else {
            return;
        };
        idle.select_nth_unstable_by_key(excess - 1, |&(last_used, _)| last_used);
        for (_, key) in &idle[..excess] {
            self.files.remove(key);
        }
    }

    /// Modules (paths) seen in mappings that have neither .eh_frame nor .debug_frame, so the
    /// summary can say "N binaries have no unwind info: build with debug info or
    /// -C force-frame-pointers".
    pub fn modules_without_unwind_info(&self) -> Vec<Arc<str>> {
        self.without_unwind_info.iter().cloned().collect()
    }

    /// An unwinder for `arch` holding one module per executable file mapping with CFI.
    /// Mappings without (anonymous/JIT code, files without CFI, of another architecture or
    /// that cannot be read) get no module, so the walk falls back to frame pointers there.
    fn build(
        &mut self,
        pid: u32,
        maps: &AddressSpace,
        (built_from, arch): (u64, Arch),
    ) -> ProcessUnwinder {
        let mut unwinder = arch::Unwinder::new(arch);
        let mut files: Vec<Arc<ModuleFile>> = Vec::new();
        let mut tabled = Vec::new();
        let mut untabled = Vec::new();
        for m in maps.iter() {
            let file = if &*m.path == "[vdso]" {
                own_vdso()
            } else if m.is_file() {
                self.file(pid, m)
            } else {
                None
            };
            let Some(file) = file else { continue };
            // A file for another machine (this machine's vDSO under a perf.data recorded on
            // another architecture, a same-named binary): its rules would lie.
            if file.arch() != Some(arch) {
                continue;
            }
            // The file on disk was replaced since the process mapped it: its CFI and its code
            // would lie.
            let replaced = match (&m.build_id, file.build_id()) {
                (Some(mapped), Some(on_disk)) => **mapped != *on_disk,
                _ => false,
            };
            let tables = file.has_unwind_info();
            if !tables {
                self.without_unwind_info.insert(m.path.clone());
            }
            let Some(bias) = file.bias(m).filter(|_| !replaced) else {
                continue;
            };
            if !tables {
                untabled.push((m.start..m.end, bias, file));
                continue;
            }
            tabled.push(m.start..m.end);
            unwinder.add_module(&m.path, m.start..m.end, bias, file.section_info());
            if !files.iter().any(|f| Arc::ptr_eq(f, &file)) {
                files.push(file);
            }
        }
        tabled.sort_by_key(|r| r.start);
        ProcessUnwinder {
            built_from,
            unwinder,
            tabled,
            untabled,
            _files: files,
        }
    }

    /// The parsed file behind a mapping, read once per file identity.
    fn file(&mut self, pid: u32, m: &Mapping) -> Option<Arc<ModuleFile>> {
        let file = open_mapped_file(pid, m)?;
        let key = FileId::of_file(&file).ok()?;
        self.clock += 1;
        let entry = self.files.entry(key).or_insert_with(|| CachedFile {
            file: ModuleFile::open(file, Path::new(&*m.path))
                .ok()
                .map(Arc::new),
            last_used: 0,
        });
        entry.last_used = self.clock;
        entry.file.clone()
    }
}

/// Walks the frames of one sample whose pc lies in a mapped file, reading words from the
/// copied stack memory.
fn walk(
    process: &ProcessUnwinder,
    cache: &mut WalkCache,
    maps: &AddressSpace,
    regs: Regs,
    stack: &[u8],
    out: &mut Trail,
) -> WalkEnd {
    let stack_end = regs.sp.saturating_add(stack.len() as u64);
    // Words outside the copy may be code of a file without tables, which the walk reads at
    // a leaf there; the copy's own words are read first.
    let read_stack = |addr: u64| -> Result<u64, Unread<Infallible>> {
        let outside = |unread| process.code_word(addr).ok_or(unread);
        if addr < regs.sp {
            return outside(Unread::Unreadable);
        }
        if addr.saturating_add(8) > stack_end {
            return outside(Unread::PastCopy);
        }
        let offset = (addr - regs.sp) as usize;
        match stack.get(offset..offset + 8) {
            Some(word) if offset.is_multiple_of(8) => Ok(u64::from_le_bytes(
                word.try_into().map_err(|_| Unread::Unreadable)?,
            )),
            _ => Err(Unread::Unreadable),
        }
    };
    let code = |addr| process.code(maps, addr);
    let start = (regs, Leaf::Rules);
    let end = process
        .unwinder
        .walk_trail(cache, start, code, read_stack, out);
    match end {
        // The module of the last frame reached: the leaf's, or the caller's found last.
        Ok(end) => end.in_module(|| {
            out.addrs
                .last()
                .and_then(|&a| maps.find(a))
                .map(|m| m.path.clone())
        }),
        Err(never) => match never {},
    }
}

impl ProcessUnwinder {
    /// The word of code at `addr` in a mapped file without tables, read from the file.
    fn code_word(&self, addr: u64) -> Option<u64> {
        let (range, bias, file) = self.untabled.iter().find(|(r, ..)| r.contains(&addr))?;
        if addr.checked_add(8)? > range.end {
            return None;
        }
        file.text_word(addr.wrapping_sub(*bias))
    }

    /// What the process has at `addr`, for the walk.
    fn code(&self, maps: &AddressSpace, addr: u64) -> Code {
        let i = self.tabled.partition_point(|r| r.start <= addr);
        if i > 0 && self.tabled[i - 1].contains(&addr) {
            Code::Tabled
        } else if maps.find(addr).is_some() {
            Code::Untabled
        } else {
            Code::Outside
        }
    }
}

//! The allocator entry points `record --alloc` and `--in-use` count memory at: glibc's family
//! and anonymous `mmap`/`munmap`,
//! jemalloc's under tikv-jemallocator's `_rjem_` prefix, and mimalloc's, looked up in the
//! files the target runs (libc, and the program, where a Rust allocator is linked statically),
//! each with how it takes its arguments (the attach cookie the BPF program reads).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use stackscope_process::target::{resolve_command, Target};

use stackscope_symbols::elf::{ElfFile, SymbolTable};

use super::near::{did_you_mean, near_matches};
use super::probed_file::{find_file, open_elf};
use super::resolve::function_names;
use crate::error::BpfError;

/// `enum alloc_kind` of profile.h: where an entry point's size and block are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AllocKind {
    /// `(size, ...)`.
    SizeFirst = 1,
    /// `(n, size)`.
    Calloc = 2,
    /// `(old, size, ...)`: frees `old`.
    Realloc = 3,
    /// `(old, n, size)`.
    ReallocArray = 4,
    /// `(&block, align, size)`.
    PosixMemalign = 5,
    /// `(align, size)`.
    SizeSecond = 6,
    /// `(block, ...)`.
    Free = 7,
    /// `mmap(addr, len, prot, flags, fd, off)`: anonymous mappings only.
    Mmap = 8,
}

use AllocKind::*;

/// Every entry point probed where a file defines it. glibc's `aligned_alloc` and `memalign`
/// share one address: both fire at one call, which the program counts once as it counts a
/// call nested in another.
const ENTRY_POINTS: &[(&str, AllocKind)] = &[
    ("malloc", SizeFirst),
    ("calloc", Calloc),
    ("realloc", Realloc),
    ("reallocarray", ReallocArray),
    ("posix_memalign", PosixMemalign),
    ("aligned_alloc", SizeSecond),
    ("memalign", SizeSecond),
    ("valloc", SizeFirst),
    ("pvalloc", SizeFirst),
    ("free", Free),
    // Anonymous mappings, an allocator of their own (glibc's malloc maps large blocks itself:
    // nested in it, those count once, as the malloc).
    ("mmap", Mmap),
    ("mmap64", Mmap),
    ("munmap", Free),
    // tikv-jemallocator: Rust frees with sdallocx, allocates with mallocx when aligned.
    ("_rjem_malloc", SizeFirst),
    ("_rjem_mallocx", SizeFirst),
    ("_rjem_calloc", Calloc),
    ("_rjem_realloc", Realloc),
    ("_rjem_rallocx", Realloc),
    ("_rjem_posix_memalign", PosixMemalign),
    ("_rjem_aligned_alloc", SizeSecond),
    ("_rjem_memalign", SizeSecond),
    ("_rjem_free", Free),
    ("_rjem_sdallocx", Free),
    ("_rjem_dallocx", Free),
    // mimalloc, and the mimalloc crate's aligned calls.
    ("mi_malloc", SizeFirst),
    ("mi_zalloc", SizeFirst),
    ("mi_calloc", Calloc),
    ("mi_realloc", Realloc),
    ("mi_malloc_aligned", SizeFirst),
    ("mi_zalloc_aligned", SizeFirst),
    ("mi_realloc_aligned", Realloc),
    ("mi_free", Free),
];

/// One entry point to probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AllocSite {
    pub path: PathBuf,
    pub func: String,
    pub kind: AllocKind,
    /// Bytes into the function its probes go (see [`entry_offset`]).
    pub offset: u64,
}

/// Where in a function its probes go: past a leading instruction that only sets the flags
/// (`test %rdi,%rdi`, as glibc's `free` tests its pointer for NULL; `cmpb $N,ADDR(%rip)`, as
/// its `posix_memalign`, `memalign`, `valloc` and `pvalloc` test whether malloc is set up) when
/// the next one is a push or a jump. The kernel emulates a push or a jump at a uprobe, but
/// single-steps those out of line, a second trap: a probe on glibc's `free` cost its caller
/// about 50 µs a call here, one on the jump after it a few. Past it the registers, the stack
/// pointer and the return address at it are the function's entry's, so the entry and the
/// return probe both go there.
fn entry_offset(code: &[u8]) -> u64 {
    let skipped = match code {
        [0x48, 0x85, 0xff, ..] => 3,
        [0x80, 0x3d, _, _, _, _, _, ..] => 7,
        _ => return 0,
    };
    let emulated = match code.get(skipped..).unwrap_or_default() {
        // push %reg, push %r8-15
        [0x50..=0x57, ..] | [0x41, 0x50..=0x57, ..] => true,
        // jcc rel8, jcc rel32, jmp rel8/rel32
        [0x70..=0x7f, ..] | [0x0f, 0x80..=0x8f, ..] | [0xeb | 0xe9, ..] => true,
        _ => false,
    };
    if emulated {
        skipped as u64
    } else {
        0
    }
}

/// [`entry_offset`] of `func` in `elf`; 0 in a file of another architecture than x86-64,
/// whose instructions those bytes do not decode.
fn entry_offset_of(elf: &ElfFile, func: &str) -> u64 {
    if stackscope_stacks::arch::Arch::of_machine(elf.machine())
        != Some(stackscope_stacks::arch::Arch::X86_64)
    {
        return 0;
    }
    [SymbolTable::Dynamic, SymbolTable::Static]
        .into_iter()
        .find_map(|table| elf.function_named(table, func.as_bytes()))
        .and_then(|function| elf.code(&function, 16).map(entry_offset))
        .unwrap_or(0)
}

/// `--alloc-fn FILE:ALLOC[,FREE]`: an allocator of the program's own (an arena's), probed as
/// the allocator's entry points are: ALLOC takes the size as its first argument and returns
/// the block, FREE takes the block as its first argument. FILE as a uprobe's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocFn {
    pub file: String,
    pub alloc: String,
    pub free: Option<String>,
}

impl FromStr for AllocFn {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad =
            |why: &str| format!("--alloc-fn `{s}`: {why} (give FILE:ALLOC or FILE:ALLOC,FREE)");
        let (file, funcs) = s.rsplit_once(':').ok_or_else(|| bad("no file"))?;
        let (alloc, free) = match funcs.split_once(',') {
            Some((alloc, free)) => (alloc, Some(free)),
            None => (funcs, None),
        };
        if file.is_empty() || alloc.is_empty() || free == Some("") {
            return Err(bad("a part is empty"));
        }
        Ok(AllocFn {
            file: file.to_string(),
            alloc: alloc.to_string(),
            free: free.map(str::to_string),
        })
    }
}

impl fmt::Display for AllocFn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.alloc)?;
        match &self.free {
            Some(free) => write!(f, ",{free}"),
            None => Ok(()),
        }
    }
}

/// The sites of the allocators `--alloc-fn` names, resolved as uprobes are: a missing file or
/// function is one line with the near matches.
fn own_sites(
    own: &[AllocFn],
    running: Option<u32>,
    frees: bool,
) -> Result<Vec<AllocSite>, BpfError> {
    let mut sites = Vec::new();
    for spec in own {
        let fail = |why: String| BpfError::Probe(format!("--alloc-fn {spec}: {why}"));
        let path = find_file(&spec.file, running).map_err(fail)?;
        let names = function_names(&path).map_err(fail)?;
        let elf = open_elf(&path).map_err(fail)?;
        let free = spec.free.iter().filter(|_| frees).map(|f| (f, Free));
        for (func, kind) in std::iter::once((&spec.alloc, SizeFirst)).chain(free) {
            if names.binary_search(func).is_err() {
                let near = near_matches(func, names.iter().map(String::as_str));
                return Err(fail(format!(
                    "no function {func} in {}{}",
                    path.display(),
                    did_you_mean(&near)
                )));
            }
            sites.push(AllocSite {
                path: path.clone(),
                func: func.clone(),
                kind,
                offset: entry_offset_of(&elf, func),
            });
        }
    }
    Ok(sites)
}

/// The entry points of the files `target` runs: libc (the one a running target maps, else the
/// loader's), and the program itself (a launched command, or each pid's executable), and those
/// `own` names. With `frees`, the frees too (`--in-use`).
pub(crate) fn alloc_sites(
    target: &Target,
    frees: bool,
    own: &[AllocFn],
) -> Result<Vec<AllocSite>, BpfError> {
    let running = match target {
        Target::Pids(ids) | Target::Tids(ids) => ids.first().copied(),
        _ => None,
    };
    let libc = find_file("libc", running)
        .map_err(|why| BpfError::Probe(format!("the allocator: {why}")))?;
    let mut files = vec![libc];
    match target {
        Target::Command(argv) => {
            if let Some(program) = argv.first().and_then(|a| resolve_command(a).ok()) {
                files.push(program);
            }
        }
        Target::Pids(ids) | Target::Tids(ids) => {
            files.extend(
                ids.iter()
                    .filter_map(|&id| std::fs::canonicalize(format!("/proc/{id}/exe")).ok()),
            );
        }
        Target::System => {}
    }
    files.dedup();
    let mut sites = Vec::new();
    for path in files {
        // A program that cannot be read defines no allocator of its own to probe.
        let names = function_names(&path).unwrap_or_default();
        let Ok(elf) = open_elf(&path) else {
            continue;
        };
        for &(func, kind) in ENTRY_POINTS {
            if (frees || kind != Free) && names.binary_search_by(|n| n.as_str().cmp(func)).is_ok() {
                sites.push(AllocSite {
                    path: path.clone(),
                    func: func.to_string(),
                    kind,
                    offset: entry_offset_of(&elf, func),
                });
            }
        }
    }
    if !sites.iter().any(|s| s.func == "malloc") {
        return Err(BpfError::Probe(
            "the allocator: no malloc in libc to probe".to_string(),
        ));
    }
    sites.extend(own_sites(own, running, frees)?);
    Ok(sites)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_libcs_allocator_family_and_its_free_only_when_asked() {
        let own = Target::Pids(vec![std::process::id()]);
        let sites = alloc_sites(&own, false, &[]).expect("libc's allocator");
        let funcs: Vec<&str> = sites.iter().map(|s| s.func.as_str()).collect();
        for func in [
            "malloc",
            "calloc",
            "realloc",
            "posix_memalign",
            "aligned_alloc",
        ] {
            assert!(funcs.contains(&func), "{func} in {funcs:?}");
        }
        assert!(!funcs.contains(&"free"), "{funcs:?}");
        let with_frees = alloc_sites(&own, true, &[]).unwrap();
        assert!(with_frees
            .iter()
            .any(|s| s.func == "free" && s.kind == Free));
    }

    #[test]
    fn the_probes_skip_a_leading_flag_test_before_an_emulated_instruction_only() {
        // test %rdi,%rdi; je rel32 / jne rel8, as glibc's free begins.
        assert_eq!(entry_offset(&[0x48, 0x85, 0xff, 0x0f, 0x84, 0, 0, 0]), 3);
        assert_eq!(entry_offset(&[0x48, 0x85, 0xff, 0x75, 0x10]), 3);
        // test %rdi,%rdi; mov ...: no gain.
        assert_eq!(entry_offset(&[0x48, 0x85, 0xff, 0x48, 0x89]), 0);
        // cmpb $0,disp32(%rip); push %r12, as glibc's posix_memalign begins.
        let cmpb = [0x80, 0x3d, 1, 2, 3, 4, 0];
        assert_eq!(entry_offset(&[&cmpb[..], &[0x41, 0x54]].concat()), 7);
        assert_eq!(entry_offset(&[&cmpb[..], &[0x48, 0x89, 0xd0]].concat()), 0);
        // push %r12, as glibc's malloc begins: emulated already.
        assert_eq!(entry_offset(&[0x41, 0x54, 0x55, 0x53]), 0);
        assert_eq!(entry_offset(&[0x48, 0x85]), 0);
    }

    #[test]
    fn an_own_allocator_is_file_alloc_and_optional_free() {
        let spec: AllocFn = "./prog:get,put".parse().unwrap();
        assert_eq!(
            (
                spec.file.as_str(),
                spec.alloc.as_str(),
                spec.free.as_deref()
            ),
            ("./prog", "get", Some("put"))
        );
        assert_eq!(spec.to_string(), "./prog:get,put");
        let alone: AllocFn = "/a:b:c:get".parse().unwrap();
        assert_eq!((alone.file.as_str(), alone.free), ("/a:b:c", None));
        for bad in ["get", ":get", "./prog:", "./prog:get,"] {
            let err = bad.parse::<AllocFn>().unwrap_err();
            assert!(err.contains(bad) && !err.contains('\n'), "{bad}: {err}");
        }
    }
}

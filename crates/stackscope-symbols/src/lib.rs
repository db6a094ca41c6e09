//! Turns code addresses into named frames: functions in ELF files (with inlined functions and
//! demangled names; from separate debug files found by build-id, by debug link or by a
//! fetcher, and from MiniDebugInfo, for stripped binaries), kernel functions from
//! `/proc/kallsyms`, JIT code from `/tmp/perf-PID.map` and jitdumps, the vDSO, and PE
//! images by RVA from their PDB or the DWARF inside them ([`pe`]), CPython code objects from a
//! process's memory ([`python_code`]); and, for code no symbol names, where its function
//! starts. Addresses are resolved in batches, each unique address
//! once.
//!
//! Also owns the one ELF reader ([`elf::ElfFile`]), the one file identity ([`FileId`]) and the
//! one opener of files that others name ([`foreign`]: non-blocking, regular files only, bounded)
//! the rest of stackscope reads binaries through, as the lowest crate that reads them.

pub mod debug_file;
#[cfg(not(windows))]
pub mod debuginfod;
mod demangle;
pub mod elf;
mod elf_info;
mod error;
mod file_id;
pub mod foreign;
#[doc(hidden)]
pub mod fuzzing;
pub mod interrupt;
mod jitdump;
mod mini_debuginfo;
pub mod pe;
mod perf_map;
pub mod python_code;
mod sym_frame;
mod symbolizer;

pub use debug_file::{DebugFile, DebugFiles, FetchDebugFile, DEFAULT_DEBUG_DIR};
pub use elf_info::{unwind_sources, FramePointers, UnwindSources};
pub use error::SymbolError;
pub use file_id::FileId;
pub use sym_frame::SymFrame;
pub use symbolizer::Symbolizer;

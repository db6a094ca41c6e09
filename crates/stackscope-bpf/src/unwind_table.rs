//! Compact unwind tables for unwinding user stacks inside the kernel (the eBPF source): each
//! ELF file's `.eh_frame` (or `.debug_frame`) CFI turned into one sorted array of 8-byte
//! [`Row`]s keyed by the file's virtual address, and, per process, the executable mappings
//! with the bias that turns a code address into that key.
//!
//! A row says how to find the caller of any pc from its address up to the next row's address:
//! where the canonical frame address (CFA) is (`rsp + n`, `rbp + n`, or one of the two PLT
//! expressions), whether `rbp` was saved (at `CFA + n`) or is unchanged, and that the return
//! address is at `CFA - 8` (and `*(rsp + n) + 8`, OpenSSL's realigned frames). Kinds outside that model are rows of their own: [`RowKind::End`]
//! (no CFI covers this pc: walk by frame pointers), [`RowKind::Stop`] (the return address is
//! undefined: the outermost frame, e.g. `_start`), [`RowKind::Signal`] (the signal return
//! trampoline: registers come from the signal frame) and [`RowKind::Unsupported`] (CFI this
//! format cannot express: try frame pointers, else the stack is truncated there).
//!
//! It does not load anything into the kernel (that is `tables`) and does not unwind copied
//! stacks (that is the perf_event source's walk).

mod build;
pub mod disk_cache;
mod process;
#[cfg(test)]
mod tests;

use std::path::Path;

use stackscope_stacks::module::ModuleFile;
use stackscope_symbols::foreign::{self, Kind};

pub use process::{MappingTable, ProcessTables, TableCache, TableId};

/// How a row finds the canonical frame address, or why it cannot. Values are shared with the
/// BPF walker (`unwind.bpf.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RowKind {
    /// No CFI from here to the next row: walk by frame pointers.
    End = 0,
    /// CFA = rsp + `cfa_offset`.
    CfaRsp = 1,
    /// CFA = rbp + `cfa_offset`.
    CfaRbp = 2,
    /// The PLT stub expression: CFA = rsp + `cfa_offset` + 8 when `(pc & 15) >= aux`.
    Plt = 3,
    /// The return address is undefined: this is the outermost frame.
    Stop = 4,
    /// CFI the row format cannot express.
    Unsupported = 5,
    /// A signal trampoline (`__restore_rt`, an FDE of a CIE with augmentation `S`): sp points
    /// at the `ucontext` the kernel saved, which holds the interrupted rip, rsp and rbp.
    Signal = 6,
    /// CFA = *(rsp + `cfa_offset`) + 8: hand-written assembly (OpenSSL's) that realigns the
    /// stack and keeps the caller's rsp in a stack slot. `aux` is the rbp rule.
    CfaDerefRsp = 7,
    /// CFA = rsp + 8 * E, where E has 21 bits: `cfa_offset` (read as unsigned) and the top
    /// five bits of `aux`; the low three bits of `aux` say rbp was saved at CFA - 8 * them (0:
    /// unchanged). Frames of 32 KiB to 16 MiB, which a compiler's functions holding its whole
    /// context have (rustc's reach 530 KiB).
    CfaRspLarge = 8,
}

/// One row, laid out exactly as the BPF walker reads it (`struct unwind_row`, 8 bytes).
///
/// For [`RowKind::CfaRsp`] and [`RowKind::CfaRbp`], `aux` is the rbp rule: 0 when rbp is
/// unchanged, else rbp was saved at `CFA + 8 * aux`. For [`RowKind::Plt`], `aux` is the
/// threshold of the expression. Keeping offsets to 16 and 8 bits (rules outside are
/// `Unsupported`) halves the table against a 64-bit address and 32-bit offsets; files whose
/// addresses do not fit 32 bits get no table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct Row {
    /// First file virtual address the row applies to.
    pub addr: u32,
    pub cfa_offset: i16,
    pub kind: RowKind,
    pub aux: i8,
}

const _: () = assert!(std::mem::size_of::<Row>() == 8);

/// A row's rule, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// No CFI here.
    End,
    /// CFA = `base` + `offset`; rbp restored from `CFA + rbp_offset` or unchanged (`None`);
    /// the return address at CFA - 8.
    Cfa {
        base: CfaBase,
        offset: i32,
        rbp_offset: Option<i16>,
    },
    /// CFA = rsp + `offset` + (8 if `(pc & 15) >= threshold`).
    Plt {
        offset: i16,
        threshold: u8,
    },
    /// Outermost frame.
    Stop,
    Unsupported,
    /// Registers restored from the signal frame at sp.
    Signal,
    /// CFA = *(rsp + `offset`) + 8; rbp as in [`Rule::Cfa`].
    CfaDeref {
        offset: i16,
        rbp_offset: Option<i16>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CfaBase {
    Rsp,
    Rbp,
}

impl Row {
    pub fn rule(&self) -> Rule {
        match self.kind {
            RowKind::End => Rule::End,
            RowKind::CfaRsp | RowKind::CfaRbp => Rule::Cfa {
                base: if self.kind == RowKind::CfaRsp {
                    CfaBase::Rsp
                } else {
                    CfaBase::Rbp
                },
                offset: i32::from(self.cfa_offset),
                rbp_offset: (self.aux != 0).then(|| i16::from(self.aux) * 8),
            },
            RowKind::Plt => Rule::Plt {
                offset: self.cfa_offset,
                threshold: self.aux as u8,
            },
            RowKind::Stop => Rule::Stop,
            RowKind::Unsupported => Rule::Unsupported,
            RowKind::Signal => Rule::Signal,
            RowKind::CfaRspLarge => {
                let (high, rbp) = (self.aux as u8 >> 3, self.aux as u8 & 7);
                Rule::Cfa {
                    base: CfaBase::Rsp,
                    offset: (i32::from(high) << 16 | i32::from(self.cfa_offset as u16)) * 8,
                    rbp_offset: (rbp != 0).then(|| -i16::from(rbp) * 8),
                }
            }
            RowKind::CfaDerefRsp => Rule::CfaDeref {
                offset: self.cfa_offset,
                rbp_offset: (self.aux != 0).then(|| i16::from(self.aux) * 8),
            },
        }
    }

    /// True when both rows say the same thing (so the second is redundant).
    fn same_rule(&self, other: &Row) -> bool {
        self.kind == other.kind && self.cfa_offset == other.cfa_offset && self.aux == other.aux
    }
}

/// What building a table met, for reports and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableStats {
    /// FDEs turned into rows.
    pub fdes: usize,
    /// FDEs left out: unparsable, overlapping an earlier one, or above 4 GiB.
    pub skipped_fdes: usize,
    /// Rows (after removing redundant ones) of kind [`RowKind::Unsupported`].
    pub unsupported_rows: usize,
    /// FDEs (of `fdes`) taken from `.debug_frame`, for functions `.eh_frame` leaves out.
    pub debug_frame_fdes: usize,
}

/// The unwind table of one ELF file: rows sorted by address, no two consecutive rows alike,
/// ending with an [`RowKind::End`] row after the last FDE.
#[derive(Debug, Clone, Default)]
pub struct UnwindTable {
    rows: Vec<Row>,
    stats: TableStats,
}

/// Why no table could be built for a file.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not a 64-bit ELF file: {message}")]
    Elf { path: String, message: String },
    #[error("{path} has no .eh_frame nor .debug_frame: build it with unwind tables (the default) or frame pointers")]
    NoUnwindInfo { path: String },
}

impl UnwindTable {
    /// Builds the table of the ELF file at `path`.
    pub fn from_path(path: &Path) -> Result<Self, BuildError> {
        let file = foreign::open(path, Kind::Binary).map_err(|refusal| BuildError::Read {
            path: path.display().to_string(),
            source: refusal.into(),
        })?;
        let module = ModuleFile::open(file, path).map_err(|e| BuildError::Elf {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Self::from_module(&module).ok_or_else(|| BuildError::NoUnwindInfo {
            path: path.display().to_string(),
        })
    }

    /// The table from a parsed file's CFI; `None` when it has none.
    pub(crate) fn from_module(module: &ModuleFile) -> Option<Self> {
        let info = module.section_info();
        let eh_frame = match (&info.eh_frame, &info.eh_frame_svma) {
            (Some(data), Some(svma)) => Some((&data[..], svma.start)),
            _ => None,
        };
        if eh_frame.is_none() && info.debug_frame.is_none() {
            return None;
        }
        Some(build::build(build::Sections {
            eh_frame,
            text_svma: info.text_svma.as_ref().map(|r| r.start),
            debug_frame: info.debug_frame.as_deref(),
        }))
    }

    pub fn rows(&self) -> &[Row] {
        &self.rows
    }

    pub fn stats(&self) -> TableStats {
        self.stats
    }

    /// The row covering file virtual address `addr`: the last row at or below it. `None`
    /// below the first row or above 4 GiB.
    pub fn lookup(&self, addr: u64) -> Option<&Row> {
        let addr = u32::try_from(addr).ok()?;
        let i = self.rows.partition_point(|r| r.addr <= addr);
        self.rows.get(i.checked_sub(1)?)
    }

    /// Size of the rows in bytes.
    pub fn size_bytes(&self) -> usize {
        std::mem::size_of_val(self.rows.as_slice())
    }
}

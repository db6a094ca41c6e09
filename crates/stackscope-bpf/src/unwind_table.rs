//! Compact unwind tables for unwinding user stacks inside the kernel (the eBPF source): each
//! ELF file's `.eh_frame` (or `.debug_frame`) CFI turned into one sorted array of 8-byte
//! [`Row`]s keyed by the file's virtual address, and, per process, the executable mappings
//! with the bias that turns a code address into that key.
//!
//! A table is of one architecture ([`UnwindTable::arch`], the file's), whose row kinds it
//! holds. A row says how to find the caller of any pc from its address up to the next row's
//! address. On x86-64: where the canonical frame address (CFA) is (`rsp + n`, `rbp + n`, one
//! of the two PLT expressions, or `*(rsp + n) + 8`, OpenSSL's realigned frames), whether
//! `rbp` was saved (at `CFA + n`) or is unchanged, and that the return address is at
//! `CFA - 8`. On aarch64: the CFA is `sp + n` or `x29 + n`, the return address was saved at
//! `CFA + n` or is still in x30 (a leaf, a prologue), and x29 is unchanged or was saved with
//! x30 as a frame record (`stp x29, x30`, x29 in the lower word). Kinds outside that model
//! are rows of their own: [`RowKind::End`]
//! (no CFI covers this pc: walk by frame pointers), [`RowKind::Stop`] (the return address is
//! undefined: the outermost frame, e.g. `_start`), [`RowKind::Signal`] (the signal return
//! trampoline: registers come from the signal frame) and [`RowKind::Unsupported`] (CFI this
//! format cannot express: try frame pointers, else the stack is truncated there).
//!
//! It does not load anything into the kernel (that is `tables`) and does not unwind copied
//! stacks (that is the perf_event source's walk).

#[cfg(test)]
mod aarch64_tests;
mod build;
pub mod disk_cache;
mod process;
#[cfg(test)]
mod tests;

use std::path::Path;

use stackscope_stacks::arch::Arch;
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
    /// aarch64: CFA = sp + `cfa_offset`; x30 (the return address) saved at `CFA + 8 * aux`,
    /// or still in x30 when `aux` is 0; x29 unchanged.
    CfaSpA64 = 9,
    /// aarch64: CFA = x29 + `cfa_offset`; x30 as in [`RowKind::CfaSpA64`].
    CfaFpA64 = 10,
    /// aarch64: CFA = sp + `cfa_offset`; the frame record (x29, then x30) saved at
    /// `CFA + 8 * aux`.
    CfaSpRecordA64 = 11,
    /// aarch64: CFA = x29 + `cfa_offset`; the frame record as in [`RowKind::CfaSpRecordA64`].
    CfaFpRecordA64 = 12,
    /// aarch64: CFA = sp + `cfa_offset`; x30 saved at sp + 8 * `aux` (read unsigned), x29
    /// unchanged: GCC's frames keep their saved registers at the bottom, which in a frame over
    /// 1 KiB is further below the CFA than [`RowKind::CfaSpA64`] reaches.
    CfaSpLowA64 = 13,
    /// aarch64: CFA = sp + `cfa_offset`; the frame record at sp + 8 * `aux` (read unsigned).
    CfaSpLowRecordA64 = 14,
    /// aarch64: as [`RowKind::CfaSpLowA64`] from x29.
    CfaFpLowA64 = 15,
    /// aarch64: as [`RowKind::CfaSpLowRecordA64`] from x29: the frame record x29 points at,
    /// in a frame over 1 KiB.
    CfaFpLowRecordA64 = 16,
}

impl RowKind {
    /// Every kind, in value order.
    pub const ALL: [RowKind; 17] = [
        RowKind::End,
        RowKind::CfaRsp,
        RowKind::CfaRbp,
        RowKind::Plt,
        RowKind::Stop,
        RowKind::Unsupported,
        RowKind::Signal,
        RowKind::CfaDerefRsp,
        RowKind::CfaRspLarge,
        RowKind::CfaSpA64,
        RowKind::CfaFpA64,
        RowKind::CfaSpRecordA64,
        RowKind::CfaFpRecordA64,
        RowKind::CfaSpLowA64,
        RowKind::CfaSpLowRecordA64,
        RowKind::CfaFpLowA64,
        RowKind::CfaFpLowRecordA64,
    ];
}

/// The architecture whose rows the BPF walker built with this crate follows (the kernel's it
/// runs on); tables of any other are not loaded.
pub const WALKER_ARCH: Option<Arch> = if cfg!(target_arch = "x86_64") {
    Some(Arch::X86_64)
} else if cfg!(target_arch = "aarch64") {
    Some(Arch::Aarch64)
} else {
    None
};

/// One row, laid out exactly as the BPF walker reads it (`struct unwind_row`, 8 bytes).
///
/// For [`RowKind::CfaRsp`] and [`RowKind::CfaRbp`], `aux` is the rbp rule: 0 when rbp is
/// unchanged, else rbp was saved at `CFA + 8 * aux`; the aarch64 kinds say what their `aux` is. For [`RowKind::Plt`], `aux` is the
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
    /// CFA = `base` + `offset`; the frame pointer (rbp, x29) restored from `CFA + fp_offset`
    /// or unchanged (`None`); the return address at `CFA + ra_offset`, or in the link
    /// register x30 (`None`, aarch64 only).
    Cfa {
        base: CfaBase,
        offset: i32,
        fp_offset: Option<i32>,
        ra_offset: Option<i32>,
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
        fp_offset: Option<i32>,
    },
}

/// The register a CFA is computed from: the stack pointer (rsp, sp) or the frame pointer
/// (rbp, x29).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CfaBase {
    Sp,
    Fp,
}

impl Row {
    pub fn rule(&self) -> Rule {
        let slot = |aux: i8| (aux != 0).then(|| i32::from(aux) * 8);
        let cfa = |base, offset, fp_offset, ra_offset| Rule::Cfa {
            base,
            offset,
            fp_offset,
            ra_offset,
        };
        let offset = i32::from(self.cfa_offset);
        match self.kind {
            RowKind::End => Rule::End,
            RowKind::CfaRsp => cfa(CfaBase::Sp, offset, slot(self.aux), Some(-8)),
            RowKind::CfaRbp => cfa(CfaBase::Fp, offset, slot(self.aux), Some(-8)),
            RowKind::Plt => Rule::Plt {
                offset: self.cfa_offset,
                threshold: self.aux as u8,
            },
            RowKind::Stop => Rule::Stop,
            RowKind::Unsupported => Rule::Unsupported,
            RowKind::Signal => Rule::Signal,
            RowKind::CfaRspLarge => {
                let (high, rbp) = (self.aux as u8 >> 3, self.aux as u8 & 7);
                cfa(
                    CfaBase::Sp,
                    (i32::from(high) << 16 | i32::from(self.cfa_offset as u16)) * 8,
                    (rbp != 0).then(|| -i32::from(rbp) * 8),
                    Some(-8),
                )
            }
            RowKind::CfaDerefRsp => Rule::CfaDeref {
                offset: self.cfa_offset,
                fp_offset: slot(self.aux),
            },
            RowKind::CfaSpA64 => cfa(CfaBase::Sp, offset, None, slot(self.aux)),
            RowKind::CfaFpA64 => cfa(CfaBase::Fp, offset, None, slot(self.aux)),
            RowKind::CfaSpRecordA64 | RowKind::CfaFpRecordA64 => {
                let base = if self.kind == RowKind::CfaSpRecordA64 {
                    CfaBase::Sp
                } else {
                    CfaBase::Fp
                };
                let fp = i32::from(self.aux) * 8;
                cfa(base, offset, Some(fp), Some(fp + 8))
            }
            RowKind::CfaSpLowA64 | RowKind::CfaFpLowA64 => {
                let ra = i32::from(self.aux as u8) * 8 - offset;
                let base = if self.kind == RowKind::CfaSpLowA64 {
                    CfaBase::Sp
                } else {
                    CfaBase::Fp
                };
                cfa(base, offset, None, Some(ra))
            }
            RowKind::CfaSpLowRecordA64 | RowKind::CfaFpLowRecordA64 => {
                let fp = i32::from(self.aux as u8) * 8 - offset;
                let base = if self.kind == RowKind::CfaSpLowRecordA64 {
                    CfaBase::Sp
                } else {
                    CfaBase::Fp
                };
                cfa(base, offset, Some(fp), Some(fp + 8))
            }
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
#[derive(Debug, Clone)]
pub struct UnwindTable {
    arch: Arch,
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

    /// The table from a parsed file's CFI; `None` when it has none, or is of an architecture
    /// without row kinds (riscv64).
    pub(crate) fn from_module(module: &ModuleFile) -> Option<Self> {
        let arch = module.arch().filter(|a| *a != Arch::Riscv64)?;
        let info = module.section_info();
        let eh_frame = match (&info.eh_frame, &info.eh_frame_svma) {
            (Some(data), Some(svma)) => Some((&data[..], svma.start)),
            _ => None,
        };
        if eh_frame.is_none() && info.debug_frame.is_none() {
            return None;
        }
        Some(build::build(build::Sections {
            arch,
            eh_frame,
            text_svma: info.text_svma.as_ref().map(|r| r.start),
            debug_frame: info.debug_frame.as_deref(),
        }))
    }

    /// The architecture of the file, whose row kinds the table holds.
    pub fn arch(&self) -> Arch {
        self.arch
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

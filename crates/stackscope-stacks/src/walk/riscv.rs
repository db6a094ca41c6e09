//! RISC-V 64 (RV64) for the walk: framehop does not cover it, so each frame's CFI row is
//! evaluated here with gimli, and where a file has no CFI the frame record is followed as the
//! RISC-V ABI lays it out (`fp - 16`: the caller's frame pointer, `fp - 8`: the return address,
//! `fp`: the caller's stack pointer).

use std::ops::Range;

use framehop::{Error as FramehopError, ExplicitModuleSectionInfo, FrameAddress};
use gimli::{
    BaseAddresses, CfaRule, CieOrFde, DebugFrame, EhFrame, EndianSlice, LittleEndian, Register,
    RegisterRule, UnwindContext, UnwindSection,
};

use super::{ArchRegs, FrameRecord};
use crate::module::SectionData;

/// DWARF numbers of the registers the walk tracks (`x1`, `x2`, `x8`).
const RA: Register = Register(1);
const SP: Register = Register(2);
const FP: Register = Register(8);

/// RV64 registers: `ra` holds the leaf's return address until the leaf saves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegsRiscv64 {
    pub pc: u64,
    pub sp: u64,
    /// `s0`/`fp`.
    pub fp: u64,
    pub ra: u64,
}

/// What one step knows of the frame being unwound: `ra` only while it may still hold the
/// return address (the leaf), since every call overwrites it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnwindRegsRiscv64 {
    ra: Option<u64>,
    sp: u64,
    fp: u64,
}

/// One file's CFI at its load address.
struct Module {
    avma: Range<u64>,
    bias: u64,
    eh_frame: Option<Table>,
    debug_frame: Option<Table>,
}

type Slice<'a> = EndianSlice<'a, LittleEndian>;

/// One CFI section with its FDEs sorted by address, so that finding a frame's rules is a
/// binary search, not a walk over every FDE of a large kernel.
struct Table {
    data: SectionData,
    bases: BaseAddresses,
    /// `.eh_frame` rather than `.debug_frame`.
    eh: bool,
    /// (first address, end, offset of the FDE in the section), by first address.
    fdes: Vec<(u64, u64, usize)>,
}

impl Table {
    fn new(data: SectionData, bases: BaseAddresses, eh: bool) -> Table {
        let mut table = Table {
            data,
            bases,
            eh,
            fdes: Vec::new(),
        };
        table.fdes = if eh {
            fdes_of(&table.eh_frame(), &table.bases)
        } else {
            fdes_of(&table.debug_frame(), &table.bases)
        };
        table
    }

    fn eh_frame(&self) -> EhFrame<Slice<'_>> {
        EhFrame::new(&self.data, LittleEndian)
    }

    fn debug_frame(&self) -> DebugFrame<Slice<'_>> {
        let mut section = DebugFrame::new(&self.data, LittleEndian);
        section.set_address_size(8);
        section
    }

    /// The rules at `svma`, when an FDE covers it.
    fn rules(&self, context: &mut UnwindContext<usize>, svma: u64) -> Option<Rules> {
        let i = self.fdes.partition_point(|f| f.0 <= svma).checked_sub(1)?;
        let (_, end, offset) = self.fdes[i];
        if svma >= end {
            return None;
        }
        if self.eh {
            Rules::of(&self.eh_frame(), &self.bases, context, offset, svma)
        } else {
            Rules::of(&self.debug_frame(), &self.bases, context, offset, svma)
        }
    }
}

/// Every FDE of `section`, sorted by address.
fn fdes_of<'a, S: UnwindSection<Slice<'a>>>(
    section: &S,
    bases: &BaseAddresses,
) -> Vec<(u64, u64, usize)> {
    let mut fdes = Vec::new();
    let mut entries = section.entries(bases);
    while let Ok(Some(entry)) = entries.next() {
        if let CieOrFde::Fde(partial) = entry {
            if let Ok(fde) = partial.parse(S::cie_from_offset) {
                let start = fde.initial_address();
                fdes.push((start, start.saturating_add(fde.len()), fde.offset()));
            }
        }
    }
    fdes.sort_unstable();
    fdes
}

/// The CFI of the files of one address space.
#[derive(Default)]
pub struct UnwinderRiscv64 {
    modules: Vec<Module>,
}

impl UnwinderRiscv64 {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a file occupying `avma`, its stated addresses shifted by `bias`, with the CFI
    /// sections `sections` (`.eh_frame`, `.debug_frame`).
    pub fn add_module(
        &mut self,
        avma: Range<u64>,
        bias: u64,
        sections: ExplicitModuleSectionInfo<SectionData>,
    ) {
        let mut bases = BaseAddresses::default();
        if let Some(text) = &sections.text_svma {
            bases = bases.set_text(text.start);
        }
        let eh_frame = match (sections.eh_frame, sections.eh_frame_svma) {
            (Some(data), Some(at)) => {
                Some(Table::new(data, bases.clone().set_eh_frame(at.start), true))
            }
            _ => None,
        };
        let debug_frame = sections
            .debug_frame
            .map(|data| Table::new(data, bases, false));
        self.modules.push(Module {
            avma,
            bias,
            eh_frame,
            debug_frame,
        });
    }

    /// The CFA and the rules for `ra` and `fp` at `address`, from `.eh_frame` first, then
    /// `.debug_frame`; `None` where no FDE covers it.
    fn rules(&self, cache: &mut CacheRiscv64, address: u64) -> Option<Rules> {
        let module = self.modules.iter().find(|m| m.avma.contains(&address))?;
        let svma = address.wrapping_sub(module.bias);
        let context = &mut cache.context;
        let from_eh = module
            .eh_frame
            .as_ref()
            .and_then(|t| t.rules(context, svma));
        from_eh.or_else(|| module.debug_frame.as_ref()?.rules(context, svma))
    }
}

/// Scratch space for evaluating CFI, kept across walks.
pub struct CacheRiscv64 {
    context: Box<UnwindContext<usize>>,
}

impl CacheRiscv64 {
    pub fn new() -> Self {
        CacheRiscv64 {
            context: Box::new(UnwindContext::new()),
        }
    }
}

impl Default for CacheRiscv64 {
    fn default() -> Self {
        Self::new()
    }
}

/// A rule as the walk evaluates it: where the register's value in the caller comes from.
#[derive(Debug, Clone, Copy)]
enum Rule {
    /// Not saved: still in the register (or, for `ra`, the outermost frame when undefined).
    Same,
    Undefined,
    /// Saved at CFA + n.
    At(i64),
    /// Is CFA + n.
    Is(i64),
    /// Held in another register.
    In(Register),
    /// A rule the walk does not evaluate (a DWARF expression).
    Unknown,
}

/// One row of a CFI table, reduced to what the walk needs.
struct Rules {
    /// The CFA as a register plus an offset; `None` for an expression.
    cfa: Option<(Register, i64)>,
    ra: Rule,
    fp: Rule,
}

impl Rules {
    /// The row at `svma` of the FDE at `offset` in `section`.
    fn of<'a, S: UnwindSection<Slice<'a>>>(
        section: &S,
        bases: &BaseAddresses,
        context: &mut UnwindContext<usize>,
        offset: usize,
        svma: u64,
    ) -> Option<Rules> {
        let fde = section
            .fde_from_offset(bases, S::Offset::from(offset), S::cie_from_offset)
            .ok()?;
        let row = fde
            .unwind_info_for_address(section, bases, context, svma)
            .ok()?;
        let cfa = match row.cfa() {
            CfaRule::RegisterAndOffset { register, offset } => Some((*register, *offset)),
            CfaRule::Expression(_) => None,
        };
        let rule = |register| match row.register(register) {
            None | Some(RegisterRule::SameValue) => Rule::Same,
            Some(RegisterRule::Undefined) => Rule::Undefined,
            Some(RegisterRule::Offset(n)) => Rule::At(n),
            Some(RegisterRule::ValOffset(n)) => Rule::Is(n),
            Some(RegisterRule::Register(r)) => Rule::In(r),
            Some(_) => Rule::Unknown,
        };
        Some(Rules {
            cfa,
            ra: rule(RA),
            fp: rule(FP),
        })
    }
}

impl UnwindRegsRiscv64 {
    fn get(&self, register: Register) -> Option<u64> {
        match register {
            RA => self.ra,
            SP => Some(self.sp),
            FP => Some(self.fp),
            _ => None,
        }
    }

    /// Moves to the caller by `rules`; the caller's return address (`None` at the outermost
    /// frame).
    fn step<F: FnMut(u64) -> Result<u64, ()>>(
        &mut self,
        rules: &Rules,
        read: &mut F,
    ) -> Result<Option<u64>, FramehopError> {
        let (register, offset) = rules.cfa.ok_or(FramehopError::DidNotAdvance)?;
        let base = self.get(register).ok_or(FramehopError::DidNotAdvance)?;
        let cfa = base
            .checked_add_signed(offset)
            .ok_or(FramehopError::IntegerOverflow)?;
        let mut value = |rule: Rule, now: Option<u64>| -> Result<Option<u64>, FramehopError> {
            let at = |n: i64| {
                cfa.checked_add_signed(n)
                    .ok_or(FramehopError::IntegerOverflow)
            };
            Ok(match rule {
                Rule::Same => now,
                Rule::Undefined | Rule::Unknown => None,
                Rule::At(n) => {
                    let addr = at(n)?;
                    Some(read(addr).map_err(|()| FramehopError::CouldNotReadStack(addr))?)
                }
                Rule::Is(n) => Some(at(n)?),
                Rule::In(r) => self.get(r),
            })
        };
        if matches!(rules.ra, Rule::Undefined) {
            return Ok(None);
        }
        let ra = value(rules.ra, self.ra)?.ok_or(FramehopError::DidNotAdvance)?;
        let fp = value(rules.fp, Some(self.fp))?.unwrap_or(0);
        *self = UnwindRegsRiscv64 {
            ra: None,
            sp: cfa,
            fp,
        };
        Ok(Some(ra))
    }

    /// Moves to the caller by the frame record at `fp`.
    fn step_by_frame_record<F: FnMut(u64) -> Result<u64, ()>>(
        &mut self,
        read: &mut F,
    ) -> Result<Option<u64>, FramehopError> {
        if self.fp == 0 {
            return Ok(None);
        }
        if self.fp < self.sp {
            return Err(FramehopError::FramepointerUnwindingMovedBackwards);
        }
        let record = RegsRiscv64::frame_record(self.fp);
        let word = |read: &mut F, addr: u64| {
            read(addr).map_err(|()| FramehopError::CouldNotReadStack(addr))
        };
        let fp = word(read, record.caller_fp)?;
        let ra = word(read, record.return_address)?;
        *self = UnwindRegsRiscv64 {
            ra: None,
            sp: record.caller_sp,
            fp,
        };
        Ok(Some(ra))
    }
}

impl ArchRegs for RegsRiscv64 {
    type Unwinder = UnwinderRiscv64;
    type Cache = CacheRiscv64;
    type Unwind = UnwindRegsRiscv64;

    fn pc(&self) -> u64 {
        self.pc
    }
    fn sp(&self) -> u64 {
        self.sp
    }
    fn fp(&self) -> u64 {
        self.fp
    }
    fn unwind_regs(&self) -> UnwindRegsRiscv64 {
        UnwindRegsRiscv64 {
            ra: Some(self.ra),
            sp: self.sp,
            fp: self.fp,
        }
    }
    fn caller(_return_address: u64, sp: u64, fp: u64) -> UnwindRegsRiscv64 {
        UnwindRegsRiscv64 { ra: None, sp, fp }
    }
    fn unwind_sp(regs: &UnwindRegsRiscv64) -> u64 {
        regs.sp
    }
    fn frame_record(fp: u64) -> FrameRecord {
        FrameRecord {
            caller_fp: fp.wrapping_sub(16),
            return_address: fp.wrapping_sub(8),
            caller_sp: fp,
        }
    }
    fn unwind_frame<F: FnMut(u64) -> Result<u64, ()>>(
        unwinder: &UnwinderRiscv64,
        cache: &mut CacheRiscv64,
        address: FrameAddress,
        regs: &mut UnwindRegsRiscv64,
        read: &mut F,
    ) -> Result<Option<u64>, FramehopError> {
        match unwinder.rules(cache, address.address_for_lookup()) {
            Some(rules) => regs.step(&rules, read),
            None => regs.step_by_frame_record(read),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::walk::{walk, Leaf, Unread, WalkEnd};

    fn walk_riscv(
        regs: RegsRiscv64,
        leaf: Leaf,
        memory: &HashMap<u64, u64>,
    ) -> (WalkEnd, Vec<u64>) {
        let unwinder = UnwinderRiscv64::new();
        let mut cache = CacheRiscv64::new();
        let mut out = Vec::new();
        let read = |addr| memory.get(&addr).copied().ok_or(Unread::<()>::Unreadable);
        let end = walk(&unwinder, &mut cache, regs, leaf, |_| true, read, &mut out);
        (end.unwrap(), out)
    }

    /// Two frame records below a stack at 0x1000: each frame's `fp` points just past its
    /// record, the outermost one holds a null frame pointer.
    #[test]
    fn without_cfi_the_walk_follows_riscv_frame_records() {
        let memory = HashMap::from([
            (0x1010, 0x1040), // fp - 16: caller's fp
            (0x1018, 0x5006), // fp - 8: return address
            (0x1030, 0),
            (0x1038, 0x6006),
        ]);
        let regs = RegsRiscv64 {
            pc: 0x4000,
            sp: 0x1000,
            fp: 0x1020,
            ra: 0x5006,
        };
        for leaf in [Leaf::Rules, Leaf::FramePointer] {
            let (end, out) = walk_riscv(regs, leaf, &memory);
            assert_eq!(end, WalkEnd::Complete, "{leaf:?}");
            assert_eq!(out, [0x4000, 0x5005, 0x6005], "{leaf:?}");
        }
    }

    #[test]
    fn a_leaf_that_has_not_saved_ra_returns_through_it() {
        let mut regs = UnwindRegsRiscv64 {
            ra: Some(0x5006),
            sp: 0x1000,
            fp: 0x1020,
        };
        let rules = Rules {
            cfa: Some((SP, 0)),
            ra: Rule::Same,
            fp: Rule::Same,
        };
        let mut read = |_| Err(());
        assert_eq!(regs.step(&rules, &mut read), Ok(Some(0x5006)));
        assert_eq!((regs.sp, regs.fp, regs.ra), (0x1000, 0x1020, None));
        // Above the leaf, `ra` was overwritten by the call: a frame that says it is unsaved
        // cannot be unwound, rather than returning to itself.
        assert_eq!(
            regs.step(&rules, &mut read),
            Err(FramehopError::DidNotAdvance)
        );
    }

    #[test]
    fn saved_registers_are_read_relative_to_the_cfa() {
        let memory = HashMap::from([(0x1018, 0x7007), (0x1010, 0x1100)]);
        let mut read = |addr| memory.get(&addr).copied().ok_or(());
        let mut regs = UnwindRegsRiscv64 {
            ra: None,
            sp: 0x1000,
            fp: 0x1234,
        };
        let rules = Rules {
            cfa: Some((SP, 0x20)),
            ra: Rule::At(-8),
            fp: Rule::At(-16),
        };
        assert_eq!(regs.step(&rules, &mut read), Ok(Some(0x7007)));
        assert_eq!((regs.sp, regs.fp), (0x1020, 0x1100));
        let outermost = Rules {
            ra: Rule::Undefined,
            ..rules
        };
        assert_eq!(regs.step(&outermost, &mut read), Ok(None));
    }
}

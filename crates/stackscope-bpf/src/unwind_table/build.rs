//! Runs the CFI program of every FDE with gimli and folds the resulting rows into one sorted
//! table: FDEs sorted by address, an `End` row wherever one FDE stops short of the next,
//! redundant rows (same rule as the row before) dropped. Each architecture's registers and
//! rules are turned into its own row kinds; the rest is shared.

use std::ops::Range;

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, DebugFrame, EhFrame, EndianSlice, LittleEndian, Register,
    RegisterRule, UnwindContext, UnwindSection, UnwindTableRow,
};

use stackscope_stacks::arch::Arch;

use super::{Row, RowKind, TableStats, UnwindTable};

type Reader<'a> = EndianSlice<'a, LittleEndian>;

const RBP: Register = Register(6);
const RSP: Register = Register(7);
const RA: Register = Register(16);
/// aarch64's frame pointer, link register (the return address column) and stack pointer.
const X29: Register = Register(29);
const X30: Register = Register(30);
const SP: Register = Register(31);

/// DWARF opcodes of the expressions recognised.
const DW_OP_BREG7: u8 = 0x77;
const DW_OP_BREG16: u8 = 0x80;
const DW_OP_LIT0: u8 = 0x30;
const DW_OP_LIT15: u8 = 0x3f;
const DW_OP_AND: u8 = 0x1a;
const DW_OP_GE: u8 = 0x2a;
const DW_OP_LIT3: u8 = 0x33;
const DW_OP_SHL: u8 = 0x24;
const DW_OP_PLUS: u8 = 0x22;
const DW_OP_DEREF: u8 = 0x06;
const DW_OP_PLUS_UCONST: u8 = 0x23;

/// The sections a table is built from.
pub(super) struct Sections<'a> {
    /// The file's architecture: which registers and row kinds.
    pub arch: Arch,
    /// `.eh_frame` bytes and stated address.
    pub eh_frame: Option<(&'a [u8], u64)>,
    pub text_svma: Option<u64>,
    pub debug_frame: Option<&'a [u8]>,
}

/// Builds the table from `.eh_frame` and `.debug_frame` together: a program built with
/// `-fno-asynchronous-unwind-tables -g` has its own functions in `.debug_frame` and only the
/// C runtime's in `.eh_frame`. Where both describe a function, `.eh_frame` wins.
pub(super) fn build(sections: Sections) -> UnwindTable {
    let mut fdes = Fdes {
        arch: sections.arch,
        scratch: Vec::new(),
        fdes: Vec::new(),
        stats: TableStats::default(),
    };
    if let Some((data, svma)) = sections.eh_frame {
        let section = EhFrame::new(data, LittleEndian);
        let mut bases = BaseAddresses::default().set_eh_frame(svma);
        if let Some(text) = sections.text_svma {
            bases = bases.set_text(text);
        }
        fdes.collect(&section, &bases, false);
    }
    if let Some(data) = sections.debug_frame {
        let mut section = DebugFrame::new(data, LittleEndian);
        section.set_address_size(8);
        fdes.collect(&section, &BaseAddresses::default(), true);
    }
    fdes.into_table()
}

/// One FDE's range and its rows in the scratch vector.
struct Fde {
    start: u64,
    end: u64,
    from_debug_frame: bool,
    rows: Range<usize>,
}

/// The rows of every FDE, in section order.
struct Fdes {
    arch: Arch,
    scratch: Vec<Row>,
    fdes: Vec<Fde>,
    stats: TableStats,
}

impl Fdes {
    fn collect<'a, S: UnwindSection<Reader<'a>>>(
        &mut self,
        section: &S,
        bases: &BaseAddresses,
        from_debug_frame: bool,
    ) {
        let stats = &mut self.stats;
        let scratch = &mut self.scratch;
        let (arch, ra) = (self.arch, return_address_register(self.arch));
        let mut ctx = Box::new(UnwindContext::new());
        let mut entries = section.entries(bases);
        // A malformed entry ends the walk: its length cannot be trusted to find the next one.
        while let Ok(Some(entry)) = entries.next() {
            let CieOrFde::Fde(partial) = entry else {
                continue;
            };
            let Ok(fde) = partial.parse(|s, b, o| s.cie_from_offset(b, o)) else {
                stats.skipped_fdes += 1;
                continue;
            };
            let (start, end) = (fde.initial_address(), fde.end_address());
            if start >= end || end > u64::from(u32::MAX) {
                stats.skipped_fdes += 1;
                continue;
            }
            let ra_register_ok = fde.cie().return_address_register() == ra;
            let signal = fde.is_signal_trampoline();
            let first = scratch.len();
            let Ok(mut table) = fde.rows(section, bases, &mut ctx) else {
                stats.skipped_fdes += 1;
                continue;
            };
            let complete = loop {
                match table.next_row() {
                    Ok(Some(row)) => {
                        let mut r = match arch {
                            Arch::Aarch64 => convert_aarch64(row),
                            _ => convert(row, section),
                        };
                        if signal {
                            r = Row {
                                kind: RowKind::Signal,
                                ..unsupported(r.addr)
                            };
                        } else if !ra_register_ok && r.kind != RowKind::Stop {
                            r = unsupported(r.addr);
                        }
                        scratch.push(r);
                    }
                    Ok(None) => break true,
                    Err(_) => break false,
                }
            };
            if !complete {
                scratch.truncate(first);
                stats.skipped_fdes += 1;
                continue;
            }
            self.fdes.push(Fde {
                start,
                end,
                from_debug_frame,
                rows: first..scratch.len(),
            });
        }
    }

    fn into_table(mut self) -> UnwindTable {
        // `.eh_frame` first among FDEs starting at the same address.
        self.fdes
            .sort_unstable_by_key(|f| (f.start, f.from_debug_frame));
        let mut stats = self.stats;
        let mut rows = Vec::with_capacity(self.scratch.len() / 2 + self.fdes.len());
        let mut covered_to = 0;
        for fde in &self.fdes {
            if fde.start < covered_to {
                // The same function in both sections is expected; anything else is not.
                if !fde.from_debug_frame {
                    stats.skipped_fdes += 1;
                }
                continue;
            }
            for row in &self.scratch[fde.rows.clone()] {
                push(&mut rows, *row);
            }
            // Replaced by the next FDE's first row when it starts right here.
            push(&mut rows, end_row(fde.end as u32));
            covered_to = fde.end;
            stats.fdes += 1;
            stats.debug_frame_fdes += usize::from(fde.from_debug_frame);
        }
        stats.unsupported_rows = rows
            .iter()
            .filter(|r| r.kind == RowKind::Unsupported)
            .count();
        UnwindTable {
            arch: self.arch,
            rows,
            stats,
        }
    }
}

/// Appends `row`, replacing a row at the same address and dropping it when the row before
/// already says the same.
fn push(rows: &mut Vec<Row>, row: Row) {
    if rows.last().is_some_and(|last| last.addr == row.addr) {
        rows.pop();
    }
    if rows.last().is_some_and(|last| last.same_rule(&row)) {
        return;
    }
    if rows.is_empty() && row.kind == RowKind::End {
        return;
    }
    rows.push(row);
}

fn end_row(addr: u32) -> Row {
    Row {
        addr,
        cfa_offset: 0,
        kind: RowKind::End,
        aux: 0,
    }
}

fn unsupported(addr: u32) -> Row {
    Row {
        addr,
        cfa_offset: 0,
        kind: RowKind::Unsupported,
        aux: 0,
    }
}

/// The column of the return address in `arch`'s CFI.
fn return_address_register(arch: Arch) -> Register {
    match arch {
        Arch::Aarch64 => X30,
        _ => RA,
    }
}

/// One gimli row of an aarch64 file as a compact row: the CFA from sp or x29, x30 saved in
/// a slot (or unchanged: a leaf, a prologue), x29 unchanged or saved just below x30.
fn convert_aarch64(row: &UnwindTableRow<usize>) -> Row {
    let addr = row.start_address() as u32;
    // A register's slot in bytes from the CFA: `Some(None)` when it still holds its value.
    let slot = |reg| match row.register(reg) {
        None | Some(RegisterRule::SameValue) => Some(None),
        Some(RegisterRule::Offset(off)) if off % 8 == 0 && off < 0 => Some(Some(off)),
        _ => None,
    };
    if row.register(X30) == Some(RegisterRule::Undefined) {
        return Row {
            kind: RowKind::Stop,
            ..unsupported(addr)
        };
    }
    let (CfaRule::RegisterAndOffset { register, offset }, Some(ra), Some(fp)) =
        (row.cfa(), slot(X30), slot(X29))
    else {
        return unsupported(addr);
    };
    let (Ok(cfa_offset), on_sp) = (i16::try_from(*offset), *register == SP) else {
        return unsupported(addr);
    };
    if !on_sp && *register != X29 {
        return unsupported(addr);
    }
    // x29 is kept only as the lower word of a frame record.
    let record = match (ra, fp) {
        (_, None) => false,
        (Some(ra), Some(fp)) if fp + 8 == ra => true,
        _ => return unsupported(addr),
    };
    // The slot named: x29's in a record, else x30's (none: x30 holds the return address).
    let named = if record { fp } else { ra };
    let near = named.map_or(Some(0), |off| i8::try_from(off / 8).ok());
    let (kind, aux) = match (near, on_sp, record) {
        (Some(aux), true, false) => (RowKind::CfaSpA64, aux),
        (Some(aux), false, false) => (RowKind::CfaFpA64, aux),
        (Some(aux), true, true) => (RowKind::CfaSpRecordA64, aux),
        (Some(aux), false, true) => (RowKind::CfaFpRecordA64, aux),
        (None, _, _) if cfa_offset % 8 == 0 => {
            // Far below the CFA: counted up from the CFA's base register instead.
            let from_base = named.map(|off| (i64::from(cfa_offset) + off) / 8);
            let Some(Ok(words)) = from_base.map(u8::try_from) else {
                return unsupported(addr);
            };
            let kind = match (on_sp, record) {
                (true, false) => RowKind::CfaSpLowA64,
                (true, true) => RowKind::CfaSpLowRecordA64,
                (false, false) => RowKind::CfaFpLowA64,
                (false, true) => RowKind::CfaFpLowRecordA64,
            };
            (kind, words as i8)
        }
        (None, _, _) => return unsupported(addr),
    };
    Row {
        addr,
        cfa_offset,
        kind,
        aux,
    }
}

/// One gimli row of an x86-64 file as a compact row.
fn convert<'a, S: UnwindSection<Reader<'a>>>(row: &UnwindTableRow<usize>, section: &S) -> Row {
    // FDE addresses were checked to fit 32 bits.
    let addr = row.start_address() as u32;
    match row.register(RA) {
        Some(RegisterRule::Undefined) => {
            return Row {
                addr,
                cfa_offset: 0,
                kind: RowKind::Stop,
                aux: 0,
            }
        }
        Some(RegisterRule::Offset(-8)) => {}
        _ => return unsupported(addr),
    }
    let rbp = match row.register(RBP) {
        None | Some(RegisterRule::SameValue) => Some(0),
        Some(RegisterRule::Offset(off)) if off % 8 == 0 && off != 0 => i8::try_from(off / 8).ok(),
        _ => None,
    };
    match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => {
            let kind = match *register {
                RSP => RowKind::CfaRsp,
                RBP => RowKind::CfaRbp,
                _ => return unsupported(addr),
            };
            match (i16::try_from(*offset), rbp) {
                (Ok(cfa_offset), Some(aux)) => Row {
                    addr,
                    cfa_offset,
                    kind,
                    aux,
                },
                (Err(_), Some(aux)) if kind == RowKind::CfaRsp => large_frame(addr, *offset, aux),
                _ => unsupported(addr),
            }
        }
        CfaRule::Expression(expr) => {
            let Ok(expr) = expr.get(section) else {
                return unsupported(addr);
            };
            let bytes = expr.0.slice();
            if let (Some((cfa_offset, threshold)), Some(0)) = (plt_expression(bytes), rbp) {
                return Row {
                    addr,
                    cfa_offset,
                    kind: RowKind::Plt,
                    aux: threshold,
                };
            }
            match (deref_rsp_expression(bytes), rbp) {
                (Some(cfa_offset), Some(aux)) => Row {
                    addr,
                    cfa_offset,
                    kind: RowKind::CfaDerefRsp,
                    aux,
                },
                _ => unsupported(addr),
            }
        }
    }
}

/// CFA = rsp + `offset` beyond what 16 bits hold, as [`RowKind::CfaRspLarge`] encodes it;
/// `rbp` is the rbp rule in eighths of [`RowKind::CfaRsp`]'s `aux`.
fn large_frame(addr: u32, offset: i64, rbp: i8) -> Row {
    let eighths = offset / 8;
    // rbp unchanged, or pushed among the first callee-saved registers.
    let rbp = match rbp {
        0 => 0u8,
        -7..=-2 => rbp.unsigned_abs(),
        _ => return unsupported(addr),
    };
    if offset % 8 != 0 || !(1..1 << 21).contains(&eighths) {
        return unsupported(addr);
    }
    Row {
        addr,
        cfa_offset: eighths as u16 as i16,
        kind: RowKind::CfaRspLarge,
        aux: (((eighths >> 16) as u8) << 3 | rbp) as i8,
    }
}

/// `breg7 N; deref; plus_uconst 8`: the caller's rsp was saved at rsp + N. Returns N.
fn deref_rsp_expression(bytes: &[u8]) -> Option<i16> {
    let (&op, rest) = bytes.split_first()?;
    if op != DW_OP_BREG7 {
        return None;
    }
    let (n, rest) = sleb128(rest)?;
    match rest {
        [DW_OP_DEREF, DW_OP_PLUS_UCONST, 8] => i16::try_from(n).ok(),
        _ => None,
    }
}

/// A signed LEB128 number of at most 4 bytes and what follows it.
fn sleb128(bytes: &[u8]) -> Option<(i64, &[u8])> {
    let mut value: i64 = 0;
    for (i, &b) in bytes.iter().enumerate().take(4) {
        value |= i64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            let bits = 7 * (i + 1);
            if b & 0x40 != 0 {
                value |= -1i64 << bits;
            }
            return Some((value, &bytes[i + 1..]));
        }
    }
    None
}

/// The expression linkers emit for PLT stubs, `rsp + N + ((rip & 15) >= K) << 3`:
/// `breg7 N; breg16 0; lit15; and; litK; ge; lit3; shl; plus`. Returns (N, K).
fn plt_expression(bytes: &[u8]) -> Option<(i16, i8)> {
    match *bytes {
        [DW_OP_BREG7, n, DW_OP_BREG16, 0, DW_OP_LIT15, DW_OP_AND, lit, DW_OP_GE, DW_OP_LIT3, DW_OP_SHL, DW_OP_PLUS]
            if n < 0x40 && (DW_OP_LIT0..=DW_OP_LIT15).contains(&lit) =>
        {
            // A one-byte SLEB128 below 0x40 is the value itself.
            Some((i16::from(n), (lit - DW_OP_LIT0) as i8))
        }
        _ => None,
    }
}

//! Runs the CFI program of every FDE with gimli and folds the resulting rows into one sorted
//! table: FDEs sorted by address, an `End` row wherever one FDE stops short of the next,
//! redundant rows (same rule as the row before) dropped.

use std::ops::Range;

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, DebugFrame, EhFrame, EndianSlice, LittleEndian, Register,
    RegisterRule, UnwindContext, UnwindSection, UnwindTableRow,
};

use super::{Row, RowKind, TableStats, UnwindTable};

type Reader<'a> = EndianSlice<'a, LittleEndian>;

const RBP: Register = Register(6);
const RSP: Register = Register(7);
const RA: Register = Register(16);

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

pub(super) fn from_eh_frame(data: &[u8], svma: u64, text_svma: Option<u64>) -> UnwindTable {
    let section = EhFrame::new(data, LittleEndian);
    let mut bases = BaseAddresses::default().set_eh_frame(svma);
    if let Some(text) = text_svma {
        bases = bases.set_text(text);
    }
    build(&section, &bases, false)
}

pub(super) fn from_debug_frame(data: &[u8]) -> UnwindTable {
    let mut section = DebugFrame::new(data, LittleEndian);
    section.set_address_size(8);
    build(&section, &BaseAddresses::default(), true)
}

/// One FDE's range and its rows in the scratch vector.
struct Fde {
    start: u64,
    end: u64,
    rows: Range<usize>,
}

fn build<'a, S: UnwindSection<Reader<'a>>>(
    section: &S,
    bases: &BaseAddresses,
    from_debug_frame: bool,
) -> UnwindTable {
    let mut stats = TableStats {
        from_debug_frame,
        ..TableStats::default()
    };
    let mut ctx = Box::new(UnwindContext::new());
    let mut scratch: Vec<Row> = Vec::new();
    let mut fdes: Vec<Fde> = Vec::new();
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
        let ra_register_ok = fde.cie().return_address_register() == RA;
        let signal = fde.is_signal_trampoline();
        let first = scratch.len();
        let Ok(mut table) = fde.rows(section, bases, &mut ctx) else {
            stats.skipped_fdes += 1;
            continue;
        };
        let complete = loop {
            match table.next_row() {
                Ok(Some(row)) => {
                    let mut r = convert(row, section);
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
        fdes.push(Fde {
            start,
            end,
            rows: first..scratch.len(),
        });
    }
    fdes.sort_unstable_by_key(|f| f.start);

    let mut rows = Vec::with_capacity(scratch.len() / 2 + fdes.len());
    let mut covered_to = 0;
    for fde in &fdes {
        if fde.start < covered_to {
            stats.skipped_fdes += 1;
            continue;
        }
        for row in &scratch[fde.rows.clone()] {
            push(&mut rows, *row);
        }
        // Replaced by the next FDE's first row when it starts right here.
        push(&mut rows, end_row(fde.end as u32));
        covered_to = fde.end;
        stats.fdes += 1;
    }
    stats.unsupported_rows = rows
        .iter()
        .filter(|r| r.kind == RowKind::Unsupported)
        .count();
    UnwindTable { rows, stats }
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

/// One gimli row as a compact row.
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
                _ => unsupported(addr),
            }
        }
        CfaRule::Expression(expr) => {
            let plt = expr
                .get(section)
                .ok()
                .and_then(|e| plt_expression(e.0.slice()));
            match (plt, rbp) {
                (Some((cfa_offset, threshold)), Some(0)) => Row {
                    addr,
                    cfa_offset,
                    kind: RowKind::Plt,
                    aux: threshold,
                },
                _ => unsupported(addr),
            }
        }
    }
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

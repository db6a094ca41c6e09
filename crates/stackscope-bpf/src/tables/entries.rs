//! The byte layout of the walker's map entries (unwind.bpf.h's structs), and the check that the
//! loaded maps have it.

use crate::unwind_table::{MappingTable, Row};
use libbpf_rs::MapCore;

use super::TableError;

/// `struct unwind_row` and `struct unwind_mapping` of unwind.bpf.h, and a slot of
/// `unwind_tables` (a map's descriptor when written, its id when read).
pub(super) const ROW_SIZE: usize = 8;
pub(super) const TABLE_SLOT_SIZE: usize = 4;
pub(super) const MAPPING_SIZE: usize = 32;
pub(super) const PROC_SIZE: usize = 8;

pub(super) fn check(
    map: &dyn MapCore,
    name: &'static str,
    value_size: usize,
) -> Result<(), TableError> {
    let got = map.value_size();
    if got as usize != value_size {
        return Err(TableError::Layout {
            map: name,
            what: "value size",
            got,
            want: value_size as u32,
        });
    }
    if map.key_size() != 4 {
        return Err(TableError::Layout {
            map: name,
            what: "key size",
            got: map.key_size(),
            want: 4,
        });
    }
    Ok(())
}

/// `struct unwind_row`: `{u32 addr; s16 cfa_offset; u8 kind; s8 aux}`.
pub(super) fn row_bytes(row: &Row) -> [u8; ROW_SIZE] {
    let mut b = [0u8; ROW_SIZE];
    b[..4].copy_from_slice(&row.addr.to_ne_bytes());
    b[4..6].copy_from_slice(&row.cfa_offset.to_ne_bytes());
    b[6] = row.kind as u8;
    b[7] = row.aux as u8;
    b
}

/// `struct unwind_mapping`: `{u64 start, end, bias; u32 table, row_count}`.
pub(super) fn mapping_entry(m: &MappingTable, (table, rows): (u32, u32)) -> [u8; MAPPING_SIZE] {
    let mut b = [0u8; MAPPING_SIZE];
    b[..8].copy_from_slice(&m.start.to_ne_bytes());
    b[8..16].copy_from_slice(&m.end.to_ne_bytes());
    b[16..24].copy_from_slice(&m.bias.to_ne_bytes());
    b[24..28].copy_from_slice(&table.to_ne_bytes());
    b[28..32].copy_from_slice(&rows.to_ne_bytes());
    b
}

//! One file's rows as a BPF array of their own, sized to the file: the walker finds it through
//! `unwind_tables`, so row storage grows with what is mapped and no file is too large for a
//! fixed array.

use crate::unwind_table::Row;
use libbpf_rs::{MapHandle, MapType};

use super::entries::{row_bytes, ROW_SIZE};
use super::mapped::MappedArray;
use super::TableError;

/// Rows one file's table may have: the walker's binary search takes
/// `UNWIND_ROW_SEARCH_STEPS` (24) steps, enough for 1 << 24 rows.
pub(super) const MAX_ROWS: usize = 1 << 24;

/// A new array map holding `rows`, ready to be put into `unwind_tables`.
pub(super) fn create(rows: &[Row]) -> Result<MapHandle, TableError> {
    if rows.len() > MAX_ROWS {
        return Err(TableError::TooManyRows { rows: rows.len() });
    }
    let opts = libbpf_sys::bpf_map_create_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as _,
        // As unwind.bpf.h's `struct unwind_file_rows`: the kernel only accepts inner maps with
        // the flags of the map the program was verified with.
        map_flags: libbpf_sys::BPF_F_MMAPABLE | libbpf_sys::BPF_F_INNER_MAP,
        ..Default::default()
    };
    let map = MapHandle::create(
        MapType::Array,
        Some("unwind_file"),
        4,
        ROW_SIZE as u32,
        rows.len().max(1) as u32,
        &opts,
    )
    .map_err(|source| TableError::Create {
        rows: rows.len(),
        source,
    })?;
    let mut array = MappedArray::new(&map, "unwind_file", ROW_SIZE)?;
    for (i, row) in rows.iter().enumerate() {
        array.write(i as u32, &row_bytes(row));
    }
    Ok(map)
}

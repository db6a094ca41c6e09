//! Writes unwind tables into the BPF maps the in-kernel walker reads (`bpf/unwind.bpf.h`):
//! every file's rows into one shared row array, each process's mappings into a mapping
//! array, and the process's slice of that array into `unwind_procs`.
//!
//! The two arrays are memory-mapped (`BPF_F_MMAPABLE`), so a million rows are a memcpy, not a
//! million syscalls. A file's rows are written once and shared by every process mapping it;
//! rows and mappings are placed first-fit in free ranges, and tables no process uses any more
//! are evicted only when space runs out. What does not fit is reported in [`LoadStats`] and
//! walked by frame pointers.

mod entries;
mod free_ranges;
mod mapped;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::Arc;

use libbpf_rs::{MapCore, MapFlags};
use stackscope_linux::maps::ProcessMaps;
use stackscope_linux::unwind_table::{Row, TableCache, TableId};

use entries::{check, mapping_entry, row_bytes, MAPPING_SIZE, PROC_SIZE, ROW_SIZE};
use free_ranges::FreeRanges;
use mapped::MappedArray;

/// The maps of the walker, as the skeleton names them.
pub struct TableMaps<'a> {
    /// `unwind_rows`
    pub rows: &'a dyn MapCore,
    /// `unwind_mappings`
    pub mappings: &'a dyn MapCore,
    /// `unwind_procs`
    pub procs: &'a dyn MapCore,
}

#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("BPF map {map} has {what} {got}, stackscope expects {want}: the BPF program was built from another version of unwind.bpf.h")]
    Layout {
        map: &'static str,
        what: &'static str,
        got: u32,
        want: u32,
    },
    #[error(
        "cannot memory-map the BPF map {map} (it must be created with BPF_F_MMAPABLE): {source}"
    )]
    Mmap {
        map: &'static str,
        source: std::io::Error,
    },
    #[error("no room for the {count} mappings of pid {pid}: unwind_mappings holds {max} in all; profile fewer processes")]
    MappingsFull { pid: u32, count: usize, max: u32 },
    #[error("cannot write the unwind mappings of pid {pid} into unwind_procs: {source}")]
    Update { pid: u32, source: libbpf_rs::Error },
}

/// What one [`TableLoader::load_process`] did.
#[derive(Debug, Clone, Default)]
pub struct LoadStats {
    /// Executable mappings of the process.
    pub mappings: usize,
    /// Mappings unwound from a table (the others by frame pointers).
    pub with_table: usize,
    /// Rows written by this call (tables already in the map are not written again).
    pub rows_written: usize,
    /// Rows of all tables now in the map, and its capacity.
    pub rows_in_use: usize,
    pub rows_capacity: usize,
    /// Mapped files (or `[vdso]`, `//anon`) without a table: no CFI, unreadable, JIT code.
    pub without_table: Vec<Arc<str>>,
    /// Files whose table did not fit in `unwind_rows`.
    pub did_not_fit: Vec<Arc<str>>,
}

/// One line: "4 of 5 mappings unwound from tables (30726 rows written, 30726 of 2097152 in
/// use); no table: [vsyscall]; did not fit: ...".
impl std::fmt::Display for LoadStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} mappings unwound from tables ({} rows written, {} of {} in use)",
            self.with_table, self.mappings, self.rows_written, self.rows_in_use, self.rows_capacity
        )?;
        if !self.without_table.is_empty() {
            write!(f, "; no table: {}", self.without_table.join(", "))?;
        }
        if !self.did_not_fit.is_empty() {
            write!(f, "; did not fit: {}", self.did_not_fit.join(", "))?;
        }
        Ok(())
    }
}

/// Keeps the walker's maps filled for the profiled processes.
pub struct TableLoader {
    cache: TableCache,
    rows: MappedArray,
    mappings: MappedArray,
    free_rows: FreeRanges,
    free_mappings: FreeRanges,
    placed: HashMap<TableId, PlacedTable>,
    processes: HashMap<u32, ProcessEntry>,
}

/// A table's rows in `unwind_rows`.
#[derive(Debug)]
struct PlacedTable {
    rows: Range<u32>,
    /// Processes using it; 0 = may be evicted.
    users: u32,
}

#[derive(Debug)]
struct ProcessEntry {
    mappings: Range<u32>,
    tables: HashSet<TableId>,
}

impl TableLoader {
    /// Checks the maps match this code's layout and memory-maps the two arrays.
    pub fn new(maps: &TableMaps) -> Result<Self, TableError> {
        check(maps.rows, "unwind_rows", ROW_SIZE)?;
        check(maps.mappings, "unwind_mappings", MAPPING_SIZE)?;
        check(maps.procs, "unwind_procs", PROC_SIZE)?;
        let rows = MappedArray::new(maps.rows, "unwind_rows", ROW_SIZE)?;
        let mappings = MappedArray::new(maps.mappings, "unwind_mappings", MAPPING_SIZE)?;
        Ok(TableLoader {
            cache: TableCache::new(),
            free_rows: FreeRanges::new(rows.len),
            free_mappings: FreeRanges::new(mappings.len),
            rows,
            mappings,
            placed: HashMap::new(),
            processes: HashMap::new(),
        })
    }

    /// Loads (or reloads, after an exec or a new mapping) the tables of process `pid`, whose
    /// executable mappings are `pmaps`, then points the walker at them in one map update.
    pub fn load_process(
        &mut self,
        maps: &TableMaps,
        pid: u32,
        pmaps: &ProcessMaps,
    ) -> Result<LoadStats, TableError> {
        let process = self.cache.process(pid, pmaps);
        let mut stats = LoadStats {
            mappings: process.mappings.len(),
            rows_capacity: self.rows.len as usize,
            ..LoadStats::default()
        };
        let mut tables = HashSet::new();
        let mut entries = Vec::with_capacity(process.mappings.len());
        for m in &process.mappings {
            let rows = match &m.table {
                Some((id, table)) => {
                    let placed = self.place(*id, table.rows(), &mut stats);
                    if placed.is_none() && !stats.did_not_fit.contains(&m.path) {
                        stats.did_not_fit.push(m.path.clone());
                    }
                    if placed.is_some() && tables.insert(*id) {
                        self.placed.get_mut(id).expect("just placed").users += 1;
                    }
                    placed
                }
                None => {
                    if !stats.without_table.contains(&m.path) {
                        stats.without_table.push(m.path.clone());
                    }
                    None
                }
            };
            stats.with_table += usize::from(rows.is_some());
            entries.push(mapping_entry(m, rows.unwrap_or(0..0)));
        }

        let count = entries.len() as u32;
        let Some(slots) = self.free_mappings.alloc(count) else {
            self.release(&tables);
            return Err(TableError::MappingsFull {
                pid,
                count: entries.len(),
                max: self.mappings.len,
            });
        };
        for (i, e) in entries.iter().enumerate() {
            self.mappings.write(slots.start + i as u32, e);
        }
        let mut value = [0u8; PROC_SIZE];
        value[..4].copy_from_slice(&slots.start.to_ne_bytes());
        value[4..].copy_from_slice(&count.to_ne_bytes());
        if let Err(source) = maps.procs.update(&pid.to_ne_bytes(), &value, MapFlags::ANY) {
            self.free_mappings.free(slots);
            self.release(&tables);
            return Err(TableError::Update { pid, source });
        }
        let old = self.processes.insert(
            pid,
            ProcessEntry {
                mappings: slots,
                tables,
            },
        );
        if let Some(old) = old {
            self.free_mappings.free(old.mappings);
            self.release(&old.tables);
        }
        stats.rows_in_use = (self.rows.len - self.free_rows.total()) as usize;
        Ok(stats)
    }

    /// Drops process `pid` from the maps (it exited); its tables stay cached for others.
    pub fn forget_process(&mut self, maps: &TableMaps, pid: u32) -> Result<(), TableError> {
        let Some(old) = self.processes.remove(&pid) else {
            return Ok(());
        };
        // Already gone from the map is fine.
        let _ = maps.procs.delete(&pid.to_ne_bytes());
        self.free_mappings.free(old.mappings);
        self.release(&old.tables);
        Ok(())
    }

    /// The rows of table `id`, written into `unwind_rows` if they are not there yet; `None`
    /// when they do not fit even after evicting unused tables.
    fn place(&mut self, id: TableId, rows: &[Row], stats: &mut LoadStats) -> Option<Range<u32>> {
        if let Some(p) = self.placed.get(&id) {
            return Some(p.rows.clone());
        }
        let count = u32::try_from(rows.len()).ok()?;
        let range = match self.free_rows.alloc(count) {
            Some(r) => r,
            None => {
                self.evict_unused();
                self.free_rows.alloc(count)?
            }
        };
        for (i, row) in rows.iter().enumerate() {
            self.rows.write(range.start + i as u32, &row_bytes(row));
        }
        stats.rows_written += rows.len();
        self.placed.insert(
            id,
            PlacedTable {
                rows: range.clone(),
                users: 0,
            },
        );
        Some(range)
    }

    fn release(&mut self, tables: &HashSet<TableId>) {
        for id in tables {
            if let Some(p) = self.placed.get_mut(id) {
                p.users = p.users.saturating_sub(1);
            }
        }
    }

    fn evict_unused(&mut self) {
        let unused: Vec<TableId> = self
            .placed
            .iter()
            .filter(|(_, p)| p.users == 0)
            .map(|(id, _)| *id)
            .collect();
        for id in &unused {
            if let Some(p) = self.placed.remove(id) {
                self.free_rows.free(p.rows);
            }
        }
        let placed = &self.placed;
        self.cache.retain(|id| placed.contains_key(&id));
    }
}

//! Writes unwind tables into the BPF maps the in-kernel walker reads (`bpf/unwind.bpf.h`):
//! every file's rows into a BPF array of their own, sized to the file and put into
//! `unwind_tables`, each process's mappings into a mapping array, and the process's slice of
//! that array into `unwind_procs`.
//!
//! Row storage grows with what is mapped: a file of a million rows gets a map of a million
//! rows, written through shared memory (`BPF_F_MMAPABLE`), a memcpy rather than a million
//! syscalls. A file's rows are written once and shared by every process mapping it; tables no
//! process uses any more are dropped only when the kernel refuses room for a new one. What
//! does not fit is counted ([`TableLoader::not_loaded`]) and walked by frame pointers.
mod entries;
mod file_rows;
mod free_ranges;
mod mapped;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::Arc;

use crate::unwind_table::{ProcessTables, Row, TableCache, TableId};
use libbpf_rs::MapHandle;
use libbpf_rs::{MapCore, MapFlags, MapType};
use stackscope_stacks::AddressSpace;
use std::os::fd::{AsFd, AsRawFd};

use entries::{check, mapping_entry, MAPPING_SIZE, PROC_SIZE, TABLE_SLOT_SIZE};
use free_ranges::FreeRanges;
use mapped::MappedArray;

/// The maps of the walker, as the skeleton names them.
pub struct TableMaps<'a> {
    /// `unwind_tables`
    pub tables: &'a dyn MapCore,
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
    #[error("BPF map unwind_tables must be an array of maps, not {0:?}")]
    NotMapOfMaps(MapType),
    #[error("{rows} rows, more than the walker's search reaches (16777216)")]
    TooManyRows { rows: usize },
    #[error("the kernel refused a map of {rows} rows: {source}")]
    Create {
        rows: usize,
        source: libbpf_rs::Error,
    },
    #[error("the kernel holds at most {slots} files' tables at once, all taken by files in use")]
    NoSlot { slots: u32 },
    #[error("cannot put a table into unwind_tables: {source}")]
    Insert { source: libbpf_rs::Error },
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
    /// Rows written by this call (tables already in the kernel are not written again).
    pub rows_written: usize,
    /// Rows of all tables now in the kernel, and how many files' tables they are.
    pub rows_in_use: usize,
    pub tables_in_use: usize,
    /// Mapped files (or `[vdso]`, `//anon`) without a table: no CFI, unreadable, JIT code.
    pub without_table: Vec<Arc<str>>,
    /// Files whose table could not be loaded.
    pub did_not_fit: Vec<Arc<str>>,
}

/// One line: "4 of 5 mappings unwound from tables (30726 rows written, 30726 in 4 tables
/// in use); no table: [vsyscall]; did not fit: ...".
impl std::fmt::Display for LoadStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} mappings unwound from tables ({} rows written, {} in {} tables in use)",
            self.with_table, self.mappings, self.rows_written, self.rows_in_use, self.tables_in_use
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

/// The tables that could not be loaded during a recording, for the message at its end.
#[derive(Debug, Clone, Default)]
pub struct NotLoaded {
    /// Each file once, with its rows, in the order met.
    pub files: Vec<(Arc<str>, usize)>,
    /// Why the last one was refused.
    pub reason: String,
}

impl NotLoaded {
    pub fn rows(&self) -> usize {
        self.files.iter().map(|f| f.1).sum()
    }
}

/// Keeps the walker's maps filled for the profiled processes.
pub struct TableLoader {
    cache: TableCache,
    mappings: MappedArray,
    free_slots: FreeRanges,
    slots: u32,
    free_mappings: FreeRanges,
    placed: HashMap<TableId, PlacedTable>,
    processes: HashMap<u32, ProcessEntry>,
    rows_in_use: usize,
    not_loaded: NotLoaded,
}

/// The tables one [`TableLoader::load_process`] made, each with its slot, not yet in
/// `unwind_tables`.
#[derive(Default)]
struct Pending {
    tables: Vec<(TableId, u32, MapHandle)>,
}

/// A table in `unwind_tables`.
#[derive(Debug)]
struct PlacedTable {
    slot: u32,
    rows: u32,
    /// Processes using it; 0 = may be dropped.
    users: u32,
}

#[derive(Debug)]
struct ProcessEntry {
    mappings: Range<u32>,
    tables: HashSet<TableId>,
}

impl TableLoader {
    /// Checks the maps match this code's layout and memory-maps the mapping array.
    pub fn new(maps: &TableMaps) -> Result<Self, TableError> {
        if maps.tables.map_type() != MapType::ArrayOfMaps {
            return Err(TableError::NotMapOfMaps(maps.tables.map_type()));
        }
        check(maps.tables, "unwind_tables", TABLE_SLOT_SIZE)?;
        check(maps.mappings, "unwind_mappings", MAPPING_SIZE)?;
        check(maps.procs, "unwind_procs", PROC_SIZE)?;
        let mappings = MappedArray::new(maps.mappings, "unwind_mappings", MAPPING_SIZE)?;
        let slots = maps.tables.max_entries();
        Ok(TableLoader {
            cache: TableCache::with_disk(crate::unwind_table::disk_cache::dir_from_env()),
            free_slots: FreeRanges::new(slots),
            slots,
            free_mappings: FreeRanges::new(mappings.len),
            mappings,
            placed: HashMap::new(),
            processes: HashMap::new(),
            rows_in_use: 0,
            not_loaded: NotLoaded::default(),
        })
    }

    /// The files whose tables could not be loaded so far.
    pub fn not_loaded(&self) -> &NotLoaded {
        &self.not_loaded
    }

    /// Loads (or reloads, after an exec or a new mapping) the tables of process `pid`, whose
    /// executable mappings are `pmaps`, then points the walker at them in one map update.
    ///
    /// The new tables go into `unwind_tables` in one batch: the kernel waits for running BPF
    /// programs (an RCU grace period, milliseconds on a busy machine) after every update of a
    /// map of maps, once per batch rather than once per file.
    pub fn load_process(
        &mut self,
        maps: &TableMaps,
        pid: u32,
        pmaps: &AddressSpace,
    ) -> Result<LoadStats, TableError> {
        let process = self.cache.process(pid, pmaps);
        let mut stats = LoadStats {
            mappings: process.mappings.len(),
            ..LoadStats::default()
        };
        let mut tables = HashSet::new();
        let mut pending = Pending::default();
        for m in &process.mappings {
            // A file of another architecture (run by an emulator) has rows the walker cannot
            // follow: frame pointers then.
            let table = m
                .table
                .as_ref()
                .filter(|(_, t)| Some(t.arch()) == crate::unwind_table::WALKER_ARCH);
            match table {
                Some((id, table)) => match self.place(maps, *id, table.rows(), &mut pending) {
                    Ok(_) => {
                        if tables.insert(*id) {
                            self.placed.get_mut(id).expect("just placed").users += 1;
                        }
                    }
                    Err(e) => self.refused(&m.path, table.rows().len(), e, &mut stats),
                },
                None => {
                    if !stats.without_table.contains(&m.path) {
                        stats.without_table.push(m.path.clone());
                    }
                }
            }
        }
        for (id, e) in self.commit(maps, pending, &mut stats) {
            tables.remove(&id);
            if let Some(m) = process
                .mappings
                .iter()
                .find(|m| m.table.as_ref().is_some_and(|t| t.0 == id))
            {
                let rows = m.table.as_ref().map_or(0, |t| t.1.rows().len());
                self.refused(&m.path, rows, e, &mut stats);
            }
        }
        self.point_walker(maps, pid, &process, tables, &mut stats)?;
        stats.rows_in_use = self.rows_in_use;
        stats.tables_in_use = self.placed.len();
        Ok(stats)
    }

    /// Writes the mappings of `process` (pid `pid`), each with its table's slot where that
    /// table is in `tables`, and points `unwind_procs` at them; the process's old mappings and
    /// tables are let go.
    fn point_walker(
        &mut self,
        maps: &TableMaps,
        pid: u32,
        process: &ProcessTables,
        tables: HashSet<TableId>,
        stats: &mut LoadStats,
    ) -> Result<(), TableError> {
        let entries: Vec<_> = process
            .mappings
            .iter()
            .map(|m| {
                let placed = m.table.as_ref().and_then(|(id, table)| {
                    let slot = self.placed.get(id).filter(|_| tables.contains(id))?.slot;
                    Some((slot, table.rows().len() as u32))
                });
                stats.with_table += usize::from(placed.is_some());
                mapping_entry(m, placed.unwrap_or((0, 0)))
            })
            .collect();
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
        Ok(())
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

    /// Notes a file whose table was refused, once per file.
    fn refused(&mut self, path: &Arc<str>, rows: usize, e: TableError, stats: &mut LoadStats) {
        if !stats.did_not_fit.contains(path) {
            stats.did_not_fit.push(path.clone());
        }
        if !self.not_loaded.files.iter().any(|f| f.0 == *path) {
            self.not_loaded.files.push((path.clone(), rows));
        }
        self.not_loaded.reason = e.to_string();
    }

    /// The slot of table `id` in `unwind_tables`; a table not in the kernel yet gets its rows
    /// written into a map of their own, put into the slot by [`Self::commit`]. When the kernel
    /// refuses room, the tables no process uses are dropped and it is asked once more.
    fn place(
        &mut self,
        maps: &TableMaps,
        id: TableId,
        rows: &[Row],
        pending: &mut Pending,
    ) -> Result<u32, TableError> {
        if let Some(p) = self.placed.get(&id) {
            return Ok(p.slot);
        }
        let (slot, map) = match self.create(rows) {
            Err(TableError::TooManyRows { rows }) => return Err(TableError::TooManyRows { rows }),
            Err(_) if self.evict_unused(maps) => self.create(rows)?,
            other => other?,
        };
        pending.tables.push((id, slot, map));
        self.rows_in_use += rows.len();
        self.placed.insert(
            id,
            PlacedTable {
                slot,
                rows: rows.len() as u32,
                users: 0,
            },
        );
        Ok(slot)
    }

    /// A free slot of `unwind_tables` and the map of `rows` to put there.
    fn create(&mut self, rows: &[Row]) -> Result<(u32, MapHandle), TableError> {
        let Some(slot) = self.free_slots.alloc(1) else {
            return Err(TableError::NoSlot { slots: self.slots });
        };
        match file_rows::create(rows) {
            Ok(map) => Ok((slot.start, map)),
            Err(e) => {
                self.free_slots.free(slot);
                Err(e)
            }
        }
    }

    /// Puts the tables [`Self::place`] made into their slots, in one batch (one by one if the
    /// kernel refuses the batch); returns those that could not be put, now forgotten.
    fn commit(
        &mut self,
        maps: &TableMaps,
        pending: Pending,
        stats: &mut LoadStats,
    ) -> Vec<(TableId, TableError)> {
        if pending.tables.is_empty() {
            return Vec::new();
        }
        let keys: Vec<u8> = pending
            .tables
            .iter()
            .flat_map(|t| t.1.to_ne_bytes())
            .collect();
        let fds: Vec<u8> = pending
            .tables
            .iter()
            .flat_map(|t| (t.2.as_fd().as_raw_fd() as u32).to_ne_bytes())
            .collect();
        let count = pending.tables.len() as u32;
        let batch = maps
            .tables
            .update_batch(&keys, &fds, count, MapFlags::ANY, MapFlags::ANY);
        let mut failed = Vec::new();
        for (id, slot, map) in &pending.tables {
            let rows = self.placed.get(id).map_or(0, |p| p.rows as usize);
            let put = match &batch {
                Ok(()) => Ok(()),
                Err(_) => {
                    let fd = map.as_fd().as_raw_fd() as u32;
                    maps.tables
                        .update(&slot.to_ne_bytes(), &fd.to_ne_bytes(), MapFlags::ANY)
                        .map_err(|source| TableError::Insert { source })
                }
            };
            match put {
                // The outer map holds the table from here on; our descriptor may close.
                Ok(()) => stats.rows_written += rows,
                Err(e) => {
                    self.placed.remove(id);
                    self.free_slots.free(*slot..*slot + 1);
                    self.rows_in_use -= rows;
                    failed.push((*id, e));
                }
            }
        }
        failed
    }

    fn release(&mut self, tables: &HashSet<TableId>) {
        for id in tables {
            if let Some(p) = self.placed.get_mut(id) {
                p.users = p.users.saturating_sub(1);
            }
        }
    }

    /// Drops the tables no process uses; true when there were any.
    fn evict_unused(&mut self, maps: &TableMaps) -> bool {
        let unused: Vec<TableId> = self
            .placed
            .iter()
            .filter(|(_, p)| p.users == 0)
            .map(|(id, _)| *id)
            .collect();
        for id in &unused {
            if let Some(p) = self.placed.remove(id) {
                let _ = maps.tables.delete(&p.slot.to_ne_bytes());
                self.free_slots.free(p.slot..p.slot + 1);
                self.rows_in_use -= p.rows as usize;
            }
        }
        let placed = &self.placed;
        self.cache.retain(|id| placed.contains_key(&id));
        !unused.is_empty()
    }
}

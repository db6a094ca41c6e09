//! Writes unwind tables into the BPF maps the in-kernel walker reads (`bpf/unwind.bpf.h`):
//! every file's rows into one shared row array, each process's mappings into a mapping
//! array, and the process's slice of that array into `unwind_procs`.
//!
//! The two arrays are memory-mapped (`BPF_F_MMAPABLE`), so a million rows are a memcpy, not a
//! million syscalls. A file's rows are written once and shared by every process mapping it;
//! rows and mappings are placed first-fit in free ranges, and tables no process uses any more
//! are evicted only when space runs out. What does not fit is reported in [`LoadStats`] and
//! walked by frame pointers.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use libbpf_rs::{MapCore, MapFlags};
use stackscope_linux::maps::ProcessMaps;
use stackscope_linux::unwind_table::{MappingTable, Row, TableCache, TableId};

/// `struct unwind_row` and `struct unwind_mapping` of unwind.bpf.h.
const ROW_SIZE: usize = 8;
const MAPPING_SIZE: usize = 32;
const PROC_SIZE: usize = 8;

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

fn check(map: &dyn MapCore, name: &'static str, value_size: usize) -> Result<(), TableError> {
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
fn row_bytes(row: &Row) -> [u8; ROW_SIZE] {
    let mut b = [0u8; ROW_SIZE];
    b[..4].copy_from_slice(&row.addr.to_ne_bytes());
    b[4..6].copy_from_slice(&row.cfa_offset.to_ne_bytes());
    b[6] = row.kind as u8;
    b[7] = row.aux as u8;
    b
}

/// `struct unwind_mapping`: `{u64 start, end, bias; u32 row_first, row_count}`.
fn mapping_entry(m: &MappingTable, rows: Range<u32>) -> [u8; MAPPING_SIZE] {
    let mut b = [0u8; MAPPING_SIZE];
    b[..8].copy_from_slice(&m.start.to_ne_bytes());
    b[8..16].copy_from_slice(&m.end.to_ne_bytes());
    b[16..24].copy_from_slice(&m.bias.to_ne_bytes());
    b[24..28].copy_from_slice(&rows.start.to_ne_bytes());
    b[28..32].copy_from_slice(&(rows.end - rows.start).to_ne_bytes());
    b
}

/// A `BPF_F_MMAPABLE` array map, mapped shared into our memory.
struct MappedArray {
    ptr: *mut u8,
    bytes: usize,
    stride: usize,
    len: u32,
}

// SAFETY: the mapping is owned by this value and only written through `&mut self`.
unsafe impl Send for MappedArray {}

impl MappedArray {
    fn new(map: &dyn MapCore, name: &'static str, value_size: usize) -> Result<Self, TableError> {
        let len = map.max_entries();
        // Array elements are laid out 8-byte aligned.
        let stride = value_size.next_multiple_of(8);
        let page = 4096;
        let bytes = (len as usize * stride).next_multiple_of(page);
        // SAFETY: a shared mapping of the map's fd, of the size the kernel allocated for it;
        // checked for failure below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                map.as_fd().as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(TableError::Mmap {
                map: name,
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(MappedArray {
            ptr: ptr.cast(),
            bytes,
            stride,
            len,
        })
    }

    fn write(&mut self, index: u32, value: &[u8]) {
        assert!(index < self.len && value.len() <= self.stride);
        // SAFETY: index is in bounds (checked above) and the value fits its slot.
        unsafe {
            std::ptr::copy_nonoverlapping(
                value.as_ptr(),
                self.ptr.add(index as usize * self.stride),
                value.len(),
            );
        }
    }
}

impl Drop for MappedArray {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what new() mapped.
        unsafe { libc::munmap(self.ptr.cast(), self.bytes) };
    }
}

/// Free index ranges of an array, first fit, merged when freed.
#[derive(Debug)]
struct FreeRanges {
    /// Sorted, disjoint, never adjacent.
    free: Vec<Range<u32>>,
}

impl FreeRanges {
    fn new(len: u32) -> Self {
        let mut free = Vec::new();
        if len > 0 {
            free.push(0..len);
        }
        FreeRanges { free }
    }

    fn alloc(&mut self, count: u32) -> Option<Range<u32>> {
        if count == 0 {
            return Some(0..0);
        }
        let i = self.free.iter().position(|r| r.end - r.start >= count)?;
        let r = &mut self.free[i];
        let out = r.start..r.start + count;
        r.start += count;
        if r.start == r.end {
            self.free.remove(i);
        }
        Some(out)
    }

    fn free(&mut self, range: Range<u32>) {
        if range.start >= range.end {
            return;
        }
        let i = self.free.partition_point(|r| r.start < range.start);
        self.free.insert(i, range);
        // Merge with the next, then with the previous.
        if i + 1 < self.free.len() && self.free[i].end == self.free[i + 1].start {
            self.free[i].end = self.free[i + 1].end;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].end == self.free[i].start {
            self.free[i - 1].end = self.free[i].end;
            self.free.remove(i);
        }
    }

    fn total(&self) -> u32 {
        self.free.iter().map(|r| r.end - r.start).sum()
    }
}

#[cfg(test)]
mod tests {
    use std::process::{Child, Command};

    use libbpf_rs::{MapHandle, MapType};
    use stackscope_linux::unwind_table::TableCache;

    use super::*;

    /// Real kernel maps shaped as unwind.bpf.h declares them, `rows` entries in the row array.
    struct Maps {
        rows: MapHandle,
        mappings: MapHandle,
        procs: MapHandle,
    }

    impl Maps {
        fn new(rows: u32) -> Self {
            let mmapable = libbpf_sys::bpf_map_create_opts {
                sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as _,
                map_flags: libbpf_sys::BPF_F_MMAPABLE,
                ..Default::default()
            };
            let plain = libbpf_sys::bpf_map_create_opts {
                sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as _,
                ..Default::default()
            };
            let create = |t, name: &str, value, n, opts| {
                MapHandle::create(t, Some(name), 4, value, n, opts)
                    .unwrap_or_else(|e| panic!("cannot create BPF map {name} (needs root): {e}"))
            };
            Maps {
                rows: create(MapType::Array, "unwind_rows", 8, rows, &mmapable),
                mappings: create(MapType::Array, "unwind_mappings", 32, 1024, &mmapable),
                procs: create(MapType::Hash, "unwind_procs", 8, 64, &plain),
            }
        }

        fn table_maps(&self) -> TableMaps<'_> {
            TableMaps {
                rows: &self.rows,
                mappings: &self.mappings,
                procs: &self.procs,
            }
        }

        fn proc(&self, pid: u32) -> Option<(u32, u32)> {
            let v = self
                .procs
                .lookup(&pid.to_ne_bytes(), MapFlags::ANY)
                .unwrap()?;
            Some((
                u32::from_ne_bytes(v[..4].try_into().unwrap()),
                u32::from_ne_bytes(v[4..].try_into().unwrap()),
            ))
        }

        /// A mapping entry, read back through the kernel (not through our mmap).
        fn mapping(&self, i: u32) -> (u64, u64, u64, u32, u32) {
            let v = self
                .mappings
                .lookup(&i.to_ne_bytes(), MapFlags::ANY)
                .unwrap()
                .unwrap();
            let u64_at = |o: usize| u64::from_ne_bytes(v[o..o + 8].try_into().unwrap());
            let u32_at = |o: usize| u32::from_ne_bytes(v[o..o + 4].try_into().unwrap());
            (u64_at(0), u64_at(8), u64_at(16), u32_at(24), u32_at(28))
        }

        fn row(&self, i: u32) -> Vec<u8> {
            self.rows
                .lookup(&i.to_ne_bytes(), MapFlags::ANY)
                .unwrap()
                .unwrap()
        }
    }

    /// A sleeping process; killed on drop.
    struct Sleeper(Child);

    impl Sleeper {
        fn start() -> Self {
            let child = Command::new("sleep").arg("60").spawn().unwrap();
            // Wait for exec and for the dynamic loader to map libc.
            let exe = std::fs::canonicalize("/proc/self/exe").unwrap();
            for _ in 0..2000 {
                let execed =
                    std::fs::read_link(format!("/proc/{}/exe", child.id())).is_ok_and(|p| p != exe);
                let maps = ProcessMaps::from_proc(child.id()).unwrap_or_default();
                if execed && maps.iter().any(|m| m.path.contains("libc")) {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Sleeper(child)
        }

        fn pid(&self) -> u32 {
            self.0.id()
        }

        fn maps(&self) -> ProcessMaps {
            ProcessMaps::from_proc(self.pid()).unwrap()
        }
    }

    impl Drop for Sleeper {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn process_tables_land_in_the_maps_and_are_shared() {
        let maps = Maps::new(1 << 20);
        let tm = maps.table_maps();
        let mut loader = TableLoader::new(&tm).unwrap();
        let (a, b) = (Sleeper::start(), Sleeper::start());

        let stats = loader.load_process(&tm, a.pid(), &a.maps()).unwrap();
        assert!(stats.did_not_fit.is_empty(), "{stats:?}");
        assert!(stats.with_table >= 3, "sleep, libc, ld.so: {stats:?}");
        assert!(stats.rows_written > 1000, "{stats:?}");
        assert_eq!(stats.rows_in_use, stats.rows_written);

        // The entries say, through the kernel, what the tables of this process say.
        let (first, count) = maps.proc(a.pid()).expect("pid in unwind_procs");
        let expected = TableCache::new().process(a.pid(), &a.maps());
        assert_eq!(count as usize, expected.mappings.len());
        for (i, want) in expected.mappings.iter().enumerate() {
            let (start, end, bias, row_first, row_count) = maps.mapping(first + i as u32);
            assert_eq!((start, end), (want.start, want.end), "{}", want.path);
            let Some((_, table)) = &want.table else {
                assert_eq!(row_count, 0, "{} has no table", want.path);
                continue;
            };
            assert_eq!(bias, want.bias, "{}", want.path);
            assert_eq!(row_count as usize, table.rows().len(), "{}", want.path);
            for (k, row) in table.rows().iter().enumerate() {
                assert_eq!(
                    maps.row(row_first + k as u32),
                    row_bytes(row),
                    "{} row {k}",
                    want.path
                );
            }
        }
        let starts: Vec<u64> = (0..count).map(|i| maps.mapping(first + i).0).collect();
        assert!(
            starts.windows(2).all(|w| w[0] < w[1]),
            "mappings sorted by start"
        );

        // The same files in a second process: nothing new written.
        let again = loader.load_process(&tm, b.pid(), &b.maps()).unwrap();
        assert_eq!(again.rows_written, 0, "{again:?}");
        assert_eq!(again.rows_in_use, stats.rows_in_use);
        // Reloading a process rewrites its entries, not its tables.
        let reload = loader.load_process(&tm, a.pid(), &a.maps()).unwrap();
        assert_eq!(reload.rows_written, 0);
        assert!(maps.proc(a.pid()).is_some());

        loader.forget_process(&tm, a.pid()).unwrap();
        assert_eq!(maps.proc(a.pid()), None);
        assert!(maps.proc(b.pid()).is_some());
    }

    #[test]
    fn tables_that_do_not_fit_are_reported_and_walked_by_frame_pointers() {
        // Room for ld.so's and sleep's tables, not libc's.
        let maps = Maps::new(8192);
        let tm = maps.table_maps();
        let mut loader = TableLoader::new(&tm).unwrap();
        let a = Sleeper::start();
        let stats = loader.load_process(&tm, a.pid(), &a.maps()).unwrap();
        assert!(
            stats.did_not_fit.iter().any(|p| p.contains("libc")),
            "{stats:?}"
        );
        assert!(stats.with_table >= 1, "{stats:?}");
        assert!(stats.rows_in_use <= 8192);
        let (first, count) = maps.proc(a.pid()).unwrap();
        let libc = a
            .maps()
            .iter()
            .position(|m| m.path.contains("libc"))
            .unwrap() as u32;
        assert!(libc < count);
        assert_eq!(
            maps.mapping(first + libc).4,
            0,
            "libc: no rows, frame pointers"
        );

        // Gone processes leave their tables for the next one, evicted as room is needed.
        loader.forget_process(&tm, a.pid()).unwrap();
        drop(a);
        let b = Sleeper::start();
        let again = loader.load_process(&tm, b.pid(), &b.maps()).unwrap();
        assert!(
            again.did_not_fit.iter().any(|p| p.contains("libc")),
            "{again:?}"
        );
        assert_eq!(again.with_table, stats.with_table, "{again:?}");
        assert!(again.to_string().contains("did not fit: "), "{again}");
        assert!(again.rows_in_use <= 8192);
    }

    #[test]
    fn maps_of_another_layout_are_refused() {
        let maps = Maps::new(16);
        let wrong = TableMaps {
            rows: &maps.mappings,
            mappings: &maps.mappings,
            procs: &maps.procs,
        };
        let err = TableLoader::new(&wrong).err().expect("refused");
        assert!(err.to_string().contains("unwind_rows"), "{err}");
    }

    #[test]
    fn free_ranges_reuse_and_merge() {
        let mut f = FreeRanges::new(10);
        let a = f.alloc(4).unwrap();
        let b = f.alloc(4).unwrap();
        assert_eq!((a.clone(), b.clone()), (0..4, 4..8));
        assert!(f.alloc(3).is_none(), "only 2 left");
        f.free(a);
        assert_eq!(f.alloc(3), Some(0..3));
        f.free(0..3);
        f.free(b);
        assert_eq!(f.free, vec![0..10]);
        // Nothing to place takes nothing, even from a full array.
        assert_eq!(f.alloc(10), Some(0..10));
        assert_eq!(f.alloc(0), Some(0..0));
        f.free(0..0);
        f.free(0..10);
        assert_eq!(f.total(), 10);
    }
}

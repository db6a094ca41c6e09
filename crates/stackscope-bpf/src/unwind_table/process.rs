//! Per-process assembly: each executable mapping of a process with the bias that turns its
//! addresses into file virtual addresses and the table of the file behind it. Tables are
//! built once per file identity (device, inode, size, mtime) and shared by every process that
//! maps the file; the vDSO's table comes from our own vDSO, the same image in every process.
//! The files a process brings that no table was built for yet are compiled side by side, one
//! thread per core, or read from the disk cache (`disk_cache`) when it holds their build.

use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::{disk_cache, UnwindTable};
use stackscope_process::maps::{open_mapped_file, own_vdso, Mapping};
use stackscope_stacks::module::ModuleFile;
use stackscope_stacks::AddressSpace;
use stackscope_symbols::FileId;

/// Identifies a table for as long as the [`TableCache`] that built it lives; a rebuilt file
/// gets a new id.
pub type TableId = u64;

/// One executable mapping of a process.
#[derive(Debug, Clone)]
pub struct MappingTable {
    pub start: u64,
    pub end: u64,
    /// File virtual address = address - bias (wrapping).
    pub bias: u64,
    /// `None`: no table (anonymous/JIT code, files without CFI or that cannot be read): walk
    /// by frame pointers.
    pub table: Option<(TableId, Arc<UnwindTable>)>,
    /// The mapped path, as in `/proc/PID/maps`.
    pub path: Arc<str>,
}

/// The mappings of one process, sorted by address.
#[derive(Debug, Clone, Default)]
pub struct ProcessTables {
    pub mappings: Vec<MappingTable>,
}

/// Tables of every file seen, shared between processes.
#[derive(Debug, Default)]
pub struct TableCache {
    /// `None` for files that are not readable ELF or have no CFI.
    files: HashMap<FileId, Option<Arc<ModuleTable>>>,
    vdso: Option<Option<Arc<ModuleTable>>>,
    next_id: TableId,
    /// Where tables are kept between recordings; `None`: compiled every time.
    disk: Option<PathBuf>,
}

/// A file's table and what is needed to place it in a process.
#[derive(Debug)]
struct ModuleTable {
    id: TableId,
    module: Arc<ModuleFile>,
    table: Arc<UnwindTable>,
}

impl TableCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// A cache that also keeps tables in `dir` between recordings (see `disk_cache`).
    pub fn with_disk(dir: Option<PathBuf>) -> Self {
        TableCache {
            disk: dir,
            ..Self::default()
        }
    }

    /// The mappings of process `pid` (whose executable mappings are `maps`) with their tables,
    /// building the tables of files not seen before.
    pub fn process(&mut self, pid: u32, maps: &AddressSpace) -> ProcessTables {
        self.build_new_files(pid, maps);
        let mappings = maps
            .iter()
            .map(|m| {
                let table = self.module_table(pid, m).and_then(|t| {
                    // The file on disk was replaced since the process mapped it: its CFI would lie.
                    if let (Some(mapped), Some(on_disk)) = (&m.build_id, t.module.build_id()) {
                        if **mapped != *on_disk {
                            return None;
                        }
                    }
                    Some((t.module.bias(m)?, (t.id, t.table.clone())))
                });
                MappingTable {
                    start: m.start,
                    end: m.end,
                    bias: table.as_ref().map_or(0, |t| t.0),
                    table: table.map(|t| t.1),
                    path: m.path.clone(),
                }
            })
            .collect();
        ProcessTables { mappings }
    }

    /// Drops the tables no longer wanted (`keep` says which ids still are), so a rebuilt or
    /// unmapped file's table does not stay in memory.
    pub fn retain(&mut self, mut keep: impl FnMut(TableId) -> bool) {
        self.files
            .retain(|_, t| t.as_ref().is_none_or(|t| keep(t.id)));
    }

    fn module_table(&mut self, pid: u32, m: &Mapping) -> Option<Arc<ModuleTable>> {
        if &*m.path == "[vdso]" {
            if self.vdso.is_none() {
                let table = own_vdso().and_then(|module| {
                    let table = UnwindTable::from_module(&module)?;
                    Some(self.new_table(module, table))
                });
                self.vdso = Some(table);
            }
            return self.vdso.clone().flatten();
        }
        if !m.is_file() {
            return None;
        }
        let file = open_mapped_file(pid, m)?;
        self.files
            .get(&FileId::of_file(&file).ok()?)
            .cloned()
            .flatten()
    }

    /// Builds the tables of the files mapped in `maps` that were not seen before, side by
    /// side, each from the disk cache when it has it.
    fn build_new_files(&mut self, pid: u32, maps: &AddressSpace) {
        let mut todo: Vec<(FileId, File, Arc<str>)> = Vec::new();
        for m in maps.iter().filter(|m| m.is_file() && &*m.path != "[vdso]") {
            let Some(file) = open_mapped_file(pid, m) else {
                continue;
            };
            let Ok(key) = FileId::of_file(&file) else {
                continue;
            };
            if !self.files.contains_key(&key) && !todo.iter().any(|t| t.0 == key) {
                todo.push((key, file, m.path.clone()));
            }
        }
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let queue = Mutex::new(todo.into_iter());
        let built = Mutex::new(Vec::new());
        let disk = self.disk.as_deref();
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| loop {
                    let Some((key, file, path)) = queue.lock().ok().and_then(|mut q| q.next())
                    else {
                        return;
                    };
                    let table = file_table(file, &path, disk);
                    if let Ok(mut built) = built.lock() {
                        built.push((key, table));
                    }
                });
            }
        });
        for (key, table) in built.into_inner().unwrap_or_default() {
            let table = table.map(|(module, table)| self.new_table(module, table));
            self.files.insert(key, table);
        }
    }

    fn new_table(&mut self, module: Arc<ModuleFile>, table: UnwindTable) -> Arc<ModuleTable> {
        self.next_id += 1;
        Arc::new(ModuleTable {
            id: self.next_id,
            module,
            table: Arc::new(table),
        })
    }
}

/// The parsed file and its table: from the disk cache when it holds this build (same
/// build-id and size), else compiled and kept there. `None` for a file that is not readable
/// ELF or has no CFI.
fn file_table(
    file: File,
    path: &str,
    disk: Option<&std::path::Path>,
) -> Option<(Arc<ModuleFile>, UnwindTable)> {
    let meta = file.metadata().ok()?;
    let size = meta.len();
    let module = ModuleFile::open(file, std::path::Path::new(path)).ok()?;
    let key = disk.map(|dir| (dir, disk_cache::identity(module.build_id(), &meta)));
    if let Some((dir, id)) = &key {
        if let Some(table) = disk_cache::load(dir, id, size) {
            return Some((Arc::new(module), table));
        }
    }
    let table = UnwindTable::from_module(&module)?;
    if let Some((dir, id)) = &key {
        disk_cache::store(dir, id, size, &table);
    }
    Some((Arc::new(module), table))
}

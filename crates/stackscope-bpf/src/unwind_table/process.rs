//! Per-process assembly: each executable mapping of a process with the bias that turns its
//! addresses into file virtual addresses and the table of the file behind it. Tables are
//! built once per file identity (device, inode, size, mtime) and shared by every process that
//! maps the file; the vDSO's table comes from our own vDSO, the same image in every process.

use std::collections::HashMap;
use std::sync::Arc;

use super::UnwindTable;
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

    /// The mappings of process `pid` (whose executable mappings are `maps`) with their tables,
    /// building the tables of files not seen before.
    pub fn process(&mut self, pid: u32, maps: &AddressSpace) -> ProcessTables {
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
                let table = own_vdso().and_then(|module| self.new_table(module));
                self.vdso = Some(table);
            }
            return self.vdso.clone().flatten();
        }
        if !m.is_file() {
            return None;
        }
        let file = open_mapped_file(pid, m)?;
        let key = FileId::of_file(&file).ok()?;
        if let Some(t) = self.files.get(&key) {
            return t.clone();
        }
        let module = ModuleFile::open(file, std::path::Path::new(&*m.path)).ok();
        let table = module.and_then(|module| self.new_table(Arc::new(module)));
        self.files.insert(key, table.clone());
        table
    }

    fn new_table(&mut self, module: Arc<ModuleFile>) -> Option<Arc<ModuleTable>> {
        let table = UnwindTable::from_module(&module)?;
        self.next_id += 1;
        Some(Arc::new(ModuleTable {
            id: self.next_id,
            module,
            table: Arc::new(table),
        }))
    }
}

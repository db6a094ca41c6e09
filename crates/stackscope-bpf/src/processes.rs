//! The sampled processes as user space follows them: what each has mapped and what it is
//! called (kept after it unmaps it, exits or execs, so its frames and threads can still be
//! named at the end), loading each one's unwind
//! tables into the BPF maps when it starts, execs, loads libraries, or shows up in a sample
//! without tables, and watching each dynamic loader they use for library loads.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use libbpf_rs::{Link, UprobeOpts};

use stackscope_process::maps::read_proc_maps;
use stackscope_process::target;
use stackscope_stacks::AddressSpace;

use crate::program::ProfileSkel;
use crate::tables::{NotLoaded, TableLoader, TableMaps};

#[derive(Default)]
pub(crate) struct Processes {
    maps: HashMap<u32, AddressSpace>,
    /// Each process's name (its main thread's) when its maps were last read: a thread sampled
    /// in a process whose main thread was not is named at the end, when the process may be gone.
    names: HashMap<u32, String>,
    /// Processes whose tables are in the maps.
    loaded: HashSet<u32>,
    /// Processes seen exiting: a sample taken on their way out asks for tables no more.
    exited: HashSet<u32>,
    loader: Option<TableLoader>,
    /// Why the last table load failed, for one hint at the end.
    pub load_error: Option<String>,
    /// Processes stopped at a library load that still wait for SIGCONT.
    held: HashSet<u32>,
    /// The uprobe on each dynamic loader seen, by its canonical path.
    loaders: HashMap<PathBuf, Option<Link>>,
    /// Why watching a loader failed, for one hint at the end.
    pub loader_error: Option<String>,
}

fn table_maps<'a>(skel: &'a ProfileSkel<'_>) -> TableMaps<'a> {
    TableMaps {
        tables: &skel.maps.unwind_tables,
        mappings: &skel.maps.unwind_mappings,
        procs: &skel.maps.unwind_procs,
    }
}

impl Processes {
    pub fn new(skel: &ProfileSkel<'_>) -> Self {
        let mut processes = Processes::default();
        match TableLoader::new(&table_maps(skel)) {
            Ok(loader) => processes.loader = Some(loader),
            Err(e) => processes.load_error = Some(e.to_string()),
        }
        processes
    }

    /// Reads the process's mappings afresh and loads (or reloads) its unwind tables.
    pub fn load(&mut self, skel: &ProfileSkel<'_>, pid: u32) {
        // A process that has let go of its memory on the way out shows no mappings: keep
        // what we knew, or its frames could not be named at the end.
        let maps = match read_proc_maps(pid) {
            Ok(maps) if !maps.is_empty() => maps,
            _ => return,
        };
        if let Some(name) = target::thread_comm(pid, pid) {
            self.names.insert(pid, name);
        }
        for m in maps.iter() {
            if is_dynamic_loader(&m.path) {
                self.watch_loader(skel, Path::new(&*m.path));
            }
        }
        if let Some(loader) = self.loader.as_mut() {
            match loader.load_process(&table_maps(skel), pid, &maps) {
                Ok(_) => {
                    self.loaded.insert(pid);
                }
                Err(e) => self.load_error = Some(format!("pid {pid}: {e}")),
            }
        }
        // Stacks are named at the end, by what was mapped when they were counted: a library
        // closed since (dlclose) keeps its place until something else is mapped over it, as
        // the perf source keeps every mapping its mmap events reported.
        match self.maps.entry(pid) {
            Entry::Occupied(mut seen) => {
                for m in maps.iter() {
                    seen.get_mut().insert(m.clone());
                }
            }
            Entry::Vacant(e) => {
                e.insert(maps);
            }
        }
    }

    /// Notes what the live processes mapped since their maps were last read (JIT code, which
    /// no exec nor library load announces), so that its frames can be named at the end.
    pub fn note_new_mappings(&mut self) {
        for pid in &self.loaded {
            let (Some(seen), Ok(now)) = (self.maps.get_mut(pid), read_proc_maps(*pid)) else {
                continue;
            };
            for m in now.iter() {
                seen.insert(m.clone());
            }
        }
    }

    /// A process that exited: its tables go, its maps stay for naming its frames.
    pub fn forget(&mut self, skel: &ProfileSkel<'_>, pid: u32) {
        self.exited.insert(pid);
        if self.loaded.remove(&pid) {
            if let Some(loader) = self.loader.as_mut() {
                let _ = loader.forget_process(&table_maps(skel), pid);
            }
        }
    }

    /// A process stopped at a library load: load the new libraries' tables, then let it go on.
    pub fn release_held(&mut self, skel: &ProfileSkel<'_>, pid: u32) {
        self.load(skel, pid);
        // SAFETY: plain kill(2).
        unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        self.held.remove(&pid);
    }

    /// The files whose unwind tables the kernel could not take.
    pub fn tables_not_loaded(&self) -> Option<&NotLoaded> {
        let not_loaded = self.loader.as_ref()?.not_loaded();
        (!not_loaded.files.is_empty()).then_some(not_loaded)
    }

    /// Whether the process was seen exiting (and its pid not since reused by a fork).
    pub fn has_exited(&self, pid: u32) -> bool {
        self.exited.contains(&pid)
    }

    /// A pid that starts a new process (a fork, or the command launched) is not the exited one.
    pub fn note_started(&mut self, pid: u32) {
        self.exited.remove(&pid);
    }

    pub fn note_held(&mut self, pid: u32) {
        self.held.insert(pid);
    }

    /// Lets every process still stopped by us go on (at the end of a recording).
    pub fn release_all(&mut self) {
        for pid in self.held.drain() {
            // SAFETY: plain kill(2).
            unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        }
    }

    /// The mappings of a process: as last loaded, else read now if it still runs.
    pub fn maps(&mut self, pid: u32) -> Option<&AddressSpace> {
        match self.maps.entry(pid) {
            Entry::Occupied(e) => Some(e.into_mut()),
            Entry::Vacant(e) => Some(e.insert(read_proc_maps(pid).ok()?)),
        }
    }

    /// The process's name: as it is now if it still runs, else as last seen.
    pub fn name(&self, pid: u32) -> Option<String> {
        target::thread_comm(pid, pid).or_else(|| self.names.get(&pid).cloned())
    }

    /// Puts the load uprobe on a dynamic loader (once per file).
    pub fn watch_loader(&mut self, skel: &ProfileSkel<'_>, path: &Path) {
        let Ok(path) = path.canonicalize() else {
            return;
        };
        if self.loaders.contains_key(&path) {
            return;
        }
        let opts = UprobeOpts {
            func_name: Some(LOADER_HOOK.into()),
            ..UprobeOpts::default()
        };
        let link = match skel
            .progs
            .on_loader_event
            .attach_uprobe_with_opts(-1, &path, 0, opts)
        {
            Ok(link) => Some(link),
            Err(e) => {
                self.loader_error = Some(format!("{}: {e}", path.display()));
                None
            }
        };
        self.loaders.insert(path, link);
    }
}

/// The function the dynamic loader calls after it mapped or unmapped libraries, for debuggers.
const LOADER_HOOK: &str = "_dl_debug_state";

/// The system's dynamic loader for programs of this architecture.
pub(crate) const SYSTEM_LOADER: &str = "/lib64/ld-linux-x86-64.so.2";

/// True for the path of a dynamic loader (`ld-linux-x86-64.so.2`, `ld-2.31.so`, `ld-musl-...`).
fn is_dynamic_loader(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    path.starts_with('/') && name.starts_with("ld-") && name.contains(".so")
}

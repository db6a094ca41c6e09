//! Raw stacks as the sampler and unwinder produce them, counted as they arrive, and turned into
//! a [`Profile`] at the end: every unique address is symbolized once, batched per module.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use stackscope_profile::{Frame, FrameId, FrameKind, Metadata, Profile, ProfileBuilder, Thread};
use stackscope_symbols::{SymFrame, Symbolizer};

use crate::maps::Mapping;

/// Index into [`StackTable::modules`].
type ModuleId = u32;

/// One frame of a raw stack, before symbolization.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RawFrame {
    /// A kernel code address.
    Kernel(u64),
    /// A user code address inside a mapped module, as a file offset.
    User { module: ModuleId, offset: u64 },
    /// A user address in anonymous executable memory (JIT code), looked up in the pid's perf map.
    Jit { pid: u32, addr: u64 },
    /// A user address that no mapping covers.
    Unmapped(u64),
    /// The user stack went on, but the copied stack memory ended.
    Truncated,
}

/// Where a module's code comes from, for the symbolizer.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum ModuleKey {
    File {
        path: Arc<str>,
        build_id: Option<Arc<[u8]>>,
    },
    Vdso,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct StackKey {
    pid: u32,
    tid: u32,
    cpu: u32,
    /// Leaf first: kernel frames, then user frames.
    frames: Box<[RawFrame]>,
}

/// Counts of unique raw stacks, with the modules they refer to.
#[derive(Default)]
pub struct StackTable {
    counts: HashMap<StackKey, u64>,
    modules: Vec<ModuleKey>,
    module_ids: HashMap<ModuleKey, ModuleId>,
}

impl StackTable {
    /// The raw frame for a user address, given the mapping that holds it (if any).
    pub fn user_frame(&mut self, pid: u32, addr: u64, mapping: Option<&Mapping>) -> RawFrame {
        let Some(m) = mapping else {
            return RawFrame::Unmapped(addr);
        };
        let key = if &*m.path == "[vdso]" {
            ModuleKey::Vdso
        } else if m.is_file() {
            ModuleKey::File {
                path: m.path.clone(),
                build_id: m.build_id.clone(),
            }
        } else {
            return RawFrame::Jit { pid, addr };
        };
        let module = match self.module_ids.get(&key) {
            Some(&id) => id,
            None => {
                let id = self.modules.len() as ModuleId;
                self.modules.push(key.clone());
                self.module_ids.insert(key, id);
                id
            }
        };
        RawFrame::User {
            module,
            offset: m.file_offset(addr),
        }
    }

    /// Counts one sample of `frames` (leaf first).
    pub fn add(&mut self, pid: u32, tid: u32, cpu: u32, frames: &[RawFrame], count: u64) {
        let key = StackKey {
            pid,
            tid,
            cpu,
            frames: frames.into(),
        };
        *self.counts.entry(key).or_insert(0) += count;
    }

    /// Symbolizes every unique address once and builds the profile. `thread` names a
    /// (pid, tid) pair.
    pub fn into_profile(
        self,
        symbolizer: &mut Symbolizer,
        meta: Metadata,
        thread: &dyn Fn(u32, u32) -> Thread,
    ) -> (Profile, Tally) {
        let names = Names::resolve(&self, symbolizer);
        let mut builder = ProfileBuilder::new(meta);
        let mut tally = Tally::default();
        let mut chain: Vec<FrameId> = Vec::new();
        let mut threads: HashMap<(u32, u32), u32> = HashMap::new();
        for (key, count) in &self.counts {
            chain.clear();
            let mut unknown_user = false;
            // Root first: walk the leaf-first raw frames backwards; one address may expand to
            // several frames (inlined functions), already outermost first.
            let mut outermost_user = None;
            for raw in key.frames.iter().rev() {
                for frame in names.frames(raw) {
                    if frame.kind == FrameKind::User {
                        unknown_user |= frame.name == UNKNOWN;
                        outermost_user.get_or_insert(frame.name.as_str());
                    }
                    chain.push(builder.frame(frame.clone()));
                }
            }
            if unknown_user {
                tally.with_unknown += count;
            }
            if outermost_user.is_some_and(|name| ENTRY_POINTS.contains(&name)) {
                tally.rooted += count;
            }
            let stack = builder.stack(&chain);
            let tid = *threads
                .entry((key.pid, key.tid))
                .or_insert_with(|| builder.thread(thread(key.pid, key.tid)));
            builder.add(tid, stack, Some(key.cpu), *count);
        }
        let mut profile = builder.finish();
        // A stable order makes outputs reproducible run to run.
        profile.samples.sort_by_key(|s| (s.thread, s.stack, s.cpu));
        (profile, tally)
    }
}

/// Figures about the user stacks that only symbols can tell.
#[derive(Debug, Default)]
pub struct Tally {
    /// Samples whose user part holds a frame with no name.
    pub with_unknown: u64,
    /// Samples whose outermost user frame is where threads begin (one of [`ENTRY_POINTS`]).
    pub rooted: u64,
}

/// Functions every stack of a process or thread starts in: glibc's program and thread
/// entries. A frame-pointer chain that ends elsewhere was cut short.
const ENTRY_POINTS: &[&str] = &[
    "_start",
    "__libc_start_main",
    "__libc_start_main_impl",
    "__libc_start_call_main",
    "start_thread",
    "clone",
    "clone3",
    "__clone",
    "__clone3",
];

const UNKNOWN: &str = "[unknown]";

/// The frames each unique raw frame stands for.
struct Names {
    frames: HashMap<RawFrame, Vec<Frame>>,
}

impl Names {
    fn resolve(table: &StackTable, symbolizer: &mut Symbolizer) -> Names {
        let mut by_module: HashMap<ModuleId, Vec<u64>> = HashMap::new();
        let mut kernel = Vec::new();
        let mut jit: HashMap<u32, Vec<u64>> = HashMap::new();
        let mut frames: HashMap<RawFrame, Vec<Frame>> = HashMap::new();
        for key in table.counts.keys() {
            for raw in key.frames.iter() {
                if frames.contains_key(raw) {
                    continue;
                }
                match *raw {
                    RawFrame::Kernel(addr) => kernel.push(addr),
                    RawFrame::User { module, offset } => {
                        by_module.entry(module).or_default().push(offset)
                    }
                    RawFrame::Jit { pid, addr } => jit.entry(pid).or_default().push(addr),
                    RawFrame::Unmapped(_) => {}
                    RawFrame::Truncated => {}
                }
                frames.insert(*raw, Vec::new());
            }
        }

        let kernel_names = symbolizer.symbolize_kernel(&kernel);
        for (addr, sym) in kernel.iter().zip(kernel_names) {
            let frame = match sym {
                Some(sym) => frame_from(sym, FrameKind::Kernel, Some("[kernel.kallsyms]")),
                None => unknown(FrameKind::Kernel, Some("[kernel.kallsyms]")),
            };
            frames.insert(RawFrame::Kernel(*addr), vec![frame]);
        }

        for (module, offsets) in by_module {
            let key = &table.modules[module as usize];
            let (module_name, resolved) = match key {
                ModuleKey::Vdso => ("[vdso]".to_string(), symbolizer.symbolize_vdso(&offsets)),
                ModuleKey::File { path, build_id } => {
                    let name = file_name(path);
                    let resolved = symbolizer
                        .symbolize_file(Path::new(&**path), build_id.as_deref(), &offsets)
                        .unwrap_or_else(|_| vec![Vec::new(); offsets.len()]);
                    (name, resolved)
                }
            };
            for (offset, syms) in offsets.iter().zip(resolved) {
                let raw = RawFrame::User {
                    module,
                    offset: *offset,
                };
                let list = if syms.is_empty() {
                    vec![unknown(FrameKind::User, Some(&module_name))]
                } else {
                    syms.into_iter()
                        .map(|s| frame_from(s, FrameKind::User, Some(&module_name)))
                        .collect()
                };
                frames.insert(raw, list);
            }
        }

        for (pid, addrs) in jit {
            let resolved = symbolizer.symbolize_perf_map(pid, &addrs);
            for (addr, sym) in addrs.iter().zip(resolved) {
                let frame = match sym {
                    Some(sym) => frame_from(sym, FrameKind::User, Some("[jit]")),
                    None => unknown(FrameKind::User, None),
                };
                frames.insert(RawFrame::Jit { pid, addr: *addr }, vec![frame]);
            }
        }

        for (raw, list) in frames.iter_mut() {
            match raw {
                RawFrame::Unmapped(_) => *list = vec![unknown(FrameKind::User, None)],
                RawFrame::Truncated => *list = vec![Frame::marker("[truncated]")],
                _ => {}
            }
        }
        Names { frames }
    }

    fn frames(&self, raw: &RawFrame) -> &[Frame] {
        self.frames.get(raw).map(Vec::as_slice).unwrap_or(&[])
    }
}

fn frame_from(sym: SymFrame, kind: FrameKind, module: Option<&str>) -> Frame {
    Frame {
        name: sym.name,
        module: module.map(str::to_string),
        file: sym.file,
        line: sym.line,
        inlined: sym.inlined,
        kind,
    }
}

fn unknown(kind: FrameKind, module: Option<&str>) -> Frame {
    Frame {
        name: UNKNOWN.to_string(),
        module: module.map(str::to_string),
        kind,
        ..Frame::default()
    }
}

/// The last path component: `libc.so.6` for `/usr/lib/x86_64-linux-gnu/libc.so.6`.
fn file_name(path: &str) -> String {
    path.rsplit('/').next().unwrap_or(path).to_string()
}

//! Raw stacks as the sampler and unwinder produce them, counted as they arrive, and turned into
//! a [`Profile`] at the end: every unique address is symbolized once, batched per module.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use stackscope_profile::{
    Frame, FrameId, FrameKind, Metadata, Profile, ProfileBuilder, Thread, UnwindStats,
};
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
    /// A marker a source puts in place of a stack it could not take, e.g. `[Missed User Stack]`.
    Marker(&'static str),
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

/// How the unwinding of a sample's user stack ended.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum UserEnd {
    /// The sample had no user stack (a kernel thread, or user stacks not wanted).
    NoStack,
    /// The unwinder reached the outermost frame.
    Complete,
    /// The copied stack memory ended first.
    Truncated,
    /// The unwinder could not go on past a frame in this module.
    Broken(Arc<str>),
    /// The chain came from frame pointers: whether it is whole is judged by its root frame.
    Unjudged,
    /// The sample carried user registers but not one byte of user stack: the kernel could not
    /// read the memory at the stack pointer. It happens inside execve, once the kernel has
    /// replaced the old program's memory while its registers are still the thread's.
    Unreadable,
}

/// A node of [`StackTable`]'s frame tree: one frame and the node of its caller.
type NodeId = u32;

/// The parent of a stack's outermost frame, and the stack of no frames.
const ROOT: NodeId = NodeId::MAX;

/// Index into [`StackTable::names`]; [`UNNAMED`] leaves the thread's name to the caller.
type NameId = u32;
const UNNAMED: NameId = NameId::MAX;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct StackKey {
    pid: u32,
    tid: u32,
    /// The thread's and its process's names when sampled: a process that execs is another
    /// program before and after.
    comm: NameId,
    process: NameId,
    cpu: u32,
    /// The stack's leaf node.
    stack: NodeId,
    end: UserEnd,
}

/// Counts of unique raw stacks, with the modules they refer to.
///
/// Stacks are kept as a tree of frames shared by every stack with the same callers, so a
/// long recording of deep stacks costs a node per new frame, not a copy of every stack.
#[derive(Default)]
pub struct StackTable {
    counts: HashMap<StackKey, u64>,
    /// (caller node, frame) of each node.
    nodes: Vec<(NodeId, RawFrame)>,
    node_ids: HashMap<(NodeId, RawFrame), NodeId>,
    modules: Vec<ModuleKey>,
    module_ids: HashMap<ModuleKey, ModuleId>,
    names: Vec<Arc<str>>,
    name_ids: HashMap<Arc<str>, NameId>,
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

    /// Counts one sample of `frames` (leaf first) whose user stack ended as `end`.
    pub fn add(&mut self, pid: u32, tid: u32, cpu: u32, frames: &[RawFrame], end: UserEnd) {
        self.add_count(pid, tid, cpu, frames, end, 1);
    }

    /// Counts one sample of a thread named `comm` in a process named `process` at the time of
    /// the sample; these names win over the ones `into_profile`'s caller gives.
    pub fn add_named(
        &mut self,
        (pid, tid): (u32, u32),
        (comm, process): (&str, &str),
        cpu: u32,
        frames: &[RawFrame],
        end: UserEnd,
    ) {
        let key = StackKey {
            pid,
            tid,
            comm: self.name(comm),
            process: self.name(process),
            cpu,
            stack: self.stack(frames),
            end,
        };
        *self.counts.entry(key).or_insert(0) += 1;
    }

    /// Counts `count` samples at once, for sources that count in the kernel.
    pub fn add_count(
        &mut self,
        pid: u32,
        tid: u32,
        cpu: u32,
        frames: &[RawFrame],
        end: UserEnd,
        count: u64,
    ) {
        let key = StackKey {
            pid,
            tid,
            comm: UNNAMED,
            process: UNNAMED,
            cpu,
            stack: self.stack(frames),
            end,
        };
        *self.counts.entry(key).or_insert(0) += count;
    }

    /// The node of a leaf-first stack, adding the nodes it lacks.
    fn stack(&mut self, frames: &[RawFrame]) -> NodeId {
        let mut node = ROOT;
        for frame in frames.iter().rev() {
            node = match self.node_ids.get(&(node, *frame)) {
                Some(&id) => id,
                None => {
                    let id = self.nodes.len() as NodeId;
                    self.nodes.push((node, *frame));
                    self.node_ids.insert((node, *frame), id);
                    id
                }
            };
        }
        node
    }

    /// The frames of a stack, root first, into `out`.
    fn frames_of(&self, mut node: NodeId, out: &mut Vec<RawFrame>) {
        out.clear();
        while let Some(&(parent, frame)) = self.nodes.get(node as usize) {
            out.push(frame);
            node = parent;
        }
        out.reverse();
    }

    fn name(&mut self, name: &str) -> NameId {
        if let Some(&id) = self.name_ids.get(name) {
            return id;
        }
        let id = self.names.len() as NameId;
        let name: Arc<str> = name.into();
        self.names.push(name.clone());
        self.name_ids.insert(name, id);
        id
    }

    /// Symbolizes every unique address once and builds the profile, with the figures on how
    /// whole the user stacks are in `meta.unwind`. `thread` names a (pid, tid) pair whose
    /// samples were counted without names.
    pub fn into_profile(
        self,
        symbolizer: &mut Symbolizer,
        meta: Metadata,
        thread: &dyn Fn(u32, u32) -> Thread,
    ) -> (Profile, Tally) {
        let names = Names::resolve(&self, symbolizer);
        let mut builder = ProfileBuilder::new(meta);
        let mut tally = Tally::default();
        let mut raw: Vec<RawFrame> = Vec::new();
        let mut chain: Vec<FrameId> = Vec::new();
        let mut threads: HashMap<(u32, u32, NameId, NameId), u32> = HashMap::new();
        for (key, count) in &self.counts {
            self.frames_of(key.stack, &mut raw);
            chain.clear();
            let mut unknown_user = false;
            let mut in_exec = false;
            // Root first; one address may expand to several frames (inlined functions),
            // already outermost first.
            let mut outermost_user = None;
            for raw in &raw {
                for frame in names.frames(raw) {
                    match frame.kind {
                        FrameKind::User => {
                            unknown_user |= frame.name == UNKNOWN;
                            outermost_user.get_or_insert(frame.name.as_str());
                        }
                        FrameKind::Kernel => in_exec |= is_exec(&frame.name),
                        _ => {}
                    }
                    chain.push(builder.frame(frame.clone()));
                }
            }
            tally.count(
                &key.end,
                *count,
                unknown_user,
                outermost_user.is_some_and(|name| ENTRY_POINTS.contains(&name)),
            );
            if key.end == UserEnd::Unreadable && in_exec {
                tally.unreadable_in_exec += count;
            }
            let stack = builder.stack(&chain);
            let tid = *threads
                .entry((key.pid, key.tid, key.comm, key.process))
                .or_insert_with(|| {
                    let named = match (
                        self.names.get(key.comm as usize),
                        self.names.get(key.process as usize),
                    ) {
                        (Some(comm), Some(process)) => Thread {
                            pid: key.pid,
                            tid: key.tid,
                            comm: comm.to_string(),
                            process_name: process.to_string(),
                        },
                        _ => thread(key.pid, key.tid),
                    };
                    builder.thread(named)
                });
            builder.add(tid, stack, Some(key.cpu), *count);
        }
        builder.meta_mut().unwind = tally.stats.clone();
        // Build-ids let a consumer (pprof's mappings) match each module to its exact file.
        for key in &self.modules {
            if let ModuleKey::File {
                path,
                build_id: Some(id),
            } = key
            {
                let hex = id.iter().map(|b| format!("{b:02x}")).collect();
                builder.meta_mut().build_ids.insert(file_name(path), hex);
            }
        }
        let mut profile = builder.finish();
        // A stable order makes outputs reproducible run to run.
        profile.samples.sort_by_key(|s| (s.thread, s.stack, s.cpu));
        (profile, tally)
    }
}

/// How whole the user stacks came out.
#[derive(Debug, Default)]
pub struct Tally {
    pub stats: UnwindStats,
    /// Samples whose stack broke off, by the module of the last frame reached.
    pub broken_in: HashMap<Arc<str>, u64>,
    /// Frame-pointer chains that did not reach an entry point.
    pub short_chains: u64,
    /// Of `stats.unreadable`, the samples taken inside execve.
    pub unreadable_in_exec: u64,
}

impl Tally {
    /// Counts `count` samples of one stack. A stack whose outermost user frame is an entry
    /// point is whole however its unwinding ended: the unwind tables of some entry stubs
    /// (the dynamic loader's `_start`) do not mark the end of the chain.
    fn count(&mut self, end: &UserEnd, count: u64, unknown: bool, rooted: bool) {
        if *end == UserEnd::NoStack {
            return;
        }
        self.stats.user_stacks += count;
        if unknown {
            self.stats.with_unknown += count;
        }
        match end {
            UserEnd::Complete => self.stats.complete += count,
            UserEnd::Truncated => self.stats.truncated += count,
            UserEnd::Unreadable => self.stats.unreadable += count,
            _ if rooted => self.stats.complete += count,
            UserEnd::Broken(module) => *self.broken_in.entry(module.clone()).or_insert(0) += count,
            UserEnd::Unjudged => self.short_chains += count,
            UserEnd::NoStack => {}
        }
    }
}

/// Functions every stack of a process or thread starts in: glibc's program and thread
/// entries (and the dynamic loader's, before the program starts).
const ENTRY_POINTS: &[&str] = &[
    "_start",
    "_dl_start_user",
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

/// Stands for the user frames of a stack the kernel could not copy.
pub const UNREADABLE: &str = "[stack unreadable]";

/// True for the kernel functions that run an execve, on every architecture.
fn is_exec(name: &str) -> bool {
    name == "bprm_execve" || name == "begin_new_exec" || name.starts_with("do_execveat_common")
}

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
        for (_, raw) in &table.nodes {
            {
                if frames.contains_key(raw) {
                    continue;
                }
                // Addresses are queued for their symbolizer and filled in below; the rest
                // need no symbols.
                let known = match *raw {
                    RawFrame::Kernel(addr) => {
                        kernel.push(addr);
                        Vec::new()
                    }
                    RawFrame::User { module, offset } => {
                        by_module.entry(module).or_default().push(offset);
                        Vec::new()
                    }
                    RawFrame::Jit { pid, addr } => {
                        jit.entry(pid).or_default().push(addr);
                        Vec::new()
                    }
                    RawFrame::Unmapped(_) => vec![unknown(FrameKind::User, None)],
                    RawFrame::Truncated => vec![Frame::marker("[truncated]")],
                    RawFrame::Marker(name) => vec![Frame::marker(name)],
                };
                frames.insert(*raw, known);
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

/// The last path component: `libc.so.6` for `/usr/lib/x86_64-linux-gnu/libc.so.6`; for a copy
/// in perf's build-id cache (`.debug/ORIGINAL/PATH/BUILDID/elf`), the original file's name.
fn file_name(path: &str) -> String {
    let mut parts = path.rsplit('/');
    let last = parts.next().unwrap_or(path);
    if last == "elf" && path.contains("/.debug/") {
        let id = parts.next().unwrap_or("");
        if id.len() >= 16 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
            if let Some(name) = parts.next() {
                return name.to_string();
            }
        }
    }
    last.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_names_see_through_perfs_build_id_cache() {
        assert_eq!(
            file_name("/usr/lib/x86_64-linux-gnu/libc.so.6"),
            "libc.so.6"
        );
        assert_eq!(
            file_name("/root/.debug/tmp/x/prog/6fab166e78b0a2a73797d7e2c63a5a0fa27d0ce9/elf"),
            "prog"
        );
        assert_eq!(file_name("/opt/tools/elf"), "elf");
    }

    #[test]
    fn tally_judges_broken_and_frame_pointer_stacks_by_their_root() {
        let mut tally = Tally::default();
        let ld: Arc<str> = "/lib64/ld-linux-x86-64.so.2".into();
        tally.count(&UserEnd::Complete, 5, false, true);
        tally.count(&UserEnd::Truncated, 2, false, false);
        // The dynamic loader's _start has no end-of-chain mark: the unwinder gives up there,
        // but the stack is whole.
        tally.count(&UserEnd::Broken(ld.clone()), 3, false, true);
        tally.count(&UserEnd::Broken(ld.clone()), 4, true, false);
        tally.count(&UserEnd::Unjudged, 6, false, true);
        tally.count(&UserEnd::Unjudged, 7, false, false);
        tally.count(&UserEnd::NoStack, 100, false, false);

        let s = &tally.stats;
        assert_eq!(s.user_stacks, 5 + 2 + 3 + 4 + 6 + 7);
        assert_eq!(s.complete, 5 + 3 + 6);
        assert_eq!(s.truncated, 2);
        assert_eq!(s.with_unknown, 4);
        assert_eq!(tally.broken_in.get(&ld), Some(&4));
        assert_eq!(tally.short_chains, 7);
    }
}

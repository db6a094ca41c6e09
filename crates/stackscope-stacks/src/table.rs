//! Raw stacks as the sampler and unwinder produce them, counted as they arrive, and turned into
//! a [`Profile`] at the end: every unique address is symbolized once, batched per module.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::Path;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use stackscope_profile::{
    Frame, FrameId, FrameKind, Metadata, Profile, ProfileBuilder, Thread, UnwindStats, UNKNOWN,
};
use stackscope_symbols::{SymFrame, Symbolizer};

use crate::Mapping;

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

    /// Unique frames held (one per new frame of any stack): what the table's memory grows
    /// with.
    pub fn nodes(&self) -> usize {
        self.nodes.len()
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
        let mut folded = Folded::default();
        self.fold_into(symbolizer, &mut folded, thread);
        folded.finish(meta)
    }

    /// Symbolizes every unique address once and adds the counted stacks, named, to `folded`.
    /// Samples that differ only in addresses inside one function become one stack there, so
    /// folding a table from time to time keeps a long recording's memory to what its
    /// functions and threads need.
    pub fn fold_into(
        self,
        symbolizer: &mut Symbolizer,
        folded: &mut Folded,
        thread: &dyn Fn(u32, u32) -> Thread,
    ) {
        let Folded {
            builder,
            tally,
            build_ids,
        } = folded;
        let names = Names::resolve(&self, symbolizer, builder);
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
                for &id in names.frames(raw) {
                    let frame = builder.frame_at(id);
                    match frame.kind {
                        FrameKind::User => {
                            unknown_user |= frame.name == UNKNOWN;
                            outermost_user.get_or_insert(frame.name.as_str());
                        }
                        FrameKind::Kernel => in_exec |= is_exec(&frame.name),
                        _ => {}
                    }
                    chain.push(id);
                }
            }
            let rooted = outermost_user.is_some_and(|name| ENTRY_POINTS.contains(&name));
            tally.count(&key.end, *count, unknown_user, rooted);
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
        // Build-ids let a consumer (pprof's mappings) match each module to its exact file.
        for key in &self.modules {
            if let ModuleKey::File {
                path,
                build_id: Some(id),
            } = key
            {
                let hex = id.iter().map(|b| format!("{b:02x}")).collect();
                build_ids.insert(file_name(path), hex);
            }
        }
    }
}

/// Stacks named and counted so far: what [`StackTable`]s fold into.
#[derive(Default)]
pub struct Folded {
    builder: ProfileBuilder,
    tally: Tally,
    build_ids: BTreeMap<String, String>,
}

impl Folded {
    /// The profile, with `meta` and the figures on how whole the user stacks are in
    /// `meta.unwind`.
    pub fn finish(mut self, meta: Metadata) -> (Profile, Tally) {
        let own = self.builder.meta_mut();
        *own = meta;
        own.unwind = self.tally.stats.clone();
        own.build_ids.extend(self.build_ids);
        let mut profile = self.builder.finish();
        // A stable order makes outputs reproducible run to run.
        profile.samples.sort_by_key(|s| (s.thread, s.stack, s.cpu));
        (profile, self.tally)
    }
}

/// Folds full [`StackTable`]s on a thread of its own, with its own [`Symbolizer`], so that
/// sampling goes on while they are named. At most one table waits while another is folded.
pub struct BackgroundFold {
    tables: mpsc::SyncSender<StackTable>,
    worker: JoinHandle<Folded>,
}

impl BackgroundFold {
    /// `thread` names a (pid, tid) pair whose samples were counted without names.
    pub fn start(thread: impl Fn(u32, u32) -> Thread + Send + 'static) -> io::Result<Self> {
        let (tables, arriving) = mpsc::sync_channel::<StackTable>(1);
        let worker = std::thread::Builder::new()
            .name("stackscope-fold".into())
            .spawn(move || {
                let mut symbolizer = Symbolizer::new();
                let mut folded = Folded::default();
                for table in arriving {
                    table.fold_into(&mut symbolizer, &mut folded, &thread);
                }
                folded
            })?;
        Ok(BackgroundFold { tables, worker })
    }

    /// Hands a table over; waits only while an earlier one is still queued.
    pub fn fold(&self, table: StackTable) {
        // The worker ends only when this sender is dropped, or by a panic that `finish`
        // passes on.
        let _ = self.tables.send(table);
    }

    /// Everything folded, once the worker has named the tables handed over.
    pub fn finish(self) -> Folded {
        drop(self.tables);
        match self.worker.join() {
            Ok(folded) => folded,
            Err(panic) => std::panic::resume_unwind(panic),
        }
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

/// Stands for the user frames of a stack the kernel could not copy.
pub const UNREADABLE: &str = "[stack unreadable]";

/// True for the kernel functions that run an execve, on every architecture.
fn is_exec(name: &str) -> bool {
    name == "bprm_execve" || name == "begin_new_exec" || name.starts_with("do_execveat_common")
}

/// The frames each unique raw frame stands for, interned in the profile being built: a raw
/// frame costs two words here however long its names are.
struct Names {
    /// Where each raw frame's frames are in `ids`, and how many (inlined functions make
    /// several).
    spans: HashMap<RawFrame, (u32, u32)>,
    ids: Vec<FrameId>,
}

impl Names {
    fn resolve(
        table: &StackTable,
        symbolizer: &mut Symbolizer,
        builder: &mut ProfileBuilder,
    ) -> Names {
        let mut names = Names {
            spans: HashMap::new(),
            ids: Vec::new(),
        };
        let mut by_module: HashMap<ModuleId, Vec<u64>> = HashMap::new();
        let mut kernel = Vec::new();
        let mut jit: HashMap<u32, Vec<u64>> = HashMap::new();
        for (_, raw) in &table.nodes {
            if names.spans.contains_key(raw) {
                continue;
            }
            // Addresses are queued for their symbolizer and named below; the rest need no
            // symbols.
            let known = match *raw {
                RawFrame::Kernel(addr) => {
                    kernel.push(addr);
                    None
                }
                RawFrame::User { module, offset } => {
                    by_module.entry(module).or_default().push(offset);
                    None
                }
                RawFrame::Jit { pid, addr } => {
                    jit.entry(pid).or_default().push(addr);
                    None
                }
                RawFrame::Unmapped(_) => Some(unknown(FrameKind::User, None)),
                RawFrame::Truncated => Some(Frame::marker("[truncated]")),
                RawFrame::Marker(name) => Some(Frame::marker(name)),
            };
            // A placeholder keeps each address queued once.
            names.spans.insert(*raw, (0, 0));
            if let Some(frame) = known {
                names.insert(builder, *raw, [frame]);
            }
        }

        let kernel_names = symbolizer.symbolize_kernel(&kernel);
        for (addr, sym) in kernel.iter().zip(kernel_names) {
            let frame = match sym {
                Some(sym) => frame_from(sym, FrameKind::Kernel, Some("[kernel.kallsyms]")),
                None => unknown(FrameKind::Kernel, Some("[kernel.kallsyms]")),
            };
            names.insert(builder, RawFrame::Kernel(*addr), [frame]);
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
                if syms.is_empty() {
                    names.insert(builder, raw, [unknown(FrameKind::User, Some(&module_name))]);
                } else {
                    let frames = syms
                        .into_iter()
                        .map(|s| frame_from(s, FrameKind::User, Some(&module_name)));
                    names.insert(builder, raw, frames);
                }
            }
        }

        for (pid, addrs) in jit {
            let resolved = symbolizer.symbolize_perf_map(pid, &addrs);
            for (addr, sym) in addrs.iter().zip(resolved) {
                let frame = match sym {
                    Some(sym) => frame_from(sym, FrameKind::User, Some("[jit]")),
                    None => unknown(FrameKind::User, None),
                };
                names.insert(builder, RawFrame::Jit { pid, addr: *addr }, [frame]);
            }
        }

        names
    }

    /// Interns `frames` (outermost first) as what `raw` stands for.
    fn insert(
        &mut self,
        builder: &mut ProfileBuilder,
        raw: RawFrame,
        frames: impl IntoIterator<Item = Frame>,
    ) {
        let start = self.ids.len();
        self.ids
            .extend(frames.into_iter().map(|f| builder.frame(f)));
        let span = (start as u32, (self.ids.len() - start) as u32);
        self.spans.insert(raw, span);
    }

    fn frames(&self, raw: &RawFrame) -> &[FrameId] {
        match self.spans.get(raw) {
            Some(&(start, len)) => &self.ids[start as usize..(start + len) as usize],
            None => &[],
        }
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
    fn folding_tables_as_they_fill_gives_the_profile_one_table_gives() {
        // Kernel addresses, all inside one function of at least 4 KiB.
        let f = stackscope_testkit::big_kernel_function();
        let k = [f, f + 64];
        let stacks: Vec<(u32, Vec<RawFrame>, UserEnd)> = vec![
            (
                1,
                vec![RawFrame::Kernel(k[0]), RawFrame::Unmapped(0x1000)],
                UserEnd::Complete,
            ),
            (
                1,
                vec![RawFrame::Kernel(k[0] + 4), RawFrame::Unmapped(0x1000)],
                UserEnd::Complete,
            ),
            (
                2,
                vec![RawFrame::Kernel(k[1]), RawFrame::Truncated],
                UserEnd::Truncated,
            ),
            (
                2,
                vec![RawFrame::Marker("[stack unreadable]")],
                UserEnd::Unreadable,
            ),
            (
                3,
                vec![RawFrame::Unmapped(0x2000)],
                UserEnd::Broken("/lib/x.so".into()),
            ),
        ];
        let meta = Metadata {
            source: "test".into(),
            ..Metadata::default()
        };
        let thread = |pid, tid| Thread {
            pid,
            tid,
            comm: format!("t{tid}"),
            process_name: format!("p{pid}"),
        };
        let add = |table: &mut StackTable, round: u32| {
            for (i, (pid, frames, end)) in stacks.iter().enumerate() {
                for _ in 0..=i as u32 + round {
                    table.add_named((*pid, *pid), ("c", "p"), round % 2, frames, end.clone());
                }
                table.add(*pid, *pid + 1, 0, frames, end.clone());
            }
        };

        let mut symbolizer = Symbolizer::new();
        let mut whole = StackTable::default();
        let mut folded = Folded::default();
        for round in 0..3 {
            add(&mut whole, round);
            let mut part = StackTable::default();
            add(&mut part, round);
            part.fold_into(&mut symbolizer, &mut folded, &thread);
        }
        let (one, one_tally) = whole.into_profile(&mut symbolizer, meta.clone(), &thread);
        let (parts, parts_tally) = folded.finish(meta);
        // Ids follow the order things were first met; what they stand for must not differ.
        let content = |p: &Profile| {
            let mut counts: Vec<(String, Vec<String>, Option<u32>, u64)> = p
                .samples
                .iter()
                .map(|s| {
                    let t = p.thread(s.thread);
                    let who = format!("{} {} {} {}", t.pid, t.tid, t.comm, t.process_name);
                    let frames = p.stack_frames(s.stack).map(|f| f.name.clone()).collect();
                    (who, frames, s.cpu, s.count)
                })
                .collect();
            counts.sort();
            counts
        };
        assert_eq!(content(&one), content(&parts));
        assert_eq!(one.meta, parts.meta);
        assert_eq!(one_tally.stats, parts_tally.stats);
        assert_eq!(one_tally.broken_in, parts_tally.broken_in);
        // Per round r, stack i is sampled i + r + 1 times with names and once without.
        assert_eq!(one.total_samples(), 3 * 15 + 5 * 3 + 3 * 5);
        // Samples at two addresses of one kernel function are one stack.
        let kernel_names: std::collections::HashSet<&str> = one
            .frames
            .iter()
            .filter(|f| f.kind == FrameKind::Kernel)
            .map(|f| f.name.as_str())
            .collect();
        assert!(kernel_names.len() <= 2, "{kernel_names:?}");
        assert_eq!(one.meta.unwind.truncated, parts.meta.unwind.truncated);
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

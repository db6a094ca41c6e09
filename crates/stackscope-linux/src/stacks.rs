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
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct StackKey {
    pid: u32,
    tid: u32,
    cpu: u32,
    /// Leaf first: kernel frames, then user frames.
    frames: Box<[RawFrame]>,
    end: UserEnd,
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

    /// Counts one sample of `frames` (leaf first) whose user stack ended as `end`.
    pub fn add(&mut self, pid: u32, tid: u32, cpu: u32, frames: &[RawFrame], end: UserEnd) {
        self.add_count(pid, tid, cpu, frames, end, 1);
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
            cpu,
            frames: frames.into(),
            end,
        };
        *self.counts.entry(key).or_insert(0) += count;
    }

    /// Symbolizes every unique address once and builds the profile, with the figures on how
    /// whole the user stacks are in `meta.unwind`. `thread` names a (pid, tid) pair.
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
            tally.count(
                &key.end,
                *count,
                unknown_user,
                outermost_user.is_some_and(|name| ENTRY_POINTS.contains(&name)),
            );
            let stack = builder.stack(&chain);
            let tid = *threads
                .entry((key.pid, key.tid))
                .or_insert_with(|| builder.thread(thread(key.pid, key.tid)));
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

//! Folding counted stacks into a profile: each table's unique addresses are named once, its
//! stacks added to what was folded before, and how whole the user stacks came out is tallied.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use stackscope_profile::{
    Frame, FrameId, FrameKind, Metadata, Profile, ProfileBuilder, StackId, Thread, ThreadId,
    UnwindStats, UNKNOWN,
};
use stackscope_symbols::elf::build_id_hex;
use stackscope_symbols::Symbolizer;

use super::live::{Interval, LiveFold};
use super::names::{file_name, Names};
use super::{ModuleId, ModuleKey, NameId, RawFrame, StackKey, StackTable};
use crate::walk::{Stop, WalkEnd};

impl StackTable {
    /// Symbolizes every unique address once and builds the profile, with the figures on how
    /// whole the user stacks are in `meta.unwind`. `thread` names a (pid, tid) pair whose
    /// samples were counted without names. Sampling has ended by then, so a Ctrl-C from now
    /// on stops naming ([`stackscope_symbols::interrupt`]).
    pub fn into_profile(
        self,
        symbolizer: &mut Symbolizer,
        meta: Metadata,
        thread: &dyn Fn(u32, u32) -> Thread,
    ) -> (Profile, Tally) {
        stackscope_symbols::interrupt::sampling_ended();
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
        let names = Names::resolve(&self, symbolizer, &mut folded.builder);
        self.add_named(&names, folded, thread, |_, _, _| {});
    }

    /// Adds the counted stacks, their frames already in `names`, to `folded`; `each` sees
    /// every stack added with its thread and count.
    pub(super) fn add_named(
        &self,
        names: &Names,
        folded: &mut Folded,
        thread: &dyn Fn(u32, u32) -> Thread,
        mut each: impl FnMut(ThreadId, StackId, u64),
    ) {
        let Folded {
            builder,
            tally,
            build_ids,
            stacks_at_most,
        } = folded;
        let mut raw: Vec<RawFrame> = Vec::new();
        let mut chain: Vec<FrameId> = Vec::new();
        let mut threads: HashMap<(u32, u32, NameId, NameId), ThreadId> = HashMap::new();
        for (key, &(count, objects)) in &self.counts {
            self.frames_of(key.stack, &mut raw);
            let seen = self.name_stack(names, builder, &raw, &mut chain);
            self.tally_stack(tally, key, count, &seen);
            if stacks_at_most.is_some_and(|most| builder.profile().stacks.len() >= most)
                && builder.known_stack(&chain).is_none()
            {
                keep_leaf_only(builder, &mut chain);
                tally.past_kept_stacks += count;
            }
            let stack = builder.stack(&chain);
            let tid = *threads
                .entry((key.pid, key.tid, key.comm, key.process))
                .or_insert_with(|| builder.thread(self.thread_of(key, thread)));
            builder.add_objects(tid, stack, Some(key.cpu), count, objects);
            each(tid, stack, count);
        }
        self.note_modules(names, tally, build_ids);
    }

    /// Names the frames of one stack, root first, into `chain`, and says what they show of
    /// how whole it is.
    fn name_stack(
        &self,
        names: &Names,
        builder: &ProfileBuilder,
        raw: &[RawFrame],
        chain: &mut Vec<FrameId>,
    ) -> StackSeen {
        chain.clear();
        let mut seen = StackSeen::default();
        // Root first; one address may expand to several frames (inlined functions),
        // already outermost first.
        let mut rooted = None;
        for raw in raw {
            // An event's root frame says what counted the stack, not where it began.
            let judged = !matches!(raw, RawFrame::Event(_));
            seen.unnamed_user |= names.is_unnamed(raw);
            match *raw {
                RawFrame::User { module, .. } if self.is_user_file(module) => {
                    seen.leaf = Some((module, names.is_unnamed(raw)));
                }
                // User code in no file (the vDSO, JIT code, unmapped) is no file's time.
                RawFrame::User { .. } | RawFrame::Jit { .. } | RawFrame::Unmapped(_) => {
                    seen.leaf = None
                }
                _ => {}
            }
            for &id in names.frames(raw) {
                let frame = builder.frame_at(id);
                match frame.kind {
                    FrameKind::User => seen.unknown_user |= frame.name == UNKNOWN,
                    FrameKind::Kernel => seen.in_exec |= is_exec(&frame.name),
                    _ => {}
                }
                if judged {
                    rooted.get_or_insert_with(|| is_entry(frame) || names.is_unnamed_entry(raw));
                }
                chain.push(id);
            }
        }
        seen.rooted = rooted.unwrap_or(false);
        seen
    }

    /// Adds `count` samples of the stack counted under `key` to the figures on how whole
    /// stacks are and where each file's time went.
    fn tally_stack(&self, tally: &mut Tally, key: &StackKey, count: u64, seen: &StackSeen) {
        tally.count(&key.end, count, seen.unknown_user, seen.rooted);
        if seen.unnamed_user && key.end != WalkEnd::NoStack {
            tally.stats.with_unnamed += count;
        }
        if key.end == WalkEnd::Unreadable && seen.in_exec {
            tally.unreadable_in_exec += count;
        }
        if let (Some((module, unnamed)), false) = (seen.leaf, key.end == WalkEnd::NoStack) {
            if let ModuleKey::File { path, .. } = &self.modules[module as usize] {
                let used = tally.modules.entry(path.clone()).or_default();
                used.leaf += count;
                if unnamed {
                    used.unnamed_leaf += count;
                }
            }
        }
    }

    /// The thread the stack counted under `key` belongs to: by the names it was sampled
    /// with, else as `thread` names it.
    fn thread_of(&self, key: &StackKey, thread: &dyn Fn(u32, u32) -> Thread) -> Thread {
        match (
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
        }
    }

    /// Notes which files were named with source lines, and each file's build-id.
    fn note_modules(
        &self,
        names: &Names,
        tally: &mut Tally,
        build_ids: &mut BTreeMap<String, String>,
    ) {
        for (id, key) in self.modules.iter().enumerate() {
            if let (ModuleKey::File { path, .. }, true) = (key, names.has_lines(id as ModuleId)) {
                tally.modules.entry(path.clone()).or_default().lines = true;
            }
        }
        // Build-ids let a consumer (pprof's mappings) match each module to its exact file.
        for key in &self.modules {
            if let ModuleKey::File {
                path,
                build_id: Some(id),
                ..
            } = key
            {
                build_ids.insert(file_name(path), build_id_hex(id));
            }
        }
    }
}

/// The root frame of a stack counted past the distinct stacks kept, above its leaf alone.
pub const PAST_KEPT_STACKS: &str = "[stacks past those kept]";

/// Turns `chain` (root first) into its leaf under [`PAST_KEPT_STACKS`]: the time in each
/// function stays whole, its callers are let go.
fn keep_leaf_only(builder: &mut ProfileBuilder, chain: &mut Vec<FrameId>) {
    let marker = builder.frame(Frame::marker(PAST_KEPT_STACKS));
    let leaf = chain.last().copied();
    chain.clear();
    chain.push(marker);
    chain.extend(leaf);
}

/// What the frames of one stack show of how whole it is and where its time went.
#[derive(Default)]
struct StackSeen {
    /// A user frame is named `UNKNOWN`.
    unknown_user: bool,
    /// A frame is user code of a known file that no symbol names.
    unnamed_user: bool,
    /// A kernel frame runs an execve.
    in_exec: bool,
    /// The innermost frame of user code in a file, and whether a symbol names it.
    leaf: Option<(ModuleId, bool)>,
    /// The outermost frame that says where the stack began is an entry point.
    rooted: bool,
}

/// Stacks named and counted so far: what [`StackTable`]s fold into.
#[derive(Default)]
pub struct Folded {
    pub(super) builder: ProfileBuilder,
    tally: Tally,
    build_ids: BTreeMap<String, String>,
    /// Distinct stacks kept at most: past them, a new stack is counted as its leaf alone
    /// under [`PAST_KEPT_STACKS`] (a live view's bound; none for a recording).
    stacks_at_most: Option<usize>,
}

impl Folded {
    /// Folds into at most `most` distinct stacks.
    pub fn keeping_stacks(most: usize) -> Folded {
        Folded {
            stacks_at_most: Some(most),
            ..Folded::default()
        }
    }

    /// The profile so far: its frames, stacks, threads and samples (its metadata is set by
    /// [`Folded::finish`]).
    pub fn so_far(&self) -> &Profile {
        self.builder.profile()
    }

    /// How whole the user stacks came out so far.
    pub fn tally(&self) -> &Tally {
        &self.tally
    }

    /// The profile, with `meta` and the figures on how whole the user stacks are in
    /// `meta.unwind`.
    pub fn finish(self, meta: Metadata) -> (Profile, Tally) {
        let Folded {
            builder,
            tally,
            build_ids,
            ..
        } = self;
        (dressed(builder.finish(), meta, &tally, &build_ids), tally)
    }

    /// The profile so far, as [`Folded::finish`] would give it now.
    pub fn snapshot(&self, meta: Metadata) -> Profile {
        let so_far = self.builder.profile().clone();
        dressed(so_far, meta, &self.tally, &self.build_ids)
    }
}

/// `profile` with `meta`, the figures on how whole its user stacks are and its files'
/// build-ids, its samples in a stable order (outputs are then reproducible run to run).
fn dressed(
    mut profile: Profile,
    meta: Metadata,
    tally: &Tally,
    build_ids: &BTreeMap<String, String>,
) -> Profile {
    profile.meta = meta;
    profile.meta.unwind = tally.stats.clone();
    profile.meta.build_ids.extend(build_ids.clone());
    profile.samples.sort_by_key(|s| (s.thread, s.stack, s.cpu));
    profile
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

    /// Folds every table handed over into one [`LiveFold`], each address named once across
    /// them, and shows `observe` the profile so far and what the table held, once it is in.
    pub fn start_live(
        thread: impl Fn(u32, u32) -> Thread + Send + 'static,
        mut observe: impl FnMut(&LiveFold, &Interval) + Send + 'static,
    ) -> io::Result<Self> {
        let (tables, arriving) = mpsc::sync_channel::<StackTable>(1);
        let worker = std::thread::Builder::new()
            .name("stackscope-fold".into())
            .spawn(move || {
                let mut live = LiveFold::new(thread);
                for table in arriving {
                    let interval = live.fold(&table);
                    // The table's memory goes back before the view draws.
                    drop(table);
                    observe(&live, &interval);
                }
                live.into_folded()
            })?;
        Ok(BackgroundFold { tables, worker })
    }

    /// Hands a table over; waits only while an earlier one is still queued.
    pub fn fold(&self, table: StackTable) {
        // The worker ends only when this sender is dropped, or by a panic that `finish`
        // passes on.
        let _ = self.tables.send(table);
    }

    /// Everything folded, once the worker has named the tables handed over. Sampling has
    /// ended by then, so a Ctrl-C from now on stops naming.
    pub fn finish(self) -> Folded {
        stackscope_symbols::interrupt::sampling_ended();
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
    /// Of those, the ones whose walker said why, by module and reason.
    pub stopped: HashMap<(Arc<str>, Stop), u64>,
    /// Frame-pointer chains that did not reach an entry point.
    pub short_chains: u64,
    /// Of `stats.unreadable`, the samples taken inside execve.
    pub unreadable_in_exec: u64,
    /// Samples whose stack came past the distinct stacks kept, counted as their leaf alone.
    pub past_kept_stacks: u64,
    /// How the user code of each file (by path) was sampled and named.
    pub modules: HashMap<Arc<str>, ModuleUse>,
}

/// How the user code of one file was sampled and named.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ModuleUse {
    /// Samples whose innermost frame of user code in a file is in this one: the time spent in
    /// its code.
    pub leaf: u64,
    /// Of those, the ones in a function no symbol names (shown as module+address).
    pub unnamed_leaf: u64,
    /// Some of its addresses were named with a source line: debug info was found for it.
    pub lines: bool,
}

impl Tally {
    /// Counts `count` samples of one stack. One rule for every source: a stack is whole
    /// when its outermost frame is a program or thread entry (`rooted`), however its
    /// unwinding ended (the unwind tables of some entry stubs, the dynamic loader's `_start`,
    /// do not mark the end of the chain), or when the unwind tables marked where it ended.
    fn count(&mut self, end: &WalkEnd, count: u64, unknown: bool, rooted: bool) {
        if *end == WalkEnd::NoStack {
            return;
        }
        self.stats.user_stacks += count;
        if unknown {
            self.stats.with_unknown += count;
        }
        if rooted {
            self.stats.complete += count;
            return;
        }
        // A stop in no mapping is a stop in no file the summary can name.
        let stopped_in =
            |module: &Option<Arc<str>>| module.clone().unwrap_or_else(|| UNKNOWN.into());
        match end {
            WalkEnd::Complete => self.stats.complete += count,
            WalkEnd::Truncated => self.stats.truncated += count,
            WalkEnd::Unreadable => self.stats.unreadable += count,
            WalkEnd::Stopped { module, why } => {
                let module = stopped_in(module);
                *self.broken_in.entry(module.clone()).or_insert(0) += count;
                if let Some(why) = why {
                    *self.stopped.entry((module, *why)).or_insert(0) += count;
                }
            }
            WalkEnd::Unconfirmed { module } => {
                *self.broken_in.entry(stopped_in(module)).or_insert(0) += count
            }
            WalkEnd::FramePointerChain => self.short_chains += count,
            WalkEnd::NoStack => {}
        }
    }
}

/// True for a user frame of a program's or thread's entry point: where every whole stack
/// starts. (A frame no symbol names is an entry when it is in the function at the entry
/// point its file states: `Names::is_unnamed_entry`.)
fn is_entry(frame: &Frame) -> bool {
    frame.kind == FrameKind::User && ENTRY_POINTS.contains(&frame.name.as_str())
}

/// Functions every stack of a process or thread starts in: glibc's program and thread
/// entries (and the dynamic loader's, before the program starts), and `main`, below which
/// only the C library's start code lies.
pub const ENTRY_POINTS: &[&str] = &[
    "main",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tally_judges_broken_and_frame_pointer_stacks_by_their_root() {
        let mut tally = Tally::default();
        let ld: Arc<str> = "/lib64/ld-linux-x86-64.so.2".into();
        let stopped_in = |module: &Arc<str>, why| WalkEnd::Stopped {
            module: Some(module.clone()),
            why,
        };
        tally.count(&WalkEnd::Complete, 5, false, true);
        tally.count(&WalkEnd::Truncated, 2, false, false);
        // The dynamic loader's _start has no end-of-chain mark: the unwinder gives up there,
        // but the stack is whole.
        tally.count(&stopped_in(&ld, None), 3, false, true);
        tally.count(&stopped_in(&ld, None), 4, true, false);
        tally.count(&WalkEnd::FramePointerChain, 6, false, true);
        tally.count(&WalkEnd::FramePointerChain, 7, false, false);
        tally.count(&WalkEnd::NoStack, 100, false, false);
        // A walk that says why it stopped is judged by its root all the same.
        let lib: Arc<str> = "/lib/libbig.so".into();
        tally.count(&stopped_in(&lib, Some(Stop::NoRule)), 8, false, false);
        tally.count(&stopped_in(&lib, Some(Stop::NoTable)), 9, false, true);

        let s = &tally.stats;
        assert_eq!(s.user_stacks, 5 + 2 + 3 + 4 + 6 + 7 + 8 + 9);
        assert_eq!(s.complete, 5 + 3 + 6 + 9);
        assert_eq!(s.truncated, 2);
        assert_eq!(s.with_unknown, 4);
        assert_eq!(tally.broken_in.get(&ld), Some(&4));
        assert_eq!(tally.broken_in.get(&lib), Some(&8));
        assert_eq!(tally.stopped.get(&(lib, Stop::NoRule)), Some(&8));
        assert_eq!(tally.stopped.len(), 1);
        assert_eq!(tally.short_chains, 7);
    }

    #[test]
    fn an_end_the_walker_did_not_confirm_counts_as_a_stop_unless_it_is_rooted() {
        let mut tally = Tally::default();
        let exe: Arc<str> = "/usr/bin/prog".into();
        let unconfirmed = WalkEnd::Unconfirmed {
            module: Some(exe.clone()),
        };
        tally.count(&unconfirmed, 3, false, true);
        tally.count(&unconfirmed, 4, false, false);
        // Where no mapping held the last frame, the stop is in an unknown file.
        tally.count(&WalkEnd::Unconfirmed { module: None }, 5, false, false);
        tally.count(&WalkEnd::stopped(Stop::Unmapped), 6, false, false);

        assert_eq!(tally.stats.user_stacks, 3 + 4 + 5 + 6);
        assert_eq!(tally.stats.complete, 3);
        assert_eq!(tally.broken_in.get(&exe), Some(&4));
        assert_eq!(tally.broken_in.get(UNKNOWN), Some(&(5 + 6)));
        let unknown: Arc<str> = UNKNOWN.into();
        assert_eq!(tally.stopped.get(&(unknown, Stop::Unmapped)), Some(&6));
        assert_eq!(tally.stopped.len(), 1);
    }
}

use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

/// Index of a frame in [`Profile::frames`].
pub type FrameId = u32;
/// Index of a stack in [`Profile::stacks`].
pub type StackId = u32;
/// Index of a thread in [`Profile::threads`].
pub type ThreadId = u32;

/// What kind of code a frame stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum FrameKind {
    /// User-space code.
    #[default]
    User,
    /// Kernel code.
    Kernel,
    /// Not code: a marker the profiler inserted, such as `[unknown]`, `[truncated]` or
    /// `[Missed User Stack]`.
    Marker,
}

/// The name of a frame whose function is not known, in every source and writer.
pub const UNKNOWN: &str = "[unknown]";

/// bcc profile's markers in place of a user or a kernel stack the kernel could not store.
pub const MISSED_USER_STACK: &str = "[Missed User Stack]";
pub const MISSED_KERNEL_STACK: &str = "[Missed Kernel Stack]";

/// What writers show in place of a character they cannot hold: U+FFFD, the replacement
/// character.
pub const REPLACEMENT: char = char::REPLACEMENT_CHARACTER;

/// Text a profiled process or a saved file chose (a function, command, module or event name),
/// as writers show it: every control character (C0, DEL and C1: terminals act on them, XML
/// cannot hold most of them, line formats split on them) and the non-characters U+FFFE and
/// U+FFFF (which XML cannot hold either) become [`REPLACEMENT`]. Borrowed when there is none.
pub fn printable(text: &str) -> Cow<'_, str> {
    let unprintable = |c: char| c.is_control() || c == '\u{fffe}' || c == '\u{ffff}';
    if !text.chars().any(unprintable) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(
        text.chars()
            .map(|c| if unprintable(c) { REPLACEMENT } else { c })
            .collect(),
    )
}

/// The one place a name (a frame's, a thread's or a process's) is made fit to show: it is
/// [`printable`], and an empty name, which would vanish, is [`UNKNOWN`]. Every writer but
/// stackscope's own lossless JSON shows names through it.
pub fn shown_name(name: &str) -> Cow<'_, str> {
    if name.is_empty() {
        Cow::Borrowed(UNKNOWN)
    } else {
        printable(name)
    }
}

/// One frame of a call stack, as shown to the user.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct Frame {
    /// Demangled function name, or a marker such as `[unknown]`.
    pub name: String,
    /// File name of the module (executable, library, `[kernel.kallsyms]`) the code lives in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    /// Source file, when debug info had it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// Source line, when debug info had it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    /// True when this function was inlined into its caller (the next frame toward the root
    /// shares its machine address).
    #[serde(default, skip_serializing_if = "is_false")]
    pub inlined: bool,
    #[serde(default)]
    pub kind: FrameKind,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Frame {
    /// A frame that stands for nothing but a name, e.g. `[unknown]`.
    pub fn marker(name: impl Into<String>) -> Self {
        Frame {
            name: name.into(),
            kind: FrameKind::Marker,
            ..Frame::default()
        }
    }

    pub fn is_kernel(&self) -> bool {
        self.kind == FrameKind::Kernel
    }

    /// The name a writer shows, as [`shown_name`] makes it.
    pub fn shown_name(&self) -> Cow<'_, str> {
        shown_name(&self.name)
    }
}

/// A call stack: frame indices, root (outermost caller) first, leaf last.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct Stack {
    pub frames: Vec<FrameId>,
}

/// A thread that samples belong to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct Thread {
    /// Process id (thread group id); 0 for the idle task.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// The thread's command name (`comm`), as bcc and perf show it.
    pub comm: String,
    /// The process's command name (the main thread's `comm`).
    #[serde(default)]
    pub process_name: String,
}

/// How many times one stack was seen on one thread (and CPU, where known).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sample {
    pub thread: ThreadId,
    pub stack: StackId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<u32>,
    pub count: u64,
    /// In a profile of bytes: the allocations those bytes are (made, or still held), as
    /// pprof's `alloc_objects` and `inuse_objects` count them. 0 elsewhere.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub objects: u64,
}

/// How whole the stacks came out. All figures count samples, not unique stacks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct UnwindStats {
    /// Samples that had a user stack to unwind.
    pub user_stacks: u64,
    /// User stacks that are whole: their outermost frame is a program or thread entry
    /// (`_start`, `main`, `start_thread`, `clone3`..., or, where no symbol names it, the
    /// function at the entry point the file states), or the unwind tables mark the end of
    /// the chain there. The same rule for every source.
    pub complete: u64,
    /// User stacks that hold at least one frame whose function is unknown.
    pub with_unknown: u64,
    /// User stacks that hold code of a known module that no symbol names, shown as the module
    /// and the start of its function (`libz.so.1+0x2f40`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub with_unnamed: u64,
    /// User stacks cut short because the copied stack memory ended.
    pub truncated: u64,
    /// User stacks the kernel could not copy at all (e.g. samples inside execve, after the
    /// old program's memory is gone): not counted as truncated.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unreadable: u64,
    /// User stacks deeper than the stack copy whose outer frames were recovered: taken from
    /// other samples of the same thread that passed the same frame, or read from the live
    /// thread (`record --read-stack-on`). Counted as complete when they reach an entry, as
    /// the others.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub recovered: u64,
}

impl UnwindStats {
    /// Adds the figures of another profile's samples.
    pub fn add(&mut self, other: &UnwindStats) {
        self.user_stacks += other.user_stacks;
        self.complete += other.complete;
        self.with_unknown += other.with_unknown;
        self.with_unnamed += other.with_unnamed;
        self.truncated += other.truncated;
        self.unreadable += other.unreadable;
        self.recovered += other.recovered;
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What a sample's count measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CountUnit {
    /// Samples or probe hits, one each.
    #[default]
    Samples,
    /// Microseconds: a profile of time (off-CPU time, or on- and off-CPU time together),
    /// each stack weighed by how long threads spent in it.
    Microseconds,
    /// Bytes of memory: allocated (`record --alloc`) or still held at the end (`--in-use`),
    /// each stack weighed by its bytes; [`Sample::objects`] counts the allocations.
    Bytes,
}

impl CountUnit {
    pub fn is_samples(&self) -> bool {
        *self == CountUnit::Samples
    }

    /// The unit's short name, as a flamegraph shows counts: `samples` or `µs`.
    pub fn short_name(self) -> &'static str {
        match self {
            CountUnit::Samples => "samples",
            CountUnit::Microseconds => "µs",
            CountUnit::Bytes => "bytes",
        }
    }
}

/// `meta.event` of a profile of the bytes allocated, by the stacks that allocated them.
pub const ALLOC_EVENT: &str = "alloc";
/// `meta.event` of a profile of the bytes still held when recording ended, by the stacks
/// that allocated them.
pub const IN_USE_EVENT: &str = "in-use";

/// How a profile was taken.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Metadata {
    /// What produced the samples, e.g. `perf_event`.
    pub source: String,
    /// The sampled event, e.g. `cpu-clock`.
    pub event: String,
    /// Samples per second per CPU, when sampling by frequency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequency_hz: Option<u64>,
    /// Events per sample, when sampling by period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<u64>,
    /// Wall-clock time sampled, in seconds.
    pub duration_secs: f64,
    /// Samples the kernel could not hand over (ring buffer full).
    pub lost_samples: u64,
    /// What the sample counts measure: samples (the default), or time.
    #[serde(default, skip_serializing_if = "CountUnit::is_samples")]
    pub count_unit: CountUnit,
    #[serde(default)]
    pub unwind: UnwindStats,
    /// The profiled command line, when stackscope launched it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// One-line explanations of broken stacks and how to fix them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hints: Vec<String>,
    /// Build-ids (lowercase hex) of the modules frames name, keyed by [`Frame::module`], where
    /// the source knew them; pprof mappings carry them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub build_ids: BTreeMap<String, String>,
}

impl Metadata {
    /// The time one sample stands for, in nanoseconds, when the profile says: one period of a
    /// frequency, or the period of a clock event (counted in nanoseconds); a microsecond in a
    /// profile of time.
    pub fn sample_nanos(&self) -> Option<u64> {
        if self.count_unit == CountUnit::Microseconds {
            return Some(1000);
        }
        match (self.frequency_hz, self.period) {
            (Some(hz), _) if hz > 0 => Some(1_000_000_000 / hz).filter(|&n| n > 0),
            (_, Some(period))
                if period > 0 && matches!(self.event.as_str(), "cpu-clock" | "task-clock") =>
            {
                Some(period)
            }
            _ => None,
        }
    }

    /// What formats that name a profile call it when not given a title: the profiled command
    /// line, else `stackscope`.
    pub fn title(&self) -> String {
        if self.command.is_empty() {
            "stackscope".to_string()
        } else {
            self.command.join(" ")
        }
    }
}

/// The profile: everything a writer needs, nothing a source needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Profile {
    pub frames: Vec<Frame>,
    pub stacks: Vec<Stack>,
    pub threads: Vec<Thread>,
    pub samples: Vec<Sample>,
    pub meta: Metadata,
}

impl Profile {
    pub fn frame(&self, id: FrameId) -> &Frame {
        &self.frames[id as usize]
    }

    pub fn stack(&self, id: StackId) -> &Stack {
        &self.stacks[id as usize]
    }

    pub fn thread(&self, id: ThreadId) -> &Thread {
        &self.threads[id as usize]
    }

    /// The sum of all sample counts.
    pub fn total_samples(&self) -> u64 {
        self.samples.iter().map(|s| s.count).sum()
    }

    /// This profile with `other`'s samples added (frames, stacks and threads interned once,
    /// equal samples merged): this one's metadata, with the samples lost and the unwind
    /// figures of both.
    pub fn merged(self, other: &Profile) -> Profile {
        let mut meta = self.meta.clone();
        meta.lost_samples += other.meta.lost_samples;
        meta.unwind.add(&other.meta.unwind);
        for (module, id) in &other.meta.build_ids {
            meta.build_ids
                .entry(module.clone())
                .or_insert_with(|| id.clone());
        }
        let mut b = ProfileBuilder::new(meta);
        for profile in [&self, other] {
            for sample in &profile.samples {
                let frames: Vec<FrameId> = profile
                    .stack_frames(sample.stack)
                    .map(|frame| b.frame(frame.clone()))
                    .collect();
                let stack = b.stack(&frames);
                let thread = b.thread(profile.thread(sample.thread).clone());
                b.add_objects(thread, stack, sample.cpu, sample.count, sample.objects);
            }
        }
        b.finish()
    }

    /// The frames of a sample's stack, root first.
    pub fn stack_frames(&self, id: StackId) -> impl DoubleEndedIterator<Item = &Frame> + '_ {
        self.stack(id).frames.iter().map(|&f| self.frame(f))
    }
}

/// Builds a [`Profile`], interning frames, stacks and threads so each is stored once, and
/// merging samples of the same (thread, stack, cpu).
#[derive(Default)]
pub struct ProfileBuilder {
    profile: Profile,
    frame_ids: HashMap<Frame, FrameId>,
    stack_ids: HashMap<Vec<FrameId>, StackId>,
    thread_ids: HashMap<Thread, ThreadId>,
    sample_ids: HashMap<(ThreadId, StackId, Option<u32>), usize>,
}

impl ProfileBuilder {
    pub fn new(meta: Metadata) -> Self {
        ProfileBuilder {
            profile: Profile {
                meta,
                ..Profile::default()
            },
            ..ProfileBuilder::default()
        }
    }

    pub fn frame(&mut self, frame: Frame) -> FrameId {
        if let Some(&id) = self.frame_ids.get(&frame) {
            return id;
        }
        let id = self.profile.frames.len() as FrameId;
        self.profile.frames.push(frame.clone());
        self.frame_ids.insert(frame, id);
        id
    }

    /// A frame interned before.
    pub fn frame_at(&self, id: FrameId) -> &Frame {
        self.profile.frame(id)
    }

    /// The stack of `frames` (root first) when it is interned already.
    pub fn known_stack(&self, frames: &[FrameId]) -> Option<StackId> {
        self.stack_ids.get(frames).copied()
    }

    /// Interns a stack given root first.
    pub fn stack(&mut self, frames: &[FrameId]) -> StackId {
        if let Some(&id) = self.stack_ids.get(frames) {
            return id;
        }
        let id = self.profile.stacks.len() as StackId;
        self.profile.stacks.push(Stack {
            frames: frames.to_vec(),
        });
        self.stack_ids.insert(frames.to_vec(), id);
        id
    }

    pub fn thread(&mut self, thread: Thread) -> ThreadId {
        if let Some(&id) = self.thread_ids.get(&thread) {
            return id;
        }
        let id = self.profile.threads.len() as ThreadId;
        self.profile.threads.push(thread.clone());
        self.thread_ids.insert(thread, id);
        id
    }

    /// Adds `count` samples of `stack` on `thread`; merges with an earlier equal key.
    pub fn add(&mut self, thread: ThreadId, stack: StackId, cpu: Option<u32>, count: u64) {
        self.add_objects(thread, stack, cpu, count, 0);
    }

    /// Adds `count` (bytes) of `objects` allocations of `stack` on `thread`; merges with an
    /// earlier equal key.
    pub fn add_objects(
        &mut self,
        thread: ThreadId,
        stack: StackId,
        cpu: Option<u32>,
        count: u64,
        objects: u64,
    ) {
        match self.sample_ids.get(&(thread, stack, cpu)) {
            Some(&i) => {
                let sample = &mut self.profile.samples[i];
                sample.count += count;
                sample.objects += objects;
            }
            None => {
                self.sample_ids
                    .insert((thread, stack, cpu), self.profile.samples.len());
                self.profile.samples.push(Sample {
                    thread,
                    stack,
                    cpu,
                    count,
                    objects,
                });
            }
        }
    }

    pub fn meta_mut(&mut self) -> &mut Metadata {
        &mut self.profile.meta
    }

    /// What was built so far.
    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    pub fn finish(self) -> Profile {
        self.profile
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A profile of `count` samples of main -> `leaf` on thread 7, whose user stacks are whole.
    fn one_stack(leaf: &str, count: u64) -> Profile {
        let mut b = ProfileBuilder::new(Metadata::default());
        let frames = [b.frame(Frame::marker("main")), b.frame(Frame::marker(leaf))];
        let stack = b.stack(&frames);
        let thread = b.thread(Thread {
            pid: 7,
            tid: 7,
            ..Thread::default()
        });
        b.add(thread, stack, None, count);
        b.meta_mut().unwind = UnwindStats {
            user_stacks: count,
            complete: count,
            ..UnwindStats::default()
        };
        b.meta_mut().lost_samples = 1;
        b.finish()
    }

    #[test]
    fn merged_profiles_share_frames_and_threads_and_add_their_counts_and_figures() {
        let merged = one_stack("a", 2)
            .merged(&one_stack("a", 3))
            .merged(&one_stack("b", 4));
        assert_eq!(merged.frames.len(), 3, "{:?}", merged.frames);
        assert_eq!(merged.threads.len(), 1);
        let counts: Vec<u64> = merged.samples.iter().map(|s| s.count).collect();
        assert_eq!(counts, [5, 4]);
        assert_eq!(merged.meta.unwind.user_stacks, 9);
        assert_eq!(merged.meta.unwind.complete, 9);
        assert_eq!(merged.meta.lost_samples, 3);
    }
}

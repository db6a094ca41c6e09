//! Raw stacks as the sampler and unwinder produce them, counted as they arrive, and turned into
//! a [`stackscope_profile::Profile`] at the end: every unique address is named once, batched
//! per module (`names`), and the stacks folded into the profile (`fold`).

use std::collections::HashMap;
use std::sync::Arc;

use stackscope_profile::FrameKind;

use crate::walk::WalkEnd;
use crate::{AddressSpace, Mapping};

mod fold;
mod live;
mod names;
mod rust_names;

pub use fold::{
    BackgroundFold, Folded, ModuleUse, Tally, ENTRY_POINTS, PAST_KEPT_STACKS, UNREADABLE,
};
pub use live::{Interval, Live, LiveFold, Observer, STACKS_KEPT};
pub(crate) use names::original_path;
pub use rust_names::rust_clean;

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
    /// A kernel address outside every module given: a guest kernel's code that the file
    /// the stub runs does not hold.
    UnmappedKernel(u64),
    /// The user stack went on, but the copied stack memory ended.
    Truncated,
    /// A marker a source puts in place of a stack it could not take, e.g. `[Missed User Stack]`.
    Marker(&'static str),
    /// The event that counted the stack, as its root frame, when a recording counts at several
    /// (a marker naming it); passed over when judging whether the stack is whole.
    Event(&'static str),
}

/// Where a module's code comes from, for the symbolizer.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum ModuleKey {
    File {
        path: Arc<str>,
        build_id: Option<Arc<[u8]>>,
        /// A guest kernel's file is kernel code.
        kind: FrameKind,
    },
    Vdso,
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
    end: WalkEnd,
}

/// Counts of unique raw stacks, with the modules they refer to.
///
/// Stacks are kept as a tree of frames shared by every stack with the same callers, so a
/// long recording of deep stacks costs a node per new frame, not a copy of every stack.
#[derive(Default)]
pub struct StackTable {
    /// Each stack's count and, in a profile of bytes, the allocations it counts.
    counts: HashMap<StackKey, (u64, u64)>,
    /// (caller node, frame) of each node.
    nodes: Vec<(NodeId, RawFrame)>,
    node_ids: HashMap<(NodeId, RawFrame), NodeId>,
    modules: Vec<ModuleKey>,
    module_ids: HashMap<ModuleKey, ModuleId>,
    names: Vec<Arc<str>>,
    name_ids: HashMap<Arc<str>, NameId>,
    naming: Naming,
    /// Samples the source lost while this table filled.
    lost: u64,
    /// The jitdump each process mapped, where its JIT code is named.
    jitdumps: HashMap<u32, Arc<str>>,
}

/// Where a stack's samples were taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sampled<'a> {
    pub pid: u32,
    pub tid: u32,
    pub cpu: u32,
    /// The thread's and its process's names at the time of the samples, when the source
    /// knows them: they win over the ones `into_profile`'s caller gives.
    pub names: Option<(&'a str, &'a str)>,
}

/// How the naming step names what a source found, where sources differ.
#[derive(Debug, Clone, Copy, Default)]
pub struct Naming {
    /// Shorten Rust names as the Asterinas OSDK does ([`rust_clean`]).
    pub short_rust_names: bool,
}

impl StackTable {
    /// The raw frame for a user address, given the mapping that holds it (if any).
    pub fn user_frame(&mut self, pid: u32, addr: u64, mapping: Option<&Mapping>) -> RawFrame {
        self.frame_in(pid, addr, mapping, FrameKind::User)
    }

    /// The raw frame for an address of `kind` in a module the source placed itself (a
    /// guest's kernel or program), given the mapping that holds it (if any).
    pub fn frame_in(
        &mut self,
        pid: u32,
        addr: u64,
        mapping: Option<&Mapping>,
        kind: FrameKind,
    ) -> RawFrame {
        let Some(m) = mapping else {
            return match kind {
                FrameKind::Kernel => RawFrame::UnmappedKernel(addr),
                _ => RawFrame::Unmapped(addr),
            };
        };
        let key = if &*m.path == "[vdso]" {
            ModuleKey::Vdso
        } else if m.is_file() {
            ModuleKey::File {
                path: m.path.clone(),
                build_id: m.build_id.clone(),
                kind,
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

    /// Notes the jitdump process `pid` mapped into `space`, if it mapped one, so that its JIT
    /// frames are named from it after the process is gone.
    pub fn note_jitdump(&mut self, pid: u32, space: &AddressSpace) {
        if let Some(path) = space.jitdump() {
            if self.jitdumps.get(&pid) != Some(path) {
                self.jitdumps.insert(pid, path.clone());
            }
        }
    }

    /// Sets how the stacks' frames are named.
    pub fn set_naming(&mut self, naming: Naming) {
        self.naming = naming;
    }

    /// Counts `count` samples of `frames` (leaf first), taken where `sampled` says, whose
    /// user stack's walk ended as `end`: the one way every source counts.
    pub fn count(&mut self, sampled: Sampled<'_>, frames: &[RawFrame], end: WalkEnd, count: u64) {
        self.count_objects(sampled, frames, end, count, 0);
    }

    /// Counts `bytes` of memory in `objects` allocations made at `frames`, as [`Self::count`]
    /// counts samples.
    pub fn count_objects(
        &mut self,
        sampled: Sampled<'_>,
        frames: &[RawFrame],
        end: WalkEnd,
        bytes: u64,
        objects: u64,
    ) {
        let (comm, process) = match sampled.names {
            Some((comm, process)) => (self.name(comm), self.name(process)),
            None => (UNNAMED, UNNAMED),
        };
        let key = StackKey {
            pid: sampled.pid,
            tid: sampled.tid,
            comm,
            process,
            cpu: sampled.cpu,
            stack: self.stack(frames),
            end,
        };
        let counted = self.counts.entry(key).or_insert((0, 0));
        counted.0 += bytes;
        counted.1 += objects;
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

    /// Whether `module` is a file of user code (not the vDSO, not a guest's kernel).
    fn is_user_file(&self, module: ModuleId) -> bool {
        matches!(
            self.modules.get(module as usize),
            Some(ModuleKey::File {
                kind: FrameKind::User,
                ..
            })
        )
    }

    /// The stacks counted so far, leaving this table empty but for its modules, which keep
    /// their numbers: the raw frames of every table taken from it name the same code, so a
    /// live recording names each address once across the tables it hands over.
    pub fn take(&mut self) -> StackTable {
        let successor = StackTable {
            modules: self.modules.clone(),
            module_ids: self.module_ids.clone(),
            naming: self.naming,
            jitdumps: self.jitdumps.clone(),
            ..StackTable::default()
        };
        std::mem::replace(self, successor)
    }

    /// Notes `count` samples the source lost while this table filled.
    pub fn lose(&mut self, count: u64) {
        self.lost += count;
    }

    /// Unique frames held (one per new frame of any stack): what the table's memory grows
    /// with.
    pub fn nodes(&self) -> usize {
        self.nodes.len()
    }
}

//! How the walk of a sample's user stack ended, in one set of words for every source: the
//! walk here, the perf source's copies, the eBPF program's in-kernel walk, a GDB stub's
//! target, ETW's kernel walk. The stack table counts stacks by it, and the summary's figures
//! on how whole the stacks are judge it ([`crate::table::Tally`]).

use std::sync::Arc;

/// How the walk of a sample's user stack ended.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum WalkEnd {
    /// No user stack was walked: a kernel thread, or user stacks not wanted.
    NoStack,
    /// The walk reached the outermost frame, as the unwind tables (or a zero frame pointer in
    /// code they cover) mark it.
    Complete,
    /// The stack goes on past what was walked: the stack memory copied with the sample ended
    /// first (the eBPF program: its frame limit was reached).
    Truncated,
    /// The walk went no further than its last frame, short of the outermost one as far as
    /// the walker can tell. `module` is the last frame's file, which the source names from
    /// its address space ([`WalkEnd::in_module`]; `None` when no mapping holds the frame);
    /// `why` is what the walker found there, when it says.
    Stopped {
        module: Option<Arc<str>>,
        why: Option<Stop>,
    },
    /// The walk took its last frame, in `module`, for the outermost without telling how it
    /// knew: the eBPF program ends a walk at a zero return address or frame pointer as it
    /// does where the tables mark the end. Whole when that frame is an entry point; else it
    /// stopped there.
    Unconfirmed { module: Option<Arc<str>> },
    /// The stack is a chain of frame pointers (the kernel's walk, or a callchain the sample
    /// carried), which no table marks the end of: whole when its outermost frame is an entry
    /// point, else short.
    FramePointerChain,
    /// The sample carried user registers but not one byte of user stack: the kernel could not
    /// read the memory at the stack pointer. It happens inside execve, once the kernel has
    /// replaced the old program's memory while its registers are still the thread's.
    Unreadable,
}

impl WalkEnd {
    /// A walk that stopped for reason `why`, at a frame whose file the source names later.
    pub(crate) fn stopped(why: Stop) -> WalkEnd {
        WalkEnd::Stopped {
            module: None,
            why: Some(why),
        }
    }

    /// This end with the file of the walk's last frame named by `module`, where the end is
    /// one that says where the walk stopped and no file is named yet: a walk knows
    /// addresses, the source knows which files map them.
    pub fn in_module(self, module: impl FnOnce() -> Option<Arc<str>>) -> WalkEnd {
        match self {
            WalkEnd::Stopped { module: None, why } => WalkEnd::Stopped {
                module: module(),
                why,
            },
            WalkEnd::Unconfirmed { module: None } => WalkEnd::Unconfirmed { module: module() },
            end => end,
        }
    }
}

/// Why a walk stopped short of the outermost frame, as far as the walker can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stop {
    /// The last frame's code has no unwind table, and its frame pointer led nowhere.
    NoTable,
    /// The table storage was full, so the last frame's module had no table.
    TableFull,
    /// [`super::MAX_FRAMES`] (or a source's own limit) frames were followed.
    FrameLimit,
    /// The rules asked for memory that could not be read.
    UnreadableMemory,
    /// The module has a table, but none of its rules covers the address (the frame-pointer
    /// guess tried instead led nowhere), or the rule there led outside the code.
    NoRule,
    /// The address lies in no mapped code.
    Unmapped,
}

impl Stop {
    /// The reason in a few words, for hints.
    pub fn words(self) -> &'static str {
        match self {
            Stop::NoTable => "no unwind table",
            Stop::TableFull => "unwind table storage full",
            Stop::FrameLimit => "frame limit reached",
            Stop::UnreadableMemory => "unreadable stack memory",
            Stop::NoRule => "no unwind rule for the address",
            Stop::Unmapped => "address in no mapping",
        }
    }
}
